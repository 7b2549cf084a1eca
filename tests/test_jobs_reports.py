"""The maintenance jobs' reports say why nothing was done, and a dry run states exactly what a
run would remove (records, bytes, segments), in the library's summary, the CLI's table and its
JSON alike."""

from __future__ import annotations

import os

import pytest
from kstore.compaction import merge_segments, run_compaction
from kstore.retention import run_retention

from tests.test_cli import Cli
from tests.test_jobs_support import Target, append, now_ms, open_store, table

HOUR = 3_600_000
COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("KSTORE_"):
            monkeypatch.delenv(name)


def reasons(summary: object) -> dict[tuple[str, int], str]:
    return {(p.topic, p.partition): p.reason for p in summary.partitions}  # type: ignore[attr-defined]


def test_compact_on_a_delete_topic_says_why(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("events", 1)
    append(store.partition("events", 0), [b"k"], [b"v"], now_ms())
    note = "topic events: cleanup.policy=delete, nothing to compact"
    summary = run_compaction(None, *local_store, ["events"], verbose=False)
    assert summary.partitions == []
    assert summary.notes == [note]
    assert note in summary.format()
    cli = Cli("job", *local_store)
    assert note in cli.run("compact", "events", "--no-spark").stdout
    assert cli.json("compact", "events", "--no-spark")["notes"] == [note]


def test_an_empty_partition_is_skipped_as_empty(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("quiet", 2, {**COMPACT, "cleanup.policy": "compact,delete"})
    append(store.partition("quiet", 0), [b"k"], [b"v"], now_ms())
    for job in (run_compaction, merge_segments, run_retention):
        assert reasons(job(None, *local_store, verbose=False))[("quiet", 1)] == "empty"
    listed = Cli("job", *local_store).json("compact", "--no-spark")
    assert [p["reason"] for p in listed["partitions"] if p["partition"] == 1] == ["empty"]


def test_an_open_transaction_is_named_by_its_offset(local_store: Target) -> None:
    store = open_store(local_store)
    config = {**COMPACT, "cleanup.policy": "compact,delete", "retention.ms": HOUR}
    store.create_topic("events", 1, config)
    part = store.partition("events", 0)
    old = now_ms() - 2 * HOUR
    append(part, [b"a"], [b"1"], old)
    part.commit_segments([part.write_segment(table([b"t"], [b"open"], old))], transaction="p:0")
    append(part, [b"b"], [b"2"], old)
    assert run_retention(None, *local_store, verbose=False).count("committed") == 1
    assert part.state().log_start_offset == 1
    # Offset 1 is the open transaction's first record: everything from there waits for it.
    key = ("events", 0)
    assert reasons(run_retention(None, *local_store, verbose=False))[key] == (
        "open transaction at offset 1: segments past retention.ms wait for it"
    )
    assert reasons(run_compaction(None, *local_store, verbose=False))[key] == (
        "no cleanable segment: open transaction at offset 1"
    )
    assert reasons(merge_segments(None, *local_store, verbose=False))[key] == (
        "open transaction at offset 1"
    )


def test_a_compaction_dry_run_states_what_the_run_removes(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("users", 1, COMPACT)
    part = store.partition("users", 0)
    ts = now_ms() - HOUR
    append(part, [b"a", b"b"], [b"1", b"2"], ts)
    append(part, [b"a", b"c"], [b"3", b"4"], ts)
    append(part, [b"a"], [b"5"], ts)
    dry = run_compaction(None, *local_store, dry_run=True, verbose=False)
    (row,) = dry.partitions
    assert row.outcome == "dry-run"
    assert (dry.records_dropped, dry.segments_removed, dry.segments_written) == (2, 3, 1)
    assert "would drop 2 of 5 record(s), rewriting 3 segment(s)" in row.reason
    assert dry.bytes_after < dry.bytes_before
    assert part.state().cleaned_offset == 0  # nothing changed

    cli = Cli("job", *local_store)
    listed = cli.json("compact", "--no-spark", "--dry-run")
    assert (listed["committed"], listed["dry_run_changes"], listed["records_dropped"]) == (0, 1, 2)
    shown = cli.run("compact", "--no-spark", "--dry-run").stdout
    assert "WOULD-CHANGE" in shown
    assert "COMMITTED" not in shown  # the table counts what JSON counts

    done = run_compaction(None, *local_store, verbose=False)
    assert (done.records_dropped, done.segments_removed, done.segments_written) == (2, 3, 1)


def test_merge_and_retention_dry_runs_state_what_the_runs_remove(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("events", 1, {"retention.ms": HOUR})
    part = store.partition("events", 0)
    old, new = now_ms() - 2 * HOUR, now_ms()
    for ts in (old, old, old, new, new):
        append(part, [b"k"], [b"v"], ts)
    dry = merge_segments(None, *local_store, dry_run=True, verbose=False)
    listed = Cli("job", *local_store).json("merge", "--no-spark", "--dry-run")
    assert (listed["segments_removed"], listed["segments_written"]) == (5, 2)
    done = merge_segments(None, *local_store, verbose=False)
    assert (dry.segments_removed, dry.segments_written, dry.records_dropped) == (5, 2, 0)
    assert (done.segments_removed, done.segments_written, done.records_dropped) == (5, 2, 0)
    assert "would merge 5 segments" in dry.partitions[0].reason

    size = part.state().segments[0].size_bytes
    dry = run_retention(None, *local_store, dry_run=True, verbose=False)
    assert (dry.segments_removed, dry.records_dropped) == (1, 3)
    assert dry.bytes_before - dry.bytes_after == size
    assert f"would remove 1 segment(s), 3 record(s), {size} bytes" in dry.partitions[0].reason
    listed = Cli("job", *local_store).json("retain", "--no-spark", "--dry-run")
    assert (listed["segments_removed"], listed["records_dropped"]) == (1, 3)
    assert listed["bytes_before"] - listed["bytes_after"] == size
    done = run_retention(None, *local_store, verbose=False)
    assert (done.segments_removed, done.records_dropped) == (1, 3)
