"""Streaming from one kstore topic to another, exactly once: the sink records the query's
(id, batch) in each partition commit, so a micro-batch replayed after a failure adds nothing.

Run: ``python examples/spark_stream_copy.py``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from kstore import Store
from kstore.producer import Producer


def main(spark: Any = None, work: Path | None = None) -> int:
    work = work or Path(tempfile.mkdtemp(prefix="kstore-copy-"))
    url = (work / "store").as_uri()
    store = Store(url)
    store.create_topic("orders", partitions=3)
    store.create_topic("orders-upper", partitions=3)
    with Producer(store) as producer:
        for i in range(1_500):
            producer.send("orders", key=b"customer-%d" % (i % 9), value=b"order %d" % i)
    own = spark is None
    if own:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.master("local[2]").appName("kstore-copy").getOrCreate()
    from kstore.spark_ext import register

    register(spark)
    query = (
        spark.readStream.format("kstore")
        .option("store", url)
        .option("subscribe", "orders")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 500)
        .load()
        .selectExpr("key", "upper(CAST(value AS STRING)) AS value")
        .writeStream.format("kstore")
        .option("store", url)
        .option("topic", "orders-upper")
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    copied = sum(d.records for d in store.describe_topic("orders-upper").partitions)
    print(
        f"copied {copied} records in {sum(1 for p in query.recentProgress if p['numInputRows'])} micro-batches"
    )
    if own:
        spark.stop()
    return copied


if __name__ == "__main__":
    main()
