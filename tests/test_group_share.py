"""Shared group commits (PROTOCOL.md 31): the members of a group share its log's commits.
Many members at once on every backend; what a commit takes, refuses and never takes twice;
takeover; bad request files; the decided requests through checkpoints; the version raise;
housekeeping of what a crash left."""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

import pytest
from kstore.retention.housekeeping import prune_logs

import kstore
from kstore.errors import CommitFailedError, UnsupportedFormatVersionError
from kstore.group_share import (
    REQUEST_MAX_AGE_MS,
    GroupRequest,
    decode_request,
    encode_request,
    parse_request_name,
    request_name,
)
from kstore.groups import (
    GROUP_LOG_WRITER_VERSION,
    Group,
    GroupState,
    Member,
    describe_group,
    upgrade_group,
)
from kstore.layout import group_dir, group_log_dir
from kstore.log import Log, protocol_action
from kstore.records import OffsetAndMetadata, TopicPartition
from tests.conftest import StoreTarget

WRITER_B = "b" * 32


def _member(member_id: str, topics: tuple[str, ...] = ("t",)) -> Member:
    return Member(
        member_id=member_id,
        instance_id=None,
        client_id=member_id,
        topics=topics,
        assignors=("range",),
        session_timeout_ms=30_000,
        rebalance_timeout_ms=30_000,
        joined_ms=0,
    )


def _requests_dir(group_id: str) -> str:
    return f"{group_dir(group_id)}/_requests"


def _put_request(store: kstore.Store, group_id: str, request: GroupRequest) -> str:
    path = f"{_requests_dir(group_id)}/{request.name}"
    store.storage.put_if_absent(path, encode_request(request, int(time.time() * 1000)))
    return path


def _offsets_request(member: str, offset: int, number: int, generation: int = 1) -> GroupRequest:
    items = [{"topic": "t", "partition": 0, "offset": offset, "metadata": ""}]
    return GroupRequest(
        "offsets",
        member,
        {"generation": generation, "offsets": items},
        writer=WRITER_B,
        number=number,
    )


def _one_member_group(store: kstore.Store, group_id: str = "g") -> Group:
    store.create_topic("t", 2)
    group = Group(store, group_id)
    group.join(_member("a"))
    return group


def _hand_over(group: Group, member_id: str) -> None:
    """The cooperative hand-over a consumer makes after a rebalance."""
    moved = [tp for tp, m in group.state().pending_release.items() if m == member_id]
    group.release(member_id, moved)
    assert not group.state().pending_release


def _actions(store: kstore.Store, group_id: str, version: int) -> list[tuple[str, Any]]:
    data = store.storage.read(f"{group_log_dir(group_id)}/{version:020d}.json")
    out = []
    for line in data.decode().splitlines()[1:]:
        ((name, body),) = json.loads(line).items()
        out.append((name, body))
    return out


def test_request_files_encode_and_refuse_what_is_malformed() -> None:
    request = _offsets_request("m-1", 5, 3)
    data = encode_request(request, 1)
    back = decode_request(data, name=request.name, where="x")
    assert (back.kind, back.member_id, back.writer, back.number) == ("offsets", "m-1", WRITER_B, 3)
    assert back.body == request.body
    bad = {
        "a name no writer makes": (data, "x.json"),
        "another number in the name": (data, request_name(WRITER_B, 4)),
        "not JSON": (b"{nope\n", request.name),
        "two lines": (data + data, request.name),
        "no newline": (data[:-1], request.name),
        "unknown kind": (data.replace(b'"offsets","memberId"', b'"drop","memberId"'), request.name),
        "no member": (data.replace(b'"memberId":"m-1"', b'"memberId":""'), request.name),
    }
    for why, (payload, name) in bad.items():
        with pytest.raises(kstore.errors.CorruptLogError):
            decode_request(payload, name=name, where=why)


def test_a_commit_takes_pending_requests_and_never_twice(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    """Member a's commit, listing, takes b's pending offset commit: both land in one commit,
    b's decided in its `requests` action. b's request read again later (a committer with a
    stale listing) is never applied again, not even after b committed newer offsets."""
    store = kstore.Store(*local_store)
    group = _one_member_group(store)
    other = Group(store, "g")
    other.join(_member("b"))
    _hand_over(group, "a")
    state = group.state()
    assert state.min_writer_version == GROUP_LOG_WRITER_VERSION
    tp_b = state.assignment["b"][0]
    tp_a = state.assignment["a"][0]
    gen = state.generation
    items = [{"topic": tp_b.topic, "partition": tp_b.partition, "offset": 10, "metadata": "m"}]
    stale = GroupRequest(
        "offsets", "b", {"generation": gen, "offsets": items}, writer=WRITER_B, number=0
    )
    path = _put_request(store, "g", stale)
    group._share._listing_until = time.monotonic() + 60  # a member that met contention lists
    group.commit_offsets({tp_a: OffsetAndMetadata(7)}, member_id="a", generation=gen)
    state = group.state()
    assert state.offsets[tp_a].offset == 7
    assert state.offsets[tp_b] == OffsetAndMetadata(10, "m")
    names = [name for name, _ in _actions(store, "g", state.version)]
    assert names == ["offsets", "offsets", "requests"]
    assert state.requests[WRITER_B].number == 0
    assert state.requests[WRITER_B].error is None
    assert not store.storage.exists(path), "a decided request's file is deleted"
    # b moves on; a committer that listed b's old request before it was deleted builds again.
    other.commit_offsets({tp_b: OffsetAndMetadata(20)}, member_id="b", generation=gen)
    actions, outcomes = group._build_round(group.state(), [])
    assert actions == []
    assert outcomes == {}
    third = Group(store, "g")
    third._share._pending = lambda: [stale]  # type: ignore[method-assign]
    third._share._listing_until = time.monotonic() + 60
    third.commit_offsets({tp_a: OffsetAndMetadata(8)}, member_id="a", generation=gen)
    state = third.state()
    assert state.offsets[tp_b].offset == 20, "an old request was applied twice"
    assert state.offsets[tp_a].offset == 8


def test_a_refused_request_is_recorded_and_its_member_told(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    """A pending offset commit of a member no longer in the group is refused by the commit
    that takes it; the refusal is in the log, and the waiting member raises it."""
    store = kstore.Store(*local_store)
    group = _one_member_group(store)
    zombie = _offsets_request("gone", 5, 0)
    _put_request(store, "g", zombie)
    group._share._listing_until = time.monotonic() + 60
    state = group.state()
    tp = state.assignment["a"][0]
    group.commit_offsets({tp: OffsetAndMetadata(3)}, member_id="a", generation=state.generation)
    decided = group.state().requests[WRITER_B]
    assert decided.error == "CommitFailedError"
    assert "gone" in (decided.message or "")
    assert group.state().offsets[tp].offset == 3, "the committer's own commit landed"
    # The waiter's side: its member learns the refusal from the state.
    waiter = Group(store, "g")
    waiter._share.writer_id = "c" * 32
    request = GroupRequest("offsets", "gone", zombie.body)
    _, refusal = waiter._share._wait(request, "COMMIT OFFSETS", waiter.state())
    assert isinstance(refusal, CommitFailedError)
    assert "gone" in str(refusal)
    assert waiter.state().requests["c" * 32].error == "CommitFailedError"


def test_a_waiter_takes_over_and_takes_the_others(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    """A pending request no commit takes is committed by its own member after the takeover
    time, with every other pending request it finds."""
    store = kstore.Store(*local_store)
    group = _one_member_group(store)
    b = Group(store, "g")
    b.join(_member("b"))
    _hand_over(group, "a")
    state = b.state()
    tp_a, tp_b = state.assignment["a"][0], state.assignment["b"][0]
    other = GroupRequest(
        "offsets",
        "a",
        {
            "generation": state.generation,
            "offsets": [{"topic": tp_a.topic, "partition": tp_a.partition, "offset": 4}],
        },
        writer=WRITER_B,
        number=0,
    )
    _put_request(store, "g", other)
    before = state.version
    request = GroupRequest(
        "offsets",
        "b",
        {
            "generation": state.generation,
            "offsets": [
                {"topic": tp_b.topic, "partition": tp_b.partition, "offset": 9, "metadata": ""}
            ],
        },
    )
    state, refusal = b._share._wait(request, "COMMIT OFFSETS", state)
    assert refusal is None
    assert state.version == before + 1, "one commit for both requests"
    assert state.offsets[tp_a].offset == 4
    assert state.offsets[tp_b].offset == 9
    assert b.metrics["group-takeover-total"] == 1
    assert store.storage.list_dir(_requests_dir("g")) == []


def test_a_damaged_or_hour_old_request_is_not_taken(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    store = kstore.Store(*local_store)
    group = _one_member_group(store)
    damaged = f"{_requests_dir('g')}/{request_name(WRITER_B, 0)}"
    store.storage.put(damaged, b'{"request": {"writer": "nope"}}\n')
    old = _offsets_request("a", 4, 0)
    old = GroupRequest(old.kind, old.member_id, old.body, writer="d" * 32, number=0)
    old_path = _put_request(store, "g", old)
    hour_ago = time.time() - REQUEST_MAX_AGE_MS / 1000 - 60
    os.utime(os.path.join(local_store[0].removeprefix("file://"), old_path), (hour_ago, hour_ago))
    group._share._listing_until = time.monotonic() + 60
    state = group.state()
    tp = state.assignment["a"][0]
    group.commit_offsets({tp: OffsetAndMetadata(1)}, member_id="a", generation=state.generation)
    state = group.state()
    assert state.requests == {}
    assert state.offsets[tp].offset == 1
    assert not store.storage.exists(damaged), "a damaged request is deleted"
    assert store.storage.exists(old_path), "an hour-old request is the housekeeping's"
    report = prune_logs(store)
    assert old_path in report.files
    assert not store.storage.exists(old_path)


def test_the_decided_requests_survive_checkpoints_and_a_delete(
    memory_store: tuple[str, dict[str, Any]],
) -> None:
    """Each writer's last decided number is what keeps a request from being taken twice:
    checkpoints keep it (a day behind the newest decision), and so does deleting the group."""
    store = kstore.Store(*memory_store)
    group = _one_member_group(store)
    state = group.state()
    day = 86_400_000
    now = int(time.time() * 1000)
    for writer, number, when in (("e" * 32, 3, now - day - 1), ("f" * 32, 7, now)):
        decided = [{"writer": writer, "number": number, "time": when}]
        group._commit(lambda s, d=decided: [{"requests": {"decided": d}}], "TEST")
    state = group.state()
    assert {w: d.number for w, d in state.requests.items()} == {"e" * 32: 3, "f" * 32: 7}
    replayed = GroupState()
    for action in state.checkpoint_actions():
        ((name, body),) = action.items()
        replayed.apply(name, body)
    assert {w: d.number for w, d in replayed.requests.items()} == {"f" * 32: 7}
    assert replayed.min_writer_version == GROUP_LOG_WRITER_VERSION
    group.leave("a")
    kstore.groups.delete_group(store, "g")
    after = Group(store, "g").state()
    assert after.deleted
    assert after.requests["f" * 32].number == 7
    assert after.min_writer_version == GROUP_LOG_WRITER_VERSION


def test_groups_below_writer_version_8_race_until_raised(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    """A group log made by an older kstore (writer version 1) is written as that version
    says: no pending request, even for a member whose commit lost a race. `upgrade_group`
    raises it under a running member; an older kstore is refused by the log afterwards."""
    store = kstore.Store(*local_store)
    store.create_topic("t", 2)
    log: Log[GroupState] = Log(store.storage, group_log_dir("old"), GroupState)
    log.commit(log.load(), lambda s: [protocol_action()], operation="CREATE")
    a, b = Group(store, "old"), Group(store, "old")
    a.join(_member("a"))
    b.join(_member("b"))  # its first attempt builds on a's version 0 view: a lost race
    assert b.state().min_writer_version == 1
    assert not store.storage.exists(_requests_dir("old"))
    assert b.metrics["group-request-pending-total"] == 0
    assert upgrade_group(store, "old", dry_run=True) == (1, 1)
    assert Group(store, "old").state().min_writer_version == 1
    assert upgrade_group(store, "old") == (1, 1)
    state = a.state()
    assert (state.min_reader_version, state.min_writer_version) == (1, GROUP_LOG_WRITER_VERSION)
    assert upgrade_group(store, "old") == (1, GROUP_LOG_WRITER_VERSION), "a no-op once raised"
    tp = state.assignment["a"][0]
    a.commit_offsets({tp: OffsetAndMetadata(2)}, member_id="a", generation=state.generation)
    lags = {
        (p.topic, p.partition): p.current_offset for p in describe_group(store, "old").partitions
    }
    assert lags[(tp.topic, tp.partition)] == 2
    with pytest.raises(kstore.errors.KStoreError, match="does not exist"):
        upgrade_group(store, "nope")
    import kstore.log as log_module

    old_version = log_module.WRITER_VERSION
    try:
        log_module.WRITER_VERSION = 7
        with pytest.raises(UnsupportedFormatVersionError, match="writer version 8"):
            Group(store, "old").commit_offsets(
                {tp: OffsetAndMetadata(3)}, member_id="a", generation=state.generation
            )
    finally:
        log_module.WRITER_VERSION = old_version


def test_many_members_at_once_lose_nothing(any_store: StoreTarget) -> None:
    """Eight members (a Group each, as separate processes would be) join one group at once,
    commit offsets many times each and leave: every join lands, the final assignment covers
    every partition once, each member's last commit is the offset it committed last, and no
    request is applied twice or lost."""
    store = kstore.Store(any_store.url, any_store.storage_options)
    store.create_topic("t", 16)
    members, rounds = 8, 6
    barrier = threading.Barrier(members)
    errors: list[BaseException] = []
    last: dict[TopicPartition, int] = {}
    lock = threading.Lock()
    groups: dict[str, Group] = {}

    def run(i: int) -> None:
        group = Group(kstore.Store(any_store.url, any_store.storage_options), "many")
        member_id = f"m{i}"
        groups[member_id] = group
        try:
            barrier.wait()
            group.join(_member(member_id))
            barrier.wait()
            for r in range(rounds):
                state = group.state()
                # Hand over what moved away, then commit what it owns now.
                pending = [tp for tp, m in state.pending_release.items() if m == member_id]
                if pending:
                    group.release(member_id, pending)
                state = group.state()
                owned = [
                    tp
                    for tp in state.assignment.get(member_id, [])
                    if state.pending_release.get(tp) in (None, member_id)
                ]
                offsets = {tp: OffsetAndMetadata(100 * r + i) for tp in owned}
                try:
                    group.commit_offsets(offsets, member_id=member_id, generation=state.generation)
                except CommitFailedError:
                    continue  # a rebalance moved a partition meanwhile: try again next round
                with lock:
                    for tp in owned:
                        last[tp] = max(last.get(tp, -1), 100 * r + i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(members)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not errors, errors
    state = Group(store, "many").state()
    assert set(state.members) == {f"m{i}" for i in range(members)}
    assigned = [tp for parts in state.assignment.values() for tp in parts]
    assert sorted(assigned) == [TopicPartition("t", p) for p in range(16)]
    for tp, offset in last.items():
        assert state.offsets[tp].offset >= offset
    shared = sum(g.metrics["group-request-pending-total"] for g in groups.values())
    taken = sum(g.metrics["group-request-taken-total"] for g in groups.values())
    commits = state.version + 1
    # Eight joins and their rebalances, releases and 48 offset commits: far fewer commits
    # than changes whenever any were shared.
    assert taken <= shared
    assert commits <= members * (rounds + 3)
    # (SeaweedFS lists a directory's own marker in it, which is no request.)
    leftovers = [
        f.name
        for f in store.storage.list_dir(_requests_dir("many"))
        if parse_request_name(f.name) is not None
    ]
    assert leftovers == []


def test_groups_upgrade_command(local_store: tuple[str, dict[str, Any]]) -> None:
    """`kstore groups upgrade`: a dry run changes nothing, the raise says what it did, a second
    run says nothing changed, an unknown group is one clear error."""
    from tests.test_cli import Cli

    store = kstore.Store(*local_store)
    store.create_topic("t", 1)
    log: Log[GroupState] = Log(store.storage, group_log_dir("old"), GroupState)
    log.commit(log.load(), lambda s: [protocol_action()], operation="CREATE")
    cli = Cli("local", *local_store)

    def said(*args: str) -> str:
        result = cli.run("groups", "upgrade", *args)
        return result.stdout + result.stderr

    out = said("old", "--dry-run")
    assert "would be raised to 1/8" in out
    assert Group(store, "old").state().min_writer_version == 1
    out = said("old")
    assert "raised from 1/1 to 1/8" in out
    assert Group(store, "old").state().min_writer_version == GROUP_LOG_WRITER_VERSION
    assert "already" in said("old")
    failed = cli.run("groups", "upgrade", "nope", code=1)
    assert "does not exist" in failed.stderr
    assert "Traceback" not in failed.stderr + failed.stdout


def test_a_group_is_raised_while_its_consumers_run(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    """Three consumers read and commit a group made by an older kstore (writer version 1);
    `upgrade_group` raises it under them: none of them fails, every record is read, and the
    offsets they commit after the raise land."""
    from kstore.consumer import Consumer
    from kstore.producer import Producer

    store = kstore.Store(*local_store)
    store.create_topic("t", 6)
    log: Log[GroupState] = Log(store.storage, group_log_dir("g"), GroupState)
    log.commit(log.load(), lambda s: [protocol_action()], operation="CREATE")
    fast = {"session_timeout_ms": 2_500, "heartbeat_interval_ms": 200}
    members = [
        Consumer("t", store=store, group_id="g", auto_offset_reset="earliest", **fast)
        for _ in range(3)
    ]
    seen: list[bytes] = []
    total = 600
    try:
        with Producer(store, linger_ms=1) as producer:
            for i in range(total):
                producer.send("t", b"%d" % i, key=b"k%d" % (i % 13))
                if i == total // 2:
                    assert upgrade_group(store, "g") == (1, 1)
        deadline = time.monotonic() + 60
        while len(set(seen)) < total and time.monotonic() < deadline:
            for m in members:
                for records in m.poll(timeout_ms=20).values():
                    seen.extend(r.value for r in records)
                m.commit()
        assert sorted(set(seen)) == sorted(b"%d" % i for i in range(total))
        state = Group(store, "g").state()
        assert state.min_writer_version == GROUP_LOG_WRITER_VERSION
        tps = [TopicPartition("t", p) for p in range(6)]
        ends = members[0].end_offsets(tps)
        committed = {tp: om.offset for tp, om in state.offsets.items()}
        assert committed == ends, "the last commits, after the raise, landed"
    finally:
        for m in members:
            m.close()
