"""Consumer groups without a broker: assignment, liveness, fencing, hand-over, administration."""

from __future__ import annotations

import functools
import itertools
import json
import operator
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

import kstore
from kstore.assignors import range_assign, roundrobin_assign, sticky_assign
from kstore.consumer import Consumer
from kstore.errors import CommitFailedError, IllegalStateError
from kstore.groups import (
    Group,
    Member,
    delete_group,
    describe_group,
    list_groups,
    reset_offsets,
)
from kstore.layout import group_members_dir
from kstore.producer import Producer
from kstore.records import OffsetAndMetadata, TopicPartition
from kstore.storage import FileInfo, Storage
from tests.commit_logs import backend_params, logs_target

BACKENDS = ["memory", "local", "seaweed"]
FAST = {"session_timeout_ms": 2_500, "heartbeat_interval_ms": 200}
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(params=BACKENDS)
def target(request: pytest.FixtureRequest) -> tuple[str, str, dict[str, Any]]:
    url, options = request.getfixturevalue(f"{request.param}_store")
    return request.param, url, options


@pytest.fixture
def store(target: tuple[str, str, dict[str, Any]]) -> kstore.Store:
    return kstore.Store(target[1], target[2])


@pytest.fixture(params=backend_params(BACKENDS))
def logs_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> kstore.Store:
    """Every backend; on the fast ones with commit.logs 1 and 3 (tests/commit_logs.py): for
    the tests that consume a layout-3 topic of several partitions."""
    target = logs_target(request, monkeypatch)
    return kstore.Store(target.url, target.storage_options)


def produce(store: kstore.Store, topic: str, n: int) -> None:
    with Producer(store, linger_ms=1) as producer:
        for i in range(n):
            producer.send(topic, value=b"%d" % i, key=b"k%d" % (i % 37))


def wait_until(condition: Callable[[], bool], timeout: float, poll: Callable[[], object]) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        poll()
        if condition():
            return time.monotonic() - started
        time.sleep(0.02)
    raise AssertionError(f"condition not reached within {timeout} s")


def parts(c: Consumer) -> list[int]:
    return sorted(tp.partition for tp in c.assignment())


def test_three_members_share_six_partitions(store: kstore.Store) -> None:
    store.create_topic("t", partitions=6)
    members = [Consumer("t", store=store, group_id="g", **FAST) for _ in range(3)]
    try:

        def poll_all() -> None:
            for m in members:
                m.poll(timeout_ms=0)

        wait_until(lambda: all(len(parts(m)) == 2 for m in members), 10, poll_all)
        owned = [tp for m in members for tp in m.assignment()]
        assert sorted(owned) == [TopicPartition("t", p) for p in range(6)]
        assert len({m.generation for m in members}) == 1
    finally:
        for m in members:
            m.close()


def test_a_join_that_fails_in_subscribe_is_made_by_the_next_poll(
    store: kstore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A storage error while subscribe() joins (the member's lease PUT failed, or landed and
    its answer was lost) does not fail the constructor: as in Kafka, whose subscribe() never
    reaches the coordinator, the next poll joins and reads. An error that retrying cannot
    mend still raises."""
    from kstore.errors import StorageError

    store.create_topic("t", partitions=2)
    produce(store, "t", 20)
    original = Group.write_lease
    failures = iter([StorageError("lease PUT failed (injected)")])

    def failing_once(self: Group, member_id: str) -> None:
        failure = next(failures, None)
        if failure is not None:
            original(self, member_id)  # it landed; the answer was lost
            raise failure
        original(self, member_id)

    monkeypatch.setattr(Group, "write_lease", failing_once)
    consumer = Consumer("t", store=store, group_id="g", auto_offset_reset="earliest", **FAST)
    try:
        assert consumer.assignment() == set()
        seen: list[bytes] = []

        def poll() -> None:
            for records in consumer.poll(timeout_ms=100).values():
                seen.extend(r.value for r in records)

        wait_until(lambda: len(seen) == 20, 10, poll)
        assert parts(consumer) == [0, 1]
        assert sorted(seen) == sorted(b"%d" % i for i in range(20))
    finally:
        consumer.close()

    def refused(self: Group, member_id: str) -> None:
        raise IllegalStateError("not a storage error")

    monkeypatch.setattr(Group, "write_lease", refused)
    with pytest.raises(IllegalStateError):
        Consumer("t", store=store, group_id="g2", **FAST)


def test_extra_members_idle(store: kstore.Store) -> None:
    store.create_topic("t", partitions=2)
    members = [Consumer("t", store=store, group_id="g", **FAST) for _ in range(3)]
    try:

        def poll_all() -> None:
            for m in members:
                m.poll(timeout_ms=0)

        wait_until(lambda: sorted(len(parts(m)) for m in members) == [0, 1, 1], 10, poll_all)
    finally:
        for m in members:
            m.close()


def test_dead_member_partitions_move_within_session_timeout(
    target: tuple[str, str, dict[str, Any]],
) -> None:
    backend, url, options = target
    store = kstore.Store(url, options)
    store.create_topic("t", partitions=6)
    survivors = [Consumer("t", store=store, group_id="g", **FAST) for _ in range(2)]
    process: subprocess.Popen[str] | None = None
    victim: Consumer | None = None
    try:
        if backend == "memory":  # one process: a member that stops heartbeating is as good as dead
            victim = Consumer("t", store=store, group_id="g", **FAST)
        else:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.workers.group_member",
                    url,
                    json.dumps(options),
                    "t",
                    "g",
                ],
                cwd=REPO,
                stdout=subprocess.PIPE,
                text=True,
            )

        def poll_all() -> None:
            for m in survivors:
                m.poll(timeout_ms=0)
            if victim is not None:
                victim.poll(timeout_ms=0)

        wait_until(lambda: sum(len(parts(m)) for m in survivors) == 4, 20, poll_all)
        if process is not None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
        else:
            assert victim is not None
            victim._membership._heartbeat_stop.set()  # type: ignore[union-attr]  # crash: no leave
        moved = wait_until(lambda: sum(len(parts(m)) for m in survivors) == 6, 20, poll_all)
        # Session timeout plus a heartbeat or two to notice, plus storage round trips.
        assert moved < FAST["session_timeout_ms"] / 1000 + 3
    finally:
        for m in survivors:
            m.close()
        if process is not None and process.poll() is None:
            process.kill()


class JoinWhileListing(Storage):
    """A storage that runs ``hook`` once, right after it lists a group's lease files: another
    member's join then lands between a heartbeat's listing and its commit."""

    hook: Callable[[], None] | None = None

    def list_dir(self, rel: str) -> list[FileInfo]:
        listing = super().list_dir(rel)
        hook = self.hook
        if hook is not None and rel == group_members_dir("g"):
            self.hook = None
            hook()
        return listing


def member(member_id: str) -> Member:
    return Member(
        member_id=member_id,
        instance_id=None,
        client_id=member_id,
        topics=("t",),
        assignors=("sticky",),
        session_timeout_ms=FAST["session_timeout_ms"],
        rebalance_timeout_ms=300_000,
        joined_ms=0,
    )


def test_a_heartbeat_does_not_expel_a_member_that_joined_after_its_listing(
    target: tuple[str, str, dict[str, Any]],
) -> None:
    _, url, options = target
    store = kstore.Store(url, options)
    store.create_topic("t", partitions=2)
    storage = JoinWhileListing(url, options)
    a = Group(kstore.Store.from_storage(storage, create=False), "g")
    a.join(member("member-a"))
    b = Group(store, "g")

    joined: list[str] = []

    def join_b() -> None:
        b.join(member("member-b"))
        joined.append("member-b")

    storage.hook = join_b
    # A metadata check makes the heartbeat build a commit on the newest state, which holds
    # b's join; b's lease is newer than the heartbeat's first listing.
    a.heartbeat("member-a", check_metadata=True)
    assert joined == ["member-b"]  # b joined in between
    state = Group(store, "g").state()
    assert set(state.members) == {"member-a", "member-b"}
    assert sorted(len(parts) for parts in state.assignment.values()) == [1, 1]
    assert "member-b.json" in {f.name for f in store.storage.list_dir(group_members_dir("g"))}


def test_members_share_the_listing_of_leases_and_still_expel_a_dead_one(
    monkeypatch: pytest.MonkeyPatch, target: tuple[str, str, dict[str, Any]]
) -> None:
    """Of 3 members each lists the leases at one heartbeat in 3 (at most the heartbeats in a
    session timeout, here 2: then one in 2); a member whose lease is gone is expelled at the
    first heartbeat that lists."""
    _, url, options = target
    store = kstore.Store(url, options)
    store.create_topic("t", partitions=3)
    groups = {m: Group(store, "g") for m in ("member-a", "member-b", "member-c")}
    for m, group in groups.items():
        group.join(member(m))
        group.write_lease(m)
    listings: list[str] = []
    real = Group.leases

    def counted(self: Group) -> dict[str, int]:
        listings.append("LIST")
        return real(self)

    monkeypatch.setattr(Group, "leases", counted)
    a = groups["member-a"]
    for _ in range(6):
        a.heartbeat("member-a", lease_check_every=10)
    assert len(listings) == 2  # every third heartbeat: one per member
    listings.clear()
    for _ in range(6):
        a.heartbeat("member-a", lease_check_every=2)
    assert len(listings) == 3
    # member-c dies: its lease is gone. Within a member's listing period it is expelled.
    groups["member-c"].drop_lease("member-c")
    listings.clear()
    for _ in range(3):
        a.heartbeat("member-a", lease_check_every=10)
    assert len(listings) >= 1
    state = Group(store, "g").state()
    assert set(state.members) == {"member-a", "member-b"}
    assert sorted(len(parts) for parts in state.assignment.values()) == [1, 2]


def test_a_lease_is_renewed_when_due_and_before_every_listing(
    monkeypatch: pytest.MonkeyPatch, target: tuple[str, str, dict[str, Any]]
) -> None:
    """With Kafka's defaults (session 45 s, heartbeat 3 s) a member writes its lease (a PUT on
    S3) when the last write is 12 s old, not at every heartbeat, and always before it lists the
    leases, so its own lease is a fresh reading of the storage's clock; a member that stops
    renewing is still expelled by the others."""
    import kstore.groups as groups_module

    _, url, options = target
    store = kstore.Store(url, options)
    store.create_topic("t", partitions=2)
    a, b = Group(store, "g"), Group(store, "g")
    a.join(member("member-a"))
    b.join(member("member-b"))

    class Clock:
        now = 1_000.0

        def monotonic(self) -> float:
            return self.now

        def __getattr__(self, name: str) -> Any:
            return getattr(time, name)

    clock = Clock()
    monkeypatch.setattr(groups_module, "time", clock)
    a.write_lease("member-a")
    beats: list[str] = []
    real_write, real_list = Group.write_lease, Group.leases

    def write(self: Group, member_id: str) -> None:
        beats.append("PUT")
        real_write(self, member_id)

    def listed(self: Group) -> dict[str, int]:
        beats.append("LIST")
        return real_list(self)

    monkeypatch.setattr(Group, "write_lease", write)
    monkeypatch.setattr(Group, "leases", listed)
    per_beat = []
    for _ in range(12):  # 36 s of heartbeats every 3 s
        clock.now += 3
        beats.clear()
        a.heartbeat("member-a", lease_check_every=15, lease_renewal_s=12.0)
        per_beat.append("+".join(beats) or "-")
    # Lists at one heartbeat in two (two members), renewing first; else renews every 12 s.
    assert per_beat[1::2] == ["PUT+LIST"] * 6, per_beat
    renewals = [i for i, beat in enumerate(per_beat) if beat.startswith("PUT")]
    assert all(b - a <= 4 for a, b in itertools.pairwise(renewals)), per_beat
    assert per_beat.count("-") >= 4, per_beat  # heartbeats that send no PUT
    # member-b's lease lapses (its process died): a listing heartbeat of a expels it.
    b.drop_lease("member-b")
    for _ in range(2):
        a.heartbeat("member-a", lease_check_every=15, lease_renewal_s=12.0)
    assert set(Group(store, "g").state().members) == {"member-a"}


def test_zombie_commit_is_rejected(store: kstore.Store) -> None:
    store.create_topic("t", partitions=2)
    produce(store, "t", 20)
    zombie = Consumer(
        "t",
        store=store,
        group_id="g",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **FAST,
    )
    zombie.poll(timeout_ms=500)
    zombie.commit()  # a live member's commit is accepted
    # It stalls (a long GC pause, say): its session expires.
    zombie._membership._heartbeat_stop.set()  # type: ignore[union-attr]
    other = Consumer("t", store=store, group_id="g", **FAST)
    try:
        wait_until(lambda: len(other.assignment()) == 2, 15, lambda: other.poll(timeout_ms=0))
        with pytest.raises(CommitFailedError):
            zombie.commit({TopicPartition("t", 0): OffsetAndMetadata(20)})
        group = Group(store, "g")
        with pytest.raises(CommitFailedError, match="does not own"):  # a partition it never had
            group.commit_offsets(
                {TopicPartition("t", 9): OffsetAndMetadata(1)},
                member_id=other.member_id,
                generation=other.generation,
            )
        with pytest.raises(CommitFailedError, match="live member"):
            group.commit_offsets(
                {TopicPartition("t", 0): OffsetAndMetadata(1)}, member_id=None, generation=-1
            )
    finally:
        other.close()
        zombie.close(autocommit=False)  # no longer a member: nothing to leave


def test_commit_after_rebalance_depends_on_ownership(store: kstore.Store) -> None:
    store.create_topic("t", partitions=2)
    a = Consumer("t", store=store, group_id="g", enable_auto_commit=False, **FAST)
    wait_until(lambda: len(a.assignment()) == 2, 10, lambda: a.poll(timeout_ms=0))
    stale_generation = a.generation
    b = Consumer("t", store=store, group_id="g", enable_auto_commit=False, **FAST)
    try:
        b.poll(timeout_ms=0)
        group = Group(store, "g")
        state = group.state()
        assert state.generation > stale_generation
        kept = next(iter(state.assignment[a.member_id]))  # type: ignore[index]
        moved = next(iter(state.assignment[b.member_id]))  # type: ignore[index]
        # A member that has not seen the new generation still owns what did not move ...
        group.commit_offsets(
            {kept: OffsetAndMetadata(0)}, member_id=a.member_id, generation=stale_generation
        )
        # ... and may commit what moved only while handing it over (its final position).
        group.commit_offsets(
            {moved: OffsetAndMetadata(0)}, member_id=a.member_id, generation=stale_generation
        )
        wait_until(
            lambda: moved not in a.assignment(), 10, lambda: a.poll(timeout_ms=0)
        )  # a releases it
        with pytest.raises(CommitFailedError, match="does not own"):
            group.commit_offsets(
                {moved: OffsetAndMetadata(5)}, member_id=a.member_id, generation=stale_generation
            )
        with pytest.raises(
            CommitFailedError, match="does not own"
        ):  # b waits for the hand-over: n/a now
            group.commit_offsets(
                {kept: OffsetAndMetadata(5)}, member_id=b.member_id, generation=b.generation
            )
    finally:
        a.close()
        b.close()


def test_hand_over_loses_nothing_and_repeats_nothing(logs_store: kstore.Store) -> None:
    """Four partitions: in one topic log, or (commit.logs 3) 0 and 3, 1, 2 in three."""
    store = logs_store
    store.create_topic("t", partitions=4)
    produce(store, "t", 800)
    events: list[tuple[str, str, list[int]]] = []

    class Listener:
        def __init__(self, name: str) -> None:
            self.name = name

        def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
            events.append((self.name, "revoked", sorted(tp.partition for tp in revoked)))

        def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
            events.append((self.name, "assigned", sorted(tp.partition for tp in assigned)))

    seen: list[tuple[int, int]] = []
    a = Consumer(
        store=store, group_id="g", auto_offset_reset="earliest", max_poll_records=40, **FAST
    )
    a.subscribe(["t"], listener=Listener("a"))
    for _ in range(3):
        seen.extend((r.partition, r.offset) for rs in a.poll(timeout_ms=200).values() for r in rs)
    b = Consumer(
        store=store, group_id="g", auto_offset_reset="earliest", max_poll_records=40, **FAST
    )
    b.subscribe(["t"], listener=Listener("b"))
    idle = 0
    while idle < 10:
        got = [r for c in (a, b) for rs in c.poll(timeout_ms=20).values() for r in rs]
        seen.extend((r.partition, r.offset) for r in got)
        idle = 0 if got else idle + 1
    a.close()
    b.close()
    assert len(seen) == len(set(seen)) == 800  # nothing read twice, nothing lost
    # Partition by partition: every offset below its end, read once.
    ends = {p: store.partition("t", p).state().end_offset for p in range(4)}
    assert sum(ends.values()) == 800
    assert sorted(seen) == [(p, o) for p in range(4) for o in range(ends[p])]
    revoked = [ps for n, e, ps in events if n == "a" and e == "revoked"]
    assigned_b = [ps for n, e, ps in events if n == "b" and e == "assigned"]
    assert revoked
    assert assigned_b
    assert sorted(functools.reduce(operator.iadd, revoked, [])) == sorted(
        functools.reduce(operator.iadd, assigned_b, [])
    )


class Events:
    """A rebalance listener that records its calls, with Kafka's on_partitions_lost."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.calls.append(("revoked", sorted(tp.partition for tp in revoked)))

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.calls.append(("assigned", sorted(tp.partition for tp in assigned)))

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        self.calls.append(("lost", sorted(tp.partition for tp in lost)))


def expelled_member(store: kstore.Store, **configs: Any) -> tuple[Consumer, Events, Consumer]:
    """A member that read part of a two-partition topic and then stalled (no heartbeats) until
    its session expired, and the member that took over its partitions and read them all."""
    store.create_topic("t", partitions=2)
    produce(store, "t", 100)
    events = Events()
    a = Consumer(
        store=store,
        group_id="g",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=10,
        **{**FAST, **configs},
    )
    a.subscribe(["t"], listener=events)
    assert sum(len(rs) for rs in a.poll(timeout_ms=2_000).values()) == 10
    a._membership._heartbeat_stop.set()  # type: ignore[union-attr]  # it stalls
    expelled = a.member_id
    # The expiry as a member's heartbeat commits it: a leave and a new generation.
    Group(store, "g").leave(expelled, "session expired")  # type: ignore[arg-type]
    b = Consumer("t", store=store, group_id="g", auto_offset_reset="earliest", **FAST)
    wait_until(lambda: len(b.assignment()) == 2, 10, lambda: None)
    got = 0
    while got < 100:
        got += sum(len(rs) for rs in b.poll(timeout_ms=2_000).values())
    assert got == 100
    assert a.member_id == expelled
    return a, events, b


def owned_by(store: kstore.Store, member_id: str | None) -> set[TopicPartition]:
    """What the group lets ``member_id`` read now: its partitions no one else still holds."""
    state = Group(store, "g").state()
    return {
        tp
        for tp in state.assignment.get(member_id or "", [])
        if state.pending_release.get(tp, member_id) == member_id
    }


def test_an_expelled_member_stops_reading_in_the_poll_that_finds_out(
    store: kstore.Store,
) -> None:
    # A heartbeat interval of 1 ms makes every poll look at the group log.
    a, events, b = expelled_member(store, heartbeat_interval_ms=1)
    try:
        got = a.poll(timeout_ms=0)
        # It rejoined, as a new member, and reads nothing another member owns.
        assert a.member_id is not None
        assert a.member_id != b.member_id
        assert set(got) <= owned_by(store, a.member_id)
        assert not set(got) & b.assignment()
        assert ("lost", [0, 1]) in events.calls
        assert not any(kind == "revoked" for kind, _ in events.calls)
    finally:
        b.close()
        a.close()


def test_a_member_told_by_a_refused_commit_that_it_was_expelled_stops_reading(
    store: kstore.Store,
) -> None:
    a, events, b = expelled_member(store)
    try:
        with pytest.raises(CommitFailedError, match="not in the group"):
            a.commit()
        got = a.poll(timeout_ms=0)
        assert not set(got) & b.assignment()
        assert set(got) <= owned_by(store, a.member_id)
        assert ("lost", [0, 1]) in events.calls  # and it rejoined in that poll
    finally:
        b.close()
        a.close()


class HookedReads(Storage):
    """A storage that runs ``hook`` once, when it is next asked for records (a segment file,
    or a range of a data object)."""

    hook: Callable[[], None] | None = None

    def _segments_read(self, rels: list[str]) -> None:
        hook = self.hook
        if hook is not None and any("/segments/" in rel or "/_data/" in rel for rel in rels):
            self.hook = None
            hook()

    def read_ranges(self, rel: str, ranges: Any, **kwargs: Any) -> list[bytes]:
        self._segments_read([rel])
        return super().read_ranges(rel, ranges, **kwargs)

    def read(self, rel: str) -> bytes:
        self._segments_read([rel])
        return super().read(rel)

    def read_many(self, rels: list[str]) -> dict[str, bytes]:
        self._segments_read(rels)
        return super().read_many(rels)


def test_records_read_while_the_heartbeat_learns_of_an_expulsion_are_not_returned(
    target: tuple[str, str, dict[str, Any]],
) -> None:
    _, url, options = target
    store = kstore.Store(url, options)
    store.create_topic("t", partitions=2)
    produce(store, "t", 100)
    storage = HookedReads(url, options)
    a = Consumer(
        "t",
        store=kstore.Store.from_storage(storage, create=False, segment_cache_bytes=0),
        group_id="g",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **FAST,
    )
    expelled = a.member_id
    assert expelled is not None
    assert len(a.assignment()) == 2
    learnt: list[str] = []

    def expel() -> None:
        # Its session is found expired while it reads, and its heartbeat thread finds out.
        Group(store, "g").leave(expelled, "session expired")
        wait_until(lambda: a._membership.needs_rejoin, 10, lambda: None)  # type: ignore[union-attr]
        learnt.append(expelled)

    storage.hook = expel
    try:
        assert a.poll(timeout_ms=0) == {}
        assert learnt == [expelled]
        got = a.poll(timeout_ms=2_000)  # rejoined: it reads again, as a new member
        assert a.member_id != expelled
        assert got
        assert set(got) <= owned_by(store, a.member_id)
    finally:
        a.close()


def test_a_member_whose_pattern_matches_a_new_topic_hands_over_and_rejoins(
    store: kstore.Store,
) -> None:
    store.create_topic("logs-a", partitions=2)
    produce(store, "logs-a", 30)
    events = Events()
    c = Consumer(
        store=store,
        group_id="g",
        auto_offset_reset="earliest",
        metadata_max_age_ms=0,  # every heartbeat looks for new topics
        **FAST,
    )
    c.subscribe(pattern=r"logs-.*", listener=events)
    try:
        got = 0
        while got < 30:
            got += sum(len(rs) for rs in c.poll(timeout_ms=2_000).values())
        first = c.member_id
        store.create_topic("logs-b")
        wait_until(lambda: c.subscription() == {"logs-a", "logs-b"}, 10, c.poll)
        # Still a member when it rejoined: its partitions were revoked (not lost), its
        # positions committed, and the old member id left rather than waiting to expire.
        assert c.member_id != first
        assert ("revoked", [0, 1]) in events.calls
        assert not any(kind == "lost" for kind, _ in events.calls)
        state = Group(store, "g").state()
        assert set(state.members) == {c.member_id}
        assert sum(state.offsets[TopicPartition("logs-a", p)].offset for p in range(2)) == 30
    finally:
        c.close()


def test_static_membership_survives_restart_without_rebalance(store: kstore.Store) -> None:
    store.create_topic("t", partitions=4)
    first = Consumer("t", store=store, group_id="g", group_instance_id="worker-1", **FAST)
    other = Consumer("t", store=store, group_id="g", group_instance_id="worker-2", **FAST)

    def poll_both() -> None:
        first.poll(timeout_ms=0)
        other.poll(timeout_ms=0)

    wait_until(lambda: len(first.assignment()) == 2 and len(other.assignment()) == 2, 10, poll_both)
    generation, owned = first.generation, first.assignment()
    first.close()  # a static member does not leave on close
    restarted = Consumer("t", store=store, group_id="g", group_instance_id="worker-1", **FAST)
    try:
        restarted.poll(timeout_ms=0)
        assert restarted.generation == generation
        assert restarted.assignment() == owned
        other.poll(timeout_ms=0)
        assert other.generation == generation
    finally:
        restarted.close()
        other.close()


def test_group_administration(store: kstore.Store) -> None:
    store.create_topic("t", partitions=2)
    produce(store, "t", 100)
    with Consumer(
        "t",
        store=store,
        group_id="app",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **FAST,
    ) as consumer:
        got = consumer.poll(timeout_ms=500, max_records=30)
        consumer.commit()
        assert list_groups(store) == ["app"]
        live = describe_group(store, "app")
        assert live.state == "Stable"
        assert len(live.members) == 1
        read = {tp.partition: len(v) for tp, v in got.items()}
        for row in live.partitions:
            if row.partition in read:
                assert row.current_offset == read[row.partition]
                assert row.lag == row.log_end_offset - read[row.partition]
            else:  # never committed: no lag to show, as kafka-consumer-groups prints "-"
                assert row.current_offset is None
                assert row.lag is None
        with pytest.raises(IllegalStateError, match="live member"):
            reset_offsets(store, "app", ["t"], to_earliest=True)
        with pytest.raises(IllegalStateError, match="live member"):
            delete_group(store, "app")
    empty = describe_group(store, "app")
    assert empty.state == "Empty"
    plan = reset_offsets(store, "app", ["t"], shift_by=-5)  # a dry run by default
    assert describe_group(store, "app").total_lag == empty.total_lag
    assert all(o >= 0 for o in plan.values())
    reset_offsets(store, "app", ["t"], to_latest=True, execute=True)
    assert describe_group(store, "app").total_lag == 0
    reset_offsets(store, "app", ["t"], to_offset=10_000, execute=True)  # clamped to the end
    assert all(
        p.current_offset == p.log_end_offset for p in describe_group(store, "app").partitions
    )
    reset_offsets(store, "app", ["t"], by_duration_ms=3_600_000, execute=True)
    assert describe_group(store, "app").total_lag == 100
    reset_offsets(
        store, "app", ["t"], to_datetime_ms=int(time.time() * 1000) + 60_000, execute=True
    )
    assert describe_group(store, "app").total_lag == 0  # nothing that new: the end
    with pytest.raises(ValueError, match="exactly one"):
        reset_offsets(store, "app", ["t"], to_earliest=True, to_latest=True)
    delete_group(store, "app")
    assert list_groups(store) == []


# -- assignors (pure functions) -----------------------------------------------------------------


def test_range_and_roundrobin_assignors() -> None:
    members = {"a": ("t",), "b": ("t",), "c": ("t", "u")}
    counts = {"t": 7, "u": 2}
    ranged = range_assign(members, counts)
    assert [len(ranged[m]) for m in "abc"] == [3, 2, 4]  # t: 3/2/2, u: all to c
    robin = roundrobin_assign(members, counts)
    assert sorted(tp for ps in robin.values() for tp in ps) == sorted(
        [TopicPartition("t", p) for p in range(7)] + [TopicPartition("u", p) for p in range(2)]
    )


def test_sticky_assignor_moves_little() -> None:
    counts = {"t": 12}
    three = {"a": ("t",), "b": ("t",), "c": ("t",)}
    before = sticky_assign(three, counts)
    assert sorted(len(v) for v in before.values()) == [4, 4, 4]
    four = {**three, "d": ("t",)}
    after = sticky_assign(four, counts, before)
    assert sorted(len(v) for v in after.values()) == [3, 3, 3, 3]
    moved = sum(1 for m in "abc" for tp in after[m] if tp not in before[m])
    assert moved == 0  # only d's three partitions were taken from others; nobody else moved
    assert len(after["d"]) == 3


def test_a_settled_member_looks_at_the_group_log_at_the_heartbeat_pace(
    store: kstore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an object store each look at the group log is a GET. A member whose assignment is
    settled looks from poll() once per heartbeat interval (as a Kafka member learns of a
    rebalance from its heartbeat), not at every 100 ms; while partitions are handed over it
    looks every 100 ms, so a new owner starts reading soon after the release."""
    import threading

    store.create_topic("t", partitions=2)
    config = {"session_timeout_ms": 10_000, "heartbeat_interval_ms": 1_000}
    a = Consumer("t", store=store, group_id="g", **config)
    looks: list[float] = []
    try:
        wait_until(lambda: len(parts(a)) == 2, 10, lambda: a.poll(timeout_ms=0))
        original = Group.state

        def counted(group: Group) -> Any:
            if threading.current_thread() is threading.main_thread():
                looks.append(time.monotonic())
            return original(group)

        monkeypatch.setattr(Group, "state", counted)
        started = time.monotonic()
        while time.monotonic() - started < 2.5:
            a.poll(timeout_ms=50)
        assert 1 <= len(looks) <= 4, looks  # at 100 ms: about 25
        # A second member: a hand-over. The first learns of it at its pace, releases, and the
        # second, waiting for the release, looks every 100 ms.
        b = Consumer("t", store=store, group_id="g", **config)
        try:
            took = wait_until(
                lambda: (
                    len(parts(a)) == 1
                    and len(parts(b)) == 1
                    and all(b._membership.owns(tp) for tp in b.assignment())  # type: ignore[union-attr]
                ),
                10,
                lambda: (a.poll(timeout_ms=0), b.poll(timeout_ms=0)),
            )
            assert took < 4  # within about a heartbeat interval or two, not a session
        finally:
            b.close()
    finally:
        a.close()


def test_a_corrupt_group_log_is_listed_and_described_with_its_error(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    """One damaged group log does not hide the others: it is listed, and describing it names
    the damage."""
    store = kstore.Store(*local_store)
    store.create_topic("t", 1)
    for name in ("good", "bad"):
        kstore.groups.reset_offsets(store, name, ["t"], to_earliest=True, execute=True)
    store.storage.put("groups/bad/_log/00000000000000000000.json", b'{"commitInfo": ')
    assert list_groups(store) == ["bad", "good"]
    with pytest.raises(kstore.errors.CorruptLogError, match="bad"):
        describe_group(store, "bad")
    assert describe_group(store, "good").group_id == "good"
