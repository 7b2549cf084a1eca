"""Where a tailing consumer's end-to-end latency goes, per commit it finds (S3-like).

One producer process (as in ``many_writers.py``: ``acks="all"``, ``linger_ms=5``, shared
commits) writes one topic on SeaweedFS behind the delaying proxy; the consumer runs in this
process, tailing every partition. For every commit a tailing look finds, three moments are
taken against the commit's own ``commitInfo.timestamp`` (the producer's clock, set just before
its PUT; same machine): when the look that found it started, when that look's GETs ended, and
when the fetch that holds it had decoded and applied it. The rows alternate the partition
counts over the rounds.

A probe, not a product path: it wraps ``Log.update``, ``Log._note_writer`` and
``Fetcher._fill`` in this process to take the moments; the wrappers do no I/O.

    .venv/bin/python benchmarks/tail_breakdown.py --cases 8:1000,64:5000 --rounds 3
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import many_writers
from benchmarks.common import percentile, table, write_results


class Probe:
    """The moments of each found commit: (look start, GETs ended, fetch ended) minus stamp."""

    def __init__(self) -> None:
        from kstore import log as log_module
        from kstore.consumer import fetcher as fetcher_module
        from kstore.storage import facade

        self.found: list[tuple[float, float, float]] = []
        self.looks: list[list[int]] = []  # per tailing look: versions found per GET round
        self._look_start = 0.0
        self._rounds: list[int] | None = None
        self._pending: list[tuple[float, float, float]] = []
        update, note, fill = (
            log_module.Log.update,
            log_module.Log._note_writer,
            fetcher_module.Fetcher._fill,
        )
        read_many = facade.Storage.read_many
        probe = self

        def timed_read_many(self: Any, rels: list[str]) -> dict[str, bytes]:
            out = read_many(self, rels)
            if probe._rounds is not None:
                probe._rounds.append(len(out))
            return out

        def timed_update(self: Any, state: Any, *, tail: bool = False) -> Any:
            if not tail:
                return update(self, state, tail=tail)
            probe._look_start, probe._rounds = time.time(), []
            try:
                return update(self, state, tail=tail)
            finally:
                probe.looks.append(probe._rounds)
                probe._rounds = None

        def timed_note(self: Any, info: dict[str, Any], actions: Any) -> None:
            stamp = info.get("timestamp")
            if isinstance(stamp, int):
                probe._pending.append((stamp / 1000, probe._look_start, time.time()))
            note(self, info, actions)

        def timed_fill(self: Any) -> None:
            fill(self)
            done = time.time()
            for stamp, look, got in probe._pending:
                probe.found.append((look - stamp, got - stamp, done - stamp))
            probe._pending = []

        facade.Storage.read_many = timed_read_many  # type: ignore[method-assign]
        log_module.Log.update = timed_update  # type: ignore[method-assign]
        log_module.Log._note_writer = timed_note  # type: ignore[method-assign]
        fetcher_module.Fetcher._fill = timed_fill  # type: ignore[method-assign]

    def reset(self) -> None:
        self.found, self.looks = [], []


def run_case(
    backend: many_writers.Backend, probe: Probe, partitions: int, rate: float, args: Any
) -> dict[str, Any]:
    from kstore import Store
    from kstore.consumer import Consumer
    from kstore.records import TopicPartition

    url, options = backend.new_store(f"tail-p{partitions}")
    Store(url, options).create_topic(many_writers.TOPIC, partitions=partitions)
    spec = {
        "url": url,
        "options": options,
        "rate": rate,
        "phase": 0,
        "prefix": "w0-",
        "mode": "shared",
        "linger_ms": 5,
    }
    producer = many_writers.kstore_child("_producer", spec, backend.work, f"tail-p{partitions}")
    consumer = Consumer(
        store=Store(url, options, create=False),
        auto_offset_reset="latest",
        enable_auto_commit=False,
    )
    try:
        consumer.assign([TopicPartition(many_writers.TOPIC, p) for p in range(partitions)])
        consumer.poll(timeout_ms=0)
        producer.wait_ready(180)
        plan = {"start": time.time() + 1.0, "warmup": args.warmup, "seconds": args.seconds}
        producer.say(plan)
        measure_from = (plan["start"] + args.warmup) * 1000
        end = measure_from + args.seconds * 1000
        while time.time() * 1000 < measure_from:
            consumer.poll(timeout_ms=50)
        probe.reset()
        cpu, wall = time.process_time(), time.time()
        e2e: list[float] = []
        while time.time() * 1000 < end:
            for records in consumer.poll(timeout_ms=50).values():
                now = time.time() * 1000
                e2e.extend(now - r.timestamp for r in records if measure_from <= r.timestamp < end)
        cpu, wall = time.process_time() - cpu, time.time() - wall
        load = os.getloadavg()[0]
        acks = producer.result(120)["acks"]
    finally:
        producer.end()
        consumer.close()
    found = probe.found
    finds = [rounds for rounds in probe.looks if any(rounds)]

    def p50(values: Any) -> float:
        return round(statistics.median(values) * 1000, 1) if found else float("nan")

    return {
        "partitions": partitions,
        "rate": rate,
        "load": round(load, 2),
        "ack_p50_ms": round(percentile(acks, 50), 1),
        "e2e_p50_ms": round(percentile(e2e, 50), 1),
        "e2e_minus_ack_ms": round(percentile(e2e, 50) - percentile(acks, 50), 1),
        "commits": len(found),
        "commits_per_find": round(len(found) / max(len(finds), 1), 2),
        "rounds_per_look": dict(collections.Counter(len(r) for r in probe.looks)),
        "look_start_after_stamp_ms": p50(f[0] for f in found),
        "look_ms": p50(f[1] - f[0] for f in found),
        "decode_apply_ms": p50(f[2] - f[1] for f in found),
        # The consumer's process CPU (its s3fs thread too) per commit found.
        "cpu_ms_per_commit": round(cpu / max(len(found), 1) * 1000, 1),
        "cpu_share": round(cpu / wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="8:1000,64:5000", help="partitions:records/s, ...")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the proxy's delay")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--name", default="tail_breakdown")
    args = parser.parse_args()
    cases = [(int(p), float(r)) for p, r in (c.split(":") for c in args.cases.split(","))]
    probe = Probe()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kstore-tail-") as work:
        backend = many_writers.Backend("s3like", Path(work), args.delay_ms)
        try:
            for k in range(args.rounds):
                for partitions, rate in cases:
                    row = {"round": k, **run_case(backend, probe, partitions, rate, args)}
                    rows.append(row)
                    print(row, flush=True)
        finally:
            backend.close()
    columns = [
        "partitions",
        "round",
        "load",
        "ack_p50_ms",
        "e2e_minus_ack_ms",
        "look_start_after_stamp_ms",
        "look_ms",
        "decode_apply_ms",
        "commits_per_find",
        "cpu_ms_per_commit",
    ]
    print(table(rows, columns))
    path = write_results(args.name, {"delay_ms": args.delay_ms, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
