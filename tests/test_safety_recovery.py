"""`kstore topics recover` (kstore.recovery, PROTOCOL.md 17.7): a damaged, cut or missing
commit file of a topic log no longer makes the topic unreadable and unwritable for good.

Each test writes records through a producer, damages one version of a topic log the way a
copy, a restore or a careless hand does (bytes cut off, garbage written over, the file
deleted), checks that readers refuse the topic, recovers it, and then checks what matters: the
topic reads and takes writes again, every record that was readable before the damage and is
not in a version the recovery reports as lost is readable at its offset, the reported losses
are exactly the records of the damaged version, no offset is given out twice, and a dry run
changes nothing.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from kstore.cli.app import app
from typer.testing import CliRunner

from kstore import Store
from kstore.consumer import Consumer
from kstore.errors import CorruptLogError, KStoreError
from kstore.layout import partition_dir, topic_data_dir
from kstore.log import checkpoint_file, decode_commit, version_file, wait_for_checkpoints
from kstore.producer import Producer
from kstore.records import TopicPartition
from kstore.recovery import RECOVERY_DIR, RecoveryReport, recover_topic
from kstore.topic_log import shared_log_dir
from kstore.upgrade import upgrade_topic
from tests import layout2
from tests.conftest import StoreTarget

runner = CliRunner()
Records = dict[tuple[int, int], bytes]  # (partition, offset) -> value

PARTITIONS = 4
ROUNDS = 6  # each round: 2 records to every partition, one flush (a commit per topic log)


def _store(target: StoreTarget) -> Store:
    return Store(target.url, target.storage_options)


def _fill(
    store: Store, topic: str, *, commit_logs: int, config: dict[str, str] | None = None
) -> Records:
    store.create_topic(topic, PARTITIONS, {"commit.logs": str(commit_logs), **(config or {})})
    written: Records = {}
    with Producer(store, linger_ms=0) as producer:
        for r in range(ROUNDS):
            futures = [
                (p, i, producer.send(topic, value=b"r%d-p%d-%d" % (r, p, i), partition=p))
                for p in range(PARTITIONS)
                for i in range(2)
            ]
            producer.flush()
            for p, i, future in futures:
                meta = future.get(10)
                written[(p, meta.offset)] = b"r%d-p%d-%d" % (r, p, i)
    return written


def _read_all(target: StoreTarget, topic: str) -> Records:
    """Every record of the topic, read by a fresh store (no cached state)."""
    store = _store(target)
    meta = store.topic(topic)
    out: Records = {}
    for p in range(meta.partitions):
        part = store.partition(topic, p, meta)
        state = part.state()
        if state.end_offset == state.start_offset:
            continue
        for batch in part.read(state.start_offset):
            rows = batch.to_pydict()
            for offset, value in zip(rows["offset"], rows["value"], strict=True):
                out[(p, offset)] = value
    return out


def _log_dir(store: Store, topic: str, index: int) -> str:
    meta = store.topic(topic)
    return shared_log_dir(topic_data_dir(topic, meta.topic_id), index)


def _adds(data: bytes) -> list[tuple[int, int, int]]:
    """(partition, first offset, end offset) of each add of an intact commit file."""
    _, actions = decode_commit(data, "test")
    return [
        (b["partition"], b["baseOffset"], b["lastOffset"] + 1) for n, b in actions if n == "add"
    ]


def _lost(report: RecoveryReport) -> set[tuple[int, int]]:
    """The offsets the report knows to be lost (not those it can only say may be)."""
    out: set[tuple[int, int]] = set()
    for lost in report.lost:
        if lost.end_offset is not None:
            out.update((lost.partition, o) for o in range(lost.first_offset, lost.end_offset))
    return out


def _unknown(report: RecoveryReport) -> dict[int, int]:
    """Partition -> the offset from which the report says records may have been lost."""
    return {x.partition: x.first_offset for x in report.lost if x.end_offset is None}


def _tree(target: StoreTarget) -> dict[str, bytes]:
    """Every file of the store, with its bytes (a dry run must leave them all as they were)."""
    if target.name == "local":
        root = target.url.removeprefix("file://")
        out = {}
        for directory, _, files in os.walk(root):
            for name in files:
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, root)] = f.read()
        return out
    storage = _store(target).storage
    fs = storage.fs
    root = storage.full_path("")
    return {path: fs.cat_file(path) for path in fs.find(root)}


def _refused(target: StoreTarget, topic: str) -> None:
    with pytest.raises(CorruptLogError):
        _read_all(target, topic)


DAMAGES = ["truncated", "garbage", "deleted"]


def _damage(store: Store, path: str, how: str) -> bytes:
    original = store.storage.read(path)
    if how == "truncated":
        store.storage.put(path, original[: len(original) // 3])  # cut inside the first add
    elif how == "garbage":
        store.storage.put(path, b"\x00\xffnot a commit\n" + os.urandom(64))
    else:
        store.storage.delete([path])
    return original


@pytest.mark.parametrize("commit_logs", [1, 3])
@pytest.mark.parametrize("carried", [True, False], ids=["carried", "data-objects"])
@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_middle_version_is_replaced_and_every_later_record_kept(
    local_store_url: tuple[str, dict[str, Any]], how: str, carried: bool, commit_logs: int
) -> None:
    target = StoreTarget("local", *local_store_url)
    store = _store(target)
    config = {} if carried else {"commit.inline.bytes": "0"}
    written = _fill(store, "t", commit_logs=commit_logs, config=config)
    assert _read_all(target, "t") == written
    path = f"{_log_dir(store, 't', 0)}/{version_file(2)}"
    original = _damage(store, path, how)
    damaged = store.storage.read_if_exists(path)
    # A cut file's whole add lines that name a data object are kept (their data checks out);
    # an add naming the commit itself (its data was carried) goes with the file.
    whole = (damaged or b"").split(b"\n")[:-1] if how == "truncated" and not carried else []
    kept = {json.loads(line)["add"]["partition"] for line in whole[1:] if b'"add"' in line}
    expected_lost = {
        (p, o) for p, lo, hi in _adds(original) if p not in kept for o in range(lo, hi)
    }
    assert expected_lost
    assert expected_lost < set(written)
    _refused(target, "t")

    before = _tree(target)
    plan = recover_topic(_store(target), "t")
    assert _tree(target) == before  # a dry run changes nothing
    assert plan.needed
    assert not plan.applied
    fixes = [f for log in plan.logs for f in log.fixes]
    assert [(f.version, f.kind) for f in fixes] == [
        (2, "corrupt" if how != "deleted" else "missing")
    ]
    _refused(target, "t")

    report = recover_topic(_store(target), "t", apply=True)
    assert report.applied
    assert report.folder is not None
    assert _lost(report) == _lost(plan) == expected_lost  # exactly the damaged version's records
    after = _read_all(target, "t")
    assert after == {k: v for k, v in written.items() if k not in expected_lost}
    assert report.folder.startswith(
        f"{topic_data_dir('t', store.topic('t').topic_id)}/{RECOVERY_DIR}/"
    )
    if damaged is not None:  # the damaged file is kept, byte for byte, in the recovery folder
        assert store.storage.read(f"{report.folder}/_log/{version_file(2)}") == damaged

    # The topic takes writes again, at offsets never given out before.
    ends = {p: max(o for q, o in written if q == p) + 1 for p in range(PARTITIONS)}
    with Producer(_store(target), linger_ms=0) as producer:
        futures = {p: producer.send("t", value=b"new-%d" % p, partition=p) for p in ends}
        producer.flush()
        for p, future in futures.items():
            assert future.get(10).offset == ends[p]
    assert len(_read_all(target, "t")) == len(after) + PARTITIONS
    # Nothing left to recover.
    assert not recover_topic(_store(target), "t").needed


@pytest.mark.parametrize("commit_logs", [1, 3])
def test_a_cut_commit_keeps_the_adds_it_still_names_whose_data_checks_out(
    local_store_url: tuple[str, dict[str, Any]], commit_logs: int
) -> None:
    """A commit cut after its first partition's add line: that add names a data object that is
    intact (size and CRC-32C checked), so its records are kept at their offsets; only the
    partition whose line was cut loses its records."""
    target = StoreTarget("local", *local_store_url)
    store = _store(target)
    written = _fill(store, "t", commit_logs=commit_logs, config={"commit.inline.bytes": "0"})
    path = f"{_log_dir(store, 't', 0)}/{version_file(3)}"
    original = store.storage.read(path)
    lines = original.split(b"\n")
    # commitInfo, then per partition: add, producer. Cut inside the second partition's add.
    assert b'"add"' in lines[1], lines
    assert b'"add"' in lines[3], lines
    cut = len(lines[0]) + len(lines[1]) + len(lines[2]) + 3 + 20
    store.storage.put(path, original[:cut])
    adds = _adds(original)
    kept_partition = adds[0][0]
    expected_lost = {(p, o) for p, lo, hi in adds[1:] for o in range(lo, hi)}
    report = recover_topic(_store(target), "t", apply=True)
    assert _lost(report) == expected_lost
    (fix,) = [f for log in report.logs for f in log.fixes]
    assert len(fix.kept) == 1
    assert f"partition {kept_partition}:" in fix.kept[0]
    assert _read_all(target, "t") == {k: v for k, v in written.items() if k not in expected_lost}


def test_a_damaged_last_version_with_a_group_ahead_raises_the_end_offset(
    local_store_url: tuple[str, dict[str, Any]],
) -> None:
    """The newest version is garbage: nothing after it shows what it held, but a consumer
    group had committed offsets past what the other versions reach. The recovery raises the
    end offset there (a RECOVER commit with endOffset), so those offsets are never given to
    new records; a partition without such evidence is reported as unknown."""
    target = StoreTarget("local", *local_store_url)
    store = _store(target)
    written = _fill(store, "t", commit_logs=1, config={"commit.inline.bytes": "0"})
    ends = {p: max(o for q, o in written if q == p) + 1 for p in range(PARTITIONS)}
    consumer = Consumer(store=_store(target), group_id="g", enable_auto_commit=False)
    consumer.assign([TopicPartition("t", 0)])
    consumer.commit({TopicPartition("t", 0): ends[0]})
    consumer.close()
    directory = _log_dir(store, "t", 0)
    newest = ROUNDS - 1
    original = _damage(store, f"{directory}/{version_file(newest)}", "garbage")
    in_last = {(p, lo, hi) for p, lo, hi in _adds(original)}
    _refused(target, "t")

    report = recover_topic(_store(target), "t", apply=True)
    (log,) = report.logs
    assert [(f.version, f.kind) for f in log.fixes] == [
        (newest, "corrupt"),
        (newest + 1, "end offsets"),
    ]
    assert log.end_offsets == {0: ends[0]}
    starts = {p: lo for p, lo, _ in in_last}
    assert _lost(report) == {(0, o) for o in range(starts[0], ends[0])}
    # The other partitions of the version: what it held there, nothing shows.
    assert _unknown(report) == {p: starts[p] for p in range(1, PARTITIONS)}
    text = "\n".join(lost.describe() for lost in report.lost)
    assert f"partition 1: any records version {newest} held from offset {starts[1]} on" in text
    with Producer(_store(target), linger_ms=0) as producer:
        first = producer.send("t", value=b"after", partition=0).get(10)
    assert first.offset == ends[0]  # offsets the group had read past are not given again


def test_a_checkpoint_is_where_readers_start_and_a_corrupt_one_is_moved_aside(
    local_store_url: tuple[str, dict[str, Any]],
) -> None:
    """Damage below the newest checkpoint is left alone (readers never replay it), but a hint
    that sends readers through it is made to name the newest checkpoint; a corrupt checkpoint
    is moved to the recovery folder and readers start from the one before."""
    target = StoreTarget("local", *local_store_url)
    store = _store(target)
    config = {"checkpoint.interval": "2", "commit.inline.bytes": "0"}
    written = _fill(store, "t", commit_logs=1, config=config)
    directory = _log_dir(store, "t", 0)
    wait_for_checkpoints(10)
    hint = f"{directory}/_last_checkpoint"
    for version in (2, 4):
        assert store.storage.exists(f"{directory}/{checkpoint_file(version)}")
    # A stale hint (7.3 allows it) and a damaged version between it and the newest checkpoint.
    store.storage.put(hint, b'{"version": 2}')
    intact = _damage(store, f"{directory}/{version_file(3)}", "garbage")
    _refused(target, "t")
    report = recover_topic(_store(target), "t", apply=True)
    assert [f.kind for f in report.logs[0].fixes] == ["hint"]
    assert json.loads(store.storage.read(hint)) == {"version": 4}
    assert any("version 3" in n and "below checkpoint 4" in n for n in report.logs[0].notes)
    assert store.storage.read(f"{directory}/{version_file(3)}") != intact  # left as it is
    assert _read_all(target, "t") == written
    # A corrupt checkpoint, which the hint names.
    store.storage.put(f"{directory}/{version_file(3)}", intact)
    _damage(store, f"{directory}/{checkpoint_file(4)}", "truncated")
    _refused(target, "t")
    report = recover_topic(_store(target), "t", apply=True)
    assert [f.kind for f in report.logs[0].fixes] == ["checkpoint", "hint"]
    assert report.logs[0].start == 2
    assert not store.storage.exists(f"{directory}/{checkpoint_file(4)}")
    assert store.storage.exists(f"{report.folder}/_log/{checkpoint_file(4)}")
    assert json.loads(store.storage.read(hint)) == {"version": 2}
    assert _read_all(target, "t") == written


def test_damage_below_the_checkpoint_to_data_still_live_is_named(
    memory_store_url: tuple[str, dict[str, Any]],
) -> None:
    """Below the checkpoint readers start from, a damaged commit that carried data (11.8) whose
    ranges are still live: the recovery changes nothing there (no version can take its place
    without losing them) and names the offsets that may not be readable."""
    target = StoreTarget("memory", *memory_store_url)
    store = _store(target)
    _fill(store, "t", commit_logs=1, config={"checkpoint.interval": "3"})
    wait_for_checkpoints(10)
    directory = _log_dir(store, "t", 0)
    original = _damage(store, f"{directory}/{version_file(1)}", "truncated")
    p, lo, hi = _adds(original)[0]
    report = recover_topic(_store(target), "t", apply=True)
    assert not report.needed
    assert any(
        f"its data is still live: partition {p} offsets {lo}-{hi - 1} cannot be read" in note
        for note in report.logs[0].notes
    ), report.logs[0].notes


def test_a_version_that_no_longer_applies_is_rewritten_and_a_merge_keeps_the_records(
    local_store_url: tuple[str, dict[str, Any]],
) -> None:
    """A merge, committed after the lost version, removes the ranges it added: without them
    its removes do not apply. The recovery rewrites the merge without those removes; the
    merged Parquet segment, written before the damage, still holds the lost version's records,
    so nothing is lost at all."""
    target = StoreTarget("local", *local_store_url)
    store = _store(target)
    written = _fill(store, "t", commit_logs=1, config={"commit.inline.bytes": "0"})
    result = runner.invoke(app, ["merge", "t", "--no-spark", "--store", target.url])
    assert result.exit_code == 0, result.output
    directory = _log_dir(store, "t", 0)
    merge_version = ROUNDS
    assert store.storage.exists(f"{directory}/{version_file(merge_version)}")
    _damage(store, f"{directory}/{version_file(2)}", "deleted")
    _refused(target, "t")
    report = recover_topic(_store(target), "t", apply=True)
    fixes = report.logs[0].fixes
    assert [(f.version, f.kind) for f in fixes] == [(2, "missing"), (merge_version, "rewritten")]
    assert fixes[1].dropped
    assert all("remove" in d for d in fixes[1].dropped)
    assert report.lost == []
    assert _read_all(target, "t") == written


@pytest.mark.parametrize("backend", ["memory", pytest.param("seaweed", marks=pytest.mark.s3)])
def test_recover_on_other_backends(backend: str, request: pytest.FixtureRequest) -> None:
    """A deleted middle version and a garbage last one of a topic log, on memory:// and on
    SeaweedFS; the dry run changes nothing there either."""
    fixture = {"memory": "memory_store_url", "seaweed": "seaweed_bucket_url"}[backend]
    url, options = request.getfixturevalue(fixture)
    target = StoreTarget(backend, url, options)
    store = _store(target)
    written = _fill(store, "t", commit_logs=3)
    lost: set[tuple[int, int]] = set()
    for index, (version, how) in enumerate([(1, "deleted"), (ROUNDS - 1, "garbage")]):
        original = _damage(store, f"{_log_dir(store, 't', index)}/{version_file(version)}", how)
        if version == 1:
            lost |= {(p, o) for p, lo, hi in _adds(original) for o in range(lo, hi)}
        else:
            last = {(p, o) for p, lo, hi in _adds(original) for o in range(lo, hi)}
    _refused(target, "t")
    before = _tree(target)
    recover_topic(_store(target), "t")
    assert _tree(target) == before
    report = recover_topic(_store(target), "t", apply=True)
    assert _lost(report) == lost
    assert _read_all(target, "t") == {k: v for k, v in written.items() if k not in lost | last}
    with Producer(_store(target), linger_ms=0) as producer:
        producer.send("t", value=b"again", partition=1).get(10)


def test_the_cli_names_the_command_and_recovers(
    local_store_url: tuple[str, dict[str, Any]],
) -> None:
    """Readers' errors name `kstore topics recover <topic>`; the command's dry run prints what
    it would do and lose, changes nothing and exits 0; --apply recovers; -o json parses."""
    target = StoreTarget("local", *local_store_url)
    store = _store(target)
    written = _fill(store, "orders", commit_logs=1, config={"commit.inline.bytes": "0"})
    path = f"{_log_dir(store, 'orders', 0)}/{version_file(2)}"
    original = _damage(store, path, "deleted")
    adds = _adds(original)
    args = ["--store", target.url]
    consumed = runner.invoke(app, ["consume", "orders", *args])
    assert consumed.exit_code == 1
    assert "`kstore topics recover orders`" in consumed.stderr, consumed.stderr
    assert consumed.stderr.count("\n") == 1
    assert "Traceback" not in consumed.stderr
    produced = runner.invoke(app, ["produce", "orders", *args], input="x\n")
    assert produced.exit_code == 1
    assert "`kstore topics recover orders`" in produced.stderr

    before = _tree(target)
    dry = runner.invoke(app, ["topics", "recover", "orders", *args])
    assert dry.exit_code == 0, dry.output
    assert _tree(target) == before
    assert "version 2: the commit file is missing" in dry.stdout
    for p, lo, hi in adds:
        assert f"lost: partition {p}: offsets {lo}-{hi - 1} ({hi - lo} record(s))" in dry.stdout
    assert "Dry run: nothing was changed" in dry.stderr
    assert "kstore topics recover orders --apply" in dry.stderr

    done = runner.invoke(app, ["topics", "recover", "orders", "--apply", "-o", "json", *args])
    assert done.exit_code == 0, done.output
    shown = json.loads(done.stdout)
    assert shown["applied"]
    assert shown["folder"]
    assert shown["logs"][0]["lost"] == [
        {
            "partition": p,
            "first_offset": lo,
            "end_offset": hi,
            "records": hi - lo,
            "cause": "held by version 2",
        }
        for p, lo, hi in adds
    ]
    assert runner.invoke(app, ["consume", "orders", *args]).exit_code == 0
    assert len(_read_all(target, "orders")) == len(written) - sum(hi - lo for _, lo, hi in adds)
    again = runner.invoke(app, ["topics", "recover", "orders", *args])
    assert again.exit_code == 0
    assert "nothing to recover" in again.stderr


def test_a_lost_transaction_marker_is_named(memory_store_url: tuple[str, dict[str, Any]]) -> None:
    """The version holding a transaction's commit marker is deleted: nothing is lost, but the
    transaction stays open (the last stable offset with it). The report says so, and that
    its marker was lost (a later transaction of the producer ended there)."""
    target = StoreTarget("memory", *memory_store_url)
    store = _store(target)
    store.create_topic("t", 1)
    producer = Producer(store, transactional_id="app")
    producer.init_transactions()
    for i in range(2):
        producer.begin_transaction()
        producer.send("t", value=b"v%d" % i)
        producer.commit_transaction()
    producer.close()
    directory = _log_dir(store, "t", 0)
    marker = _damage(store, f"{directory}/{version_file(1)}", "deleted")
    assert [name for name, _ in decode_commit(marker, "test")[1]] == ["txnMarker"]
    report = recover_topic(_store(target), "t", apply=True)
    assert report.lost == []
    (note,) = [n for n in report.logs[0].notes if "transaction" in n]
    assert "is open from offset 0" in note
    assert "its marker was lost" in note
    assert "kstore transactions abort-expired" in note


def test_a_partition_log_of_layout_2_is_recovered_the_same_way(
    memory_store_url: tuple[str, dict[str, Any]],
) -> None:
    target = StoreTarget("memory", *memory_store_url)
    store = _store(target)
    layout2.create_topic(store, "t", 2)  # as an older version wrote it
    written: Records = {}
    for r in range(5):
        for p in range(2):
            landed = layout2.append(store, "t", p, layout2.records([b"r%d-%d" % (r, p)]))
            written[(p, landed.base_offset)] = b"r%d-%d" % (r, p)
    topic = store.topic("t")
    directory = f"{partition_dir('t', topic.topic_id, 1)}/_log"
    original = _damage(store, f"{directory}/{version_file(2)}", "deleted")
    _, actions = decode_commit(original, "test")
    ((first, end),) = [(b["baseOffset"], b["lastOffset"] + 1) for n, b in actions if n == "add"]
    _refused(target, "t")
    report = recover_topic(_store(target), "t", apply=True)
    assert [log.name for log in report.logs if log.needed] == ["partition 1"]
    (lost,) = report.lost
    assert (lost.partition, lost.first_offset, lost.end_offset) == (1, first, end)
    kept = {k: v for k, v in written.items() if not (k[0] == 1 and first <= k[1] < end)}
    assert _read_all(target, "t") == kept
    # Recovered, the log can be upgraded; written to after that.
    upgrade_topic(_store(target), "t")
    with Producer(_store(target), linger_ms=0) as producer:
        assert producer.send("t", value=b"x", partition=1).get(10).offset == 5


def test_a_log_whose_early_versions_are_gone_is_refused_clearly(
    memory_store_url: tuple[str, dict[str, Any]],
) -> None:
    target = StoreTarget("memory", *memory_store_url)
    store = _store(target)
    _fill(store, "t", commit_logs=1)
    directory = _log_dir(store, "t", 0)
    store.storage.delete([f"{directory}/{version_file(0)}", f"{directory}/{version_file(1)}"])
    with pytest.raises(KStoreError, match="versions before 2 are gone"):
        recover_topic(_store(target), "t", apply=True)
    assert store.storage.exists(f"{directory}/{version_file(2)}")  # nothing was changed
