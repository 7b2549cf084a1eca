"""Compaction and segment merging (kstore.compaction), run in this process (spark=None): the
rules, on local disk and the essential ones on SeaweedFS. The same functions run in Spark
tasks in tests/test_jobs_spark.py."""

from __future__ import annotations

import random
from typing import Any

import kstore.compaction.cleaner as cleaner
import kstore.compaction.jobs as jobs
import kstore.compaction.merger as merger
import pytest
from kstore.compaction import merge_segments, plan_compaction, run_compaction
from kstore.compaction.cleaner import delete_horizon
from kstore.compaction.jobs import MAX_UNCOMMITTED_MS
from kstore.retention import MIN_ORPHAN_AGE_MS, run_retention

from kstore.consumer import Consumer
from kstore.records import TopicPartition
from kstore.segments import write_segment
from tests.commit_logs_extra import open_target, target_params
from tests.test_jobs_support import (
    BACKENDS,
    Target,
    append,
    latest_per_key,
    now_ms,
    open_store,
    rows,
    segment_files,
    table,
)

COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0}


def fill(
    part: Any, rng: random.Random, segments: int, per_segment: int, keys: int, ts: int
) -> None:
    """Random keys (some null), some tombstones (null values)."""
    for s in range(segments):
        ks, vs = [], []
        for i in range(per_segment):
            k = None if rng.random() < 0.05 else b"key-%d" % rng.randrange(keys)
            ks.append(k)
            vs.append(None if rng.random() < 0.1 else b"value-%d-%d" % (s, i))
        append(part, ks, vs, ts)


@pytest.mark.parametrize("target", target_params(BACKENDS))
def test_every_key_keeps_its_latest_record_at_its_offset(
    target: tuple[str, int], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two partitions: in one topic log, or (commit.logs 3) each in its own."""
    where: Target = open_target(request, monkeypatch, target)
    store = open_store(where)
    store.create_topic("users", 2, COMPACT)
    rng = random.Random(7)
    before = {}
    for p in range(2):
        part = store.partition("users", p)
        fill(part, rng, segments=12, per_segment=40, keys=60, ts=now_ms() - 3_600_000)
        before[p] = rows(part)
    logs = store.topic_logs("users")
    assert len(logs) == min(target[1], 2)
    versions = [log.state().version for log in logs]
    summary = run_compaction(None, *where, verbose=False)
    assert summary.count("committed") == 2
    assert not summary.errors
    # Each partition's rewrite is committed to its own topic log, and only there.
    grown = [log.state().version - v for log, v in zip(logs, versions, strict=True)]
    assert sum(grown) == sum(row.commits for row in summary.partitions)
    assert all(grown), grown
    assert summary.records_dropped == sum(
        len(before[p]) - len(latest_per_key(before[p])) for p in range(2)
    )
    for p in range(2):
        part = store.partition("users", p)
        state = part.state()
        assert state.cleaned_offset == state.end_offset == 480
        # Below the cleaned point: exactly the latest record of each key (tombstones too, as
        # delete.retention.ms has not passed), every null-key record, at the original offsets.
        assert rows(part) == latest_per_key(before[p])
        assert all(s.format == "parquet" and s.sparse for s in state.segments)
        # A consumer skips the gaps and reads the same.
        consumer = Consumer(store=store, auto_offset_reset="earliest")
        consumer.assign([TopicPartition("users", p)])
        seen: list[tuple[int, bytes | None, bytes | None]] = []
        while batch := consumer.poll(timeout_ms=100, max_records=1000):
            seen.extend((r.offset, r.key, r.value) for rs in batch.values() for r in rs)
        consumer.close()
        assert seen == latest_per_key(before[p])
    # A second run finds nothing dirty.
    again = run_compaction(None, *where, verbose=False)
    assert again.count("committed") == 0
    assert again.count("skipped") == 2


@pytest.mark.parametrize("target", BACKENDS)
def test_tombstones_survive_delete_retention_then_go(
    target: str, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    retention = 60_000
    store.create_topic("t", 1, {**COMPACT, "delete.retention.ms": retention})
    part = store.partition("t", 0)
    t0 = now_ms()
    append(part, [b"a", b"b", b"c", b"a"], [b"1", b"2", b"3", None], t0 - 1000)
    run_compaction(None, *where, verbose=False, now_ms=t0)
    expected = [(1, b"b", b"2"), (2, b"c", b"3"), (3, b"a", None)]
    assert rows(part) == expected
    horizon = delete_horizon(t0, retention)
    assert horizon >= t0 + retention
    assert part.state().segments[0].delete_horizon_ms == horizon
    # Before the horizon: nothing to clean, the tombstone stays.
    early = run_compaction(None, *where, verbose=False, now_ms=horizon - 1)
    assert early.count("skipped") == 1
    assert rows(part) == expected
    # A later tombstone, seen by a later cleaning, gets its own (later) horizon.
    append(part, [b"b"], [None], t0)
    run_compaction(None, *where, verbose=False, now_ms=t0 + 30_000)
    assert rows(part) == [(2, b"c", b"3"), (3, b"a", None), (4, b"b", None)]
    # After the first horizon only the first tombstone goes; the second waits for its own.
    run_compaction(None, *where, verbose=False, now_ms=horizon)
    assert rows(part) == [(2, b"c", b"3"), (4, b"b", None)]
    second = delete_horizon(t0 + 30_000, retention)
    run_compaction(None, *where, verbose=False, now_ms=second - 1)
    assert rows(part) == [(2, b"c", b"3"), (4, b"b", None)]
    run_compaction(None, *where, verbose=False, now_ms=second)
    assert rows(part) == [(2, b"c", b"3")]
    state = part.state()
    assert state.end_offset == 5
    assert state.cleaned_offset == 5


def test_head_younger_than_min_compaction_lag_stays(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("t", 1, {**COMPACT, "min.compaction.lag.ms": 600_000})
    part = store.partition("t", 0)
    now = now_ms()
    append(part, [b"k", b"k"], [b"old-1", b"old-2"], now - 3_600_000)
    append(part, [b"k", b"k"], [b"new-1", b"new-2"], now - 1_000)  # in the head
    run_compaction(None, *local_store, verbose=False, now_ms=now)
    state = part.state()
    assert state.cleaned_offset == 2
    assert rows(part) == [(1, b"k", b"old-2"), (2, b"k", b"new-1"), (3, b"k", b"new-2")]
    assert [s.format for s in state.segments] == ["parquet", "arrow"]


def test_dirty_ratio_and_max_compaction_lag(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic(
        "t",
        1,
        {
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": 0.9,
            "max.compaction.lag.ms": 600_000,
        },
    )
    part = store.partition("t", 0)
    now = now_ms()
    append(part, [b"k%d" % (i % 50) for i in range(500)], [b"v" * 50] * 500, now)
    first = run_compaction(None, *local_store, verbose=False, now_ms=now)
    assert first.count("committed") == 1  # all dirty: ratio 1.0
    append(part, [b"k1"], [b"new"], now)
    plan = plan_compaction(part.state(), store.topic("t").effective_config, now)
    assert isinstance(plan, str)
    assert "below min.cleanable.dirty.ratio" in plan
    skipped = run_compaction(None, *local_store, verbose=False, now_ms=now)
    assert skipped.count("skipped") == 1
    assert "min.cleanable.dirty.ratio" in skipped.partitions[0].reason
    # max.compaction.lag.ms: a dirty record older than it forces a cleaning.
    forced = run_compaction(None, *local_store, verbose=False, now_ms=now + 600_001)
    assert forced.count("committed") == 1
    assert "max.compaction.lag.ms" in forced.partitions[0].reason
    assert rows(part)[-1] == (500, b"k1", b"new")
    assert len(rows(part)) == 50


def test_an_incremental_run_rewrites_only_superseded_clean_segments(local_store: Target) -> None:
    store = open_store(local_store)
    # A small segment.bytes: every source segment is its own group, so its own output.
    store.create_topic("t", 1, {**COMPACT, "segment.bytes": 1000})
    part = store.partition("t", 0)
    now = now_ms()
    for s in range(10):
        append(part, [b"s%d-k%d" % (s, i) for i in range(20)], [b"v0"] * 20, now - 10_000)
    run_compaction(None, *local_store, verbose=False, now_ms=now)
    clean = {s.path for s in part.state().segments}
    assert len(clean) == 10
    # New records: one supersedes a key of segment 3, the others are new keys.
    append(part, [b"s3-k5", b"new-1", b"new-2"], [b"v1", b"v1", b"v1"], now - 10_000)
    summary = run_compaction(None, *local_store, verbose=False, now_ms=now)
    result = summary.partitions[0]
    assert result.segments_removed == 2  # clean segment 3, and the dirty one
    after = part.state()
    assert len(clean - {s.path for s in after.segments}) == 1  # nine clean segments untouched
    # Read as a list, not a dict by key: a superseded record left beside its successor would
    # collapse away in a dict.
    listed = rows(part)
    assert [k for _, k, _ in listed].count(b"s3-k5") == 1
    assert len(listed) == len({k for _, k, _ in listed}) == 202
    assert (200, b"s3-k5", b"v1") in listed  # the latest, at its own offset
    assert (201, b"new-1", b"v1") in listed
    assert [o for o, _, _ in listed] == sorted(o for o, _, _ in listed)
    # Only new keys: no clean segment is rewritten at all.
    before = {s.path for s in part.state().segments}
    append(part, [b"new-3"], [b"v2"], now - 10_000)
    third = run_compaction(None, *local_store, verbose=False, now_ms=now).partitions[0]
    assert third.segments_removed == 1  # the dirty segment only
    assert before <= {s.path for s in part.state().segments}
    assert rows(part) == [*listed, (203, b"new-3", b"v2")]


def test_null_keys_are_never_dropped(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("t", 1, COMPACT)
    part = store.partition("t", 0)
    append(part, [None, b"k", None, b"k", None], [b"n1", b"a", None, b"b", b"n3"], now_ms())
    run_compaction(None, *local_store, verbose=False)
    assert rows(part) == [(0, None, b"n1"), (2, None, None), (3, b"k", b"b"), (4, None, b"n3")]


def test_compaction_and_merging_stop_at_an_open_transaction(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("t", 1, {**COMPACT, "segment.bytes": 1 << 20})
    part = store.partition("t", 0)
    now = now_ms()
    append(part, [b"k", b"k"], [b"1", b"2"], now)
    open_txn = part.write_segment(table([b"k"], [b"txn"], now))
    part.commit_segments([open_txn], transaction="p:0", durable=False)
    append(part, [b"k", b"k"], [b"3", b"4"], now)
    assert part.state().last_stable_offset == 2
    run_compaction(None, *local_store, verbose=False)
    merge_segments(None, *local_store, verbose=False)
    state = part.state()
    assert state.cleaned_offset == 2
    assert [(s.base_offset, s.last_offset, s.format) for s in state.segments] == [
        (0, 1, "parquet"),
        (2, 2, "arrow"),
        (3, 4, "arrow"),
    ]
    part.end_transaction("p", 0, 0, commit=True)
    run_compaction(None, *local_store, verbose=False)
    assert rows(part) == [(4, b"k", b"4")]


def test_a_concurrent_maintenance_commit_wins_cleanly(
    local_store: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retention removes segments while compaction is writing: compaction's commit sees it,
    commits nothing, deletes its new file and reports a conflict; nothing is lost."""
    store = open_store(local_store)
    store.create_topic("t", 1, {**COMPACT, "cleanup.policy": "compact,delete"})
    part = store.partition("t", 0)
    append(part, [b"a", b"a"], [b"1", b"2"], now_ms())
    append(part, [b"b", b"b"], [b"3", b"4"], now_ms())
    # Room for one segment: retention removes the first.
    store.alter_topic_config("t", {"retention.bytes": part.state().segments[1].size_bytes})
    real = write_segment

    def write_then_race(*args: Any, **kwargs: Any) -> Any:
        written = real(*args, **kwargs)
        run_retention(None, *local_store, verbose=False)  # removes the first segment
        return written

    monkeypatch.setattr(cleaner, "write_segment", write_then_race)
    summary = run_compaction(None, *local_store, verbose=False)
    assert summary.count("conflict") == 1
    assert not summary.errors
    state = part.state()
    assert state.cleaned_offset == 0
    assert state.log_start_offset == 2
    assert rows(part) == [(2, b"b", b"3"), (3, b"b", b"4")]
    # The abandoned output is gone: storage holds the live segment and the removed one only.
    assert {f"segments/{n}" for n in segment_files(store, part)} == {
        s.path for s in state.segments
    } | set(state.removed)
    monkeypatch.setattr(cleaner, "write_segment", real)
    assert run_compaction(None, *local_store, verbose=False).count("committed") == 1
    assert rows(part) == [(3, b"b", b"4")]


def test_producer_appends_never_conflict_with_a_rewrite(
    local_store: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(local_store)
    store.create_topic("t", 1, COMPACT)
    part = store.partition("t", 0)
    append(part, [b"a", b"a"], [b"1", b"2"], now_ms())
    real = write_segment

    def write_then_append(*args: Any, **kwargs: Any) -> Any:
        written = real(*args, **kwargs)
        append(part, [b"a"], [b"later"], now_ms())  # lands between the write and the commit
        return written

    monkeypatch.setattr(cleaner, "write_segment", write_then_append)
    summary = run_compaction(None, *local_store, verbose=False)
    assert summary.count("committed") == 1
    assert rows(part) == [(1, b"a", b"2"), (2, b"a", b"later")]
    monkeypatch.setattr(cleaner, "write_segment", write_segment)
    store.create_topic("logs", 1)
    part = store.partition("logs", 0)
    append(part, [b"a"], [b"1"], now_ms())
    append(part, [b"a"], [b"2"], now_ms())
    monkeypatch.setattr(merger, "write_segment", write_then_append)
    assert merge_segments(None, *local_store, ["logs"], verbose=False).count("committed") == 1
    assert rows(part) == [(0, b"a", b"1"), (1, b"a", b"2"), (2, b"a", b"later")]
    assert [s.format for s in part.state().segments] == ["parquet", "arrow"]


def test_a_rewrite_whose_files_are_too_old_is_abandoned(
    local_store: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A maintenance commit must land within MAX_UNCOMMITTED_MS of writing its files, or vacuum
    could take them for orphans; past that it gives up and deletes them."""
    store = open_store(local_store)
    store.create_topic("t", 1, COMPACT)
    part = store.partition("t", 0)
    append(part, [b"a", b"a"], [b"1", b"2"], now_ms())
    assert MAX_UNCOMMITTED_MS < MIN_ORPHAN_AGE_MS
    # As if writing the new segment had taken longer than the limit.
    monkeypatch.setattr(jobs, "MAX_UNCOMMITTED_MS", -60_000)
    summary = run_compaction(None, *local_store, verbose=False)
    monkeypatch.undo()
    assert summary.count("conflict") == 1
    state = part.state()
    assert len(segment_files(store, part)) == 1
    assert state.segments[0].format == "arrow"


@pytest.mark.parametrize("target", BACKENDS)
def test_merging_keeps_every_record_and_offset(target: str, request: pytest.FixtureRequest) -> None:
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("logs", 1, {"segment.bytes": 12_000})
    part = store.partition("logs", 0)
    now = now_ms()
    rng = random.Random(3)
    for _ in range(30):
        # Incompressible values, so that Parquet output sizes track Arrow input sizes.
        append(part, [b"k%d" % i for i in range(10)], [rng.randbytes(100) for _ in range(10)], now)
    before = rows(part)
    small = part.state().segments[0].size_bytes
    summary = merge_segments(None, *where, verbose=False)
    state = part.state()
    assert summary.count("committed") == 1
    assert summary.segments_removed == 30
    assert rows(part) == before
    assert len(state.segments) < 30 // 3
    assert all(s.size_bytes <= 12_000 + small for s in state.segments if s.format == "parquet")
    # Tiered: one more small segment does not rewrite the merged ones.
    merged = {s.path for s in state.segments}
    append(part, [b"x"], [b"y"], now)
    merge_segments(None, *where, verbose=False)
    assert merged <= {s.path for s in part.state().segments}
    assert rows(part) == [*before, (300, b"x", b"y")]


def test_merge_plan_is_tiered() -> None:
    from kstore.partition import PartitionState, Segment

    def seg(i: int, size: int) -> Segment:
        return Segment(f"segments/{i}", i, i, 1, 0, 0, size, "crc32c:0", "arrow", False, 0)

    state = PartitionState()
    state.segments = [
        seg(0, 600),
        seg(1, 100),
        seg(2, 100),
        seg(3, 100),
        seg(4, 2000),
        seg(5, 10),
        seg(6, 10),
    ]
    state.end_offset = 7
    groups = merger.plan_merge(state, {"segment.bytes": 1000})
    # 600 dominates [600,100,100,100]; 2000 is over the target; the tiny ones merge.
    assert [[s.base_offset for s in g] for g in groups] == [[1, 2, 3], [5, 6]]


def test_dry_runs_change_nothing(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("t", 1, COMPACT)
    part = store.partition("t", 0)
    for _ in range(3):
        append(part, [b"a", b"a"], [b"1", b"2"], now_ms())
    version, files = part.state().version, segment_files(store, part)
    compaction = run_compaction(None, *local_store, verbose=False, dry_run=True)
    merge = merge_segments(None, *local_store, verbose=False, dry_run=True)
    assert compaction.count("dry-run") == 1
    assert merge.count("dry-run") == 1
    assert part.state().version == version
    assert segment_files(store, part) == files


def test_a_withdrawn_newer_record_keeps_the_older_one(
    local_store: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (torture seed 663744393): compaction planned on a state in which a late
    commit's record was a key's newest; the commit was then withdrawn (PROTOCOL.md 23.2), and
    compaction still dropped the older record, the key's newest left: an acknowledged record
    lost. A group now commits only while every dirty segment that decided what it drops is
    live; otherwise the run is a conflict and the next one plans again."""
    store = open_store(local_store)
    store.create_topic("t", 1, COMPACT)
    part = store.partition("t", 0)
    append(part, [b"k9"], [b"acknowledged"], now_ms())
    append(part, [b"k9"], [b"withdrawn"], now_ms())
    older, newer = part.state().segments
    real_groups, real_replace = cleaner._groups, cleaner.replace_segments
    # One group per segment, as segment.bytes makes them in a larger partition.
    monkeypatch.setattr(cleaner, "_groups", lambda segs, *a, **k: [[s] for s in segs])
    withdrawn = []

    def withdraw_then_replace(*args: Any, **kwargs: Any) -> bool:
        if not withdrawn:
            part.commit_actions(
                lambda state: [{"remove": {"path": newer.path, "deletionTimestamp": now_ms()}}],
                operation="WITHDRAW",
            )
            withdrawn.append(newer.path)
        return bool(real_replace(*args, **kwargs))

    monkeypatch.setattr(cleaner, "replace_segments", withdraw_then_replace)
    summary = run_compaction(None, *local_store, verbose=False)
    assert summary.count("conflict") == 1
    assert rows(part) == [(older.base_offset, b"k9", b"acknowledged")]
    monkeypatch.setattr(cleaner, "_groups", real_groups)
    monkeypatch.setattr(cleaner, "replace_segments", real_replace)
    run_compaction(None, *local_store, verbose=False)
    assert rows(part) == [(older.base_offset, b"k9", b"acknowledged")]
