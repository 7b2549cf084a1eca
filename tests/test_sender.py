"""The sender on its own (kstore/sender.py), built from a real accumulator, transaction manager
and topic metadata on a memory or local store: its deliveries, offsets, retries, epoch bumps,
failures and stop. Records are added to the accumulator as ``send()`` adds them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

import kstore
from kstore.accumulator import FutureRecordMetadata, RecordAccumulator
from kstore.errors import StorageError, UnknownTopicOrPartitionError
from kstore.partitioner import get_partitioner
from kstore.producer_metadata import Backoff, ProducerMetadata, TopicInfo
from kstore.sender import Sender
from kstore.transaction_manager import TransactionManager
from tests.faults import Fault, FaultyStorage

BACKOFF = Backoff(1, 10)


@dataclass
class Parts:
    store: kstore.Store
    accumulator: RecordAccumulator
    transactions: TransactionManager
    metadata: ProducerMetadata
    sender: Sender

    def send(
        self, topic: str, values: list[bytes], partitions: list[int] | None = None
    ) -> list[FutureRecordMetadata]:
        """Add records as send() does (without the fast path), each to the given partition."""
        info = self.metadata.topic(topic)
        futures = []
        with self.accumulator.lock:
            batch = self.accumulator.open.get(topic) or self.accumulator.open_batch(
                topic, 100, info
            )
            for i, value in enumerate(values):
                index = len(batch.values)
                batch.add_key(b"k%d" % i)
                batch.add_value(value)
                batch.add_timestamp(time.time())
                if partitions is not None:
                    batch.partitions[index] = partitions[i]
                batch.nbytes += 70 + len(value)
                futures.append(FutureRecordMetadata((batch, index)))
        return futures

    def deliver(
        self, topic: str, values: list[bytes], partitions: list[int] | None = None
    ) -> list[FutureRecordMetadata]:
        futures = self.send(topic, values, partitions)
        for batch in self.accumulator.flush():
            assert batch.done.wait(30)
        return futures


def _build(
    store: kstore.Store,
    *,
    transactional_id: str | None = None,
    acks: int | str = 1,
    retries: int = 5,
    topic_info: Callable[[str], TopicInfo] | None = None,
) -> Parts:
    accumulator = RecordAccumulator(batch_size=1 << 20, buffer_memory=1 << 24, max_block_ms=10_000)
    transactions = TransactionManager(
        store, transactional_id=transactional_id, on_fenced=accumulator.fail
    )
    metadata = ProducerMetadata(
        store,
        max_age_ms=300_000,
        max_block_ms=10_000,
        max_request_size=1 << 20,
        compression=None,
        backoff=BACKOFF,
        client_id="unit",
    )
    sender = Sender(
        store,
        accumulator,
        transactions,
        topic_info or metadata.topic,
        partitioner=get_partitioner("murmur2"),
        backoff=BACKOFF,
        max_in_flight=2,
        client_id="unit",
        acks=acks,
        linger_ms=60_000,
        retries=retries,
    )
    sender.start()
    return Parts(store, accumulator, transactions, metadata, sender)


@pytest.fixture(params=["memory_store", "local_store"])
def url(request: pytest.FixtureRequest) -> tuple[str, dict[str, object]]:
    value: tuple[str, dict[str, object]] = request.getfixturevalue(request.param)
    return value


@pytest.fixture
def faulty(url: tuple[str, dict[str, object]]) -> tuple[FaultyStorage, kstore.Store]:
    storage = FaultyStorage(kstore.Storage(url[0], url[1]))
    return storage, kstore.Store.from_storage(storage)


def _stop(parts: Parts) -> None:
    parts.accumulator.close()
    parts.sender.close(30)
    assert not parts.sender.is_alive()


def _values(store: kstore.Store, topic: str, p: int) -> list[bytes]:
    fresh = kstore.Store(store.url, store.storage.storage_options, create=False)
    return [
        value
        for batch in fresh.partition(topic, p).read(0)
        for value in batch.column("value").to_pylist()
    ]


def test_a_delivery_is_one_commit_per_topic_log_with_offsets_in_send_order(
    url: tuple[str, dict[str, object]],
) -> None:
    store = kstore.Store(url[0], url[1])
    store.create_topic("t", 4, config={"commit.logs": 2})
    parts = _build(store)
    try:
        values = [b"v%d" % i for i in range(20)]
        futures = parts.deliver("t", values, [i % 4 for i in range(20)])
        metadata = [f.get(timeout=30) for f in futures]
        assert [(m.partition, m.offset) for m in metadata] == [(i % 4, i // 4) for i in range(20)]
        assert all(m.log_start_offset == 0 for m in metadata)
        for p in range(4):
            assert _values(store, "t", p) == values[p::4]
        metrics = parts.sender.metrics
        assert metrics["commit-total"] == 2  # partitions 0, 2 in log 0; 1, 3 in log 1
        assert metrics["batch-total"] == 1
        assert metrics["record-send-total"] == 20
        # The next delivery continues the offsets and the sequences.
        again = parts.deliver("t", [b"w"], [1])[0].get(timeout=30)
        assert (again.partition, again.offset) == (1, 5)
        producer = store.partition("t", 1).state().producers[parts.transactions.producer_id]
        assert (producer.epoch, producer.last_sequence) == (0, 5)
    finally:
        _stop(parts)


def test_keyed_records_are_placed_by_the_partitioner(url: tuple[str, dict[str, object]]) -> None:
    store = kstore.Store(url[0], url[1])
    store.create_topic("t", 8)
    parts = _build(store)
    try:
        futures = parts.deliver("t", [b"v"] * 16)
        placed = [f.get(timeout=30).partition for f in futures]
        expected = [get_partitioner("murmur2").partition(b"k%d" % i, 8) for i in range(16)]
        assert placed == expected
    finally:
        _stop(parts)


def _is_data_object(path: str) -> bool:
    return "/_data/" in path


# Small records are carried by their commit unless commit.inline.bytes is 0: then each
# delivery writes a data object first, whose failure reaches the sender (a commit's is
# resolved by the log itself where it can be).
DATA_OBJECTS = {"commit.inline.bytes": 0}


def test_a_failed_write_is_retried_with_backoff_and_lands_once(
    faulty: tuple[FaultyStorage, kstore.Store],
) -> None:
    storage, store = faulty
    store.create_topic("t", 1, config=DATA_OBJECTS)
    parts = _build(store, retries=3)
    try:
        storage.add(Fault("put_new", when="before", times=2, match=_is_data_object))
        futures = parts.deliver("t", [b"a", b"b", b"c"])
        assert [f.get(timeout=30).offset for f in futures] == [0, 1, 2]
        assert storage.injected == {"put_new:before": 2}
        assert parts.sender.metrics["record-retry-total"] == 6  # 3 records, twice
        assert _values(store, "t", 0) == [b"a", b"b", b"c"]
        assert parts.transactions.epoch == 0
    finally:
        _stop(parts)


def test_a_failed_write_fails_its_records_and_the_next_write_starts_a_new_epoch(
    faulty: tuple[FaultyStorage, kstore.Store],
) -> None:
    """Out of retries: the records fail, and since a failed write may have landed, the next
    write must not reuse their sequences: a new epoch (KIP-360)."""
    storage, store = faulty
    store.create_topic("t", 1, config=DATA_OBJECTS)
    parts = _build(store, retries=0)
    try:
        storage.add(Fault("put_new", when="before", times=1, match=_is_data_object))
        lost = parts.deliver("t", [b"a", b"b"])
        for future in lost:
            assert isinstance(future.exception, StorageError)
        assert parts.transactions.epoch == 1
        assert parts.sender.is_alive()
        assert parts.sender.metrics["record-error-total"] == 2
        kept = parts.deliver("t", [b"c"])[0].get(timeout=30)
        assert kept.offset == 0
        assert _values(store, "t", 0) == [b"c"]
        entry = store.partition("t", 0).state().producers[parts.transactions.producer_id]
        assert (entry.epoch, entry.last_sequence) == (1, 0)
    finally:
        _stop(parts)


def test_a_topic_whose_metadata_fails_fails_its_records_not_the_sender(
    url: tuple[str, dict[str, object]],
) -> None:
    store = kstore.Store(url[0], url[1])
    store.create_topic("t", 1)
    metadata = ProducerMetadata(
        store,
        max_age_ms=300_000,
        max_block_ms=10_000,
        max_request_size=1 << 20,
        compression=None,
        backoff=BACKOFF,
        client_id="unit",
    )
    gone = iter([UnknownTopicOrPartitionError("topic 't' was deleted")])

    def topic_info(topic: str) -> TopicInfo:
        failure = next(gone, None)
        if failure is not None:
            raise failure
        return metadata.topic(topic)

    parts = _build(store, topic_info=topic_info)
    try:
        lost = parts.deliver("t", [b"a"])[0]
        assert isinstance(lost.exception, UnknownTopicOrPartitionError)
        assert parts.deliver("t", [b"b"])[0].get(timeout=30).offset == 0
        assert _values(store, "t", 0) == [b"b"]
    finally:
        _stop(parts)


def test_acks_0_gives_no_offsets(url: tuple[str, dict[str, object]]) -> None:
    store = kstore.Store(url[0], url[1])
    store.create_topic("t", 1)
    parts = _build(store, acks=0)
    try:
        assert [f.get(timeout=30).offset for f in parts.deliver("t", [b"a", b"b"])] == [-1, -1]
        assert _values(store, "t", 0) == [b"a", b"b"]
    finally:
        _stop(parts)


def test_a_transactions_records_are_tagged_and_visible_once_it_commits(
    url: tuple[str, dict[str, object]],
) -> None:
    store = kstore.Store(url[0], url[1])
    store.create_topic("t", 2)
    parts = _build(store, transactional_id="tx", acks="all")
    try:
        parts.transactions.begin()
        futures = parts.deliver("t", [b"a", b"b"], [0, 1])
        assert [f.get(timeout=30).offset for f in futures] == [0, 0]
        for p in (0, 1):
            state = store.partition("t", p).state()
            assert list(state.open_transactions) == [f"{parts.transactions.producer_id}:0"]
            assert state.last_stable_offset == 0
        parts.transactions.commit()
        for p in (0, 1):
            state = store.partition("t", p).state()
            assert not state.open_transactions
            assert state.last_stable_offset == 1
    finally:
        _stop(parts)


def test_the_sender_stops_once_closed_and_drained(url: tuple[str, dict[str, object]]) -> None:
    store = kstore.Store(url[0], url[1])
    store.create_topic("t", 1)
    parts = _build(store)
    futures = parts.send("t", [b"a"])  # open, not flushed: still delivered by the close
    parts.accumulator.close()
    parts.sender.close(30)
    assert not parts.sender.is_alive()
    assert futures[0].get(timeout=1).offset == 0
