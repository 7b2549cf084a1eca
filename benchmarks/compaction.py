"""Compaction throughput against DuckDB deduplicating the same records, in the same run.

The data: ``--records`` records (10M) over ``--keys`` keys (1M), keys drawn uniformly at random,
100-byte incompressible values, written to one partition of a compacted topic as
``--segments`` producer segments (Arrow IPC) on the local disk; and the very same records, with
their offsets, as one Parquet file for DuckDB. Both sides write uncompressed Parquet.

Measured (median of ``--repeat`` runs, each on a fresh copy of the data):

- ``kstore``: compaction of the partition (``kstore.compaction.compact_partition``, the job's
  per-partition function, in this process): read and verify every segment, build the offset
  map, filter, write sparse Parquet, commit;
- ``kstore-spark`` (with ``--spark``): the same through ``run_compaction`` on a local Spark
  session (one task), including Spark's job overhead;
- ``duckdb``: ``COPY (SELECT ... FROM read_parquet(...) QUALIFY row_number() OVER (PARTITION
  BY key ORDER BY offset DESC) = 1 ORDER BY offset) TO ... (FORMAT parquet)``: read, keep the
  latest record of each key in offset order, write. (``arg_max`` per key is also timed and
  the faster of the two is the baseline.)

The target: kstore within 3x of DuckDB's time. MB/s is input bytes (the segments' size) per
second. Results print as a table and go to benchmarks/results/compaction.json.

Run: ``.venv/bin/python benchmarks/compaction.py [--records 10000000] [--keys 1000000] [--spark]``
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

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from kstore.compaction import compact_partition, run_compaction
from kstore.compaction.jobs import WorkItem

from kstore import Store
from kstore.segments import TIMESTAMP_TYPE

TOPIC = "bench"
RESULTS = Path(__file__).resolve().parent / "results" / "compaction.json"
CONFIG = {
    "cleanup.policy": "compact",
    "min.cleanable.dirty.ratio": 0.0,
    "compression.type": "uncompressed",
}


def make_records(records: int, keys: int, value_bytes: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    key_ids = rng.integers(0, keys, records)
    key_width = len(str(keys))
    key_table = pa.array([b"key-%0*d" % (key_width, i) for i in range(keys)], pa.binary())
    values = pa.Array.from_buffers(
        pa.binary(),
        records,
        [
            None,
            pa.py_buffer(np.arange(0, (records + 1) * value_bytes, value_bytes, dtype=np.int32)),
            pa.py_buffer(rng.bytes(records * value_bytes)),
        ],
    )
    stamp = (int(time.time() * 1000) - 3_600_000) * 1000
    return pa.table(
        {
            "key": key_table.take(pa.array(key_ids)),
            "value": values,
            "timestamp": pa.array(np.full(records, stamp, np.int64)).cast(TIMESTAMP_TYPE),
        }
    )


def build(root: Path, data: pa.Table, segments: int) -> tuple[str, int]:
    """The partition (returns the store URL and its bytes) and DuckDB's Parquet input."""
    store = Store(str(root / "store"))
    store.create_topic(TOPIC, 1, CONFIG)
    part = store.partition(TOPIC, 0)
    per = -(-data.num_rows // segments)
    for start in range(0, data.num_rows, per):
        part.append(data.slice(start, per), durable=False)
    with_offsets = data.append_column("offset", pa.array(np.arange(data.num_rows, dtype=np.int64)))
    pq.write_table(with_offsets, root / "input.parquet", compression="none")
    return str(root / "store"), part.state().size_bytes


def time_kstore(url: str) -> tuple[float, dict[str, Any]]:
    store = Store(url, create=False, segment_cache_bytes=0)
    meta = store.topic(TOPIC)
    item = WorkItem(TOPIC, meta.topic_id, 0, meta.effective_config)
    started = time.perf_counter()
    result = compact_partition(store, item, {"memory_bytes": 4 << 30})
    elapsed = time.perf_counter() - started
    assert result.outcome == "committed", result
    return elapsed, {"records_after": result.records_after, "bytes_after": result.bytes_after}


def time_kstore_spark(url: str, spark: Any) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    summary = run_compaction(spark, url, verbose=False, memory_bytes=4 << 30)
    elapsed = time.perf_counter() - started
    assert summary.count("committed") == 1, summary.format()
    return elapsed, {"records_after": summary.partitions[0].records_after}


DUCKDB_QUERIES = {
    "qualify": """COPY (SELECT key, value, "timestamp", "offset" FROM read_parquet('{src}')
                     QUALIFY row_number() OVER (PARTITION BY key ORDER BY "offset" DESC) = 1
                     ORDER BY "offset")
                  TO '{dst}' (FORMAT parquet, COMPRESSION uncompressed)""",
    "arg_max": """COPY (SELECT key, arg_max(value, "offset") AS value,
                            arg_max("timestamp", "offset") AS "timestamp", max("offset") AS "offset"
                       FROM read_parquet('{src}') GROUP BY key ORDER BY "offset")
                  TO '{dst}' (FORMAT parquet, COMPRESSION uncompressed)""",
}


def time_duckdb(root: Path, query: str) -> tuple[float, dict[str, Any]]:
    import duckdb

    out = root / f"duckdb-{query}.parquet"
    out.unlink(missing_ok=True)
    connection = duckdb.connect()
    started = time.perf_counter()
    connection.execute(DUCKDB_QUERIES[query].format(src=root / "input.parquet", dst=out))
    elapsed = time.perf_counter() - started
    rows = connection.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()
    connection.close()
    return elapsed, {"records_after": rows[0] if rows else None, "threads": os.cpu_count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--segments", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--spark", action="store_true", help="also time run_compaction on Spark")
    parser.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    args = parser.parse_args()

    work = Path(args.dir or tempfile.mkdtemp(prefix="kstore-bench-compaction-"))
    print(f"building {args.records:,} records over {args.keys:,} keys in {work} ...", flush=True)
    data = make_records(args.records, args.keys, args.value_bytes, seed=1)
    pristine = work / "pristine"
    pristine.mkdir(parents=True, exist_ok=True)
    _, input_bytes = build(pristine, data, args.segments)
    del data
    parquet_bytes = (pristine / "input.parquet").stat().st_size

    spark = None
    if args.spark:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")

    times: dict[str, list[float]] = {"kstore": [], "duckdb-qualify": [], "duckdb-arg_max": []}
    if spark is not None:
        times["kstore-spark"] = []
    details: dict[str, Any] = {}
    for run in range(args.repeat):
        for name in list(times):
            copy = work / f"run-{run}-{name}"
            shutil.copytree(pristine, copy)
            copy_url = str(copy / "store")
            if name == "kstore":
                elapsed, info = time_kstore(copy_url)
            elif name == "kstore-spark":
                elapsed, info = time_kstore_spark(copy_url, spark)
            else:
                elapsed, info = time_duckdb(copy, name.split("-", 1)[1])
            times[name].append(elapsed)
            details[name] = info
            shutil.rmtree(copy)
            print(f"  run {run + 1}/{args.repeat} {name:>15}: {elapsed:7.2f} s", flush=True)

    medians = {name: statistics.median(ts) for name, ts in times.items()}
    baseline_name = min(("duckdb-qualify", "duckdb-arg_max"), key=lambda n: medians[n])
    baseline = medians[baseline_name]
    rows = []
    for name, median in medians.items():
        source = parquet_bytes if name.startswith("duckdb") else input_bytes
        rows.append(
            {
                "name": name,
                "median_s": round(median, 3),
                "runs_s": [round(t, 3) for t in times[name]],
                "input_mb": round(source / 1e6, 1),
                "mb_per_s": round(source / 1e6 / median, 1),
                "records_per_s": round(args.records / median),
                "vs_duckdb": round(median / baseline, 2),
                **details.get(name, {}),
            }
        )
    print(f"\n{'':>15} {'median s':>9} {'MB/s':>8} {'records/s':>12} {'x duckdb':>9}")
    for row in rows:
        print(
            f"{row['name']:>15} {row['median_s']:9.2f} {row['mb_per_s']:8.1f} "
            f"{row['records_per_s']:12,} {row['vs_duckdb']:9.2f}"
        )
    verdict = medians["kstore"] <= 3 * baseline
    print(f"\nbaseline: {baseline_name}; kstore within 3x of DuckDB: {verdict}")
    assert details["kstore"]["records_after"] == details[baseline_name]["records_after"], details
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "compaction",
                "records": args.records,
                "keys": args.keys,
                "value_bytes": args.value_bytes,
                "segments": args.segments,
                "repeat": args.repeat,
                "baseline": baseline_name,
                "within_3x": verdict,
                "results": rows,
                "machine": {
                    "python": platform.python_version(),
                    "cpus": os.cpu_count(),
                    "pyarrow": pa.__version__,
                    "platform": platform.platform(),
                },
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")
    if spark is not None:
        spark.stop()
    if args.dir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
