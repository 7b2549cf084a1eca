"""The consumer's subscription state on its own: subscriptions and patterns, manual
assignment, positions, seeks and pauses, and what it announces when what a fetch reads
changes."""

from __future__ import annotations

from typing import Any

import pytest

import kstore
from kstore.consumer.subscription import SubscriptionState
from kstore.errors import IllegalStateError, InvalidTopicError, UnknownTopicOrPartitionError
from kstore.records import OffsetAndMetadata, TopicPartition

T0, T1, U0 = TopicPartition("t", 0), TopicPartition("t", 1), TopicPartition("u", 0)


class Changes:
    """Counts the subscription's announcements."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


@pytest.fixture
def store(memory_store: tuple[str, dict[str, Any]]) -> kstore.Store:
    store = kstore.Store(*memory_store)
    store.create_topic("t", partitions=2)
    store.create_topic("u", partitions=1)
    store.create_topic("other", partitions=3)
    return store


def test_a_subscription_to_topics_names_every_partition_of_them(store: kstore.Store) -> None:
    state = SubscriptionState(store, Changes())
    assert not state.active
    state.subscribe(["u", "t"])
    assert state.active
    assert not state.manual
    assert state.topics == {"t", "u"}
    assert state.subscribed_partitions() == [T0, T1, U0]
    assert state.assigned == []  # the assignment is set apart (by a group, or the consumer)


def test_a_pattern_subscribes_to_the_topics_it_matches_and_follows_new_ones(
    store: kstore.Store,
) -> None:
    state = SubscriptionState(store, Changes())
    state.subscribe(pattern="t|u|v")
    assert state.topics == {"t", "u"}
    store.create_topic("v")
    assert state.topics == {"t", "u"}  # until the subscription follows the pattern
    assert state.matching_topics() == {"t", "u", "v"}
    state.follow_pattern()
    assert state.topics == {"t", "u", "v"}


def test_subscribe_needs_topics_or_a_pattern_and_valid_names(store: kstore.Store) -> None:
    state = SubscriptionState(store, Changes())
    with pytest.raises(IllegalStateError, match="either topics or a pattern"):
        state.subscribe()
    with pytest.raises(IllegalStateError, match="either topics or a pattern"):
        state.subscribe(["t"], pattern="t")
    with pytest.raises(InvalidTopicError):
        state.subscribe(["bad/name"])
    assert not state.active


def test_assignment_is_checked_and_excludes_a_subscription(store: kstore.Store) -> None:
    state = SubscriptionState(store, Changes())
    with pytest.raises(UnknownTopicOrPartitionError):
        state.assign([TopicPartition("t", 2)])  # t has two partitions
    with pytest.raises(UnknownTopicOrPartitionError):
        state.assign([TopicPartition("missing", 0)])
    with pytest.raises(TypeError, match="TopicPartition"):
        state.assign(["t"])  # type: ignore[list-item]
    assert not state.active
    state.assign([T1, ("t", 0)])  # type: ignore[list-item]  # plain tuples are taken
    assert state.manual
    assert state.assigned == [T0, T1]
    with pytest.raises(IllegalStateError, match="after assign"):
        state.subscribe(["t"])
    state.unsubscribe()
    assert not state.active
    assert state.assigned == []
    state.subscribe(["t"])
    with pytest.raises(IllegalStateError, match="after subscribe"):
        state.assign([T0])


def test_a_new_assignment_drops_the_positions_and_pauses_of_partitions_it_leaves_out(
    store: kstore.Store,
) -> None:
    changes = Changes()
    state = SubscriptionState(store, changes)
    state.assign([T0, T1, U0])
    before = state.assigned
    assert changes.count == 1
    for tp, offset in ((T0, 5), (T1, 7), (U0, 9)):
        state.set_position(tp, offset)
    state.pause(T1, U0)
    state.set_assignment([U0, T0])
    assert changes.count == 2
    assert state.assigned == [T0, U0]
    assert state.assigned is not before
    assert dict(state.positions) == {T0: 5, U0: 9}
    assert set(state.paused) == {U0}
    assert state.offsets_to_commit() == {T0: OffsetAndMetadata(5), U0: OffsetAndMetadata(9)}


def test_seek_sets_a_position_of_an_assigned_partition_only(store: kstore.Store) -> None:
    changes = Changes()
    state = SubscriptionState(store, changes)
    state.assign([T0])
    state.seek(T0, 3)
    assert dict(state.positions) == {T0: 3}
    assert changes.count == 2  # the assignment, the seek
    with pytest.raises(IllegalStateError, match="not assigned"):
        state.seek(T1, 0)
    for bad in (-1, True, 1.5, "2"):
        with pytest.raises(ValueError, match="non-negative integer"):
            state.seek(T0, bad)  # type: ignore[arg-type]
    assert dict(state.positions) == {T0: 3}
    assert changes.count == 2


def test_pause_and_resume(store: kstore.Store) -> None:
    changes = Changes()
    state = SubscriptionState(store, changes)
    state.assign([T0, T1])
    with pytest.raises(IllegalStateError, match="not assigned"):
        state.pause(U0)
    state.pause(T0)
    assert set(state.paused) == {T0}
    assert changes.count == 1  # a pause reads less: nothing to look at again
    state.resume(T0, U0)  # resuming a partition not paused is no error
    assert set(state.paused) == set()
    assert changes.count == 2


def test_positions_put_back_are_the_ones_copied(store: kstore.Store) -> None:
    state = SubscriptionState(store, Changes())
    state.assign([T0, T1])
    state.set_position(T0, 4)
    saved = dict(state.positions)
    state.set_position(T0, 10)
    state.set_position(T1, 2)
    state.forget_position(T1)
    state.forget_position(T1)  # already gone: no error
    assert dict(state.positions) == {T0: 10}
    state.restore_positions(saved)
    assert dict(state.positions) == {T0: 4}
