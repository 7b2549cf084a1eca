"""Bad arguments to every CLI command (invariant 8): malicious names, wrong types, out-of-range
numbers, unknown options, conflicting flags. Each must exit 1 (an error) or 2 (a usage error)
with a message naming what is wrong, show no traceback, and leave the store byte for byte as
it was. Most run through typer's CliRunner; a few through the installed `kstore` command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kstore.cli.app import app
from typer.testing import CliRunner

from kstore import Producer, Store
from kstore.groups import Group
from kstore.records import OffsetAndMetadata, TopicPartition
from tests.badinput import local_snapshot

runner = CliRunner()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with topic "t" (2 partitions, 4 records) and group "g" (an offset on t-0)."""
    root = tmp_path_factory.mktemp("cli-bad") / "store"
    store = Store(str(root))
    store.create_topic("t", 2)
    with Producer(store) as p:
        for i in range(4):
            p.send("t", b"v%d" % i, partition=i % 2)
    Group(store, "g").commit_offsets(
        {TopicPartition("t", 0): OffsetAndMetadata(1)}, member_id=None, generation=-1
    )
    return root


def flat(text: str) -> str:
    for char in "│╭╮╰╯─":
        text = text.replace(char, " ")
    return " ".join(text.split())


JOB_VERBS = {"retain", "vacuum", "compact", "merge"}

# (arguments, stdin, exit code, fragment of the message)
CASES: list[tuple[list[str], str | None, int, str]] = [
    # topics
    (["topics", "create", "../x"], None, 1, "invalid topic name '../x'"),
    (["topics", "create", "/etc"], None, 1, "invalid topic name '/etc'"),
    (["topics", "create", "a\x00b"], None, 1, "invalid topic name 'a\\x00b'"),
    (["topics", "create", "x" * 300], None, 1, "is 300 characters long; the limit is 249"),
    (["topics", "create", "t\u202e"], None, 1, "illegal characters ('\\u202e')"),
    (["topics", "create", "a\u200bb"], None, 1, "illegal characters ('\\u200b')"),
    (["topics", "create", "cafe\u0301"], None, 1, "illegal characters"),
    (["topics", "create", "a\uff0eb"], None, 1, "illegal characters ('\\uff0e')"),
    (["topics", "create", "t\u0435st"], None, 1, "illegal characters"),
    (["topics", "create", "x", "-p", "0"], None, 2, "'--partitions'"),
    (["topics", "create", "x", "-p", "abc"], None, 2, "valid integer"),
    (["topics", "create", "x", "-p", "100001"], None, 1, "partition count 100001 is out of range"),
    (
        ["topics", "create", "x", "-c", "retention.ms=abc"],
        None,
        1,
        "'retention.ms': expected an integer",
    ),
    (
        ["topics", "create", "x", "-c", "retention.ms=-7"],
        None,
        1,
        "'retention.ms': -7 is out of range",
    ),
    (["topics", "create", "x", "-c", "nope=1"], None, 1, "unknown topic config 'nope'"),
    (["topics", "create", "x", "-c", "noequals"], None, 2, "--config expects NAME=VALUE"),
    (["topics", "create", "x", "-c", "compression.type=gzip"], None, 1, "'compression.type'"),
    (["topics", "create", "t"], None, 1, "topic 't' already exists"),
    (["topics", "create", "x", "--bogus"], None, 2, "No such option: --bogus"),
    (["topics", "describe", "../x"], None, 1, "invalid topic name '../x'"),
    (["topics", "describe", "nope"], None, 1, "topic 'nope' does not exist"),
    (["topics", "list", "--output", "xml"], None, 2, "'xml' is not one of"),
    (["topics", "alter", "t", "--set", "retention.ms=-5"], None, 1, "-5 is out of range"),
    (["topics", "alter", "t", "--set", "segment.bytes=1kb"], None, 1, "'segment.bytes'"),
    (["topics", "alter", "t", "--delete", "nope"], None, 1, "unknown topic config 'nope'"),
    (
        ["topics", "alter", "nope", "--set", "retention.ms=5"],
        None,
        1,
        "topic 'nope' does not exist",
    ),
    (["topics", "alter", "t"], None, 2, "nothing to change"),
    (["topics", "delete", "../x", "-y"], None, 1, "invalid topic name '../x'"),
    (["topics", "delete", "nope", "-y"], None, 1, "topic 'nope' does not exist"),
    (["topics", "add-partitions", "t", "-p", "1"], None, 1, "1"),
    (["topics", "add-partitions", "t", "-p", "x"], None, 2, "valid integer"),
    (["topics", "add-partitions", "nope", "-p", "3"], None, 1, "'nope' does not exist"),
    # groups
    (["groups", "describe", "../g"], None, 1, "invalid group id '../g'"),
    (["groups", "describe", "g\u202e"], None, 1, "invalid group id"),
    (["groups", "describe", "nope"], None, 1, "consumer group 'nope' does not exist"),
    (["groups", "delete", "nope"], None, 1, "group 'nope' does not exist"),
    (["groups", "delete", "a/b"], None, 1, "invalid group id 'a/b'"),
    (
        ["groups", "reset-offsets", "g", "--topic", "t", "--to-offset", "-1"],
        None,
        2,
        "'--to-offset'",
    ),
    (
        ["groups", "reset-offsets", "g", "--topic", "t:9", "--to-earliest", "--execute"],
        None,
        1,
        "9 does not exist",
    ),
    (
        ["groups", "reset-offsets", "g", "--topic", "t:x", "--to-earliest"],
        None,
        2,
        "must be integers",
    ),
    (["groups", "reset-offsets", "g", "--topic", "t:-1", "--to-earliest"], None, 2, "non-negative"),
    (
        [
            "groups",
            "reset-offsets",
            "g",
            "--topic",
            "t",
            "--to-earliest",
            "--to-latest",
            "--execute",
        ],
        None,
        2,
        "got --to-earliest, --to-latest",
    ),
    (
        ["groups", "reset-offsets", "g", "--topic", "t", "--to-datetime", "soonish"],
        None,
        2,
        "ISO 8601",
    ),
    (
        ["groups", "reset-offsets", "g", "--topic", "t", "--by-duration", "forever"],
        None,
        2,
        "'forever' is not a duration",
    ),
    (["groups", "reset-offsets", "g", "--topic", "t", "--shift-by", "x"], None, 2, "'--shift-by'"),
    (
        ["groups", "reset-offsets", "g", "--topic", "../x", "--to-earliest", "--execute"],
        None,
        1,
        "invalid topic name '../x'",
    ),
    (["groups", "reset-offsets", "g", "--to-earliest", "--execute"], None, 2, "--all-topics"),
    (
        ["groups", "reset-offsets", "g", "--topic", "nope", "--to-earliest", "--execute"],
        None,
        1,
        "'nope' does not exist",
    ),
    (
        ["groups", "reset-offsets", "../g", "--topic", "t", "--to-earliest", "--execute"],
        None,
        1,
        "invalid group id '../g'",
    ),
    # produce
    (["produce", "../x"], "a\n", 1, "invalid topic name '../x'"),
    (["produce", "nope"], "a\n", 1, "topic 'nope' does not exist"),
    (["produce", "t", "-p", "9"], "a\n", 1, "9 does not exist"),
    (["produce", "t", "-p", "-1"], "a\n", 2, "'--partition'"),
    (["produce", "t", "--acks", "2"], "a\n", 2, "'2' is not one of"),
    (["produce", "t", "--format", "xml"], "a\n", 2, "'xml' is not one of"),
    (["produce", "t", "--format", "json"], "not json\n", 1, "line 1: not valid JSON"),
    (["produce", "t", "--format", "json"], '{"value": "a", "partition": 7}\n', 1, "got 7"),
    (
        ["produce", "t", "--format", "json"],
        '{"value": "a", "bogus": 1}\n',
        1,
        "unknown field(s) ['bogus']",
    ),
    (
        ["produce", "t", "--format", "json"],
        '{"value": "a", "partition": "0"}\n',
        1,
        "partition must be an integer",
    ),
    (["produce", "t", "--key-separator", ""], "a\n", 2, "--key-separator must not be empty"),
    (["produce", "t", "--file", "/nonexistent/records.txt"], None, 2, "/nonexistent/records.txt"),
    # consume
    (["consume", "../x"], None, 1, "invalid topic name '../x'"),
    (["consume", "nope"], None, 1, "topic 'nope' does not exist"),
    (["consume", "t", "-p", "9", "--timeout-ms", "0"], None, 1, "9 does not exist"),
    (["consume", "t", "--offset", "abc"], None, 2, "expected an offset"),
    (["consume", "t", "-n", "0"], None, 2, "'--max-messages'"),
    (["consume", "t", "--timeout-ms", "-5"], None, 2, "'--timeout-ms'"),
    (["consume", "t", "--from-time", "whenever"], None, 2, "ISO 8601"),
    (["consume", "t", "--group", "../g"], None, 1, "invalid group id '../g'"),
    (["consume", "t", "--isolation-level", "x"], None, 2, "'x' is not one of"),
    (["consume", "t", "--output", "yaml"], None, 2, "'yaml' is not one of"),
    (
        ["consume", "t", "--offset", "99", "-p", "0", "--timeout-ms", "0"],
        None,
        1,
        "offset 99 is outside the live range [0, 2]",
    ),
    # maintenance jobs
    (["retain", "--no-spark", "--tasks", "0"], None, 2, "'--tasks'"),
    (["retain", "--spark", "cluster"], None, 2, "for a cluster, use --print-submit"),
    (["vacuum", "--no-spark", "--orphan-age", "1s"], None, 2, "the minimum of 10m"),
    (["vacuum", "--no-spark", "--orphan-age", "soon"], None, 2, "'soon' is not a duration"),
    (["vacuum", "--no-spark", "--log-retention", "1h"], None, 2, "the minimum of 2d"),
    (["compact", "--no-spark", "../x"], None, 1, "invalid topic name '../x'"),
    (["merge", "--no-spark", "nope"], None, 1, "'nope' does not exist"),
    (["retain", "--no-spark", "t\u202e"], None, 1, "invalid topic name"),
    # store selection
    (["info", "--option", "noequals"], None, 2, "expects KEY=VALUE"),
    (["topics", "list", "--store", ""], None, 2, "store"),
]


def _invoke(root: Path, args: list[str], stdin: str | None) -> Any:
    if args[-2:-1] == ["--store"]:
        full = args  # the case chooses the store itself
    elif args[0] in JOB_VERBS:
        full = [args[0], "--store", str(root), *args[1:]]
    else:
        full = [*args, "--store", str(root)]
    return runner.invoke(app, full, input=stdin)


@pytest.mark.parametrize(
    ("args", "stdin", "code", "fragment"),
    CASES,
    ids=[f"{i}-{'-'.join(a[:2])}" for i, (a, _, _, _) in enumerate(CASES)],
)
def test_bad_cli_arguments_are_refused_and_change_nothing(
    template: Path, args: list[str], stdin: str | None, code: int, fragment: str
) -> None:
    before = local_snapshot(str(template))
    result = _invoke(template, args, stdin)
    err = flat(result.stderr)
    assert result.exit_code == code, (result.exit_code, result.stdout, err, result.exception)
    assert fragment in err, err
    assert "Traceback" not in result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit)
    if code == 1:
        assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    assert local_snapshot(str(template)) == before


@pytest.mark.parametrize("name", ["../x", "nope"])
def test_verify_reports_a_bad_topic_as_a_problem(template: Path, name: str) -> None:
    before = local_snapshot(str(template))
    result = runner.invoke(app, ["verify", name, "--store", str(template)])
    assert result.exit_code == 1
    assert "1 problem(s)" in flat(result.stdout + result.stderr)
    assert name in result.stdout + result.stderr
    assert local_snapshot(str(template)) == before


def test_a_missing_store_is_not_created_by_any_read_command(tmp_path: Path) -> None:
    root = tmp_path / "absent"
    for args in (
        ["topics", "list"],
        ["topics", "describe", "t"],
        ["groups", "list"],
        ["consume", "t", "--timeout-ms", "0"],
        ["info"],
    ):
        result = runner.invoke(app, [*args, "--store", str(root)])
        assert result.exit_code == 1, (args, result.stdout, result.stderr)
        assert "no kstore store" in result.stderr
        assert not root.exists(), args


def _kstore(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name("kstore")
    env = {**os.environ, "KSTORE_STORE": ""}
    env.pop("KSTORE_STORE")
    return subprocess.run(
        [str(exe), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["topics", "create", "../../etc"], 1, "invalid topic name '../../etc'"),
        (["topics", "create", "x", "--partitions", "-3"], 2, "--partitions"),
        (["groups", "describe", "g\u202eevil"], 1, "invalid group id"),
    ],
    ids=["traversal", "negative-partitions", "rtl-group"],
)
def test_bad_arguments_through_the_installed_command(
    template: Path, args: list[str], code: int, fragment: str
) -> None:
    before = local_snapshot(str(template))
    done = _kstore(*args, "--store", str(template))
    assert done.returncode == code, done.stderr
    assert fragment in flat(done.stderr)
    assert "Traceback" not in done.stderr
    assert local_snapshot(str(template)) == before
