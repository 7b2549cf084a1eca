"""Every reader reloads and reads the live files before it reports anything missing (PROTOCOL.md
24 item 8; issue 45, defect 3 and the reader suspicion).

Each reader loads its state (or a plan made from one), then a merge and a vacuum past
``file.delete.delay.ms`` (its floor, 10 s, passed on vacuum's clock) delete every data object
that state names, then it reads: it must return every live record and raise nothing. The
kinds: a partition read and an offset lookup from a held state, a consumer paused between its
fetch's states and its reads, Spark read tasks (streaming ones carrying their planned segments,
and batch ones; the task function runs here, as an executor runs it, without a SparkSession),
the merge and compaction jobs, and the Delta publication of the tail. Data loss is reported
only for offsets truly gone (below the log start after retention); offsets compaction removed
are simply absent.

The pause is a wrapper around a function the reader calls between loading its state and
reading (:func:`pause_at`), where a SIGSTOP, a hung mount or a late executor would hold it.
Layout-3 topics with ``commit.logs`` 1 and 3; the Partition and Spark task readers on local
disk and SeaweedFS, the rest on local disk. The escaped bug of one Delta application id for
every topic log is checked at the end.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kstore.compaction import merge_segments, run_compaction
from kstore.lakehouse import publish_table, read_snapshot, table_dir
from kstore.retention import run_retention, vacuum
from kstore.spark_ext.options import StoreRef
from kstore.spark_ext.reading import (
    DataLossError,
    Range,
    ReadContext,
    ReadTask,
    plan_tasks,
    read_task,
)
from kstore.spark_ext.schema import Projection

from kstore import Store
from kstore.consumer import Consumer
from kstore.manifest import segment_location
from kstore.partition import PartitionState
from kstore.producer import Producer
from kstore.records import TopicPartition
from tests.test_jobs_support import Target, now_ms, open_store

merger = importlib.import_module("kstore.compaction.merger")
cleaner = importlib.import_module("kstore.compaction.cleaner")
fetcher_module = importlib.import_module("kstore.consumer.fetcher")
reading = importlib.import_module("kstore.spark_ext.reading")
tail_module = importlib.import_module("kstore.lakehouse.tail")

DELAY = 10_000  # file.delete.delay.ms, its floor
PARTITIONS = 4
FLUSHES = 5
PER_FLUSH = 40  # records per partition and flush: 200 per partition
BACKENDS = ["local_store", pytest.param("seaweed_store", marks=pytest.mark.s3)]
LOGS = [1, 3]

Rows = dict[int, list[tuple[int, bytes | None]]]  # partition -> (offset, value)


def make_topic(store: Store, logs: int, config: dict[str, Any] | None = None) -> Rows:
    """A layout-3 topic whose every producer flush is a data object (none carried by its
    commit), FLUSHES flushes of PER_FLUSH records to each partition; returns its records."""
    store.create_topic(
        "t",
        PARTITIONS,
        {
            "file.delete.delay.ms": DELAY,
            "commit.inline.bytes": 0,
            "commit.logs": logs,
            **(config or {}),
        },
    )
    with Producer(store, linger_ms=60_000) as producer:
        for flush in range(FLUSHES):
            for p in range(PARTITIONS):
                for i in range(PER_FLUSH):
                    value = b"%d-%d-%d" % (p, flush, i)
                    producer.send("t", key=b"k%d" % (i % 8), value=value, partition=p)
            producer.flush()
    return live_rows(store)


def live_rows(store: Store) -> Rows:
    """Every live record of every partition, read from the newest state."""
    out: Rows = {}
    for p in range(PARTITIONS):
        part = store.partition("t", p)
        state = part.state()
        out[p] = [
            (o, v)
            for batch in part.read(state.start_offset, state=state)
            for o, v in zip(
                batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True
            )
        ]
    return out


def merge_and_vacuum(where: Target) -> list[str]:
    """What another process does meanwhile: a merge job rewrites every range into Parquet,
    and a vacuum past file.delete.delay.ms deletes the data objects. Returns what it deleted."""
    merged = merge_segments(None, *where, verbose=False)
    assert merged.errors == [], [r.reason for r in merged.errors]
    swept = vacuum(None, *where, verbose=False, now_ms=now_ms() + DELAY + 5_000)
    assert swept.errors == [], [r.reason for r in swept.errors]
    return swept.files


class Pause:
    """What :func:`pause_at` ran meanwhile: ``deleted``, what its vacuum deleted (None until
    it ran)."""

    deleted: list[str] | None = None


def pause_at(
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    name: str,
    meanwhile: Callable[[], list[str]],
) -> Pause:
    """``module.name`` made to run ``meanwhile`` before its first call: the reader that calls
    it, between loading its state and reading, is paused while that runs (later calls, its
    own among them, pass)."""
    real = getattr(module, name)
    pause = Pause()
    started: list[bool] = []

    def paused(*args: Any, **kwargs: Any) -> Any:
        if not started:
            started.append(True)
            pause.deleted = meanwhile()
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, paused)
    return pause


def assert_gone(store: Store, states: dict[int, PartitionState]) -> None:
    """The premise: every data object the held states name was deleted."""
    for p, state in states.items():
        directory = store.partition("t", p).directory
        assert state.segments
        for seg in state.segments:
            assert not store.storage.exists(segment_location(directory, seg.path)), seg.path


# -- Partition: read, offset lookup ----------------------------------------------------------


@pytest.mark.parametrize("logs", LOGS)
@pytest.mark.parametrize("target", BACKENDS)
def test_a_partition_read_from_a_state_older_than_a_merge_and_vacuum(
    target: str, logs: int, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    expected = make_topic(open_store(where), logs)
    reader = open_store(where)  # a reader process: its own store, cache and states
    parts = {p: reader.partition("t", p) for p in range(PARTITIONS)}
    held = {p: part.state() for p, part in parts.items()}
    # Offset lookups: the first record at or after the timestamp of offset 120.
    stamps = {
        p: [
            int(t.timestamp() * 1000)
            for b in open_store(where).partition("t", p).read(0, columns=["timestamp"])
            for t in b.column("timestamp").to_pylist()
        ]
        for p in range(PARTITIONS)
    }
    merge_and_vacuum(where)
    assert_gone(reader, held)
    for p, part in parts.items():
        got = [
            (o, v)
            for b in part.read(0, state=held[p])
            for o, v in zip(
                b.column("offset").to_pylist(), b.column("value").to_pylist(), strict=True
            )
        ]
        assert got == expected[p]
        target_ms = stamps[p][120]
        first = next(i for i, t in enumerate(stamps[p]) if t >= target_ms)
        assert part.offset_for_timestamp(target_ms, held[p]) == first


def test_a_live_segment_whose_file_is_missing_is_still_reported(local_store: Target) -> None:
    """The reload does not hide real damage: a segment the newest state still holds, whose
    data object is gone, is a MissingSegmentError naming it (PROTOCOL.md 24 item 8)."""
    from kstore.errors import MissingSegmentError

    store = open_store(local_store)
    make_topic(store, 1)
    part = open_store(local_store).partition("t", 0)
    first = part.state().segments[0]
    store.storage.delete([segment_location(part.directory, first.path)])
    with pytest.raises(MissingSegmentError, match=first.path) as info:
        list(part.read(0))
    assert type(info.value) is MissingSegmentError  # not "replaced": nothing newer holds it


# -- the consumer --------------------------------------------------------------------------------


@pytest.mark.parametrize("logs", LOGS)
def test_a_consumer_paused_past_the_delete_delay_reads_every_live_record(
    local_store: Target, logs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The consumer pauses after its fetch took the topic logs' states, before it reads
    (PROTOCOL.md 23.1 used to let that poll fail with MissingSegmentError)."""
    expected = make_topic(open_store(local_store), logs)
    reader = open_store(local_store)
    consumer = Consumer(store=reader, auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([TopicPartition("t", p) for p in range(PARTITIONS)])
    pause = pause_at(monkeypatch, fetcher_module, "prefetch", lambda: merge_and_vacuum(local_store))
    got: Rows = {p: [] for p in range(PARTITIONS)}
    for _ in range(50):
        for tp, records in consumer.poll(timeout_ms=100, max_records=1000).items():
            got[tp.partition].extend((r.offset, r.value) for r in records)
        if sum(map(len, got.values())) >= PARTITIONS * FLUSHES * PER_FLUSH:
            break
    consumer.close()
    assert pause.deleted  # the merge and vacuum ran, and deleted files, mid-fetch
    assert got == expected


def test_a_consumer_whose_offsets_retention_removed_mid_fetch_resets(
    local_store: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paused the same way while DeleteRecords below 100, retention, a merge and a vacuum
    run: offsets truly gone go through auto_offset_reset (earliest: the new log start), as a
    Kafka fetch that meets OFFSET_OUT_OF_RANGE does; the poll raises nothing."""
    expected = make_topic(open_store(local_store), 1)
    reader = open_store(local_store)
    consumer = Consumer(store=reader, auto_offset_reset="earliest", enable_auto_commit=False)
    consumer.assign([TopicPartition("t", p) for p in range(PARTITIONS)])

    def remove_then_merge() -> list[str]:
        open_store(local_store).partition("t", 0).delete_records(100)
        run_retention(None, *local_store, verbose=False)
        return merge_and_vacuum(local_store)

    pause = pause_at(monkeypatch, fetcher_module, "prefetch", remove_then_merge)
    got: Rows = {p: [] for p in range(PARTITIONS)}
    for _ in range(50):
        for tp, records in consumer.poll(timeout_ms=100, max_records=1000).items():
            got[tp.partition].extend((r.offset, r.value) for r in records)
        if sum(map(len, got.values())) >= PARTITIONS * FLUSHES * PER_FLUSH - 100:
            break
    consumer.close()
    assert pause.deleted
    assert got == {**expected, 0: expected[0][100:]}


# -- Spark read tasks (without a SparkSession) ---------------------------------------------------


def context(where: Target, *, fail: bool, cache_bytes: int = 0) -> ReadContext:
    url, options = where
    return ReadContext(
        store=StoreRef(url, json.dumps(options, sort_keys=True)),
        projection=Projection(("partition", "offset", "value")),
        fail_on_data_loss=fail,
        cache_bytes=cache_bytes,
    )


def streaming_tasks(store: Store) -> list[ReadTask]:
    """The tasks a streaming query's driver plans (``snapshot=True``): each carries the
    segments of its range."""
    meta = store.topic("t")
    states = {TopicPartition("t", p): store.partition("t", p).state() for p in range(PARTITIONS)}
    ranges = [Range(tp, 0, state.end_offset) for tp, state in states.items()]
    tasks = plan_tasks(ranges, states, {"t": meta}, min_partitions=None, snapshot=True)
    assert len(tasks) == PARTITIONS
    assert all(t.segments for t in tasks)
    return tasks


def run_tasks(tasks: list[ReadTask], ctx: ReadContext) -> Rows:
    out: Rows = {p: [] for p in range(PARTITIONS)}
    for task in tasks:
        for batch in read_task(task, ctx):
            for row in batch.to_pylist():
                out[row["partition"]].append((row["offset"], row["value"]))
    return out


@pytest.mark.parametrize("fail", [True, False], ids=["failOnDataLoss", "noFailOnDataLoss"])
@pytest.mark.parametrize("logs", LOGS)
@pytest.mark.parametrize("target", BACKENDS)
def test_streaming_tasks_run_after_a_merge_and_vacuum_read_every_record(
    target: str, logs: int, fail: bool, request: pytest.FixtureRequest, caplog: Any
) -> None:
    """Defect 3: the tasks read 0 of 200 live records (failOnDataLoss=false) or raised
    DataLossError for records that are all there (true)."""
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    expected = make_topic(store, logs)
    tasks = streaming_tasks(store)
    merge_and_vacuum(where)
    for task in tasks:
        directory = store.partition("t", task.partition).directory
        assert task.segments is not None
        assert not any(
            store.storage.exists(segment_location(directory, s.path)) for s in task.segments
        )
    with caplog.at_level(logging.WARNING, logger="kstore.spark_ext.reading"):
        got = run_tasks(tasks, context(where, fail=fail, cache_bytes=1 << 26))
    assert got == expected
    assert not [r for r in caplog.records if "lost" in r.getMessage()]


def test_a_batch_task_paused_after_its_state_reads_every_record(
    local_store: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch task resolves its range against the state at read time, then pauses (a slow
    executor) while a merge and vacuum run."""
    store = open_store(local_store)
    expected = make_topic(store, 3)
    meta = store.topic("t")
    tasks = [ReadTask(meta, p, 0, 0, 0, None, open_end=True) for p in range(PARTITIONS)]
    pause = pause_at(
        monkeypatch, reading, "_resolve_at_read_time", lambda: merge_and_vacuum(local_store)
    )
    assert run_tasks(tasks, context(local_store, fail=True)) == expected
    assert pause.deleted


@pytest.mark.parametrize("target", BACKENDS)
def test_only_offsets_retention_removed_are_data_loss(
    target: str, request: pytest.FixtureRequest, caplog: Any
) -> None:
    """Planned tasks, then DeleteRecords below 100 in partition 0, retention, a merge and a
    vacuum: offsets 0..99 are truly gone, the rest is read."""
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    expected = make_topic(store, 1)
    tasks = streaming_tasks(store)
    store.partition("t", 0).delete_records(100)
    run_retention(None, *where, verbose=False)
    merge_and_vacuum(where)
    with pytest.raises(DataLossError, match=r"offsets 0\.\.99 were to be read, but the log now"):
        run_tasks(tasks, context(where, fail=True))
    with caplog.at_level(logging.WARNING, logger="kstore.spark_ext.reading"):
        got = run_tasks(tasks, context(where, fail=False))
    assert got == {**expected, 0: expected[0][100:]}
    warnings = [r.getMessage() for r in caplog.records if "lost" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "offsets 0..99 were to be read" in warnings[0]


def test_a_topic_deleted_and_purged_before_its_tasks_ran_is_data_loss(
    local_store: Target, caplog: Any
) -> None:
    """The reload finds no log at all (the incarnation's files purged): its records are gone,
    and the tasks report it rather than read an empty state's nothing."""
    store = open_store(local_store)
    make_topic(store, 1)
    tasks = streaming_tasks(store)
    store.delete_topic("t")
    purged = vacuum(None, *local_store, verbose=False, now_ms=now_ms() + DELAY + 5_000)
    assert purged.errors == []
    assert not store.storage.exists(store.partition("t", 0, tasks[0].metadata).directory)
    with pytest.raises(DataLossError, match=r"t-0: offsets 0\.\.39 are gone"):
        run_tasks(tasks, context(local_store, fail=True))
    with caplog.at_level(logging.WARNING, logger="kstore.spark_ext.reading"):
        got = run_tasks(tasks, context(local_store, fail=False))
    assert got == {p: [] for p in range(PARTITIONS)}
    lost = [r for r in caplog.records if "lost" in r.getMessage()]
    assert len(lost) == PARTITIONS * FLUSHES  # every planned segment, each reported


def test_offsets_compaction_removed_are_absent_not_lost(local_store: Target) -> None:
    """Planned tasks, then compaction (8 keys a partition), a merge and a vacuum: the tasks
    read what the log holds now in their ranges, and report no loss."""
    store = open_store(local_store)
    make_topic(store, 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0})
    tasks = streaming_tasks(store)
    compacted = run_compaction(None, *local_store, verbose=False)
    assert compacted.errors == []
    assert compacted.records_dropped > 0
    merge_and_vacuum(local_store)
    now = live_rows(open_store(local_store))
    assert sum(map(len, now.values())) < PARTITIONS * FLUSHES * PER_FLUSH
    assert run_tasks(tasks, context(local_store, fail=True)) == now


# -- the jobs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("logs", [*LOGS, PARTITIONS])
def test_a_merge_job_whose_plan_was_merged_and_vacuumed_stands_down(
    local_store: Target, logs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The job loads its states and pauses before its plan is read while another merge and a
    vacuum run: a lost race, not an error. The first plan is the shared part's of a topic log
    of several partitions (commit.logs 1 and 3), or a partition's own merge when every
    partition has its log (commit.logs 4)."""
    expected = make_topic(open_store(local_store), logs)
    pause = pause_at(monkeypatch, merger, "plan_merge", lambda: merge_and_vacuum(local_store))
    summary = merge_segments(None, *local_store, verbose=False)
    assert pause.deleted
    assert summary.errors == [], [r.reason for r in summary.errors]
    assert summary.count("conflict") > 0
    assert all("no longer live" in r.reason for r in summary.partitions if r.outcome == "conflict")
    assert live_rows(open_store(local_store)) == expected
    assert merge_segments(None, *local_store, verbose=False).errors == []


def test_a_compaction_whose_plan_was_merged_and_vacuumed_stands_down(
    local_store: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(local_store)
    make_topic(store, 3, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0})
    before = live_rows(store)
    pause = pause_at(monkeypatch, cleaner, "plan_compaction", lambda: merge_and_vacuum(local_store))
    summary = run_compaction(None, *local_store, verbose=False)
    assert pause.deleted
    assert summary.errors == [], [r.reason for r in summary.errors]
    # The first partition's compaction was paused (the others loaded their states after).
    (stale,) = [r for r in summary.partitions if r.outcome == "conflict"]
    assert "no longer live" in stale.reason
    assert live_rows(open_store(local_store))[stale.partition] == before[stale.partition]
    again = run_compaction(None, *local_store, verbose=False)
    assert again.errors == []
    assert [r.partition for r in again.partitions if r.outcome == "committed"] == [stale.partition]
    after = live_rows(open_store(local_store))
    for p, rows in before.items():
        # Every key's latest record is still there (record i of a flush has key i % 8).
        latest = {int((v or b"").split(b"-")[2]) % 8: (o, v) for o, v in rows}
        assert set(latest.values()) <= set(after[p])
        assert len(after[p]) < len(rows)


# -- the Delta publication -----------------------------------------------------------------------


def table_offsets(store: Store) -> dict[int, list[int]]:
    """Partition -> the offsets the newest version of the topic's Delta table holds, read
    from the Parquet files it names."""
    root = table_dir(store.topic("t"))
    out: dict[int, list[int]] = {}
    for f in read_snapshot(store.storage, root).files.values():
        head, _, _ = f.path.partition("/")
        table = pq.read_table(pa.BufferReader(store.storage.read(f"{root}/{f.path}")))
        out.setdefault(int(head), []).extend(table.column("offset").to_pylist())
    return {p: sorted(offsets) for p, offsets in sorted(out.items())}


@pytest.mark.parametrize("logs", LOGS)
def test_a_tail_publication_whose_tail_was_merged_and_vacuumed_publishes_it_all(
    local_store: Target, logs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(local_store)
    expected = make_topic(store, logs, {"table.format": "delta"})
    pause = pause_at(monkeypatch, tail_module, "tail_groups", lambda: merge_and_vacuum(local_store))
    report = publish_table(open_store(local_store), "t", tail=True)
    assert pause.deleted
    assert report.covered == {p: len(rows) for p, rows in expected.items()}
    assert table_offsets(store) == {p: [o for o, _ in rows] for p, rows in expected.items()}


def test_each_topic_log_has_its_own_delta_application_id(local_store: Target) -> None:
    """Escaped bug: with one application id for every topic log the table held partitions 1
    and 3 only (the last log's state stood for both)."""
    store = open_store(local_store)
    expected = make_topic(store, 2, {"table.format": "delta"})
    report = publish_table(store, "t", tail=True)
    assert report.covered == {p: len(rows) for p, rows in expected.items()}
    assert table_offsets(store) == {p: [o for o, _ in rows] for p, rows in expected.items()}
    snapshot = read_snapshot(store.storage, table_dir(store.topic("t")))
    topic_id = store.topic("t").topic_id
    assert {app: v >= 0 for app, v in snapshot.txns.items()} == {
        f"kstore-{topic_id}-log-0": True,
        f"kstore-{topic_id}-log-1": True,
    }
