"""Consumer SDK: reading, positions, resets, seeks, pauses, gaps, commits, offsets_for_times."""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pytest

import kstore
from kstore.consumer import Consumer
from kstore.consumer.builder import RecordBuilder
from kstore.consumer.fetcher import Fetcher
from kstore.errors import (
    IllegalStateError,
    InvalidConfigurationError,
    InvalidGroupIdError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from kstore.partition import Segment
from kstore.producer import Producer
from kstore.records import OffsetAndMetadata, TopicPartition
from kstore.segments import write_segment
from tests.commit_logs import FAST_BACKENDS, backend_params, commit_logs_fixture, logs_target

BACKENDS = ["memory", "local", "seaweed"]


@pytest.fixture(params=backend_params(BACKENDS, all_logs=FAST_BACKENDS))
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> kstore.Store:
    """Every backend; on the fast ones with commit.logs 1 and 3 (tests/commit_logs.py)."""
    target = logs_target(request, monkeypatch)
    return kstore.Store(target.url, target.storage_options)


@pytest.fixture(params=BACKENDS)
def one_log_store(request: pytest.FixtureRequest) -> kstore.Store:
    """Every backend, commit.logs 1 alone: for topics of one partition, where commit.logs 3
    would leave logs 1 and 2 unused and change nothing."""
    url, options = request.getfixturevalue(f"{request.param}_store")
    return kstore.Store(url, options)


commit_logs = commit_logs_fixture()


def produce(
    store: kstore.Store,
    topic: str,
    n: int,
    *,
    key_mod: int = 10,
    start: int = 0,
    timestamps: list[int] | None = None,
) -> None:
    with Producer(store, linger_ms=1) as producer:
        for i in range(start, start + n):
            producer.send(
                topic,
                value=b"%d" % i,
                key=b"k%d" % (i % key_mod),
                timestamp_ms=None if timestamps is None else timestamps[i - start],
            )


def drain(consumer: Consumer, *, idle_polls: int = 3, timeout_ms: int = 50) -> list[Any]:
    out: list[Any] = []
    idle = 0
    while idle < idle_polls:
        got = consumer.poll(timeout_ms=timeout_ms)
        if not got:
            idle += 1
            continue
        idle = 0
        for records in got.values():
            out.extend(records)
    return out


def test_reads_everything_in_partition_order(store: kstore.Store) -> None:
    store.create_topic("t", partitions=3)
    with Producer(store, linger_ms=1) as producer:
        futures = [producer.send("t", value=b"%d" % i, key=b"k%d" % (i % 10)) for i in range(600)]
    acked: dict[tuple[int, int], int] = {}
    for i, future in enumerate(futures):
        meta = future.get()
        acked[(meta.partition, meta.offset)] = i
    with Consumer("t", store=store, auto_offset_reset="earliest", max_poll_records=70) as consumer:
        records = drain(consumer)
    assert sorted(int(r.value) for r in records) == list(range(600))
    # Every record where its acknowledgement said, partition by partition (with commit.logs 3
    # each partition has a topic log of its own; a flush spans all three).
    assert {(r.partition, r.offset): int(r.value) for r in records} == acked
    by_partition: dict[int, list[int]] = {}
    for r in records:
        by_partition.setdefault(r.partition, []).append(r.offset)
        assert r.topic == "t"
        assert r.timestamp_type == 0
        assert r.headers == ()
    for offsets in by_partition.values():
        assert offsets == list(range(len(offsets)))  # in order, no gap, no repeat
    # each key's values arrive in send order
    per_key: dict[bytes, list[int]] = {}
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        per_key.setdefault(r.key, []).append(int(r.value))
    assert all(v == sorted(v) for v in per_key.values())


def test_latest_and_none_resets(one_log_store: kstore.Store) -> None:
    store = one_log_store
    store.create_topic("t")
    produce(store, "t", 5)
    with Consumer("t", store=store, auto_offset_reset="latest") as consumer:
        assert consumer.poll(timeout_ms=50) == {}
        produce(store, "t", 3, start=5)
        assert [int(r.value) for r in drain(consumer)] == [5, 6, 7]
    with (
        Consumer("t", store=store, group_id="g", auto_offset_reset="none") as consumer,
        pytest.raises(OffsetOutOfRangeError, match="no committed offset"),
    ):
        consumer.poll(timeout_ms=50)


def test_seek_position_pause_resume(store: kstore.Store) -> None:
    store.create_topic("t", partitions=2)
    produce(store, "t", 100)
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    with Consumer(store=store, auto_offset_reset="earliest") as consumer:
        consumer.assign([tp0, tp1])
        end = consumer.end_offsets([tp0, tp1])
        assert consumer.beginning_offsets([tp0]) == {tp0: 0}
        consumer.seek(tp0, 3)
        assert consumer.position(tp0) == 3
        consumer.pause(tp1)
        assert consumer.paused() == {tp1}
        records = drain(consumer)
        assert {r.partition for r in records} == {0}
        assert records[0].offset == 3
        assert consumer.position(tp0) == end[tp0]
        consumer.resume(tp1)
        assert {r.partition for r in drain(consumer)} == {1}
        consumer.seek_to_beginning(tp0)
        assert consumer.position(tp0) == 0
        consumer.seek_to_end()
        assert consumer.position(tp1) == end[tp1]
        with pytest.raises(IllegalStateError):
            consumer.seek(TopicPartition("t", 7), 0)
        with pytest.raises(ValueError, match="non-negative"):
            consumer.seek(tp0, -1)


def test_poll_batches_are_arrow(store: kstore.Store) -> None:
    store.create_topic("t", partitions=2)
    produce(store, "t", 1_000)
    total = 0
    with Consumer(
        "t", store=store, auto_offset_reset="earliest", max_poll_records=10_000
    ) as consumer:
        while got := consumer.poll_batches(timeout_ms=50):
            for _tp, batches in got.items():
                for batch in batches:
                    assert isinstance(batch, pa.RecordBatch)
                    assert batch.schema.names == ["key", "value", "timestamp", "headers", "offset"]
                    total += batch.num_rows
    assert total == 1_000


def test_deserializers_and_headers(one_log_store: kstore.Store) -> None:
    store = one_log_store
    store.create_topic("t")
    with Producer(store) as producer:
        producer.send("t", value=b'{"a": 1}', key=b"k", headers=[("h", b"v")])
        producer.send("t", value=None, key=b"k")
    import json

    with Consumer(
        "t",
        store=store,
        auto_offset_reset="earliest",
        value_deserializer=json.loads,
        key_deserializer=bytes.decode,
    ) as consumer:
        first, tombstone = drain(consumer)
    assert first.value == {"a": 1}
    assert first.key == "k"
    assert first.headers == (("h", b"v"),)
    assert tombstone.value is None
    assert tombstone.serialized_value_size == -1


def test_one_poll_of_many_partitions_gives_each_record_its_own_partition_and_fields(
    store: kstore.Store,
) -> None:
    """A poll that gathers a few records from each of many partitions (converted together,
    a topic at a time) hands every partition exactly its own records, in offset order, with
    their own keys, values, headers and sizes, across two topics."""
    store.create_topic("a", partitions=16, layout=3)
    store.create_topic("b", partitions=4)
    sent: dict[tuple[str, int], list[tuple[bytes | None, bytes | None, tuple[Any, ...]]]] = {}
    with Producer(store, linger_ms=50) as producer:
        for i in range(60):
            topic = "a" if i % 3 else "b"
            partition = i % (16 if topic == "a" else 4)
            key = None if i % 7 == 0 else b"k%d" % i
            value = None if i % 11 == 0 else b"v" * (i % 5)
            headers = [("h", b"%d" % i)] if i % 2 else []
            producer.send(topic, value=value, key=key, partition=partition, headers=headers)
            sent.setdefault((topic, partition), []).append((key, value, tuple(headers)))
    with Consumer(
        "a", "b", store=store, auto_offset_reset="earliest", max_poll_records=1000
    ) as consumer:
        got: dict[TopicPartition, list[Any]] = {}
        for _ in range(50):
            for tp, records in consumer.poll(timeout_ms=50).items():
                got.setdefault(tp, []).extend(records)
            if sum(map(len, got.values())) == 60:
                break
    assert {(tp.topic, tp.partition) for tp in got} == set(sent)
    for tp, records in got.items():
        assert all((r.topic, r.partition) == (tp.topic, tp.partition) for r in records)
        assert [r.offset for r in records] == list(range(len(records)))
        assert [(r.key, r.value, r.headers) for r in records] == sent[(tp.topic, tp.partition)]
        assert [r.serialized_key_size for r in records] == [
            -1 if k is None else len(k) for k, _, _ in sent[(tp.topic, tp.partition)]
        ]


def _visits(consumer: Consumer, monkeypatch: pytest.MonkeyPatch) -> list[TopicPartition]:
    """The partitions a consumer's fetches look up one by one, from now on."""
    visited: list[TopicPartition] = []
    real = Fetcher.partition

    def counted(fetcher: Fetcher, tp: TopicPartition, *, cached_metadata: bool = False) -> Any:
        visited.append(tp)
        return real(fetcher, tp, cached_metadata=cached_metadata)

    monkeypatch.setattr(Fetcher, "partition", counted)
    return visited


def _drain(consumer: Consumer, want: int) -> dict[TopicPartition, list[int]]:
    got: dict[TopicPartition, list[int]] = {}
    for _ in range(100):
        for tp, records in consumer.poll(timeout_ms=20).items():
            got.setdefault(tp, []).extend(r.offset for r in records)
        if sum(map(len, got.values())) >= want:
            break
    return got


def test_a_tailing_consumer_looks_without_visiting_its_partitions_while_nothing_changes(
    store: kstore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a fetch of a topic log's partitions found nothing to read, looks that find the
    same state go through none of them (partitions not written yet included), and anything that
    changes what a fetch reads is seen at once: a commit, a seek, a pause and a resume, a new
    assignment."""
    # Topic metadata is not checked again during the test: only what changed brings a fetch.
    monkeypatch.setattr(kstore.consumer.fetcher, "METADATA_RECHECK_S", 3600.0)
    store.create_topic("t", partitions=12, layout=3)
    with Producer(store, linger_ms=0) as producer:
        for p in (0, 1, 2, 11):  # partitions 3-10 are not written yet; 11 is not assigned yet
            producer.send("t", b"v", partition=p)
    consumer = Consumer(store=store, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("t", p) for p in range(11)])
    assert sum(map(len, _drain(consumer, 3).values())) == 3
    assert consumer.poll(timeout_ms=0) == {}  # finds every partition caught up
    visited = _visits(consumer, monkeypatch)
    for _ in range(5):
        assert consumer.poll(timeout_ms=5) == {}
    assert visited == []
    # A commit to a partition never written until now.
    with Producer(store, linger_ms=0) as producer:
        producer.send("t", b"w", partition=9)
    assert _drain(consumer, 1) == {TopicPartition("t", 9): [0]}
    # The fetch that read partition 9 to its end left it caught up: not looked up again.
    visited.clear()
    assert consumer.poll(timeout_ms=0) == {}
    assert visited == []
    # A seek back, with nothing new committed.
    consumer.seek(TopicPartition("t", 2), 0)
    assert _drain(consumer, 1) == {TopicPartition("t", 2): [0]}
    # A pause: the paused partition's records wait for its resume.
    assert consumer.poll(timeout_ms=0) == {}
    consumer.pause(TopicPartition("t", 0))
    with Producer(store, linger_ms=0) as producer:
        producer.send("t", b"x", partition=0)
        producer.send("t", b"x", partition=1)
    assert _drain(consumer, 1) == {TopicPartition("t", 1): [1]}
    assert consumer.poll(timeout_ms=0) == {}
    consumer.resume(TopicPartition("t", 0))
    assert _drain(consumer, 1) == {TopicPartition("t", 0): [1]}
    # A new assignment, with nothing new committed: the newly assigned partition is read
    # (the positions of the others are kept, so only the assignment tells).
    assert consumer.poll(timeout_ms=0) == {}
    consumer.assign([TopicPartition("t", p) for p in range(12)])
    assert _drain(consumer, 1) == {TopicPartition("t", 11): [0]}
    consumer.close()


def test_a_consumer_looking_at_an_unchanged_log_sees_a_topic_deleted_meanwhile(
    local_store: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, commit_logs: int
) -> None:
    """Looks that skip the partitions of an unchanged topic log still check the topic's
    metadata as often as before: a topic deleted meanwhile is reported, not tailed forever."""
    # The metadata is read again 50 ms after it was read (a second by default).
    monkeypatch.setattr(kstore.consumer.fetcher, "METADATA_RECHECK_S", 0.05)
    store = kstore.Store(*local_store)
    store.create_topic("t", partitions=3, layout=3)
    with Producer(store, linger_ms=0) as producer:
        producer.send("t", b"v", partition=1)
    consumer = Consumer(store=kstore.Store(*local_store), auto_offset_reset="earliest")
    consumer.assign([TopicPartition("t", p) for p in range(3)])
    assert sum(map(len, _drain(consumer, 1).values())) == 1
    assert consumer.poll(timeout_ms=0) == {}
    store.delete_topic("t")

    def poll_until_refused() -> None:
        for _ in range(50):
            consumer.poll(timeout_ms=10)

    with pytest.raises(UnknownTopicOrPartitionError):
        poll_until_refused()
    consumer.close()


def test_records_of_partitions_whose_batches_differ_in_schema_are_built_apart(
    memory_store: tuple[str, dict[str, Any]],
) -> None:
    """Batches that cannot be joined (their schemas differ) are converted one at a time,
    each record keeping its partition."""
    store = kstore.Store(*memory_store)
    store.create_topic("t", partitions=2)

    def batch(values: pa.Array, offset: int) -> pa.RecordBatch:
        n = len(values)
        return pa.record_batch(
            {
                "key": pa.array([b"k"] * n),
                "value": values,
                "timestamp": pa.array([1_000_000] * n, pa.timestamp("us", tz="UTC")),
                "headers": pa.nulls(
                    n, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
                ),
                "offset": pa.array(range(offset, offset + n), pa.int64()),
            }
        )

    zero, one = TopicPartition("t", 0), TopicPartition("t", 1)
    records = RecordBuilder(store).to_records(
        {zero: [batch(pa.array([b"x", b"y"]), 5)], one: [batch(pa.array(["z"]), 9)]}
    )
    assert [(r.partition, r.offset, r.value) for r in records[zero]] == [(0, 5, b"x"), (0, 6, b"y")]
    assert [(r.partition, r.offset, r.value) for r in records[one]] == [(1, 9, "z")]


def test_serialized_sizes_are_the_raw_lengths_and_minus_one_for_null(
    one_log_store: kstore.Store,
) -> None:
    """Kafka's serialized sizes: the bytes as stored, before a deserializer, -1 for a null
    key or value; in a poll that mixes records with and without keys."""
    store = one_log_store
    store.create_topic("t", partitions=1)
    sent = [(b"k", b"v" * 10), (None, b"\xff" * 3), (b"\xe2\x82\xac", None), (b"", b"")]
    with Producer(store) as producer:
        for key, value in sent:
            producer.send("t", value=value, key=key)
    with Consumer(
        "t",
        store=store,
        auto_offset_reset="earliest",
        key_deserializer=lambda b: b.decode(errors="replace"),
    ) as consumer:
        got = drain(consumer)
    assert [(r.serialized_key_size, r.serialized_value_size) for r in got] == [
        (1, 10),
        (-1, 3),
        (3, -1),
        (0, 0),
    ]
    assert got[2].key == "\u20ac"  # deserialized after its size was taken


def test_offsets_for_times_matches_a_scan(one_log_store: kstore.Store) -> None:
    store = one_log_store
    store.create_topic("t", partitions=1)
    # Not monotonic: producers choose CreateTime, and several segments are written.
    stamps = [1_000, 5_000, 3_000, 9_000, 2_000, 7_000, 7_000, 11_000]
    for i, ts in enumerate(stamps):
        produce(store, "t", 1, start=i, timestamps=[ts])
    tp = TopicPartition("t", 0)
    with Consumer(store=store) as consumer:
        consumer.assign([tp])
        for query in [0, 1_000, 1_001, 4_000, 7_000, 8_000, 11_000, 11_001]:
            expected = next(((i, ts) for i, ts in enumerate(stamps) if ts >= query), None)
            found = consumer.offsets_for_times({tp: query})[tp]
            if expected is None:
                assert found is None
            else:
                assert found is not None
                assert (found.offset, found.timestamp) == expected


def test_compaction_gaps_are_skipped(one_log_store: kstore.Store) -> None:
    store = one_log_store
    store.create_topic("t", config={"cleanup.policy": "compact"})
    produce(store, "t", 10)
    part = store.partition("t", 0)
    state = part.state()
    # Replace every segment by one sparse segment holding offsets 2, 5 and 9 (as compaction would).
    rows = [r for b in part.read(0) for r in b.to_pylist() if r["offset"] in (2, 5, 9)]
    table = pa.Table.from_pylist(rows, schema=kstore.READ_SCHEMA)
    seg_file = write_segment(part.storage, part.directory, table)
    seg = Segment(
        seg_file.path,
        0,
        9,
        3,
        seg_file.min_timestamp_ms,
        seg_file.max_timestamp_ms,
        seg_file.size_bytes,
        seg_file.checksum,
        seg_file.format,
        True,
        0,
    )

    def build(s: kstore.PartitionState) -> list[dict[str, Any]]:
        now = int(time.time() * 1000)
        return [
            *({"remove": {"path": x.path, "deletionTimestamp": now}} for x in s.segments),
            seg.to_action(),
        ]

    part.commit_actions(build, operation="COMPACT")
    assert state.end_offset == 10
    with Consumer("t", store=store, auto_offset_reset="earliest") as consumer:
        assert [r.offset for r in drain(consumer)] == [2, 5, 9]
        consumer.seek(TopicPartition("t", 0), 3)
        assert [r.offset for r in drain(consumer)] == [5, 9]


def test_retention_moves_log_start_and_resets_positions(one_log_store: kstore.Store) -> None:
    store = one_log_store
    store.create_topic("t")
    produce(store, "t", 5)
    produce(store, "t", 5, start=5)
    part = store.partition("t", 0)
    first = part.state().segments[0]

    def retain(s: kstore.PartitionState) -> list[dict[str, Any]]:
        return [
            {"remove": {"path": first.path, "deletionTimestamp": int(time.time() * 1000)}},
            {"logStart": {"offset": first.last_offset + 1}},
        ]

    part.commit_actions(retain, operation="RETENTION")
    store.create_topic("other")
    tp = TopicPartition("t", 0)
    group = kstore.groups.Group(store, "g")
    group.commit_offsets(
        {tp: OffsetAndMetadata(1, "before retention")}, member_id=None, generation=-1
    )
    with Consumer(store=store, group_id="g", auto_offset_reset="earliest") as consumer:
        consumer.assign([tp])
        assert [int(r.value) for r in drain(consumer)] == list(range(first.last_offset + 1, 10))
    with Consumer(
        store=store, group_id="g", auto_offset_reset="none", enable_auto_commit=False
    ) as consumer:
        consumer.assign([tp])
        consumer.seek(tp, 0)
        with pytest.raises(OffsetOutOfRangeError, match="outside the live range"):
            consumer.poll(timeout_ms=10)


def test_commit_committed_and_restart_resume(store: kstore.Store) -> None:
    store.create_topic("t", partitions=2)
    produce(store, "t", 200)
    with Consumer(
        "t",
        store=store,
        group_id="g",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=30,
    ) as consumer:
        got = consumer.poll(timeout_ms=1_000)
        first = [r for rs in got.values() for r in rs]
        consumer.commit()
        for tp in got:
            assert consumer.committed(tp) == consumer.position(tp)
        tp = next(iter(got))
        consumer.commit({tp: OffsetAndMetadata(consumer.position(tp), "checkpoint-7")})
        assert consumer.committed(tp, metadata=True) == OffsetAndMetadata(
            consumer.position(tp), "checkpoint-7"
        )
        committed = {tp.partition: consumer.position(tp) for tp in consumer.assignment()}
    with Consumer("t", store=store, group_id="g", auto_offset_reset="earliest") as consumer:
        rest = drain(consumer)
    values = sorted(int(r.value) for r in first + rest)
    assert values == list(range(200))  # resumed exactly where the commit left off
    # ... partition by partition: each resumes at its own committed offset.
    resumed: dict[int, int] = {}
    for r in rest:
        resumed.setdefault(r.partition, r.offset)
    assert resumed == {p: at for p, at in committed.items() if p in resumed}
    assert set(committed) == {0, 1}


def test_auto_commit(one_log_store: kstore.Store) -> None:
    store = one_log_store
    store.create_topic("t")
    produce(store, "t", 50)
    with Consumer(
        "t", store=store, group_id="auto", auto_offset_reset="earliest", auto_commit_interval_ms=1
    ) as consumer:
        drain(consumer)
        consumer.poll(timeout_ms=5)  # the commit happens at the start of a later poll
        assert consumer.committed(TopicPartition("t", 0)) == 50


def test_commit_async_callback(one_log_store: kstore.Store) -> None:
    store = one_log_store
    store.create_topic("t")
    produce(store, "t", 5)
    seen: list[Any] = []
    with Consumer(
        "t", store=store, group_id="ga", auto_offset_reset="earliest", enable_auto_commit=False
    ) as consumer:
        drain(consumer)
        consumer.commit_async(callback=lambda offsets, exc: seen.append((offsets, exc))).result(
            timeout=30
        )
    assert seen
    assert seen[0][1] is None
    assert seen[0][0][TopicPartition("t", 0)].offset == 5


def test_pattern_subscription(one_log_store: kstore.Store) -> None:
    store = one_log_store
    for name in ("logs-a", "logs-b", "metrics"):
        store.create_topic(name)
        produce(store, name, 3)
    with Consumer(store=store, auto_offset_reset="earliest") as consumer:
        consumer.subscribe(pattern=r"logs-.*")
        assert consumer.subscription() == {"logs-a", "logs-b"}
        assert {r.topic for r in drain(consumer)} == {"logs-a", "logs-b"}


def test_iteration_stops_after_consumer_timeout(one_log_store: kstore.Store) -> None:
    store = one_log_store
    store.create_topic("t")
    produce(store, "t", 7)
    consumer = Consumer("t", store=store, auto_offset_reset="earliest", consumer_timeout_ms=200)
    assert len(list(consumer)) == 7
    consumer.close()
    with pytest.raises(IllegalStateError, match="closed"):
        consumer.poll()


def test_bad_input(memory_store: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(memory_store[0])
    store.create_topic("t")
    with pytest.raises(InvalidConfigurationError, match="auto_offset_reset"):
        Consumer("t", store=store, auto_offset_reset="middle")
    with pytest.raises(InvalidConfigurationError, match="unknown consumer config"):
        Consumer("t", store=store, max_poll_record=5)
    with pytest.raises(InvalidConfigurationError, match="heartbeat"):
        Consumer("t", store=store, session_timeout_ms=100, heartbeat_interval_ms=500)
    with pytest.raises(InvalidConfigurationError, match="assignment strategy"):
        Consumer("t", store=store, partition_assignment_strategy=["best"])
    with pytest.raises(InvalidGroupIdError):
        Consumer("t", store=store, group_id="../g")
    with pytest.raises(UnknownTopicOrPartitionError):
        Consumer("missing", store=store)
    consumer = Consumer(store=store)
    with pytest.raises(IllegalStateError, match="not subscribed"):
        consumer.poll()
    with pytest.raises(IllegalStateError):
        consumer.subscribe(["t"], pattern="t")
    with pytest.raises(UnknownTopicOrPartitionError):
        consumer.assign([TopicPartition("t", 3)])
    with pytest.raises(IllegalStateError, match="group_id"):
        consumer.commit()
    with pytest.raises(ValueError, match="timestamp"):
        consumer.offsets_for_times({TopicPartition("t", 0): -1})
    with pytest.raises(kstore.StoreNotFoundError):
        Consumer("t", store="memory://no-such-store-here")
