"""Stream a kstore topic into a Delta table, exactly once, with the ``deltalake`` package.

delta-spark cannot run here (its JVM jars come from Maven), so each micro-batch is written by
delta-rs through ``foreachBatch``. Exactly-once comes from Delta's app transactions: every
append records ``Transaction(app_id, batch_id)`` in the same commit, and a batch whose id the
table already holds for this app id is skipped. Spark replays a micro-batch after a failure
with the same id and the same records (the kstore source's offsets are in the checkpoint), so
a replay adds nothing twice.

Run it on its own (it makes a store with sample records in a temporary directory)::

    .venv/bin/python examples/spark_to_delta.py

or against a store: ``--store URL --topic NAME --table PATH --checkpoint PATH``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake


def delta_batch_writer(table: str, app_id: str) -> Any:
    """The foreachBatch function: append one micro-batch unless the table already has it."""

    def write(batch: Any, batch_id: int) -> None:
        if DeltaTable.is_deltatable(table):
            done = DeltaTable(table).transaction_version(app_id)
            if done is not None and done >= batch_id:
                return  # a replayed micro-batch: already in the table
        records = batch.selectExpr(
            "CAST(key AS STRING) AS key",
            "CAST(value AS STRING) AS value",
            "topic",
            "partition",
            "offset",
            "timestamp",
        ).toArrow()
        if records.num_rows == 0:
            return
        write_deltalake(
            table,
            records,
            mode="append",
            commit_properties=CommitProperties(app_transactions=[Transaction(app_id, batch_id)]),
        )

    return write


def run(
    spark: Any,
    *,
    store: str,
    topic: str,
    table: str,
    checkpoint: str,
    app_id: str = "kstore-to-delta",
    max_offsets_per_trigger: int = 1000,
    storage_options: str | None = None,
) -> Any:
    """Copy everything in ``topic`` so far into ``table`` (availableNow); returns the query."""
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
        .writeStream.foreachBatch(delta_batch_writer(table, app_id))
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return query


def read_back(spark: Any, table: str) -> Any:
    """The table as Spark sees it: through Delta's live file list, never a directory listing."""
    return spark.read.parquet(*DeltaTable(table).file_uris())


def _sample_store(root: Path, topic: str, records: int) -> str:
    from kstore import Store
    from kstore.producer import Producer

    url = root.as_uri()
    store = Store(url)
    store.create_topic(topic, 3)
    with Producer(store) as producer:
        for i in range(records):
            producer.send(topic, key=b"user-%d" % (i % 10), value=b"event-%d" % i)
    return url


def main(argv: list[str] | None = None, spark: Any = None) -> int:
    """Run the example; with ``spark`` given, in that session (left running)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--store")
    parser.add_argument("--topic", default="events")
    parser.add_argument("--table")
    parser.add_argument("--checkpoint")
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from kstore.spark_ext import register
    from pyspark.sql import SparkSession

    work = Path(tempfile.mkdtemp(prefix="kstore-delta-example-"))
    store = args.store or _sample_store(work / "store", args.topic, 1500)
    table = args.table or str(work / "delta")
    checkpoint = args.checkpoint or str(work / "checkpoint")
    own_session = spark is None
    if own_session:
        spark = SparkSession.builder.master("local[2]").appName("kstore-to-delta").getOrCreate()
        register(spark)
    query = run(spark, store=store, topic=args.topic, table=table, checkpoint=checkpoint)
    batches = sum(1 for p in query.recentProgress if p["numInputRows"] > 0)
    rows = read_back(spark, table).count()
    print(f"{rows} records in Delta table {table} after {batches} micro-batches")
    if own_session:
        spark.stop()
    return 0


if __name__ == "__main__":
    from kstore.cli.common import exit_process

    exit_process(main())  # not the teardown that can abort once deltalake is loaded
