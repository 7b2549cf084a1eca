"""A Spark batch query over a topic, in SQL: a temporary view over the ``kstore`` source.

Run: ``python examples/spark_sql.py`` (makes a store with sample clicks in a temporary
directory and a local Spark session).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from kstore import Store
from kstore.producer import Producer


def sample(url: str) -> None:
    store = Store(url)
    store.create_topic("clicks", partitions=4)
    with Producer(store) as producer:
        for i in range(2_000):
            producer.send("clicks", key=b"user-%d" % (i % 50), value=b"/page/%d" % (i % 7))


def main(spark: Any = None, url: str | None = None) -> list[tuple[str, int]]:
    url = url or Path(tempfile.mkdtemp(prefix="kstore-sql-"), "store").as_uri()
    sample(url)
    own = spark is None
    if own:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.master("local[2]").appName("kstore-sql").getOrCreate()
    from kstore.spark_ext import register

    register(spark)
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW clicks USING kstore OPTIONS (store '{url}', subscribe 'clicks')"
    )
    rows = spark.sql("""
        SELECT CAST(value AS STRING) AS page, count(*) AS views
        FROM clicks
        GROUP BY page
        ORDER BY views DESC, page
    """).collect()
    for row in rows:
        print(f"{row.page:10s} {row.views}")
    if own:
        spark.stop()
    return [(row.page, row.views) for row in rows]


if __name__ == "__main__":
    main()
