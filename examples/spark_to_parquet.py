"""Stream a kstore topic into Parquet files through ``foreachBatch``, exactly once.

Each micro-batch goes to its own directory, ``<output>/batch=<id>``, written in overwrite
mode: Spark replays a failed micro-batch with the same id and the same records (the kstore
source's offsets are in the checkpoint), so a replay replaces its own earlier partial output
instead of adding to it. Readers see the whole dataset as one table partitioned by ``batch``.

Run it on its own (it makes a store with sample records in a temporary directory)::

    .venv/bin/python examples/spark_to_parquet.py

or against a store: ``--store URL --topic NAME --output PATH --checkpoint PATH``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any


def parquet_batch_writer(output: str) -> Any:
    """The foreachBatch function: one directory per micro-batch, replaced on a replay."""

    def write(batch: Any, batch_id: int) -> None:
        (
            batch.selectExpr(
                "CAST(key AS STRING) AS key",
                "CAST(value AS STRING) AS value",
                "partition",
                "offset",
                "timestamp",
            )
            .write.mode("overwrite")
            .parquet(f"{output}/batch={batch_id}")
        )

    return write


def run(
    spark: Any,
    *,
    store: str,
    topic: str,
    output: str,
    checkpoint: str,
    max_offsets_per_trigger: int = 1000,
    storage_options: str | None = None,
) -> Any:
    """Copy everything in ``topic`` so far to Parquet under ``output`` (availableNow)."""
    reader = (
        spark.readStream.format("kstore")
        .option("store", store)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    )
    if storage_options:
        reader = reader.option("storageOptions", storage_options)
    query = (
        reader.load()
        .writeStream.foreachBatch(parquet_batch_writer(output))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    """Run the example; with ``spark`` given, in that session (left running)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--store")
    parser.add_argument("--topic", default="events")
    parser.add_argument("--output")
    parser.add_argument("--checkpoint")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from kstore.spark_ext import register
    from pyspark.sql import SparkSession

    work = Path(tempfile.mkdtemp(prefix="kstore-parquet-example-"))
    if args.store:
        store = args.store
    else:
        from kstore import Store
        from kstore.producer import Producer

        store = (work / "store").as_uri()
        Store(store).create_topic(args.topic, 3)
        with Producer(store) as producer:
            for i in range(1500):
                producer.send(args.topic, key=b"user-%d" % (i % 10), value=b"event-%d" % i)
    output = args.output or str(work / "parquet")
    checkpoint = args.checkpoint or str(work / "checkpoint")
    own_session = spark is None
    if own_session:
        spark = SparkSession.builder.master("local[2]").appName("kstore-to-parquet").getOrCreate()
        register(spark)
    query = run(spark, store=store, topic=args.topic, output=output, checkpoint=checkpoint)
    batches = sum(1 for p in query.recentProgress if p["numInputRows"] > 0)
    print(f"{spark.read.parquet(output).count()} records in {output} after {batches} micro-batches")
    if own_session:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
