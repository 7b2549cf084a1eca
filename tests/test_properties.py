"""Property-based tests of manifest replay and checkpoints.

Random sequences of valid partition commits (appends with producer ids, epochs and sequences,
retention moves of the log start, compaction replacements, transactions with their markers,
transaction identifiers) go through the real log code (`Partition.commit_segments`,
`commit_actions`, `end_transaction`) on a memory store with a checkpoint every few versions.
Then: replaying from version 0, loading from the newest checkpoint, and time travel to every
version from the checkpoints below it all give the same state; offsets are contiguous and
increasing; retried batches are recognised and stale ones rejected. Separately, the checkpoint
of every kind of state (partition, group, topic, producer identity) replays to the same state.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir

from kstore.errors import (
    DuplicateSequenceError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)
from kstore.groups import GroupState
from kstore.log import Log, LogState, compact_json, decode_commit, encode_commit, version_file
from kstore.manifest import PartitionState, ProducerBatch, Segment
from kstore.partition import Partition
from kstore.segments import SegmentFile
from kstore.storage import Storage
from kstore.store import TopicState
from kstore.transactions import TransactionLogState
from tests.layout2 import WritablePartition

# Hypothesis keeps caches (and, by default, its example database) under ./.hypothesis: send
# them to a temporary directory so that running this file writes nothing into the repository.
if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    set_hypothesis_home_dir(tempfile.mkdtemp(prefix="kstore-hypothesis-"))

SETTINGS = settings(
    deadline=None,
    max_examples=150,
    database=None,  # nothing is written into the repository
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# --- canonical forms ---------------------------------------------------------------------------


def canonical_partition(state: PartitionState) -> dict[str, Any]:
    """Everything a reader or writer of a partition depends on. A segment's transaction tag
    matters only while its transaction is open (checkpoints drop it once ended)."""
    return {
        "version": state.version,
        "protocol": (state.min_reader_version, state.min_writer_version),
        "end": state.end_offset,
        "start": state.log_start_offset,
        "cleaned": state.cleaned_offset,
        "segments": [
            (
                s.path,
                s.base_offset,
                s.last_offset,
                s.record_count,
                s.min_timestamp_ms,
                s.max_timestamp_ms,
                s.size_bytes,
                s.checksum,
                s.format,
                s.sparse,
                s.created_ms,
                s.transaction if s.transaction in state.open_transactions else None,
                s.delete_horizon_ms,
            )
            for s in state.segments
        ],
        "producers": dict(state.producers),
        "txns": dict(state.txns),
        "removed": dict(state.removed),
        "open": dict(state.open_transactions),
        "ended": dict(state.ended_transactions),
        "lso": state.last_stable_offset,
        "last_commit_ms": state.last_commit_ms,
    }


def canonical(state: LogState) -> dict[str, Any]:
    if isinstance(state, PartitionState):
        return canonical_partition(state)
    # confirmed_at is bookkeeping (when the state was last known to be the newest), not content.
    out = {k: v for k, v in vars(state).items() if not k.startswith("_") and k != "confirmed_at"}
    if isinstance(state, TopicState) and not state.deleted:
        out.pop("deleted_body")  # the body of a delete matters only while deleted
    if isinstance(state, GroupState):
        out["assignment"] = {m: sorted(p) for m, p in state.assignment.items()}
    return out


def replay_from_zero(log: Log[Any], upto: int) -> list[dict[str, Any]]:
    """The canonical state after each version 0..upto, replayed commit by commit."""
    state = log.state_factory()
    out = []
    for version in range(upto + 1):
        commit = log.read_commit(version)
        assert commit is not None, f"version {version} is missing"
        state = state.copy()
        log._apply_commit(state, version, *commit)
        out.append(canonical(state))
    return out


def roundtrip(state: LogState) -> LogState:
    """state -> checkpoint actions -> encoded file -> replay onto an empty state."""
    payload = encode_commit(state.checkpoint_actions(), {"checkpointVersion": state.version})
    _, actions = decode_commit(payload, "checkpoint")
    fresh = type(state)()
    for name, body in actions:
        fresh.apply(name, body)
    fresh.version = state.version
    fresh.last_commit_ms = state.last_commit_ms
    return fresh


# --- the partition model -----------------------------------------------------------------------


def fake_file(records: int) -> SegmentFile:
    """A segment as the log records it. Replay never opens segment files, so none is written."""
    now = int(time.time() * 1000)
    return SegmentFile(
        path=f"segments/{now:013d}-{uuid.uuid4().hex}.arrow",
        record_count=records,
        min_timestamp_ms=now,
        max_timestamp_ms=now,
        size_bytes=100 * records,
        checksum="crc32c:00000000",
        format="arrow",
        sparse=False,
    )


@dataclass
class ProducerModel:
    pid: str
    epoch: int = 0
    next_seq: int = 0
    last_batch: tuple[int, int, int, int] | None = None  # first seq, last seq, base, last offset
    txn_version: int = 0
    open_txn: int | None = None


@dataclass
class Model:
    partition: Partition
    producers: list[ProducerModel]
    end: int = 0
    apps: dict[str, int] = field(default_factory=dict)


OPS = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 2), st.integers(1, 5)),
    st.tuples(st.just("retry"), st.integers(0, 2), st.just(0)),
    st.tuples(st.just("stale"), st.integers(0, 2), st.just(0)),
    st.tuples(st.just("gap"), st.integers(0, 2), st.just(0)),
    st.tuples(st.just("bump_epoch"), st.integers(0, 2), st.just(0)),
    st.tuples(st.just("zombie"), st.integers(0, 2), st.just(0)),
    st.tuples(st.just("txn_append"), st.integers(0, 2), st.integers(1, 4)),
    st.tuples(st.just("txn_end"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("retention"), st.just(0), st.integers(1, 3)),
    st.tuples(st.just("compact"), st.just(0), st.integers(0, 5)),
    st.tuples(st.just("app_txn"), st.sampled_from(["q1", "q2"]), st.integers(0, 3)),
)


def run_op(model: Model, op: tuple[Any, Any, Any]) -> None:
    part = model.partition
    kind, who, arg = op
    if kind in ("append", "txn_append"):
        p = model.producers[who]
        tag = None
        if kind == "txn_append":
            if p.open_txn is None:
                p.open_txn = p.txn_version
                p.txn_version += 1
            tag = f"{p.pid}:{p.open_txn}"
        batch = ProducerBatch(p.pid, p.epoch, p.next_seq, p.next_seq + arg - 1)
        result = part.commit_segments([fake_file(arg)], producer=batch, transaction=tag)
        # Offsets are assigned at commit, contiguously from the end offset.
        assert not result.duplicate
        assert (result.base_offset, result.last_offset) == (model.end, model.end + arg - 1)
        p.last_batch = (p.next_seq, p.next_seq + arg - 1, result.base_offset, result.last_offset)
        p.next_seq += arg
        model.end += arg
    elif kind == "retry":
        p = model.producers[who]
        if p.last_batch is None:
            return
        first, last, base, last_offset = p.last_batch
        f = fake_file(last - first + 1)
        result = part.commit_segments([f], producer=ProducerBatch(p.pid, p.epoch, first, last))
        assert result.duplicate
        assert (result.base_offset, result.last_offset) == (base, last_offset)
    elif kind == "stale":
        p = model.producers[who]
        if p.next_seq < 2:
            return
        version = part.state().version
        with pytest.raises(DuplicateSequenceError, match="already committed"):
            part.commit_segments(
                [fake_file(1)],
                producer=ProducerBatch(p.pid, p.epoch, p.next_seq - 2, p.next_seq - 2),
            )
        assert part.state().version == version
    elif kind == "gap":
        p = model.producers[who]
        if p.last_batch is None:
            return
        version = part.state().version
        with pytest.raises(OutOfOrderSequenceError, match="does not follow"):
            part.commit_segments(
                [fake_file(1)],
                producer=ProducerBatch(p.pid, p.epoch, p.next_seq + 1, p.next_seq + 1),
            )
        assert part.state().version == version
    elif kind == "bump_epoch":
        p = model.producers[who]
        if p.open_txn is not None:
            return  # a new instance first finishes the open transaction (txn_end)
        p.epoch += 1
        p.next_seq = 0
        p.last_batch = None
    elif kind == "zombie":
        p = model.producers[who]
        entry = part.state().producers.get(p.pid)
        if p.epoch == 0 or entry is None or entry.epoch != p.epoch:
            return  # fenced only once the partition has seen the newer epoch
        version = part.state().version
        with pytest.raises(ProducerFencedError, match="fenced"):
            part.commit_segments([fake_file(1)], producer=ProducerBatch(p.pid, p.epoch - 1, 0, 0))
        assert part.state().version == version
    elif kind == "txn_end":
        p = model.producers[who]
        if p.open_txn is None:
            return
        state = part.state()
        tag = f"{p.pid}:{p.open_txn}"
        before = {s.path for s in state.segments if s.transaction == tag}
        assert part.end_transaction(p.pid, p.epoch, p.open_txn, commit=arg)
        after = part.state()
        assert tag not in after.open_transactions
        live = {s.path for s in after.segments}
        assert before <= live if arg else not (before & live)
        p.open_txn = None
        # The marker's epoch is now the producer's epoch here; sequences go on.
        entry = after.producers[p.pid]
        assert entry.epoch == p.epoch
        if entry.last_sequence == -1:
            p.next_seq, p.last_batch = 0, None
    elif kind == "retention":

        def drop(state: PartitionState) -> list[dict[str, Any]] | None:
            lso = state.last_stable_offset
            victims = [s for s in state.segments[:arg] if s.last_offset < lso]
            if not victims:
                return None
            now = int(time.time() * 1000)
            actions: list[dict[str, Any]] = [
                {"remove": {"path": s.path, "deletionTimestamp": now}} for s in victims
            ]
            actions.append({"logStart": {"offset": victims[-1].last_offset + 1}})
            return actions

        part.commit_actions(drop, operation="RETENTION")
    elif kind == "compact":

        def replace(state: PartitionState) -> list[dict[str, Any]] | None:
            if not state.segments:
                return None
            seg = state.segments[arg % len(state.segments)]
            if seg.transaction in state.open_transactions:
                return None
            kept = max(1, seg.record_count // 2)
            now = int(time.time() * 1000)
            new = Segment(
                f"segments/{now:013d}-{uuid.uuid4().hex}.parquet",
                seg.base_offset,
                seg.last_offset,
                kept,
                seg.min_timestamp_ms,
                seg.max_timestamp_ms,
                seg.size_bytes // 2,
                "crc32c:00000000",
                "parquet",
                True,
                now,
                None,
                now + 1000,
            )
            return [
                {"remove": {"path": seg.path, "deletionTimestamp": now}},
                new.to_action(),
                {"cleaned": {"offset": seg.last_offset + 1}},
            ]

        part.commit_actions(replace, operation="COMPACT")
    elif kind == "app_txn":
        app, version = who, arg
        result = part.commit_segments([fake_file(1)], txn=(app, version))
        if model.apps.get(app, -1) >= version:
            assert result.duplicate  # an exactly-once sink's replayed batch commits nothing
        else:
            assert not result.duplicate
            assert result.base_offset == model.end
            model.end += 1
            model.apps[app] = version
    else:  # pragma: no cover
        raise AssertionError(kind)


def check_offsets(state: PartitionState) -> None:
    segs = state.segments
    for a, b in itertools.pairwise(segs):
        assert a.last_offset < b.base_offset, "segments overlap or are out of order"
    for s in segs:
        if not s.sparse:
            assert s.record_count == s.last_offset - s.base_offset + 1
    if segs:
        assert segs[-1].last_offset < state.end_offset
        assert segs[0].base_offset >= state.log_start_offset
    assert state.log_start_offset <= state.last_stable_offset <= state.end_offset


@SETTINGS
@given(ops=st.lists(OPS, min_size=1, max_size=40), interval=st.integers(2, 5))
def test_partition_replay_from_zero_and_from_checkpoints_agree(
    ops: list[tuple[Any, Any, Any]], interval: int
) -> None:
    storage = Storage(f"memory://kstore-prop-{uuid.uuid4().hex}/s")
    try:
        part = WritablePartition(storage, "t", 0, "topics/t/p/0", checkpoint_interval=interval)
        model = Model(part, [ProducerModel(uuid.uuid4().hex) for _ in range(3)])
        for op in ops:
            run_op(model, op)
            check_offsets(part.state())
        writer_state = part.state()
        assert writer_state.end_offset == model.end
        newest = writer_state.version
        if newest < 0:
            return
        history = replay_from_zero(part.log, newest)
        # The writer's own state, replay from version 0, and a fresh load from the newest
        # checkpoint (plus the commits after it) agree.
        assert canonical(writer_state) == history[-1]
        fresh = Partition(storage, "t", 0, "topics/t/p/0", checkpoint_interval=interval)
        assert canonical(fresh.state()) == history[-1]
        # Time travel: every version, rebuilt from the checkpoint at or below it.
        for version in range(newest + 1):
            assert canonical(part.log.load_version(version)) == history[version], version
        # And every state's own checkpoint replays to it.
        for version in range(newest + 1):
            state = part.log.load_version(version)
            assert canonical(roundtrip(state)) == history[version]
        # Offsets of each version grow and are never reused.
        ends = [h["end"] for h in history]
        assert ends == sorted(ends)
        starts = [h["start"] for h in history]
        assert starts == sorted(starts)
    finally:
        if storage.fs.exists(storage.full_path("")):
            storage.fs.rm(storage.full_path(""), recursive=True)


def test_an_abort_marker_of_a_newer_epoch_keeps_a_committed_transaction() -> None:
    """Regression: end_transaction(abort) removed every segment still tagged with the
    transaction, and a replay from version 0 keeps the tag on segments of *ended*
    transactions: an abort marker from a newer epoch (a successor finishing the same version)
    removed records that were already committed, unlike on a state loaded from a checkpoint."""
    storage = Storage(f"memory://kstore-prop-{uuid.uuid4().hex}/s")
    part = WritablePartition(storage, "t", 0, "topics/t/p/0")
    pid = uuid.uuid4().hex
    part.commit_segments(
        [fake_file(2)], producer=ProducerBatch(pid, 0, 0, 1), transaction=f"{pid}:0"
    )
    assert part.end_transaction(pid, 0, 0, commit=True)
    committed = [s.path for s in part.state().segments]
    fresh = WritablePartition(storage, "t", 0, "topics/t/p/0")  # replays from version 0
    fresh.end_transaction(pid, 1, 0, commit=False)  # fences epoch 0; must not undo the commit
    assert [s.path for s in fresh.state().segments] == committed
    assert fresh.state().end_offset == 2
    assert fresh.state().producers[pid].epoch == 1


# --- checkpoint round trips of every state kind -----------------------------------------------

NAMES = st.text("abcxyz-._0123456789", min_size=1, max_size=6)
TPS = st.tuples(st.sampled_from(["t", "u", "v.w"]), st.integers(0, 4))


@st.composite
def group_actions(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    members = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    actions: list[tuple[str, dict[str, Any]]] = []
    generation = 0
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(
            st.sampled_from(
                ["join", "leave", "assignment", "offsets", "release", "txnFence", "delete", "x"]
            )
        )
        member = draw(st.sampled_from(members))
        when = draw(st.integers(0, 10**12))
        if kind == "join":
            actions.append(
                (
                    "join",
                    {
                        "memberId": member,
                        "instanceId": draw(st.one_of(st.none(), st.sampled_from(["i1", "i2"]))),
                        "clientId": "c",
                        "topics": draw(st.lists(st.sampled_from(["t", "u"]), unique=True)),
                        "assignors": ["sticky", "range"],
                        "sessionTimeoutMs": 10_000,
                        "rebalanceTimeoutMs": 60_000,
                        "time": when,
                    },
                )
            )
        elif kind == "leave":
            actions.append(("leave", {"memberId": member, "reason": "r", "time": when}))
        elif kind == "assignment":
            generation += 1
            owners = draw(st.dictionaries(TPS, st.sampled_from(members), max_size=6))
            by_member: dict[str, list[list[Any]]] = {}
            for (t, p), m in sorted(owners.items()):
                by_member.setdefault(m, []).append([t, p])
            actions.append(
                (
                    "assignment",
                    {
                        "generation": generation,
                        "assignor": "sticky",
                        "members": by_member,
                        "partitions": {"t": 5, "u": 5},
                        "subscriptions": {m: ["t"] for m in by_member},
                    },
                )
            )
        elif kind == "offsets":
            items = [
                {"topic": t, "partition": p, "offset": o, "metadata": md}
                for (t, p), (o, md) in draw(
                    st.dictionaries(
                        TPS,
                        st.tuples(st.integers(0, 10**6), st.sampled_from(["", "m", "reset"])),
                        max_size=4,
                    )
                ).items()
            ]
            body: dict[str, Any] = {
                "memberId": member,
                "generation": generation,
                "time": when,
                "offsets": items,
            }
            if draw(st.booleans()):
                body["transaction"] = {
                    "id": draw(st.sampled_from(["app1", "app2"])),
                    "version": draw(st.integers(0, 5)),
                    "epoch": draw(st.integers(0, 3)),
                }
            actions.append(("offsets", body))
        elif kind == "release":
            parts = draw(st.lists(TPS, max_size=3))
            actions.append(
                ("release", {"memberId": member, "partitions": [list(p) for p in parts]})
            )
        elif kind == "txnFence":
            actions.append(
                ("txnFence", {"id": draw(st.sampled_from(["app1", "app3"])), "epoch": when % 7})
            )
        elif kind == "delete":
            actions.append(("deleteGroup", {"time": when}))
        else:
            actions.append(("futureAction", {"x": 1}))  # unknown: ignored by replay
    return actions


@SETTINGS
@given(actions=group_actions())
def test_group_state_checkpoint_round_trip(actions: list[tuple[str, dict[str, Any]]]) -> None:
    state = GroupState()
    for version, (name, body) in enumerate(actions):
        state = state.copy()
        state.apply(name, body)
        state.version = version
        assert canonical(roundtrip(state)) == canonical(state), (version, name)


@st.composite
def producer_log_actions(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    actions: list[tuple[str, dict[str, Any]]] = []
    epoch, version, open_version = -1, -1, None
    for _ in range(draw(st.integers(1, 20))):
        kind = draw(st.sampled_from(["epoch", "partitions", "decision", "complete"]))
        if kind == "epoch" or epoch < 0:
            epoch += 1
            actions.append(
                (
                    "producerEpoch",
                    {
                        "transactionalId": "app",
                        "producerId": "ab" * 16,
                        "epoch": epoch,
                        "transactionTimeoutMs": draw(st.integers(1, 10**6)),
                    },
                )
            )
        elif kind == "partitions":
            if open_version is None:
                version += 1
                open_version = version
            actions.append(
                (
                    "txnPartitions",
                    {
                        "version": open_version,
                        "epoch": epoch,
                        "time": draw(st.integers(0, 10**12)),
                        "group": draw(st.one_of(st.none(), st.sampled_from(["g1", "g2"]))),
                        "partitions": [list(p) for p in draw(st.lists(TPS, max_size=3))],
                    },
                )
            )
        elif kind == "decision" and open_version is not None:
            actions.append(
                (
                    "txnDecision",
                    {
                        "version": open_version,
                        "epoch": epoch,
                        "result": draw(st.sampled_from(["commit", "abort"])),
                    },
                )
            )
        elif kind == "complete":
            done = open_version if open_version is not None else version + 1
            version = max(version, done)
            actions.append(("txnComplete", {"version": done, "epoch": epoch, "result": "empty"}))
            open_version = None
    return actions


@SETTINGS
@given(actions=producer_log_actions())
def test_producer_identity_checkpoint_round_trip(
    actions: list[tuple[str, dict[str, Any]]],
) -> None:
    state = TransactionLogState()
    for version, (name, body) in enumerate(actions):
        state = state.copy()  # type: ignore[assignment]
        state.apply(name, body)
        state.version = version
        assert canonical(roundtrip(state)) == canonical(state), (version, name)


@st.composite
def topic_log_actions(draw: st.DrawFn) -> list[tuple[str, dict[str, Any]]]:
    actions: list[tuple[str, dict[str, Any]]] = []
    partitions = 1
    for _ in range(draw(st.integers(1, 10))):
        if draw(st.integers(0, 4)) == 0:
            actions.append(("delete", {"time": draw(st.integers(0, 10**12)), "id": "x"}))
            partitions = 1
            continue
        partitions = max(partitions, draw(st.integers(1, 8)))
        body: dict[str, Any] = {
            "name": "t",
            "id": draw(st.sampled_from(["a" * 32, "b" * 32])),
            "partitions": partitions,
            "config": draw(
                st.dictionaries(
                    st.sampled_from(["retention.ms", "cleanup.policy", "segment.bytes"]),
                    st.one_of(st.integers(1, 10**9), st.sampled_from(["delete", "compact"])),
                    max_size=3,
                )
            ),
            "createdTime": draw(st.integers(0, 10**12)),
        }
        if draw(st.booleans()):
            body["futureField"] = {"kept": True}  # unknown fields are carried forward
        actions.append(("metaData", body))
    return actions


@SETTINGS
@given(actions=topic_log_actions())
def test_topic_state_checkpoint_round_trip(actions: list[tuple[str, dict[str, Any]]]) -> None:
    state = TopicState()
    for version, (name, body) in enumerate(actions):
        state = state.copy()  # type: ignore[assignment]
        state.apply(name, body)
        state.version = version
        again = roundtrip(state)
        assert canonical(again) == canonical(state), (version, name)
        assert again.to_metadata() == state.to_metadata()  # type: ignore[attr-defined]


@SETTINGS
@given(
    segments=st.lists(
        st.tuples(st.integers(1, 50), st.booleans(), st.one_of(st.none(), st.integers(0, 10**12))),
        min_size=0,
        max_size=12,
    ),
    producers=st.dictionaries(
        st.text("0123456789abcdef", min_size=32, max_size=32),
        st.tuples(st.integers(0, 5), st.integers(0, 1000), st.integers(0, 10)),
        max_size=4,
    ),
    apps=st.dictionaries(NAMES, st.integers(0, 10**6), max_size=3),
    removed=st.dictionaries(NAMES, st.integers(0, 10**12), max_size=3),
    gap=st.integers(0, 3),
)
def test_partition_state_checkpoint_round_trip(
    segments: list[tuple[int, bool, int | None]],
    producers: dict[str, tuple[int, int, int]],
    apps: dict[str, int],
    removed: dict[str, int],
    gap: int,
) -> None:
    now = 1_700_000_000_000
    state = PartitionState()
    state.apply("protocol", {"minReaderVersion": 1, "minWriterVersion": 1})
    offset = 0
    for i, (records, sparse, horizon) in enumerate(segments):
        span = records + (gap if sparse else 0)
        seg = Segment(
            f"segments/{i:013d}-{'0' * 32}.{'parquet' if sparse else 'arrow'}",
            offset,
            offset + span - 1,
            records,
            now + i,
            now + i + 5,
            records * 10,
            "crc32c:00000000",
            "parquet" if sparse else "arrow",
            sparse,
            now,
            f"{'c' * 32}:{i}" if i % 3 == 2 else None,
            horizon,
        )
        ((name, body),) = seg.to_action().items()
        state.apply(name, body)
        offset += span
    if segments:
        state.apply("logStart", {"offset": state.segments[0].base_offset + 1})
        state.apply("cleaned", {"offset": state.segments[0].last_offset + 1})
    state.apply("endOffset", {"offset": offset + gap})
    for pid, (epoch, seq, n) in producers.items():
        state.apply(
            "producer",
            {
                "id": pid,
                "epoch": epoch,
                "firstSequence": seq,
                "lastSequence": seq + n,
                "baseOffset": 0,
                "lastOffset": n,
                "timestamp": now,
            },
        )
    for app, version in apps.items():
        state.apply("txn", {"appId": app, "version": version})
    for path, when in removed.items():
        state.apply("tombstone", {"path": f"segments/{path}", "deletionTimestamp": when})
    state.version = 7
    state.last_commit_ms = now
    assert canonical(roundtrip(state)) == canonical(state)


def test_a_checkpoint_file_is_what_replay_reads() -> None:
    """The checkpoint written by the log (not just its actions) loads to the same state."""
    storage = Storage(f"memory://kstore-prop-{uuid.uuid4().hex}/s")
    part = WritablePartition(storage, "t", 0, "topics/t/p/0", checkpoint_interval=2)
    pid = uuid.uuid4().hex
    for i in range(5):
        part.commit_segments([fake_file(2)], producer=ProducerBatch(pid, 0, 2 * i, 2 * i + 1))
    assert storage.read(f"{part.log.directory}/_last_checkpoint") == b'{"version": 4}'
    assert storage.exists(f"{part.log.directory}/{version_file(4)}")
    history = replay_from_zero(part.log, 4)
    assert canonical(part.log._read_checkpoint(4)) == history[4]  # type: ignore[arg-type]


# --- the JSON of log lines -------------------------------------------------------------------

_JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)  # past 64 bits too
    | st.text(max_size=12)  # any code point: non-ASCII, controls, lone surrogates, U+2028
    | st.floats(allow_nan=False, allow_infinity=False)
)
_JSON_VALUES = st.recursive(
    _JSON_SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        # integer keys, which json writes as strings
        | st.dictionaries(st.integers(-5, 5), inner, min_size=1, max_size=2)
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_JSON_VALUES)
def test_a_log_line_is_what_the_standard_encoder_writes(value: Any) -> None:
    """Log lines are encoded by orjson where it writes json's text: the same text as json.dumps
    with compact separators (ASCII, every non-ASCII character escaped, integers exact at any
    size), except a float's exponent (``1e-7`` against ``1e-07``, the same number)."""
    line = compact_json(value)
    standard = json.dumps(value, separators=(",", ":"))
    assert line.isascii()
    assert json.loads(line) == json.loads(standard)
    if not _has_float(value):
        assert line == standard


def _has_float(value: Any) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    return False


# --- a delivery split by partition -----------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(0, 5),  # partition
            st.none() | st.binary(max_size=3),  # key
            st.none() | st.lists(st.tuples(st.text(max_size=2), st.binary(max_size=2)), max_size=2),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(1, 4),  # chunks
    st.booleans(),  # a table the sender built (compact), or one a user gave (a slice)
)
def test_a_delivery_splits_into_each_partitions_records_in_send_order(
    records: list[tuple[int, bytes | None, list[tuple[str, bytes]] | None]],
    chunks: int,
    built: bool,
) -> None:
    """The sender's split of a delivery by partition (one or several chunks, a merged
    delivery's): each partition gets exactly its records, in the order they were sent, keys
    and headers with them, whether the delivery is in partition order already or not; and
    each partition's table holds its records alone, even when the delivery is a slice of a
    larger table whose headers are ``pa.nulls`` (an IPC message of such a slice would carry
    the whole table's buffers)."""
    import numpy as np
    import pyarrow as pa

    from kstore.accumulator import by_partition
    from kstore.segments import BINARY, null_headers

    schema = BINARY.record_schema
    rows = [
        {
            "key": key,
            "value": b"%d" % i,
            "timestamp": i,
            "headers": None if headers is None else [{"key": k, "value": v} for k, v in headers],
        }
        for i, (_, key, headers) in enumerate(records)
    ]
    size = -(-len(rows) // chunks)
    batches = [
        pa.RecordBatch.from_pylist(rows[i : i + size], schema=schema)
        for i in range(0, len(rows), size)
    ]
    no_headers = all(r["headers"] is None for r in rows)
    if not built:  # a user's table: each chunk a slice of a much larger one
        pad = pa.RecordBatch.from_pylist([{"value": b"x"}] * 500, schema=schema)
        batches = [
            pa.concat_batches([pad, b, pad]).slice(pad.num_rows, b.num_rows) for b in batches
        ]
    if no_headers:  # as a sender builds them, or as pa.nulls makes them (a user's)
        batches = [
            b.set_column(
                3,
                "headers",
                null_headers(b.num_rows)
                if built
                else pa.nulls(b.num_rows + 1000, schema.field("headers").type).slice(
                    500, b.num_rows
                ),
            )
            for b in batches
        ]
    table = pa.Table.from_batches(batches, schema=schema)
    sent = table.to_pylist()
    parts = np.array([p for p, _, _ in records], np.int32)
    pieces = by_partition(table, parts, 6, compact=built)
    assert sorted(pieces) == sorted(set(parts.tolist()))
    for p, piece in pieces.items():
        assert piece.schema == schema
        mine = [row for row, q in zip(sent, parts, strict=True) if q == p]
        assert piece.to_pylist() == mine
        for batch in piece.to_batches():
            # As many bytes as the same records built afresh, give or take buffer padding.
            fresh = pa.RecordBatch.from_pylist(batch.to_pylist(), schema=schema)
            buffers = sum(len(column.buffers()) for column in batch.columns)
            assert batch.serialize().size <= fresh.serialize().size + 16 * buffers


def test_null_headers_of_any_length_from_many_threads_hold_nothing_else() -> None:
    """null_headers is shared by the sender thread and send_batch() callers: each gets exactly
    the length it asked for, all null, with no children's buffers, while others grow it."""
    import threading

    import pyarrow as pa

    from kstore.segments import HEADERS_TYPE, null_headers

    lengths = [1, 5000, 3, 70_000, 1024, 200_000, 17, 4096] * 4
    results: dict[int, tuple[int, int, int]] = {}

    def take(i: int, n: int) -> None:
        a = null_headers(n)
        results[i] = (len(a), a.null_count, len(a.values))

    threads = [threading.Thread(target=take, args=(i, n)) for i, n in enumerate(lengths)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(lengths))] == [(n, n, 0) for n in lengths]
    one = null_headers(3)
    assert one.type == HEADERS_TYPE
    one.validate(full=True)
    size = pa.RecordBatch.from_arrays([null_headers(1000)], names=["h"]).serialize().size
    assert (
        size
        < pa.RecordBatch.from_arrays([pa.nulls(1000, HEADERS_TYPE)], names=["h"]).serialize().size
    )
