"""Retention and vacuum (kstore.retention), run in this process (spark=None), on local disk and
the essential ones on SeaweedFS. The same functions run in Spark tasks in
tests/test_jobs_spark.py."""

from __future__ import annotations

import os
import random
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kstore.compaction import merge_segments, run_compaction
from kstore.retention import MIN_ORPHAN_AGE_MS, run_retention, vacuum
from kstore.retention.main import main as retention_main

from kstore import Store
from kstore import clock as kstore_clock
from kstore.consumer import Consumer
from kstore.errors import InvalidConfigurationError, OffsetOutOfRangeError
from kstore.layout import topic_data_dir
from kstore.log import version_file
from kstore.records import TopicPartition
from kstore.storage import Storage
from tests.commit_logs import commit_logs_fixture
from tests.commit_logs_extra import open_target, target_params
from tests.test_jobs_support import (
    BACKENDS,
    Target,
    append,
    now_ms,
    open_store,
    rows,
    segment_files,
)

HOUR = 3_600_000
DAY = 24 * HOUR

commit_logs = commit_logs_fixture()


class CountingStorage(Storage):
    """Records every path read, to show what a job looked at."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads: list[str] = []

    def read(self, rel: str) -> bytes:
        self.reads.append(rel)
        return super().read(rel)


@pytest.mark.parametrize("target", target_params(BACKENDS))
def test_retention_by_time_removes_old_segments_and_advances_the_log_start(
    target: tuple[str, int], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two partitions: in one topic log, or (commit.logs 3) each in its own."""
    where: Target = open_target(request, monkeypatch, target)
    store = open_store(where)
    store.create_topic("events", 2, {"retention.ms": HOUR})
    now = now_ms()
    for p in range(2):
        part = store.partition("events", p)
        append(part, [b"a", b"b"], [b"1", b"2"], [now - 3 * HOUR, now - 2 * HOUR])  # expired
        append(part, [b"c"], [b"3"], [now - 2 * HOUR])  # expired
        append(
            part, [b"d", b"e"], [b"4", b"5"], [now - 3 * HOUR, now - HOUR // 2]
        )  # newest is young
        append(part, [b"f"], [b"6"], [now - 5 * HOUR])  # old, but after a young one: stays
    summary = run_retention(None, *where, verbose=False, now_ms=now)
    assert summary.count("committed") == 2
    assert summary.segments_removed == 4
    assert summary.records_dropped == 6
    for p in range(2):
        part = store.partition("events", p)
        state = part.state()
        assert state.log_start_offset == 3
        assert state.end_offset == 6
        assert rows(part) == [(3, b"d", b"4"), (4, b"e", b"5"), (5, b"f", b"6")]
        assert sorted(state.removed) == sorted(set(state.removed))
        assert len(state.removed) == 2
    # Nothing more is due; a later clock removes the rest, and the end offset survives.
    assert run_retention(None, *where, verbose=False, now_ms=now).count("committed") == 0
    run_retention(None, *where, verbose=False, now_ms=now + 2 * HOUR)
    for p in range(2):
        state = Store(*where).partition("events", p).state()
        assert state.segments == []
        assert state.log_start_offset == 6 == state.end_offset


@pytest.mark.parametrize("target", BACKENDS)
def test_retention_by_size_keeps_at_least_retention_bytes(
    target: str, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("events", 1)
    part = store.partition("events", 0)
    for i in range(6):
        append(part, [b"k"], [b"%d" % i], now_ms())
    sizes = [s.size_bytes for s in part.state().segments]
    # Room for 2.5 segments: Kafka removes a segment only if the rest stays >= retention.bytes,
    # so three segments stay.
    limit = sizes[0] * 5 // 2
    store.alter_topic_config("events", {"retention.bytes": limit})
    summary = run_retention(None, *where, verbose=False)
    state = part.state()
    assert summary.segments_removed == 3
    assert state.log_start_offset == 3
    assert state.size_bytes >= limit
    assert [o for o, _, _ in rows(part)] == [3, 4, 5]


def test_retention_reads_manifests_only(tmp_path: Path, commit_logs: int) -> None:
    storage = CountingStorage(str(tmp_path / "store"))
    store = Store.from_storage(storage)
    store.create_topic("a", 3, {"retention.ms": HOUR})
    store.create_topic("b", 2, {"retention.bytes": 1})
    for name, count in (("a", 3), ("b", 2)):
        for p in range(count):
            for _ in range(3):
                append(store.partition(name, p), [b"k"], [b"v"], now_ms() - 2 * HOUR)
    storage.reads.clear()
    summary = run_retention(None, store, verbose=False)
    assert summary.segments_removed == 3 * 3 + 2 * 2  # "b" keeps one segment of each partition
    assert storage.reads, "it read the manifests"
    assert not [r for r in storage.reads if "/segments/" in r]


def test_a_consumer_before_the_new_log_start(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("events", 1, {"retention.ms": HOUR})
    part = store.partition("events", 0)
    now = now_ms()
    append(part, [b"a", b"b"], [b"1", b"2"], now - 2 * HOUR)
    append(part, [b"c", b"d"], [b"3", b"4"], now)
    tp = TopicPartition("events", 0)
    consumers = {
        policy: Consumer(store=store, auto_offset_reset=policy)
        for policy in ("none", "earliest", "latest")
    }
    for consumer in consumers.values():
        consumer.assign([tp])
        consumer.seek(tp, 0)
    run_retention(None, *local_store, verbose=False, now_ms=now)
    with pytest.raises(OffsetOutOfRangeError, match="outside the live range"):
        consumers["none"].poll(timeout_ms=0)
    with pytest.raises(OffsetOutOfRangeError):
        list(part.read(0))
    records = consumers["earliest"].poll(timeout_ms=500)[tp]
    assert [(r.offset, r.value) for r in records] == [(2, b"3"), (3, b"4")]
    assert consumers["latest"].poll(timeout_ms=0) == {}
    assert consumers["latest"].position(tp) == 4
    for consumer in consumers.values():
        consumer.close()


def test_retention_leaves_compact_only_topics_and_open_transactions_alone(
    local_store: Target,
) -> None:
    store = open_store(local_store)
    store.create_topic("users", 1, {"cleanup.policy": "compact", "retention.ms": 0})
    store.create_topic("events", 1, {"retention.ms": 0})
    old = now_ms() - DAY
    append(store.partition("users", 0), [b"a"], [b"1"], old)
    events = store.partition("events", 0)
    append(events, [b"a"], [b"1"], old)
    from tests.test_jobs_support import table

    events.commit_segments([events.write_segment(table([b"t"], [b"open"], old))], transaction="p:0")
    append(events, [b"b"], [b"2"], old)
    summary = run_retention(None, *local_store, verbose=False)
    assert [p.topic for p in summary.partitions] == ["events"]
    assert store.partition("users", 0).state().segments[0].base_offset == 0
    # Only the segment before the open transaction goes.
    assert events.state().log_start_offset == 1
    assert len(events.state().segments) == 2
    events.end_transaction("p", 0, 0, commit=True)
    run_retention(None, *local_store, verbose=False)
    assert events.state().segments == []
    assert events.state().log_start_offset == 3


# -- vacuum -------------------------------------------------------------------------------------


def orphan_name(named_ms: int) -> str:
    return f"segments/{named_ms:013d}-{uuid.uuid4().hex}.arrow"


@pytest.mark.parametrize("target", BACKENDS)
def test_vacuum_deletes_old_orphans_and_keeps_young_ones(
    target: str, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    append(part, [b"a"], [b"1"], now_ms())
    # The job's clock runs 2 hours ahead; a file's age counts from the later of its name's
    # time and its modification time (which storage sets to now).
    clock = now_ms() + 2 * HOUR
    old, young = orphan_name(now_ms() - 1000), orphan_name(clock - 1000)
    for name in (old, young):  # a writer crashed after writing, before committing
        store.storage.put_if_absent(f"{part.directory}/{name}", b"orphan")
    dry = vacuum(None, *where, verbose=False, dry_run=True, now_ms=clock)
    assert dry.files == [f"{part.directory}/{old}"]
    assert dry.count("dry-run") == 1
    assert len(segment_files(store, part)) == 3
    assert vacuum(None, *where, verbose=False).files == []  # by the real clock nothing is old
    done = vacuum(None, *where, verbose=False, now_ms=clock)
    assert done.files == [f"{part.directory}/{old}"]
    assert {f"segments/{n}" for n in segment_files(store, part)} == {
        part.state().segments[0].path,
        young,
    }
    assert rows(part) == [(0, b"a", b"1")]
    with pytest.raises(InvalidConfigurationError, match="orphan_age_ms"):
        vacuum(None, *where, verbose=False, orphan_age_ms=MIN_ORPHAN_AGE_MS - 1)


def test_vacuum_deletes_old_temporary_files(local_store: Target) -> None:
    store = open_store(local_store)
    meta = store.create_topic("t", 1)
    part = store.partition("t", 0)
    append(part, [b"a"], [b"1"], now_ms())
    incarnation = topic_data_dir("t", meta.topic_id)
    for sub in ("_data", "_log"):
        for name, age in ((".tmp-" + "0" * 32, 2 * HOUR), (".tmp-" + "1" * 32, 0)):
            path = Path(store.storage.full_path(f"{incarnation}/{sub}/{name}"))
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"half")
            stamp = (now_ms() - age) / 1000
            os.utime(path, (stamp, stamp))
    summary = vacuum(None, *local_store, verbose=False)
    assert sorted(f.rsplit("/", 2)[-2] + "/" + f.rsplit("/", 1)[-1] for f in summary.files) == [
        "_data/.tmp-" + "0" * 32,
        "_log/.tmp-" + "0" * 32,
    ]


class Clock:
    """Moves the monotonic clock (what writers and readers use to tell how long ago they last
    saw the newest state) forward with the jobs' clock, as if that much time had passed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.offset_ms = 0
        real = time.monotonic
        monkeypatch.setattr(time, "monotonic", lambda: real() + self.offset_ms / 1000)
        # The ages of PROTOCOL.md 23.1 and 23.2 are read from kstore.clock: it moves too.
        monkeypatch.setattr(kstore_clock, "_offset", kstore_clock._offset)

    def advance(self, ms: int) -> int:
        self.offset_ms += ms
        kstore_clock.advance(ms / 1000)
        return now_ms() + self.offset_ms


@pytest.mark.parametrize("target", target_params(BACKENDS))
def test_vacuum_never_deletes_a_file_the_latest_manifest_references(
    target: tuple[str, int], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random appends, compactions, merges and retentions, each followed by the most aggressive
    vacuum possible (31 days later: every removed file past its grace, every unreferenced file
    an orphan, old log versions past retention), with long-lived writers: every live segment
    stays and reads back verified, and no acknowledged append is lost. Two partitions: in
    one topic log, or (commit.logs 3) each in its own."""
    where: Target = open_target(request, monkeypatch, target)
    store = open_store(where)
    config = {
        "cleanup.policy": "compact,delete",
        "min.cleanable.dirty.ratio": 0.0,
        "segment.bytes": 4000,
        "retention.bytes": 20_000,
        "file.delete.delay.ms": 10_000,  # the smallest allowed
        "checkpoint.interval": 4,
    }
    store.create_topic("t", 2, config)
    rng = random.Random(11)
    clock = Clock(monkeypatch)
    acked: dict[int, list[tuple[int, bytes]]] = {0: [], 1: []}
    for step in range(12):
        for p in range(2):
            part = store.partition("t", p)  # the same Partition objects throughout
            values = [rng.randbytes(60) for _ in range(8)]
            base = append(part, [b"k%d" % rng.randrange(30) for _ in range(8)], values, now_ms())
            acked[p].extend((base + i, v) for i, v in enumerate(values))
        job = step % 3
        if job == 0:
            run_compaction(None, *where, verbose=False)
        elif job == 1:
            merge_segments(None, *where, verbose=False)
        else:
            run_retention(None, *where, verbose=False)
        summary = vacuum(None, *where, verbose=False, now_ms=clock.advance(31 * DAY))
        assert not summary.errors
        fresh = Store(*where)
        for p in range(2):
            part = fresh.partition("t", p)
            state = part.state()
            assert {f"segments/{n}" for n in segment_files(fresh, part)} == {
                s.path for s in state.segments
            }
            assert state.end_offset == len(acked[p])
            # Every acknowledged record is there unless compaction or retention removed it by
            # the rules: at most the newest of its key, and nothing below the log start.
            got = {o: v for o, _, v in rows(part)}
            assert set(got) <= {o for o, _ in acked[p]}
            assert all(got[o] == v for o, v in acked[p] if o in got)
            newest = max(o for o, _ in acked[p])
            assert newest in got  # the last append always survives


def test_a_long_idle_writer_and_reader_reload_past_deleted_log_versions(
    local_store: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(local_store)
    store.create_topic("t", 1, {"checkpoint.interval": 3})
    idle_writer = store.partition("t", 0)
    append(idle_writer, [b"k"], [b"first"], now_ms())
    idle_reader = Store(*local_store).partition("t", 0)
    assert len(rows(idle_reader)) == 1
    other = Store(*local_store).partition("t", 0)
    for i in range(10):
        append(other, [b"k"], [b"%d" % i], now_ms())
    clock = Clock(monkeypatch)
    summary = vacuum(None, *local_store, verbose=False, now_ms=clock.advance(31 * DAY))
    assert f"{idle_writer.log.directory}/{version_file(1)}" in summary.files
    # The idle writer's cached state is at version 1, whose successor is deleted: it reloads
    # rather than publishing a new version 2 that no reader would ever see.
    offset = append(idle_writer, [b"k"], [b"late"], now_ms())
    assert offset == 11
    assert rows(Store(*local_store).partition("t", 0))[-1] == (11, b"k", b"late")
    assert rows(idle_reader)[-1] == (11, b"k", b"late")


def test_vacuum_deletes_stale_topic_incarnations(local_store: Target) -> None:
    store = open_store(local_store)
    old_id = store.create_topic("t", 1).topic_id
    append(store.partition("t", 0), [b"k"], [b"old"], now_ms())
    root = Path(store.storage.root)
    saved = root.parent / "saved"
    shutil.copytree(root / topic_data_dir("t", old_id), saved)
    store.delete_topic("t")
    # As if the delete had crashed (deletion now keeps the files for file.delete.delay.ms).
    shutil.copytree(saved, root / topic_data_dir("t", old_id), dirs_exist_ok=True)
    new_id = store.create_topic("t", 1).topic_id
    append(store.partition("t", 0), [b"k"], [b"new"], now_ms())
    store.create_topic("gone", 1)
    gone_id = store.topic("gone").topic_id
    append(store.partition("gone", 0), [b"k"], [b"gone"], now_ms())
    (root / "saved-gone").mkdir()
    shutil.copytree(root / topic_data_dir("gone", gone_id), root / "saved-gone" / "d")
    store.delete_topic("gone")
    shutil.copytree(
        root / "saved-gone" / "d", root / topic_data_dir("gone", gone_id), dirs_exist_ok=True
    )
    assert vacuum(None, *local_store, verbose=False).extra_files == []  # too recent
    summary = vacuum(None, *local_store, verbose=False, now_ms=now_ms() + 2 * HOUR)
    assert summary.extra_files == [topic_data_dir("gone", gone_id), topic_data_dir("t", old_id)]
    assert not (root / topic_data_dir("t", old_id)).exists()
    assert (root / topic_data_dir("t", new_id)).exists()
    assert rows(store.partition("t", 0)) == [(0, b"k", b"new")]


def test_the_command_line_runs_without_spark(
    local_store: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(local_store)
    store.create_topic("events", 1, {"retention.ms": 0})
    append(store.partition("events", 0), [b"a"], [b"1"], now_ms() - HOUR)
    url = local_store[0]
    assert retention_main(["--store", url, "--local", "--dry-run", "--quiet"]) == 0
    assert "would change 1" in capsys.readouterr().out
    assert store.partition("events", 0).state().segments
    assert (
        retention_main(["--store", url, "--local", "--json", "-", "all", "--topic", "events"]) == 0
    )
    out = capsys.readouterr().out
    assert '"operation": "retention"' in out
    assert '"operation": "vacuum"' in out
    assert store.partition("events", 0).state().segments == []
    # Bad input: a clear message and exit status 2, no traceback.
    assert retention_main(["--store", url + "-missing", "--local"]) == 2
    assert retention_main(["--store", url, "--local", "vacuum", "--orphan-age-ms", "1"]) == 2
    assert "orphan_age_ms" in capsys.readouterr().err


def test_vacuum_keeps_files_a_running_spark_batch_has_not_committed_yet(
    local_store: Target,
) -> None:
    """A long Spark micro-batch holds written files for longer than the orphan age: while its
    write intent is recorded they are not orphans (the driver commits them at the end)."""
    import json

    store = open_store(local_store)
    meta = store.create_topic("t", 1)
    part = store.partition("t", 0)
    append(part, [b"a"], [b"1"], now_ms())
    clock = now_ms() + 2 * HOUR
    in_flight, orphan = orphan_name(now_ms() - 1000), orphan_name(now_ms() - 2000)
    for name in (in_flight, orphan):
        store.storage.put_if_absent(f"{part.directory}/{name}", b"written, not yet committed")
    intent = [{"topic": "t", "topicId": meta.topic_id, "partition": 0, "path": in_flight}]
    store.storage.put(
        "spark/pending/stream-abc-00000000000000000007.1.json", json.dumps(intent).encode()
    )
    done = vacuum(None, *local_store, verbose=False, now_ms=clock)
    assert done.files == [f"{part.directory}/{orphan}"]  # the one no intent names
    assert in_flight.removeprefix("segments/") in segment_files(store, part)
