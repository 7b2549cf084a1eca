"""A typed topic: a declared schema, validated sends, dicts back, Spark reading 2 of its fields,
and a schema evolution that old records survive.

Run: ``python examples/typed_orders.py [STORE_URL]`` (default: a temporary directory).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

from kstore import Store
from kstore.consumer import Consumer
from kstore.errors import InvalidRecordError
from kstore.producer import Producer
from kstore.schema import IncompatibleSchemaError


@dataclasses.dataclass
class Order:
    id: int
    customer: str
    amount: Decimal
    placed: dt.datetime


def main(url: str, spark: Any = None) -> dict[str, Any]:
    store = Store(url)
    store.create_topic(
        "orders",
        partitions=3,
        value_schema="id BIGINT NOT NULL, customer STRING, amount DECIMAL(10,2), placed TIMESTAMP",
        key_schema="string",
    )
    now = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
    refused = ""
    with Producer(store) as producer:
        for i in range(30):  # dataclasses and dicts alike
            order = Order(i, f"c{i % 4}", Decimal(i) + Decimal("0.99"), now)
            producer.send("orders", key=order.customer, value=order)
        try:
            producer.send("orders", value={"id": "thirty", "customer": "c1"})
        except InvalidRecordError as exc:
            print("refused:", exc)  # field 'id': expected long, got str 'thirty'
            refused = str(exc)

    # Evolve: a new nullable field is fine; removing one is not.
    store.alter_topic_schema(
        "orders",
        "id BIGINT NOT NULL, customer STRING, amount DECIMAL(12,2), placed TIMESTAMP, "
        "channel STRING",
    )
    try:
        store.alter_topic_schema("orders", "id BIGINT NOT NULL")
    except IncompatibleSchemaError as exc:
        print("refused:", exc)
    with Producer(store) as producer:
        producer.send("orders", key="c9", value={"id": 30, "customer": "c9", "channel": "web"})

    with Consumer(
        "orders", store=store, auto_offset_reset="earliest", consumer_timeout_ms=500
    ) as consumer:
        values = [record.value for record in consumer]
    print(values[0])  # {'id': ..., 'customer': ..., ..., 'channel': None}: an old record

    totals: dict[str, Decimal] = {}
    if spark is not None:
        from kstore.spark_ext import register

        register(spark)
        df = (
            spark.read.format("kstore")
            .schema("value STRUCT<customer: STRING, amount: DECIMAL(12,2)>")  # 2 fields only
            .option("store", url)
            .option("subscribe", "orders")
            .load()
        )
        rows = df.groupBy("value.customer").sum("value.amount").collect()
        totals = {r[0]: r[1] for r in rows if r[1] is not None}
        print(totals)
    return {"refused": refused, "values": values, "totals": totals}


if __name__ == "__main__":
    from pyspark.sql import SparkSession

    main(
        sys.argv[1]
        if len(sys.argv) > 1
        else Path(tempfile.mkdtemp(prefix="kstore-typed-")).as_uri(),
        SparkSession.builder.master("local[2]").getOrCreate(),
    )
