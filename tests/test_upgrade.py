"""Upgrading a topic from layout 2 to layout 3 (``kstore.upgrade``, ``kstore topics upgrade``),
on memory:// and a local directory: records at the same offsets, group offsets, open and
decided transactions finished by the producer's next instance, idempotent producer sequences,
new writes through the topic log, re-runs, a run stopped after each step, dry runs; and a
layout-2 topic stays readable and unchanged by this version."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from kstore.cli.app import app
from typer.testing import CliRunner

import kstore
from kstore import upgrade as upgrade_module
from kstore.consumer import Consumer
from kstore.errors import (
    IllegalStateError,
    LayoutUpgradeRequiredError,
    OutOfOrderSequenceError,
    UnknownTopicOrPartitionError,
)
from kstore.groups import Group
from kstore.layout import partition_dir, topic_data_dir, topic_log_dir
from kstore.log import Log
from kstore.manifest import PartitionState
from kstore.partition import ProducerBatch
from kstore.producer import Producer
from kstore.records import OffsetAndMetadata, TopicPartition
from kstore.segments import TIMESTAMP_TYPE, layout_of
from kstore.store import TopicState
from kstore.topic_log import TOPIC_LOG_VERSION, TOPIC_LOG_WRITER_VERSION, TopicLogState
from kstore.upgrade import (
    Step,
    adopt_partitions,
    seal_partitions,
    switch_layout,
    upgrade_topic,
)
from tests import layout2

TOPIC = "t"
PARTITIONS = 3
BASE_US = 1_700_000_000_000_000
GROUP_OFFSETS = {0: 3, 1: 2, 2: 1}
RETRY = ProducerBatch("retrying-producer", 0, 0, 2)  # a batch committed before the upgrade

Row = tuple[int, int, bytes | None, bytes | None]  # partition, offset, key, value


@pytest.fixture(params=["memory", "local"])
def target(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    url, options = request.getfixturevalue(f"{request.param}_store")
    return url, options


def fresh(target: tuple[str, dict[str, Any]]) -> kstore.Store:
    """Another Store object on the same URL: what another process sees."""
    return kstore.Store(target[0], target[1], create=False)


# -- helpers -----------------------------------------------------------------------------------


def table(values: list[bytes]) -> pa.Table:
    n = len(values)
    return pa.table(
        {
            "key": pa.array([None] * n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "timestamp": pa.array([BASE_US + i for i in range(n)], TIMESTAMP_TYPE),
        }
    )


def read_all(store: kstore.Store, isolation: str = "read_uncommitted") -> list[Row]:
    out: list[Row] = []
    with Consumer(
        TOPIC, store=store, auto_offset_reset="earliest", isolation_level=isolation
    ) as consumer:
        idle = 0
        while idle < 3:
            got = consumer.poll(timeout_ms=30)
            idle = 0 if got else idle + 1
            out.extend((r.partition, r.offset, r.key, r.value) for rs in got.values() for r in rs)
    return sorted(out)


def snapshot(store: kstore.Store) -> dict[str, bytes]:
    """Every file of the store with its content."""
    fs = store.storage.fs
    root = store.storage.full_path("")
    return {path: bytes(fs.cat_file(path)) for path in fs.find(root)}


def partition_log(store: kstore.Store, p: int) -> Log[PartitionState]:
    meta = store.topic(TOPIC)
    return Log(store.storage, f"{partition_dir(TOPIC, meta.topic_id, p)}/_log", PartitionState)


def files_below(store: kstore.Store, rel: str) -> set[str]:
    return {path for path in snapshot(store) if f"/{rel}/" in path}


def segment_actions(state: PartitionState) -> list[dict[str, Any]]:
    """The live segments as a checkpoint records them (a transaction tag only while open)."""
    return [
        s.to_action(open_transaction=s.transaction in state.open_transactions)
        for s in state.segments
    ]


def crash(*args: Any, **kwargs: Any) -> None:
    raise SystemExit("the process died after the decision, before the markers")


@dataclass
class Before:
    """What a layout-2 topic held right before its upgrade."""

    rows: list[Row]
    committed_rows: list[Row]
    states: dict[int, PartitionState]
    retry: tuple[int, int]  # offsets RETRY got


def build_layout2(store: kstore.Store) -> Before:
    """A layout-2 topic (tests/layout2.py: what an older version wrote) with keyed records of
    an idempotent producer, a committed transaction, one left open, one decided but not
    marked, a batch of a producer that will retry it, and committed group offsets."""
    layout2.create_topic(store, TOPIC, PARTITIONS)
    plain = layout2.Idempotent(store)
    for i in range(30):
        plain.send(TOPIC, i % PARTITIONS, layout2.records([b"plain-%d" % i], [b"k%d" % (i % 7)]))
    done = layout2.Transactional(store, "tx-done")
    for i in range(6):
        done.send(TOPIC, i % PARTITIONS, layout2.records([b"done-%d" % i], [b"k%d" % i]))
    done.commit()
    left_open = layout2.Transactional(store, "tx-open")
    for i in range(6):  # written, never decided: then the process died
        left_open.send(TOPIC, i % PARTITIONS, layout2.records([b"open-%d" % i], [b"k%d" % i]))
    decided = layout2.Transactional(store, "tx-decided")
    for i in range(6):  # decided, and the process died before the markers
        decided.send(TOPIC, i % PARTITIONS, layout2.records([b"decided-%d" % i], [b"k%d" % i]))
    decided.decide("commit")
    landed = layout2.append(store, TOPIC, 0, table([b"r0", b"r1", b"r2"]), producer=RETRY)
    Group(store, "g").commit_offsets(
        {TopicPartition(TOPIC, p): OffsetAndMetadata(o) for p, o in GROUP_OFFSETS.items()},
        member_id=None,
        generation=-1,
    )
    states = {p: store.partition_state(TOPIC, p) for p in range(PARTITIONS)}
    assert sum(len(s.open_transactions) for s in states.values()) >= 2  # open and decided
    rows = read_all(store)
    committed = read_all(store, "read_committed")
    assert {v for *_, v in rows} >= {b"open-0", b"decided-0", b"done-0", b"r2"}
    assert not {v for *_, v in committed if v is not None and v.startswith(b"open")}
    return Before(rows, committed, states, (landed.base_offset, landed.last_offset))


def check_upgraded(target: tuple[str, dict[str, Any]], before: Before) -> None:
    """What a fully upgraded topic must show to a fresh process."""
    store = fresh(target)
    meta = store.topic(TOPIC)
    assert meta.layout == 3
    assert read_all(store) == before.rows
    assert read_all(store, "read_committed") == before.committed_rows
    for p in range(PARTITIONS):
        state = store.partition_state(TOPIC, p)
        old = before.states[p]
        assert (state.start_offset, state.end_offset) == (old.start_offset, old.end_offset)
        assert state.last_stable_offset == old.last_stable_offset
        assert state.open_transactions == old.open_transactions
        assert state.producers == old.producers
        assert state.ended_transactions == old.ended_transactions
        assert segment_actions(state) == segment_actions(old)
        assert state.sealed_layout is None  # the seal belongs to the partition log only
        assert store.partition(TOPIC, p).topic_log is not None


# -- the upgrade -----------------------------------------------------------------------------


def test_upgrade_keeps_records_offsets_transactions_and_producers(
    target: tuple[str, dict[str, Any]],
) -> None:
    store = kstore.Store(*target)
    before = build_layout2(store)
    report = upgrade_topic(store, TOPIC)
    assert report.layout_before == 2
    assert report.changed
    assert [(p.partition, p.sealed, p.adopted) for p in report.partitions] == [
        (p, Step.done, Step.done) for p in range(PARTITIONS)
    ]
    assert report.topic_logs == ((0, Step.done),)
    assert report.metadata is Step.done
    assert [p.end_offset for p in report.partitions] == [
        before.states[p].end_offset for p in range(PARTITIONS)
    ]
    check_upgraded(target, before)
    # The store object that ran the upgrade reads through the topic log too.
    assert store.partition(TOPIC, 0).topic_log is not None
    assert read_all(store) == before.rows


def test_upgrade_writes_the_versions_and_adopts_segments_by_reference(
    target: tuple[str, dict[str, Any]],
) -> None:
    store = kstore.Store(*target)
    build_layout2(store)
    files_before = snapshot(store)
    upgrade_topic(store, TOPIC)
    meta = store.topic(TOPIC)
    incarnation = topic_data_dir(TOPIC, meta.topic_id)
    # Topic metadata: the newest protocol, 5/6 (layout 3 with incremental checkpoints, the
    # sidecar horizon and commits that carry data) before the metaData that says layout 3.
    newest = {"minReaderVersion": TOPIC_LOG_VERSION, "minWriterVersion": TOPIC_LOG_WRITER_VERSION}
    metadata_log = Log(store.storage, topic_log_dir(TOPIC), TopicState)
    head = metadata_log.read_commit(metadata_log.load().version)
    assert head is not None
    assert head[1] == [
        ("protocol", newest),
        ("metaData", {**files_metadata(files_before), "layout": 3}),
    ]
    # Partition logs: sealed, writers of version 3 only, readers unchanged.
    for p in range(PARTITIONS):
        sealed = partition_log(store, p).load()
        assert sealed.sealed_layout == 3
        assert (sealed.min_reader_version, sealed.min_writer_version) == (1, 3)
    # Topic log 0, version 0: the newest protocol and every partition, segments by reference.
    shared = Log(store.storage, f"{incarnation}/_log", TopicLogState)
    commit = shared.read_commit(0)
    assert commit is not None
    assert commit[0]["operation"] == "UPGRADE TOPIC"
    assert commit[1][0] == ("protocol", newest)
    assert {body["partition"] for _, body in commit[1][1:]} == set(range(PARTITIONS))
    adds = [body for name, body in commit[1] if name == "add"]
    assert adds
    assert all(a["path"].startswith("segments/") and "range" not in a for a in adds)
    # Nothing copied: every file there was is there unchanged; the new ones are commits.
    after = snapshot(store)
    assert all(after[path] == data for path, data in files_before.items() if "/_log/" not in path)
    new = sorted(set(after) - set(files_before))
    assert new
    assert all("/_log/" in path and path.endswith(".json") for path in new)
    assert not files_below(store, "_data")


def files_metadata(files: dict[str, bytes]) -> dict[str, Any]:
    """The topic's metaData body as the files hold it before the upgrade."""
    (path,) = [p for p in files if p.endswith(f"topics/{TOPIC}/_log/00000000000000000000.json")]
    lines = [json.loads(line) for line in files[path].decode().splitlines()]
    (body,) = [line["metaData"] for line in lines if "metaData" in line]
    return dict(body)


def test_group_offsets_stay_valid(target: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(*target)
    before = build_layout2(store)
    upgrade_topic(store, TOPIC)
    reader = fresh(target)
    for p, offset in GROUP_OFFSETS.items():
        committed = Group(reader, "g").committed(TopicPartition(TOPIC, p))
        assert committed is not None
        assert committed.offset == offset
    first: dict[int, int] = {}
    with Consumer(
        TOPIC,
        store=reader,
        group_id="g",
        session_timeout_ms=2_500,
        heartbeat_interval_ms=200,
        enable_auto_commit=False,
    ) as consumer:
        for _ in range(200):
            for tp, records in consumer.poll(timeout_ms=50).items():
                first.setdefault(tp.partition, records[0].offset)
            if len(first) == PARTITIONS:
                break
    assert first == GROUP_OFFSETS  # each partition resumes where the group left it
    assert all(before.states[p].end_offset > o for p, o in GROUP_OFFSETS.items())


def test_new_writes_go_to_the_topic_log(target: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(*target)
    before = build_layout2(store)
    upgrade_topic(store, TOPIC)
    meta = store.topic(TOPIC)
    partition_logs = {
        p: files_below(store, f"{partition_dir(TOPIC, meta.topic_id, p)}/_log")
        for p in range(PARTITIONS)
    }
    shared = Log(store.storage, f"{topic_data_dir(TOPIC, meta.topic_id)}/_log", TopicLogState)
    version = shared.load().version
    for writer in (store, fresh(target)):  # the store that upgraded, and another process
        with Producer(writer) as producer:
            sent = [
                producer.send(TOPIC, value=b"new-%d" % p, partition=p).get(timeout=30)
                for p in range(PARTITIONS)
            ]
        assert [m.offset for m in sent] == [
            fresh(target).partition_state(TOPIC, p).end_offset - 1 for p in range(PARTITIONS)
        ]
    for p in range(PARTITIONS):
        assert (
            files_below(store, f"{partition_dir(TOPIC, meta.topic_id, p)}/_log")
            == (partition_logs[p])
        )
    assert shared.load().version > version
    rows = read_all(fresh(target))
    assert set(before.rows) <= set(rows)
    new = sorted((p, o) for p, o, _, v in rows if v is not None and v.startswith(b"new-"))
    ends = {p: before.states[p].end_offset for p in range(PARTITIONS)}
    assert new == sorted(
        [(p, ends[p]) for p in range(PARTITIONS)] + [(p, ends[p] + 1) for p in range(PARTITIONS)]
    )


def test_transactions_are_finished_by_the_next_instance(
    target: tuple[str, dict[str, Any]],
) -> None:
    store = kstore.Store(*target)
    before = build_layout2(store)
    upgrade_topic(store, TOPIC)
    other = fresh(target)
    Producer(other, transactional_id="tx-open").close()  # aborts the open transaction
    Producer(other, transactional_id="tx-decided").close()  # rolls the decision forward
    reader = fresh(target)
    for p in range(PARTITIONS):
        state = reader.partition_state(TOPIC, p)
        assert state.open_transactions == {}
        assert state.last_stable_offset == state.end_offset == before.states[p].end_offset
    expected = [row for row in before.rows if row[3] is None or not row[3].startswith(b"open-")]
    assert read_all(reader) == expected
    assert read_all(reader, "read_committed") == expected  # the decided records, in place


def test_idempotent_producer_sequences_carry(target: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(*target)
    before = build_layout2(store)
    upgrade_topic(store, TOPIC)
    part = fresh(target).partition(TOPIC, 0)
    assert part.topic_log is not None
    version = part.state().version
    again = part.append(table([b"r0", b"r1", b"r2"]), producer=RETRY)  # the retry
    assert again.duplicate
    assert (again.base_offset, again.last_offset) == before.retry
    assert part.state().version == version  # nothing committed
    with pytest.raises(OutOfOrderSequenceError):  # a gap is still a gap
        part.append(table([b"x"]), producer=ProducerBatch(RETRY.producer_id, 0, 9, 9))
    nxt = part.append(table([b"r3"]), producer=ProducerBatch(RETRY.producer_id, 0, 3, 3))
    assert (nxt.base_offset, nxt.duplicate) == (before.states[0].end_offset, False)


# -- idempotence and runs that stopped -------------------------------------------------------


def test_a_second_run_changes_nothing(target: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(*target)
    build_layout2(store)
    upgrade_topic(store, TOPIC)
    files = snapshot(store)
    for runner_store in (store, fresh(target)):
        report = upgrade_topic(runner_store, TOPIC)
        assert report.layout_before == 3
        assert not report.changed
        assert report.partitions == ()
        assert report.metadata is Step.already
    assert snapshot(store) == files


def test_concurrent_runs_upgrade_once(target: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(*target)
    before = build_layout2(store)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            upgrade_topic(fresh(target), TOPIC)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    meta = store.topic(TOPIC)
    shared = Log(store.storage, f"{topic_data_dir(TOPIC, meta.topic_id)}/_log", TopicLogState)
    assert shared.load().version == 0  # one version 0, adopted once
    for p in range(PARTITIONS):
        log = partition_log(store, p)
        assert log.load().version == before.states[p].version + 1  # sealed once
    check_upgraded(target, before)


def test_a_run_stopped_after_sealing_is_finished_by_the_next(
    target: tuple[str, dict[str, Any]],
) -> None:
    store = kstore.Store(*target)
    before = build_layout2(store)
    assert seal_partitions(store, TOPIC) == dict.fromkeys(range(PARTITIONS), Step.done)
    assert seal_partitions(store, TOPIC) == dict.fromkeys(range(PARTITIONS), Step.already)
    # Meanwhile: readers read as before, writers are told to finish the upgrade.
    other = fresh(target)
    assert other.topic(TOPIC).layout == 2
    assert read_all(other) == before.rows
    with pytest.raises(LayoutUpgradeRequiredError, match="kstore topics upgrade t"):
        other.partition(TOPIC, 1).append(table([b"refused"]))
    with pytest.raises(IllegalStateError, match="not in a topic log"):
        switch_layout(other, TOPIC)  # the steps keep their order
    assert other.topic(TOPIC).layout == 2
    report = upgrade_topic(fresh(target), TOPIC)
    assert {(p.sealed, p.adopted) for p in report.partitions} == {(Step.already, Step.done)}
    assert report.metadata is Step.done
    check_upgraded(target, before)


def test_a_run_stopped_after_adopting_is_finished_by_the_next(
    target: tuple[str, dict[str, Any]],
) -> None:
    store = kstore.Store(*target)
    before = build_layout2(store)
    with pytest.raises(IllegalStateError, match="not sealed"):
        adopt_partitions(store, TOPIC)  # the steps keep their order
    seal_partitions(store, TOPIC)
    assert adopt_partitions(store, TOPIC) == dict.fromkeys(range(PARTITIONS), Step.done)
    assert adopt_partitions(store, TOPIC) == dict.fromkeys(range(PARTITIONS), Step.already)
    assert fresh(target).topic(TOPIC).layout == 2
    assert read_all(fresh(target)) == before.rows  # still read from the partition logs
    report = upgrade_topic(fresh(target), TOPIC)
    assert {(p.sealed, p.adopted) for p in report.partitions} == {(Step.already, Step.already)}
    assert report.topic_logs == ((0, Step.already),)
    assert report.metadata is Step.done
    check_upgraded(target, before)


def test_partitions_added_after_a_stopped_run_are_adopted_too(
    target: tuple[str, dict[str, Any]],
) -> None:
    store = kstore.Store(*target)
    before = build_layout2(store)
    seal_partitions(store, TOPIC)
    adopt_partitions(store, TOPIC)
    store.add_partitions(TOPIC, PARTITIONS + 1)  # still layout 2: a new, unsealed log
    # An older version's writer starts the new partition's log.
    landed = layout2.append(fresh(target), TOPIC, PARTITIONS, table([b"late"]))
    report = upgrade_topic(fresh(target), TOPIC)
    assert [(p.partition, p.sealed, p.adopted) for p in report.partitions[-2:]] == [
        (PARTITIONS - 1, Step.already, Step.already),
        (PARTITIONS, Step.done, Step.done),
    ]
    reader = fresh(target)
    assert reader.topic(TOPIC).layout == 3
    rows = read_all(reader)
    assert (PARTITIONS, landed.base_offset, None, b"late") in rows
    assert set(before.rows) <= set(rows)


def test_dry_run_changes_nothing(target: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(*target)
    build_layout2(store)
    files = snapshot(store)
    report = upgrade_topic(store, TOPIC, dry_run=True)
    assert report.dry_run
    assert not report.changed
    assert {(p.sealed, p.adopted) for p in report.partitions} == {(Step.planned, Step.planned)}
    assert report.topic_logs == ((0, Step.planned),)
    assert report.metadata is Step.planned
    assert snapshot(store) == files
    seal_partitions(store, TOPIC)  # half done: the dry run says what is left
    files = snapshot(store)
    report = upgrade_topic(store, TOPIC, dry_run=True)
    assert {(p.sealed, p.adopted) for p in report.partitions} == {(Step.already, Step.planned)}
    assert snapshot(store) == files
    assert store.topic(TOPIC).layout == 2


def test_typed_topic_keeps_its_schemas(target: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(*target)
    layout2.create_topic(
        store, TOPIC, 2, value_schema="id BIGINT NOT NULL, name STRING", key_schema="long"
    )
    store.alter_topic_schema(TOPIC, "id BIGINT NOT NULL, name STRING, email STRING")
    record_schema = layout_of(store.topic(TOPIC)).record_schema
    for i in range(8):
        typed = pa.table(
            {
                "key": pa.array([i], record_schema.field("key").type),
                "value": pa.array(
                    [{"id": i, "name": f"n{i}", "email": None}], record_schema.field("value").type
                ),
                "timestamp": pa.array([BASE_US + i], TIMESTAMP_TYPE),
            }
        )
        layout2.append(store, TOPIC, i % 2, typed)
    schemas = store.topic(TOPIC).schemas
    rows = read_all(store)
    upgrade_topic(store, TOPIC)
    meta = fresh(target).topic(TOPIC)
    assert (meta.layout, meta.schemas) == (3, schemas)
    assert read_all(fresh(target)) == rows
    assert len(rows) == 8


def test_upgrade_refuses_an_unknown_topic(target: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(*target)
    with pytest.raises(UnknownTopicOrPartitionError, match="'nope' does not exist"):
        upgrade_topic(store, "nope")
    store.create_topic(TOPIC, 1)  # layout 3 from the start
    assert upgrade_topic(store, TOPIC).layout_before == 3
    with pytest.raises(IllegalStateError, match="layout 3 already"):
        seal_partitions(store, TOPIC)


# -- layout 2 without an upgrade -------------------------------------------------------------


def test_a_layout2_topic_stays_readable_and_unchanged_by_reading(
    target: tuple[str, dict[str, Any]],
) -> None:
    store = kstore.Store(*target)
    layout2.create_topic(store, TOPIC, 2)
    for i in range(10):
        layout2.append(store, TOPIC, i % 2, layout2.records([b"v%d" % i], [b"k%d" % i]))
    files = snapshot(store)
    reader = fresh(target)
    rows = read_all(reader)
    assert sorted(v for *_, v in rows if v is not None) == sorted(b"v%d" % i for i in range(10))
    described = reader.describe_topic(TOPIC)
    assert described.metadata.layout == 2
    assert [p.log_end_offset for p in described.partitions] == [
        len([r for r in rows if r[0] == p]) for p in range(2)
    ]
    # Reading writes nothing: no topic log, no data object, no log raised to a version older
    # readers refuse.
    assert snapshot(store) == files
    meta = reader.topic(TOPIC)
    incarnation = topic_data_dir(TOPIC, meta.topic_id)
    assert not files_below(store, f"{incarnation}/_log")
    assert not files_below(store, "_data")
    metadata_log = Log(store.storage, topic_log_dir(TOPIC), TopicState).load()
    assert (metadata_log.min_reader_version, metadata_log.min_writer_version) == (1, 1)
    for p in range(2):
        state = partition_log(store, p).load()
        assert (state.min_reader_version, state.min_writer_version) == (1, 1)
        assert state.sealed_layout is None


# -- the command -----------------------------------------------------------------------------


runner = CliRunner()


def cli(target: tuple[str, dict[str, Any]], *args: str, code: int = 0) -> Any:
    result = runner.invoke(app, [*args, "--store", target[0]])
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


def test_cli_upgrade(target: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(*target)
    before = build_layout2(store)
    files = snapshot(store)
    dry = cli(target, "topics", "upgrade", TOPIC, "--dry-run")
    assert "to seal" in dry.stdout
    assert "to adopt" in dry.stdout
    assert "Dry run" in dry.stderr
    assert "nothing was changed" in dry.stderr
    assert snapshot(store) == files
    done = cli(target, "topics", "upgrade", TOPIC)
    assert done.stdout.count("sealed") == PARTITIONS
    assert "adopted" in done.stdout
    assert f"Upgraded topic {TOPIC!r} to layout 3." in done.stderr
    check_upgraded(target, before)
    again = json.loads(cli(target, "topics", "upgrade", TOPIC, "-o", "json").stdout)
    assert (again["layout_before"], again["changed"], again["partitions"]) == (3, False, [])
    assert "layout 3 already" in cli(target, "topics", "upgrade", TOPIC).stderr
    missing = cli(target, "topics", "upgrade", "nope", code=1)
    lines = missing.stderr.strip().splitlines()
    assert lines == [f"error: topic 'nope' does not exist in {target[0]!r}"]


def test_cli_upgrade_json_reports_each_partition(target: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(*target)
    before = build_layout2(store)
    seal_partitions(store, TOPIC)
    out = json.loads(cli(target, "topics", "upgrade", TOPIC, "-o", "json").stdout)
    assert out["layout_before"] == 2
    assert out["layout"] == 3
    assert out["changed"]
    assert out["topic_logs"] == [{"index": 0, "version0": "done"}]
    assert [
        (p["partition"], p["log_end_offset"], p["sealed"], p["adopted"]) for p in out["partitions"]
    ] == [(p, before.states[p].end_offset, "already", "done") for p in range(PARTITIONS)]


def test_partitions_added_during_a_run_are_moved_before_the_switch(
    target: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = kstore.Store(*target)
    before = build_layout2(store)
    real_adopt = upgrade_module._adopt
    rounds: list[int] = []

    def adopt_then_grow(*args: Any, **kwargs: Any) -> Any:
        done = real_adopt(*args, **kwargs)
        if not rounds:  # another client adds a partition and writes to it, before step 3
            other = fresh(target)
            other.add_partitions(TOPIC, PARTITIONS + 1)
            layout2.append(other, TOPIC, PARTITIONS, table([b"late"]))  # an older writer
        rounds.append(len(done[0]))
        return done

    monkeypatch.setattr(upgrade_module, "_adopt", adopt_then_grow)
    report = upgrade_topic(store, TOPIC)
    assert rounds == [PARTITIONS, PARTITIONS + 1]
    assert [(p.partition, p.sealed, p.adopted, p.end_offset) for p in report.partitions] == [
        *((p, Step.done, Step.done, before.states[p].end_offset) for p in range(PARTITIONS)),
        (PARTITIONS, Step.done, Step.done, 1),
    ]
    reader = fresh(target)
    assert (reader.topic(TOPIC).layout, reader.topic(TOPIC).partitions) == (3, PARTITIONS + 1)
    assert read_all(reader) == sorted([*before.rows, (PARTITIONS, 0, None, b"late")])


def test_an_idempotent_producer_carries_on_after_the_upgrade(
    target: tuple[str, dict[str, Any]],
) -> None:
    """The producer's batches before the upgrade were written by an older version (this one
    writes no layout 2); its next batches, after the upgrade, go to the topic log and carry on
    from its sequences there."""
    store = kstore.Store(*target)
    layout2.create_topic(store, TOPIC, PARTITIONS)
    old = layout2.Idempotent(store)
    before = [old.send(TOPIC, p, table([b"a%d" % p])) for p in range(PARTITIONS)]
    entries = {p: store.partition_state(TOPIC, p).producers for p in range(PARTITIONS)}
    upgrade_topic(store, TOPIC)
    writer = fresh(target)  # another process, which opens the topic in layout 3
    after = [
        writer.partition(TOPIC, p).append(
            table([b"b%d" % p]), producer=ProducerBatch(old.producer_id, 0, 1, 1)
        )
        for p in range(PARTITIONS)
    ]
    assert [m.base_offset for m in after] == [m.base_offset + 1 for m in before]
    reader = fresh(target)
    for p in range(PARTITIONS):
        ((pid, entry),) = entries[p].items()
        new = reader.partition_state(TOPIC, p).producers[pid]  # the same producer, in order
        assert (new.epoch, new.first_sequence) == (entry.epoch, entry.last_sequence + 1)
    assert [(p, o, v) for p, o, _, v in read_all(reader)] == sorted(
        [(p, 0, b"a%d" % p) for p in range(PARTITIONS)]
        + [(p, 1, b"b%d" % p) for p in range(PARTITIONS)]
    )


def test_a_live_consumer_reads_what_is_written_after_the_upgrade(
    target: tuple[str, dict[str, Any]],
) -> None:
    store = kstore.Store(*target)
    layout2.create_topic(store, TOPIC, 1)
    layout2.append(store, TOPIC, 0, table([b"old"]))
    got: list[bytes | None] = []
    with Consumer(
        TOPIC, store=fresh(target), auto_offset_reset="earliest", metadata_max_age_ms=100
    ) as consumer:
        while not got:
            got += [r.value for rs in consumer.poll(timeout_ms=20).values() for r in rs]
        upgrade_topic(store, TOPIC)
        with Producer(fresh(target)) as producer:
            producer.send(TOPIC, value=b"new").get(timeout=30)
        for _ in range(200):  # well past metadata_max_age_ms
            got += [r.value for rs in consumer.poll(timeout_ms=20).values() for r in rs]
            if len(got) == 2:
                break
    assert got == [b"old", b"new"]


def test_a_transaction_after_the_upgrade_first_ends_the_one_left_before_it(
    target: tuple[str, dict[str, Any]],
) -> None:
    """A transaction an older version's producer left open in the layout-2 topic is aborted
    by its id's next instance, after the upgrade, which then commits its own through the
    topic log."""
    store = kstore.Store(*target)
    layout2.create_topic(store, TOPIC, PARTITIONS)
    old = layout2.Transactional(store, "tx-live")
    for p in range(PARTITIONS):
        old.send(TOPIC, p, table([b"old-%d" % p]))
    upgrade_topic(store, TOPIC)
    producer = Producer(fresh(target), transactional_id="tx-live")
    try:
        producer.begin_transaction()
        for p in range(PARTITIONS):
            producer.send(TOPIC, value=b"t%d" % p, partition=p)
        producer.commit_transaction()
    finally:
        producer.close()
    reader = fresh(target)
    assert [(p, o, v) for p, o, _, v in read_all(reader, "read_committed")] == [
        (p, 1, b"t%d" % p) for p in range(PARTITIONS)
    ]
