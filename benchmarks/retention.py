"""Retention over 1,000 partitions: how long it takes, and evidence that it reads manifests only.

The store (local disk): ``--topics`` topics (10) of ``--partitions`` partitions each (100), so
1,000 partitions; each partition holds ``--segments`` small segments (10), the older half past
``retention.ms``. Measured, each on a fresh copy of the store:

- ``floor``: opening every partition's manifest in this process (``Partition.state()``), the
  least any retention must read (the baseline the others are compared with);
- ``in-process``: ``run_retention(None, ...)`` with an instrumented storage that counts every
  read and listing by kind (log files vs segment files): evidence 1, segment reads = 0;
- ``spark``: ``run_retention(spark, ...)`` on a local Spark session, one task per group of
  partitions, run on a copy of the store whose segment files have all been **deleted**: had it
  read a single segment, that partition would report an error (evidence 2).

Results print as a table and go to benchmarks/results/retention.json.

Run: ``.venv/bin/python benchmarks/retention.py [--topics 10] [--partitions 100] [--segments 10]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
from kstore.retention import run_retention

from kstore import Store
from kstore.segments import TIMESTAMP_TYPE
from kstore.storage import FileInfo, Storage

RESULTS = Path(__file__).resolve().parent / "results" / "retention.json"
HOUR = 3_600_000


class CountingStorage(Storage):
    """Counts reads and listings by kind of path."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.counts: Counter[str] = Counter()

    @staticmethod
    def kind(rel: str) -> str:
        if "/segments/" in rel or rel.endswith("/segments"):
            return "segment"
        if "/_log" in rel:
            return "log"
        return "other"

    def read(self, rel: str) -> bytes:
        self.counts[f"read {self.kind(rel)}"] += 1
        return super().read(rel)

    def list_dir(self, rel: str) -> list[FileInfo]:
        self.counts[f"list {self.kind(rel)}"] += 1
        return super().list_dir(rel)


def build(root: Path, topics: int, partitions: int, segments: int) -> int:
    store = Store(str(root))
    now = int(time.time() * 1000)
    for t in range(topics):
        name = f"topic-{t:03d}"
        store.create_topic(name, partitions, {"retention.ms": HOUR})
        for p in range(partitions):
            part = store.partition(name, p)
            for s in range(segments):
                age = 2 * HOUR if s < segments // 2 else 0  # the older half has expired
                stamp = (now - age) * 1000
                part.append(
                    pa.table(
                        {
                            "key": pa.array([b"k%d" % i for i in range(10)], pa.binary()),
                            "value": pa.array([b"v" * 100] * 10, pa.binary()),
                            "timestamp": pa.array([stamp] * 10, pa.int64()).cast(TIMESTAMP_TYPE),
                        }
                    ),
                    durable=False,
                )
    return topics * partitions


def copy_of(pristine: Path, name: str, *, without_segments: bool = False) -> Path:
    target = pristine.parent / name
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(pristine, target)
    deleted = 0
    if without_segments:
        for directory in target.glob("topics/*/*/*/segments"):
            shutil.rmtree(directory)
            deleted += 1
        assert deleted, "no segment directory found"
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--segments", type=int, default=10)
    parser.add_argument("--tasks", type=int, default=None, help="Spark tasks (default 4 per core)")
    parser.add_argument("--no-spark", action="store_true")
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="kstore-bench-retention-"))
    pristine = work / "pristine"
    print(
        f"building {args.topics * args.partitions} partitions x {args.segments} segments ...",
        flush=True,
    )
    started = time.perf_counter()
    count = build(pristine, args.topics, args.partitions, args.segments)
    print(f"  built in {time.perf_counter() - started:.1f} s", flush=True)
    expected_removed = count * (args.segments // 2)
    rows: list[dict[str, Any]] = []

    # Floor: read every manifest, decide nothing.
    target = copy_of(pristine, "floor")
    storage = CountingStorage(str(target))
    store = Store.from_storage(storage, create=False, segment_cache_bytes=0)
    started = time.perf_counter()
    for name in store.list_topics():
        meta = store.topic(name)
        for p in range(meta.partitions):
            store.partition(name, p, meta).state()
    floor = time.perf_counter() - started
    rows.append({"name": "floor (open manifests)", "seconds": round(floor, 3), **storage.counts})

    # In-process retention with counted storage access.
    target = copy_of(pristine, "in-process")
    storage = CountingStorage(str(target))
    store = Store.from_storage(storage, create=False, segment_cache_bytes=0)
    started = time.perf_counter()
    summary = run_retention(None, store, verbose=False)
    elapsed = time.perf_counter() - started
    assert summary.segments_removed == expected_removed, summary.format()
    assert not summary.errors, summary.format()
    # Evidence 1: not one segment file read, nor a segments/ directory listed.
    assert storage.counts["read segment"] == 0, storage.counts
    assert storage.counts["list segment"] == 0, storage.counts
    rows.append(
        {
            "name": "in-process",
            "seconds": round(elapsed, 3),
            "partitions": count,
            "segments_removed": summary.segments_removed,
            **storage.counts,
        }
    )

    if not args.no_spark:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        warm = copy_of(pristine, "warm-up", without_segments=True)
        run_retention(spark, str(warm), verbose=False, topics=["topic-000"])  # start the workers
        target = copy_of(pristine, "spark", without_segments=True)
        started = time.perf_counter()
        summary = run_retention(spark, str(target), verbose=False, tasks=args.tasks)
        elapsed = time.perf_counter() - started
        assert not summary.errors, summary.format()
        assert summary.segments_removed == expected_removed, summary.format()
        rows.append(
            {
                "name": "spark (segments deleted)",
                "seconds": round(elapsed, 3),
                "partitions": count,
                "tasks": summary.tasks,
                "segments_removed": summary.segments_removed,
                "errors": len(summary.errors),
            }
        )
        spark.stop()

    print(f"\n{'':>26} {'seconds':>8} {'x floor':>8}  storage access")
    for row in rows:
        row["vs_floor"] = round(row["seconds"] / floor, 2)
        access = ", ".join(f"{k} {v}" for k, v in row.items() if k.startswith(("read", "list")))
        print(f"{row['name']:>26} {row['seconds']:8.2f} {row['vs_floor']:8.2f}  {access}")
    print(
        "\nevidence: the in-process run read 0 segment files; the Spark run succeeded with every "
        "segment file deleted beforehand"
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "retention",
                "partitions": count,
                "segments_per_partition": args.segments,
                "results": rows,
                "machine": {
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                    "platform": platform.platform(),
                },
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")
    if args.dir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
