"""How many bytes do topic log checkpoints write per byte of data? Version 3 (a changed
partition's whole state in a new sidecar) against version 4 (chains: the previous sidecars plus
a compressed delta of the commits since, PROTOCOL.md 13.4), side by side.

A deterministic model of the OPERATIONS.md cost example, on the local disk, through the topic
log itself (manifest actions only, no data is written; pyarrow is not used):

- one layout-3 topic of ``--partitions`` partitions (8), one topic log, ``checkpoint.interval``
  ``--interval`` (100);
- a steady state seeded first, per partition: ``--live`` live ranges (7,000: 10-minute merges)
  and ``--removed`` removed files awaiting vacuum (36,000: hourly vacuum), as the example has;
- then deliveries, one commit each, by two producers taking turns: per partition one ranged
  ``add`` of ``--data-per-partition`` bytes (62,500: 10 MB/s in 20 deliveries/s over 8
  partitions) and its ``producer`` entry; every ``--merge-every`` deliveries (600) a merge
  replaces that many ranges of each partition by one segment (``remove``s and an ``add``), and
  every ``--vacuum-every`` (3,600) the files removed before the previous vacuum are forgotten
  (``vacuumed``).

Reported per version: the data bytes the adds name, the checkpoint bytes written during the
deliveries (checkpoint files and the sidecars they wrote; ``_last_checkpoint`` is ~16 bytes a
checkpoint, left out), their ratio, bytes per checkpoint, and the time a new reader takes to
open the log at the end (the newest checkpoint, its sidecars, the commits after it) with the
number of sidecar files it reads. Version 3 runs fewer deliveries
(its checkpoints are all alike: the whole state of every partition); version 4 runs enough to
go through chains of the full length twice (a new base every 65 checkpoints at most).

Run: ``.venv/bin/python benchmarks/checkpoint_bytes.py [--v3-deliveries 500]
[--v4-deliveries 13100] [--max-deltas 64]``
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kstore.store
import kstore.topic_log
from kstore import Store
from kstore.log import Action
from kstore.manifest import PartitionState


class Model:
    def __init__(self, args: argparse.Namespace, root: str) -> None:
        self.args = args
        self.store = Store(f"file://{root}")
        self.store.create_topic("t", args.partitions, config={"checkpoint.interval": args.interval})
        self.shared = self.store.topic_log("t", self.store.topic("t"), 0)
        self.now = int(time.time() * 1000) - 3_600_000
        self.counter = 0
        # Names and checksums as random as real ones (128 random bits, CRC-32s): what is left
        # of a compressed sidecar is mostly these.
        self.rng = random.Random(1)
        self.small: dict[int, list[str]] = {p: [] for p in range(args.partitions)}
        self.removed: dict[int, list[str]] = {p: [] for p in range(args.partitions)}
        self.forget: dict[int, list[str]] = {p: [] for p in range(args.partitions)}
        self.data_bytes = 0

    def _name(self, prefix: str, suffix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.now:013d}-{uuid.UUID(int=self.rng.getrandbits(128)).hex}{suffix}"

    def _add(self, state: PartitionState, end: int, records: int, size: int) -> Action:
        self.now += 1
        return {
            "add": {
                "path": self._name("_data/", ".kdat"),
                "baseOffset": end,
                "lastOffset": end + records - 1,
                "records": records,
                "minTimestamp": self.now - 50,
                "maxTimestamp": self.now - 2,
                "size": size,
                "checksum": f"crc32c:{self.rng.getrandbits(32):08x}",
                "format": "arrow",
                "sparse": False,
                "createdTime": self.now,
                "range": [self.rng.randrange(400_000), size],
            }
        }

    def seed(self) -> None:
        """The steady state, one partition per commit: live ranges and removed files."""
        for p in range(self.args.partitions):

            def build(state: PartitionState) -> list[Action]:
                out: list[Action] = []
                end = state.end_offset
                for _ in range(self.args.removed):
                    add = self._add(state, end, 100, 62_500)
                    out.append(add)
                    out.append(
                        {"remove": {"path": add["add"]["path"], "deletionTimestamp": self.now}}
                    )
                    end += 100
                for _ in range(self.args.live):
                    out.append(self._add(state, end, 100, 62_500))
                    end += 100
                out.append({"logStart": {"offset": self.args.removed * 100}})
                return out

            self.shared.commit({p: build}, operation="SEED")

    def deliver(self, number: int) -> None:
        producer = f"{number % 2:032x}"
        merge = number and number % self.args.merge_every == 0
        vacuum = number and number % self.args.vacuum_every == 0
        builds = {}
        for p in range(self.args.partitions):

            def build(state: PartitionState, p: int = p) -> list[Action]:
                out: list[Action] = []
                if vacuum and self.forget[p]:
                    out.append({"vacuumed": {"paths": self.forget[p]}})
                    self.forget[p] = []
                if vacuum:
                    self.forget[p], self.removed[p] = self.removed[p], []
                if merge and self.small[p]:
                    live = {s.path: s for s in state.segments}
                    run = [live[path] for path in self.small[p]]
                    for seg in run:
                        out.append({"remove": {"path": seg.path, "deletionTimestamp": self.now}})
                    out.append(
                        {
                            "add": {
                                "path": self._name("segments/", ".parquet"),
                                "baseOffset": run[0].base_offset,
                                "lastOffset": run[-1].last_offset,
                                "records": sum(s.record_count for s in run),
                                "minTimestamp": run[0].min_timestamp_ms,
                                "maxTimestamp": run[-1].max_timestamp_ms,
                                "size": sum(s.size_bytes for s in run),
                                "checksum": f"crc32c:{self.rng.getrandbits(32):08x}",
                                "format": "parquet",
                                "sparse": False,
                                "createdTime": self.now,
                            }
                        }
                    )
                    self.removed[p].extend(self.small[p])
                    self.small[p] = []
                add = self._add(state, state.end_offset, 100, self.args.data_per_partition)
                self.small[p].append(add["add"]["path"])
                self.data_bytes += self.args.data_per_partition
                out.append(add)
                out.append(
                    {
                        "producer": {
                            "id": producer,
                            "epoch": 0,
                            "firstSequence": number * 100,
                            "lastSequence": number * 100 + 99,
                            "baseOffset": state.end_offset,
                            "lastOffset": state.end_offset + 99,
                            "timestamp": self.now,
                        }
                    }
                )
                return out

            builds[p] = build
        result, refused = self.shared.commit(builds, operation="WRITE")
        assert result is not None
        assert not refused


def checkpoint_files(root: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for directory, _, files in os.walk(root):
        for name in files:
            if ".checkpoint." in name or "/_sidecars" in directory:
                path = os.path.join(directory, name)
                out[path] = os.path.getsize(path)
    return out


def run(args: argparse.Namespace, version: int, deliveries: int) -> dict[str, Any]:
    kstore.topic_log.TOPIC_LOG_VERSION = version
    kstore.store.TOPIC_LOG_VERSION = version  # type: ignore[attr-defined]
    root = tempfile.mkdtemp(prefix=f"kstore-checkpoint-bytes-v{version}-")
    try:
        model = Model(args, root)
        model.seed()
        before = checkpoint_files(root)
        started = time.perf_counter()
        for number in range(deliveries):
            model.deliver(number)
        elapsed = time.perf_counter() - started
        written = {k: v for k, v in checkpoint_files(root).items() if k not in before}
        checkpoints = sum(1 for k in written if ".checkpoint." in k)
        sidecars = sum(v for k, v in written.items() if "/_sidecars/" in k)
        total = sum(written.values())
        state = model.shared.state()
        # Opening the log as a new reader does: the newest checkpoint with its sidecars (every
        # member of every chain), then the commits after it; the median of three.
        top = model.shared.log._read_checkpoint(state.version // args.interval * args.interval)
        assert top is not None
        members = sum(len(chain) for chain in top.sidecars.values())
        opens = []
        for _ in range(3):
            fresh = Store(f"file://{root}")
            shared = fresh.topic_log("t", fresh.topic("t"), 0)
            began = time.perf_counter()
            shared.log.load()
            opens.append(time.perf_counter() - began)
        return {
            "version": version,
            "deliveries": deliveries,
            "checkpoints": checkpoints,
            "data_bytes": model.data_bytes,
            "checkpoint_bytes": total,
            "sidecar_bytes": sidecars,
            "checkpoint_bytes_per_data_byte": total / model.data_bytes,
            "bytes_per_checkpoint": total / max(1, checkpoints),
            "live_per_partition": len(state.partition(0).segments),
            "removed_per_partition": len(state.partition(0).removed),
            "seconds": round(elapsed, 1),
            "sidecars_read_on_open": members,
            "open_s": round(sorted(opens)[1], 3),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
        kstore.topic_log.TOPIC_LOG_VERSION = kstore.topic_log.CHAIN_VERSION
        kstore.store.TOPIC_LOG_VERSION = kstore.topic_log.CHAIN_VERSION  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--interval", type=int, default=100)
    parser.add_argument("--live", type=int, default=7000)
    parser.add_argument("--removed", type=int, default=36000)
    parser.add_argument("--data-per-partition", type=int, default=62_500)
    parser.add_argument("--merge-every", type=int, default=600)
    parser.add_argument("--vacuum-every", type=int, default=3600)
    parser.add_argument("--v3-deliveries", type=int, default=500)
    parser.add_argument("--v4-deliveries", type=int, default=13100)
    parser.add_argument(
        "--max-deltas",
        type=int,
        default=kstore.topic_log.MAX_DELTAS,
        help="the chain's count bound to try (the protocol's is the default)",
    )
    args = parser.parse_args()
    kstore.topic_log.MAX_DELTAS = args.max_deltas
    results = [run(args, 3, args.v3_deliveries)] if args.v3_deliveries else []
    results.append(run(args, 4, args.v4_deliveries))
    print(
        f"{'version':>7} {'deliveries':>10} {'checkpoints':>11} {'data MB':>10} "
        f"{'checkpoint MB':>13} {'per data byte':>13} {'KB/checkpoint':>13} {'s':>6} "
        f"{'open s':>7} {'sidecars':>8}"
    )
    for r in results:
        print(
            f"{r['version']:>7} {r['deliveries']:>10} {r['checkpoints']:>11} "
            f"{r['data_bytes'] / 1e6:>10.1f} {r['checkpoint_bytes'] / 1e6:>13.2f} "
            f"{r['checkpoint_bytes_per_data_byte']:>13.4%} "
            f"{r['bytes_per_checkpoint'] / 1e3:>13.1f} {r['seconds']:>6} "
            f"{r['open_s']:>7} {r['sidecars_read_on_open']:>8}"
        )
    print(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
