"""``kstore compact|retain|vacuum|merge`` through typer's CliRunner: each verb in this process
(``--no-spark``) on local disk (retention on SeaweedFS too) with its effects checked through the
library, one verb on the shared local Spark session, ``--print-submit``, JSON output and the
errors."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kstore.cli import jobs as cli_jobs
from kstore.cli.app import app
from kstore.compaction.jobs import parse_storage_options
from typer.testing import CliRunner

from kstore import Store
from kstore.layout import topic_data_dir
from kstore.producer import Producer
from tests.test_cli import Cli, option_args
from tests.test_jobs_support import (
    Target,
    append,
    latest_per_key,
    now_ms,
    open_store,
    rows,
    segment_files,
)

HOUR = 3_600_000
DAY = 24 * HOUR
COMPACT = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0}
runner = CliRunner()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("KSTORE_"):
            monkeypatch.delenv(name)


def cli_for(target: Target) -> Cli:
    return Cli("job", *target)


# How the tests write records: "segments" appends a segment file per partition (what the
# maintenance jobs and the Spark sink write); "objects" sends them with a producer, whose
# flush is one data object holding every partition's records as a range (layout 3).
WRITES = ["segments", "objects"]


def write(
    store: Store,
    topic: str,
    records: dict[int, list[tuple[bytes, bytes]]],
    ts_ms: int,
    how: str,
) -> None:
    """Write one batch of (key, value) records to each given partition."""
    if how == "segments":
        for p, pairs in records.items():
            append(store.partition(topic, p), [k for k, _ in pairs], [v for _, v in pairs], ts_ms)
        return
    assert how == "objects", how
    with Producer(store, linger_ms=60_000) as producer:
        for p, pairs in records.items():
            for key, value in pairs:
                producer.send(topic, value=value, key=key, partition=p, timestamp_ms=ts_ms)
        producer.flush()
    # The premise: one flush, one data object holding a range of each partition written.
    newest = {store.partition(topic, p).state().segments[-1] for p in records}
    assert all(seg.byte_range is not None for seg in newest), newest
    assert len({seg.path for seg in newest}) == 1, newest


def stored_files(store: Store, topic: str) -> set[str]:
    """What storage holds of a one-partition topic, as manifest paths: its segment files
    and its topic's data objects."""
    part = store.partition(topic, 0)
    objects = f"{topic_data_dir(topic, store.topic(topic).topic_id)}/_data"
    return {f"segments/{name}" for name in segment_files(store, part)} | {
        f"_data/{info.name}" for info in store.storage.list_dir(objects)
    }


def old_and_new_segments(store: Store, topic: str, partitions: int, how: str) -> None:
    """Per partition: two expired segments (3 records), then a young one (2 records)."""
    now = now_ms()
    every = range(partitions)
    write(store, topic, {p: [(b"a", b"1"), (b"b", b"2")] for p in every}, now - 3 * HOUR, how)
    write(store, topic, {p: [(b"c", b"3")] for p in every}, now - 2 * HOUR, how)
    write(store, topic, {p: [(b"d", b"4"), (b"e", b"5")] for p in every}, now, how)


# -- each verb in this process ------------------------------------------------------------------


@pytest.mark.parametrize("how", WRITES)
@pytest.mark.parametrize(
    "target", ["local_store", pytest.param("seaweed_store", marks=pytest.mark.s3)]
)
def test_retain_removes_old_segments_and_advances_the_log_start(
    target: str, how: str, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    cli = cli_for(where)
    store = open_store(where)
    store.create_topic("events", 2, {"retention.ms": HOUR})
    store.create_topic("kept", 1)  # default retention (7 days): nothing due
    old_and_new_segments(store, "events", 2, how)
    old_and_new_segments(store, "kept", 1, how)

    dry = cli.json("retain", "--no-spark", "--dry-run")
    assert dry["ok"] is True
    assert dry["dry_run"] is True
    assert dry["dry_run_changes"] == 2
    assert store.partition("events", 0).state().log_start_offset == 0  # nothing changed

    result = cli.run("retain", "--no-spark")
    assert "retention of" in result.stdout
    assert "SEGMENTS-REMOVED" in result.stdout
    assert "TOTAL" in result.stdout
    assert "1/3" in result.stderr or "3/3" in result.stderr  # progress lines, off a terminal
    for p in range(2):
        part = store.partition("events", p)
        assert part.state().log_start_offset == 3
        assert rows(part) == [(3, b"d", b"4"), (4, b"e", b"5")]
    assert store.partition("kept", 0).state().log_start_offset == 0

    again = cli.json("retain", "events", "--no-spark")
    assert again["partitions_scanned"] == 2
    assert again["committed"] == 0
    assert again["segments_removed"] == 0


@pytest.mark.parametrize("how", WRITES)
def test_retain_json_reports_what_it_removed(local_store: Target, how: str) -> None:
    cli = cli_for(local_store)
    store = open_store(local_store)
    store.create_topic("events", 1, {"retention.ms": HOUR})
    old_and_new_segments(store, "events", 1, how)
    summary = cli.json("retain", "events", "--no-spark")
    assert summary["operation"] == "retention"
    assert summary["committed"] == 1
    assert summary["segments_removed"] == 2
    assert summary["records_dropped"] == 3
    assert summary["bytes_before"] > summary["bytes_after"] > 0
    (row,) = summary["partitions"]
    assert (row["topic"], row["partition"], row["outcome"]) == ("events", 0, "committed")
    assert row["log_start_offset"] == 3


@pytest.mark.parametrize("how", WRITES)
def test_compact_leaves_one_record_per_key(local_store: Target, how: str) -> None:
    cli = cli_for(local_store)
    store = open_store(local_store)
    store.create_topic("users", 1, COMPACT)
    part = store.partition("users", 0)
    ts = now_ms() - HOUR
    for s in range(4):
        write(
            store, "users", {0: [(b"k%d" % (i + 1), b"v%d-%d" % (s, i)) for i in range(3)]}, ts, how
        )
    before = rows(part)
    summary = cli.json("compact", "--no-spark")
    assert summary["committed"] == 1
    assert summary["records_dropped"] == 9
    after = rows(part)
    assert after == latest_per_key(before)
    assert [k for _, k, _ in after] == [b"k1", b"k2", b"k3"]
    assert [v for _, _, v in after] == [b"v3-0", b"v3-1", b"v3-2"]


@pytest.mark.parametrize("how", WRITES)
def test_merge_reduces_the_segment_count(local_store: Target, how: str) -> None:
    cli = cli_for(local_store)
    store = open_store(local_store)
    store.create_topic("clicks", 1)
    part = store.partition("clicks", 0)
    for i in range(6):
        write(store, "clicks", {0: [(b"k%d" % i, b"v%d" % i)]}, now_ms(), how)
    before = rows(part)
    assert len(part.state().segments) == 6
    dry = cli.json("merge", "clicks", "--no-spark", "--dry-run")
    assert dry["dry_run_changes"] == 1
    assert len(part.state().segments) == 6
    result = cli.run("merge", "clicks", "--no-spark")
    assert "merge of" in result.stdout
    assert len(part.state().segments) == 1
    assert rows(part) == before


@pytest.mark.parametrize("how", WRITES)
def test_vacuum_deletes_files_past_the_grace_period_only(local_store: Target, how: str) -> None:
    cli = cli_for(local_store)
    store = open_store(local_store)
    # A producer's flush is written as a data object, which vacuum deletes, not carried by
    # its commit (PROTOCOL.md 11.8).
    objects = {"commit.inline.bytes": 0}
    store.create_topic("now", 1, {**COMPACT, **objects, "file.delete.delay.ms": 10_000})
    store.create_topic("later", 1, {**COMPACT, **objects, "file.delete.delay.ms": DAY})
    for name in ("now", "later"):
        write(store, name, {0: [(b"a", b"1"), (b"a", b"2")]}, now_ms(), how)
        write(store, name, {0: [(b"b", b"3"), (b"b", b"4")]}, now_ms(), how)
    written = {n: stored_files(store, n) for n in ("now", "later")}
    kind = "segments/" if how == "segments" else "_data/"  # a producer's flush: a data object
    assert all(len(f) == 2 and all(x.startswith(kind) for x in f) for f in written.values())
    cli.run("compact", "--no-spark")
    # The delay counts from when the storage recorded the removing commit: make that a minute
    # ago for "now", as if the compaction had run then. The commit is in the topic log.
    now_log = store.partition("now", 0).log.directory
    assert store.topic("now").layout == 3
    assert now_log == store.topic_logs("now")[0].directory
    log_dir = Path(store.storage.full_path(now_log))
    for commit in log_dir.iterdir():
        stamp = commit.stat().st_mtime - 60
        os.utime(commit, (stamp, stamp))
    files = {n: stored_files(store, n) for n in ("now", "later")}
    assert all(len(f) == 3 for f in files.values())  # two removed, one new
    for name in files:  # the two removed are what was written; the new one a segment file
        assert files[name] > written[name]
        assert store.partition(name, 0).state().segments[0].path.startswith("segments/")

    dry = cli.run("vacuum", "--no-spark", "--dry-run", "--orphan-age", "2h")
    assert "Would delete:" in dry.stdout
    assert {n: stored_files(store, n) for n in files} == files
    listed = cli.json("vacuum", "--no-spark", "--dry-run")
    assert listed["files_deleted"] == 2
    listed_files = [f for p in listed["partitions"] for f in p["files"]]
    assert len(listed_files) == 2
    assert all(f"/{kind}" in f for f in listed_files), listed_files

    done = cli.json("vacuum", "--no-spark", "--orphan-age", "1h", "--log-retention", "30d")
    assert done["files_deleted"] == 2
    assert done["dry_run"] is False
    now_part = store.partition("now", 0)
    assert stored_files(store, "now") == {s.path for s in now_part.state().segments}
    assert stored_files(store, "later") == files["later"]  # grace period
    assert rows(now_part) == [(1, b"a", b"2"), (3, b"b", b"4")]


def test_a_failed_partition_exits_1_with_the_errors_listed(
    local_store: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kstore.retention as retention

    cli = cli_for(local_store)
    store = open_store(local_store)
    store.create_topic("events", 2, {"retention.ms": HOUR})

    def broken(*args: Any) -> Any:
        raise OSError("disk on fire")

    monkeypatch.setattr(retention, "retention_partition", broken)
    result = cli.run("retain", "--no-spark", "-o", "json", code=1)
    summary = json.loads(result.stdout)
    assert summary["ok"] is False
    assert summary["errors"] == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: events-0: OSError: disk on fire",
        "error: events-1: OSError: disk on fire",
    ]


# -- on the local Spark ---------------------------------------------------------------------------


@pytest.mark.spark
def test_retain_on_local_spark(
    spark: Any, local_store: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli = cli_for(local_store)
    store = open_store(local_store)
    store.create_topic("events", 2, {"retention.ms": HOUR})
    old_and_new_segments(store, "events", 2, "segments")
    result = cli.run("retain", "--spark", "local[2]", "--tasks", "2", "--output", "json")
    summary = json.loads(result.stdout)
    assert summary["tasks"] == 2
    assert summary["committed"] == 2
    # Off a terminal: the plan, then the progress once, at its end (it stayed at 0/2).
    assert result.stderr.splitlines() == [
        "[retention] 2 partition(s) of 1 topic(s), on Spark",
        "[retention] 2/2 tasks done",
    ]
    # On a terminal: a live line, last drawn at 2/2 (it was left at 0/? or 0/2).
    monkeypatch.setattr(
        cli_jobs, "_JobProgress", functools.partial(cli_jobs._JobProgress, interactive=True)
    )
    result = cli.run("retain", "--spark", "local[2]", "--tasks", "2")
    assert "retention of " in result.stdout
    assert "2/2" in _last_frame(result.stderr)
    assert "tasks done" in _last_frame(result.stderr)
    for p in range(2):
        assert store.partition("events", p).state().log_start_offset == 3
    # The command joined the running session and left it running.
    assert spark.range(3).count() == 3


# -- spark-submit -----------------------------------------------------------------------------------

SECRET = "s3cr3t-value-XYZ"
TOKEN = "token-value-123456"


def test_print_submit_prints_the_job_command_line_without_secrets(tmp_path: Path) -> None:
    from kstore.retention import SUBMIT_SCRIPT

    options = {
        "key": "AKIAEXAMPLE",
        "secret": SECRET,
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:8333", "aws_session_token": TOKEN},
        "use_listings_cache": False,
    }
    result = runner.invoke(
        app,
        [
            "vacuum",
            "events",
            "--print-submit",
            "--spark",
            "yarn",
            "--dry-run",
            "--tasks",
            "8",
            "--orphan-age",
            "2h",
            "--store",
            "s3://bucket/ks",
            *option_args(options),
        ],
    )
    assert result.exit_code == 0, result.stderr
    command = result.stdout.strip()
    for secret in ("AKIAEXAMPLE", SECRET, TOKEN):
        assert secret not in result.stdout
        assert secret not in result.stderr
    assert command.startswith("spark-submit --master yarn ")
    assert SUBMIT_SCRIPT in command
    assert "--store s3://bucket/ks" in command
    assert "KSTORE_OPTION_CLIENT_KWARGS__AWS_SESSION_TOKEN" in result.stderr

    # The shell, given the secrets in the environment, hands the job exactly these arguments.
    fake = tmp_path / "spark-submit"
    fake.write_text(
        f'#!/bin/sh\nexec {sys.executable} -c "import json,sys; print(json.dumps(sys.argv[1:]))" "$@"\n'
    )
    fake.chmod(0o755)
    env = {
        "PATH": f"{tmp_path}:{os.environ['PATH']}",
        "KSTORE_OPTION_KEY": "AKIAEXAMPLE",
        "KSTORE_OPTION_SECRET": SECRET,
        "KSTORE_OPTION_CLIENT_KWARGS__AWS_SESSION_TOKEN": TOKEN,
    }
    shell = subprocess.run(
        ["sh", "-c", command], env=env, capture_output=True, text=True, check=True
    )
    argv: list[str] = json.loads(shell.stdout)
    assert argv[:3] == ["--master", "yarn", SUBMIT_SCRIPT]
    rest = argv[3:]
    assert rest[-1] == "vacuum"
    pairs = [rest[i + 1] for i, word in enumerate(rest) if word == "--option"]
    assert parse_storage_options(pairs) == options
    assert rest[rest.index("--topic") + 1] == "events"
    assert rest[rest.index("--orphan-age-ms") + 1] == str(2 * HOUR)
    assert rest[rest.index("--tasks") + 1] == "8"
    assert "--dry-run" in rest

    # The job's own parser accepts them.
    from kstore.compaction.jobs import base_parser

    parser = base_parser("t", "t")
    parser.add_argument("command")
    parser.add_argument("--orphan-age-ms", type=int)
    parsed = parser.parse_args(rest)
    assert (parsed.store, parsed.topic, parsed.command) == ("s3://bucket/ks", ["events"], "vacuum")


@pytest.mark.parametrize(
    ("verb", "command"),
    [("compact", "compact"), ("merge", "merge"), ("retain", "retention"), ("vacuum", "vacuum")],
)
def test_print_submit_json_for_each_verb(local_store: Target, verb: str, command: str) -> None:
    cli = cli_for(local_store)
    shown = cli.json(verb, "--print-submit")
    assert shown["command"].startswith("spark-submit ")
    assert shown["command"].endswith(f" {command}")
    assert f"--store {local_store[0]}" in shown["command"]
    assert shown["environment"] == []


def test_print_submit_hides_credentials_in_the_url() -> None:
    result = runner.invoke(
        app, ["retain", "--print-submit", "--store", "s3://AKIAEXAMPLE:" + SECRET + "@bucket/ks"]
    )
    assert result.exit_code == 0, result.stderr
    assert SECRET not in result.stdout
    assert "AKIAEXAMPLE" not in result.stdout
    assert '--store "$KSTORE_STORE"' in result.stdout


# -- errors and help ------------------------------------------------------------------------------


def test_errors_are_one_line(local_store: Target, memory_store: Target) -> None:
    cli = cli_for(local_store)
    open_store(local_store).create_topic("events", 1)
    assert cli.error("retain", "missing", "--no-spark") == (
        f"error: topic 'missing' does not exist in '{local_store[0]}'"
    )
    assert "--orphan-age 1m is below the minimum of 10m" in cli.error(
        "vacuum", "--no-spark", "--orphan-age", "1m", code=2
    )
    assert "--log-retention 1h is below" in cli.error("vacuum", "--log-retention", "1h", code=2)
    assert "duration" in cli.error("vacuum", "--no-spark", "--orphan-age", "soon", code=2)
    assert "exclude" in cli.error("compact", "--no-spark", "--print-submit", code=2)
    assert "--print-submit" in cli.error("merge", "--spark", "yarn", code=2)
    assert "--tasks" in cli.error("merge", "--no-spark", "--tasks", "0", code=2)
    assert "--no-spark" in cli_for(memory_store).error("merge", code=2)

    missing = Cli("job", local_store[0] + "-missing", {})
    assert "no kstore store" in missing.error("compact", "--no-spark")
    result = runner.invoke(app, ["merge", "--no-spark"])
    assert result.exit_code == 2
    assert "no store given" in result.stderr


@pytest.mark.parametrize("verb", ["compact", "merge", "retain", "vacuum"])
def test_help_has_examples(verb: str) -> None:
    result = runner.invoke(app, [verb, "--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.stdout
    assert f"kstore {verb} " in result.stdout
    for flag in ("--no-spark", "--print-submit", "--dry-run", "--spark"):
        assert flag in result.stdout
    # The optional topics, bracketed once (it read [[TOPIC]...]...).
    usage = result.stdout.strip().splitlines()[0].split()
    assert usage == ["Usage:", "kstore", verb, "[OPTIONS]", "[TOPIC]..."]


def test_progress_bar_on_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    progress = cli_jobs._JobProgress("merge", interactive=True)
    with progress:
        progress.update("[merge] 3 partition(s) of 2 topic(s), in this process")
        assert progress._bar.tasks[0].total == 3
        progress.update("[merge] 2/3 t-1: committed")
        assert progress._bar.tasks[0].completed == 2
        progress.update("[merge] 1/4 tasks done")
        assert progress._bar.tasks[0].total == 4
        print("a summary the job prints")  # dropped: stdout is ours
    assert "a summary" not in capsys.readouterr().out


SPARK_PROGRESS = [
    "[merge] 4 partition(s) of 1 topic(s), on Spark",
    "[merge] 0/4 tasks done",
    "[merge] 3/4 tasks done",
    "[merge] 4/4 tasks done",
]


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _last_frame(written: str) -> str:
    """What a terminal shows last of a live line: the text after its last carriage return or
    line erase, without colours and cursor codes (a pty turns a newline into CR LF)."""
    text = _ANSI.sub("", written.replace("\r\n", "\n").replace("\x1b[2K", "\r"))
    return text.rstrip("\n").rsplit("\r", 1)[-1]


def test_progress_on_a_terminal_is_one_live_line_that_ends_at_n_of_n(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with cli_jobs._JobProgress("merge", interactive=True) as progress:
        for message in SPARK_PROGRESS:
            progress.update(message)
    written = capsys.readouterr().err
    assert "\r" in written  # redrawn in place
    assert "4/4" in _last_frame(written)
    assert "tasks done" in _last_frame(written)


def test_progress_off_a_terminal_is_the_plan_and_one_final_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with cli_jobs._JobProgress("merge", interactive=False) as progress:
        for message in SPARK_PROGRESS:
            progress.update(message)
        assert capsys.readouterr().err == SPARK_PROGRESS[0] + "\n"  # nothing while it runs
    assert capsys.readouterr().err == SPARK_PROGRESS[-1] + "\n"


def _small_store(root: Path, partitions: int) -> None:
    store = Store(str(root))
    store.create_topic("t", partitions)
    for _ in range(2):  # two small segments per partition: something to merge
        with Producer(store) as producer:
            for p in range(partitions):
                producer.send("t", b"v", key=b"k", partition=p)


def _merge(root: Path, *flags: str) -> list[str]:
    """The installed command line of kstore merge on the store at ``root``."""
    return [sys.executable, "-m", "kstore.cli.app", "merge", *flags, "--store", str(root)]


def _own_jvm_env(**extra: str) -> dict[str, str]:
    """The environment of a job that starts its own JVM (not this process's Spark gateway)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    return {**env, **extra}


def test_progress_in_a_real_terminal_ends_at_n_of_n(tmp_path: Path) -> None:
    """kstore merge with its stderr on a pseudo-terminal: a live line, last drawn at 3/3."""
    import pty

    _small_store(tmp_path / "store", 3)
    main, secondary = pty.openpty()
    with subprocess.Popen(
        _merge(tmp_path / "store", "--no-spark"),
        stdout=subprocess.PIPE,
        stderr=secondary,
        env={**os.environ, "COLUMNS": "120"},
    ) as proc:  # fmt: skip
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the terminal's other end closed (Linux)
                break
            if not chunk:
                break
            chunks.append(chunk)
        stdout = proc.communicate()[0].decode()
    os.close(main)
    assert proc.returncode == 0
    written = b"".join(chunks).decode()
    assert "\r" in written
    assert "3/3" in _last_frame(written)
    assert "merge of " in stdout
    assert "committed 3" in stdout


_LOG4J_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (TRACE|DEBUG|INFO|WARN|ERROR) ")


@pytest.mark.spark
def test_a_spark_job_prints_no_spark_logs(tmp_path: Path) -> None:
    """The installed command on a local Spark it starts: stderr holds the job's plan and its
    final progress, none of Spark's start-up warnings; stdout the whole summary."""
    _small_store(tmp_path / "store", 2)
    done = subprocess.run(
        _merge(tmp_path / "store", "--spark", "local[1]"),
        capture_output=True,
        check=False,
        env=_own_jvm_env(),
    )
    # Bytes, decoded here: text mode would turn a carriage return into a newline.
    stdout, stderr = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, stderr
    lines = stderr.splitlines()
    assert not [line for line in lines if _LOG4J_LINE.match(line)], stderr
    assert not [line for line in lines if "log4j" in line or "log level" in line], stderr
    assert "\r" not in stderr  # nor Spark's console bar ([Stage 0:>   (0 + 1) / 2])
    assert "[Stage" not in stderr
    # Nor the JVM's own notice of the incubating module Spark starts it with: the job alone.
    assert lines == [
        "[merge] 2 partition(s) of 1 topic(s), on Spark",
        "[merge] 2/2 tasks done",
    ], stderr
    assert "merge of " in stdout
    assert "2 partition(s) scanned, committed 2" in stdout
    assert stdout.splitlines()[-1].split()[:3] == ["t", "2", "2"]


@pytest.mark.spark
def test_a_jvm_that_cannot_start_says_why(tmp_path: Path) -> None:
    """The JVM's stderr goes through kstore's filter: what it says before it fails still shows,
    ahead of the error line."""
    _small_store(tmp_path / "store", 1)
    done = subprocess.run(
        _merge(tmp_path / "store", "--spark", "local[1]"),
        capture_output=True,
        text=True,
        check=False,
        env=_own_jvm_env(JAVA_HOME=str(tmp_path / "no-java")),
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert any(f"{tmp_path / 'no-java'}/bin/java" in line for line in lines[:-1]), done.stderr
    assert lines[-1].startswith("error: ")
    assert "JAVA_GATEWAY_EXITED" in lines[-1]
