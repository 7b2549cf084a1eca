"""Commits that carry their flush's data (PROTOCOL.md 7.1, 11.8, 12.7; version 5/6).

A producer flush whose data for a topic log fits ``commit.inline.bytes`` writes no data object:
the commit file holds its text, spaces up to ``dataOffset``, then the data, and each
partition's ranged add names that commit file. Checked on memory, local disk and SeaweedFS:
what is written, what readers read (and how many requests it costs), what is refused as
corrupt, races between writers, the merge, vacuum, the upgrade from 4/5."""

from __future__ import annotations

import itertools
import json
import os
import random
import threading
from typing import Any

import pytest
from kstore.cli.verify import verify_topic
from kstore.compaction import merge_segments
from kstore.retention import vacuum

from kstore import Consumer, Producer, Store, TopicPartition
from kstore.errors import CorruptLogError
from kstore.layout import topic_data_dir
from kstore.log import (
    carried_data_offset,
    decode_commit,
    encode_carrying_commit,
    version_file,
)
from kstore.manifest import is_carried_path
from kstore.topic_log import TOPIC_LOG_VERSION, TOPIC_LOG_WRITER_VERSION
from kstore.upgrade import upgrade_topic
from tests.test_jobs_support import Target, now_ms, open_store, rows

ALL = ["memory_store", "local_store", pytest.param("seaweed_store", marks=pytest.mark.s3)]
FAST = ["memory_store", "local_store"]
HOUR = 3_600_000
DAY = 24 * HOUR


def _flush(store: Store, topic: str, partitions: int, tag: bytes, **producer: Any) -> None:
    with Producer(store, linger_ms=60_000, **producer) as p:
        for part in range(partitions):
            for i in range(3):
                p.send(topic, value=tag + b"-%d-%d" % (part, i), key=b"k%d" % i, partition=part)
        p.flush()


def _values(store: Store, topic: str, partition: int) -> list[bytes | None]:
    return [v for _, _, v in rows(store.partition(topic, partition))]


def _data_objects(store: Store, topic: str) -> list[str]:
    directory = f"{topic_data_dir(topic, store.topic(topic).topic_id)}/_data"
    own = directory.rsplit("/", 1)[-1]
    return [i.name for i in store.storage.list_dir(directory) if i.name != own]


def _carried_files(store: Store, topic: str) -> set[str]:
    """The commit files whose carried data partition 0 of ``topic`` reads (store paths)."""
    incarnation = topic_data_dir(topic, store.topic(topic).topic_id)
    return {
        f"{incarnation}/{s.path}"
        for s in store.partition(topic, 0).state().segments
        if is_carried_path(s.path)
    }


def _four_carried_flushes(where: Target) -> tuple[Store, dict[int, list[bytes | None]], set[str]]:
    """Topic ``t`` (2 partitions, a checkpoint every 2 commits) after five flushes, the last
    four carried: the store, each partition's values, the carried commit files."""
    store = open_store(where)
    store.create_topic("t", 2, {"file.delete.delay.ms": 60_000, "checkpoint.interval": 2})
    for n in range(5):
        _flush(store, "t", 2, b"f%d" % n)
    before = {p: _values(store, "t", p) for p in range(2)}
    carried = _carried_files(store, "t")
    assert len(carried) == 4
    return store, before, carried


@pytest.mark.parametrize("target", ALL)
def test_a_flush_after_the_first_carries_its_data_in_the_commit(
    target: str, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("t", 3)
    _flush(store, "t", 3, b"a")  # version 0 of the topic log: a data object (12.7)
    assert len(_data_objects(store, "t")) == 1
    _flush(store, "t", 3, b"b")
    _flush(store, "t", 3, b"c")
    assert len(_data_objects(store, "t")) == 1  # no object for the carried flushes
    fresh = open_store(where)
    for p in range(3):
        segments = fresh.partition("t", p).state().segments
        assert [s.path for s in segments] == [
            segments[0].path,
            "_log/00000000000000000001.json",
            "_log/00000000000000000002.json",
        ]
        assert segments[0].path.startswith("_data/")
        assert _values(fresh, "t", p) == [
            tag + b"-%d-%d" % (p, i) for tag in (b"a", b"b", b"c") for i in range(3)
        ]
    log_dir = store.topic_logs("t")[0].directory
    raw = store.storage.read(f"{log_dir}/{version_file(2)}")
    info = json.loads(raw.split(b"\n", 1)[0])["commitInfo"]
    assert info["dataOffset"] + info["dataBytes"] == len(raw)
    text_end = raw.rfind(b"\n", 0, info["dataOffset"]) + 1
    assert set(raw[text_end : info["dataOffset"]]) <= {ord(" ")}
    _, actions = decode_commit(raw, "v2")
    for name, body in actions:
        if name == "add":
            start, length = body["range"]
            assert info["dataOffset"] <= start
            assert start + length <= len(raw)
            # Each range is a whole arrow file of its own (11.7).
            assert raw[start : start + 6] == b"ARROW1"
    report = verify_topic(fresh, "t", read_data=True)
    assert report.findings == [], report.findings


@pytest.mark.s3
def test_a_tailing_consumer_reads_carried_data_with_the_commits_get(
    seaweed_store: Target,
) -> None:
    """The commit's GET brings the data: a tailing consumer sends no range GET for a flush
    its commit carries, where a data object costs it one per flush. (Counted at the storage
    layer of the consumer's own store: the GETs of ranges that reach the server.)"""
    store = open_store(seaweed_store)
    fetches: dict[int, int] = {}
    for inline in (0, 1 << 20):
        topic = f"tail{inline}"
        store.create_topic(topic, 4, {"commit.inline.bytes": inline})
        _flush(store, topic, 4, b"first")
        consumer = Consumer(store=open_store(seaweed_store), auto_offset_reset="earliest")
        consumer.assign([TopicPartition(topic, p) for p in range(4)])
        seen = 0
        while seen < 12:
            seen += sum(len(b) for b in consumer.poll(500).values())
        storage = consumer.store.storage
        backend = storage.backend
        sent = backend._ranges
        calls: list[str] = []

        async def counted(
            path: str, runs: list[tuple[int, int]], calls: list[str] = calls, sent: Any = sent
        ) -> list[bytes]:
            calls.append(path)
            result: list[bytes] = await sent(path, runs)
            return result

        backend._ranges = counted  # type: ignore[attr-defined]
        flushes = 5
        for n in range(flushes):
            _flush(store, topic, 4, b"n%d" % n)
            got: list[bytes] = []
            while len(got) < 12:
                for records in consumer.poll(1000).values():
                    got.extend(r.value for r in records)
            assert sorted(got) == sorted(
                b"n%d-%d-%d" % (n, p, i) for p in range(4) for i in range(3)
            )
        fetches[inline] = len(calls)
        consumer.close()
    # A data object: at least one fetch of ranges per flush (its partitions' ranges coalesced).
    assert fetches[0] >= 5, fetches
    assert fetches[1 << 20] == 0, fetches


@pytest.mark.parametrize("target", FAST)
def test_a_flush_larger_than_the_limit_writes_a_data_object(
    target: str, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("t", 2, {"commit.inline.bytes": 4096})
    _flush(store, "t", 2, b"first")
    _flush(store, "t", 2, b"small")
    with Producer(store, linger_ms=60_000) as p:
        for i in range(40):
            p.send("t", value=bytes([i]) * 500, partition=i % 2)
        p.flush()
    paths = [s.path for s in store.partition("t", 0).state().segments]
    assert paths[1] == "_log/00000000000000000001.json"
    assert paths[2].startswith("_data/")
    assert len(_data_objects(store, "t")) == 2
    # The bytes encoded to be carried went to the data object as they were: read and verified.
    for p in range(2):
        assert _values(open_store(where), "t", p)[6:] == [bytes([i]) * 500 for i in range(p, 40, 2)]
    # Off: every flush writes a data object.
    store.alter_topic_config("t", {"commit.inline.bytes": 0})
    _flush(open_store(where), "t", 2, b"off")
    assert open_store(where).partition("t", 1).state().segments[-1].path.startswith("_data/")


def _carried_commit(store: Store) -> tuple[str, bytes]:
    store.create_topic("t", 2)
    _flush(store, "t", 2, b"a")
    _flush(store, "t", 2, b"b")
    path = f"{store.topic_logs('t')[0].directory}/{version_file(1)}"
    return path, store.storage.read(path)


def _rewrite(store: Store, path: str, data: bytes) -> None:
    store.storage.delete([path])
    store.storage.put_if_absent(path, data)


def _info_line(raw: bytes) -> dict[str, Any]:
    info: dict[str, Any] = json.loads(raw.split(b"\n", 1)[0])["commitInfo"]
    return info


@pytest.mark.parametrize(
    "damage",
    ["cut", "one byte more", "padding not spaces", "offset past the file", "offset not int"],
)
def test_a_damaged_carrying_commit_is_corrupt(local_store: Target, damage: str) -> None:
    store = open_store(local_store)
    path, raw = _carried_commit(store)
    info = _info_line(raw)
    offset = info["dataOffset"]
    text_end = raw.rfind(b"\n", 0, offset) + 1
    if damage == "cut":
        bad = raw[:-1]
    elif damage == "one byte more":
        bad = raw + b"\0"
    elif damage == "padding not spaces":
        # Room for one more byte before the data (the offset one more, of as many digits),
        # which is not a space.
        assert len(str(offset)) == len(str(offset + 1))
        moved = raw[:offset].replace(b'"dataOffset":%d' % offset, b'"dataOffset":%d' % (offset + 1))
        assert raw[text_end:offset].strip(b" ") == b""
        bad = moved + b"x" + raw[offset:]
    else:
        value = b"99999999" if damage == "offset past the file" else b'"12"'
        bad = raw.replace(b'"dataOffset":%d' % offset, b'"dataOffset":' + value, 1)
    with pytest.raises(CorruptLogError):
        decode_commit(bad, "the commit")
    _rewrite(store, path, bad)
    with pytest.raises(CorruptLogError):
        open_store(local_store).partition("t", 0).state()


@pytest.mark.parametrize("wrong", ["another commit", "outside the data", "no data"])
def test_a_commit_whose_range_is_not_its_own_data_is_corrupt(
    local_store: Target, wrong: str
) -> None:
    """A ranged add of a commit names the commit's own file, inside the data it carries."""
    store = open_store(local_store)
    path, raw = _carried_commit(store)
    info, actions = decode_commit(raw, "v1")
    offset = info["dataOffset"]
    data = raw[offset:]
    placed: list[dict[str, Any]] = []
    for name, body in actions:
        if name == "add":
            start, length = body["range"]
            start -= offset  # back to counting from the data's start
            if wrong == "outside the data":
                start = len(data) - length + 1
            body = {**body, "path": "<carried>", "range": [start, length]}
        placed.append({name: body})
    own = "_log/00000000000000000001.json"
    meta = {k: v for k, v in info.items() if k not in ("dataOffset", "dataBytes", "actions")}
    if wrong == "no data":
        # The adds name this very file, but it carries nothing.
        text = [json.dumps({"commitInfo": {**meta, "actions": len(placed)}})]
        for action in placed:
            if "add" in action:
                action = {"add": {**action["add"], "path": own, "range": [0, 10]}}
            text.append(json.dumps(action))
        bad = ("\n".join(text) + "\n").encode()
    else:
        name = "_log/00000000000000000000.json" if wrong == "another commit" else own
        _, bad = encode_carrying_commit(placed, meta, data, name)
    _rewrite(store, path, bad)
    with pytest.raises(CorruptLogError, match=r"carries|carried"):
        open_store(local_store).partition("t", 0).state()


@pytest.mark.parametrize("adds", [1, 7, 60, 400])
def test_a_carrying_commit_puts_its_data_right_after_its_text(adds: int) -> None:
    """The text is encoded once, and the data starts at the smallest offset at or past the
    text's length once the offset and the ranges it holds are written out (PROTOCOL.md 7.1):
    every range names its bytes, whatever digits the offset adds."""
    rng = random.Random(adds)
    lengths = [rng.randrange(1, 5000) for _ in range(adds)]
    data = bytes(rng.randrange(256) for _ in range(sum(lengths)))
    actions: list[dict[str, Any]] = []
    start = 0
    for i, length in enumerate(lengths):
        actions.append(
            {"add": {"path": "<carried>", "range": [start, length], "records": 1, "partition": i}}
        )
        actions.append({"producer": {"id": "p", "lastSequence": i, "partition": i}})
        start += length
    own = "_log/00000000000000000007.json"
    placed, payload = encode_carrying_commit(actions, {"operation": "APPEND"}, data, own)
    offset = carried_data_offset(payload, "c")
    assert offset is not None
    assert payload[offset:] == data
    info, decoded = decode_commit(payload, "c")
    assert info["dataOffset"] == offset
    assert info["dataBytes"] == len(data)
    adds_read = [body for name, body in decoded if name == "add"]
    assert [a["add"] for a in placed if "add" in a] == adds_read
    begins = list(itertools.accumulate([0, *lengths[:-1]]))
    for body, length, begin in zip(adds_read, lengths, begins, strict=True):
        assert body["path"] == own
        assert body["range"] == [offset + begin, length]
    # The smallest offset that fits: with one less, the text written out would not end by it.
    text = payload[:offset].rstrip(b" ")
    assert len(text) <= offset

    def digits(n: int) -> int:
        return len(str(n))

    one_less = len(text) + digits(offset - 1) - digits(offset)
    one_less += sum(digits(offset - 1 + b) - digits(offset + b) for b in begins)
    assert one_less > offset - 1


def test_only_log_paths_of_commit_files_name_carried_ranges() -> None:
    assert is_carried_path("_log/00000000000000000001.json")
    assert is_carried_path("_log.3/00000000000000000001.json")
    for bad in (
        "_log/1.json",
        "_log.0/00000000000000000001.json",
        "_log/../_log/00000000000000000001.json",
        "_log/00000000000000000001.checkpoint.json",
        "_logs/00000000000000000001.json",
        "segments/00000000000000000001.json",
    ):
        assert not is_carried_path(bad), bad


@pytest.mark.parametrize("target", ALL)
def test_writers_racing_for_versions_carry_their_data_in_the_version_they_win(
    target: str, request: pytest.FixtureRequest
) -> None:
    """Two producers take turns on one topic log: a lost race rebuilds the commit for the next
    version, so every range names the commit file that holds it, and no record is lost."""
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("t", 2)
    _flush(store, "t", 2, b"first")
    rounds = 15 if target != "seaweed_store" else 6

    def write(tag: bytes) -> None:
        own = open_store(where)
        with Producer(own, linger_ms=0) as producer:
            for n in range(rounds):
                for p in range(2):
                    producer.send("t", value=tag + b"%d-%d" % (n, p), partition=p)
                producer.flush()

    threads = [threading.Thread(target=write, args=(tag,)) for tag in (b"x", b"y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fresh = open_store(where)
    for p in range(2):
        segments = fresh.partition("t", p).state().segments
        for seg in segments[1:]:
            assert is_carried_path(seg.path), seg.path
        values = _values(fresh, "t", p)
        for tag in (b"x", b"y"):
            assert [v for v in values if v and v.startswith(tag)] == [
                tag + b"%d-%d" % (n, p) for n in range(rounds)
            ]
    assert verify_topic(fresh, "t", read_data=True).findings == []


def test_the_merge_rewrites_carried_ranges_and_vacuum_then_deletes_their_commits(
    local_store: Target,
) -> None:
    """A commit file older than the log retention stays while a range in it is live, or
    removed within the delete delay; once the merge has rewritten its ranges and the delay
    has passed, vacuum deletes it with the other old versions. (Local disk: the log's files
    are aged by their modification times, as if written ten days ago.)"""
    where = local_store
    store, before, carried = _four_carried_flushes(where)
    log_dir = store.topic_logs("t")[0].directory
    aged = (now_ms() - 10 * DAY) / 1000
    for info in store.storage.list_dir(log_dir):
        os.utime(store.storage.full_path(f"{log_dir}/{info.name}"), (aged, aged))
    # Versions 1 to 3 lie below the newest checkpoint past the retention (version 4).
    old = {path for path in carried if int(path.rsplit("/", 1)[1][:20]) < 4}
    assert len(old) == 3
    options = {"log_retention_ms": 3 * DAY, "orphan_age_ms": 3 * DAY}
    # Without a merge: past the log retention, but their ranges are live.
    summary = vacuum(None, *where, verbose=False, **options)
    assert summary.errors == []
    deleted = set(summary.files)
    assert f"{log_dir}/{version_file(0)}" in deleted  # an old version with no carried data
    assert not carried & deleted
    assert all(store.storage.exists(path) for path in carried)
    assert _values(open_store(where), "t", 1) == before[1]
    # The merge rewrites the ranges into the partitions' own segments.
    merged = merge_segments(None, open_store(where), verbose=False)
    assert merged.count("committed") == 2
    for p in range(2):
        state = open_store(where).partition("t", p).state()
        assert not any(is_carried_path(s.path) for s in state.segments)
        assert _values(open_store(where), "t", p) == before[p]
    # Removed moments ago: within the delete delay, kept, data and all.
    sizes = {path: len(store.storage.read(path)) for path in carried}
    soon = vacuum(None, *where, verbose=False, **options)
    assert soon.errors == []
    assert not carried & set(soon.files)
    assert {path: len(store.storage.read(path)) for path in carried} == sizes
    # Past the delay: the old ones go as old versions; version 4, which the kept checkpoint
    # follows, stays a log version without its data (22.5).
    later = vacuum(None, *where, verbose=False, now_ms=now_ms() + 120_000, **options)
    assert later.errors == []
    assert old <= set(later.files), sorted(old - set(later.files))
    assert not any(store.storage.exists(path) for path in old)
    (newest,) = carried - old
    stripped = store.storage.read(newest)
    assert len(stripped) < sizes[newest] // 2
    info = json.loads(stripped.split(b"\n", 1)[0])["commitInfo"]
    assert info["dataVacuumed"] is True
    assert "dataOffset" not in info
    assert b"ARROW1" not in stripped
    assert later.bytes_deleted >= sizes[newest] - len(stripped)
    fresh = open_store(where)
    # A reader replaying the log from before the merge (time travel) finds that data gone.
    topic_log = fresh.topic_logs("t")[0]
    state = topic_log.log.load_version(4)
    assert any(is_carried_path(s.path) for s in state.partition(0).segments)
    from kstore.errors import MissingSegmentError
    from kstore.segments import read_segment_data

    seg = next(s for s in state.partition(0).segments if s.path == newest.split("/", 3)[-1])
    with pytest.raises(MissingSegmentError, match="vacuumed"):
        read_segment_data(fresh.storage, fresh.partition("t", 0).directory, seg, "time travel")
    for p in range(2):
        assert _values(fresh, "t", p) == before[p]
        removed = fresh.partition("t", p).state().removed
        assert not any(path in removed for path in (o.split("/", 3)[-1] for o in old))
    assert verify_topic(fresh, "t", read_data=True).problems == []


@pytest.mark.parametrize("target", ALL)
def test_with_a_longer_log_retention_vacuum_removes_carried_data_from_the_commits(
    target: str, request: pytest.FixtureRequest
) -> None:
    """Above the minimum log retention a commit whose data no partition needs keeps its text
    (a log version) and loses its data: every such commit, on every backend."""
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("t", 2, {"file.delete.delay.ms": 60_000})
    for n in range(4):
        _flush(store, "t", 2, b"f%d" % n)
    before = {p: _values(store, "t", p) for p in range(2)}
    carried = sorted(_carried_files(store, "t"))
    assert len(carried) == 3
    sizes = {path: len(store.storage.read(path)) for path in carried}
    assert merge_segments(None, open_store(where), verbose=False).count("committed") == 2
    done = vacuum(
        None,
        *where,
        verbose=False,
        now_ms=now_ms() + 120_000,
        log_retention_ms=3 * DAY,
        orphan_age_ms=3 * DAY,
    )
    assert done.errors == []
    assert "the data of 3 commit(s)" in done.partitions[0].reason, done.partitions[0].reason
    plain = open_store(where).storage  # not one that kept the files as it read them
    for path in carried:
        text = plain.read(path)
        assert len(text) < sizes[path] // 2, path
        assert json.loads(text.split(b"\n", 1)[0])["commitInfo"]["dataVacuumed"] is True
    for p in range(2):
        assert _values(open_store(where), "t", p) == before[p]


def test_at_the_minimum_log_retention_carried_data_goes_with_its_commit_file(
    local_store: Target,
) -> None:
    """At the default log retention (the minimum, 2 days) vacuum does not rewrite a commit
    whose data no partition needs (a PUT each on S3): it forgets the removals, and the file,
    data and all, goes as an old version once a checkpoint past the retention follows it."""
    from kstore.retention import DEFAULT_LOG_RETENTION_MS, MIN_LOG_RETENTION_MS

    assert DEFAULT_LOG_RETENTION_MS == MIN_LOG_RETENTION_MS == 2 * DAY
    where = local_store
    store, before, carried = _four_carried_flushes(where)
    merged = merge_segments(None, open_store(where), verbose=False)
    assert merged.count("committed") == 2
    sizes = {path: len(store.storage.read(path)) for path in carried}
    options = {"orphan_age_ms": 3 * DAY}  # the log retention left at its default
    # Past the delete delay, within the log retention: the removals are forgotten, the commit
    # files stay whole (no rewrite).
    due = vacuum(None, *where, verbose=False, now_ms=now_ms() + 120_000, **options)
    assert due.errors == []
    assert not carried & set(due.files)
    assert {path: len(store.storage.read(path)) for path in carried} == sizes
    for p in range(2):
        removed = open_store(where).partition("t", p).state().removed
        assert not any(path.split("/", 3)[-1] in removed for path in carried)
    # Three days on, the versions below the newest checkpoint past the retention go, data and
    # all (the merge's and vacuum's commits, and a checkpoint, came after them).
    log_dir = store.topic_logs("t")[0].directory
    aged = (now_ms() - 3 * DAY) / 1000
    for info in store.storage.list_dir(log_dir):
        os.utime(store.storage.full_path(f"{log_dir}/{info.name}"), (aged, aged))
    later = vacuum(None, *where, verbose=False, **options)
    assert later.errors == []
    assert carried <= set(later.files), sorted(carried - set(later.files))
    assert not any(store.storage.exists(path) for path in carried)
    assert later.bytes_deleted >= sum(sizes.values())
    fresh = open_store(where)
    for p in range(2):
        assert _values(fresh, "t", p) == before[p]
    assert verify_topic(fresh, "t", read_data=True).problems == []


@pytest.mark.parametrize("target", FAST)
def test_a_topic_at_4_5_writes_data_objects_until_the_upgrade_raises_it(
    target: str, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("t", 2)
    topic_log = store.topic_logs("t")[0]
    _flush(store, "t", 2, b"first")
    # Set the topic as a writer of version 5 left it: its topic log and metadata log at 4/5.
    for log_dir in (topic_log.log.directory, store._topic_log("t").directory):
        path = f"{log_dir}/{version_file(0)}"
        raw = store.storage.read(path)
        newest = b'"minReaderVersion":%d,"minWriterVersion":%d' % (
            TOPIC_LOG_VERSION,
            TOPIC_LOG_WRITER_VERSION,
        )
        assert newest in raw
        older = raw.replace(newest, b'"minReaderVersion":4,"minWriterVersion":5')
        _rewrite(store, path, older)
    old = open_store(where)
    assert old.topic_logs("t")[0].state().min_reader_version == 4
    assert old._topic_log("t").load().min_writer_version == 5
    _flush(old, "t", 2, b"old")
    assert old.partition("t", 0).state().segments[-1].path.startswith("_data/")
    upgrade_topic(open_store(where), "t")
    raised = open_store(where)
    state = raised.topic_logs("t")[0].state()
    assert (state.min_reader_version, state.min_writer_version) == (
        TOPIC_LOG_VERSION,
        TOPIC_LOG_WRITER_VERSION,
    )
    _flush(raised, "t", 2, b"new")
    assert is_carried_path(raised.partition("t", 0).state().segments[-1].path)
    assert _values(raised, "t", 1)[-3:] == [b"new-1-%d" % i for i in range(3)]
