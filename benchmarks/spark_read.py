"""Spark reading a kstore topic versus Spark reading the same records from Parquet.

One run builds, on the local disk, a topic of ``--records`` records (``--partitions``
partitions, segments of ``--segment-records`` records, 100-byte values, 16-byte keys, one
header on every tenth record) and writes the very same rows (every column the kstore source
returns) to Parquet with Spark's default codec (snappy), one file per partition. Then, in one
Spark session, alternating the two so that machine noise hits both alike:

- ``kstore``: ``spark.read.format("kstore")`` of the topic,
- ``parquet`` (the baseline): ``spark.read.parquet`` of the same rows,

each followed by an aggregate over every column (so no column can be skipped). The medians
and the ratio (kstore speed / Parquet speed; the target is at least 0.7) are printed and
written to benchmarks/results/spark_read.json, with a streaming figure: records/s of a
kstore-to-kstore copy query (availableNow, ``--trigger-records`` offsets per micro-batch).

``--write producer`` writes each round of segments through the producer (one data object per
round with a range per partition) and ``--merge`` runs the merge job before reading (ranges become per-partition
Parquet segments).

Run: ``.venv/bin/python benchmarks/spark_read.py [--records 2000000] [--repeat 5]
[--write producer --merge] [--out PATH]``
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
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kstore import Store
from kstore.producer import Producer
from kstore.segments import HEADERS_TYPE, RECORD_SCHEMA, TIMESTAMP_TYPE

TOPIC = "bench"
SINK = "bench-copy"
RESULTS = Path(__file__).resolve().parent / "results" / "spark_read.json"
AGGREGATE = (
    "count(*) AS records",
    "sum(length(key)) AS key_bytes",
    "sum(length(value)) AS value_bytes",
    "count(DISTINCT topic) AS topics",
    "sum(partition) AS partitions",
    "sum(offset) AS offsets",
    "max(timestamp) AS newest",
    "sum(timestampType) AS types",
    "sum(size(headers)) AS headers",
)


def records(start: int, count: int, rng: np.random.Generator) -> pa.Table:
    """``count`` records numbered from ``start``: 16-byte keys, 100-byte values."""
    numbers = np.arange(start, start + count)
    keys = pa.array([b"key-%012d" % (n % 100_003) for n in numbers], pa.binary())
    payload = rng.integers(0, 256, size=(count, 100), dtype=np.uint8).tobytes()
    values = pa.Array.from_buffers(
        pa.binary(),
        count,
        [
            None,
            pa.py_buffer(np.arange(0, 100 * count + 1, 100, dtype=np.int32)),
            pa.py_buffer(payload),
        ],
    )
    stamps = pa.array(1_700_000_000_000_000 + numbers * 1000, pa.int64()).cast(TIMESTAMP_TYPE)
    headers = pa.array(
        [[{"key": "trace", "value": b"%d" % n}] if n % 10 == 0 else None for n in numbers],
        HEADERS_TYPE,
    )
    return pa.Table.from_arrays([keys, values, stamps, headers], schema=RECORD_SCHEMA)


def build(
    root: str,
    parquet_dir: str,
    total: int,
    partitions: int,
    segment_records: int,
    *,
    write: str = "append",
) -> None:
    """The topic and its Parquet twin. ``write``: ``append`` writes each segment with
    Partition.append (a per-partition file); ``producer`` sends one table per round through
    the producer, so that every flush is one data object holding a range of every
    partition (what producers write)."""
    store = Store(Path(root).as_uri())
    store.create_topic(TOPIC, partitions)
    store.create_topic(SINK, partitions)
    rng = np.random.default_rng(7)
    per_partition = total // partitions
    os.makedirs(parquet_dir, exist_ok=True)
    number = 0
    pieces: dict[int, list[pa.Table]] = {p: [] for p in range(partitions)}
    producer = (
        Producer(store, linger_ms=60_000, buffer_memory=1 << 31) if write == "producer" else None
    )
    try:
        for offset in range(0, per_partition, segment_records):
            count = min(segment_records, per_partition - offset)
            round_tables = []
            for p in range(partitions):
                table = records(number, count, rng)
                number += count
                pieces[p].append(table)
                if producer is None:
                    # durable=False only to build the fixture quickly; reading is measured.
                    store.partition(TOPIC, p).append(table, durable=False)
                else:
                    round_tables.append(
                        table.append_column("partition", pa.array(np.full(count, p, np.int32)))
                    )
            if producer is not None:
                producer.send_batch(TOPIC, pa.concat_tables(round_tables))
                producer.flush()
    finally:
        if producer is not None:
            producer.close()
    for p in range(partitions):
        whole = pa.concat_tables(pieces[p])
        n = whole.num_rows
        rows = pa.table(
            {
                "key": whole.column("key"),
                "value": whole.column("value"),
                "topic": pa.array([TOPIC] * n, pa.string()),
                "partition": pa.array(np.full(n, p, np.int32)),
                "offset": pa.array(np.arange(n, dtype=np.int64)),
                "timestamp": whole.column("timestamp"),
                "timestampType": pa.array(np.zeros(n, np.int32)),
                "headers": whole.column("headers"),
            }
        )
        pq.write_table(
            rows, os.path.join(parquet_dir, f"part-{p:05d}.parquet"), compression="snappy"
        )


def live_segments(root: str) -> dict[str, int]:
    """How the topic's live records are stored: ranges of data objects, per-partition files."""
    store = Store(Path(root).as_uri())
    meta = store.topic(TOPIC)
    counts = {"ranged": 0, "files": 0}
    for p in range(meta.partitions):
        for seg in store.partition_state(TOPIC, p, meta).segments:
            counts["ranged" if seg.byte_range is not None else "files"] += 1
    return counts


def timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--segment-records", type=int, default=250_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--trigger-records", type=int, default=500_000)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument(
        "--write",
        choices=("append", "producer"),
        default="append",
        help="append: one file per segment; producer: one producer flush per round "
        "(a data object with a range per partition)",
    )
    parser.add_argument(
        "--merge", action="store_true", help="run the merge job (in process) before reading"
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    warnings.filterwarnings("ignore", message="PySpark does not yet fully support pandas")
    from kstore.spark_ext import register
    from pyspark.sql import SparkSession

    work = tempfile.mkdtemp(prefix="kstore-bench-spark-")
    root = os.path.join(work, "store")
    parquet_dir = os.path.join(work, "parquet")
    spark = None
    try:
        t0 = time.perf_counter()
        build(
            root,
            parquet_dir,
            args.records,
            args.partitions,
            args.segment_records,
            write=args.write,
        )
        build_s = time.perf_counter() - t0
        stored = {"before_merge": live_segments(root)}
        merge_s = None
        if args.merge:
            from kstore.compaction import merge_segments

            merge_s, _ = timed(
                lambda: merge_segments(None, Path(root).as_uri(), None, [TOPIC], verbose=False)
            )
            stored["after_merge"] = live_segments(root)
        print(f"built in {build_s:.1f} s; live segments {stored}", flush=True)
        spark = (
            SparkSession.builder.master(args.master)
            .appName("kstore-bench-spark-read")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        url = Path(root).as_uri()

        def run_kstore() -> Any:
            df = spark.read.format("kstore").option("store", url).option("subscribe", TOPIC)
            return df.option("includeHeaders", "true").load().selectExpr(*AGGREGATE).collect()[0]

        def run_parquet() -> Any:
            return spark.read.parquet(parquet_dir).selectExpr(*AGGREGATE).collect()[0]

        # Warm-up: JVM JIT, Python workers, page cache, for both.
        _, kstore_row = timed(run_kstore)
        _, parquet_row = timed(run_parquet)
        assert kstore_row == parquet_row, (kstore_row, parquet_row)
        assert kstore_row["records"] == (args.records // args.partitions) * args.partitions
        kstore_times: list[float] = []
        parquet_times: list[float] = []
        for _ in range(args.repeat):
            kstore_times.append(timed(run_kstore)[0])
            parquet_times.append(timed(run_parquet)[0])

        # Streaming: copy the topic into another with availableNow, several micro-batches.
        checkpoint = os.path.join(work, "checkpoint")
        query = (
            spark.readStream.format("kstore")
            .option("store", url)
            .option("subscribe", TOPIC)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(args.trigger_records))
            .load()
            .selectExpr("key", "value", "timestamp")
            .writeStream.format("kstore")
            .option("store", url)
            .option("topic", SINK)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
        )
        stream_s, handle = timed(lambda: query.start())
        wait_s, _ = timed(handle.awaitTermination)
        stream_s += wait_s
        copied = sum(
            p.end_offset
            for p in (Store(url).partition(SINK, i).state() for i in range(args.partitions))
        )
        batches = len([p for p in handle.recentProgress if p["numInputRows"] > 0])
        assert copied == kstore_row["records"], (copied, kstore_row["records"])
    finally:
        if spark is not None:
            spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    kstore_s = statistics.median(kstore_times)
    parquet_s = statistics.median(parquet_times)
    ratio = parquet_s / kstore_s
    result = {
        "benchmark": "spark_read",
        "storage": "local disk",
        "records": int(kstore_row["records"]),
        "partitions": args.partitions,
        "segment_records": args.segment_records,
        "value_bytes": 100,
        "repeat": args.repeat,
        "build_seconds": build_s,
        "write": args.write,
        "merged": args.merge,
        "merge_seconds": merge_s,
        "live_segments": stored,
        "kstore_median_s": kstore_s,
        "parquet_median_s": parquet_s,
        "kstore_runs_s": kstore_times,
        "parquet_runs_s": parquet_times,
        "kstore_records_per_s": kstore_row["records"] / kstore_s,
        "parquet_records_per_s": kstore_row["records"] / parquet_s,
        "speed_ratio_kstore_over_parquet": ratio,
        "target_ratio": 0.7,
        "stream_copy_seconds": stream_s,
        "stream_copy_batches": batches,
        "stream_copy_records_per_s": copied / stream_s,
        "master": args.master,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "pyarrow": pa.__version__,
        "machine": platform.machine(),
    }
    print(f"{'read':<10}{'median s':>10}{'records/s':>14}")
    print(f"{'kstore':<10}{kstore_s:>10.3f}{result['kstore_records_per_s']:>14,.0f}")
    print(f"{'parquet':<10}{parquet_s:>10.3f}{result['parquet_records_per_s']:>14,.0f}")
    print(f"speed ratio kstore / parquet: {ratio:.2f}x (target >= 0.70)")
    print(
        f"streaming kstore->kstore copy: {copied:,} records in {stream_s:.1f} s, {batches} micro-batches, "
        f"{result['stream_copy_records_per_s']:,.0f} records/s"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
