"""Issue 45: tests for bugs that a review planted one at a time in the layout-3 paths of
maintenance and checkpoints, and that no test noticed. Each test here fails with its bug put
back (the docstrings say which):

1. the sidecar horizon of writer version 5 off by one, either way (PROTOCOL.md 13.4, 22.5
   layout-3 step 2.4);
2. vacuum's refresh after its listing (22.5 layout-3 step 3) no longer sparing a file that a
   commit made live meanwhile;
3. a transaction marker's epoch no longer fencing older epochs of its producer in a partition
   of a topic log (9.2, 18.6);
4. the merge's shared rewrite of a topic log's ranges (22.4) handing a partition another
   partition's range, which its error, swallowed, hid (each partition's own merge redid the
   work).

Every test runs with one topic log (``commit.logs`` 1) and with three (partitions of one topic
log are then not adjacent)."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import time
import uuid
from typing import Any

import pyarrow as pa
import pytest
from kstore.compaction import merge_segments, merger
from kstore.retention import vacuum

from kstore import Producer, ProducerFencedError, Store
from kstore.errors import StorageError
from kstore.layout import topic_data_dir
from kstore.log import Action, checkpoint_file, decode_commit, parse_log_file_name
from kstore.manifest import PartitionState, ProducerBatch
from kstore.segments import write_data_object
from kstore.topic_log import SIDECARS, TopicLog, sidecar_name
from kstore.transactions import end_transaction

StoreURL = tuple[str, dict[str, Any]]
vacuum_module = importlib.import_module("kstore.retention.vacuum")

LOGS = [1, 3]
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def _now_ms() -> int:
    return int(time.time() * 1000)


def _touch(state: PartitionState) -> list[Action]:
    """A commit's actions for a partition that change it and nothing else."""
    return [{"logStart": {"offset": state.log_start_offset}}]


def _chains(store: Store, log_dir: str, version: int) -> dict[int, list[dict[str, Any]]]:
    """Partition -> the chain of sidecars checkpoint ``version`` names for it (13.4)."""
    path = f"{log_dir}/{checkpoint_file(version)}"
    chains: dict[int, list[dict[str, Any]]] = {}
    for name, body in decode_commit(store.storage.read(path), path)[1]:
        if name == "sidecar":
            chains.setdefault(int(body["partition"]), []).append(body)
    return chains


def _named_version(body: dict[str, Any]) -> int:
    """The version of the checkpoint that wrote a sidecar, as its name says (5.8)."""
    parsed = sidecar_name(str(body["path"]).removeprefix(f"{SIDECARS}/"))
    assert parsed is not None, body
    return parsed[1]


# -- 1. the sidecar horizon, at its exact boundary ---------------------------------------------


@pytest.mark.parametrize("logs", LOGS)
def test_an_idle_chain_is_named_up_to_exactly_the_horizon_and_rebased_one_past_it(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch, logs: int
) -> None:
    """A checkpoint every commit, so that every distance between a sidecar and a checkpoint
    naming it occurs: an idle partition's base is named by the checkpoints up to exactly
    SIDECAR_HORIZON versions after it (horizon - 1 and horizon: reused) and replaced by a new
    base at horizon + 1 (13.4); no checkpoint names any sidecar from further back. The bug put
    back either way (``>`` for ``>=`` in ``within_horizon``: rebased at the horizon; or one
    version more allowed: a gap of horizon + 1) fails here; the test of
    test_incremental_checkpoints, a checkpoint every 2 versions against a horizon of 12, can
    never make a gap of 13."""
    horizon = 4
    monkeypatch.setattr("kstore.topic_log.SIDECAR_HORIZON", horizon)
    store = Store(*local_store)
    store.create_topic("t", 2 * logs, config={"commit.logs": logs, "checkpoint.interval": 1})
    busy, idle = 0, logs  # both in topic log 0
    shared = store.topic_log("t", store.topic("t"), busy)
    result, _ = shared.commit({busy: _touch, idle: _touch}, operation="TEST")
    assert result is not None
    first = result.version
    for _ in range(3 * (horizon + 1) + 2):
        result, _ = shared.commit({busy: _touch}, operation="TEST")
    assert result is not None
    newest = result.version
    gaps: list[int] = []
    previous: int | None = None
    for version in range(max(first, 1), newest + 1):  # no checkpoint at version 0
        chains = _chains(store, shared.directory, version)
        for partition, chain in chains.items():
            for body in chain:  # no checkpoint names a sidecar beyond the horizon
                assert _named_version(body) >= version - horizon, (version, partition, body)
        (base,) = chains[idle]  # unchanged since ``first``: its base alone, never a delta
        written = _named_version(base)
        if previous is not None and written != previous:
            # A new base exactly when the old one would be horizon + 1 versions back.
            assert version - previous == horizon + 1, (version, previous)
            assert written == version
        previous = written
        gaps.append(version - written)
    # Every distance up to the horizon occurred, the horizon itself included, and no more.
    assert max(gaps) == horizon
    assert gaps.count(horizon) >= 2
    assert sorted(set(gaps)) == list(range(horizon + 1))


def _age(path: str, ms_ago: int) -> None:
    """Set a local file's modification time, which the storage reports for it (23.1)."""
    when = (_now_ms() - ms_ago) / 1000
    os.utime(path, (when, when))


@pytest.mark.parametrize("logs", LOGS)
def test_vacuum_keeps_a_sidecar_named_by_the_last_checkpoint_within_the_horizon_past_k(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch, logs: int
) -> None:
    """Vacuum's side of the horizon (22.5 step 2.4): with K the oldest checkpoint it keeps, a
    sidecar written at K - 1 may be named by the checkpoints up to K - 1 + horizon (a writer
    that extended the chain of a checkpoint older than K); vacuum reads the checkpoints of
    versions K to K + horizon - 1 and keeps it when the last of them names it. One written at
    K - horizon - 1 is named by no kept checkpoint and goes. With the window one version
    short (the bug put back), the named sidecar is deleted and that checkpoint is corrupt."""
    horizon = 4
    monkeypatch.setattr("kstore.topic_log.SIDECAR_HORIZON", horizon)
    monkeypatch.setattr(vacuum_module, "SIDECAR_HORIZON", horizon)
    url, options = local_store
    root = url.removeprefix("file://")
    store = Store(url, options)
    store.create_topic("t", 2 * logs, config={"commit.logs": logs, "checkpoint.interval": 1})
    meta = store.topic("t")
    # Every topic log gets checkpoints (a log without one makes vacuum list the logs whole).
    topic_logs = [store.topic_log("t", meta, j) for j in range(logs)]
    for _ in range(horizon + 3):
        for j, topic_log in enumerate(topic_logs):
            topic_log.commit({j: _touch, j + logs: _touch}, operation="TEST")
    shared = topic_logs[0]
    k = shared.state().version
    assert k > horizon + 1
    # Everything so far was written three days ago: checkpoint k is the K of a vacuum with a
    # log retention of two days; what follows is young.
    incarnation = topic_data_dir("t", store.topic("t").topic_id)
    for directory, _, names in os.walk(f"{root}/{incarnation}"):
        for name in names:
            _age(f"{directory}/{name}", 3 * DAY_MS)
    for _ in range(horizon + 2):
        for j, topic_log in enumerate(topic_logs):
            topic_log.commit({j: _touch}, operation="TEST")
    assert shared.state().version > k + horizon  # the window's last checkpoint is not the newest
    sidecar_dir = f"{incarnation}/{SIDECARS}"

    def stray(version: int) -> str:
        name = f"0-{version:020d}-{uuid.uuid4().hex}.json.gz"
        store.storage.put_if_absent(f"{sidecar_dir}/{name}", b"not read")
        _age(f"{root}/{sidecar_dir}/{name}", 3 * DAY_MS)
        return name

    named = stray(k - 1)
    far = stray(k - horizon - 1)
    # The last checkpoint of the window names ``named`` (a distance of exactly the horizon),
    # as a writer that extended an older chain would.
    last = k + horizon - 1
    path = f"{shared.directory}/{checkpoint_file(last)}"
    info, actions = decode_commit(store.storage.read(path), path)
    extra = {"partition": 0, "path": f"{SIDECARS}/{named}", "actions": 1, "size": 8}
    lines = [{n: b} for n, b in actions] + [{"sidecar": extra}]
    info["actions"] = len(lines)
    text = "\n".join([json.dumps({"commitInfo": info}), *(json.dumps(a) for a in lines)]) + "\n"
    store.storage.put(path, text.encode())
    wholes: list[str] = []
    whole = vacuum_module.LogScan.whole

    def listed_whole(self: Any) -> Any:
        wholes.append(self.directory)
        return whole(self)

    monkeypatch.setattr(vacuum_module.LogScan, "whole", listed_whole)
    summary = vacuum(None, url, options, verbose=False, log_retention_ms=2 * DAY_MS)
    assert summary.errors == []
    assert wholes == []  # the sidecars were judged by the horizon, no log listed whole
    gone = {p.rsplit("/", 1)[-1] for p in summary.files}
    assert far in gone  # sanity: the run did judge the old sidecars by their names
    assert any(parse_log_file_name(n) == (k - 1, False) for n in gone)  # below K: gone
    assert named not in gone
    assert store.storage.exists(f"{sidecar_dir}/{named}")


# -- 2. vacuum's refresh spares what a commit made live after its listing ----------------------


@pytest.mark.parametrize("logs", LOGS)
def test_vacuum_spares_a_data_object_committed_between_its_listing_and_its_refresh(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch, logs: int
) -> None:
    """Layout-3 vacuum lists ``_data/``, reads every topic log's state, judges, then refreshes
    the states before deleting (22.5 layout-3 step 3). A data object committed right after
    vacuum read the state of its topic log (the hook below commits it then, deterministically)
    was an orphan by that state and by its age; the refresh must keep it, and its records
    read. An object of the same age that nobody commits goes in the same run. With the
    refresh disabled (the bug put back: the re-read sees nothing new) the committed object is
    deleted and its partition's reads fail."""
    url, options = local_store
    store = Store(url, options)
    partitions = 2 * logs
    store.create_topic("t", partitions, config={"commit.logs": logs, "commit.inline.bytes": 0})
    with Producer(store, linger_ms=60_000) as producer:
        for p in range(partitions):
            producer.send("t", value=b"before-%d" % p, partition=p)
        producer.flush()
    target = partitions - 1  # in the last topic log
    part = store.partition("t", target)
    incarnation = part.directory.rsplit("/", 1)[0]
    records = pa.table({"value": pa.array([b"late-0", b"late-1"], pa.binary())})
    late = write_data_object(store.storage, incarnation, [(target, records, part.layout)])
    stray = write_data_object(store.storage, incarnation, [(target, records, part.layout)])
    late_location = f"{incarnation}/{late[target].path}"
    stray_location = f"{incarnation}/{stray[target].path}"
    log_dir = store.topic_log("t", store.topic("t"), target).directory
    committed: list[int] = []

    def commit_late() -> None:
        writer = Store(url, options)
        outcome: dict[str, Any] = {}
        build = writer.partition("t", target).append_build([late[target]], outcome=outcome)
        result, _ = writer.topic_log("t", writer.topic("t"), target).commit(
            {target: build}, operation="APPEND"
        )
        assert result is not None
        committed.append(result.version)

    base = vacuum_module.TopicLogFiles

    class Hooked(base):  # type: ignore[misc, valid-type]
        """Vacuum's reader of a topic log: once the state of the late object's log is read
        (after every listing), the object is committed."""

        def load(self) -> Any:
            state = super().load()
            if self.directory == log_dir and not committed:
                commit_late()
            return state

    monkeypatch.setattr(vacuum_module, "TopicLogFiles", Hooked)
    # Two hours on: both objects are older than the orphan age (1 hour) by then.
    summary = vacuum(None, url, options, verbose=False, now_ms=_now_ms() + 2 * HOUR_MS)
    assert summary.errors == []
    assert committed  # the commit landed between the listing and the refresh
    assert stray_location in summary.files  # the same age, never committed: an orphan
    assert late_location not in summary.files
    assert store.storage.exists(late_location)
    fresh = Store(url, options)
    for p in range(partitions):
        expected = [b"before-%d" % p] + ([b"late-0", b"late-1"] if p == target else [])
        assert _values(fresh, p) == expected


def _values(store: Store, partition: int) -> list[bytes]:
    """A partition's values in offset order, read and verified; offsets dense from 0."""
    offsets: list[int] = []
    values: list[bytes] = []
    for batch in store.partition("t", partition).read(0):
        offsets.extend(batch.column("offset").to_pylist())
        values.extend(batch.column("value").to_pylist())
    assert offsets == list(range(len(values))), offsets
    return values


# -- 3. a transaction marker fences older epochs in each partition of a topic log --------------


def _zombie_append(store: Store, partitions: range, pid: str, epoch: int) -> dict[int, Any]:
    """An append of producer ``pid`` at ``epoch`` to every partition, one commit per topic
    log, each partition refused alone (isolate): partition -> its error (or its outcome)."""
    meta = store.topic("t")
    out: dict[int, Any] = {}
    by_log: dict[int, list[int]] = {}
    for p in partitions:
        by_log.setdefault(p % meta.commit_logs, []).append(p)
    for members in by_log.values():
        parts = {p: store.partition("t", p, meta) for p in members}
        incarnation = parts[members[0]].directory.rsplit("/", 1)[0]
        records = pa.table({"value": pa.array([b"zombie"], pa.binary())})
        files = write_data_object(
            store.storage, incarnation, [(p, records, parts[p].layout) for p in members]
        )
        outcomes: dict[int, dict[str, Any]] = {p: {} for p in members}
        builds = {
            p: parts[p].append_build(
                [files[p]], producer=ProducerBatch(pid, epoch, 1, 1), outcome=outcomes[p]
            )
            for p in members
        }
        topic_log: TopicLog = store.topic_log("t", meta, members[0])
        result, refused = topic_log.commit(builds, operation="APPEND", isolate=True)
        for p in members:
            out[p] = refused.get(p, outcomes[p])
        assert result is None or set(refused) != set(members)
    return out


@pytest.mark.parametrize("logs", LOGS)
def test_a_marker_fences_older_epochs_of_its_producer_in_each_partition_of_a_topic_log(
    local_store: StoreURL, logs: int
) -> None:
    """A new instance of a transactional id finishes (aborts) the transaction its predecessor
    left open: its markers, one commit per topic log, carry the new epoch, and each raises the
    producer's epoch in its partition (9.2, 18.6). A zombie append of the old epoch to those
    partitions is then refused there, partition by partition, before and after a reload from a
    checkpoint; and a marker of the old epoch for the ended transaction writes nothing. With
    the bug put back (the marker's epoch not raising the partition's entry) the zombie's
    batches are appended."""
    url, options = local_store
    store = Store(url, options)
    partitions = range(2 * logs)
    store.create_topic(
        "t",
        len(partitions),
        config={"commit.logs": logs, "checkpoint.interval": 1, "commit.inline.bytes": 0},
    )
    old = Producer(store, transactional_id="tx")
    old.init_transactions()
    old.begin_transaction()
    for p in partitions:
        old.send("t", value=b"open-%d" % p, partition=p)
    old.flush()  # appended in its transaction; the instance then stops (a crash)
    pid, old_epoch = old.producer_id, old.epoch
    (key,) = set(store.partition("t", 0).state().open_transactions)
    version = int(key.rpartition(":")[2])
    new = Producer(Store(url, options), transactional_id="tx")
    new.init_transactions()  # fences the old epoch and aborts its transaction
    try:
        assert new.producer_id == pid
        assert new.epoch > old_epoch
        logs_before = {}
        for p in partitions:
            state = store.partition("t", p).state()
            assert not state.open_transactions
            assert state.producers[pid].epoch == new.epoch, p
            assert state.last_stable_offset == state.end_offset == 1
            logs_before[p % logs] = state.version
        # A marker of the old epoch for the transaction that ended: nothing to write.
        tps = [_tp(p) for p in partitions]
        end_transaction(store, tps, pid, old_epoch, version, commit=True)
        for p in partitions:
            assert store.partition("t", p).state().version == logs_before[p % logs]
        for reader in (store, Store(url, options)):  # and after a reload from a checkpoint
            refused = _zombie_append(reader, partitions, pid, old_epoch)
            for p in partitions:
                assert isinstance(refused[p], ProducerFencedError), (p, refused[p])
                assert f"fenced by epoch {new.epoch}" in str(refused[p])
        fresh = Store(url, options)
        for p in partitions:
            assert _values(fresh, p) == []  # the aborted records stay hidden, nothing added
            assert fresh.partition("t", p).state().end_offset == 1
    finally:
        new.close()
        with contextlib.suppress(Exception):
            old.close()


def _tp(partition: int) -> Any:
    from kstore.records import TopicPartition

    return TopicPartition("t", partition)


# -- 4. the merge's shared rewrite gives each partition its own ranges -------------------------


def _records(store: Store, partition: int) -> list[tuple[int, bytes]]:
    """A partition's (offset, value) pairs, read and verified."""
    out: list[tuple[int, bytes]] = []
    for batch in store.partition("t", partition).read(0):
        out.extend(
            zip(batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True)
        )
    return out


def _merge_topic(
    url: str, options: dict[str, Any], logs: int
) -> dict[int, list[tuple[int, bytes]]]:
    """Six partitions (``logs`` topic logs: 6 or 2 partitions a log, not adjacent with 3), four
    flushes of three records each, every flush a data object per topic log: partition ->
    the (offset, value) pairs its producer's futures acknowledged."""
    store = Store(url, options)
    store.create_topic("t", 6, config={"commit.logs": logs, "commit.inline.bytes": 0})
    futures = []
    with Producer(store, linger_ms=60_000) as producer:
        for f in range(4):
            for p in range(6):
                for i in range(3):
                    value = b"p%d-f%d-i%d" % (p, f, i) * 8
                    futures.append((value, producer.send("t", value=value, partition=p)))
            producer.flush()
    acked: dict[int, list[tuple[int, bytes]]] = {}
    for value, future in futures:
        meta = future.get(30)
        acked.setdefault(meta.partition, []).append((meta.offset, value))
    for p in range(6):  # the premise: every partition's records are ranges of shared objects
        segments = store.partition("t", p).state().segments
        assert len(segments) == 4
        assert all(s.byte_range is not None for s in segments)
    return {p: sorted(pairs) for p, pairs in acked.items()}


@pytest.mark.parametrize("logs", LOGS)
def test_the_shared_merge_gives_every_partition_its_own_ranges_at_their_offsets(
    local_store: StoreURL, caplog: pytest.LogCaptureFixture, logs: int
) -> None:
    """After a merge every partition holds exactly the records and offsets its producer was
    told, in per-partition files, and the rewrite was the shared one (one task per topic log,
    22.4), without an error or a warning. With the shared rewrite mapping a range to another
    partition (the bug put back: in the bytes it fetches, or in the commit it builds) either
    the records differ, or the shared rewrite fails and is reported (it used to be swallowed,
    each partition's own merge redoing the work unnoticed)."""
    url, options = local_store
    acked = _merge_topic(url, options, logs)
    with caplog.at_level(logging.WARNING, logger="kstore"):
        summary = merge_segments(None, Store(url, options), topics=["t"], verbose=False)
    assert summary.errors == []
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    rows = {row.partition: row for row in summary.partitions}
    assert set(rows) == set(range(6))
    for row in rows.values():
        assert row.outcome == "committed", row
        assert "with the topic log's other partitions" in row.reason, row.reason
    fresh = Store(url, options)
    for p in range(6):
        segments = fresh.partition("t", p).state().segments
        assert segments
        assert all(s.byte_range is None for s in segments), segments
        assert _records(fresh, p) == acked[p], p


@pytest.mark.parametrize("logs", LOGS)
def test_a_shared_rewrite_that_fails_on_its_own_is_an_error_and_one_of_the_storage_a_warning(
    local_store: StoreURL,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    logs: int,
) -> None:
    """A shared rewrite handed a partition another partition's bytes (injected here): the
    range does not verify (its checksum), which the partition's own merge, reading the right
    bytes, would never see. The run reports it: a warning with the cause and its traceback,
    each row of that topic log an ``error`` naming it, and the maintenance service's record an
    error; the records are intact, the own merges having done the work. A storage failure of
    the shared rewrite is a warning only: the own merges cover for it, the run is ``ok``."""
    from kstore.maintenance.tasks import from_summary

    url, options = local_store
    acked = _merge_topic(url, options, logs)
    fetch = merger._fetch

    def swapped(store: Store, parts: Any, pieces: Any) -> dict[tuple[int, str], bytes]:
        data = fetch(store, parts, pieces)
        keys = sorted(data)  # each range's bytes given to the next partition's range
        return {key: data[keys[(n + 1) % len(keys)]] for n, key in enumerate(keys)}

    monkeypatch.setattr(merger, "_fetch", swapped)
    with caplog.at_level(logging.WARNING, logger="kstore.compaction.merger"):
        summary = merge_segments(None, Store(url, options), topics=["t"], verbose=False)
    warnings = [r for r in caplog.records if r.name == "kstore.compaction.merger"]
    assert len(warnings) == logs, [r.getMessage() for r in warnings]
    for record in warnings:
        assert "rewriting their ranges together failed (CorruptRecordError" in record.getMessage()
        assert "checksum mismatch" in record.getMessage()
        assert record.exc_info  # with its traceback
    assert sorted(row.partition for row in summary.errors) == list(range(6))
    for row in summary.errors:
        assert "rewriting the ranges together failed (CorruptRecordError" in row.reason
    result = from_summary(summary)
    assert result.outcome == "error"
    assert "rewriting the ranges together failed" in result.detail
    fresh = Store(url, options)
    for p in range(6):  # the partitions' own merges did the work, right
        assert all(s.byte_range is None for s in fresh.partition("t", p).state().segments)
        assert _records(fresh, p) == acked[p]

    # The storage failing under the shared rewrite: a warning, and the run is ok.
    other = f"{url}-2"
    acked = _merge_topic(other, options, logs)
    monkeypatch.setattr(merger, "_fetch", fetch)

    def unavailable(*_: object, **__: object) -> None:
        raise StorageError("injected: the storage did not answer")

    monkeypatch.setattr(merger, "read_object_ranges", unavailable)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kstore.compaction.merger"):
        summary = merge_segments(None, Store(other, options), topics=["t"], verbose=False)
    warnings = [r for r in caplog.records if r.name == "kstore.compaction.merger"]
    assert len(warnings) == logs
    assert all("StorageError: injected" in r.getMessage() for r in warnings)
    assert not any(r.exc_info for r in warnings)  # no traceback: not the rewrite's fault
    assert summary.errors == []
    assert summary.count("committed") == 6
    assert from_summary(summary).outcome == "ok"
    for p in range(6):
        assert _records(Store(other, options), p) == acked[p]
