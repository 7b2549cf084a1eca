"""Typed topics through Spark: the value as a struct (or flattened), pruning by a user schema,
the sink taking a struct value, streaming copies, and segments written under an older schema."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid
from pathlib import Path
from typing import Any

import pytest

from kstore import Store
from kstore.producer import Producer
from tests.test_spark_support import BACKENDS, open_store, source_options, wait_for

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

SCHEMA = (
    "id BIGINT NOT NULL, user STRING, amount DECIMAL(10,2), tags ARRAY<STRING>, "
    "attrs MAP<STRING, INT>, address STRUCT<city: STRING, zip: INT>, at TIMESTAMP"
)
AT = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def order(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "user": f"u{i % 3}",
        "amount": decimal.Decimal(f"{i}.25"),
        "tags": ["a", f"t{i}"],
        "attrs": {"n": i},
        "address": {"city": "Oslo", "zip": 1000 + i},
        "at": AT,
    }


def make_orders(store: Store, topic: str, count: int = 12) -> None:
    store.create_topic(topic, 2, value_schema=SCHEMA, key_schema="string")
    with Producer(store, linger_ms=0) as producer:
        for i in range(count):
            producer.send(topic, key=f"u{i % 3}", value=order(i))
        producer.send(topic, key="u1", value=None)  # a tombstone


def read(spark: Any, target: Any, topic: str, **options: Any) -> Any:
    return (
        spark.read.format("kstore")
        .options(**source_options(target, subscribe=topic, **options))
        .load()
    )


@pytest.mark.parametrize("target_name", BACKENDS)
def test_a_typed_topic_reads_as_a_struct_value_with_its_declared_types(
    spark: Any, target_name: str, request: pytest.FixtureRequest
) -> None:
    target = request.getfixturevalue(target_name)
    store = open_store(target)
    make_orders(store, "orders")
    df = read(spark, target, "orders")
    assert df.schema.simpleString() == (
        "struct<key:string,value:struct<id:bigint,user:string,amount:decimal(10,2),"
        "tags:array<string>,attrs:map<string,int>,address:struct<city:string,zip:int>,"
        "at:timestamp>,topic:string,partition:int,offset:bigint,timestamp:timestamp,"
        "timestampType:int>"
    )
    rows = df.where("value IS NOT NULL").orderBy("value.id").collect()
    assert [r.value.id for r in rows] == list(range(12))
    first = rows[3]
    assert first.key == "u0"
    assert first.value.amount == decimal.Decimal("3.25")
    assert first.value.tags == ["a", "t3"]
    assert first.value.attrs == {"n": 3}
    assert first.value.address.zip == 1003
    assert first.value.at.replace(tzinfo=None) is not None
    tombstones = df.where("value IS NULL").collect()
    assert [t.key for t in tombstones] == ["u1"]
    # SQL over the fields, as over a table.
    df.createOrReplaceTempView("typed_orders")
    total = spark.sql(
        "SELECT value.user AS user, SUM(value.amount) AS total FROM typed_orders "
        "WHERE value IS NOT NULL GROUP BY value.user ORDER BY user"
    ).collect()
    assert [(r.user, r.total) for r in total] == [
        ("u0", decimal.Decimal("19.00")),  # 0+3+6+9 + 4*0.25
        ("u1", decimal.Decimal("23.00")),
        ("u2", decimal.Decimal("27.00")),
    ]


def test_flatten_value_puts_the_fields_at_the_top_level(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    make_orders(store, "flat")
    df = read(spark, local_store_url, "flat", flattenValue="true")
    assert df.columns == [
        "key",
        "id",
        "user",
        "amount",
        "tags",
        "attrs",
        "address",
        "at",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]
    rows = df.orderBy("offset", "partition").collect()
    assert sorted(r.id for r in rows if r.id is not None) == list(range(12))
    # A tombstone's fields are all null.
    tomb = [r for r in rows if r.id is None]
    assert len(tomb) == 1
    assert tomb[0].user is None
    assert tomb[0].key == "u1"


def test_a_user_schema_prunes_value_fields_and_bad_ones_are_named(
    spark: Any, local_store_url: Any
) -> None:
    store = open_store(local_store_url)
    make_orders(store, "pruned")
    opts = source_options(local_store_url, subscribe="pruned")
    df = (
        spark.read.format("kstore")
        .schema("value STRUCT<amount: DECIMAL(10,2), user: STRING>, offset BIGINT")
        .options(**opts)
        .load()
    )
    assert df.schema.simpleString() == (
        "struct<value:struct<amount:decimal(10,2),user:string>,offset:bigint>"
    )
    rows = df.where("value IS NOT NULL").collect()
    assert sorted(r.value.amount for r in rows)[0] == decimal.Decimal("0.25")
    for bad, message in [
        ("value STRUCT<nope: INT>", "'value' has no field 'nope'"),
        ("value STRUCT<id: STRING>", "field 'value.id' must have type bigint"),
        ("value BINARY", "column 'value' of a typed topic is a struct"),
    ]:
        with pytest.raises(Exception, match=message):
            spark.read.format("kstore").schema(bad).options(**opts).load().collect()


def test_a_query_over_topics_of_different_kinds_or_schemas_is_refused(
    spark: Any, local_store_url: Any
) -> None:
    store = open_store(local_store_url)
    make_orders(store, "typed_a")
    store.create_topic("binary_b", 1)
    store.create_topic("typed_c", 1, value_schema="x INT")
    with pytest.raises(Exception, match="are typed but"):
        read(spark, local_store_url, "typed_a,binary_b").collect()
    with pytest.raises(Exception, match="have different schemas"):
        read(spark, local_store_url, "typed_a,typed_c").collect()
    with pytest.raises(Exception, match="flattenValue=true needs a typed topic"):
        read(spark, local_store_url, "binary_b", flattenValue="true").collect()


@pytest.mark.parametrize("target_name", BACKENDS)
def test_the_sink_writes_a_struct_value_into_a_typed_topic(
    spark: Any, target_name: str, request: pytest.FixtureRequest
) -> None:
    target = request.getfixturevalue(target_name)
    store = open_store(target)
    make_orders(store, "src")
    store.create_topic("dst", 3, value_schema=SCHEMA, key_schema="string")
    src = read(spark, target, "src")
    (
        src.select("key", "value")
        .write.format("kstore")
        .options(**source_options(target, topic="dst"))
        .mode("append")
        .save()
    )
    copied = read(spark, target, "dst").collect()
    assert sorted((r.key, r.value.id if r.value else -1) for r in copied) == sorted(
        (r.key, r.value.id if r.value else -1) for r in src.collect()
    )
    # Typed keys land where a Kafka client would put them: the same key, the same partition.
    by_key: dict[str, set[int]] = {}
    for r in copied:
        by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(parts) == 1 for parts in by_key.values())


def test_the_sink_takes_a_subset_of_fields_and_refuses_wrong_values(
    spark: Any, local_store_url: Any
) -> None:
    store = open_store(local_store_url)
    store.create_topic("people", 1, value_schema="name STRING NOT NULL, age INT, city STRING")
    store.create_topic("raw", 1)
    opts = source_options(local_store_url, topic="people")
    df = spark.createDataFrame([("ann", 31), ("bob", None)], "name STRING, age INT")
    df.selectExpr("struct(name, age) AS value").write.format("kstore").options(**opts).mode(
        "append"
    ).save()
    rows = read(spark, local_store_url, "people").orderBy("offset").collect()
    assert [(r.value.name, r.value.age, r.value.city) for r in rows] == [
        ("ann", 31, None),
        ("bob", None, None),
    ]
    before = sorted(p.name for p in Path(local_store_url[0]).rglob("*"))
    cases = [
        (df.selectExpr("CAST(name AS BINARY) AS value"), opts, "topic 'people' is typed"),
        (df.selectExpr("struct(name, age, 1 AS nope) AS value"), opts, "no field 'value.nope'"),
        (
            df.selectExpr("struct(CAST(NULL AS STRING) AS name) AS value"),
            opts,
            "'value.name' is declared NOT NULL",
        ),
        (
            df.selectExpr("struct(name) AS value"),
            source_options(local_store_url, topic="raw"),
            "topic 'raw' is binary",
        ),
        (
            df.selectExpr("struct(name, 'x' AS age) AS value"),
            opts,
            "field 'value.age' has type string",
        ),
    ]
    for frame, options, message in cases:
        with pytest.raises(Exception, match=message):
            frame.write.format("kstore").options(**options).mode("append").save()
    assert sorted(p.name for p in Path(local_store_url[0]).rglob("*")) == before


def test_segments_written_before_an_evolution_read_with_the_new_schema(
    spark: Any, local_store_url: Any
) -> None:
    store = open_store(local_store_url)
    store.create_topic("evolving", 1, value_schema="id INT NOT NULL, price FLOAT")
    with Producer(store, linger_ms=0) as producer:
        producer.send("evolving", value={"id": 1, "price": 1.5})
    store.alter_topic_schema("evolving", "id BIGINT NOT NULL, price DOUBLE, note STRING")
    with Producer(store, linger_ms=0) as producer:
        producer.send("evolving", value={"id": 2**40, "price": 2.25, "note": "new"})
    df = read(spark, local_store_url, "evolving")
    assert (
        df.schema["value"].dataType.simpleString() == "struct<id:bigint,price:double,note:string>"
    )
    rows = df.orderBy("offset").collect()
    assert [(r.value.id, r.value.price, r.value.note) for r in rows] == [
        (1, 1.5, None),
        (2**40, 2.25, "new"),
    ]


def copy_stream(spark: Any, target: Any, checkpoint: Path) -> Any:
    """stream_src -> stream_dst, availableNow, from the earliest offsets."""
    return (
        spark.readStream.format("kstore")
        .options(**source_options(target, subscribe="stream_src", startingOffsets="earliest"))
        .load()
        .select("key", "value")
        .writeStream.format("kstore")
        .options(**source_options(target, topic="stream_dst"))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_a_streaming_copy_of_a_typed_topic_is_exact(
    spark: Any, local_store_url: Any, tmp_path: Path
) -> None:
    store = open_store(local_store_url)
    make_orders(store, "stream_src", count=20)
    store.create_topic("stream_dst", 2, value_schema=SCHEMA, key_schema="string")
    name = f"typed_{uuid.uuid4().hex[:8]}"
    query = copy_stream(spark, local_store_url, tmp_path / name)
    query.awaitTermination(120)
    assert query.exception() is None
    got = read(spark, local_store_url, "stream_dst").collect()
    assert len(got) == 21
    assert sorted(r.value.id for r in got if r.value is not None) == list(range(20))
    # Records sent after the first run arrive in a second, and nothing twice.
    with Producer(store, linger_ms=0) as producer:
        producer.send("stream_src", key="u9", value=order(100))
    query = copy_stream(spark, local_store_url, tmp_path / name)
    query.awaitTermination(120)
    wait_for(lambda: len(read(spark, local_store_url, "stream_dst").collect()) == 22, 30)
    ids = [r.value.id for r in read(spark, local_store_url, "stream_dst").collect() if r.value]
    assert sorted(ids) == [*range(20), 100]
