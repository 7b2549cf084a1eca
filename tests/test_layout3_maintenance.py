"""Vacuum and verify of layout-3 topics (PROTOCOL.md 17.4, 22.5, 26): partitions share topic
logs, data objects and checkpoint sidecars, so vacuum works per topic incarnation and verify
checks the topic logs and the objects' ranges. Run in this process (spark=None) on memory and
local disk, the shared-object case also on SeaweedFS. Time is the jobs' fixed ``now_ms``
against the storage's modification times, as in tests/test_jobs_retention.py."""

from __future__ import annotations

import gzip
import importlib
import json
import time
import uuid
from typing import Any

import pytest
from kstore.cli.verify import verify_topic
from kstore.compaction import merge_segments, merger
from kstore.compaction.jobs import plan_items
from kstore.retention import run_retention, vacuum

from kstore import Store
from kstore.errors import StorageError
from kstore.layout import topic_data_dir
from kstore.log import decode_commit, parse_log_file_name
from kstore.manifest import is_carried_path
from kstore.partition import Segment
from kstore.producer import Producer
from kstore.topic_log import (
    CHAIN_VERSION,
    HORIZON_VERSION,
    SIDECARS,
    TOPIC_LOG_VERSION,
    TOPIC_LOG_WRITER_VERSION,
)
from kstore.upgrade import upgrade_topic
from tests.commit_logs_extra import open_target, target_params
from tests.test_jobs_support import Target, now_ms, open_store, rows

# The module (``kstore.retention.vacuum`` the attribute is the job function).
vacuum_module = importlib.import_module("kstore.retention.vacuum")

HOUR = 3_600_000
DAY = 24 * HOUR
DELAY = 60_000

ALL = ["memory_store", "local_store", pytest.param("seaweed_store", marks=pytest.mark.s3)]
FAST = ["memory_store", "local_store"]
# commit.logs 1 and 3 on memory and local disk, 1 alone on SeaweedFS (tests/commit_logs.py).
ALL_LOGS = target_params(ALL)
FAST_LOGS = target_params(FAST)
# A topic whose producers write every flush as a data object: none is carried by its commit
# (PROTOCOL.md 11.8, which the topic log's first commit never does either).
OBJECTS = {"commit.inline.bytes": 0}


def produce_one_flush(store: Store, topic: str, partitions: int, tag: bytes = b"v") -> str:
    """One record to each partition in one producer flush: one data object holding a range
    per partition, or the commit carrying that data (PROTOCOL.md 11.8: not the topic log's
    first, nor in a topic with ``OBJECTS``). Returns its manifest path (``_data/...`` or
    ``_log/<version>.json``) in partition 0's topic log (with ``commit.logs`` > 1 each topic
    log has its own)."""
    with Producer(store, linger_ms=60_000) as producer:
        for p in range(partitions):
            producer.send(topic, value=tag + b"%d" % p, key=b"k", partition=p)
        producer.flush()
    logs = store.topic(topic).commit_logs
    by_log: dict[int, set[str]] = {}
    for p in range(partitions):
        by_log.setdefault(p % logs, set()).add(store.partition(topic, p).state().segments[-1].path)
    # The premise: the partitions of a topic log share one object, each log its own.
    assert all(len(paths) == 1 for paths in by_log.values()), by_log
    assert len(set().union(*by_log.values())) == len(by_log), by_log
    (path,) = by_log[0]
    objects = int(store.topic(topic).effective_config["commit.inline.bytes"]) == 0
    assert path.startswith("_data/") or (not objects and is_carried_path(path)), path
    return path


def values(store: Store, topic: str, partition: int) -> list[bytes | None]:
    """Every live value of a partition, read and verified (Partition.read)."""
    return [v for _, _, v in rows(store.partition(topic, partition))]


def object_location(store: Store, topic: str, path: str) -> str:
    return f"{topic_data_dir(topic, store.topic(topic).topic_id)}/{path}"


def remove_ranges(where: Target, store: Store, topic: str, partitions: list[int]) -> None:
    """Remove each partition's ranges as Kafka's DeleteRecords then retention do."""
    for p in partitions:
        store.partition(topic, p).delete_records(-1)
    run_retention(None, *where, verbose=False)
    for p in partitions:
        assert store.partition(topic, p).state().segments == []


@pytest.mark.parametrize("target", ALL_LOGS)
def test_a_shared_object_stays_until_every_partition_removed_it_and_the_delay_passed(
    target: tuple[str, int], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three partitions share topic log 0's object (with commit.logs 3: partitions 0, 3 and
    6 of nine, the others in logs 1 and 2 keep their objects and records throughout)."""
    where: Target = open_target(request, monkeypatch, target)
    logs = target[1]
    first, second, third = 0, logs, 2 * logs  # topic log 0's partitions
    store = open_store(where)
    store.create_topic("t", 3 * logs, {"file.delete.delay.ms": DELAY, **OBJECTS})
    path = produce_one_flush(store, "t", 3 * logs)
    location = object_location(store, "t", path)
    others = {p: values(store, "t", p) for p in range(3 * logs) if p % logs}
    other_objects = {
        object_location(store, "t", store.partition("t", p).state().segments[-1].path)
        for p in others
    }

    remove_ranges(where, store, "t", [first])
    t0 = now_ms()
    # Partition 0's removal is long due, but partitions 1 and 2 still read the object.
    summary = vacuum(None, *where, verbose=False, now_ms=t0 + DELAY + HOUR // 2)
    assert summary.errors == []
    assert location not in summary.files
    assert store.storage.exists(location)
    assert path in store.partition("t", first).state().removed  # kept until the object goes
    assert values(store, "t", second) == [b"v%d" % second]

    topic_log = store.topic_logs("t")[0]
    first_removal = topic_log.state().version
    before = now_ms()
    remove_ranges(where, store, "t", [second, third])
    t1 = now_ms()
    # Every partition has removed it, but the last removals are not yet due. (S3 records
    # times to the second: a removal may look up to 1 s older than it is.)
    early = vacuum(None, *where, verbose=False, now_ms=before + DELAY - 2000)
    assert location not in early.files
    assert store.storage.exists(location)
    # The instant partition 0's removal becomes due (by the storage's times of the commits),
    # the others' are not yet: the object stays.
    times = {
        parsed[0]: info.mtime_ms
        for info in store.storage.list_dir(topic_log.directory)
        if (parsed := parse_log_file_name(info.name)) is not None and not parsed[1]
    }
    due_first, due_next = (
        times[first_removal],
        min(t for v, t in times.items() if v > first_removal),
    )
    assert due_first is not None
    assert due_next is not None
    if due_next > due_first:  # always on memory and local disk; S3 keeps whole seconds
        between = vacuum(None, *where, verbose=False, now_ms=due_first + DELAY)
        assert location not in between.files
        assert store.storage.exists(location)

    version = topic_log.state().version
    late = vacuum(None, *where, verbose=False, now_ms=t1 + DELAY)
    assert late.errors == []
    assert location in late.files
    assert not store.storage.exists(location)
    assert late.count("committed") == 1  # one row: the incarnation, on partition 0's item
    # One topic-log commit forgets the object in each partition that recorded it.
    state = topic_log.state()
    assert state.version == version + 1
    commit = topic_log.log.read_commit(version + 1)
    assert commit is not None
    vacuumed = sorted(
        (body["partition"], body["paths"]) for name, body in commit[1] if name == "vacuumed"
    )
    assert vacuumed == [(first, [path]), (second, [path]), (third, [path])]
    for p in (first, second, third):
        assert store.partition("t", p).state().removed == {}
    # The other topic logs' objects and records are untouched.
    assert not other_objects & set(late.files)
    assert {p: values(Store(*where), "t", p) for p in others} == others
    assert verify_topic(Store(*where), "t").findings == []


@pytest.mark.parametrize("target", FAST_LOGS)
def test_an_object_nothing_names_is_deleted_after_the_orphan_age_and_not_before(
    target: tuple[str, int], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    where: Target = open_target(request, monkeypatch, target)
    store = open_store(where)
    store.create_topic("t", 2, OBJECTS)
    live = object_location(store, "t", produce_one_flush(store, "t", 2))
    data_dir = live.rsplit("/", 1)[0]
    written = now_ms()
    # A producer wrote its object and crashed before the commit.
    orphan = f"{data_dir}/{written:013d}-{uuid.uuid4().hex}.kdat"
    store.storage.put_if_absent(orphan, b"never committed")
    # Before the orphan age (1 hour by default) it may still be committing.
    young = vacuum(None, *where, verbose=False, now_ms=written + HOUR - 60_000)
    assert young.files == []
    assert store.storage.exists(orphan)
    later = now_ms() + HOUR + 60_000
    dry = vacuum(None, *where, verbose=False, dry_run=True, now_ms=later)
    assert dry.files == [orphan]
    assert store.storage.exists(orphan)
    done = vacuum(None, *where, verbose=False, now_ms=later)
    assert done.errors == []
    assert done.files == [orphan]
    assert not store.storage.exists(orphan)
    assert store.storage.exists(live)
    # Every topic log's object stays (with commit.logs 3, partition 1's is log 1's).
    assert [values(Store(*where), "t", p) for p in range(2)] == [[b"v0"], [b"v1"]]


@pytest.mark.parametrize("target", FAST_LOGS)
def test_a_sidecar_no_kept_checkpoint_names_is_deleted(
    target: tuple[str, int], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    where: Target = open_target(request, monkeypatch, target)
    store = open_store(where)
    store.create_topic("t", 2, {"checkpoint.interval": 2})
    for i in range(5):
        produce_one_flush(store, "t", 2, tag=b"%d-" % i)
    incarnation = topic_data_dir("t", store.topic("t").topic_id)
    sidecar_dir = f"{incarnation}/{SIDECARS}"
    # A checkpoint writer that lost its race left a sidecar no checkpoint names.
    stray = f"{sidecar_dir}/0-{0:020d}-{uuid.uuid4().hex}.json"
    store.storage.put_if_absent(stray, b"{}")
    # Younger than the log retention: it may belong to a checkpoint being written.
    assert stray not in vacuum(None, *where, verbose=False).files
    summary = vacuum(None, *where, verbose=False, now_ms=now_ms() + 31 * DAY)
    assert summary.errors == []
    assert stray in summary.files
    remaining = {f"{SIDECARS}/{i.name}" for i in store.storage.list_dir(sidecar_dir)}
    # What stays is exactly what the kept checkpoints of every topic log name.
    named: set[str] = set()
    for topic_log in store.topic_logs("t"):
        log_dir = topic_log.directory
        for info in store.storage.list_dir(log_dir):
            parsed = parse_log_file_name(info.name)
            if parsed is not None and parsed[1]:
                _, actions = decode_commit(store.storage.read(f"{log_dir}/{info.name}"), info.name)
                named |= {str(body["path"]) for name, body in actions if name == "sidecar"}
    assert named
    assert remaining == named
    # A reader that starts now loads the kept checkpoint and its sidecars.
    fresh = Store(*where)
    for p in range(2):
        assert values(fresh, "t", p) == [b"%d-%d" % (i, p) for i in range(5)]
    assert verify_topic(fresh, "t").ok


@pytest.mark.parametrize("target", ALL_LOGS)
def test_verify_passes_a_healthy_topic_and_reports_a_missing_object_and_a_bad_range(
    target: tuple[str, int], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Topic log 0's objects (with commit.logs 3: of partitions 0, 3 and 6 of nine) hurt;
    the other logs' partitions are reported for nothing."""
    where: Target = open_target(request, monkeypatch, target)
    logs = target[1]
    shared = [0, logs, 2 * logs]  # topic log 0's partitions
    store = open_store(where)
    store.create_topic("t", 3 * logs, {"checkpoint.interval": 2, **OBJECTS})
    first = produce_one_flush(store, "t", 3 * logs, tag=b"a")
    second = produce_one_flush(store, "t", 3 * logs, tag=b"b")
    third = produce_one_flush(store, "t", 3 * logs, tag=b"c")
    healthy = verify_topic(store, "t")
    assert healthy.findings == []
    assert (healthy.segments, healthy.records) == (9 * logs, 9 * logs)

    # A byte flipped inside the second partition's range of the second object.
    location = object_location(store, "t", second)
    seg = next(s for s in store.partition("t", shared[1]).state().segments if s.path == second)
    assert seg.byte_range is not None
    data = bytearray(store.storage.read(location))
    data[seg.byte_range[0] + seg.byte_range[1] // 2] ^= 0xFF
    store.storage.put(location, bytes(data))
    # The third object gone.
    store.storage.delete([object_location(store, "t", third)])
    # An object a crashed producer left.
    orphan = location.rsplit("/", 1)[0] + f"/{now_ms():013d}-{uuid.uuid4().hex}.kdat"
    store.storage.put_if_absent(orphan, b"never committed")

    report = verify_topic(Store(*where), "t")
    problems = {(f.partition, f.path, f.message) for f in report.problems}
    missing = object_location(store, "t", third)
    assert {p for p, path, msg in problems if path == missing and "missing" in msg} == set(shared)
    bad = [(p, msg) for p, path, msg in problems if path == location]
    assert len(bad) == 1, problems  # the first and third read their ranges of it fine
    assert bad[0][0] == shared[1]
    assert {p for p, _, _ in problems} <= set(shared), problems
    assert "checksum" in bad[0][1].lower(), bad
    assert f"range {seg.byte_range[0]}+{seg.byte_range[1]}" in bad[0][1]
    assert [f.path for f in report.warnings] == [orphan]
    assert object_location(store, "t", first) not in {f.path for f in report.findings}


def test_objects_of_several_topic_logs_go_with_one_commit_per_log(memory_store: Target) -> None:
    store = open_store(memory_store)
    store.create_topic("t", 4, {"file.delete.delay.ms": DELAY, "commit.logs": 2, **OBJECTS})
    with Producer(store, linger_ms=60_000) as producer:
        for p in range(4):
            producer.send("t", value=b"v%d" % p, key=b"k", partition=p)
        producer.flush()
    # One object per topic log: partitions 0 and 2 share one, 1 and 3 the other.
    path = {p: store.partition("t", p).state().segments[0].path for p in range(4)}
    assert path[0] == path[2] != path[1] == path[3]
    remove_ranges(memory_store, store, "t", [0, 1, 2, 3])
    logs = store.topic_logs("t")
    versions = [log.state().version for log in logs]
    summary = vacuum(None, *memory_store, verbose=False, now_ms=now_ms() + DELAY + 1000)
    assert summary.errors == []
    assert sorted(summary.files) == sorted(object_location(store, "t", path[p]) for p in (0, 1))
    assert sum(r.commits for r in summary.partitions) == 2
    for k, log in enumerate(logs):
        commit = log.log.read_commit(versions[k] + 1)
        assert commit is not None
        assert sorted(
            (body["partition"], body["paths"]) for name, body in commit[1] if name == "vacuumed"
        ) == [(p, [path[p]]) for p in (k, k + 2)]
    report = verify_topic(Store(*memory_store), "t")
    assert report.findings == []


def test_verify_replays_topic_logs_against_checkpoints_and_their_sidecars(
    local_store: Target,
) -> None:
    store = open_store(local_store)
    store.create_topic("t", 2, {"checkpoint.interval": 3})
    for i in range(7):
        produce_one_flush(store, "t", 2, tag=b"%d-" % i)
    report = verify_topic(store, "t")
    assert report.findings == []
    assert report.log_files >= 7 + 2  # commits 0..6, checkpoints 3 and 6
    log_dir = store.topic_logs("t")[0].directory

    def base_of(version: int, partition: int) -> dict[str, Any]:
        _, actions = decode_commit(
            store.storage.read(f"{log_dir}/{version:020d}.checkpoint.json"), "checkpoint"
        )
        # The first of the partition's chain: its base (13.4).
        return next(b for n, b in actions if n == "sidecar" and b["partition"] == partition)

    def sidecar_of(version: int, partition: int) -> str:
        return f"{topic_data_dir('t', store.topic('t').topic_id)}/{base_of(version, partition)['path']}"

    # A sidecar that disagrees with the commits: the checkpoint is at fault, for partition 1.
    # (Compressed, version 4: rewritten with the size the checkpoint records kept right. Both
    # partitions' bases are members of one file, version 6: partition 1's is rewritten.)
    sidecar = sidecar_of(3, 1)
    start, length = base_of(3, 1)["range"]
    content = store.storage.read(sidecar)
    text = gzip.decompress(content[start : start + length]).decode()
    assert '"endOffset":{"offset":4}' in text  # one record per flush, versions 0..3
    payload = gzip.compress(
        text.replace('"endOffset":{"offset":4}', '"endOffset":{"offset":9}').encode()
    )
    store.storage.put(sidecar, content[:start] + payload + content[start + length :])
    shift = len(payload) - length
    for version in (3, 6):  # checkpoint 6 names it too when it extends that chain (13.4)
        top = f"{log_dir}/{version:020d}.checkpoint.json"
        info, actions = decode_commit(store.storage.read(top), "checkpoint")
        lines = [json.dumps({"commitInfo": info})]
        for name, body in actions:
            if name == "sidecar" and sidecar.endswith(body["path"]):
                at, size = body["range"]
                if at == start:
                    body = {**body, "size": len(payload), "range": [start, len(payload)]}
                elif at > start:
                    body = {**body, "range": [at + shift, size]}
            lines.append(json.dumps({name: body}))
        store.storage.put(top, ("\n".join(lines) + "\n").encode())
    report = verify_topic(Store(*local_store), "t")
    # When checkpoint 6 extends checkpoint 3's chain for partition 1 with a delta (13.4), it
    # names the same base: the same fault, also in the state readers load from it.
    problem, *later = report.problems
    assert all(
        "checkpoint 6 disagrees" in p.message or "the state readers load" in p.message
        for p in later
    ), later
    assert "checkpoint 3 disagrees" in problem.message
    assert "partition 1: endOffset differs" in problem.message
    # A sidecar gone: the checkpoint cannot be loaded.
    store.storage.delete([sidecar_of(6, 0)])
    report = verify_topic(Store(*local_store), "t")
    assert any(
        "checkpoint 6 is corrupt" in p.message and "missing" in p.message for p in report.problems
    ), report.problems
    # A truncated commit of the topic log.
    commit = f"{log_dir}/{1:020d}.json"
    store.storage.put(commit, store.storage.read(commit)[:-20])
    report = verify_topic(Store(*local_store), "t")
    assert any("commit 1 is corrupt" in p.message for p in report.problems), report.problems


def _checkpoints(store: Store, log_dir: str) -> dict[int, set[str]]:
    """Checkpoint version -> the sidecar paths it names."""
    out: dict[int, set[str]] = {}
    for info in store.storage.list_dir(log_dir):
        parsed = parse_log_file_name(info.name)
        if parsed is not None and parsed[1]:
            _, actions = decode_commit(store.storage.read(f"{log_dir}/{info.name}"), info.name)
            out[parsed[0]] = {str(body["path"]) for name, body in actions if name == "sidecar"}
    return out


@pytest.mark.parametrize("target", ALL_LOGS)
def test_vacuum_finds_old_sidecars_by_their_names_without_listing_the_log(
    target: tuple[str, int], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer version 5 (13.4, 22.5): no kept checkpoint names a sidecar written more than the
    horizon before the oldest kept checkpoint K, so vacuum deletes those by name; one written
    within the horizon before K goes unless a kept checkpoint up to the horizon past K names
    it. The log is never listed whole, and a reader starting afterwards reads everything."""
    horizon = 6
    monkeypatch.setattr("kstore.topic_log.SIDECAR_HORIZON", horizon)
    monkeypatch.setattr(vacuum_module, "SIDECAR_HORIZON", horizon)
    where: Target = open_target(request, monkeypatch, target)
    store = open_store(where)
    store.create_topic("t", 2, {"checkpoint.interval": 2})
    for i in range(12):
        produce_one_flush(store, "t", 2, tag=b"%d-" % i)
    log_dir = store.topic_logs("t")[0].directory
    sidecar_dir = f"{topic_data_dir('t', store.topic('t').topic_id)}/{SIDECARS}"
    k = max(_checkpoints(store, log_dir))  # the newest checkpoint of the old phase: K
    assert k > horizon + 2

    def stray(partition: int, version: int) -> str:
        name = f"{partition}-{version:020d}-{uuid.uuid4().hex}.json.gz"
        store.storage.put_if_absent(f"{sidecar_dir}/{name}", b"not read")
        return name

    far = stray(0, 1)  # past the horizon before K: goes by its name alone
    near = stray(1, k - 1)  # within it, named by no checkpoint: goes
    kept = stray(0, k - 2)  # within it, and named by a checkpoint after K (below): stays
    time.sleep(1.2)
    boundary = now_ms()
    time.sleep(1.2)
    for i in range(12, 20):
        produce_one_flush(store, "t", 2, tag=b"%d-" % i)
    young = sorted(v for v in _checkpoints(store, log_dir) if v > k)
    assert len(young) >= 2
    # A checkpoint after K (not the newest, which readers load) names ``kept`` as a writer
    # that extended an older chain would (13.2: the chain of the checkpoint it knew).
    named_by = f"{log_dir}/{young[0]:020d}.checkpoint.json"
    info, actions = decode_commit(store.storage.read(named_by), named_by)
    extra = {"partition": 0, "path": f"{SIDECARS}/{kept}", "actions": 1, "size": 8}
    body = [{n: b} for n, b in actions] + [{"sidecar": extra}]
    info["actions"] = len(body)
    lines = [json.dumps({"commitInfo": info}), *(json.dumps(a) for a in body)]
    store.storage.put(named_by, ("\n".join(lines) + "\n").encode())
    wholes: list[str] = []
    original = vacuum_module.LogScan.whole
    monkeypatch.setattr(
        vacuum_module.LogScan, "whole", lambda self: wholes.append(self.directory) or original(self)
    )
    summary = vacuum(
        None, *where, verbose=False, now_ms=boundary + 30 * DAY + 1, log_retention_ms=30 * DAY
    )
    assert summary.errors == []
    assert wholes == []  # the log was not listed whole
    gone = {path.rsplit("/", 1)[-1] for path in summary.files if f"/{SIDECARS}/" in path}
    assert far in gone
    assert near in gone
    assert kept not in gone
    remaining = {i.name for i in store.storage.list_dir(sidecar_dir)}
    # What every topic log's kept checkpoints name stays (with commit.logs 3, partition 1's
    # sidecars are log 1's, judged by that log's own checkpoints).
    named = set().union(
        *(c for log in store.topic_logs("t") for c in _checkpoints(store, log.directory).values())
    )
    assert {f"{SIDECARS}/{n}" for n in remaining} >= named
    assert kept in remaining
    fresh = Store(*where)
    for p in range(2):
        assert values(fresh, "t", p) == [b"%d-%d" % (i, p) for i in range(20)]


@pytest.mark.parametrize("target", FAST)
def test_a_log_of_writer_version_4_has_its_sidecars_vacuumed_by_listing_it(
    target: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic log written before writer version 5 gives no horizon: vacuum lists it and reads
    every kept checkpoint (22.5), and still deletes only the sidecars none of them names."""
    where: Target = request.getfixturevalue(target)
    with monkeypatch.context() as old:
        old.setattr("kstore.topic_log.TOPIC_LOG_VERSION", CHAIN_VERSION)
        old.setattr("kstore.store.TOPIC_LOG_VERSION", CHAIN_VERSION)
        old.setattr("kstore.topic_log.TOPIC_LOG_WRITER_VERSION", 4)
        old.setattr("kstore.store.TOPIC_LOG_WRITER_VERSION", 4)
        store = open_store(where)
        store.create_topic("t", 2, {"checkpoint.interval": 2})
        for i in range(5):
            produce_one_flush(store, "t", 2, tag=b"%d-" % i)
    log_dir = store.topic_logs("t")[0].directory
    state = store.topic_logs("t")[0].state()
    assert (state.min_reader_version, state.min_writer_version) == (4, 4)
    sidecar_dir = f"{topic_data_dir('t', store.topic('t').topic_id)}/{SIDECARS}"
    stray = f"{sidecar_dir}/0-{0:020d}-{uuid.uuid4().hex}.json"
    store.storage.put_if_absent(stray, b"{}")
    wholes: list[str] = []
    original = vacuum_module.LogScan.whole
    monkeypatch.setattr(
        vacuum_module.LogScan, "whole", lambda self: wholes.append(self.directory) or original(self)
    )
    summary = vacuum(None, *where, verbose=False, now_ms=now_ms() + 31 * DAY)
    assert summary.errors == []
    assert wholes == [log_dir]
    assert stray in summary.files
    remaining = {f"{SIDECARS}/{i.name}" for i in store.storage.list_dir(sidecar_dir)}
    assert remaining == set().union(*_checkpoints(store, log_dir).values())
    assert values(Store(*where), "t", 1) == [b"%d-1" % i for i in range(5)]
    # Raised to the newest versions (5/6, 27.4), past writer version 5, the log keeps the
    # horizon from then on; once the oldest checkpoint vacuum keeps is past the raise, old
    # sidecars are found by their names.
    report = upgrade_topic(store, "t")
    assert report.changed
    fresh = Store(*where)
    newest = (TOPIC_LOG_VERSION, TOPIC_LOG_WRITER_VERSION)
    raised = fresh.topic_logs("t")[0].state()
    assert (raised.min_reader_version, raised.min_writer_version) == newest
    metadata = fresh._topic_log("t").load()
    assert (metadata.min_reader_version, metadata.min_writer_version) == newest
    assert TOPIC_LOG_WRITER_VERSION > HORIZON_VERSION
    for i in range(5, 9):
        produce_one_flush(fresh, "t", 2, tag=b"%d-" % i)
    wholes.clear()
    again = vacuum(None, *where, verbose=False, now_ms=now_ms() + 31 * DAY)
    assert again.errors == []
    assert wholes == []
    remaining = {f"{SIDECARS}/{i.name}" for i in fresh.storage.list_dir(sidecar_dir)}
    assert remaining == set().union(*_checkpoints(fresh, log_dir).values())
    assert values(Store(*where), "t", 1) == [b"%d-1" % i for i in range(9)]


@pytest.mark.parametrize("target", FAST)
def test_a_removal_a_checkpoint_delta_carries_still_waits_for_the_delete_delay(
    target: str, request: pytest.FixtureRequest
) -> None:
    """A file removed by a commit that a later checkpoint carries in a delta (13.4) is due
    ``file.delete.delay.ms`` after that commit at the earliest: vacuum, loading the checkpoint,
    must not take the removal for one as old as the log (found by a torture run: a job
    holding a state from before the removal was refused the file two seconds after it)."""
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("t", 2, {"checkpoint.interval": 2, "file.delete.delay.ms": 10_000})
    first = produce_one_flush(store, "t", 2, tag=b"a")
    for i in range(30):
        produce_one_flush(store, "t", 2, tag=b"%d-" % i)
    time.sleep(3)  # the log's first commit is more than the delay older than ``early``
    remove_ranges(where, store, "t", [0, 1])
    removed_at = now_ms()
    produce_one_flush(store, "t", 2, tag=b"b")
    log_dir = store.topic_logs("t")[0].directory
    newest = max(_checkpoints(store, log_dir))
    _, top = decode_commit(store.storage.read(f"{log_dir}/{newest:020d}.checkpoint.json"), "")
    # The premise: the newest checkpoint carries the removal in a delta, not in a base.
    incarnation = topic_data_dir("t", store.topic("t").topic_id)
    carried = [
        name
        for name, body in top
        if name == "sidecar" and "delta" in body
        for line in gzip.decompress(store.storage.read(f"{incarnation}/{body['path']}")).split(
            b"\n"
        )
        if line.startswith(b'{"remove"')
    ]
    assert carried
    location = object_location(store, "t", first)
    early = vacuum(None, *where, verbose=False, now_ms=removed_at + 8_000)
    assert early.errors == []
    assert location not in early.files
    assert store.storage.exists(location)
    due = vacuum(None, *where, verbose=False, now_ms=removed_at + 60_000)
    assert location in due.files


def _produce_flushes(store: Store, topic: str, partitions: int, flushes: int) -> None:
    with Producer(store, linger_ms=60_000) as producer:
        for f in range(flushes):
            for p in range(partitions):
                for i in range(10):
                    producer.send(topic, value=b"%d-%d-%d" % (f, p, i) * 20, partition=p)
            producer.flush()


def test_the_merge_reads_each_data_object_once_for_all_partitions_of_its_log(
    seaweed_store: Target,
) -> None:
    """8 partitions, 12 flushes (12 data objects of 8 ranges each): the merge fetches each
    object once (one coalesced GET of its 8 ranges), where one partition at a time fetched
    it 8 times, and replaces every partition's ranges in one commit."""
    store = open_store(seaweed_store)
    store.create_topic("wide", 8, OBJECTS)
    _produce_flushes(store, "wide", 8, 12)
    before = {p: values(store, "wide", p) for p in range(8)}
    meta = store.topic("wide")
    log_dir = f"topics/wide/{meta.topic_id}/_log"
    versions = len([n for n in store.storage.list_dir(log_dir) if n.name.endswith(".json")])
    job_store = open_store(seaweed_store)
    direct = job_store.storage.direct_requests()
    assert direct is not None
    object_gets: list[str] = []

    def note(kind: str, key: str) -> None:
        if kind == "GET" and "/_data/" in key:
            object_gets.append(key)

    direct.before_send.append(note)
    try:
        with job_store.storage.count_requests() as counts:
            summary = merge_segments(None, job_store, topics=["wide"], verbose=False)
    finally:
        direct.before_send.remove(note)
    assert summary.count("committed") == 8
    assert not summary.errors
    assert summary.segments_removed == 96
    assert summary.segments_written == 8
    assert all(row.commits == 1 for row in summary.partitions)
    # Each object once; one partition at a time read each 8 times.
    assert len(object_gets) == 12
    assert len(set(object_gets)) == 12
    # Besides: the topic metadata, the topic log's 14 versions and a look per partition.
    assert counts["GET"] <= 12 + 32, dict(counts)
    assert counts["PUT"] == 8 + 1, dict(counts)  # a segment per partition, one commit
    after = [n for n in store.storage.list_dir(log_dir) if n.name.endswith(".json")]
    assert len(after) == versions + 1
    fresh = open_store(seaweed_store)
    for p in range(8):
        (segment,) = fresh.partition("wide", p).state().segments
        assert segment.byte_range is None
        assert segment.format == "parquet"
        assert values(fresh, "wide", p) == before[p]


@pytest.mark.parametrize("target", FAST_LOGS)
def test_the_merge_of_a_topic_log_goes_a_window_of_objects_at_a_time(
    target: tuple[str, int], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``segment.bytes`` far below the ranges to rewrite, the shared merge works a
    window of objects at a time (each partition's ranges of a window one segment, a commit per
    window), and every record stays at its offset; the partitions' own merge then packs the
    windows' segments."""
    where: Target = open_target(request, monkeypatch, target)
    store = open_store(where)
    store.create_topic("win", 4, {"segment.bytes": 1 << 16})
    logs = store.topic("win").commit_logs
    _produce_flushes(store, "win", 4, 40)
    before = {p: values(store, "win", p) for p in range(4)}
    ranged = sum(s.size_bytes for p in range(4) for s in store.partition("win", p).state().segments)
    assert ranged > 4 * (1 << 16)  # the premise: several windows
    items = plan_items(store, ["win"], lambda c: True)
    shared = [  # the shared rewrite of each topic log (with commit.logs 3: 0 and 3, 1, 2)
        row
        for k in range(logs)
        for row in merger.rewrite_ranges(
            store, [i for i in items if i.partition % logs == k], {"now_ms": now_ms()}
        )
    ]
    assert {row.partition for row in shared} == set(range(4))
    assert not [row for row in shared if row.outcome == "error"], shared
    # A commit per window of each topic log: the same count for the partitions of one log.
    windows = {row.partition % logs: row.commits for row in shared}
    assert min(windows.values()) >= (4 if logs == 1 else 2)
    assert all(row.commits == windows[row.partition % logs] for row in shared)
    for p in range(4):
        segments = store.partition("win", p).state().segments
        assert all(s.byte_range is None for s in segments)
        assert len(segments) == next(r.segments_written for r in shared if r.partition == p)
        assert [s.base_offset for s in segments[1:]] == [s.last_offset + 1 for s in segments[:-1]]
        assert values(open_store(where), "win", p) == before[p]
    summary = merge_segments(None, store, topics=["win"], verbose=False)
    assert not summary.errors
    written = {row.partition: row.segments_written for row in shared}
    for p in range(4):
        count = len(store.partition("win", p).state().segments)
        if p % logs in {q % logs for q in range(4) if q != p}:
            assert count < written[p]  # windows shared with another partition: packed
        else:  # alone in its log (commit.logs 3: 1, 2): its windows are full segments
            assert count <= written[p]
        assert values(open_store(where), "win", p) == before[p]


def _ranged(path: str, base: int, size: int = 10) -> Segment:
    return Segment(
        path=path,
        base_offset=base,
        last_offset=base,
        record_count=1,
        min_timestamp_ms=0,
        max_timestamp_ms=0,
        size_bytes=size,
        checksum="crc32c:00000000",
        format="arrow",
        sparse=False,
        created_ms=0,
        byte_range=(0, size),
    )


def test_a_window_takes_each_partitions_ranges_in_offset_order_even_when_names_are_not() -> None:
    """Partition 0 committed object B (named later) before A: its ranges wait until the
    window reaches B, then go together; each range is taken once, in offset order."""
    a, b, c = "_data/1000-a.kdat", "_data/2000-b.kdat", "_data/3000-c.kdat"
    queues = {
        0: [[_ranged(b, 0), _ranged(a, 1), _ranged(c, 2)]],
        1: [[_ranged(a, 0), _ranged(b, 1)], [_ranged(c, 2)]],
    }
    windows = []
    while any(queues.values()):
        pieces = merger._next_window(queues, budget=10)
        windows.append({p: [[s.path for s in run] for run in runs] for p, runs in pieces.items()})
    assert windows == [
        {1: [[a]]},
        {0: [[b, a]], 1: [[b]]},
        {0: [[c]], 1: [[c]]},
    ]


@pytest.mark.parametrize("target", FAST_LOGS)
def test_a_missing_data_object_fails_the_merge_of_its_topic_log_and_nothing_else(
    target: tuple[str, int], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data object gone from storage: the merge of its topic log's partitions reports the
    missing object against each of them and commits nothing there; the topic's other logs
    (with commit.logs 3: partitions 1 and 2) and another topic (whose commits carry their data)
    merge."""
    where: Target = open_target(request, monkeypatch, target)
    logs = target[1]
    store = open_store(where)
    store.create_topic("broken", 3, OBJECTS)
    store.create_topic("fine", 3)
    _produce_flushes(store, "broken", 3, 2)
    _produce_flushes(store, "fine", 3, 2)
    lost = store.partition("broken", 0).state().segments[-1].path
    store.storage.delete([object_location(store, "broken", lost)])
    versions = store.partition("broken", 0).state().version
    summary = merge_segments(None, open_store(where), verbose=False)
    rows = {(row.topic, row.partition): row for row in summary.partitions}
    for p in range(3):
        if p % logs == 0:  # in partition 0's topic log
            assert rows[("broken", p)].outcome == "error"
            assert "MissingSegmentError" in rows[("broken", p)].reason
        else:
            assert rows[("broken", p)].outcome == "committed", rows[("broken", p)]
        assert rows[("fine", p)].outcome == "committed"
    fresh = open_store(where)
    assert fresh.partition("broken", 0).state().version == versions
    for p in range(1, 3):
        if p % logs:
            (segment,) = fresh.partition("broken", p).state().segments
            assert segment.byte_range is None


@pytest.mark.parametrize("target", FAST)
def test_when_rewriting_a_topic_logs_ranges_together_fails_each_partition_merges_alone(
    target: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read of the shared part fails (a storage error): the partitions' own merges still
    take every range, and each row says what failed."""
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("flaky", 3)
    _produce_flushes(store, "flaky", 3, 4)
    before = {p: values(store, "flaky", p) for p in range(3)}

    def fail(*_: object, **__: object) -> None:
        raise StorageError("injected: the storage did not answer")

    monkeypatch.setattr(merger, "read_object_ranges", fail)
    summary = merge_segments(None, open_store(where), verbose=False)
    assert summary.count("committed") == 3
    for row in summary.partitions:
        assert "rewriting the ranges together failed (StorageError: injected" in row.reason
    fresh = open_store(where)
    for p in range(3):
        (segment,) = fresh.partition("flaky", p).state().segments
        assert segment.byte_range is None
        assert values(fresh, "flaky", p) == before[p]
