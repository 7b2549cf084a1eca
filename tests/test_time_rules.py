"""The time rules of PROTOCOL.md 23.1: which clock judges each age, and the bounds that tie a
writer's commit deadline, vacuum's orphan age and file.delete.delay.ms together."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kstore.compaction import run_compaction
from kstore.compaction.jobs import WorkItem
from kstore.retention import MIN_LOG_RETENTION_MS, vacuum, vacuum_partition
from kstore.retention.vacuum import StorageClock

from kstore import Store
from kstore.config import (
    MAX_UNCOMMITTED_MS,
    MIN_FILE_DELETE_DELAY_MS,
    MIN_ORPHAN_AGE_MS,
    read_config,
)
from kstore.errors import InvalidConfigurationError, StaleWriteError
from kstore.log import RetryPolicy
from kstore.manifest import PartitionState
from kstore.producer import Producer
from kstore.storage import Storage
from tests.test_jobs_support import append

ELEVEN_MINUTES_MS = 11 * 60_000


class ManualClock:
    """A monotonic clock that moves only when told to: a writer's pause, without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class PausingStorage(Storage):
    """Runs ``pause`` once, right after the first segment file or data object is written: the
    moment a writer holds a written segment it has not committed yet (a GC pause, SIGSTOP, a
    frozen VM)."""

    def __init__(self, url: str, pause: Callable[[], None]) -> None:
        super().__init__(url)
        self.pause: Callable[[], None] | None = pause

    def put_new(self, rel: str, data: bytes | memoryview, *, durable: bool = True) -> None:
        super().put_new(rel, data, durable=durable)
        if ("/segments/" in rel or "/_data/" in rel) and self.pause is not None:
            pause, self.pause = self.pause, None
            pause()


def wall_ms() -> int:
    return int(time.time() * 1000)


def values(store: Store, topic: str) -> list[bytes]:
    part = store.partition(topic, 0)
    return [v for b in part.read(0) for v in b.column("value").to_pylist()]


@pytest.mark.parametrize("transactional", [False, True])
def test_a_producer_paused_between_write_and_commit_never_commits_a_vacuumed_segment(
    tmp_path: Path, transactional: bool
) -> None:
    """The segment is a range of a data object (not data the commit carries, PROTOCOL.md
    11.8)."""
    url = f"file://{tmp_path}/store"
    Store(url).create_topic("t", 1, {"commit.inline.bytes": 0})
    clock = ManualClock()
    vacuumed: list[str] = []

    def pause() -> None:
        # 11 minutes pass for the producer (its monotonic clock) and for the storage (vacuum's
        # now): the segment just written is an unreferenced file older than the orphan age.
        clock.now += ELEVEN_MINUTES_MS / 1000
        summary = vacuum(
            None,
            url,
            verbose=False,
            orphan_age_ms=MIN_ORPHAN_AGE_MS,
            now_ms=wall_ms() + ELEVEN_MINUTES_MS,
        )
        vacuumed.extend(summary.files)

    storage = PausingStorage(url, pause)
    store = Store.from_storage(storage, create=False, retry=RetryPolicy(clock=clock))
    with Producer(store, acks="all", transactional_id="tx" if transactional else None) as producer:
        if transactional:
            producer.begin_transaction()
        metadata = producer.send("t", b"v", partition=0).get(timeout=60)
        if transactional:
            producer.commit_transaction()
    assert metadata.offset == 0
    assert len(vacuumed) == 1  # the paused write's file went; the record was written again
    assert "/_data/" in vacuumed[0]
    assert values(Store(url), "t") == [b"v"]
    # And a later vacuum by the same storage clock keeps the committed file.
    vacuum(
        None,
        url,
        verbose=False,
        orphan_age_ms=MIN_ORPHAN_AGE_MS,
        now_ms=wall_ms() + ELEVEN_MINUTES_MS,
    )
    assert values(Store(url), "t") == [b"v"]


def test_every_commit_attempt_checks_the_age_of_the_files_it_references(tmp_path: Path) -> None:
    clock = ManualClock()
    store = Store(f"file://{tmp_path}/store", retry=RetryPolicy(clock=clock))
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    table = pa.table(
        {"key": [None], "value": [b"v"]}, pa.schema([("key", pa.binary()), ("value", pa.binary())])
    )
    written_at = clock()
    segment = part.write_segment(table)
    clock.now += MAX_UNCOMMITTED_MS / 1000
    with pytest.raises(StaleWriteError, match="nothing was committed"):
        part.commit_segments([segment], written_at=written_at)
    assert part.state().version == -1
    assert part.commit_segments([segment], written_at=clock()).base_offset == 0


def test_bounds_above_the_orphan_age_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigurationError, match="delivery_timeout_ms"):
        Producer(f"file://{tmp_path}/store", delivery_timeout_ms=MAX_UNCOMMITTED_MS + 1)
    with pytest.raises(InvalidConfigurationError, match="max_uncommitted_s"):
        RetryPolicy(max_uncommitted_s=MIN_ORPHAN_AGE_MS / 1000)
    with pytest.raises(InvalidConfigurationError, match="timeout_s"):
        RetryPolicy(timeout_s=MAX_UNCOMMITTED_MS / 1000)
    assert MAX_UNCOMMITTED_MS < MIN_ORPHAN_AGE_MS


# -- removed files: the grace period by the storage's clock -----------------------------------


def compact_topic(store: Store, name: str, delay_ms: int) -> None:
    store.create_topic(
        name,
        1,
        {
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": 0.0,
            "file.delete.delay.ms": delay_ms,
        },
    )
    part = store.partition(name, 0)
    for values in ([b"1", b"2"], [b"3", b"4"]):
        append(part, [b"k", b"k"], values, wall_ms() - 600_000)  # written 10 minutes ago


def offsets(part: Any, state: Any) -> list[int]:
    return [o for b in part.read(0, state=state) for o in b.column("offset").to_pylist()]


def test_a_remover_whose_clock_is_behind_does_not_shorten_the_grace_period(
    tmp_path: Path,
) -> None:
    url = f"file://{tmp_path}/store"
    store = Store(url)
    compact_topic(store, "t", 60_000)
    part = store.partition("t", 0)
    reader_state = part.state()  # a reader holding the manifest before compaction
    # The compaction job's wall clock is 2 minutes behind: it writes deletionTimestamps 2
    # minutes in the past.
    run_compaction(None, url, verbose=False, now_ms=wall_ms() - 120_000)
    assert len(part.state().removed) == 2
    # A second later by the storage's clock, the removed files are a second old, not 2 min.
    soon = vacuum(None, url, verbose=False, now_ms=wall_ms() + 1000)
    assert soon.files_deleted == 0
    assert offsets(part, reader_state) == [0, 1, 2, 3]
    later = vacuum(None, url, verbose=False, now_ms=wall_ms() + 61_000)
    assert later.files_deleted == 2
    assert not part.state().removed


def test_the_delete_delay_has_a_floor(tmp_path: Path) -> None:
    store = Store(f"file://{tmp_path}/store")
    for value in (0, MIN_FILE_DELETE_DELAY_MS - 1):
        with pytest.raises(InvalidConfigurationError, match=r"file\.delete\.delay\.ms.*10000"):
            store.create_topic("t", 1, {"file.delete.delay.ms": value})
    store.create_topic("t", 1, {"file.delete.delay.ms": MIN_FILE_DELETE_DELAY_MS})
    with pytest.raises(InvalidConfigurationError, match=r"file\.delete\.delay\.ms"):
        store.alter_topic_config("t", {"file.delete.delay.ms": 0})
    # A value stored before the floor existed still loads, read as the floor.
    assert read_config({"file.delete.delay.ms": 0}) == {
        "file.delete.delay.ms": MIN_FILE_DELETE_DELAY_MS
    }


def test_vacuum_clamps_a_smaller_stored_delay_at_use(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/store"
    store = Store(url)
    compact_topic(store, "t", MIN_FILE_DELETE_DELAY_MS)
    run_compaction(None, url, verbose=False)
    meta = store.topic("t")
    # As a topic whose stored config says 0 would reach vacuum without the clamp on reading.
    item = WorkItem("t", meta.topic_id, 0, {**meta.effective_config, "file.delete.delay.ms": 0})
    options = {
        "now_ms": wall_ms() + MIN_FILE_DELETE_DELAY_MS // 2,
        "orphan_age_ms": MIN_ORPHAN_AGE_MS,
        "log_retention_ms": MIN_LOG_RETENTION_MS,
    }
    assert vacuum_partition(store, item, options).files_deleted == 0
    options["now_ms"] = wall_ms() + MIN_FILE_DELETE_DELAY_MS + 1000
    assert vacuum_partition(store, item, options).files_deleted == 2


@pytest.mark.s3
def test_on_an_object_store_vacuum_takes_now_from_a_probe_it_deletes(
    moto_store: tuple[str, dict[str, Any]],
) -> None:
    store = Store(*moto_store)
    store.storage.put("d/file", b"x")
    now, listing = StorageClock(store.storage, "d", None, dry_run=False).list()
    assert [i.name for i in listing] == ["file"]  # the probe is not listed as a file
    assert [i.name for i in store.storage.list_dir("d")] == ["file"]  # and it is gone
    (written,) = (i.mtime_ms for i in listing)
    assert written is not None
    assert now >= written  # the storage's time, after the file's
    # A dry run writes nothing: this machine's clock.
    _, listing = StorageClock(store.storage, "d", None, dry_run=True).list()
    assert [i.name for i in listing] == ["file"]


# -- the Spark sink ------------------------------------------------------------------------


def sink_options(url: str) -> Any:
    from kstore.spark_ext.options import parse_write_options

    return parse_write_options({"store": url, "topic": "t"}, streaming=False)


def sink_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"key": [b"k"], "value": [b"v"]})


def segment_names(store: Store, topic: str) -> set[str]:
    part = store.partition(topic, 0)
    return {i.name for i in store.storage.list_dir(f"{part.directory}/segments")}


def test_the_spark_sink_never_commits_a_file_older_than_its_bound(tmp_path: Path) -> None:
    from kstore.spark_ext.writer import KStoreCommitMessage, TaskSink, WrittenFile, commit_files

    url = f"file://{tmp_path}/store"
    store = Store(url)
    store.create_topic("t", 1)
    sink = TaskSink(sink_options(url), store, {"key": "key", "value": "value"}, seed="s", task=0)
    sink.add(sink_batch())
    (fresh,) = sink.finish()
    # The same bytes under a name from 25 hours ago: a driver that commits a day late.
    part = store.partition("t", 0)
    old_path = f"segments/{wall_ms() - 25 * 3600 * 1000:013d}-{'0' * 32}.arrow"
    data = store.storage.read(f"{part.directory}/{fresh.path}")
    store.storage.put_if_absent(f"{part.directory}/{old_path}", data)
    old = WrittenFile("t", fresh.topic_id, 0, replace(fresh.file, path=old_path), fresh.order)
    with pytest.raises(StaleWriteError, match="run the batch again"):
        commit_files(store, [KStoreCommitMessage(files=[old])], txn=None, durable=False)
    assert part.state().segments == []  # nothing committed
    assert old_path.rsplit("/", 1)[-1] not in segment_names(store, "t")  # and the file deleted
    commit_files(store, [KStoreCommitMessage(files=[fresh])], txn=None, durable=False)
    assert values(store, "t") == [b"v"]


def test_a_spark_task_paused_before_its_write_intent_writes_the_segment_again(
    tmp_path: Path,
) -> None:
    from kstore.spark_ext.writer import TaskSink, WrittenFile

    url = f"file://{tmp_path}/store"
    Store(url).create_topic("t", 1)
    clock = ManualClock()
    store = Store(url, retry=RetryPolicy(clock=clock))
    recorded: list[list[str]] = []

    def on_written(files: list[WrittenFile]) -> None:
        if not recorded:  # the task pauses between its first write and recording its intent
            clock.now += ELEVEN_MINUTES_MS / 1000
        recorded.append([f.path for f in files])

    sink = TaskSink(
        sink_options(url),
        store,
        {"key": "key", "value": "value"},
        seed="s",
        task=0,
        on_written=on_written,
    )
    sink.add(sink_batch())
    (kept,) = sink.finish()
    assert len(recorded) == 2
    assert recorded[1] == [kept.path]  # the intent names only the new file
    assert recorded[0][0] != kept.path
    # The paused write's file is gone; the new one is there.
    assert segment_names(store, "t") == {kept.path.rsplit("/", 1)[-1]}


# -- producer entries in checkpoints ---------------------------------------------------------

DAY_MS = 86_400_000


def producer_action(pid: str, timestamp_ms: int, offset: int = 0) -> dict[str, Any]:
    return {
        "id": pid,
        "epoch": 0,
        "firstSequence": 0,
        "lastSequence": 0,
        "baseOffset": offset,
        "lastOffset": offset,
        "timestamp": timestamp_ms,
    }


def checkpointed_producers(state: PartitionState) -> set[str]:
    return {a["producer"]["id"] for a in state.checkpoint_actions() if "producer" in a}


def test_a_writer_whose_clock_is_a_day_fast_does_not_expire_other_producers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Only the newest batch stays whatever the times (8.9): the others go by the times.
    monkeypatch.setattr("kstore.manifest.RECENT_PRODUCERS", 1)
    now = wall_ms()
    state = PartitionState()
    state.apply("producer", producer_action("idle", now - 3 * DAY_MS, 0))
    state.apply("producer", producer_action("honest", now, 1))
    # A writer two days fast commits last: its entry and the commit carry its clock.
    state.apply("producer", producer_action("fast", now + 2 * DAY_MS, 2))
    state.last_commit_ms = now + 2 * DAY_MS
    # The honest producer stays; the one idle for 3 days (by the honest clocks) still expires.
    assert checkpointed_producers(state) == {"honest", "fast"}


def test_producer_entries_still_expire_by_the_checkpoint_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("kstore.manifest.RECENT_PRODUCERS", 2)  # "old" is followed by more
    now = wall_ms()
    state = PartitionState()
    for offset, (pid, age) in enumerate((("old", 2 * DAY_MS), ("none", now), ("a", 0), ("b", 0))):
        state.apply("producer", producer_action(pid, now - age, offset))
    state.last_commit_ms = now
    assert checkpointed_producers(state) == {"a", "b"}  # no timestamp (0): always omitted
