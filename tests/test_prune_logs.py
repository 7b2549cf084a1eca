"""Pruning old versions of group, producer and topic metadata logs (PROTOCOL.md 17.5): below the
newest checkpoint older than the log retention, with a checkpoint written where old commits have
none after them; and the reload of a log state not confirmed as the newest for a day."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from kstore.cli.app import app
from kstore.retention import prune_logs
from typer.testing import CliRunner

import kstore
from kstore import clock
from kstore.errors import InvalidConfigurationError
from kstore.groups import Group
from kstore.layout import group_log_dir, producer_log_dir, topic_log_dir
from kstore.log import STALE_STATE_S, parse_log_file_name
from kstore.producer import Producer
from kstore.records import OffsetAndMetadata, TopicPartition

DAY_MS = 24 * 3600 * 1000
KEEP_MS = 2 * DAY_MS
TP = TopicPartition("t", 0)


def _ms() -> int:
    return int(time.time() * 1000)


def _versions(store: kstore.Store, directory: str) -> tuple[list[int], list[int]]:
    """(commit versions, checkpoint versions) in a log directory."""
    commits, checkpoints = [], []
    for info in store.storage.list_dir(directory):
        parsed = parse_log_file_name(info.name)
        if parsed is not None:
            (checkpoints if parsed[1] else commits).append(parsed[0])
    return sorted(commits), sorted(checkpoints)


def _commit_offsets(store: kstore.Store, first: int, last: int) -> None:
    group = Group(store, "g")
    for offset in range(first, last):
        group.commit_offsets({TP: OffsetAndMetadata(offset)}, member_id=None, generation=-1)


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest) -> kstore.Store:
    url, options = request.getfixturevalue(f"{request.param}_store")
    return kstore.Store(url, options)


def test_a_busy_group_log_is_pruned_to_a_few_files(store: kstore.Store) -> None:
    store.create_topic("t")
    _commit_offsets(store, 0, 120)  # versions 0..119, a checkpoint at 100
    directory = group_log_dir("g")
    assert _versions(store, directory) == (list(range(120)), [100])
    later = _ms() + KEEP_MS + 1_000  # every file is older than the log retention by then

    dry = prune_logs(store, keep_ms=KEEP_MS, now_ms=later, dry_run=True)
    [entry] = [e for e in dry.logs if e.kind == "group"]
    assert (entry.name, entry.kept_from, entry.checkpoint) == ("g", 100, 119)
    assert sorted(entry.files) == [f"{directory}/{v:020d}.json" for v in range(100)]
    assert _versions(store, directory) == (list(range(120)), [100])  # nothing changed

    done = prune_logs(store, keep_ms=KEEP_MS, now_ms=later)
    [pruned] = [e for e in done.logs if e.kind == "group"]
    assert sorted(pruned.files) == sorted(entry.files)  # what the dry run said
    assert pruned.bytes == entry.bytes > 0
    assert _versions(store, directory) == (list(range(100, 120)), [100, 119])
    # A new reader replays to the same committed offsets.
    assert Group(store, "g").committed(TP) == OffsetAndMetadata(119)
    # Once the new checkpoint is older than the retention, everything below it goes.
    again = prune_logs(store, keep_ms=KEEP_MS, now_ms=_ms() + KEEP_MS + 1_000)
    assert [e.kept_from for e in again.logs if e.kind == "group"] == [119]
    assert _versions(store, directory) == ([119], [119])
    # Writers carry on after the newest version.
    _commit_offsets(store, 120, 121)
    assert _versions(store, directory) == ([119, 120], [119])
    assert Group(store, "g").committed(TP) == OffsetAndMetadata(120)
    assert Group(store, "g").state().version == 120
    # Nothing more to do now: no file is older than the retention by the real clock.
    assert prune_logs(store, keep_ms=KEEP_MS).logs == []


def _age(directory: Path, versions: range, days: float) -> None:
    """Make the log files of ``versions`` look ``days`` old to the storage's clock."""
    when = time.time() - days * 86_400
    for path in directory.iterdir():
        parsed = parse_log_file_name(path.name)
        if parsed is not None and parsed[0] in versions:
            os.utime(path, (when, when))


def test_readers_within_the_retention_keep_reading(local_store: Any) -> None:
    url, _ = local_store
    store = kstore.Store(url)
    store.create_topic("t")
    _commit_offsets(store, 0, 50)
    stale = Group(store, "g")
    assert stale.committed(TP) == OffsetAndMetadata(49)  # holds version 49
    _commit_offsets(store, 50, 106)
    recent = Group(store, "g")
    assert recent.committed(TP) == OffsetAndMetadata(105)  # holds version 105
    _commit_offsets(store, 106, 120)
    # Versions up to 100 (with the checkpoint) were written 3 days ago, the rest just now.
    _age(Path(store.storage.root) / group_log_dir("g"), range(101), 3)
    report = prune_logs(store, keep_ms=KEEP_MS)
    assert [(e.kept_from, e.checkpoint) for e in report.logs if e.kind == "group"] == [(100, None)]
    assert _versions(store, group_log_dir("g"))[0] == list(range(100, 120))
    # A reader whose state is younger than the retention follows the log by name.
    assert recent.committed(TP) == OffsetAndMetadata(119)
    # One that has not confirmed its state for a day reloads from a checkpoint instead of
    # taking the first deleted version for the end of the log, and writes after the newest.
    assert stale._state is not None
    stale._state.confirmed_at = clock.monotonic() - STALE_STATE_S - 1
    assert stale.committed(TP) == OffsetAndMetadata(119)
    assert stale._state is not None
    stale._state.confirmed_at = clock.monotonic() - STALE_STATE_S - 1
    stale.commit_offsets({TP: OffsetAndMetadata(500)}, member_id=None, generation=-1)
    assert _versions(store, group_log_dir("g"))[0] == list(range(100, 121))
    assert Group(store, "g").committed(TP) == OffsetAndMetadata(500)


def test_producer_and_topic_metadata_logs(memory_store: Any) -> None:
    store = kstore.Store(*memory_store)
    store.create_topic("t")
    for i in range(22):  # the topic metadata log: versions 0..22, a checkpoint at 20
        store.alter_topic_config("t", {"retention.ms": str(60_000 + i)})
    producer = Producer(store, transactional_id="tx")
    for i in range(20):  # about three producer-log commits each: a checkpoint at 50
        producer.begin_transaction()
        producer.send("t", value=b"%d" % i)
        producer.commit_transaction()
    producer.close()
    end = store.partition("t", 0).state().end_offset
    commits, checkpoints = _versions(store, producer_log_dir("tx"))
    assert checkpoints == [50]
    report = prune_logs(store, keep_ms=KEEP_MS, now_ms=_ms() + KEEP_MS + 1_000)
    kept = {(e.kind, e.name): (e.kept_from, e.checkpoint) for e in report.logs}
    assert kept[("topic", "t")] == (20, 22)
    assert kept[("producer", producer_log_dir("tx").split("/")[1])] == (50, commits[-1])
    assert _versions(store, topic_log_dir("t")) == ([20, 21, 22], [20, 22])
    assert _versions(store, producer_log_dir("tx")) == (commits[50:], [50, commits[-1]])
    # Replayed from what is left: the same config, the same producer epoch and versions.
    fresh = kstore.Store(store.url, store.storage.storage_options)
    assert fresh.topic("t").config["retention.ms"] == 60021
    with Producer(fresh, transactional_id="tx") as successor:
        assert successor.epoch == 1
        successor.begin_transaction()
        successor.send("t", value=b"after")
        successor.commit_transaction()
    state = fresh.partition("t", 0).state()
    assert state.end_offset == state.last_stable_offset > end


def test_retention_below_two_days_is_refused(memory_store: Any) -> None:
    store = kstore.Store(*memory_store)
    with pytest.raises(InvalidConfigurationError, match="log_retention_ms 3600000 is below"):
        prune_logs(store, keep_ms=3_600_000)
    with pytest.raises(InvalidConfigurationError, match="now_ms"):
        prune_logs(store, now_ms=-5)


def test_a_moto_store(moto_store: Any) -> None:
    url, options = moto_store
    store = kstore.Store(url, options)
    store.create_topic("t")
    for i in range(20):  # the topic metadata log: versions 0..20, a checkpoint at 20
        store.alter_topic_config("t", {"retention.ms": str(60_000 + i)})
    # The storage's clock (a probe): nothing is old yet.
    assert prune_logs(store, keep_ms=KEEP_MS).logs == []
    report = prune_logs(store, keep_ms=KEEP_MS, now_ms=_ms() + KEEP_MS + 2_000)
    assert [(e.kind, e.kept_from, len(e.files), e.checkpoint) for e in report.logs] == [
        ("topic", 20, 20, None)
    ]
    assert _versions(store, topic_log_dir("t")) == ([20], [20])
    fresh = kstore.Store(url, options)
    assert fresh.topic("t").config["retention.ms"] == 60_019
    assert all(not i.name.startswith(".probe-") for i in store.storage.list_dir("topics"))


def test_the_command(local_store: Any) -> None:
    url, _ = local_store
    store = kstore.Store(url)
    store.create_topic("t")
    _commit_offsets(store, 0, 101)
    _age(Path(store.storage.root) / group_log_dir("g"), range(102), 3)
    runner = CliRunner()
    dry = runner.invoke(app, ["prune-logs", "--dry-run", "--log-retention", "2d", "--store", url])
    assert dry.exit_code == 0, dry.output
    assert dry.stdout.startswith(
        "log pruning (dry run): 2 group, producer and topic metadata log(s); would delete 100 "
        "file(s), "
    )
    assert dry.stdout.endswith(" bytes; would write 0 checkpoint(s)\n")
    assert len(dry.stdout.splitlines()) == 1
    done = runner.invoke(app, ["prune-logs", "--log-retention", "2d", "-o", "json", "--store", url])
    assert done.exit_code == 0, done.output
    body = json.loads(done.stdout)
    assert (body["filesDeleted"], body["dryRun"]) == (100, False)
    assert _versions(store, group_log_dir("g")) == ([100], [100])
    short = runner.invoke(app, ["prune-logs", "--log-retention", "1h", "--store", url])
    assert short.exit_code == 2
    assert "--log-retention 1h is below" in short.stderr
