"""The transaction manager on its own (kstore/transaction_manager.py): the producer's identity,
its sequences and epochs, and Kafka's transaction calls over a real producer log, with records
appended by hand where the producer's sender would append them."""

from __future__ import annotations

import time

import pytest

import kstore
from kstore.accumulator import Batch, build_table
from kstore.errors import (
    IllegalStateError,
    InvalidGroupIdError,
    ProducerFencedError,
    StorageError,
)
from kstore.layout import producer_log_dir
from kstore.manifest import ProducerBatch
from kstore.records import TopicPartition
from kstore.segments import BINARY
from kstore.transaction_manager import TransactionManager
from kstore.transactions import producer_log


@pytest.fixture(params=["memory_store", "local_store"])
def store(request: pytest.FixtureRequest) -> kstore.Store:
    url, options = request.getfixturevalue(request.param)
    return kstore.Store(url, options)


def _append(
    store: kstore.Store,
    topic: str,
    p: int,
    values: list[bytes],
    producer: ProducerBatch | None,
    transaction: str | None = None,
) -> int:
    """Append ``values`` to ``topic``-``p`` as the sender would; returns the base offset."""
    batch = Batch(topic, time.monotonic())
    for value in values:
        batch.add_key(None)
        batch.add_value(value)
        batch.add_timestamp(time.time())
    part = store.partition(topic, p)
    segment = part.write_segment(build_table(batch, BINARY), durable=False)
    result = part.commit_segments(
        [segment], durable=False, producer=producer, transaction=transaction
    )
    return result.base_offset


def _committed_values(store: kstore.Store, topic: str, p: int) -> list[bytes]:
    part = store.partition(topic, p)
    return [
        value
        for batch in part.read(0, committed_only=True)
        for value in batch.column("value").to_pylist()
    ]


def test_an_idempotent_identity_hands_out_sequences_that_follow_what_landed(
    store: kstore.Store,
) -> None:
    store.create_topic("t", 2)
    manager = TransactionManager(store, idempotent=True)
    assert len(manager.producer_id) == 32
    assert manager.epoch == 0
    first = manager.producer_batches("t", {0: 3, 1: 2})
    assert [(b.epoch, b.first_sequence, b.last_sequence) for b in first.values()] == [
        (0, 0, 2),
        (0, 0, 1),
    ]
    for p, batch in first.items():
        _append(store, "t", p, [b"v"] * (batch.last_sequence + 1), batch)
        manager.landed("t", p, batch)
    # Not landed: the same sequences again (a retry is recognised as the same batch).
    assert manager.producer_batches("t", {0: 1})[0].first_sequence == 3
    assert manager.producer_batches("t", {0: 1})[0].first_sequence == 3
    # The log takes the next batch, and its retry as a duplicate (its offsets, no new ones).
    following = manager.producer_batches("t", {0: 1})[0]
    assert _append(store, "t", 0, [b"w"], following) == 3
    assert _append(store, "t", 0, [b"w"], following) == 3
    assert store.partition("t", 0).state().end_offset == 4


def test_a_failed_write_starts_a_new_epoch_and_restarts_sequences(store: kstore.Store) -> None:
    """The failed write may have landed: a later batch must not reuse its sequences (KIP-360).
    A batch that started in the old epoch and lands after the bump does not move the new
    epoch's sequences."""
    store.create_topic("t", 1)
    manager = TransactionManager(store, idempotent=True)
    old = manager.producer_batches("t", {0: 5})[0]
    manager.landed("t", 0, old)
    in_flight = manager.producer_batches("t", {0: 2})[0]
    manager.on_write_failure(StorageError("lost"))
    assert manager.epoch == 1
    fresh = manager.producer_batches("t", {0: 4})[0]
    assert (fresh.epoch, fresh.first_sequence, fresh.last_sequence) == (1, 0, 3)
    manager.landed("t", 0, in_flight)  # of epoch 0: ignored
    assert manager.producer_batches("t", {0: 1})[0].first_sequence == 0


def test_a_producer_that_is_not_idempotent_carries_no_batches_and_keeps_its_epoch(
    store: kstore.Store,
) -> None:
    manager = TransactionManager(store, idempotent=False)
    assert manager.producer_batches("t", {0: 3}) == {}
    manager.on_write_failure(StorageError("lost"))
    assert manager.epoch == 0
    assert manager.add_partitions("t", [0]) is None  # no transaction tag outside them
    assert not manager.in_transaction


def test_a_new_instance_fences_the_old_one(store: kstore.Store) -> None:
    fenced: list[ProducerFencedError] = []
    old = TransactionManager(store, transactional_id="tx", on_fenced=fenced.append)
    assert old.idempotent  # always, with a transactional id
    old.check_not_fenced()
    new = TransactionManager(store, transactional_id="tx")
    assert new.producer_id == old.producer_id
    assert new.epoch == old.epoch + 1
    with pytest.raises(
        ProducerFencedError, match=f"fenced by a newer instance \\(epoch {new.epoch}"
    ):
        old.check_not_fenced()
    assert len(fenced) == 1
    # A write of the old instance refused as fenced is fatal too, and bumps no epoch.
    old.on_write_failure(fenced[0])
    assert len(fenced) == 2
    assert old.epoch == new.epoch - 1
    new.check_not_fenced()


def test_a_transaction_records_its_partitions_and_commits_its_records(
    store: kstore.Store,
) -> None:
    store.create_topic("t", 2)
    manager = TransactionManager(store, transactional_id="tx")
    registry = producer_log(store.storage, producer_log_dir("tx"))
    with pytest.raises(IllegalStateError, match="outside a transaction"):
        manager.add_partitions("t", [0])
    manager.begin()
    assert manager.in_transaction
    with pytest.raises(IllegalStateError, match="already in progress"):
        manager.begin()
    tag = manager.add_partitions("t", [0, 1])
    assert tag == f"{manager.producer_id}:0"
    current = registry.load().current
    assert current is not None
    assert current.partitions == {TopicPartition("t", 0), TopicPartition("t", 1)}
    version = registry.load().version
    assert manager.add_partitions("t", [1]) == tag  # known already: nothing recorded
    assert registry.load().version == version
    batches = manager.producer_batches("t", {0: 2, 1: 1})
    for p, batch in batches.items():
        _append(store, "t", p, [b"in-txn"] * (batch.last_sequence + 1), batch, tag)
        manager.landed("t", p, batch)
    for p in (0, 1):
        state = store.partition("t", p).state()
        assert state.open_transactions
        assert state.last_stable_offset == 0
    manager.prepare_commit()
    manager.commit()
    assert not manager.in_transaction
    assert registry.load().current is None
    for p, end in ((0, 2), (1, 1)):
        state = store.partition("t", p).state()
        assert not state.open_transactions
        assert state.end_offset == end  # a marker takes no offset
        assert state.last_stable_offset == state.end_offset
        assert _committed_values(store, "t", p) == [b"in-txn"] * end
    with pytest.raises(IllegalStateError, match="no transaction in progress"):
        manager.prepare_commit()


def test_a_transaction_with_a_failed_record_cannot_commit_and_aborts(
    store: kstore.Store,
) -> None:
    store.create_topic("t", 1)
    manager = TransactionManager(store, transactional_id="tx")
    manager.begin()
    tag = manager.add_partitions("t", [0])
    batch = manager.producer_batches("t", {0: 1})[0]
    _append(store, "t", 0, [b"doomed"], batch, tag)
    manager.on_write_failure(StorageError("a later write failed"))
    assert manager.epoch == 0  # transactional: no epoch bump, the transaction aborts
    manager.prepare_commit()
    with pytest.raises(IllegalStateError, match="cannot commit: a record failed"):
        manager.commit()
    manager.prepare_abort()
    manager.abort()
    state = store.partition("t", 0).state()
    assert not state.open_transactions
    assert state.last_stable_offset == state.end_offset
    assert _committed_values(store, "t", 0) == []


def test_offsets_are_checked_before_the_group_is_recorded(store: kstore.Store) -> None:
    manager = TransactionManager(store, transactional_id="tx")
    registry = producer_log(store.storage, producer_log_dir("tx"))
    manager.begin()
    version = registry.load().version
    with pytest.raises(InvalidGroupIdError):
        manager.send_offsets({TopicPartition("t", 0): 1}, 42)  # type: ignore[arg-type]
    with pytest.raises(InvalidGroupIdError):
        manager.send_offsets({TopicPartition("t", 0): 1}, "")
    assert registry.load().version == version
    manager.send_offsets({TopicPartition("t", 0): 1}, "g")
    current = registry.load().current
    assert current is not None
    assert current.group == "g"
    with pytest.raises(IllegalStateError, match="one consumer group"):
        manager.send_offsets({TopicPartition("t", 0): 2}, "other")
