"""Typed topics against JSON values: a Spark aggregation over 2 of 20 fields.

The same records are written twice, in one run: to a typed topic (20 declared fields stored as
Arrow columns) and to a binary topic whose values are the same records as JSON. The query sums
one field grouped by another:

- typed: ``spark.read.format("kstore").schema(<value with the 2 fields>)`` then ``groupBy``;
  the user schema is how a Python data source prunes (PySpark 4.3 pushes no columns down), so
  only the 2 fields travel to Spark;
- JSON: ``from_json(CAST(value AS STRING), <20-field schema>)`` then the same ``groupBy``, the
  way a Kafka topic's values are usually read.

Both are timed ``--repeat`` times after a warm-up; the ratio is JSON time / typed time. Results
go to benchmarks/results/typed_topics.json.

    .venv/bin/python benchmarks/typed_topics.py --records 2000000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_results
from kstore import Store
from kstore.producer import Producer

FIELDS = 20


def value_schema() -> pa.Schema:
    """20 fields: a category, an amount, and 18 others of mixed types."""
    fields = [pa.field("category", pa.string()), pa.field("amount", pa.float64())]
    for i in range(FIELDS - 2):
        kind = (pa.int64(), pa.string(), pa.float64())[i % 3]
        fields.append(pa.field(f"f{i:02d}", kind))
    return pa.schema(fields)


def columns(start: int, count: int, rng: np.random.Generator) -> dict[str, pa.Array]:
    out: dict[str, pa.Array] = {
        "category": pa.array([f"c{n}" for n in rng.integers(0, 50, count)]),
        "amount": pa.array(np.round(rng.random(count) * 100, 2)),
    }
    for i, f in enumerate(value_schema()):
        if i < 2:
            continue
        if f.type == pa.int64():
            out[f.name] = pa.array(rng.integers(0, 1_000_000, count))
        elif f.type == pa.float64():
            out[f.name] = pa.array(np.round(rng.random(count) * 1000, 3))
        else:
            out[f.name] = pa.array([f"text-{n}" for n in rng.integers(0, 100_000, count)])
    out["id"] = pa.array(np.arange(start, start + count))  # only for the key
    return out


def build(store: Store, total: int, partitions: int, chunk: int) -> None:
    schema = value_schema()
    store.create_topic("typed", partitions, value_schema=schema)
    store.create_topic("json", partitions)
    rng = np.random.default_rng(7)
    with Producer(store, linger_ms=50, batch_size=64 << 20) as producer:
        for start in range(0, total, chunk):
            count = min(chunk, total - start)
            cols = columns(start, count, rng)
            keys = pc.cast(pc.cast(cols.pop("id"), pa.string()), pa.binary())
            typed = pa.table({"key": keys, **cols})
            producer.send_batch("typed", typed)
            rows = pa.table(cols).to_pylist()
            values = pa.array([json.dumps(r, separators=(",", ":")).encode() for r in rows])
            producer.send_batch("json", pa.table({"key": keys, "value": values}))
        producer.flush()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--records", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--chunk", type=int, default=250_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--master", default="local[*]")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from kstore.spark_ext import register
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master(args.master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    with tempfile.TemporaryDirectory() as root:
        store = Store(root)
        started = time.perf_counter()
        build(store, args.records, args.partitions, args.chunk)
        build_s = time.perf_counter() - started
        sizes = {
            topic: sum(p.size_bytes for p in store.describe_topic(topic).partitions)
            for topic in ("typed", "json")
        }
        ddl = ", ".join(
            f"{f.name} {'STRING' if f.type == pa.string() else 'DOUBLE' if f.type == pa.float64() else 'BIGINT'}"
            for f in value_schema()
        )

        def typed_query() -> list[Any]:
            df = (
                spark.read.format("kstore")
                .schema("value STRUCT<category: STRING, amount: DOUBLE>")
                .option("store", root)
                .option("subscribe", "typed")
                .load()
            )
            return df.groupBy("value.category").sum("value.amount").orderBy("category").collect()

        def json_query() -> list[Any]:
            df = (
                spark.read.format("kstore").option("store", root).option("subscribe", "json").load()
            )
            parsed = df.selectExpr(f"from_json(CAST(value AS STRING), '{ddl}') AS v")
            return parsed.groupBy("v.category").sum("v.amount").orderBy("category").collect()

        def timed(query: Any) -> tuple[list[float], list[Any]]:
            query()  # warm-up: Spark's first plan of a query shape costs extra
            times = []
            result: list[Any] = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                result = query()
                times.append(time.perf_counter() - t0)
            return times, result

        typed_times, typed_rows = timed(typed_query)
        json_times, json_rows = timed(json_query)
        # Both queries must agree, or the comparison means nothing.
        assert [r[0] for r in typed_rows] == [r[0] for r in json_rows]
        for a, b in zip(typed_rows, json_rows, strict=True):
            assert abs(a[1] - b[1]) < 1e-6 * max(1.0, abs(b[1])), (a, b)
    spark.stop()
    typed_s = statistics.median(typed_times)
    json_s = statistics.median(json_times)
    result = {
        "records": args.records,
        "fields": FIELDS,
        "partitions": args.partitions,
        "build_s": round(build_s, 2),
        "bytes_typed": sizes["typed"],
        "bytes_json": sizes["json"],
        "typed_median_s": typed_s,
        "json_median_s": json_s,
        "typed_runs_s": typed_times,
        "json_runs_s": json_times,
        "ratio_json_over_typed": json_s / typed_s,
        "command": "benchmarks/typed_topics.py " + " ".join(argv or sys.argv[1:]),
    }
    write_results("typed_topics", result)
    print(
        f"{args.records:,} records x {FIELDS} fields, sum(amount) by category:\n"
        f"  typed topic, 2 fields read : {typed_s:.2f} s (median of {args.repeat})\n"
        f"  JSON values + from_json    : {json_s:.2f} s\n"
        f"  ratio JSON / typed         : {json_s / typed_s:.2f}x\n"
        f"  stored bytes typed / JSON  : {sizes['typed']:,} / {sizes['json']:,}"
    )
    return result


if __name__ == "__main__":
    main()
