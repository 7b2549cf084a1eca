"""The ``kstore`` command through typer's CliRunner, on memory://, a local directory and
SeaweedFS: every command's happy path and its errors, JSON output parsed back, exit codes."""

from __future__ import annotations

import base64
import gzip
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kstore.cli.app import app
from typer.testing import CliRunner, Result

import kstore
from kstore.consumer import Consumer
from kstore.producer import Producer
from kstore.segments import write_segment
from tests import layout2

BACKENDS = ["memory", "local", pytest.param("seaweed", marks=pytest.mark.s3)]
runner = CliRunner()


def option_args(options: dict[str, Any], prefix: str = "") -> list[str]:
    """Storage options as --option arguments, nested ones with dotted keys."""
    out: list[str] = []
    for key, value in options.items():
        if isinstance(value, dict):
            out += option_args(value, f"{prefix}{key}.")
        else:
            out += ["--option", f"{prefix}{key}={value}"]
    return out


def flat(text: str) -> str:
    """typer's error panel without its frame and line breaks, for substring checks."""
    for char in "│╭╮╰╯─":
        text = text.replace(char, " ")
    return " ".join(text.split())


@dataclass
class Cli:
    backend: str
    url: str
    options: dict[str, Any]

    def store_args(self) -> list[str]:
        return ["--store", self.url, *option_args(self.options)]

    def run(self, *args: str, input: str | bytes | None = None, code: int = 0) -> Result:
        result = runner.invoke(app, [*args, *self.store_args()], input=input)
        assert result.exit_code == code, (
            f"kstore {' '.join(args)}: exit {result.exit_code}, wanted {code}\n"
            f"stdout: {result.stdout}\nstderr: {result.stderr}\nexception: {result.exception!r}"
        )
        return result

    def json(self, *args: str, input: str | bytes | None = None, code: int = 0) -> Any:
        return json.loads(self.run(*args, "--output", "json", input=input, code=code).stdout)

    def error(self, *args: str, code: int = 1, input: str | None = None) -> str:
        """Run a command that must fail; returns its one-line error message."""
        result = self.run(*args, code=code, input=input)
        if code == 1:
            lines = result.stderr.strip().splitlines()
            assert lines, result.stdout
            assert lines[-1].startswith("error: "), result.stderr
            assert "Traceback" not in result.stderr
            return lines[-1]
        return flat(result.stderr)

    def store(self) -> kstore.Store:
        return kstore.Store(self.url, self.options, create=False)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("KSTORE_"):
            monkeypatch.delenv(name)


@pytest.fixture(params=BACKENDS)
def cli(request: pytest.FixtureRequest) -> Cli:
    url, options = request.getfixturevalue(f"{request.param}_store")
    return Cli(request.param, url, options)


@pytest.fixture
def local_cli(local_store: tuple[str, dict[str, Any]]) -> Cli:
    return Cli("local", *local_store)


@pytest.fixture
def memory_cli(memory_store: tuple[str, dict[str, Any]]) -> Cli:
    return Cli("memory", *memory_store)


# -- topics -----------------------------------------------------------------------------------------


def test_topics_lifecycle(cli: Cli) -> None:
    cli.run(
        "topics",
        "create",
        "orders",
        "--partitions",
        "3",
        "-c",
        "retention.ms=3600000",
        "-c",
        "cleanup.policy=compact,delete",
    )
    created = cli.json("topics", "create", "users", "-p", "1", "--if-not-exists")
    assert created["created"] is True
    again = cli.json("topics", "create", "users", "--if-not-exists")
    assert again["created"] is False
    assert again["topic_id"] == created["topic_id"]

    listed = cli.json("topics", "list")
    assert [(t["topic"], t["partitions"], t["cleanup.policy"]) for t in listed] == [
        ("orders", 3, "delete,compact"),
        ("users", 1, "delete"),
    ]
    assert "orders" in cli.run("topics", "list").stdout

    cli.run("produce", "orders", "--key-separator", ":", input="a:1\nb:2\nc:3\nd:4\n")
    (orders,) = cli.json("topics", "describe", "orders")
    assert orders["topic"] == "orders"
    assert sum(p["log_end_offset"] for p in orders["partitions"]) == 4
    assert sum(p["records"] for p in orders["partitions"]) == 4
    for p in orders["partitions"]:
        assert p["log_start_offset"] == 0
        assert p["segments"] == (1 if p["records"] else 0)
        assert (p["bytes"] > 0) == (p["records"] > 0)
        if p["records"]:
            assert p["oldest_timestamp_ms"] <= p["newest_timestamp_ms"]
        else:
            assert p["oldest_timestamp_ms"] is None
    config = {c["name"]: c for c in orders["config"]}
    assert config["retention.ms"] == {"name": "retention.ms", "value": 3600000, "default": False}
    assert config["cleanup.policy"]["value"] == "delete,compact"
    assert config["segment.bytes"] == {
        "name": "segment.bytes",
        "value": 1073741824,
        "default": True,
    }

    table = cli.run("topics", "describe", "orders").stdout
    for heading in ("LOG-START", "LOG-END", "SEGMENTS", "BYTES", "OLDEST", "NEWEST", "SOURCE"):
        assert heading in table
    assert "retention.ms" in table
    assert "default" in table
    assert len(cli.json("topics", "describe")) == 2  # every topic

    altered = cli.json(
        "topics",
        "alter",
        "orders",
        "--set",
        "retention.ms=60000",
        "--add-config",
        "max.message.bytes=2048",
        "--delete",
        "cleanup.policy",
    )
    assert altered["config"] == {"retention.ms": 60000, "max.message.bytes": 2048}
    (orders,) = cli.json("topics", "describe", "orders")
    assert {c["name"]: c["default"] for c in orders["config"]}["cleanup.policy"] is True

    grown = cli.json("topics", "add-partitions", "orders", "--partitions", "5")
    assert (grown["partitions"], grown["previous_partitions"]) == (5, 3)
    assert (
        "now has 6 partitions (was 5)"
        in cli.run("topics", "add-partitions", "orders", "-p", "6").stderr
    )

    assert cli.json("topics", "delete", "orders", "users") == [
        {"topic": "orders", "deleted": True},
        {"topic": "users", "deleted": True},
    ]
    assert cli.json("topics", "list") == []
    assert cli.json("topics", "delete", "orders", "--if-exists") == [
        {"topic": "orders", "deleted": False}
    ]


def test_topic_errors(cli: Cli) -> None:
    cli.run("topics", "create", "t", "-p", "2")
    assert "already exists" in cli.error("topics", "create", "t")
    assert "invalid topic name" in cli.error("topics", "create", "bad/name")
    assert "expected an integer, got 'abc'" in cli.error(
        "topics", "create", "u", "-c", "retention.ms=abc"
    )
    assert "did you mean 'retention.ms'" in cli.error(
        "topics", "create", "u", "-c", "retention.msx=1"
    )
    assert "out of range" in cli.error("topics", "create", "u", "-c", "min.cleanable.dirty.ratio=2")
    assert "must not exceed" in cli.error(
        "topics",
        "alter",
        "t",
        "--set",
        "min.compaction.lag.ms=10",
        "--set",
        "max.compaction.lag.ms=5",
    )
    assert "unknown topic config" in cli.error("topics", "alter", "t", "--delete", "nope")
    assert "must be larger" in cli.error("topics", "add-partitions", "t", "-p", "2")
    for args in (
        ("topics", "describe", "missing"),
        ("topics", "alter", "missing", "--set", "retention.ms=1"),
        ("topics", "add-partitions", "missing", "-p", "3"),
        ("topics", "delete", "missing"),
    ):
        assert "does not exist" in cli.error(*args), args
    # Usage errors: exit code 2, typer's message.
    assert "NAME=VALUE" in cli.error("topics", "create", "u", "-c", "retention.ms", code=2)
    assert "nothing to change" in cli.error("topics", "alter", "t", code=2)
    assert "both set and deleted" in cli.error(
        "topics", "alter", "t", "--set", "retention.ms=1", "--delete", "retention.ms", code=2
    )
    cli.error("topics", "create", "u", "--partitions", "0", code=2)
    cli.error("topics", "create", "u", "--partitions", "many", code=2)
    cli.error("topics", "create", code=2)  # missing argument
    cli.error("topics", "frobnicate", code=2)
    # Nothing was created by the failed commands.
    assert [t["topic"] for t in cli.json("topics", "list")] == ["t"]


# -- produce and consume ----------------------------------------------------------------------------


def test_round_trip_produce_then_consume_from_beginning(cli: Cli) -> None:
    cli.run("topics", "create", "events", "-p", "3")
    lines = [f"user-{i % 5}:value {i}" for i in range(40)]
    produced = cli.json("produce", "events", "--key-separator", ":", input="\n".join(lines) + "\n")
    assert produced["records"] == 40
    assert produced["failed"] == 0
    assert sum(p["records"] for p in produced["partitions"]) == 40
    result = cli.run("consume", "events", "--from-beginning", "--output", "json")
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert "Processed a total of 40 messages" in result.stderr
    assert sorted((r["key"], r["value"]) for r in records) == sorted(
        tuple(line.split(":", 1)) for line in lines
    )
    for r in records:
        assert set(r) == {
            "topic",
            "partition",
            "offset",
            "timestamp",
            "timestamp_type",
            "key",
            "value",
            "headers",
        }
        assert r["topic"] == "events"
        assert r["timestamp_type"] == "CreateTime"
    for partition in range(3):
        mine = [r for r in records if r["partition"] == partition]
        assert [r["offset"] for r in mine] == list(range(len(mine)))  # dense, in order
        # One key always lands in one partition, in the order it was sent.
        for key in {r["key"] for r in mine}:
            values = [int(r["value"].split()[1]) for r in mine if r["key"] == key]
            assert values == sorted(values)


def test_headers_nulls_and_binary_round_trip(cli: Cli) -> None:
    cli.run("topics", "create", "src")
    cli.run("topics", "create", "copy", "-p", "2")
    cli.run(
        "produce",
        "src",
        "--headers",
        "--key-separator",
        "\\t",
        "--null-marker",
        "NULL",
        input="src:web,trace:1\tk1\tv1\n\tk2\tNULL\nh:x\tNULL\tv3\n",
    )
    binary = base64.b64encode(bytes(range(256))).decode()
    json_lines = [
        json.dumps({"key": "k4", "value": {"nested": [1, 2]}, "headers": {"h": "v"}}),
        "",
        json.dumps({"value": binary, "value_encoding": "base64", "timestamp": 1_700_000_000_000}),
    ]
    cli.run("produce", "src", "--format", "json", input="\n".join(json_lines) + "\n")
    dumped = cli.run("consume", "src", "-o", "json").stdout
    records = [json.loads(line) for line in dumped.splitlines()]
    assert [(r["key"], r.get("value")) for r in records[:4]] == [
        ("k1", "v1"),
        ("k2", None),
        (None, "v3"),
        ("k4", '{"nested":[1,2]}'),
    ]
    assert records[0]["headers"] == [{"key": "src", "value": "web"}, {"key": "trace", "value": "1"}]
    assert records[1]["headers"] == []
    assert records[4]["value_encoding"] == "base64"
    assert base64.b64decode(records[4]["value"]) == bytes(range(256))
    assert records[4]["timestamp"] == 1_700_000_000_000

    # consume -o json | produce --format json copies records exactly (partition kept).
    cli.run("produce", "copy", "--format", "json", input=dumped)
    copied = [
        json.loads(line) for line in cli.run("consume", "copy", "-o", "json").stdout.splitlines()
    ]
    strip = ("topic",)
    assert [{k: v for k, v in r.items() if k not in strip} for r in copied] == [
        {k: v for k, v in r.items() if k not in strip} for r in records
    ]

    plain = cli.run(
        "consume",
        "src",
        "--print-key",
        "--print-headers",
        "--print-offset",
        "--print-partition",
        "--print-timestamp",
        "--max-messages",
        "3",
    ).stdout_bytes
    assert plain.splitlines()[0].split(b"\t")[1:] == [
        b"Partition:0",
        b"Offset:0",
        b"src:web,trace:1",
        b"k1",
        b"v1",
    ]
    assert plain.splitlines()[1].endswith(b"NO_HEADERS\tk2\tnull")
    hexed = cli.run("consume", "src", "-o", "hex", "-K", "--key-separator", " ", "-n", "1").stdout
    assert hexed == "6b31 7631\n"


def test_consume_positions(cli: Cli) -> None:
    cli.run("topics", "create", "t", "-p", "2")
    cli.run("produce", "t", "-p", "0", input="".join(f"a{i}\n" for i in range(10)))
    before = int(time.time() * 1000)
    time.sleep(0.01)
    cli.run("produce", "t", "-p", "1", input="".join(f"b{i}\n" for i in range(5)))

    def values(*args: str) -> list[str]:
        return cli.run("consume", "t", *args).stdout.splitlines()

    assert values("-p", "0", "--offset", "7") == ["a7", "a8", "a9"]
    assert values("--offset", "-2") == ["a8", "a9", "b3", "b4"]
    assert values("-p", "1", "--offset", "-100") == [f"b{i}" for i in range(5)]
    assert values("-p", "1", "--offset", "latest") == []
    assert values("-p", "0", "--offset", "earliest", "--max-messages", "2") == ["a0", "a1"]
    assert values("--from-time", str(before)) == [f"b{i}" for i in range(5)]
    assert values("--from-time", "2099-01-01T00:00:00Z") == []
    assert len(values("--max-messages", "12")) == 12
    # --follow with nothing new: stops at --timeout-ms, or at --max-messages.
    assert values("--follow", "--timeout-ms", "300") == []
    assert values("--follow", "--from-beginning", "--max-messages", "3", "-p", "0") == [
        "a0",
        "a1",
        "a2",
    ]

    assert "outside the live range [0, 10]" in cli.error(
        "consume", "t", "-p", "0", "--offset", "11"
    )
    assert "partitions 0..1; 5 does not exist" in cli.error("consume", "t", "-p", "5")
    assert "does not exist" in cli.error("consume", "missing")
    assert "needs --partition" in cli.error("consume", "t", "--offset", "3", code=2)
    assert "--offset" in cli.error("consume", "t", "--offset", "soon", code=2)
    assert "choose one of" in cli.error(
        "consume", "t", "--offset", "-1", "--from-beginning", code=2
    )
    assert "not a time" in cli.error("consume", "t", "--from-time", "yesterday", code=2)
    assert "excludes --partition" in cli.error("consume", "t", "--group", "g", "-p", "0", code=2)
    cli.error("consume", "t", "--max-messages", "0", code=2)


def test_produce_errors(cli: Cli) -> None:
    cli.run("topics", "create", "t", "-c", "max.message.bytes=200")
    assert "does not exist" in cli.error("produce", "missing", input="x\n")
    assert "partitions 0..0; 3 does not exist" in cli.error("produce", "t", "-p", "3", input="x\n")
    message = cli.error(
        "produce", "t", "--key-separator", ":", input="k:1\nk:2\nno key here\nk:4\n"
    )
    assert message.startswith("error: line 3: no key separator ':' found")
    message = cli.error("produce", "t", input="ok\n" + "x" * 500 + "\n")
    assert "line 2" in message
    assert "larger than the limit" in message
    assert "line 1: not valid JSON" in cli.error(
        "produce", "t", "--format", "json", input="{nope\n"
    )
    assert "--format text only" in cli.error("produce", "t", "--format", "json", "-k", ":", code=2)
    cli.error("produce", "t", "--acks", "2", code=2)
    cli.error("produce", "t", "--file", "/nonexistent/records.txt", code=2)
    # Records before a bad line were delivered; nothing after it.
    assert cli.run("consume", "t").stdout.splitlines() == ["1", "2", "ok"]


def test_produce_from_file_with_acks(cli: Cli, tmp_path: Path) -> None:
    cli.run("topics", "create", "t")
    path = tmp_path / "records.txt"
    path.write_bytes(
        b"one\r\ntwo\n\nthree"
    )  # CRLF, an empty line (an empty value), no final newline
    for acks in ("0", "1", "all"):
        summary = cli.json("produce", "t", "--file", str(path), "--acks", acks)
        assert summary["records"] == 4
    values = cli.run("consume", "t").stdout.splitlines()
    assert values == ["one", "two", "", "three"] * 3


# -- groups -----------------------------------------------------------------------------------------


def _lag(cli: Cli, group: str) -> dict[int, tuple[int | None, int, int | None]]:
    described = cli.json("groups", "describe", group)
    return {
        p["partition"]: (p["current_offset"], p["log_end_offset"], p["lag"])
        for p in described["partitions"]
    }


def test_groups(cli: Cli) -> None:
    cli.run("topics", "create", "t", "-p", "2")
    cli.run("produce", "t", "-p", "0", input="".join(f"a{i}\n" for i in range(6)))
    cli.run("produce", "t", "-p", "1", input="".join(f"b{i}\n" for i in range(4)))
    assert cli.json("groups", "list") == []
    assert "No consumer groups" in cli.run("groups", "list").stderr

    # A group consumer commits what it printed, and the next run continues from there.
    first = cli.run("consume", "t", "--group", "g1", "--max-messages", "3").stdout.splitlines()
    assert len(first) == 3
    rest = cli.run("consume", "t", "--group", "g1").stdout.splitlines()
    assert sorted(first + rest) == sorted([f"a{i}" for i in range(6)] + [f"b{i}" for i in range(4)])
    assert cli.run("consume", "t", "--group", "g1").stdout == ""

    listed = cli.json("groups", "list")
    assert listed == [
        {"group": "g1", "state": "Empty", "members": 0, "generation": listed[0]["generation"]}
    ]
    assert _lag(cli, "g1") == {0: (6, 6, 0), 1: (4, 4, 0)}
    described = cli.json("groups", "describe", "g1")
    assert (described["state"], described["members"], described["total_lag"]) == ("Empty", [], 0)
    table = cli.run("groups", "describe", "g1").stdout
    for heading in ("CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "MEMBER-ID"):
        assert heading in table

    # Reset: a dry run by default.
    plan = cli.json("groups", "reset-offsets", "g1", "--topic", "t", "--to-earliest")
    assert plan["executed"] is False
    assert [(o["partition"], o["current_offset"], o["new_offset"]) for o in plan["offsets"]] == [
        (0, 6, 0),
        (1, 4, 0),
    ]
    assert _lag(cli, "g1") == {0: (6, 6, 0), 1: (4, 4, 0)}
    assert (
        "Dry run"
        in cli.run("groups", "reset-offsets", "g1", "--topic", "t", "--to-earliest").stderr
    )

    cli.json("groups", "reset-offsets", "g1", "--topic", "t:0", "--to-offset", "2", "--execute")
    assert _lag(cli, "g1") == {0: (2, 6, 4), 1: (4, 4, 0)}
    cli.json("groups", "reset-offsets", "g1", "--all-topics", "--shift-by", "-3", "--execute")
    assert _lag(cli, "g1") == {0: (0, 6, 6), 1: (1, 4, 3)}  # clamped at the log start
    cli.json("groups", "reset-offsets", "g1", "--topic", "t", "--to-latest", "--execute")
    assert _lag(cli, "g1") == {0: (6, 6, 0), 1: (4, 4, 0)}
    cli.json(
        "groups",
        "reset-offsets",
        "g1",
        "--topic",
        "t",
        "--to-datetime",
        "2000-01-01T00:00:00Z",
        "--execute",
    )
    assert _lag(cli, "g1") == {0: (0, 6, 6), 1: (0, 4, 4)}
    cli.json("groups", "reset-offsets", "g1", "--topic", "t", "--by-duration", "PT0S", "--execute")
    assert _lag(cli, "g1") == {0: (6, 6, 0), 1: (4, 4, 0)}  # nothing at or after now: the end
    cli.json("groups", "reset-offsets", "g1", "--topic", "t", "--to-offset", "1000", "--execute")
    assert _lag(cli, "g1") == {0: (6, 6, 0), 1: (4, 4, 0)}  # clamped at the end
    assert cli.run("consume", "t", "--group", "g1").stdout == ""
    # A new group's offsets can be set before it ever consumes.
    cli.json("groups", "reset-offsets", "fresh", "--topic", "t:1", "--to-offset", "3", "--execute")
    # Partition 0 has no committed offset: it starts at the beginning (no --follow).
    assert sorted(cli.run("consume", "t", "--group", "fresh").stdout.splitlines()) == [
        *(f"a{i}" for i in range(6)),
        "b3",
    ]

    assert "Deleted consumer group 'g1'" in cli.run("groups", "delete", "g1").stderr
    assert [g["group"] for g in cli.json("groups", "list")] == ["fresh"]
    assert "does not exist" in cli.error("groups", "describe", "g1")
    assert "does not exist" in cli.error("groups", "delete", "g1")
    assert "does not exist" in cli.error("groups", "describe", "never")


def test_group_reset_errors(cli: Cli) -> None:
    cli.run("topics", "create", "t", "-p", "2")
    base = ("groups", "reset-offsets", "g", "--topic", "t")
    assert "exactly one" in cli.error(*base, code=2)
    assert "exactly one" in cli.error(*base, "--to-earliest", "--to-latest", code=2)
    assert "--to-offset" in cli.error(*base, "--to-offset", "-1", code=2)
    assert "--shift-by" in cli.error(*base, "--shift-by", "x", code=2)
    assert "not a time" in cli.error(*base, "--to-datetime", "someday", code=2)
    assert "duration" in cli.error(*base, "--by-duration", "forever", code=2)
    assert "--topic" in cli.error("groups", "reset-offsets", "g", "--to-earliest", code=2)
    assert "exclude each other" in cli.error(
        *base, "--to-earliest", "--execute", "--dry-run", code=2
    )
    assert "partitions must be integers" in cli.error(
        "groups", "reset-offsets", "g", "--topic", "t:x", "--to-earliest", code=2
    )
    assert "no offsets or assignment" in cli.error(
        "groups", "reset-offsets", "g", "--all-topics", "--to-earliest", code=2
    )
    assert "does not exist" in cli.error(
        "groups", "reset-offsets", "g", "--topic", "nope", "--to-earliest"
    )
    assert "partitions 0..1; 2 does not exist" in cli.error(
        "groups", "reset-offsets", "g", "--topic", "t:2", "--to-earliest"
    )
    assert "invalid group id" in cli.error("groups", "describe", "bad group")


def test_live_group_reset_and_delete_refused(cli: Cli) -> None:
    cli.run("topics", "create", "t")
    cli.run("produce", "t", input="a\nb\n")
    store = cli.store()
    consumer = Consumer(
        "t",
        store=store,
        group_id="live",
        auto_offset_reset="earliest",
        session_timeout_ms=30_000,
        heartbeat_interval_ms=1_000,
    )
    try:
        assert consumer.poll(timeout_ms=5_000)
        consumer.commit()
        described = cli.json("groups", "describe", "live")
        assert described["state"] == "Stable"
        (member,) = described["members"]
        assert member["assignment"] == [["t", 0]]
        assert described["partitions"][0]["member_id"] == member["member_id"]
        assert cli.json("groups", "list")[0]["members"] == 1
        message = cli.error(
            "groups", "reset-offsets", "live", "--topic", "t", "--to-earliest", "--execute"
        )
        assert "1 live member(s)" in message
        assert "live member" in cli.error(
            "groups", "reset-offsets", "live", "--topic", "t", "--to-earliest"
        )
        assert "live member" in cli.error("groups", "delete", "live")
    finally:
        consumer.close()
    cli.json("groups", "reset-offsets", "live", "--topic", "t", "--to-earliest", "--execute")
    assert _lag(cli, "live") == {0: (0, 2, 2)}
    cli.run("groups", "delete", "live")


# -- verify -----------------------------------------------------------------------------------------


def _segments(cli: Cli, topic: str) -> Iterator[tuple[kstore.Store, Any, Any]]:
    store = cli.store()
    meta = store.topic(topic)
    for number in range(meta.partitions):
        partition = store.partition(topic, number, meta)
        for seg in partition.state().segments:
            yield store, partition, seg


def _create(cli: Cli, topic: str, partitions: int, layout: int, config: str = "") -> None:
    """Create a topic through the command (layout 3) or, for layout 2 (which this version no
    longer creates), as an older version did (tests/layout2.py)."""
    if layout == 3:
        cli.run(
            "topics", "create", topic, "-p", str(partitions), *(["-c", config] if config else [])
        )
        assert cli.store().topic(topic).layout == 3
        return
    settings = dict([config.split("=", 1)]) if config else {}
    layout2.create_topic(kstore.Store(cli.url, cli.options), topic, partitions, settings)


def _produce(cli: Cli, topic: str, layout: int, records: list[tuple[bytes | None, bytes]]) -> None:
    """One produce run: the command (layout 3), or a commit per partition as an older version
    wrote them (layout 2: partition by record index)."""
    if layout == 3:
        text = "".join(
            f"{k.decode()}:{v.decode()}\n" if k else f"{v.decode()}\n" for k, v in records
        )
        cli.run("produce", topic, *(["-k", ":"] if records[0][0] else []), input=text)
        return
    store = kstore.Store(cli.url, cli.options)
    partitions = store.topic(topic).partitions
    for p in range(partitions):
        mine = records[p::partitions]
        if mine:
            keys = [k for k, _ in mine]
            layout2.append(store, topic, p, layout2.records([v for _, v in mine], keys))


def _bytes_of(partition: Any, seg: Any) -> tuple[str, int, int]:
    """Where a live segment's bytes are: (file, first byte, length). In layout 3 a producer's
    segment is a range of a data object that holds other partitions' ranges too."""
    from kstore.manifest import segment_location

    path = segment_location(partition.directory, seg.path)
    if seg.byte_range is not None:
        assert seg.path.startswith("_data/")
        start, length = seg.byte_range
        return path, start, length
    return path, 0, seg.size_bytes


@pytest.mark.parametrize("layout", [3, 2])
def test_verify_catches_a_corrupted_segment(cli: Cli, layout: int) -> None:
    # In layout 3 the damaged topic's flushes are written to data objects (below: a byte of
    # one flipped, one deleted), not carried by their commits (PROTOCOL.md 11.8); the healthy
    # topic's commits carry them.
    _create(cli, "good", 2, layout)
    _create(cli, "bad", 2, layout, "commit.inline.bytes=0")
    for topic in ("good", "bad"):
        for _ in range(3):
            _produce(cli, topic, layout, [(b"k%d" % i, b"v%d" % i) for i in range(10)])
    report = cli.json("verify")
    assert report["ok"] is True
    # Three runs, each at least one segment per partition (more if a batch was split).
    assert [
        (t["topic"], t["segments"] >= 6, t["records"], t["problems"]) for t in report["topics"]
    ] == [("bad", True, 30, []), ("good", True, 30, [])]
    assert "OK" in cli.run("verify").stderr

    # Flip one byte in the middle of a segment (same size): only the checksum can tell. In
    # layout 3 the byte is inside this partition's range of the shared data object: the other
    # partition's range of that object stays readable.
    store, partition, seg = next(_segments(cli, "bad"))
    assert (seg.byte_range is not None) == (layout == 3)
    path, start, length = _bytes_of(partition, seg)
    data = bytearray(store.storage.read(path))
    data[start + length // 2] ^= 0xFF
    store.storage.put(path, bytes(data))
    result = cli.run("verify", code=1)
    assert "checksum mismatch" in result.stdout
    assert seg.path in result.stdout
    assert "1 problem(s)" in result.stderr
    report = cli.json("verify", code=1)
    assert report["ok"] is False
    bad, good = report["topics"]
    assert good["ok"] is True
    (problem,) = bad["problems"]
    assert problem["partition"] == partition.partition
    assert problem["path"] == path
    assert "checksum mismatch" in problem["message"]
    if layout == 3:
        assert f"range {start}+{length}" in problem["message"]
    assert cli.json("verify", "good")["ok"] is True  # one topic only
    assert cli.json("verify", "bad", "--no-data")["ok"] is True  # the data is not read

    # A missing segment and a truncated commit file are found too.
    segments = list(_segments(cli, "bad"))
    _, partition0, seg0 = [s for s in segments if s[1].partition == 0][-1]
    assert seg0.path != seg.path
    missing, _, _ = _bytes_of(partition0, seg0)
    # Every partition with a live segment in the deleted file misses it (in layout 3 a data
    # object holds both partitions' records of one flush).
    holders = {p.partition for _, p, s in segments if s.path == seg0.path}
    assert holders == ({0, 1} if layout == 3 else {0})
    store.storage.delete([missing])
    report = cli.json("verify", "bad", code=1)
    problems = report["topics"][0]["problems"]
    # Once per partition: a file found missing is not also reported unreadable.
    assert sorted(p["partition"] for p in problems if p["path"] == missing) == sorted(holders)
    assert all("missing from storage" in p["message"] for p in problems if p["path"] == missing)
    # The progress of a verification still reaches the bytes it planned to read.
    from kstore.cli.verify import planned_bytes, verify_topic

    read: list[int] = []
    verify_topic(cli.store(), "bad", progress=read.append)
    assert sum(read) == planned_bytes(cli.store(), ["bad"]) > 0
    _, partition1, _ = segments[-1]
    assert partition1.partition == 1
    # The log partition 1 commits to: its own (layout 2) or the topic log (layout 3).
    log_file = f"{partition1.log.directory}/00000000000000000001.json"
    owner = partition1.directory if layout == 2 else partition1.directory.rsplit("/", 1)[0]
    assert log_file == f"{owner}/_log/00000000000000000001.json"
    store.storage.put(log_file, store.storage.read(log_file)[:-20])
    report = cli.json("verify", "bad", code=1)
    problems = report["topics"][0]["problems"]
    messages = " | ".join(p["message"] for p in problems)
    assert "commit 1 is corrupt" in messages
    if layout == 2:  # the other partition's log still loads: its missing segment is reported
        assert "missing from storage" in messages
        assert {p["partition"] for p in problems} == {0, 1}
    else:  # the topic log is both partitions' log: neither partition's state loads
        assert {
            p["partition"] for p in problems if "the topic log cannot be loaded" in p["message"]
        } == {0, 1}
    assert "does not exist" in cli.run("verify", "nope", code=1).stdout


def test_verify_checks_checkpoints_and_orphans(local_cli: Cli) -> None:
    cli = local_cli
    # The files a partition log of layout 2 keeps; layout 3's topic log and its sidecars below.
    _create(cli, "t", 1, 2, "checkpoint.interval=3")
    for i in range(7):
        _produce(cli, "t", 2, [(None, b"r%d" % i)])
    report = cli.json("verify", "t")
    assert report["ok"] is True
    assert report["topics"][0]["log_files"] >= 8 + 2  # commits 0..6 and checkpoints 3 and 6
    store = cli.store()
    partition = store.partition("t", 0)
    # An orphan segment (written, never committed) is a warning, not a problem.
    write_segment(store.storage, partition.directory, _table([b"orphan"]))
    report = cli.json("verify", "t")
    assert report["ok"] is True
    (warning,) = report["topics"][0]["warnings"]
    assert "not referenced by the manifest" in warning["message"]
    # A checkpoint that disagrees with the commits is a problem.
    checkpoint = f"{partition.directory}/_log/00000000000000000003.checkpoint.json"
    text = store.storage.read(checkpoint).decode()
    assert '"endOffset":{"offset":4}' in text  # version 0 is the first append
    store.storage.put(
        checkpoint, text.replace('"endOffset":{"offset":4}', '"endOffset":{"offset":9}').encode()
    )
    report = cli.json("verify", "t", code=1)
    assert any(
        "checkpoint 3 disagrees" in p["message"] and "endOffset" in p["message"]
        for p in report["topics"][0]["problems"]
    )


def test_verify_checks_topic_log_checkpoints_sidecars_and_orphans(local_cli: Cli) -> None:
    """Layout 3: a checkpoint of the topic log holds each partition's state in a sidecar, and
    a producer's orphan is a data object."""
    from kstore.layout import topic_data_dir
    from kstore.log import decode_commit
    from kstore.partitioner import murmur2_partition

    cli = local_cli
    _create(cli, "t", 2, 3, "checkpoint.interval=3")
    # One key per partition: each run is one flush, one commit of the topic log for both.
    keys = [
        next(f"k{n}" for n in range(100) if murmur2_partition(f"k{n}".encode(), 2) == p)
        for p in (0, 1)
    ]
    for i in range(7):
        cli.run("produce", "t", "-k", ":", input="".join(f"{k}:r{i}\n" for k in keys))
    report = cli.json("verify", "t")
    assert report["ok"] is True
    assert report["topics"][0]["warnings"] == []
    # The topic metadata log, topic log commits 0..6 and checkpoints 3 and 6.
    assert report["topics"][0]["log_files"] >= 8 + 2
    store = cli.store()
    meta = store.topic("t")
    incarnation = topic_data_dir("t", meta.topic_id)
    partition = store.partition("t", 0, meta)
    assert partition.state().end_offset == 7
    log_dir = partition.log.directory
    assert log_dir == f"{incarnation}/_log"
    # An orphan segment (written, never committed) and an orphan data object (a flush that
    # never committed) are warnings, not problems.
    orphan_segment = partition.write_segment(_table([b"orphan"]))
    orphan_object = f"{incarnation}/_data/{int(time.time() * 1000):013d}-{'cd' * 16}.kdat"
    store.storage.put_if_absent(orphan_object, b"never committed")
    report = cli.json("verify", "t")
    assert report["ok"] is True
    warnings = {w["path"]: w["message"] for w in report["topics"][0]["warnings"]}
    segment = f"{partition.directory}/{orphan_segment.path}"
    assert set(warnings) == {segment, orphan_object}
    assert "not referenced by the manifest" in warnings[segment]
    assert "data object no partition names" in warnings[orphan_object]
    # A checkpoint whose sidecar disagrees with the commits is a problem, for that partition.
    checkpoint = f"{log_dir}/00000000000000000003.checkpoint.json"
    _, actions = decode_commit(store.storage.read(checkpoint), checkpoint)
    sidecars = {body["partition"]: body for name, body in actions if name == "sidecar"}
    assert set(sidecars) == {0, 1}
    # Version 6: both partitions' bases are members of one file, partition 1's the second.
    assert sidecars[0]["path"] == sidecars[1]["path"]
    start, length = sidecars[1]["range"]
    sidecar = f"{incarnation}/{sidecars[1]['path']}"
    content = store.storage.read(sidecar)
    assert start + length == len(content)
    # Compressed (version 4): rewritten, with the size the checkpoint records kept right.
    text = gzip.decompress(content[start:]).decode()
    assert '"endOffset":{"offset":4}' in text  # version 0 is the first append
    payload = gzip.compress(
        text.replace('"endOffset":{"offset":4}', '"endOffset":{"offset":9}').encode()
    )
    store.storage.put(sidecar, content[:start] + payload)
    info, _ = decode_commit(store.storage.read(checkpoint), checkpoint)
    lines = [json.dumps({"commitInfo": info})]
    for name, body in actions:
        if name == "sidecar" and body["partition"] == 1:
            body = {**body, "size": len(payload), "range": [start, len(payload)]}
        lines.append(json.dumps({name: body}))
    store.storage.put(checkpoint, ("\n".join(lines) + "\n").encode())
    report = cli.json("verify", "t", code=1)
    problems = {p["path"]: p["message"] for p in report["topics"][0]["problems"]}
    assert "checkpoint 3 disagrees" in problems[checkpoint]
    assert "partition 1: endOffset differs" in problems[checkpoint]
    # Checkpoint 6 extends that base with a delta (13.4), so it, and the state readers load
    # from it, are problems too: they disagree with the commits, or, when the rewritten gzip's
    # size differs from the one checkpoint 6 records (by a byte, depending on the content),
    # checkpoint 6 is corrupt.
    later = f"{log_dir}/00000000000000000006.checkpoint.json"
    assert set(problems) <= {checkpoint, later, log_dir}
    assert re.search(r"checkpoint 6 (disagrees|is corrupt)", problems[later])


def test_verify_finds_manifest_and_data_disagreeing(local_cli: Cli) -> None:
    """Segments whose checksum is right but whose manifest entry lies about them."""
    import pyarrow as pa
    from kstore.cli.verify import verify_topic

    from kstore.segments import checksum, encode_arrow

    cli = local_cli
    cli.run("topics", "create", "t")
    cli.run("produce", "t", input="a\nb\n")
    store = cli.store()
    partition = store.partition("t", 0)

    def add(body: dict[str, Any]) -> None:
        partition.commit_actions(lambda state: [{"add": body}], operation="TEST")

    # 1. A dense segment whose manifest timestamps and size are wrong.
    written = partition.write_segment(_table([b"c", b"d"]))
    add(
        {
            "path": written.path,
            "baseOffset": 2,
            "lastOffset": 3,
            "records": 2,
            "minTimestamp": 1,
            "maxTimestamp": 2,
            "size": written.size_bytes + 5,
            "checksum": written.checksum,
            "format": "arrow",
            "sparse": False,
        }
    )
    # 2. A sparse segment whose offsets go backwards (the reader checks only the first and
    #    the last against the manifest's range).
    table = _table([b"e", b"f", b"g"]).append_column("offset", pa.array([4, 7, 6], pa.int64()))
    data = encode_arrow(table, "uncompressed").to_pybytes()
    path = "segments/0000000000001-" + "ab" * 16 + ".arrow"
    store.storage.put_if_absent(f"{partition.directory}/{path}", data)
    stamp = table.column("timestamp")[0].value // 1000
    add(
        {
            "path": path,
            "baseOffset": 4,
            "lastOffset": 7,
            "records": 3,
            "minTimestamp": stamp,
            "maxTimestamp": stamp,
            "size": len(data),
            "checksum": checksum(data),
            "format": "arrow",
            "sparse": True,
        }
    )
    report = verify_topic(store, "t")
    messages = sorted(f.message for f in report.problems)
    assert len(messages) == 3, messages
    assert messages[0].startswith("file is ")
    assert "the manifest says" in messages[0]
    assert messages[1] == "offsets are not strictly increasing"
    assert messages[2].startswith("timestamps span")
    assert "the manifest says 1..2" in messages[2]
    assert {f.path for f in report.problems} == {
        f"{partition.directory}/{written.path}",
        f"{partition.directory}/{path}",
    }
    assert (report.segments, report.records) == (3, 7)
    output = cli.run("verify", "t", code=1)
    assert output.stdout.count("error: t-0: ") == 3
    assert "3 problem(s)" in output.stderr


def test_verify_finds_data_object_ranges_and_their_manifest_disagreeing(local_cli: Cli) -> None:
    """Layout 3: ranges of data objects whose checksum is right but whose manifest entry lies
    about them, and an object cut short of a range it holds."""
    import uuid

    import pyarrow as pa
    from kstore.cli.verify import verify_topic

    from kstore.layout import topic_data_dir
    from kstore.segments import checksum, encode_arrow

    cli = local_cli
    cli.run("topics", "create", "t")
    cli.run("produce", "t", input="a\nb\n")
    store = cli.store()
    partition = store.partition("t", 0)
    (first,) = partition.state().segments
    assert first.byte_range is not None  # the premise: a producer wrote a data object
    incarnation = topic_data_dir("t", store.topic("t").topic_id)
    head = b"another partition's range"  # each range starts past the object's first byte

    def add(body: dict[str, Any], blob: bytes, stored: bytes) -> str:
        """Commit ``blob`` as this partition's range of a new data object holding ``stored``
        after ``head``; returns the object's path in the store."""
        path = f"_data/{int(time.time() * 1000):013d}-{uuid.uuid4().hex}.kdat"
        store.storage.put_if_absent(f"{incarnation}/{path}", head + stored)
        ranged = {
            **body,
            "path": path,
            "range": [len(head), len(blob)],
            "size": len(blob),
            "checksum": checksum(blob),
            "format": "arrow",
        }
        partition.commit_actions(lambda state: [{"add": ranged}], operation="TEST")
        return f"{incarnation}/{path}"

    # 1. A dense range whose manifest timestamps are wrong.
    dense = encode_arrow(_table([b"c", b"d"]), "uncompressed").to_pybytes()
    stamps_wrong = add(
        {
            "baseOffset": 2,
            "lastOffset": 3,
            "records": 2,
            "minTimestamp": 1,
            "maxTimestamp": 2,
            "sparse": False,
        },
        dense,
        dense,
    )
    # 2. A sparse range whose offsets go backwards.
    table = _table([b"e", b"f", b"g"]).append_column("offset", pa.array([4, 7, 6], pa.int64()))
    sparse = encode_arrow(table, "uncompressed").to_pybytes()
    stamp = table.column("timestamp")[0].value // 1000
    backwards = add(
        {
            "baseOffset": 4,
            "lastOffset": 7,
            "records": 3,
            "minTimestamp": stamp,
            "maxTimestamp": stamp,
            "sparse": True,
        },
        sparse,
        sparse,
    )
    # 3. A range the object is cut short of (its last 10 bytes lost).
    tail = encode_arrow(_table([b"h"]), "uncompressed").to_pybytes()
    short = add(
        {
            "baseOffset": 8,
            "lastOffset": 8,
            "records": 1,
            "minTimestamp": stamp,
            "maxTimestamp": stamp,
            "sparse": False,
        },
        tail,
        tail[:-10],
    )
    report = verify_topic(store, "t")
    by_path: dict[str | None, list[str]] = {}
    for problem in report.problems:
        by_path.setdefault(problem.path, []).append(problem.message)
    assert set(by_path) == {stamps_wrong, backwards, short}, by_path
    start, length = len(head), len(tail)
    assert sorted(by_path[short]) == [
        f"data object is {start + length - 10} bytes, the range {start}+{length} ends at "
        f"{start + length}",
        f"range {start}+{length} is cut short at {length - 10} bytes",
    ]
    assert by_path[backwards] == ["offsets are not strictly increasing"]
    (timestamps,) = by_path[stamps_wrong]
    assert timestamps.startswith("timestamps span")
    assert "the manifest says 1..2" in timestamps
    assert {f.partition for f in report.problems} == {0}
    assert report.warnings == []
    assert (report.segments, report.records) == (4, 8)
    output = cli.run("verify", "t", code=1)
    assert output.stdout.count("error: t-0: ") == 4
    assert "4 problem(s)" in output.stderr


def _table(values: list[bytes]) -> Any:
    import pyarrow as pa

    from kstore.segments import RECORD_SCHEMA, TIMESTAMP_TYPE

    n = len(values)
    return pa.table(
        {
            "key": pa.nulls(n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "timestamp": pa.array([int(time.time() * 1e6)] * n, TIMESTAMP_TYPE),
            "headers": pa.nulls(n, RECORD_SCHEMA.field("headers").type),
        }
    )


# -- store selection, secrets, errors ---------------------------------------------------------------


def test_store_selection(
    memory_cli: Cli, local_cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local_cli.run("topics", "create", "from-local")
    memory_cli.run("topics", "create", "from-memory")

    def topics(*args: str, env: dict[str, str] | None = None) -> list[str]:
        result = runner.invoke(app, [*args, "-o", "json"], env=env)
        assert result.exit_code == 0, result.stderr
        return [t["topic"] for t in json.loads(result.stdout)]

    # Before the command, after it, and the environment; after the command wins.
    assert topics("--store", local_cli.url, "topics", "list") == ["from-local"]
    assert topics("--store", local_cli.url, "topics", "list", "--store", memory_cli.url) == [
        "from-memory"
    ]
    assert topics("topics", "list", env={"KSTORE_STORE": memory_cli.url}) == ["from-memory"]
    assert topics("topics", "list", "-s", local_cli.url, env={"KSTORE_STORE": memory_cli.url}) == [
        "from-local"
    ]
    config = tmp_path / "kstore.toml"
    config.write_text(f'store = "{local_cli.url}"\n[options]\nauto_mkdir = true\n')
    assert topics("--config-file", str(config), "topics", "list") == ["from-local"]
    assert topics("topics", "list", env={"KSTORE_CONFIG": str(config)}) == ["from-local"]
    assert topics(
        "topics", "list", env={"KSTORE_CONFIG": str(config), "KSTORE_STORE": memory_cli.url}
    ) == ["from-memory"]
    result = runner.invoke(app, ["topics", "list"])
    assert result.exit_code == 2
    assert "no store given" in flat(result.stderr)
    result = runner.invoke(app, ["topics", "list", "--config-file", str(tmp_path / "missing.toml")])
    assert result.exit_code == 2
    assert "does not exist" in flat(result.stderr)


def test_bad_store_urls(tmp_path: Path) -> None:
    cases = {
        str(tmp_path / "nothing-here"): "no kstore store at",
        (tmp_path / "nothing-here").as_uri(): "no kstore store at",
        "memory://never-created/store": "no kstore store at",
        "nosuchfs://bucket/x": "unsupported filesystem 'nosuchfs'",
    }
    for url, message in cases.items():
        result = runner.invoke(app, ["topics", "list", "--store", url])
        assert result.exit_code == 1, (url, result.stderr)
        assert message in result.stderr, (url, result.stderr)
        assert result.stderr.count("\n") == 1  # one line, no traceback
    assert not (tmp_path / "nothing-here").exists()  # a read never creates a store
    # A corrupt store marker.
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "_kstore.json").write_text("{not json")
    result = runner.invoke(app, ["topics", "list", "--store", str(tmp_path / "corrupt")])
    assert result.exit_code == 1
    assert "_kstore.json: not valid JSON" in result.stderr


def test_secrets_are_never_printed(memory_cli: Cli, tmp_path: Path) -> None:
    secret = "Sup3r-Secret-Value-42"
    memory_cli.run("topics", "create", "t")
    config = tmp_path / "kstore.toml"
    config.write_text(f'[options]\nsecret = "{secret}"\n')
    # Errors whose text holds the secret (here in the URL, as a library or botocore message
    # might hold it): every occurrence is replaced, in the error line and in --debug tracebacks.
    missing = f"memory://{secret}/store"
    for args, env in (
        (["topics", "list", "-s", missing, "-O", f"secret={secret}"], {}),
        (
            [
                "--debug",
                "topics",
                "list",
                "-s",
                missing,
                "-O",
                f"client_kwargs.aws_secret_access_key={secret}",
            ],
            {},
        ),
        (["topics", "describe", "t", "-s", missing, "--debug"], {"KSTORE_OPTION_TOKEN": secret}),
        (["--config-file", str(config), "topics", "list", "-s", missing, "--debug"], {}),
        (["topics", "list", "-s", f"nosuchfs://user:{secret}@host/x", "--debug"], {}),
        (["topics", "list", "-s", f"s3://AKIA:{secret}@host/x", "-O", "key=AKIA", "--debug"], {}),
        (
            ["topics", "list", "-s", memory_cli.url, "-O", secret],
            {},
        ),  # no KEY= at all: a usage error
    ):
        result = runner.invoke(app, args, env=env)
        assert result.exit_code in (1, 2), (args, result.stderr)
        assert secret not in result.stdout + result.stderr, (args, result.stderr)
        assert "***" in result.stderr or result.exit_code == 2, (args, result.stderr)
    # info shows the options, secrets hidden; the environment's secrets are hidden too.
    result = runner.invoke(
        app,
        ["info", "-s", memory_cli.url, "-o", "json"],
        env={"KSTORE_OPTION_SECRET": secret, "KSTORE_OPTION_CLIENT_KWARGS__REGION_NAME": "r1"},
    )
    assert result.exit_code == 0, result.stderr
    assert secret not in result.stdout + result.stderr
    assert json.loads(result.stdout)["storage_options"] == {
        "secret": "***",
        "client_kwargs": {"region_name": "r1"},
    }
    info = memory_cli.json("info")
    assert (info["store"], info["topics"], info["groups"], info["format_version"]) == (
        memory_cli.url,
        1,
        0,
        1,
    )
    assert "PROPERTY" in memory_cli.run("info").stdout


def test_debug_shows_the_traceback(memory_cli: Cli) -> None:
    memory_cli.run("topics", "create", "t")
    result = memory_cli.run("topics", "describe", "missing", code=1)
    assert result.stderr.count("\n") == 1
    result = memory_cli.run("topics", "describe", "missing", "--debug", code=1)
    assert "Traceback (most recent call last)" in result.stderr
    assert (
        result.stderr.strip().splitlines()[-1].startswith("error: topic 'missing' does not exist")
    )
    result = runner.invoke(
        app, ["topics", "describe", "missing", *memory_cli.store_args()], env={"KSTORE_DEBUG": "1"}
    )
    assert "Traceback" in result.stderr


def test_version_and_usage() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"kstore {kstore.__version__}\n"
    assert runner.invoke(app, ["nosuchcommand"]).exit_code == 2
    assert runner.invoke(app, ["topics", "list", "--nosuchoption"]).exit_code == 2
    result = runner.invoke(app, [])
    assert "Usage" in result.stdout + result.stderr


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_every_command_help_has_an_example() -> None:
    import typer.main

    paths = list(_commands(typer.main.get_command(app)))
    names = {" ".join(p) for p in paths}
    assert {
        "topics create",
        "topics list",
        "topics describe",
        "topics alter",
        "topics delete",
        "topics add-partitions",
        "produce",
        "consume",
        "groups list",
        "groups describe",
        "groups reset-offsets",
        "groups delete",
        "verify",
        "info",
    } <= names
    for path in paths:
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.stderr)
        assert "Examples" in result.stdout, path
        assert "kstore " + " ".join(path) in result.stdout, path


def test_producer_and_cli_agree(memory_cli: Cli) -> None:
    """Records written by the library read back through the CLI, and the reverse."""
    memory_cli.run("topics", "create", "t")
    with Producer(memory_cli.store(), linger_ms=1) as producer:
        producer.send("t", value=b"\xff\xfe", key=b"k", headers=[("h", b"\x00")]).get(10)
    (record,) = [
        json.loads(line)
        for line in memory_cli.run("consume", "t", "-o", "json").stdout.splitlines()
    ]
    assert base64.b64decode(record["value"]) == b"\xff\xfe"
    assert record["headers"] == [{"key": "h", "value": "\x00"}]
    assert memory_cli.run("consume", "t", "-o", "hex").stdout == "fffe\n"
