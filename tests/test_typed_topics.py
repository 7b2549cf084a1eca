"""Typed topics (issue 10): a declared value (and key) schema, end to end through the producer,
the consumer, schema evolution, compaction, retention and the format's protections.

Round trips run on memory, local disk and SeaweedFS; the rest on memory or local disk, where
the behaviour does not depend on the backend."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import struct
import time
from collections import namedtuple
from pathlib import Path
from typing import Any

import pyarrow as pa
import pydantic
import pytest
from kstore.compaction import merge_segments, run_compaction
from kstore.retention import run_retention

import kstore.log as kstore_log
from kstore import Store
from kstore.consumer import Consumer
from kstore.errors import (
    CorruptLogError,
    CorruptRecordError,
    InvalidConfigurationError,
    InvalidRecordError,
    RecordTooLargeError,
    UnsupportedFormatVersionError,
)
from kstore.log import TYPED_TOPICS_VERSION
from kstore.producer import Producer
from kstore.records import ConsumerRecord, TopicPartition
from kstore.schema import IncompatibleSchemaError, SchemaError
from kstore.segments import layout_of
from kstore.topic_log import TOPIC_LOG_VERSION, TOPIC_LOG_WRITER_VERSION
from tests import layout2
from tests.conftest import StoreTarget

UTC = dt.UTC
EVERY_TYPE = (
    "b BOOLEAN, i8 TINYINT, i16 SMALLINT, i32 INT, i64 BIGINT, f32 FLOAT, f64 DOUBLE, "
    "s STRING, bin BINARY, d DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ, amount DECIMAL(12,2), "
    "tags ARRAY<STRING>, attrs MAP<STRING, BIGINT>, "
    "address STRUCT<street: STRING, zip: INT, geo: STRUCT<lat: DOUBLE, lon: DOUBLE>>"
)
EVERY_VALUE: dict[str, Any] = {
    "b": True,
    "i8": -128,
    "i16": 32767,
    "i32": -(2**31),
    "i64": 2**63 - 1,
    "f32": 1.5,
    "f64": 2.718281828459045,
    "s": "héllo, wörld ✓",
    "bin": b"\x00\xff\x10binary",
    "d": dt.date(2024, 2, 29),
    "ts": dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
    "ntz": dt.datetime(2024, 5, 6, 7, 8, 9, 654321),
    "amount": decimal.Decimal("1234567890.12"),
    "tags": ["a", None, "c"],
    "attrs": {"x": 1, "y": -2},
    "address": {"street": "Main St", "zip": 12345, "geo": {"lat": 1.25, "lon": -2.5}},
}
USERS = "id BIGINT NOT NULL, name STRING, score INT"


# -- helpers -------------------------------------------------------------------------------------


def open_store(target: StoreTarget) -> Store:
    return Store(target.url, target.storage_options)


def read_all(store: Store, topic: str) -> list[ConsumerRecord]:
    """Every record of the topic, in (partition, offset) order."""
    n = store.topic(topic).partitions
    consumer = Consumer(store=store, auto_offset_reset="earliest")
    try:
        parts = [TopicPartition(topic, p) for p in range(n)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        out: list[ConsumerRecord] = []
        while True:
            got = consumer.poll(timeout_ms=0)
            if not got:
                break
            for records in got.values():
                out.extend(records)
    finally:
        consumer.close(autocommit=False)
    return sorted(out, key=lambda r: (r.partition, r.offset))


def produce(store: Store, topic: str, records: list[tuple[Any, Any]], **send: Any) -> list[Any]:
    """Send (key, value) pairs and wait for each; returns the RecordMetadata list."""
    producer = Producer(store)
    try:
        futures = [producer.send(topic, key=k, value=v, **send) for k, v in records]
        producer.flush()
        return [f.get(10) for f in futures]
    finally:
        producer.close()


def topic_log_files(store: Store, topic: str, root: Path) -> dict[str, bytes]:
    log_dir = root / "topics" / topic / "_log"
    return {p.name: p.read_bytes() for p in sorted(log_dir.iterdir())}


@pytest.fixture
def local(tmp_path: Path) -> tuple[Store, Path]:
    root = tmp_path / "store"
    return Store(root.as_uri()), root


@pytest.fixture
def mem(memory_store_url: tuple[str, dict[str, Any]]) -> Store:
    return Store(memory_store_url[0])


@pytest.fixture(
    params=["memory", "local", pytest.param("seaweed", marks=pytest.mark.s3)],
)
def backend(request: pytest.FixtureRequest) -> StoreTarget:
    """Memory, local disk and SeaweedFS (moto adds nothing typed topics could differ on)."""
    fixture = {
        "memory": "memory_store_url",
        "local": "local_store_url",
        "seaweed": "seaweed_bucket_url",
    }[request.param]
    url, options = request.getfixturevalue(fixture)
    return StoreTarget(request.param, url, options)


# -- round trips ---------------------------------------------------------------------------------


def test_every_type_round_trips_on_every_backend(backend: StoreTarget) -> None:
    store = open_store(backend)
    meta = store.create_topic("everything", 2, value_schema=EVERY_TYPE, key_schema="string")
    assert meta.typed
    assert meta.schema is not None
    assert meta.schema.id == 1
    nulls = dict.fromkeys(EVERY_VALUE)
    produce(
        store,
        "everything",
        [("k1", EVERY_VALUE), ("k2", nulls), ("k1", None)],
        headers=[("trace", b"\x01\x02"), ("h", b"")],
    )
    records = read_all(Store(backend.url, backend.storage_options), "everything")
    by_key: dict[str, list[ConsumerRecord]] = {}
    for r in records:
        by_key.setdefault(r.key, []).append(r)
    assert sorted(by_key) == ["k1", "k2"]
    first, tombstone = by_key["k1"]
    assert first.value == EVERY_VALUE
    assert first.value["ts"].utcoffset() == dt.timedelta(0)
    assert first.headers == (("trace", b"\x01\x02"), ("h", b""))
    assert tombstone.value is None
    assert tombstone.offset > first.offset
    assert by_key["k2"][0].value == nulls
    # poll_batches: the value is an Arrow struct of the declared fields.
    consumer = Consumer(store=store, auto_offset_reset="earliest")
    tp = TopicPartition("everything", first.partition)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    batches = consumer.poll_batches(timeout_ms=0)[tp]
    consumer.close(autocommit=False)
    value_type = batches[0].schema.field("value").type
    assert pa.types.is_struct(value_type)
    assert [f.name for f in value_type] == list(EVERY_VALUE)
    assert value_type.field("amount").type == pa.decimal128(12, 2)
    assert batches[0].schema.field("key").type == pa.string()


@dataclasses.dataclass
class User:
    id: int
    name: str | None
    score: int | None


class UserModel(pydantic.BaseModel):
    id: int
    name: str | None = None
    score: int | None = None


UserTuple = namedtuple("UserTuple", ["id", "name", "score"])


def test_dataclasses_pydantic_models_and_named_tuples_are_values(mem: Store) -> None:
    mem.create_topic("users", 1, value_schema=USERS)
    produce(
        mem,
        "users",
        [
            (None, {"id": 1, "name": "dict"}),
            (None, User(2, "dataclass", 20)),
            (None, UserModel(id=3, name="pydantic", score=30)),
            (None, UserTuple(4, "namedtuple", None)),
        ],
    )
    assert [r.value for r in read_all(mem, "users")] == [
        {"id": 1, "name": "dict", "score": None},
        {"id": 2, "name": "dataclass", "score": 20},
        {"id": 3, "name": "pydantic", "score": 30},
        {"id": 4, "name": "namedtuple", "score": None},
    ]


def test_serializers_are_not_applied_on_typed_topics(mem: Store) -> None:
    mem.create_topic("users", 1, value_schema=USERS)
    mem.create_topic("raw", 1)
    producer = Producer(mem, value_serializer=lambda v: repr(v).encode())
    producer.send("users", value={"id": 1}).get(10)
    producer.send("raw", value={"id": 1}).get(10)
    producer.close()
    assert read_all(mem, "users")[0].value == {"id": 1, "name": None, "score": None}
    assert read_all(mem, "raw")[0].value == b"{'id': 1}"


# -- typed keys ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key_type", "keys", "as_bytes"),
    [
        ("string", [f"user-{i}" for i in range(60)], lambda k: k.encode("utf-8")),
        ("long", [i * 7919 - 200 for i in range(60)], lambda k: struct.pack(">q", k)),
        ("integer", list(range(-30, 30)), lambda k: struct.pack(">i", k)),
        ("double", [i / 3 for i in range(60)], lambda k: struct.pack(">d", k)),
    ],
)
def test_typed_keys_land_where_their_kafka_serialized_bytes_land(
    mem: Store, key_type: str, keys: list[Any], as_bytes: Any
) -> None:
    mem.create_topic("typed", 7, value_schema="v INT", key_schema=key_type)
    mem.create_topic("binary", 7)
    typed = produce(mem, "typed", [(k, {"v": 1}) for k in keys])
    binary = produce(mem, "binary", [(as_bytes(k), b"1") for k in keys])
    assert [m.partition for m in typed] == [m.partition for m in binary]
    assert len({m.partition for m in typed}) > 3  # really spread, not one partition
    # send_batch places them the same way.
    mem.create_topic("typed-batch", 7, value_schema="v INT", key_schema=key_type)
    producer = Producer(mem)
    producer.send_batch("typed-batch", pa.table({"key": keys, "v": [1] * len(keys)})).get(10)
    producer.close()
    placed = {(r.key, r.partition) for r in read_all(mem, "typed-batch")}
    assert placed == {(k, m.partition) for k, m in zip(keys, binary, strict=True)}


def test_typed_key_is_validated(mem: Store) -> None:
    mem.create_topic("t", 2, value_schema="v INT", key_schema="long")
    producer = Producer(mem)
    with pytest.raises(InvalidRecordError, match="key"):
        producer.send("t", key="not a number", value={"v": 1})
    with pytest.raises(InvalidRecordError, match="out of range"):
        producer.send("t", key=2**63, value={"v": 1})
    producer.close()
    assert read_all(mem, "t") == []


def test_a_key_schema_needs_a_value_schema_and_a_supported_type(mem: Store) -> None:
    with pytest.raises(InvalidConfigurationError):
        mem.create_topic("t", 1, key_schema="string")
    with pytest.raises(SchemaError, match="key schema"):
        mem.create_topic("t", 1, value_schema="v INT", key_schema="date")
    assert mem.list_topics() == []


# -- send_batch ----------------------------------------------------------------------------------


def test_send_batch_with_a_value_struct_column_or_top_level_fields(backend: StoreTarget) -> None:
    store = open_store(backend)
    store.create_topic("users", 1, value_schema=USERS, key_schema="long")
    producer = Producer(store)
    struct_values = pa.array(
        [{"id": 1, "name": "a", "score": 10}, None, {"id": 3, "name": None, "score": None}],
        pa.struct([("id", pa.int64()), ("name", pa.string()), ("score", pa.int32())]),
    )
    producer.send_batch(
        "users",
        pa.table(
            {
                "key": pa.array([1, 1, 3], pa.int64()),
                "value": struct_values,
                "headers": pa.array(
                    [[("h", b"1")], None, None],
                    pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
                ),
            }
        ),
    ).get(10)
    # Top-level columns: narrower ints are converted safely, a missing nullable field is null.
    producer.send_batch(
        "users",
        pa.table(
            {
                "key": pa.array([4, 5], pa.int32()),
                "id": pa.array([4, 5], pa.int8()),
                "name": ["d", "e"],
            }
        ),
    ).get(10)
    producer.close()
    records = read_all(store, "users")
    assert [(r.key, r.value) for r in records] == [
        (1, {"id": 1, "name": "a", "score": 10}),
        (1, None),
        (3, {"id": 3, "name": None, "score": None}),
        (4, {"id": 4, "name": "d", "score": None}),
        (5, {"id": 5, "name": "e", "score": None}),
    ]
    assert records[0].headers == (("h", b"1"),)


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"id": pa.array([1, None], pa.int64())}, "'value.id' is declared NOT NULL but row 1"),
        ({"name": ["a"]}, "'value.id' is required"),
        ({"id": [1], "extra": [2]}, "unexpected columns \\['extra'\\]"),
        ({"id": [1], "score": pa.array([2**40], pa.int64())}, "value.score"),
        ({"id": ["one"]}, "value.id"),
        ({"value": pa.array([b"x"], pa.binary())}, "must be a struct"),
        ({"value": pa.array([{"id": 1, "nope": 2}])}, "unknown field 'value.nope'"),
    ],
)
def test_send_batch_refuses_bad_columns_naming_the_field(
    mem: Store, columns: dict[str, Any], message: str
) -> None:
    mem.create_topic("users", 1, value_schema=USERS)
    producer = Producer(mem)
    with pytest.raises(InvalidRecordError, match=message):
        producer.send_batch("users", pa.table(columns))
    producer.close()
    assert read_all(mem, "users") == []


# -- validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"id": "7"}, "field 'id': expected long, got str"),
        ({"id": 1, "score": 2**31}, "field 'score': 2147483648 is out of range for integer"),
        ({"id": True}, "field 'id': expected long"),
        ({"name": "x"}, "field 'id' is required"),
        ({"id": None}, "field 'id' is required"),
        ({"id": 1, "nickname": "x"}, "unknown field 'nickname'"),
        ({"id": 1, "name": b"bytes"}, "field 'name': expected string"),
        (["not", "a", "record"], "expected a dict, dataclass, pydantic model or named tuple"),
        (b"raw bytes", "expected a dict"),
    ],
)
def test_send_refuses_invalid_values_naming_the_field(mem: Store, value: Any, message: str) -> None:
    mem.create_topic("users", 1, value_schema=USERS)
    producer = Producer(mem)
    with pytest.raises(InvalidRecordError, match=message):
        producer.send("users", value=value)
    producer.send("users", value={"id": 1}).get(10)  # the producer stays usable
    producer.close()
    assert [r.value for r in read_all(mem, "users")] == [{"id": 1, "name": None, "score": None}]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"amount": decimal.Decimal("1.234")}, "field 'amount': 1.234 has more than 2 decimal"),
        ({"amount": decimal.Decimal("123456789012.5")}, "field 'amount': .* does not fit"),
        ({"amount": 1.5}, "field 'amount': expected decimal"),
        ({"amount": decimal.Decimal("NaN")}, "field 'amount': NaN is not a finite"),
        ({"ts": dt.datetime(2024, 1, 1)}, "field 'ts': a timestamp is an instant"),
        ({"ntz": dt.datetime(2024, 1, 1, tzinfo=UTC)}, "field 'ntz': timestamp_ntz"),
        ({"d": dt.datetime(2024, 1, 1)}, "field 'd': expected date"),
        ({"d": "2024-01-01"}, "field 'd': expected date"),
        ({"i8": 128}, "field 'i8': 128 is out of range for byte"),
        ({"i16": -32769}, "field 'i16': .* out of range for short"),
        ({"b": 1}, "field 'b': expected boolean"),
        ({"f64": "1.0"}, "field 'f64': expected double"),
        ({"tags": "abc"}, "field 'tags': expected array"),
        ({"tags": ["a", 1]}, "field 'tags\\[1\\]': expected string"),
        ({"attrs": {"k": "v"}}, "field \"attrs\\['k'\\]\": expected long"),
        ({"address": {"zip": "x"}}, "field 'address.zip': expected integer"),
        ({"address": {"geo": {"lat": 1.0, "alt": 2}}}, "unknown field 'address.geo.alt'"),
    ],
)
def test_every_type_is_validated(mem: Store, value: dict[str, Any], message: str) -> None:
    mem.create_topic("everything", 1, value_schema=EVERY_TYPE)
    producer = Producer(mem)
    with pytest.raises(InvalidRecordError, match=message):
        producer.send("everything", value=value)
    producer.close()
    assert read_all(mem, "everything") == []


def test_not_null_inside_arrays_and_structs(mem: Store) -> None:
    array = {"type": "array", "elementType": "integer", "containsNull": False}
    inner = {
        "type": "struct",
        "fields": [
            {"name": "a", "type": "integer", "nullable": False, "metadata": {}},
            {"name": "b", "type": "integer", "nullable": True, "metadata": {}},
        ],
    }
    spark_json = {
        "type": "struct",
        "fields": [
            {"name": "xs", "type": array, "nullable": True, "metadata": {}},
            {"name": "inner", "type": inner, "nullable": True, "metadata": {}},
        ],
    }
    mem.create_topic("t", 1, value_schema=spark_json)
    producer = Producer(mem)
    with pytest.raises(InvalidRecordError, match=r"'xs\[1\]': null in an array declared NOT NULL"):
        producer.send("t", value={"xs": [1, None]})
    with pytest.raises(InvalidRecordError, match=r"'inner\.a' is required"):
        producer.send("t", value={"inner": {"b": 1}})
    producer.send("t", value={"xs": [1, 2], "inner": None}).get(10)
    producer.close()
    assert [r.value for r in read_all(mem, "t")] == [{"xs": [1, 2], "inner": None}]


def test_max_message_bytes_applies_to_typed_values(mem: Store) -> None:
    mem.create_topic("t", 1, {"max.message.bytes": 1000}, value_schema="s STRING, b BINARY")
    producer = Producer(mem)
    with pytest.raises(RecordTooLargeError):
        producer.send("t", value={"s": "x" * 2000})
    with pytest.raises(RecordTooLargeError):
        producer.send("t", value={"b": b"\0" * 2000})
    with pytest.raises(RecordTooLargeError):
        producer.send_batch("t", pa.table({"s": ["ok", "y" * 5000]}))
    producer.send("t", value={"s": "x" * 500}).get(10)
    producer.close()
    assert [r.value for r in read_all(mem, "t")] == [{"s": "x" * 500, "b": None}]


# -- schema evolution ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after", "old", "projected"),
    [
        ("id BIGINT", "id BIGINT, name STRING", {"id": 1}, {"id": 1, "name": None}),
        ("n INT", "n BIGINT", {"n": -(2**31)}, {"n": -(2**31)}),
        ("n TINYINT", "n SMALLINT", {"n": -7}, {"n": -7}),
        ("n INT", "n DOUBLE", {"n": 2**31 - 1}, {"n": float(2**31 - 1)}),
        ("x FLOAT", "x DOUBLE", {"x": 1.5}, {"x": 1.5}),
        (
            "m DECIMAL(5,2)",
            "m DECIMAL(10,4)",
            {"m": decimal.Decimal("123.45")},
            {"m": decimal.Decimal("123.4500")},
        ),
        ("id BIGINT NOT NULL", "id BIGINT", {"id": 1}, {"id": 1}),
        (
            "s STRUCT<a: INT>",
            "s STRUCT<a: INT, b: STRING>",
            {"s": {"a": 1}},
            {"s": {"a": 1, "b": None}},
        ),
        (
            "xs ARRAY<STRUCT<a: INT>>",
            "xs ARRAY<STRUCT<a: BIGINT, b: STRING>>",
            {"xs": [{"a": 1}]},
            {"xs": [{"a": 1, "b": None}]},
        ),
    ],
)
def test_allowed_evolutions_and_old_segments_read_through_the_new_schema(
    local: tuple[Store, Path], before: str, after: str, old: dict[str, Any], projected: Any
) -> None:
    store, root = local
    store.create_topic("t", 1, value_schema=before)
    produce(store, "t", [(None, old)])
    meta = store.alter_topic_schema("t", after)
    assert meta.schema is not None
    assert meta.schema.id == 2
    assert [s.id for s in meta.schema_history] == [1, 2]
    # A fresh reader (no cached segment) and the same store both project the old segment.
    assert [r.value for r in read_all(Store(root.as_uri()), "t")] == [projected]
    assert [r.value for r in read_all(store, "t")] == [projected]
    assert type(read_all(store, "t")[0].value) is dict


@pytest.mark.parametrize(
    ("before", "after", "field"),
    [
        ("id BIGINT, name STRING", "id BIGINT", "name"),
        ("id BIGINT, name STRING", "id BIGINT, full_name STRING", "name"),
        ("n BIGINT", "n INT", "n"),
        ("x DOUBLE", "x FLOAT", "x"),
        ("n BIGINT", "n DOUBLE", "n"),
        ("n INT", "n STRING", "n"),
        ("m DECIMAL(10,2)", "m DECIMAL(10,3)", "m"),
        ("m DECIMAL(10,2)", "m DECIMAL(9,2)", "m"),
        ("id BIGINT", "id BIGINT, name STRING NOT NULL", "name"),
        ("id BIGINT", "id BIGINT NOT NULL", "id"),
        ("s STRUCT<a: INT>", "s STRUCT<a: INT, b: INT NOT NULL>", "b"),
        ("s STRUCT<a: INT, b: INT>", "s STRUCT<a: INT>", "b"),
        ("xs ARRAY<INT>", "xs ARRAY<STRING>", "xs"),
    ],
)
def test_refused_evolutions_name_the_field_and_change_nothing(
    local: tuple[Store, Path], before: str, after: str, field: str
) -> None:
    store, root = local
    store.create_topic("t", 1, value_schema=before)
    files = topic_log_files(store, "t", root)
    with pytest.raises(IncompatibleSchemaError, match=field):
        store.alter_topic_schema("t", after)
    assert topic_log_files(store, "t", root) == files
    assert len(Store(root.as_uri()).topic("t").schema_history) == 1


def test_key_type_changes_and_binary_topics_are_refused(local: tuple[Store, Path]) -> None:
    store, root = local
    store.create_topic("t", 1, value_schema="v INT", key_schema="long")
    store.create_topic("raw", 1)
    before = (topic_log_files(store, "t", root), topic_log_files(store, "raw", root))
    with pytest.raises(IncompatibleSchemaError, match="key type"):
        store.alter_topic_schema("t", "v INT, w INT", key_schema="string")
    with pytest.raises(SchemaError, match="binary"):
        store.alter_topic_schema("raw", "v INT")
    with pytest.raises(SchemaError, match="unchanged"):
        store.alter_topic_schema("t", "v INT")
    assert (topic_log_files(store, "t", root), topic_log_files(store, "raw", root)) == before
    # The key type is kept when none is given.
    assert store.alter_topic_schema("t", "v INT, w INT").schema.key_declared == "long"  # type: ignore[union-attr]


def test_a_producer_with_older_metadata_writes_after_an_evolution(
    local: tuple[Store, Path],
) -> None:
    store, root = local
    store.create_topic("t", 2, value_schema="id BIGINT, n INT", key_schema="string")
    producer = Producer(store)
    producer.send("t", key="a", value={"id": 1, "n": 1}).get(10)  # caches schema 1
    other = Store(root.as_uri())
    other.alter_topic_schema("t", "id BIGINT, n BIGINT, tag STRING")
    producer.send("t", key="b", value={"id": 2, "n": 2}).get(10)  # still schema 1's validator
    producer.close()
    values = sorted((r.value["id"], r.value) for r in read_all(Store(root.as_uri()), "t"))
    assert [v for _, v in values] == [
        {"id": 1, "n": 1, "tag": None},
        {"id": 2, "n": 2, "tag": None},
    ]
    fresh = Producer(Store(root.as_uri()))
    fresh.send("t", key="c", value={"id": 3, "n": 2**40, "tag": "new"}).get(10)
    fresh.close()
    assert {r.value["id"]: r.value for r in read_all(store, "t")}[3] == {
        "id": 3,
        "n": 2**40,
        "tag": "new",
    }


def test_a_reader_with_older_metadata_drops_newer_fields(local: tuple[Store, Path]) -> None:
    store, root = local
    store.create_topic("t", 1, value_schema="id BIGINT")
    old_reader = Store(root.as_uri())
    part = old_reader.partition("t", 0)  # opened under schema 1
    assert part.layout.schema_id == 1
    writer = Store(root.as_uri())
    writer.alter_topic_schema("t", "id BIGINT, extra STRING")
    produce(writer, "t", [(None, {"id": 1, "extra": "new"})])
    # Reading a segment written under schema 2 with schema 1: the newer field is dropped.
    table = pa.Table.from_batches(list(part.read(0)))
    assert table.column("value").type == pa.struct([("id", pa.int64())])
    assert table.column("value").to_pylist() == [{"id": 1}]
    # And a consumer reading through the store's current metadata sees everything.
    assert [r.value for r in read_all(writer, "t")] == [{"id": 1, "extra": "new"}]


# -- jobs ----------------------------------------------------------------------------------------


def test_compaction_keeps_the_latest_record_per_typed_key(local: tuple[Store, Path]) -> None:
    store, root = local
    store.create_topic(
        "users",
        2,
        {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0, "segment.ms": 1},
        value_schema=USERS,
        key_schema="long",
    )
    for round_ in range(3):
        produce(
            store,
            "users",
            [(k, {"id": k, "name": f"r{round_}", "score": round_}) for k in range(6)],
        )
    produce(store, "users", [(2, None), (3, None)])  # tombstones
    produce(store, "users", [(0, {"id": 0, "name": "last", "score": 9})])
    summary = run_compaction(
        None, root.as_uri(), verbose=False, now_ms=int(time.time() * 1000) + 10_000
    )
    assert summary.count("committed") >= 1
    records = read_all(Store(root.as_uri()), "users")
    live = {r.key: r.value for r in records}
    assert live[0] == {"id": 0, "name": "last", "score": 9}
    assert live[1] == {"id": 1, "name": "r2", "score": 2}
    assert live[2] is None
    assert live[3] is None
    keys = [r.key for r in records if r.value is not None]
    assert sorted(keys) == [0, 1, 4, 5]  # one record per key: older ones are gone
    # The compacted segments are Parquet, and they read back typed.
    files = [p.name for p in root.rglob("segments/*")]
    assert any(name.endswith(".parquet") for name in files)


def test_merged_parquet_segments_read_back_typed(local: tuple[Store, Path]) -> None:
    store, root = local
    store.create_topic("e", 1, value_schema=EVERY_TYPE, key_schema="string")
    for i in range(4):
        produce(store, "e", [(f"k{i}", EVERY_VALUE), (f"n{i}", {"s": str(i)})])
    store.alter_topic_schema("e", EVERY_TYPE + ", added STRING")
    merge_segments(None, root.as_uri(), verbose=False, now_ms=int(time.time() * 1000) + 10_000)
    assert any(p.suffix == ".parquet" for p in root.rglob("segments/*"))
    records = read_all(Store(root.as_uri()), "e")
    assert len(records) == 8
    assert records[0].value == {**EVERY_VALUE, "added": None}
    assert records[1].value == {**dict.fromkeys(EVERY_VALUE), "s": "0", "added": None}


def test_retention_removes_old_typed_segments(local: tuple[Store, Path]) -> None:
    store, root = local
    store.create_topic("t", 1, {"retention.ms": 3_600_000}, value_schema=USERS)
    now = int(time.time() * 1000)
    producer = Producer(store)
    producer.send("t", value={"id": 1}, timestamp_ms=now - 3 * 3_600_000).get(10)
    producer.send("t", value={"id": 2}, timestamp_ms=now).get(10)
    producer.close()
    summary = run_retention(None, root.as_uri(), verbose=False, now_ms=now)
    assert summary.records_dropped == 1
    records = read_all(Store(root.as_uri()), "t")
    assert [(r.offset, r.value) for r in records] == [(1, {"id": 2, "name": None, "score": None})]


# -- protections of the format -------------------------------------------------------------------


def test_typed_topic_logs_need_reader_version_2_and_binary_ones_stay_at_1(
    local: tuple[Store, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layout 2 (what readers of versions 1 and 2 can read), as older versions created it."""
    store, root = local
    layout2.create_topic(store, "typed", 1, value_schema="v INT")
    layout2.create_topic(store, "raw", 1)
    assert TYPED_TOPICS_VERSION == 2
    assert store._topic_log("typed").load().min_reader_version == TYPED_TOPICS_VERSION
    assert store._topic_log("raw").load().min_reader_version == 1
    # A reader that predates typed topics refuses the typed topic and still reads the other.
    monkeypatch.setattr(kstore_log, "READER_VERSION", 1)
    old = Store(root.as_uri())
    with pytest.raises(UnsupportedFormatVersionError):
        old.topic("typed")
    assert old.topic("raw").partitions == 1


@pytest.mark.parametrize("reader", [1, 2, 3, 4])
def test_layout_3_topics_need_the_newest_reader_version_typed_or_not(
    local: tuple[Store, Path], monkeypatch: pytest.MonkeyPatch, reader: int
) -> None:
    """Layout 3: the topic metadata log and the topic log of a topic created now need version
    5 (commits that carry data), typed or not; a reader of version 1 to 4 refuses both
    topics and still reads the layout-2 ones."""
    store, root = local
    store.create_topic("typed", 1, value_schema="v INT")
    store.create_topic("raw", 1)
    # Layout-2 topics as older versions wrote them.
    layout2.create_topic(store, "typed2", 1, value_schema="v INT")
    layout2.create_topic(store, "raw2", 1)
    produce(store, "typed", [(None, {"v": 1})])
    produce(store, "raw", [(None, b"r")])
    typed = layout_of(store.topic("typed2")).record_schema
    layout2.append(
        store,
        "typed2",
        0,
        pa.table(
            {
                "key": pa.array([None], typed.field("key").type),
                "value": pa.array([{"v": 2}], typed.field("value").type),
                "timestamp": pa.array([layout2.BASE_US], typed.field("timestamp").type),
            }
        ),
    )
    layout2.append(store, "raw2", 0, layout2.records([b"r2"]))
    for topic in ("typed", "raw"):
        metadata_log = store._topic_log(topic).load()
        topic_log = store.partition(topic, 0).log.load()
        for state in (metadata_log, topic_log):
            assert (state.min_reader_version, state.min_writer_version) == (
                TOPIC_LOG_VERSION,
                TOPIC_LOG_WRITER_VERSION,
            ), topic
    monkeypatch.setattr(kstore_log, "READER_VERSION", reader)
    old = Store(root.as_uri())
    for topic in ("typed", "raw"):
        with pytest.raises(
            UnsupportedFormatVersionError, match=f"reader version {TOPIC_LOG_VERSION}"
        ):
            old.topic(topic)
    readable = {"typed2": [{"v": 2}], "raw2": [b"r2"]} if reader >= 2 else {"raw2": [b"r2"]}
    for topic, values in readable.items():
        assert [r.value for r in read_all(old, topic)] == values


def _rewrite_schemas(store: Store, topic: str, schemas: list[Any]) -> None:
    log = store._topic_log(topic)
    state = log.load()
    assert state.metadata is not None
    body = {**state.metadata, "schemas": schemas}
    log.commit(state, lambda _: [{"metaData": body}], operation="TEST")


def test_a_schema_with_an_unknown_type_is_refused_clearly(local: tuple[Store, Path]) -> None:
    store, root = local
    meta = store.create_topic("t", 1, value_schema="v INT")
    entry = dict(meta.schemas[0])
    entry["value"] = {
        "type": "struct",
        "fields": [{"name": "v", "type": "variant", "nullable": True, "metadata": {}}],
    }
    _rewrite_schemas(store, "t", [entry])
    refused = (UnsupportedFormatVersionError, CorruptLogError)
    other = Store(root.as_uri())
    with pytest.raises(refused, match="'variant' is not one this kstore knows"):
        _ = other.topic("t").schema_history
    producer = Producer(other)
    with pytest.raises(refused, match="variant"):
        producer.send("t", value={"v": 1})
    producer.close()
    with pytest.raises(refused, match="variant"):
        read_all(Store(root.as_uri()), "t")


def test_malformed_schema_entries_are_corrupt_logs(local: tuple[Store, Path]) -> None:
    store, root = local
    meta = store.create_topic("t", 1, value_schema="v INT")
    _rewrite_schemas(store, "t", [{**meta.schemas[0], "key": "date"}])
    with pytest.raises(CorruptLogError, match="key type"):
        _ = Store(root.as_uri()).topic("t").schema_history
    _rewrite_schemas(store, "t", [{**meta.schemas[0], "id": 2}, {**meta.schemas[0], "id": 1}])
    with pytest.raises(CorruptLogError, match="strictly increasing"):
        _ = Store(root.as_uri()).topic("t").schema_history


def test_a_corrupt_typed_segment_is_refused(local: tuple[Store, Path]) -> None:
    """The data object holding the segment (not data a
    commit carries, PROTOCOL.md 11.8)."""
    store, root = local
    store.create_topic("t", 1, {"commit.inline.bytes": 0}, value_schema=USERS)
    produce(store, "t", [(None, {"id": i, "name": "x" * 50}) for i in range(20)])
    # Usually one file; more when a slow machine split the records over several flushes.
    files = sorted(root.rglob("_data/*.kdat"))
    assert files
    segment = files[0]
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    with pytest.raises((CorruptRecordError, CorruptLogError)):
        read_all(Store(root.as_uri()), "t")


def test_a_binary_segment_in_a_typed_topic_is_refused(local: tuple[Store, Path]) -> None:
    """A segment whose columns do not match the topic's schema (a writer that ignored the
    schema) is refused when read, not misread."""
    from kstore.segments import BINARY
    from tests.test_jobs_support import table

    store, root = local
    store.create_topic("t", 1, value_schema=USERS)
    rogue = Store(root.as_uri()).partition("t", 0)
    rogue.layout = BINARY
    rogue.append(table([b"k"], [b"not a struct"], int(time.time() * 1000)), durable=False)
    with pytest.raises((CorruptRecordError, CorruptLogError, UnsupportedFormatVersionError)):
        read_all(Store(root.as_uri()), "t")


def test_topic_metadata_of_typed_and_binary_topics(mem: Store) -> None:
    typed = mem.create_topic("typed", 1, value_schema=pa.schema([("a", pa.int64())]))
    raw = mem.create_topic("raw", 1)
    assert typed.typed
    assert not raw.typed
    assert raw.schema is None
    assert raw.schema_history == ()
    assert typed.schema is not None
    assert typed.schema.ddl() == "a BIGINT"
    assert typed.schema.key_declared is None
    spark_json = {
        "type": "struct",
        "fields": [{"name": "a", "type": "long", "nullable": False, "metadata": {}}],
    }
    again = mem.create_topic("json", 1, value_schema=spark_json)
    assert again.schema is not None
    assert again.schema.ddl() == "a BIGINT NOT NULL"


def test_send_batch_enforces_max_message_bytes_per_record_in_nested_fields(mem: Store) -> None:
    mem.create_topic("t", 1, {"max.message.bytes": 10_000}, value_schema="tags ARRAY<STRING>")
    producer = Producer(mem)
    with pytest.raises(RecordTooLargeError):
        producer.send("t", value={"tags": ["x" * 50_000]})
    try:
        with pytest.raises(RecordTooLargeError):
            producer.send_batch("t", pa.table({"tags": [["x" * 50_000]] + [["a"]] * 99}))
    finally:
        producer.close()
    assert read_all(mem, "t") == []
