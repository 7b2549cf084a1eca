"""Late writes and gaps (PROTOCOL.md 14.1, 23.2): a writer stopped between its last check and
its write, for longer than the rules' bounds, must not lose or misnumber acknowledged records,
and a reader must not take a gap in a log for its end.

Pauses are made through the clock the code reads (``kstore.clock.advance``), storage ages
through vacuum's ``now_ms`` or the files' times, so each test takes seconds, not days.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kstore.retention import vacuum

from kstore import Store, clock
from kstore.errors import CorruptLogError, StaleWriteError, WithdrawnCommitError
from kstore.groups import Group
from kstore.log import (
    LAST_CHECKPOINT,
    STALE_STATE_S,
    Log,
    LogState,
    checkpoint_file,
    decode_commit,
    parse_log_file_name,
    version_file,
)
from kstore.producer import Producer
from kstore.records import OffsetAndMetadata, TopicPartition
from tests.test_jobs_support import Target, now_ms, open_store, rows

DAY_MS = 86_400_000
MINUTE_S = 60.0
ALL = ["memory_store", "local_store", pytest.param("seaweed_store", marks=pytest.mark.s3)]
FAST = ["memory_store", "local_store"]
# Every flush a data object (none carried by its commit, PROTOCOL.md 11.8), a checkpoint
# every 5 versions.
TOPIC = {"commit.inline.bytes": 0, "checkpoint.interval": 5}


@pytest.fixture(autouse=True)
def _clock_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's pauses stay its own: the process clock's offset is put back after it."""
    monkeypatch.setattr(clock, "_offset", clock._offset)


def _put_hook(storage: Any, when: Callable[[str], bool], action: Callable[[], None]) -> None:
    """Run ``action`` once, inside the first ``put_if_absent`` of a path ``when`` accepts,
    right before the write itself: a writer stopped after its last check."""
    real = storage.put_if_absent
    fired = []

    def put_if_absent(rel: str, data: Any, *, durable: bool = True) -> None:
        if not fired and when(rel):
            fired.append(rel)
            action()
        real(rel, data, durable=durable)

    storage.put_if_absent = put_if_absent


def _flushes(store: Store, topic: str, count: int, tag: str) -> list[tuple[int, int]]:
    """``count`` flushes of one record to each of two partitions; their acknowledged
    (partition, offset)s."""
    acked: list[tuple[int, int]] = []
    with Producer(store, linger_ms=60_000) as producer:
        for i in range(count):
            futures = [
                producer.send(topic, value=f"{tag}{i}-{p}".encode(), key=b"k", partition=p)
                for p in (0, 1)
            ]
            producer.flush()
            acked += [(f.get().partition, f.get().offset) for f in futures]
    return acked


def _everything(where: Target, topic: str) -> dict[tuple[int, int], bytes | None]:
    """Every live record of the topic's two partitions, by (partition, offset), read through a
    Store opened afresh (a new process would read the same)."""
    fresh = Store(*where)
    return {
        (p, offset): value for p in (0, 1) for offset, _, value in rows(fresh.partition(topic, p))
    }


def _topic_log(store: Store, topic: str) -> Log[Any]:
    return store.topic_log(topic, store.topic(topic), 0).log


@pytest.mark.parametrize("target", ALL)
def test_a_checkpoint_written_late_after_vacuum_loses_nothing(
    target: str, request: pytest.FixtureRequest
) -> None:
    """Issue 45, defect 2: writer A commits version 10 and stops as it starts checkpoint 10;
    writer B goes on to version 50 and more; vacuum, a log retention later, deletes the versions
    below B's newest checkpoint; A resumes and writes checkpoint 10 (inside its PUT, after its
    checks, or as a writer of an earlier release that also points the hint back at it). Fresh
    readers and writers must still see B's versions, and a second vacuum must delete none of
    B's data."""
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("t", 2, TOPIC)
    acked = _flushes(store, "t", 11, "a")  # versions 0 to 10
    paused_log = _topic_log(Store(*where), "t")
    late = paused_log.load()
    assert late.version == 10
    acked += _flushes(store, "t", 42, "b")  # B: versions 11 to 52, checkpoints every 5
    newest = _topic_log(store, "t").load().version
    assert newest == 52
    later = now_ms() + 3 * DAY_MS
    first = vacuum(None, *where, verbose=False, now_ms=later)
    assert first.errors == []
    log_dir = paused_log.directory
    kept = sorted(
        parsed[0]
        for info in store.storage.list_dir(log_dir)
        if (parsed := parse_log_file_name(info.name)) is not None and not parsed[1]
    )
    assert kept[0] == 50  # the premise: versions below checkpoint 50 are gone

    # A, stopped before its checks for three days, is refused and writes nothing.
    clock.advance(3 * 86_400)
    with pytest.raises(StaleWriteError):
        paused_log.write_checkpoint(late.copy())
    assert not store.storage.exists(f"{log_dir}/{checkpoint_file(10)}")

    # A, stopped inside its PUT after passing its checks: the checkpoint lands, the hint stays.
    late.confirmed_at = clock.monotonic()
    written: dict[str, bytes] = {}
    real_put = paused_log.storage.put_if_absent

    def keep(rel: str, data: Any, *, durable: bool = True) -> None:
        if rel.endswith(checkpoint_file(10)):
            written[rel] = bytes(data)
            clock.advance(3 * 86_400)
        real_put(rel, data, durable=durable)

    paused_log.storage.put_if_absent = keep  # type: ignore[method-assign]
    with pytest.raises(StaleWriteError):
        paused_log.write_checkpoint(late.copy())
    hint = store.storage.read_if_exists(f"{log_dir}/{LAST_CHECKPOINT}")
    assert hint is not None
    assert b'"version": 50' in hint.replace(b":50", b": 50")
    # Its commit is gone, so A deleted it again.
    assert not store.storage.exists(f"{log_dir}/{checkpoint_file(10)}")

    # A writer of an earlier release puts it back and points the hint at it.
    ((path, payload),) = written.items()
    store.storage.put_if_absent(path, payload)
    store.storage.put(f"{log_dir}/{LAST_CHECKPOINT}", b'{"version": 10}')

    assert _topic_log(Store(*where), "t").load().version == newest
    everything = _everything(where, "t")
    assert sorted(everything) == sorted(acked)
    # A fresh producer commits after B's versions, at new offsets, and is read back.
    more = _flushes(Store(*where), "t", 1, "c")
    assert all(offset == 53 for _, offset in more)
    second = vacuum(None, *where, verbose=False, now_ms=later + DAY_MS)
    assert second.errors == []
    assert sorted(_everything(where, "t")) == sorted(acked + more)


@pytest.mark.parametrize("target", ALL)
def test_a_commit_whose_put_lands_past_the_orphan_age_is_withdrawn_not_acknowledged(
    target: str, request: pytest.FixtureRequest
) -> None:
    """Issue 45, defect 4: a producer stopped inside its commit's PUT, after the last age
    check, while vacuum runs 11 minutes later with a 10-minute orphan age and deletes its data
    object. The PUT lands; the producer must not acknowledge the record, and the partition must
    stay readable (no commit naming a missing file is left live)."""
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("t", 1, TOPIC)
    deleted: list[str] = []

    def stopped_for_eleven_minutes() -> None:
        clock.advance(11 * MINUTE_S)
        summary = vacuum(
            None, *where, verbose=False, now_ms=now_ms() + 11 * 60_000, orphan_age_ms=600_000
        )
        deleted.extend(summary.files)

    _put_hook(store.storage, lambda rel: rel.endswith(version_file(0)), stopped_for_eleven_minutes)
    with Producer(store, linger_ms=0, retries=0) as producer:
        future = producer.send("t", value=b"lost?", key=b"k", partition=0)
        producer.flush()
        with pytest.raises(WithdrawnCommitError):
            future.get()
    assert [path.rsplit("/", 2)[-2] for path in deleted] == ["_data"]  # the premise
    fresh = Store(*where)
    assert rows(fresh.partition("t", 0)) == []  # readable: the add was taken back
    # The topic goes on: the next record is acknowledged and read at its offset.
    with Producer(fresh, linger_ms=0) as producer:
        offset = producer.send("t", value=b"next", key=b"k", partition=0).get().offset
    assert rows(Store(*where).partition("t", 0)) == [(offset, b"k", b"next")]


@pytest.mark.parametrize("target", ALL)
def test_a_commit_whose_put_returns_late_but_whose_files_stood_is_acknowledged(
    target: str, request: pytest.FixtureRequest
) -> None:
    """The other side of the rule: a PUT that returns past the commit deadline (the writer's
    clock jumped, a suspend) whose files the storage recorded moments before the commit is
    confirmed by the storage's times and acknowledged."""
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("t", 1, TOPIC)
    _put_hook(
        store.storage,
        lambda rel: rel.endswith(version_file(0)),
        lambda: clock.advance(30 * MINUTE_S),
    )
    with Producer(store, linger_ms=0, retries=0) as producer:
        offset = producer.send("t", value=b"kept", key=b"k", partition=0).get().offset
    assert rows(Store(*where).partition("t", 0)) == [(offset, b"k", b"kept")]


def test_a_commit_whose_files_the_storage_recorded_long_before_it_is_withdrawn(
    local_store: Target,
) -> None:
    """A commit that lands while its data object is still there but was recorded more than the
    minimum orphan age before it: vacuum may be about to delete it, so the commit is withdrawn.
    (Local disk: the object's time is set back, as a storage would have recorded it.)"""
    store = open_store(local_store)
    store.create_topic("t", 1, TOPIC)
    root = Path(store.storage.root)

    def aged() -> None:
        clock.advance(11 * MINUTE_S)
        old = time.time() - 11 * 60
        for path in root.rglob("*.kdat"):
            os.utime(path, (old, old))

    _put_hook(store.storage, lambda rel: rel.endswith(version_file(0)), aged)
    with Producer(store, linger_ms=0, retries=0) as producer:
        future = producer.send("t", value=b"x", key=b"k", partition=0)
        producer.flush()
        with pytest.raises(WithdrawnCommitError):
            future.get()
    assert rows(Store(*local_store).partition("t", 0)) == []


class _Counter(LogState):
    """A minimal log state: the sum of its commits' ``n`` actions."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def apply(self, name: str, body: dict[str, Any]) -> None:
        if name == "n":
            self.total += body["v"]
        else:
            super().apply(name, body)

    def checkpoint_actions(self) -> list[dict[str, Any]]:
        return [*super().checkpoint_actions(), {"n": {"v": self.total}}]


def _counter_log(store: Store) -> Log[_Counter]:
    return Log(store.storage, "logs/counter", _Counter, checkpoint_interval=5)


def _add(log: Log[_Counter], state: _Counter, value: int = 1) -> _Counter:
    result = log.commit(state, lambda _: [{"n": {"v": value}}], operation="ADD")
    assert result is not None
    return result.state


def _vacuum_below(store: Store, log: Log[_Counter], keep_from: int) -> None:
    """What vacuum does to an old log (17.5): the hint pointed at K, every version below gone."""
    store.storage.put(f"{log.directory}/{LAST_CHECKPOINT}", b'{"version": %d}' % keep_from)
    gone = [
        f"{log.directory}/{info.name}"
        for info in store.storage.list_dir(log.directory)
        if (parsed := parse_log_file_name(info.name)) is not None and parsed[0] < keep_from
    ]
    store.storage.delete(gone)


def _age_log(store: Store, log: Log[_Counter], days: float) -> None:
    when = time.time() - days * 86_400
    for path in (Path(store.storage.root) / log.directory).iterdir():
        os.utime(path, (when, when))


def _behind_a_vacuumed_log(
    local_store: Target,
) -> tuple[Store, Log[_Counter], _Counter]:
    """A writer holding version 10 of a log that another writer took to version 60 and that
    vacuum, three days later, cut below checkpoint 60: the writer's next version, 11, was
    written and deleted."""
    store = open_store(local_store)
    writer, other = _counter_log(store), _counter_log(open_store(local_store))
    state = writer.load()
    for _ in range(11):
        state = _add(writer, state)
    theirs = other.load()
    for _ in range(50):
        theirs = _add(other, theirs)
    _age_log(store, other, 3)
    _vacuum_below(store, other, 60)
    return store, writer, state


def test_a_commit_built_on_a_state_that_went_stale_before_its_put_is_built_again(
    local_store: Target,
) -> None:
    """A commit that names no file (markers, offsets, `vacuumed`) is checked for staleness when
    it starts; a writer stopped after that, while the log moved on and vacuum deleted the
    versions after its state, must not take a deleted version's name (23.2)."""
    store, writer, state = _behind_a_vacuumed_log(local_store)

    def paused_while_building(current: _Counter) -> list[dict[str, Any]]:
        if current.version == 10:
            clock.advance(STALE_STATE_S + 3600)  # stopped for 25 hours
        return [{"n": {"v": 1000}}]

    result = writer.commit(state, paused_while_building, operation="ADD")
    assert result is not None
    assert result.version == 61
    assert _counter_log(open_store(local_store)).load().total == 1061
    assert not store.storage.exists(f"{writer.directory}/{version_file(11)}")


def test_a_commit_that_lands_on_a_vacuumed_version_is_voided_and_built_again(
    local_store: Target,
) -> None:
    """The same writer stopped inside its PUT, after every check: the version it names was
    written and vacuumed meanwhile, so the put-if-absent succeeds on a deleted name. The
    writer finds a checkpoint above it that the storage recorded days before, deletes its
    file and commits again after the newest version."""
    store, writer, state = _behind_a_vacuumed_log(local_store)
    _put_hook(
        store.storage,
        lambda rel: rel.endswith(version_file(11)),
        lambda: clock.advance(STALE_STATE_S + 3600),
    )
    result = writer.commit(state, lambda _: [{"n": {"v": 1000}}], operation="ADD")
    assert result is not None
    assert result.version == 61
    assert _counter_log(open_store(local_store)).load().total == 1061
    assert not store.storage.exists(f"{writer.directory}/{version_file(11)}")


def test_a_late_group_checkpoint_does_not_move_committed_offsets_back(
    local_store: Target,
) -> None:
    """Mechanism 2 in the shared Log, on a group log: a checkpoint of an old version written
    after log pruning, with the hint pointed back at it, must not hand readers old offsets."""
    from kstore.retention import prune_logs

    from kstore.layout import group_log_dir

    store = open_store(local_store)
    store.create_topic("t")
    tp = TopicPartition("t", 0)
    group = Group(store, "g")
    for offset in range(12):
        group.commit_offsets({tp: OffsetAndMetadata(offset)}, member_id=None, generation=-1)
    group_log = group.log
    old = group_log.load()
    for offset in range(12, 130):
        group.commit_offsets({tp: OffsetAndMetadata(offset)}, member_id=None, generation=-1)
    directory = Path(store.storage.root) / group_log_dir("g")
    when = time.time() - 3 * 86_400
    for path in directory.iterdir():
        os.utime(path, (when, when))
    prune_logs(store, now_ms=now_ms())
    assert not (directory / version_file(old.version)).exists()  # the premise
    # A writer of an earlier release writes its late checkpoint and points the hint at it.
    payload_actions = old.checkpoint_actions()
    from kstore.log import encode_commit

    payload = encode_commit(
        payload_actions, {"checkpointVersion": old.version, "timestamp": 0, "writer": "old"}
    )
    store.storage.put_if_absent(f"{group_log_dir('g')}/{checkpoint_file(old.version)}", payload)
    store.storage.put(f"{group_log_dir('g')}/{LAST_CHECKPOINT}", b'{"version": %d}' % old.version)
    assert Group(open_store(local_store), "g").committed(tp) == OffsetAndMetadata(129)


@pytest.mark.parametrize("target", ALL)
def test_a_missing_middle_commit_is_refused_and_never_filled(
    target: str, request: pytest.FixtureRequest
) -> None:
    """Issue 45, bad states: a deleted middle commit file was read as the end of the log (5 of
    10 records, exit 0), and the next produce wrote into the gap. Readers and writers must
    refuse the log, naming the missing version, and write nothing."""
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("t", 2, {**TOPIC, "checkpoint.interval": 1000})
    _flushes(store, "t", 10, "a")
    log_dir = _topic_log(store, "t").directory
    store.storage.delete([f"{log_dir}/{version_file(5)}"])
    before = sorted(info.name for info in store.storage.list_dir(log_dir))
    with pytest.raises(CorruptLogError, match="version 5 is missing"):
        rows(Store(*where).partition("t", 0))
    with (
        pytest.raises(CorruptLogError, match="version 5 is missing"),
        Producer(Store(*where), linger_ms=0, retries=0) as producer,
    ):
        producer.send("t", value=b"into the gap?", key=b"k", partition=0).get()
    assert sorted(info.name for info in store.storage.list_dir(log_dir)) == before


def test_a_window_that_sees_a_version_past_a_missing_one_reports_the_gap(
    memory_store: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader fetching several versions at once (an object store's catch-up windows) that
    gets a later version back but not an earlier one reads the earlier again, and reports a
    gap only when it is still missing."""
    store = open_store(memory_store)
    log = _counter_log(store)
    state = log.load()
    start = state
    for _ in range(6):
        state = _add(log, state)
    reads: list[list[str]] = []
    real = store.storage.read_many

    def read_many(paths: list[str]) -> dict[str, bytes]:
        reads.append(paths)
        found: dict[str, bytes] = real(paths)
        return found

    store.storage.read_many = read_many  # type: ignore[method-assign]
    # Windows are an object store's: make this memory store count as one.
    monkeypatch.setattr(type(store.storage), "is_remote", property(lambda self: True))
    assert log.update(start).version == 5  # windows, no gap
    store.storage.delete([f"{log.directory}/{version_file(2)}"])
    with pytest.raises(CorruptLogError, match="version 2 is missing but a later version exists"):
        log.update(start)
    assert any(len(paths) > 1 for paths in reads)  # the premise: it read windows


def test_the_clock_counts_suspended_time_and_advances_the_reload_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kstore.clock reads CLOCK_BOOTTIME (it counts a suspend) and every staleness rule reads
    kstore.clock: a jump of a day makes a state stale."""
    if hasattr(time, "CLOCK_BOOTTIME"):
        assert abs(clock._boottime() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1.0
        # As the module sets it up (a torture driver earlier in this process may follow jumps).
        monkeypatch.setattr(clock, "_read", clock._boottime)
        monkeypatch.setattr(clock, "_offset", 0.0)
        assert abs(clock.monotonic() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 1.0
    state = LogState()
    assert not state.stale()
    clock.advance(STALE_STATE_S + 1)
    assert state.stale()
    with pytest.raises(ValueError):
        clock.advance(-1)


@pytest.mark.parametrize("target", FAST)
def test_the_hint_never_moves_back(target: str, request: pytest.FixtureRequest) -> None:
    """A checkpoint of an older version, written after a newer one (two writers, or one
    background checkpoint overtaking another), leaves ``_last_checkpoint`` where it was."""
    store = open_store(request.getfixturevalue(target))
    log = _counter_log(store)
    state = log.load()
    states = []
    for _ in range(11):
        state = _add(log, state)
        states.append(state)
    assert log._hinted_version() == 10
    older = states[6].copy()  # version 6
    older.confirmed_at = clock.monotonic()
    log.write_checkpoint(older)
    assert store.storage.exists(f"{log.directory}/{checkpoint_file(6)}")
    assert log._hinted_version() == 10


def test_a_merge_whose_commit_lands_past_the_orphan_age_is_taken_back_whole(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge stopped inside its commit's PUT while vacuum, eleven minutes later, deletes the
    Parquet file it wrote (an orphan then): the commit lands, removing the merged ranges'
    originals and naming a missing file. The merge takes it back whole: the originals are
    added again (their delete delay counts from the commit, so they are still there), and
    each partition's own merge then does the work again. Every record reads at its offset."""
    from kstore.compaction import merge_segments

    from kstore.storage import Storage

    where: Target = request.getfixturevalue("local_store")
    store = open_store(where)
    store.create_topic("t", 2, TOPIC)
    acked = _flushes(store, "t", 6, "a")
    before = _everything(where, "t")
    assert sorted(before) == sorted(acked)
    log_dir = _topic_log(store, "t").directory
    merge_version = _topic_log(store, "t").load().version + 1
    deleted: list[str] = []
    real_put = Storage.put_if_absent

    def put_if_absent(self: Storage, rel: str, data: Any, *, durable: bool = True) -> None:
        if rel == f"{log_dir}/{version_file(merge_version)}" and not deleted:
            clock.advance(11 * MINUTE_S)
            summary = vacuum(
                None, *where, verbose=False, now_ms=now_ms() + 11 * 60_000, orphan_age_ms=600_000
            )
            deleted.extend(summary.files or ["nothing"])
        real_put(self, rel, data, durable=durable)

    monkeypatch.setattr(Storage, "put_if_absent", put_if_absent)
    summary = merge_segments(None, *where, verbose=False)
    monkeypatch.undo()
    assert any(path.endswith(".parquet") for path in deleted), deleted  # the premise
    assert summary.errors == []
    assert _everything(where, "t") == before
    operations = [
        decode_commit(store.storage.read(f"{log_dir}/{version_file(v)}"), "")[0]["operation"]
        for v in range(merge_version, merge_version + 2)
    ]
    assert operations == ["MERGE", "WITHDRAW"]
