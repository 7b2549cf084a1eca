"""How long does opening a partition take, as a function of its history?

Checkpoints (every ``checkpoint.interval`` commits, 100 by default) hold the whole partition
state, so opening a partition should read one checkpoint plus fewer than 100 commits, whatever
the number of commits before it. This benchmark builds, on the local disk, one-partition
topics (one topic log; each append a range of a data object in ``_data/``, as a producer flush
writes it), partition 0 of each opened from the topic log's checkpoint (a top file and the
partition's sidecar in ``_sidecars/``):

- ``small``: a partition with 100 commits (100 appends, so 100 live segments);
- ``large``: a partition with 10,000 commits (10,000 appends, so 10,000 live segments);
- ``large-history``: 10,000 commits of which 100 are appends and the rest only record a
  transaction identifier: a long history, but the same state size as ``small``;
- ``large-replay`` (the baseline): the ``large`` log with its checkpoints removed, so opening
  it replays every commit, which is what checkpoints are there to avoid.

A checkpoint holds the whole state, so ``large`` costs more than ``small`` in proportion to its
live segments (its checkpoint lists 10,000 of them; merging and retention keep that number
down in practice), while ``large-history`` shows the cost of history alone.

Each is opened several times with a fresh :class:`kstore.Store` (``Partition.state()``), the
cases taking turns, and the median times are printed with their ratios and written to
benchmarks/results/open_partition.json.

Run: ``.venv/bin/python benchmarks/open_partition.py [--large 10000] [--repeat 7]``
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_results
from kstore import Store
from kstore.layout import topic_data_dir
from kstore.segments import TIMESTAMP_TYPE, write_data_object

TOPIC = "bench"


def build(root: str, commits: int, appends: int | None = None) -> str:
    """A store at ``root`` whose partition 0 of TOPIC has ``commits`` commits, the first
    ``appends`` of them (all by default) appends of one small segment each (a range of a data
    object, as a producer flush writes it) and the rest commits that only record a transaction
    identifier (as an empty streaming micro-batch does), so that the history is long but the
    state small. Returns the topic log's directory."""
    appends = commits if appends is None else appends
    store = Store(root)
    meta = store.create_topic(TOPIC, 1)
    partition = store.partition(TOPIC, 0)
    incarnation = topic_data_dir(TOPIC, meta.topic_id)
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
            files = write_data_object(
                store.storage, incarnation, [(0, table, partition.layout)], durable=False
            )
            partition.commit_segments([files[0]], durable=False)
        else:
            txn = {"txn": {"appId": "bench-query", "version": i}}
            partition.commit_actions(lambda state, a=txn: [a], operation="TXN", durable=False)
    state = partition.state()
    assert state.version == commits - 1, (state.version, commits)
    assert state.end_offset == appends
    assert len(state.segments) == appends
    assert all(s.byte_range is not None for s in state.segments)
    return os.path.join(root, incarnation, "_log")


def open_once(root: str, expect_version: int) -> float:
    """Seconds to open the partition with a fresh Store."""
    started = time.perf_counter()
    store = Store(root, create=False)
    state = store.partition(TOPIC, 0).state()
    elapsed = time.perf_counter() - started
    assert state.version == expect_version, (state.version, expect_version)
    return elapsed


def files_under(directory: str) -> tuple[int, int]:
    """(files, bytes) of the checkpoint files in a log directory and its sidecars."""
    count = size = 0
    for folder in (directory, os.path.join(os.path.dirname(directory), "_sidecars")):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            if ".checkpoint." in name or folder.endswith("_sidecars"):
                count += 1
                size += os.path.getsize(os.path.join(folder, name))
    return count, size


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    if args.small < 1 or args.large < args.small or args.repeat < 1:
        raise SystemExit("need 1 <= --small <= --large and --repeat >= 1")

    load_before = [round(x, 2) for x in os.getloadavg()]
    work = tempfile.mkdtemp(prefix="kstore-bench-open-")
    try:
        roots = {
            name: os.path.join(work, name)
            for name in ("small", "large", "large-history", "large-replay")
        }
        t0 = time.perf_counter()
        build(roots["small"], args.small)
        large_log = build(roots["large"], args.large)
        build(roots["large-history"], args.large, appends=args.small)
        build_s = time.perf_counter() - t0
        # The baseline: the same log without checkpoints, so opening replays every commit.
        shutil.copytree(roots["large"], roots["large-replay"])
        replay_log = large_log.replace(roots["large"], roots["large-replay"], 1)
        for name in os.listdir(replay_log):
            if ".checkpoint." in name or name == "_last_checkpoint":
                os.unlink(os.path.join(replay_log, name))

        cases = [
            ("small", args.small, args.small),
            ("large", args.large, args.large),
            ("large-history", args.large, args.small),
            ("large-replay", args.large, args.large),
        ]
        times: dict[str, list[float]] = {name: [] for name, *_ in cases}
        for name, commits, _ in cases:
            open_once(roots[name], commits - 1)  # warm the page cache and imports
        for _ in range(args.repeat):  # the cases take turns: a slow spell falls on all
            for name, commits, _ in cases:
                times[name].append(open_once(roots[name], commits - 1))
        rows: dict[str, dict[str, Any]] = {}
        for name, commits, segments in cases:
            rows[name] = {
                "commits": commits,
                "live_segments": segments,
                "median_ms": statistics.median(times[name]) * 1000,
                "min_ms": min(times[name]) * 1000,
                "max_ms": max(times[name]) * 1000,
                "runs_ms": [t * 1000 for t in times[name]],
            }
        checkpoints = {
            "large": dict(zip(("files", "bytes"), files_under(large_log), strict=True)),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(name: str) -> float:
        return float(rows[name]["median_ms"])

    result = {
        "storage": "local disk",
        "checkpoint_interval": 100,
        "repeat": args.repeat,
        "build_seconds": build_s,
        "checkpoint_files": checkpoints,
        "cases": rows,
        "ratio_large_over_small": med("large") / med("small"),
        "ratio_large_history_over_small": med("large-history") / med("small"),
        "ratio_replay_over_large": med("large-replay") / med("large"),
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "pyarrow": pa.__version__,
        "platform": platform.platform(),
    }

    print(
        f"{'case':<15}{'commits':>9}{'segments':>10}{'median ms':>12}{'min ms':>10}{'max ms':>10}"
    )
    for name, row in rows.items():
        print(
            f"{name:<15}{row['commits']:>9}{row['live_segments']:>10}"
            f"{row['median_ms']:>12.2f}{row['min_ms']:>10.2f}{row['max_ms']:>10.2f}"
        )
    print(f"ratio large / small:          {result['ratio_large_over_small']:6.2f}x")
    print(f"ratio large-history / small:  {result['ratio_large_history_over_small']:6.2f}x")
    print(f"ratio large-replay / large:   {result['ratio_replay_over_large']:6.2f}x")
    print(f"checkpoint files: {checkpoints}")
    print(f"load average before {load_before}, after {result['load_after']}")
    print(f"wrote {write_results('open_partition', result)}")
    return result


if __name__ == "__main__":
    main()
