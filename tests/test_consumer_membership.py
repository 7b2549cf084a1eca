"""A consumer's group membership on its own, over a real store: joining, rebalances with the
listener's callbacks, hand-over of a partition, commits by a member, by a manual assignment,
and by a member the group expelled."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import kstore
from kstore.consumer.membership import GroupMembership
from kstore.consumer.subscription import SubscriptionState
from kstore.errors import CommitFailedError
from kstore.groups import Group
from kstore.records import OffsetAndMetadata, TopicPartition

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


class Events:
    """A rebalance listener that records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, set[TopicPartition]]] = []

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.calls.append(("revoked", set(revoked)))

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.calls.append(("assigned", set(assigned)))

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self.calls.append(("lost", set(lost)))


class Member:
    """A subscription state and its membership of group ``g``, as a consumer builds them."""

    def __init__(self, store: kstore.Store, name: str, *, auto_commit: bool = False) -> None:
        self.events = Events()
        self.subscription = SubscriptionState(store, lambda: None)
        self.membership = GroupMembership(
            Group(store, "g"),
            self.subscription,
            client_id=name,
            instance_id=None,
            assignors=["range"],
            # Long: no session expires and the heartbeat thread stays out of the way.
            session_timeout_ms=60_000,
            heartbeat_interval_ms=20_000,
            max_poll_interval_ms=300_000,
            metadata_max_age_ms=300_000,
            auto_commit=auto_commit,
            auto_commit_interval_ms=5_000,
        )

    def join(self) -> None:
        self.subscription.subscribe(["t"], listener=self.events)
        self.membership.join()

    def close(self) -> None:
        self.membership.close(autocommit=False)


@pytest.fixture
def store(memory_store: tuple[str, dict[str, Any]]) -> Iterator[kstore.Store]:
    store = kstore.Store(*memory_store)
    store.create_topic("t", partitions=2)
    return store


def test_a_lone_member_joins_with_every_partition_and_leaves(store: kstore.Store) -> None:
    a = Member(store, "a")
    a.join()
    try:
        assert a.membership.member_id is not None
        assert a.membership.member_id.startswith("a-")
        assert a.membership.generation >= 0
        assert a.subscription.assigned == [T0, T1]
        assert a.events.calls == [("assigned", {T0, T1})]
        assert all(a.membership.owns(tp) for tp in (T0, T1))
        assert a.membership.metrics()["rebalance-total"] == 1
    finally:
        a.close()
    assert a.membership.member_id is None
    assert Group(store, "g").state().members == {}


def test_a_partition_moves_only_once_its_owner_released_it(store: kstore.Store) -> None:
    a, b = Member(store, "a", auto_commit=True), Member(store, "b")
    a.join()
    try:
        a.subscription.set_position(T0, 4)
        a.subscription.set_position(T1, 7)
        b.join()
        try:
            (moved,) = b.subscription.assigned  # range: one partition each
            (kept,) = {T0, T1} - {moved}
            assert not b.membership.owns(moved)  # a has not handed it over yet
            a.membership.refresh(force=True)
            assert a.subscription.assigned == [kept]
            assert a.events.calls[-1] == ("revoked", {moved})
            # The release committed a's final position of the moved partition.
            committed = a.membership.committed(moved)
            assert committed == OffsetAndMetadata(4 if moved == T0 else 7)
            b.membership.refresh(force=True)
            assert b.membership.owns(moved)
            assert not a.membership.owns(moved)
        finally:
            b.close()
    finally:
        a.close()


def test_a_member_commits_what_it_owns(store: kstore.Store) -> None:
    a = Member(store, "a")
    a.join()
    try:
        a.subscription.set_position(T0, 3)
        a.membership.commit()  # the positions of the assigned partitions
        assert a.membership.committed_offset(T0) == 3
        assert a.membership.committed_offset(T1) is None
        a.membership.commit({T1: 5})
        assert a.membership.committed(T1) == OffsetAndMetadata(5)
        with pytest.raises(CommitFailedError, match="does not own"):
            a.membership.commit({TopicPartition("t", 9): 1})
        with pytest.raises(ValueError, match="offset"):
            a.membership.commit({T0: -1})
        assert a.membership.metrics()["commit-total"] == 2
    finally:
        a.close()


def test_an_expelled_member_cannot_commit_and_loses_its_partitions(store: kstore.Store) -> None:
    a = Member(store, "a")
    a.join()
    try:
        a.membership.stop_heartbeat()  # it stalls: its session expires
        expelled = a.membership.member_id
        assert expelled is not None
        Group(store, "g").leave(expelled, "session expired")  # as a heartbeat finds it
        a.subscription.set_position(T0, 1)
        with pytest.raises(CommitFailedError):
            a.membership.commit()
        assert a.membership.committed_offset(T0) is None
        # Its next poll finds it out of the group: the partitions are lost (not revoked:
        # nothing could be committed for them), and it joins again as a new member.
        a.membership.refresh()
        assert ("lost", {T0, T1}) in a.events.calls
        assert not any(kind == "revoked" for kind, _ in a.events.calls)
        assert a.membership.member_id not in (None, expelled)
        assert a.subscription.assigned == [T0, T1]
        assert dict(a.subscription.positions) == {}  # the lost positions are not kept
    finally:
        a.close()


def test_a_member_that_left_must_rejoin_to_commit(store: kstore.Store) -> None:
    a = Member(store, "a")
    a.join()
    a.subscription.set_position(T0, 2)
    a.membership.stop_heartbeat()
    a.membership.leave()
    with pytest.raises(CommitFailedError, match="not a member"):
        a.membership.commit()
    assert Group(store, "g").state().members == {}


def test_a_manual_assignment_commits_outside_the_generations(store: kstore.Store) -> None:
    subscription = SubscriptionState(store, lambda: None)
    membership = GroupMembership(
        Group(store, "g"),
        subscription,
        client_id="m",
        instance_id=None,
        assignors=["range"],
        session_timeout_ms=60_000,
        heartbeat_interval_ms=20_000,
        max_poll_interval_ms=300_000,
        metadata_max_age_ms=300_000,
        auto_commit=False,
        auto_commit_interval_ms=5_000,
    )
    subscription.assign([T1])
    subscription.set_position(T1, 6)
    membership.refresh()  # no group assignment to apply: it reads what it was given
    assert membership.owns(T1)
    membership.commit()
    assert membership.committed_offset(T1) == 6
    assert membership.member_id is None
    # A live member's partitions are not a manual consumer's to commit.
    a = Member(store, "a")
    a.join()
    try:
        with pytest.raises(CommitFailedError, match="live member"):
            membership.commit({T1: 7})
    finally:
        a.close()
