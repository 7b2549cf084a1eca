"""The consumer's fetcher on its own, over a real store: reading from positions (set from the
group's committed offsets or auto_offset_reset), the fetch buffer, pauses, isolation levels,
and both layouts."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

import kstore
from kstore.consumer.fetcher import Fetcher, NoGroup
from kstore.consumer.membership import GroupMembership
from kstore.consumer.pacing import Pacer
from kstore.consumer.subscription import SubscriptionState
from kstore.errors import OffsetOutOfRangeError, UnknownTopicOrPartitionError
from kstore.groups import Group
from kstore.producer import Producer
from kstore.records import OffsetAndMetadata, TopicPartition
from tests import layout2

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


class Reader:
    """A subscription state and a fetcher wired as the consumer wires them."""

    def __init__(self, store: kstore.Store, group: Any = None, **options: Any) -> None:
        self.pacer = Pacer(remote=store.storage.is_remote, max_wait_ms=100)
        self.subscription = SubscriptionState(store, self.changed)
        settings: dict[str, Any] = {
            "auto_offset_reset": "earliest",
            "read_committed": False,
            "fetch_max_bytes": 52_428_800,
            "max_partition_fetch_bytes": 1_048_576,
            **options,
        }
        self.fetcher = Fetcher(store, self.subscription, group or NoGroup(), self.pacer, **settings)

    def changed(self) -> None:
        self.fetcher.retain_assigned()
        self.pacer.look_soon()

    def values(self, max_records: int = 500) -> dict[TopicPartition, list[bytes]]:
        return {
            tp: [v for b in batches for v in b.column("value").to_pylist()]
            for tp, batches in self.fetcher.fetch(max_records).items()
        }


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest) -> kstore.Store:
    url, options = request.getfixturevalue(f"{request.param}_store")
    return kstore.Store(url, options)


def produce(store: kstore.Store, partition: int, values: list[bytes]) -> None:
    with Producer(store, linger_ms=0) as producer:
        for value in values:
            producer.send("t", value, partition=partition)


def write(store: kstore.Store, partition: int, values: list[bytes]) -> None:
    """Records into a topic of either layout: a producer writes layout 3, the test builder
    layout 2 (no producer writes it any more)."""
    if store.topic("t").layout == 2:
        layout2.append(store, "t", partition, layout2.records(list(values)))
    else:
        produce(store, partition, values)


@pytest.mark.parametrize("layout", [2, 3])
def test_a_fetch_reads_every_assigned_partition_from_its_position(
    store: kstore.Store, layout: int
) -> None:
    if layout == 2:
        layout2.create_topic(store, "t", partitions=2)
    else:
        store.create_topic("t", partitions=2)
    write(store, 0, [b"a", b"b", b"c"])
    write(store, 1, [b"x"])
    reader = Reader(store)
    reader.subscription.assign([T0, T1])
    reader.subscription.seek(T0, 1)
    assert reader.values() == {T0: [b"b", b"c"], T1: [b"x"]}
    assert dict(reader.subscription.positions) == {T0: 3, T1: 1}
    assert reader.values() == {}  # caught up
    write(store, 1, [b"y"])
    assert reader.values() == {T1: [b"y"]}
    assert reader.fetcher.metrics()["records-consumed-total"] == 4


def test_polls_capped_by_max_records_drain_what_one_fetch_read(store: kstore.Store) -> None:
    store.create_topic("t", partitions=1)
    produce(store, 0, [b"%d" % i for i in range(5)])
    reader = Reader(store)
    reader.subscription.assign([T0])
    assert reader.values(2) == {T0: [b"0", b"1"]}
    assert reader.fetcher.has_buffered()
    produce(store, 0, [b"5"])  # not read until the buffer is drained
    assert reader.values(2) == {T0: [b"2", b"3"]}
    assert reader.values(2) == {T0: [b"4"]}
    assert not reader.fetcher.has_buffered()
    assert reader.values(2) == {T0: [b"5"]}


def test_a_seek_drops_the_buffered_run_and_a_pause_keeps_it(store: kstore.Store) -> None:
    store.create_topic("t", partitions=2)
    produce(store, 0, [b"a", b"b", b"c"])
    produce(store, 1, [b"x", b"y"])
    reader = Reader(store)
    reader.subscription.assign([T0, T1])
    assert reader.values(1) == {T0: [b"a"]}  # the fetch read both: b, c, x, y buffered
    reader.subscription.pause(T1)
    reader.subscription.seek(T0, 0)
    assert reader.values() == {T0: [b"a", b"b", b"c"]}  # read again from the seek
    reader.subscription.resume(T1)
    assert reader.values() == {T1: [b"x", b"y"]}  # the run the pause kept
    assert reader.fetcher.metrics()["records-consumed-total"] == 6


def test_a_partition_unassigned_and_assigned_again_is_read_from_its_new_position(
    store: kstore.Store,
) -> None:
    store.create_topic("t", partitions=1)
    produce(store, 0, [b"a", b"b", b"c"])
    reader = Reader(store)
    reader.subscription.assign([T0])
    assert reader.values(1) == {T0: [b"a"]}  # b and c buffered
    reader.subscription.set_assignment([])
    reader.subscription.set_assignment([T0])
    reader.subscription.seek(T0, 2)
    assert reader.values() == {T0: [b"c"]}


def test_positions_come_from_auto_offset_reset_without_a_committed_offset(
    store: kstore.Store,
) -> None:
    store.create_topic("t", partitions=1)
    produce(store, 0, [b"a", b"b"])
    latest = Reader(store, auto_offset_reset="latest")
    latest.subscription.assign([T0])
    assert latest.values() == {}
    assert latest.fetcher.position(T0) == 2
    produce(store, 0, [b"c"])
    assert latest.values() == {T0: [b"c"]}
    none = Reader(store, auto_offset_reset="none")
    none.subscription.assign([T0])
    with pytest.raises(OffsetOutOfRangeError, match="no committed offset"):
        none.values()
    none.subscription.seek(T0, 99)  # beyond the end: out of the live range
    with pytest.raises(OffsetOutOfRangeError, match="outside the live range"):
        none.values()
    earliest = Reader(store)
    earliest.subscription.assign([T0])
    earliest.subscription.seek(T0, 99)
    assert earliest.values() == {T0: [b"a", b"b", b"c"]}  # reset to the start


def test_a_committed_offset_is_where_reading_starts(store: kstore.Store) -> None:
    store.create_topic("t", partitions=1)
    produce(store, 0, [b"a", b"b", b"c"])
    Group(store, "g").commit_offsets({T0: OffsetAndMetadata(2)}, member_id=None, generation=-1)
    subscription = SubscriptionState(store, lambda: None)
    membership = GroupMembership(
        Group(store, "g"),
        subscription,
        client_id="c",
        instance_id=None,
        assignors=["range"],
        session_timeout_ms=10_000,
        heartbeat_interval_ms=1_000,
        max_poll_interval_ms=300_000,
        metadata_max_age_ms=300_000,
        auto_commit=False,
        auto_commit_interval_ms=5_000,
    )
    fetcher = Fetcher(
        store,
        subscription,
        membership,
        Pacer(remote=False, max_wait_ms=100),
        auto_offset_reset="earliest",
        read_committed=False,
        fetch_max_bytes=1 << 20,
        max_partition_fetch_bytes=1 << 20,
    )
    subscription.assign([T0])
    got = fetcher.fetch(10)
    assert [b.column("value").to_pylist() for b in got[T0]] == [[b"c"]]


def test_read_committed_hides_an_open_transaction(store: kstore.Store) -> None:
    store.create_topic("t", partitions=1)
    produce(store, 0, [b"before"])
    producer = Producer(store, transactional_id="tx")
    try:
        producer.begin_transaction()
        producer.send("t", b"open", partition=0)
        producer.flush()
        committed = Reader(store, read_committed=True)
        uncommitted = Reader(store)
        for reader in (committed, uncommitted):
            reader.subscription.assign([T0])
        assert committed.values() == {T0: [b"before"]}
        assert uncommitted.values() == {T0: [b"before", b"open"]}
        assert committed.values() == {}
        producer.commit_transaction()
        assert committed.values() == {T0: [b"open"]}
    finally:
        producer.close()


def test_unknown_partitions_are_refused(store: kstore.Store) -> None:
    store.create_topic("t", partitions=1)
    reader = Reader(store)
    with pytest.raises(UnknownTopicOrPartitionError):
        reader.fetcher.position(TopicPartition("t", 1))
    with pytest.raises(UnknownTopicOrPartitionError):
        reader.fetcher.end_offset(TopicPartition("missing", 0))


def test_offsets_for_a_time_are_the_first_at_or_after_it(store: kstore.Store) -> None:
    store.create_topic("t", partitions=1)
    with Producer(store, linger_ms=0) as producer:
        for i, ts in enumerate((1_000, 2_000, 3_000)):
            producer.send("t", b"%d" % i, partition=0, timestamp_ms=ts)
    reader = Reader(store)
    found = reader.fetcher.offset_for_time(T0, 1_500)
    assert found is not None
    assert (found.offset, found.timestamp) == (1, 2_000)
    assert reader.fetcher.offset_for_time(T0, 9_999) is None
    assert (reader.fetcher.start_offset(T0), reader.fetcher.end_offset(T0)) == (0, 3)


def test_fetched_batches_carry_the_read_schema(store: kstore.Store) -> None:
    store.create_topic("t", partitions=1)
    produce(store, 0, [b"a"])
    reader = Reader(store)
    reader.subscription.assign([T0])
    (batch,) = reader.fetcher.fetch(10)[T0]
    assert batch.schema.names == ["key", "value", "timestamp", "headers", "offset"]
    assert batch.column("offset").type == pa.int64()
