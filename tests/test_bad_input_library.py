"""Bad input to the library's public entry points (invariant 8), beyond tests/test_bad_input.py.

Store construction, malicious topic names, group ids and transactional ids through every API
that takes one, producer and consumer configuration, send/send_batch arguments, subscribe,
assign, seek and commit arguments, group administration, the transactions API and the
maintenance jobs' entry points. Each case asserts the error and its message, and that the
store is byte for byte unchanged.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Iterator
from functools import partial
from typing import Any

import pyarrow as pa
import pytest
from kstore.compaction import merge_segments, run_compaction
from kstore.compaction.main import main as compaction_main
from kstore.retention import run_retention, vacuum
from kstore.retention.main import main as retention_main

from kstore import Consumer, Producer, Store
from kstore.errors import (
    CommitFailedError,
    IllegalStateError,
    InvalidConfigurationError,
    InvalidGroupIdError,
    InvalidRecordError,
    InvalidStoreError,
    InvalidTopicError,
    KStoreError,
    RecordTooLargeError,
    StoreNotFoundError,
    UnknownTopicOrPartitionError,
)
from kstore.groups import Group, delete_group, describe_group, list_groups, reset_offsets
from kstore.layout import producer_log_dir
from kstore.records import OffsetAndMetadata, TopicPartition
from kstore.storage import check_store_url
from tests.badinput import (
    MALICIOUS_NAMES,
    local_snapshot,
    mem_store,
    name_id,
    open_store,
    refused,
    snapshot,
)
from tests.conftest import StoreTarget

__all__ = ["mem_store"]  # the fixture, imported for pytest

TP0 = TopicPartition("t", 0)


@pytest.fixture
def store(mem_store: StoreTarget) -> Store:
    """A memory store with topic "t" (2 partitions, 3 records each) and group "g" with a
    committed offset."""
    s = open_store(mem_store)
    s.create_topic("t", 2)
    with Producer(s) as p:
        for i in range(6):
            p.send("t", b"v%d" % i, partition=i % 2)
    Group(s, "g").commit_offsets({TP0: OffsetAndMetadata(1)}, member_id=None, generation=-1)
    return s


@pytest.fixture
def producer(store: Store) -> Iterator[Producer]:
    p = Producer(store)
    yield p
    p.close()


@pytest.fixture
def consumer(store: Store) -> Iterator[Consumer]:
    c = Consumer(store=store, group_id="g", enable_auto_commit=False)
    yield c
    c.close(autocommit=False)


# --- store construction ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error", "fragment"),
    [
        ((5,), InvalidStoreError, "non-empty string, got 5"),
        ((None,), InvalidStoreError, "None"),
        ((b"/tmp/x",), InvalidStoreError, "got b'/tmp/x'"),
        (("",), InvalidStoreError, "empty"),
        (("memory://x", [("a", 1)]), InvalidStoreError, "storage_options must be a mapping"),
        (("memory://x", "anon=true"), InvalidStoreError, "storage_options must be a mapping"),
        (("nosuchprotocol://bucket/x",), InvalidStoreError, "nosuchprotocol"),
    ],
    ids=["int", "none", "bytes", "empty", "options-list", "options-str", "protocol"],
)
def test_unusable_store_urls_and_options_are_refused(
    args: tuple[Any, ...], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error) as info:
        Store(*args)
    assert fragment in str(info.value)


UNUSABLE_URLS = [
    ("http://127.0.0.1:9/x", "a web server cannot hold a store"),
    ("HTTPS://example.invalid/ks", "a web server cannot hold a store"),
    ("ftp://127.0.0.1:9/x", "FTP offers no atomic create"),
    ("sftp://127.0.0.1:9/x", "SFTP offers no atomic create"),
]


@pytest.mark.parametrize(("url", "why"), UNUSABLE_URLS, ids=["http", "https", "ftp", "sftp"])
def test_unusable_store_url_schemes_name_the_cause_in_every_entry_point(url: str, why: str) -> None:
    """Each entry point fails at once with the cause and the usable kinds in one line (http
    and https failed naming only a path, ftp with an AttributeError, sftp naming paramiko)."""
    scheme = url.partition("://")[0]
    for open_it in (
        lambda: Store(url),
        lambda: Store(url, create=False),
        lambda: Producer(url),
        lambda: Consumer(store=url, group_id="g"),
    ):
        with pytest.raises(InvalidStoreError) as info:
            open_it()
        message = str(info.value)
        assert message.startswith(f"store URL scheme '{scheme}://': {why}"), message
        assert message.endswith("use a local path, s3://bucket/prefix or memory://name")
        assert "\n" not in message


def test_unknown_storage_options_of_a_local_store_are_refused(tmp_path: Any) -> None:
    """A local store reads timeout_ms, attempt_timeout_ms and auto_mkdir; anything else (an S3
    option, a typo) was ignored without a word."""
    root = tmp_path / "store"
    Store(str(root)).create_topic("t", 1)
    before = local_snapshot(str(root))
    for url in (str(root), root.as_uri(), f"local://{root}"):
        for open_it in (
            partial(Store, url, {"foo": "bar"}),
            partial(Store, url, {"client_kwargs": {"endpoint_url": "http://127.0.0.1:1"}}),
            partial(Producer, url, storage_options={"anon": True}),
            partial(Consumer, store=url, storage_options={"anon": True}),
        ):
            with pytest.raises(InvalidStoreError) as info:
                open_it()
            message = str(info.value)
            assert "means nothing to a store on the local disk" in message, message
            assert message.endswith(
                "local stores take only timeout_ms, attempt_timeout_ms, auto_mkdir"
            )
    with pytest.raises(InvalidStoreError, match="storage option 'anon' means nothing"):
        Store(str(root), {"timeout_ms": 5000, "anon": True})
    # a new store is not started either
    with pytest.raises(InvalidStoreError, match="storage option 'foo'"):
        Store(str(tmp_path / "new"), {"foo": 1})
    assert not (tmp_path / "new").exists()
    assert local_snapshot(str(root)) == before
    # what a local store reads is accepted, in any of its forms
    store = Store(str(root), {"timeout_ms": "5000", "attempt_timeout_ms": 2000, "auto_mkdir": True})
    assert store.list_topics() == ["t"]


def test_the_store_check_leaves_other_filesystems_options_alone() -> None:
    """Options of an object store or memory store are the filesystem's to judge."""
    check_store_url("s3://bucket/ks", {"anon": True, "client_kwargs": {"region_name": "x"}})
    check_store_url("memory://x", {"foo": "bar"})
    with pytest.raises(InvalidStoreError, match="storage option 'foo'"):
        check_store_url("/data/ks", {"foo": "bar"})


@pytest.mark.spark
@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
def test_the_spark_source_gives_the_librarys_store_error(spark: Any, tmp_path: Any) -> None:
    """The source opens its store with the options it was given: one action, as the sink and
    the other URL checks go through the same Store construction."""
    root = tmp_path / "store"
    Store(str(root)).create_topic("t", 1)
    before = local_snapshot(str(root))
    with pytest.raises(Exception) as info:
        spark.read.format("kstore").options(
            store=str(root), subscribe="t", **{"storage.anon": "true"}
        ).load()
    assert "storage option 'anon' means nothing to a store on the local disk" in " ".join(
        str(info.value).split()
    )
    assert local_snapshot(str(root)) == before


def test_opening_a_missing_store_without_create_writes_nothing(tmp_path: Any) -> None:
    root = tmp_path / "none"
    with pytest.raises(StoreNotFoundError, match="no kstore store"):
        Store(str(root), create=False)
    with pytest.raises(StoreNotFoundError, match="no kstore store"):
        Consumer(store=str(root))
    assert not root.exists()


# --- malicious names ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", MALICIOUS_NAMES, ids=[name_id(n) for n in MALICIOUS_NAMES])
def test_malicious_topic_names_are_refused_by_every_api(
    store: Store, producer: Producer, name: Any
) -> None:
    calls = [
        lambda: store.create_topic(name, 1),
        lambda: store.topic(name),
        lambda: store.partition(name, 0),
        lambda: store.describe_topic(name),
        lambda: store.delete_topic(name),
        lambda: store.add_partitions(name, 3),
        lambda: store.alter_topic_config(name, set={"retention.ms": 1}),
        lambda: producer.send(name, b"v"),
        lambda: producer.send_batch(name, pa.table({"value": [b"v"]})),
        lambda: producer.partitions_for(name),
        lambda: Consumer(name, store=store),
        lambda: Consumer(store=store).subscribe([name]),
        lambda: Consumer(store=store).assign([TopicPartition(name, 0)]),
        lambda: Group(store, "g").commit_offsets(
            {TopicPartition(name, 0): OffsetAndMetadata(1)}, member_id=None, generation=-1
        ),
        lambda: reset_offsets(store, "g", [name], to_earliest=True, execute=True),
        lambda: run_retention(None, store, topics=[name], verbose=False),
        lambda: run_compaction(None, store, topics=[name], verbose=False),
    ]
    for call in calls:
        refused(store.storage, call, InvalidTopicError, "invalid topic name")
    assert store.list_topics() == ["t"]
    assert describe_group(store, "g").partitions[0].current_offset == 1


@pytest.mark.parametrize("name", MALICIOUS_NAMES, ids=[name_id(n) for n in MALICIOUS_NAMES])
def test_malicious_group_ids_are_refused_by_every_api(store: Store, name: Any) -> None:
    calls = [
        lambda: Consumer("t", store=store, group_id=name),
        lambda: Group(store, name),
        lambda: describe_group(store, name),
        lambda: delete_group(store, name),
        lambda: reset_offsets(store, name, ["t"], to_earliest=True, execute=True),
    ]
    for call in calls:
        refused(store.storage, call, InvalidGroupIdError, "invalid group id")
    assert list_groups(store) == ["g"]


@pytest.mark.parametrize(
    "tid", ["../../etc", "/abs", "nul\x00", "\u202eevil", "x" * 10_000, "cafe\u0301"]
)
def test_any_transactional_id_only_ever_reaches_storage_hashed(store: Store, tid: str) -> None:
    before = set(snapshot(store.storage))
    with Producer(store, transactional_id=tid) as p:
        p.begin_transaction()
        p.send("t", b"in-txn", partition=0)
        p.commit_transaction()
    new = set(snapshot(store.storage)) - before
    log_dir = producer_log_dir(tid)
    producer_files = {f for f in new if "producers" in f}
    assert producer_files
    assert all(log_dir in f for f in producer_files)
    assert all(tid not in f for f in new)


@pytest.mark.parametrize("tid", ["", 5, b"app", None.__class__])
def test_unusable_transactional_ids_are_refused(store: Store, tid: Any) -> None:
    refused(
        store.storage,
        lambda: Producer(store, transactional_id=tid),
        ValueError,
        "transactional id must be a non-empty string",
    )


# --- producer configuration --------------------------------------------------------------------

PRODUCER_CONFIGS: list[tuple[str, Any, str]] = [
    ("linger_ms", -1, "'linger_ms': must be a non-negative integer, got -1"),
    ("linger_ms", 1.5, "'linger_ms'"),
    ("linger_ms", "5", "'linger_ms'"),
    ("linger_ms", True, "'linger_ms'"),
    ("batch_size", 0, "batch_size"),
    ("buffer_memory", 0, "buffer_memory"),
    ("max_request_size", -5, "'max_request_size'"),
    ("max_block_ms", None, "'max_block_ms'"),
    ("retries", math.inf, "'retries'"),
    ("delivery_timeout_ms", -1, "'delivery_timeout_ms'"),
    ("max_in_flight_partitions", 0, "max_in_flight_partitions"),
    ("acks", 2, "'acks': must be 0, 1 or 'all'"),
    ("acks", "everyone", "'acks': must be 0, 1 or 'all'"),
    ("compression_type", "gzip", "'compression_type': 'gzip' is not supported"),
    ("compression_type", "snappy", "'compression_type': 'snappy'"),
    ("partitioner", "nope", "unknown partitioner 'nope'"),
    ("key_serializer", "str", "'key_serializer': must be callable"),
    ("value_serializer", 5, "'value_serializer': must be callable"),
    ("bootstrap_servers", "localhost:9092", "unknown producer config 'bootstrap_servers'"),
    ("lingerms", 5, "unknown producer config 'lingerms'"),
]


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    PRODUCER_CONFIGS,
    ids=[f"{n}={v!r}" for n, v, _ in PRODUCER_CONFIGS],
)
def test_invalid_producer_configs_are_refused(
    store: Store, name: str, value: Any, fragment: str
) -> None:
    refused(
        store.storage, lambda: Producer(store, **{name: value}), InvalidConfigurationError, fragment
    )


def test_a_transactional_producer_refuses_weak_acks(store: Store) -> None:
    refused(
        store.storage,
        lambda: Producer(store, transactional_id="app", acks=1),
        InvalidConfigurationError,
        "acks='all'",
    )


def test_a_producer_on_a_string_url_with_bad_options_is_refused(mem_store: StoreTarget) -> None:
    with pytest.raises(InvalidStoreError, match="storage_options must be a mapping"):
        Producer(mem_store.url, storage_options=["x"])


@pytest.mark.parametrize("value", [-5, "x"])
def test_transaction_timeout_is_checked(store: Store, value: Any) -> None:
    refused(
        store.storage,
        lambda: Producer(store, transactional_id="app", transaction_timeout_ms=value),
        InvalidConfigurationError,
        "transaction_timeout_ms",
    )


# --- send / send_batch -------------------------------------------------------------------------

SEND_CASES: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"topic": "nope", "value": b"v"}, UnknownTopicOrPartitionError, "'nope' does not exist"),
    ({"topic": None, "value": b"v"}, InvalidTopicError, "must be a string"),
    ({"value": "text"}, InvalidRecordError, "value must be bytes"),
    ({"value": 5}, InvalidRecordError, "value must be bytes"),
    ({"value": b"v", "key": 5}, InvalidRecordError, "key must be bytes"),
    ({"value": b"v", "key": "k"}, InvalidRecordError, "key must be bytes"),
    ({"value": b"v", "partition": 2}, UnknownTopicOrPartitionError, "partitions 0..1; got 2"),
    ({"value": b"v", "partition": -1}, UnknownTopicOrPartitionError, "got -1"),
    ({"value": b"v", "partition": True}, UnknownTopicOrPartitionError, "got True"),
    ({"value": b"v", "partition": "0"}, UnknownTopicOrPartitionError, "got '0'"),
    ({"value": b"v", "timestamp_ms": -1}, InvalidRecordError, "timestamp_ms"),
    ({"value": b"v", "timestamp_ms": 1.5}, InvalidRecordError, "timestamp_ms"),
    ({"value": b"v", "timestamp_ms": "now"}, InvalidRecordError, "timestamp_ms"),
    ({"value": b"v", "headers": {"a": b"b"}}, InvalidRecordError, "headers must be a list"),
    ({"value": b"v", "headers": "ab"}, InvalidRecordError, "headers must be a list"),
    ({"value": b"v", "headers": [("a",)]}, InvalidRecordError, "headers[0]"),
    ({"value": b"v", "headers": [("a", "b")]}, InvalidRecordError, "value must be bytes"),
    ({"value": b"v", "headers": [(b"a", b"b")]}, InvalidRecordError, "name must be str"),
    ({"value": b"x" * 1_100_000}, RecordTooLargeError, "max.message.bytes"),
    ({"value": b"v", "key": b"k" * 1_100_000}, RecordTooLargeError, "max_request_size"),
    (
        {"value": b"v", "headers": [("h", b"x" * 1_100_000)]},
        RecordTooLargeError,
        "larger than the limit",
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"), SEND_CASES, ids=[str(i) for i in range(len(SEND_CASES))]
)
def test_bad_send_arguments_are_refused(
    store: Store, producer: Producer, kwargs: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    kwargs = {"topic": "t", **kwargs}
    refused(store.storage, lambda: producer.send(**kwargs), error, fragment)
    producer.flush()
    assert store.partition("t", 0).end_offset() == 3


def test_the_topics_max_message_bytes_limits_records(store: Store) -> None:
    store.create_topic("small", 1, {"max.message.bytes": 200})
    with Producer(store) as p:
        refused(store.storage, lambda: p.send("small", b"x" * 300), RecordTooLargeError, "200")
        refused(
            store.storage,
            lambda: p.send_batch("small", pa.table({"value": [b"ok", b"x" * 300]})),
            RecordTooLargeError,
            "row 1",
        )


def test_a_producers_max_request_size_limits_records(store: Store) -> None:
    with Producer(store, max_request_size=100) as p:
        refused(
            store.storage,
            lambda: p.send("t", b"x" * 101),
            RecordTooLargeError,
            "max_request_size=100",
        )


SEND_BATCH_CASES: list[tuple[Any, dict[str, Any], type[Exception], str]] = [
    ({"value": [b"a"]}, {}, InvalidRecordError, "got dict"),
    ([b"a"], {}, InvalidRecordError, "got list"),
    (pa.table({"key": [b"a"]}), {}, InvalidRecordError, "needs a 'value' column"),
    (pa.table({"value": [1]}), {}, InvalidRecordError, "'value' must be binary"),
    (pa.table({"value": [b"a"], "x": [1]}), {}, InvalidRecordError, "unexpected columns ['x']"),
    (pa.table({"value": [b"a"]}), {"partition": 9}, UnknownTopicOrPartitionError, "0..1"),
    (pa.table({"value": [b"a"], "partition": [7]}), {}, UnknownTopicOrPartitionError, "0..1"),
    (pa.table({"value": [b"a"], "headers": [["x"]]}), {}, InvalidRecordError, "'headers'"),
    (pa.table({"value": [b"x" * 1_100_000]}), {}, RecordTooLargeError, "row 0"),
]


@pytest.mark.parametrize(
    ("data", "kwargs", "error", "fragment"),
    SEND_BATCH_CASES,
    ids=[str(i) for i in range(len(SEND_BATCH_CASES))],
)
def test_bad_send_batch_arguments_are_refused(
    store: Store,
    producer: Producer,
    data: Any,
    kwargs: dict[str, Any],
    error: type[Exception],
    fragment: str,
) -> None:
    refused(store.storage, lambda: producer.send_batch("t", data, **kwargs), error, fragment)


def test_send_to_a_list_topic_names_the_topic(store: Store, producer: Producer) -> None:
    refused(store.storage, lambda: producer.send(["t"], b"v"), InvalidTopicError, "topic")


def test_send_refuses_a_timestamp_beyond_the_segment_range(
    store: Store, producer: Producer
) -> None:
    refused(
        store.storage,
        lambda: producer.send("t", b"v", timestamp_ms=2**63).get(10),
        InvalidRecordError,
        "timestamp_ms",
    )


def test_send_batch_refuses_a_negative_partition_column(store: Store, producer: Producer) -> None:
    refused(
        store.storage,
        lambda: producer.send_batch("t", pa.table({"value": [b"a"], "partition": [-1]})).get(10),
        UnknownTopicOrPartitionError,
        "-1",
    )


def test_send_batch_refuses_negative_timestamps(store: Store, producer: Producer) -> None:
    table = pa.table({"value": [b"a"], "timestamp": pa.array([-5], pa.timestamp("ms"))})
    refused(
        store.storage,
        lambda: producer.send_batch("t", table).get(10),
        InvalidRecordError,
        "timestamp",
    )


def test_a_closed_producer_refuses_sends(store: Store) -> None:
    p = Producer(store)
    p.close()
    refused(store.storage, lambda: p.send("t", b"v"), IllegalStateError, "closed")
    refused(
        store.storage,
        lambda: p.send_batch("t", pa.table({"value": [b"v"]})),
        IllegalStateError,
        "closed",
    )


# --- transactions API --------------------------------------------------------------------------


def test_transaction_calls_out_of_order_are_refused(store: Store, producer: Producer) -> None:
    for call in (
        producer.init_transactions,
        producer.begin_transaction,
        producer.commit_transaction,
        producer.abort_transaction,
        lambda: producer.send_offsets_to_transaction({TP0: 1}, "g"),
    ):
        refused(store.storage, call, IllegalStateError, "transactional_id")
    with Producer(store, transactional_id="app") as tp:
        for call in (
            tp.commit_transaction,
            tp.abort_transaction,
            lambda: tp.send_offsets_to_transaction({TP0: 1}, "g"),
        ):
            refused(store.storage, call, IllegalStateError, "begin_transaction()")
        refused(store.storage, lambda: tp.send("t", b"v"), IllegalStateError, "begin_transaction()")
        tp.begin_transaction()
        refused(store.storage, tp.begin_transaction, IllegalStateError, "already in progress")
        tp.abort_transaction()


@pytest.mark.parametrize(
    ("offsets", "group", "error", "fragment"),
    [
        ({TP0: 1}, "../g", InvalidGroupIdError, "invalid group id"),
        ([1], "g", ValueError, "offsets"),
        ({TP0: -1}, "g", ValueError, "non-negative"),
    ],
    ids=["group-id", "not-a-mapping", "negative-offset"],
)
def test_send_offsets_to_transaction_checks_before_writing(
    store: Store, offsets: Any, group: str, error: type[Exception], fragment: str
) -> None:
    with Producer(store, transactional_id="app") as tp:
        tp.begin_transaction()
        refused(
            store.storage, lambda: tp.send_offsets_to_transaction(offsets, group), error, fragment
        )
        tp.abort_transaction()


# --- consumer configuration and calls ----------------------------------------------------------

CONSUMER_CONFIGS: list[tuple[str, Any, str]] = [
    (
        "auto_offset_reset",
        "first",
        "'auto_offset_reset': 'first' is not one of earliest, latest, none",
    ),
    ("max_poll_records", 0, "'max_poll_records': must be an integer >= 1, got 0"),
    ("max_poll_records", "10", "'max_poll_records'"),
    ("fetch_max_bytes", -1, "'fetch_max_bytes'"),
    ("session_timeout_ms", 0, "'session_timeout_ms'"),
    (
        "heartbeat_interval_ms",
        60_000,
        "heartbeat_interval_ms must be lower than session_timeout_ms",
    ),
    ("auto_commit_interval_ms", 1.5, "'auto_commit_interval_ms'"),
    ("max_poll_interval_ms", True, "'max_poll_interval_ms'"),
    ("partition_assignment_strategy", ("magic",), "unknown partition assignment strategy"),
    ("isolation_level", "serializable", "'isolation_level': 'serializable' is not one of"),
    ("value_deserializer", "utf-8", "'value_deserializer': must be callable"),
    ("client_id", "../x", "'client_id': '../x' must be 1-200"),
    ("client_id", "x" * 201, "client_id"),
    ("client_id", "caf\u00e9", "client_id"),
    ("group_id_", "g", "unknown consumer config 'group_id_'"),
]


@pytest.mark.parametrize(
    ("name", "value", "fragment"),
    CONSUMER_CONFIGS,
    ids=[f"{n}={v!r}"[:40] for n, v, _ in CONSUMER_CONFIGS],
)
def test_invalid_consumer_configs_are_refused(
    store: Store, name: str, value: Any, fragment: str
) -> None:
    refused(
        store.storage,
        lambda: Consumer("t", store=store, group_id="g", **{name: value}),
        InvalidConfigurationError,
        fragment,
    )


def test_consumer_timeout_is_checked(store: Store) -> None:
    refused(
        store.storage,
        lambda: Consumer("t", store=store, consumer_timeout_ms="soon"),
        InvalidConfigurationError,
        "consumer_timeout_ms",
    )


def test_bad_subscribe_and_assign_arguments_are_refused(store: Store, consumer: Consumer) -> None:
    s = store.storage
    refused(s, lambda: consumer.subscribe(["t"], pattern="t"), IllegalStateError, "not both")
    refused(s, lambda: consumer.subscribe(), IllegalStateError, "either topics or a pattern")
    refused(s, lambda: consumer.subscribe([5]), InvalidTopicError, "must be a string")
    refused(s, lambda: consumer.assign([("t", 9)]), UnknownTopicOrPartitionError, "9 does not")
    refused(s, lambda: consumer.assign([("t", -1)]), UnknownTopicOrPartitionError, "-1")
    refused(s, lambda: consumer.assign([("t", "0")]), UnknownTopicOrPartitionError, "'0'")
    refused(s, lambda: consumer.assign(["t"]), TypeError, "TopicPartition")
    refused(s, lambda: consumer.assign([("nope", 0)]), UnknownTopicOrPartitionError, "'nope'")
    assert consumer.assignment() == set()


def test_bad_positions_and_commits_are_refused(store: Store, consumer: Consumer) -> None:
    s = store.storage
    consumer.assign([TP0])
    tp1 = TopicPartition("t", 1)
    refused(s, lambda: consumer.seek(TP0, -1), ValueError, "non-negative integer, got -1")
    refused(s, lambda: consumer.seek(TP0, "1"), ValueError, "got '1'")
    refused(s, lambda: consumer.seek(TP0, True), ValueError, "got True")
    refused(s, lambda: consumer.seek(tp1, 0), IllegalStateError, "not assigned")
    refused(s, lambda: consumer.position(tp1), IllegalStateError, "not assigned")
    refused(s, lambda: consumer.pause(tp1), IllegalStateError, "not assigned")
    refused(s, lambda: consumer.poll(max_records=0), ValueError, "max_records")
    refused(
        s,
        lambda: consumer.offsets_for_times({TP0: -1}),
        ValueError,
        "must be a non-negative integer (ms)",
    )
    refused(s, lambda: consumer.commit({TP0: -1}), ValueError, "non-negative integer, got -1")
    refused(
        s,
        lambda: consumer.commit({TopicPartition("../x", 0): 1}),
        InvalidTopicError,
        "invalid topic name '../x'",
    )
    refused(
        s,
        lambda: consumer.commit({TopicPartition("t", -3): 1}),
        ValueError,
        "partition of 't' must be a non-negative integer, got -3",
    )
    refused(
        s,
        lambda: consumer.commit({TP0: OffsetAndMetadata(1, 5)}),  # type: ignore[arg-type]
        ValueError,
        "metadata for t-0 must be a string",
    )
    assert consumer.committed(TP0) == 1
    assert describe_group(store, "g").partitions[0].current_offset == 1


def test_commits_outside_a_group_or_subscription_are_refused(store: Store) -> None:
    c = Consumer(store=store)
    refused(store.storage, lambda: c.commit({TP0: 1}), IllegalStateError, "needs a group_id")
    refused(store.storage, lambda: c.committed(TP0), IllegalStateError, "needs a group_id")
    refused(store.storage, c.poll, IllegalStateError, "not subscribed")
    c.close()
    refused(store.storage, c.poll, IllegalStateError, "closed")


def test_a_string_offset_commit_names_the_partition(store: Store, consumer: Consumer) -> None:
    consumer.assign([TP0])
    refused(store.storage, lambda: consumer.commit({TP0: "x"}), ValueError, "t-0")


# --- group administration ----------------------------------------------------------------------


def test_group_commits_are_checked_before_writing(store: Store) -> None:
    """Regression: commit_offsets wrote entries with illegal topic names, bad partitions and
    non-string metadata into the group log, after which describe_group failed for good."""
    group = Group(store, "g")
    cases: list[tuple[Any, type[Exception], str]] = [
        ({TopicPartition("../x", 0): OffsetAndMetadata(1)}, InvalidTopicError, "'../x'"),
        ({TopicPartition(5, 0): OffsetAndMetadata(1)}, InvalidTopicError, "must be a string"),
        ({TopicPartition("t", -1): OffsetAndMetadata(1)}, ValueError, "got -1"),
        ({TopicPartition("t", "0"): OffsetAndMetadata(1)}, ValueError, "got '0'"),
        ({TopicPartition("t", True): OffsetAndMetadata(1)}, ValueError, "got True"),
        ({TP0: OffsetAndMetadata(True)}, ValueError, "got True"),
        ({TP0: OffsetAndMetadata(1.5)}, ValueError, "got 1.5"),
        ({TP0: OffsetAndMetadata(1, b"m")}, ValueError, "must be a string"),
        ({TP0: 1}, ValueError, "not an OffsetAndMetadata"),
        ({"t": OffsetAndMetadata(1)}, ValueError, "not a TopicPartition"),
        ([(TP0, OffsetAndMetadata(1))], ValueError, "must be a mapping"),
    ]
    for offsets, error, fragment in cases:
        refused(
            store.storage,
            lambda o=offsets: group.commit_offsets(o, member_id=None, generation=-1),
            error,
            fragment,
        )
    assert describe_group(store, "g").partitions[0].current_offset == 1


def test_none_metadata_is_stored_as_empty(store: Store) -> None:
    """Regression: OffsetAndMetadata(o, None) was stored and read back as the string 'None'."""
    Group(store, "g").commit_offsets(
        {TP0: OffsetAndMetadata(2, None)},  # type: ignore[arg-type]
        member_id=None,
        generation=-1,
    )
    assert Group(store, "g").committed(TP0) == OffsetAndMetadata(2, "")


RESET_CASES: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({}, ValueError, "choose exactly one"),
    ({"to_earliest": True, "to_latest": True}, ValueError, "choose exactly one"),
    ({"to_offset": "5"}, ValueError, "to_offset must be an integer, got '5'"),
    ({"to_offset": True}, ValueError, "to_offset must be an integer, got True"),
    ({"to_offset": -1}, ValueError, "to_offset must not be negative"),
    ({"shift_by": 1.5}, ValueError, "shift_by must be an integer"),
    ({"to_datetime_ms": -5}, ValueError, "to_datetime_ms must not be negative"),
    ({"by_duration_ms": -5}, ValueError, "by_duration_ms must not be negative"),
    (
        {"to_earliest": True, "partitions": [9]},
        UnknownTopicOrPartitionError,
        "partition 9 does not exist",
    ),
    ({"to_earliest": True, "partitions": [-1]}, ValueError, "got -1"),
    ({"to_earliest": True, "partitions": ["0"]}, ValueError, "got '0'"),
]


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"), RESET_CASES, ids=[str(i) for i in range(len(RESET_CASES))]
)
def test_bad_offset_resets_are_refused(
    store: Store, kwargs: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    """Regression: these crashed with TypeError, reset to True, or silently planned nothing."""
    refused(
        store.storage,
        lambda: reset_offsets(store, "g", ["t"], execute=True, **kwargs),
        error,
        fragment,
    )
    assert Group(store, "g").committed(TP0) == OffsetAndMetadata(1)


def test_reset_offsets_takes_one_topic_as_a_string(store: Store) -> None:
    """Regression: a string was iterated, resetting topics named by its characters."""
    store.create_topic("orders", 1)
    plan = reset_offsets(store, "g", "orders", to_earliest=True)
    assert plan == {TopicPartition("orders", 0): 0}
    refused(
        store.storage,
        lambda: reset_offsets(store, "g", ["nope"], to_earliest=True, execute=True),
        UnknownTopicOrPartitionError,
        "'nope'",
    )


def test_group_admin_of_missing_or_live_groups_is_refused(store: Store) -> None:
    refused(store.storage, lambda: delete_group(store, "missing"), KStoreError, "does not exist")
    c = Consumer("t", store=store, group_id="live", enable_auto_commit=False)
    try:
        refused(
            store.storage, lambda: delete_group(store, "live"), IllegalStateError, "live member"
        )
        refused(
            store.storage,
            lambda: reset_offsets(store, "live", ["t"], to_earliest=True, execute=True),
            IllegalStateError,
            "live member",
        )
        refused(
            store.storage,
            lambda: Group(store, "live").commit_offsets(
                {TP0: OffsetAndMetadata(1)}, member_id=None, generation=-1
            ),
            CommitFailedError,
            "live member",
        )
        refused(
            store.storage,
            lambda: Group(store, "live").commit_offsets(
                {TP0: OffsetAndMetadata(1)}, member_id="ghost-1", generation=1
            ),
            CommitFailedError,
            "member ghost-1 is not in the group",
        )
    finally:
        c.close(autocommit=False)


# --- maintenance jobs --------------------------------------------------------------------------


@pytest.mark.parametrize("job", [run_retention, vacuum], ids=["retention", "vacuum"])
@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"tasks": -1}, InvalidConfigurationError, "tasks must be an integer >= 1, got -1"),
        ({"tasks": "4"}, InvalidConfigurationError, "tasks must be an integer"),
        ({"now_ms": "now"}, InvalidConfigurationError, "now_ms must be an integer"),
        ({"now_ms": -1}, InvalidConfigurationError, "now_ms must be an integer >= 0"),
        ({"topics": ["nope"]}, UnknownTopicOrPartitionError, "'nope'"),
        ({"storage_options": [1]}, InvalidStoreError, "mapping"),
    ],
    ids=["tasks-neg", "tasks-str", "now-str", "now-neg", "unknown-topic", "options"],
)
def test_bad_retention_job_arguments_are_refused(
    store: Store, job: Any, kwargs: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    """Regression: tasks and now_ms were unchecked (a TypeError mid-run, or ignored)."""
    url = store.url if "storage_options" in kwargs else store
    refused(store.storage, lambda: job(None, url, verbose=False, **kwargs), error, fragment)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"orphan_age_ms": 5}, "orphan_age_ms 5 is below"),
        ({"orphan_age_ms": "1h"}, "orphan_age_ms must be an integer"),
        ({"log_retention_ms": 5}, "log_retention_ms 5 is below"),
        ({"log_retention_ms": None}, "log_retention_ms must be an integer"),
    ],
)
def test_bad_vacuum_ages_are_refused(store: Store, kwargs: dict[str, Any], fragment: str) -> None:
    refused(
        store.storage,
        lambda: vacuum(None, store, verbose=False, **kwargs),
        InvalidConfigurationError,
        fragment,
    )


def test_retention_takes_one_topic_as_a_string(store: Store) -> None:
    store.create_topic("orders", 1)
    summary = run_retention(None, store, topics="orders", verbose=False)
    assert summary.partitions_scanned == 1


@pytest.mark.parametrize("job", [run_compaction, merge_segments], ids=["compact", "merge"])
def test_bad_compaction_job_arguments_are_refused(store: Store, job: Any) -> None:
    refused(
        store.storage,
        lambda: job(None, store, topics=["nope"], verbose=False),
        UnknownTopicOrPartitionError,
        "'nope'",
    )
    refused(
        store.storage,
        lambda: job(None, store.url + "-missing", verbose=False),
        StoreNotFoundError,
        "no kstore store",
    )


def test_compaction_takes_one_topic_as_a_string(store: Store) -> None:
    store.create_topic("orders", 1, {"cleanup.policy": "compact"})
    summary = run_compaction(None, store, topics="orders", verbose=False)
    assert summary.partitions_scanned == 1


def test_compaction_checks_tasks(store: Store) -> None:
    refused(
        store.storage,
        lambda: run_compaction(None, store, tasks=-1, verbose=False),
        InvalidConfigurationError,
        "tasks",
    )


def _run_main(main: Any, argv: list[str]) -> tuple[int | str | None, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code: int | str | None = main(argv)
        except SystemExit as exc:
            code = exc.code
    return code, err.getvalue()


@pytest.mark.parametrize(
    ("main", "argv", "code", "fragment"),
    [
        (compaction_main, [], 2, "--store"),
        (compaction_main, ["explode"], 2, "invalid choice: 'explode'"),
        (compaction_main, ["--tasks", "x"], 2, "invalid int value: 'x'"),
        (
            compaction_main,
            ["--option", "noequals"],
            "--option expects KEY=VALUE, got 'noequals'",
            "",
        ),
        (compaction_main, ["--tasks", "-3"], 2, "tasks must be an integer >= 1, got -3"),
        (compaction_main, ["--topic", "../x"], 2, "invalid topic name '../x'"),
        (compaction_main, ["--topic", "nope"], 2, "'nope' does not exist"),
        (retention_main, ["vacuum", "--orphan-age-ms", "5"], 2, "orphan_age_ms 5 is below"),
        (retention_main, ["vacuum", "--orphan-age-ms", "1h"], 2, "invalid int value: '1h'"),
        (retention_main, ["--tasks", "-3"], 2, "tasks must be an integer >= 1, got -3"),
        (retention_main, ["--topic", "a\x00b"], 2, "invalid topic name"),
    ],
    ids=[
        "no-store",
        "command",
        "tasks-type",
        "option",
        "compaction-tasks-neg",
        "topic-name",
        "topic-missing",
        "orphan-age",
        "orphan-type",
        "tasks-neg",
        "topic-nul",
    ],
)
def test_job_command_lines_refuse_bad_arguments(
    tmp_path: Any, main: Any, argv: list[str], code: Any, fragment: str
) -> None:
    root = tmp_path / "store"
    Store(str(root)).create_topic("t", 1)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    if (argv and not argv[0].startswith("--") and argv != ["explode"]) or argv:
        full = ["--store", str(root), "--local", *argv]
    else:
        full = ["--local"]
    got, err = _run_main(main, full)
    assert got == code
    assert fragment in err
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
