"""How long does opening a partition take, as a function of its history?

Checkpoints (every ``checkpoint.interval`` commits, 100 by default) hold the whole partition
state, so opening a partition should read one checkpoint plus fewer than 100 commits, whatever
the number of commits before it. This benchmark builds, on the local disk:

- ``small``: a partition with 100 commits (100 appends, so 100 live segments);
- ``large``: a partition with 10,000 commits (10,000 appends, so 10,000 live segments);
- ``large-history``: 10,000 commits of which 100 are appends and the rest only record a
  transaction identifier: a long history, but the same state size as ``small``;
- ``large-replay`` (the baseline): the ``large`` log with its checkpoints removed, so opening
  it replays every commit, which is what checkpoints are there to avoid.

A checkpoint holds the whole state, so ``large`` costs more than ``small`` in proportion to its
live segments (its checkpoint lists 10,000 of them; merging and retention keep that number
down in practice), while ``large-history`` shows the cost of history alone.

Each is opened several times with a fresh :class:`kstore.Store` (``Partition.state()``), and the
median times are printed with their ratios and written to benchmarks/results/open_partition.json.

Run: ``.venv/bin/python benchmarks/open_partition.py [--large 10000] [--repeat 7]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from kstore import Store
from kstore.segments import TIMESTAMP_TYPE

TOPIC = "bench"
RESULTS = Path(__file__).resolve().parent / "results" / "open_partition.json"


def build(root: str, commits: int, appends: int | None = None) -> str:
    """A store at ``root`` whose partition 0 of TOPIC has ``commits`` commits, the first
    ``appends`` of them (all by default) appends of one small segment each and the rest
    commits that only record a transaction identifier (as an empty streaming micro-batch
    does), so that the history is long but the state small. Returns the log directory."""
    appends = commits if appends is None else appends
    store = Store(root)
    meta = store.create_topic(TOPIC, 1)
    partition = store.partition(TOPIC, 0)
    for i in range(commits):
        # durable=False only to build the fixture quickly; opening is what is measured.
        if i < appends:
            table = pa.table(
                {
                    "key": pa.array([b"k%d" % i], pa.binary()),
                    "value": pa.array([b"v" * 100], pa.binary()),
                    "timestamp": pa.array([1_700_000_000_000_000 + i * 1000], TIMESTAMP_TYPE),
                }
            )
            partition.append(table, durable=False)
        else:
            txn = {"txn": {"appId": "bench-query", "version": i}}
            partition.commit_actions(lambda state, a=txn: [a], operation="TXN", durable=False)
    state = partition.state()
    assert state.version == commits - 1
    assert state.end_offset == appends
    assert len(state.segments) == appends
    return os.path.join(root, "topics", TOPIC, meta.topic_id, "0", "_log")


def time_open(root: str, repeat: int, expect_version: int) -> list[float]:
    """Seconds to open the partition with a fresh Store, ``repeat`` times."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        store = Store(root, create=False)
        state = store.partition(TOPIC, 0).state()
        times.append(time.perf_counter() - started)
        assert state.version == expect_version, (state.version, expect_version)
    return times


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    work = tempfile.mkdtemp(prefix="kstore-bench-open-")
    try:
        small_root = os.path.join(work, "small")
        large_root = os.path.join(work, "large")
        history_root = os.path.join(work, "large-history")
        replay_root = os.path.join(work, "large-replay")
        t0 = time.perf_counter()
        build(small_root, args.small)
        large_log = build(large_root, args.large)
        build(history_root, args.large, appends=args.small)
        build_s = time.perf_counter() - t0
        # The baseline: the same log without checkpoints, so opening replays every commit.
        shutil.copytree(large_root, replay_root)
        replay_log = large_log.replace(large_root, replay_root, 1)
        for name in os.listdir(replay_log):
            if ".checkpoint." in name or name == "_last_checkpoint":
                os.unlink(os.path.join(replay_log, name))
        checkpoints = sorted(n for n in os.listdir(large_log) if ".checkpoint." in n)

        cases = [
            ("small", small_root, args.small, args.small),
            ("large", large_root, args.large, args.large),
            ("large-history", history_root, args.large, args.small),
            ("large-replay", replay_root, args.large, args.large),
        ]
        rows: dict[str, dict[str, Any]] = {}
        for name, root, commits, segments in cases:
            time_open(root, 1, commits - 1)  # warm the page cache and imports
            times = time_open(root, args.repeat, commits - 1)
            rows[name] = {
                "commits": commits,
                "live_segments": segments,
                "median_ms": statistics.median(times) * 1000,
                "min_ms": min(times) * 1000,
                "max_ms": max(times) * 1000,
                "runs_ms": [t * 1000 for t in times],
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)

    small = rows["small"]["median_ms"]
    large = rows["large"]["median_ms"]
    history = rows["large-history"]["median_ms"]
    replay = rows["large-replay"]["median_ms"]
    result = {
        "benchmark": "open_partition",
        "storage": "local disk",
        "checkpoint_interval": 100,
        "repeat": args.repeat,
        "build_seconds": build_s,
        "large_checkpoints": len(checkpoints),
        "cases": rows,
        "ratio_large_over_small": large / small,
        "ratio_large_history_over_small": history / small,
        "ratio_replay_over_large": replay / large,
        "python": sys.version.split()[0],
        "pyarrow": pa.__version__,
        "machine": platform.machine(),
    }

    print(
        f"{'case':<15}{'commits':>9}{'segments':>10}{'median ms':>12}{'min ms':>10}{'max ms':>10}"
    )
    for name, row in rows.items():
        print(
            f"{name:<15}{row['commits']:>9}{row['live_segments']:>10}{row['median_ms']:>12.2f}"
            f"{row['min_ms']:>10.2f}{row['max_ms']:>10.2f}"
        )
    print(f"ratio large / small:          {large / small:6.2f}x  (100x the live segments)")
    print(f"ratio large-history / small:  {history / small:6.2f}x  (100x the history, same state)")
    print(f"ratio large-replay / large:   {replay / large:6.2f}x  (no checkpoints: what they save)")

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
