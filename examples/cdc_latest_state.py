"""A CDC-style changelog (upserts and deletes keyed by primary key) in a compacted topic,
turned into a latest-state table: compaction keeps the newest change per key and drops
deletes (tombstones) once delete.retention.ms has passed; a Spark query then reads the
current state of every row.

Run: ``python examples/cdc_latest_state.py``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from kstore.compaction import run_compaction

from kstore import Store
from kstore.producer import Producer


def changelog(store: Store) -> dict[str, dict[str, Any] | None]:
    """Customers created, updated and some deleted; returns the expected final state."""
    expected: dict[str, dict[str, Any] | None] = {}
    with Producer(store) as producer:
        for version in range(3):
            for n in range(100):
                key = f"customer-{n}"
                if version == 2 and n % 10 == 0:
                    producer.send("customers", key=key.encode(), value=None)  # a delete
                    expected[key] = None
                else:
                    row = {
                        "id": n,
                        "tier": ["bronze", "silver", "gold"][version],
                        "version": version,
                    }
                    producer.send("customers", key=key.encode(), value=json.dumps(row).encode())
                    expected[key] = row
    return expected


def main(spark: Any = None, url: str | None = None) -> dict[str, dict[str, Any]]:
    url = url or Path(tempfile.mkdtemp(prefix="kstore-cdc-"), "store").as_uri()
    store = Store(url)
    store.create_topic(
        "customers",
        partitions=2,
        config={
            "cleanup.policy": "compact",
            "delete.retention.ms": 0,
            "min.cleanable.dirty.ratio": 0.01,
        },
    )
    expected = changelog(store)
    before = sum(d.records for d in store.describe_topic("customers").partitions)
    run_compaction(None, url, topics=["customers"], verbose=False)  # in-process; or on Spark
    run_compaction(
        None, url, topics=["customers"], verbose=False
    )  # tombstones past their horizon go
    after = sum(d.records for d in store.describe_topic("customers").partitions)
    print(f"changelog: {before} changes; after compaction: {after} records")
    own = spark is None
    if own:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.master("local[2]").appName("kstore-cdc").getOrCreate()
    from kstore.spark_ext import register

    register(spark)
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW changes USING kstore OPTIONS (store '{url}', subscribe 'customers')"
    )
    # The latest change per key, deletes removed: the current state of the table.
    rows = spark.sql("""
        SELECT key, value FROM (
            SELECT CAST(key AS STRING) AS key, CAST(value AS STRING) AS value,
                   row_number() OVER (PARTITION BY key ORDER BY offset DESC) AS newest
            FROM changes)
        WHERE newest = 1 AND value IS NOT NULL
    """).collect()
    state = {row.key: json.loads(row.value) for row in rows}
    print(f"latest state: {len(state)} customers")
    if own:
        spark.stop()
    assert state == {k: v for k, v in expected.items() if v is not None}
    return state


if __name__ == "__main__":
    main()
