"""The kafka-* tools' common invocations on the kstore command line: Kafka's flags work where
kstore has the same thing, and are refused with one line naming the kstore form where not."""

from __future__ import annotations

from pathlib import Path

import pytest
from kstore.cli.app import app
from typer.testing import CliRunner, Result

from kstore import Producer, Store

runner = CliRunner()


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    store = Store(str(root))
    store.create_topic("orders", 2)
    with Producer(store) as p:
        for i in range(6):
            p.send("orders", b"v%d" % i, key=b"k%d" % i, partition=i % 2)
    return root


def kstore(store: Path, *args: str, input: str | None = None) -> Result:
    return runner.invoke(app, [*args, "--store", str(store)], input=input)


def one_error_line(result: Result, code: int) -> str:
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    return lines[0]


# -- 1. Kafka's flags -------------------------------------------------------------------------------


def test_topic_flag_is_the_topic_argument(store_dir: Path) -> None:
    # kafka-topics --create --topic T --partitions N, with the action as a flag or a command
    result = kstore(store_dir, "topics", "create", "--topic", "users", "--partitions", "3")
    assert result.exit_code == 0, result.stderr
    result = kstore(store_dir, "topics", "--create", "--topic=audit", "--partitions", "2")
    assert result.exit_code == 0, result.stderr
    store = Store(str(store_dir))
    assert store.topic("users").partitions == 3
    assert store.topic("audit").partitions == 2
    # kafka-topics --describe --topic T
    result = kstore(store_dir, "topics", "--describe", "--topic", "orders", "-o", "json")
    assert result.exit_code == 0, result.stderr
    assert '"orders"' in result.stdout
    # kafka-topics --alter --topic T --partitions N is add-partitions
    result = kstore(store_dir, "topics", "--alter", "--topic", "audit", "--partitions", "4")
    assert result.exit_code == 0, result.stderr
    assert Store(str(store_dir)).topic("audit").partitions == 4
    # kafka-console-consumer --topic T --from-beginning
    result = kstore(store_dir, "consume", "--topic", "orders", "--from-beginning")
    assert result.exit_code == 0, result.stderr
    assert sorted(result.stdout.split()) == [f"v{i}" for i in range(6)]
    # kafka-console-producer --topic T
    result = kstore(store_dir, "produce", "--topic", "orders", input="new\n")
    assert result.exit_code == 0, result.stderr
    # the command already is the action: the flag is accepted and changes nothing
    result = kstore(store_dir, "topics", "describe", "--describe", "--topic", "orders")
    assert result.exit_code == 0, result.stderr


def test_group_flag_is_the_group_argument(store_dir: Path) -> None:
    result = kstore(store_dir, "consume", "orders", "--group", "g1", "--from-beginning")
    assert result.exit_code == 0, result.stderr
    result = kstore(store_dir, "groups", "--describe", "--group", "g1", "-o", "json")
    assert result.exit_code == 0, result.stderr
    assert '"g1"' in result.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["topics", "create", "x", "--bootstrap-server", "localhost:9092"],
            "--bootstrap-server: a store is not a broker: name it with --store URL",
        ),
        (
            ["consume", "orders", "--bootstrap-server=localhost:9092"],
            "--bootstrap-server: a store is not a broker",
        ),
        (["produce", "orders", "--broker-list", "b:9092"], "--broker-list: a store is not"),
        (
            ["topics", "create", "x", "--replication-factor", "3"],
            "--replication-factor: kstore keeps no replicas",
        ),
        (["groups", "list", "--all-groups"], "only 'kstore groups describe' takes --all-groups"),
        (["groups", "list", "--topic", "orders"], "'kstore groups list' takes no --topic"),
        (
            ["topics", "create", "x", "--describe"],
            "--describe is 'kstore topics describe' here, not 'kstore topics create'",
        ),
        (["topics", "--create", "--list"], "give one of --create, --list"),
        (["consume", "orders", "--whitelist", "o.*"], "--whitelist: name the topic"),
    ],
)
def test_kafka_flags_refused_with_the_kstore_form(
    store_dir: Path, args: list[str], fragment: str
) -> None:
    before = sorted(p.name for p in store_dir.rglob("*"))
    line = one_error_line(kstore(store_dir, *args), 2)
    assert fragment in line
    assert sorted(p.name for p in store_dir.rglob("*")) == before


def test_usage_errors_are_one_line(store_dir: Path) -> None:
    line = one_error_line(kstore(store_dir, "topics", "create", "x", "--bogus"), 2)
    assert line == "error: No such option: --bogus (see 'kstore topics create --help')"
    line = one_error_line(kstore(store_dir, "topics", "create", "x", "-p", "abc"), 2)
    assert "'--partitions'" in line
    assert "valid integer" in line
    line = one_error_line(runner.invoke(app, ["nosuchcommand"]), 2)
    assert "No such command 'nosuchcommand'" in line
    # a bare group still shows its help
    result = runner.invoke(app, ["topics"])
    assert "Usage" in result.stdout + result.stderr


# -- 2. what was missing ----------------------------------------------------------------------------


def test_topics_list_names_only_and_pattern(store_dir: Path) -> None:
    for name in ("orders-eu", "users"):
        assert kstore(store_dir, "topics", "create", name).exit_code == 0
    result = kstore(store_dir, "topics", "list", "--names-only")
    assert result.stdout == "orders\norders-eu\nusers\n"
    # the whole name matches, as Kafka's --topic regex on --list
    result = kstore(store_dir, "topics", "list", "orders.*", "--names-only")
    assert result.stdout == "orders\norders-eu\n"
    result = kstore(store_dir, "topics", "list", "order", "--names-only")
    assert result.stdout == ""
    # kafka-topics --list [--topic REGEX] prints names only
    result = kstore(store_dir, "topics", "--list")
    assert result.stdout == "orders\norders-eu\nusers\n"
    result = kstore(store_dir, "topics", "--list", "--topic", "u.*")
    assert result.stdout == "users\n"
    line = one_error_line(kstore(store_dir, "topics", "list", "("), 2)
    assert "PATTERN '(' is not a regular expression" in line


def test_groups_describe_every_partition_all_groups_and_members(store_dir: Path) -> None:
    from kstore.groups import Group
    from kstore.records import OffsetAndMetadata, TopicPartition

    store = Store(str(store_dir))
    # a committed offset on partition 0 only: partition 1's 3 records are unread too
    Group(store, "g1").commit_offsets(
        {TopicPartition("orders", 0): OffsetAndMetadata(2)}, member_id=None, generation=-1
    )
    Group(store, "g2").commit_offsets(
        {TopicPartition("orders", 1): OffsetAndMetadata(3)}, member_id=None, generation=-1
    )
    result = kstore(store_dir, "groups", "describe", "g1", "-o", "json")
    assert result.exit_code == 0, result.stderr
    import json

    data = json.loads(result.stdout)
    rows = [(p["partition"], p["current_offset"], p["lag"]) for p in data["partitions"]]
    assert rows == [(0, 2, 1), (1, None, None)]
    assert data["uncommitted_partitions"] == 1
    result = kstore(store_dir, "groups", "describe", "g1")
    assert "No committed offset: 1 partition(s)" in result.stdout
    # kafka-consumer-groups --describe --all-groups
    result = kstore(store_dir, "groups", "--describe", "--all-groups", "-o", "json")
    assert result.exit_code == 0, result.stderr
    assert [g["group"] for g in json.loads(result.stdout)] == ["g1", "g2"]
    result = kstore(store_dir, "groups", "describe", "--all-groups")
    assert "Group: g1" in result.stdout
    assert "Group: g2" in result.stdout
    # --members: the members table alone
    result = kstore(store_dir, "groups", "describe", "g1", "--members", "-o", "json")
    assert "partitions" not in json.loads(result.stdout)
    result = kstore(store_dir, "groups", "describe", "g1", "--members")
    assert "CURRENT-OFFSET" not in result.stdout
    assert "MEMBER-ID" in result.stdout
    line = one_error_line(kstore(store_dir, "groups", "describe", "g1", "--all-groups"), 2)
    assert "give a GROUP or --all-groups (not both)" in line


def test_groups_delete_offsets(store_dir: Path) -> None:
    import json

    from kstore.groups import Group
    from kstore.records import OffsetAndMetadata, TopicPartition

    store = Store(str(store_dir))
    store.create_topic("users", 1)
    Group(store, "g").commit_offsets(
        {
            TopicPartition("orders", 0): OffsetAndMetadata(1),
            TopicPartition("orders", 1): OffsetAndMetadata(2),
            TopicPartition("users", 0): OffsetAndMetadata(0),
        },
        member_id=None,
        generation=-1,
    )
    result = kstore(store_dir, "groups", "delete-offsets", "g", "--topic", "orders:1", "-o", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == [{"topic": "orders", "partition": 1}]
    # kafka-consumer-groups --delete-offsets --group G --topic T (the whole topic)
    result = kstore(store_dir, "groups", "--delete-offsets", "--group", "g", "--topic", "orders")
    assert result.exit_code == 0, result.stderr
    assert "deleted" in result.stdout
    offsets = Group(Store(str(store_dir)), "g").state().offsets
    assert set(offsets) == {TopicPartition("users", 0)}
    # read back by a fresh replay too
    result = kstore(store_dir, "groups", "describe", "g", "-o", "json")
    rows = {
        (p["topic"], p["partition"]): p["current_offset"]
        for p in json.loads(result.stdout)["partitions"]
    }
    assert rows == {("users", 0): 0}
    result = kstore(store_dir, "groups", "delete-offsets", "g", "--topic", "orders")
    assert result.exit_code == 0
    assert "nothing changed" in result.stderr
    line = one_error_line(kstore(store_dir, "groups", "delete-offsets", "nope", "--topic", "x"), 1)
    assert "consumer group 'nope' does not exist" in line


def test_delete_records(store_dir: Path, tmp_path: Path) -> None:
    import json

    # orders: partition 0 holds v0 v2 v4 (offsets 0-2), partition 1 v1 v3 v5
    result = kstore(store_dir, "delete-records", "orders", "-p", "0", "--offset", "2", "-o", "json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == [{"topic": "orders", "partition": 0, "log_start_offset": 2}]
    result = kstore(store_dir, "consume", "orders", "-p", "0", "--from-beginning")
    assert result.stdout.split() == ["v4"]
    # kafka-delete-records --offset-json-file, -1 meaning the end
    plan = tmp_path / "offsets.json"
    plan.write_text(
        json.dumps(
            {"partitions": [{"topic": "orders", "partition": 1, "offset": -1}], "version": 1}
        )
    )
    result = kstore(store_dir, "delete-records", "--offset-json-file", str(plan))
    assert result.exit_code == 0, result.stderr
    desc = Store(str(store_dir)).describe_topic("orders")
    assert [(p.log_start_offset, p.log_end_offset) for p in desc.partitions] == [(2, 3), (3, 3)]
    # the start offset never moves back
    result = kstore(store_dir, "delete-records", "orders", "--offset", "1")
    assert result.exit_code == 0, result.stderr
    assert Store(str(store_dir)).describe_topic("orders").partitions[0].log_start_offset == 2
    line = one_error_line(kstore(store_dir, "delete-records", "orders", "--offset", "9"), 1)
    assert "offset 9 is past the end offset 3" in line
    line = one_error_line(kstore(store_dir, "delete-records", "orders"), 2)
    assert "give TOPIC and --offset, or --offset-json-file" in line
    plan.write_text('{"partitions": [{"topic": "orders", "partition": "0"}]}')
    line = one_error_line(kstore(store_dir, "delete-records", "--offset-json-file", str(plan)), 2)
    assert "expected {" in line


# -- 3. the console clients' properties -------------------------------------------------------------


def test_console_producer_sends_what_the_topic_allows(store_dir: Path) -> None:
    big = "x" * (2 * 1024 * 1024)  # over the client's 1 MiB default
    result = kstore(store_dir, "topics", "create", "blobs", "-c", "max.message.bytes=5000000")
    assert result.exit_code == 0, result.stderr
    result = kstore(store_dir, "produce", "blobs", input=big + "\n")
    assert result.exit_code == 0, result.stderr
    result = kstore(store_dir, "consume", "blobs")
    assert result.stdout == big + "\n"
    # the topic's limit still holds
    result = kstore(store_dir, "produce", "orders", input=big + "\n")
    assert result.exit_code == 1
    assert "max.message.bytes" in result.stderr


def test_producer_and_consumer_properties(store_dir: Path) -> None:
    # Kafka's names map to kstore's: a producer limited to 100 bytes refuses 200
    result = kstore(
        store_dir,
        "produce",
        "orders",
        "--producer-property",
        "max.request.size=100",
        input="y" * 200 + "\n",
    )
    assert result.exit_code == 1
    assert "max_request_size=100" in result.stderr
    result = kstore(
        store_dir, "produce", "orders", "--producer-property", "linger.ms=0", input="z\n"
    )
    assert result.exit_code == 0, result.stderr
    line = one_error_line(
        kstore(store_dir, "produce", "orders", "--producer-property", "nope=1", input="z\n"), 1
    )
    assert "unknown producer config 'nope'" in line
    result = kstore(store_dir, "consume", "orders", "--consumer-property", "max.poll.records=1")
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.split()) == 7  # six records and "z"
    line = one_error_line(
        kstore(store_dir, "consume", "orders", "--consumer-property", "group.id=g"), 2
    )
    assert "--consumer-property group.id: use --group" in line
    line = one_error_line(kstore(store_dir, "consume", "orders", "--consumer-property", "bogus"), 2)
    assert "--consumer-property expects NAME=VALUE" in line


def test_console_property_flags(store_dir: Path) -> None:
    # kafka-console-producer --property parse.key=true --property key.separator=:
    result = kstore(
        store_dir,
        "produce",
        "--topic",
        "orders",
        "--property",
        "parse.key=true",
        "--property",
        "key.separator=:",
        "-p",
        "0",
        input="kk:vv\n",
    )
    assert result.exit_code == 0, result.stderr
    # parse.key alone: Kafka's tab
    result = kstore(
        store_dir, "produce", "orders", "--property", "parse.key=true", "-p", "0", input="kt\tvt\n"
    )
    assert result.exit_code == 0, result.stderr
    # kafka-console-consumer --property print.key=true --property key.separator=,
    result = kstore(
        store_dir,
        "consume",
        "orders",
        "-p",
        "0",
        "--property",
        "print.key=true",
        "--property=key.separator=,",
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == ["kk,vv", "kt,vt"]
    line = one_error_line(kstore(store_dir, "consume", "orders", "--property", "print.foo=1"), 2)
    assert "--property 'print.foo=1': 'kstore consume' knows print.key" in line


# -- 4. store mistakes ------------------------------------------------------------------------------


def test_unknown_storage_option_on_a_local_store_is_refused(store_dir: Path) -> None:
    result = kstore(store_dir, "topics", "list", "--option", "foo=bar")
    line = one_error_line(result, 2)
    assert "storage option 'foo' means nothing to a store on the local disk" in line
    result = runner.invoke(
        app,
        ["topics", "list", "--store", store_dir.as_uri()],
        env={"KSTORE_OPTION_CLIENT_KWARGS__ENDPOINT_URL": "http://127.0.0.1:1"},
    )
    assert "storage option 'client_kwargs'" in one_error_line(result, 2)
    # what a local store does read is accepted
    result = kstore(store_dir, "topics", "list", "--option", "timeout_ms=5000")
    assert result.exit_code == 0, result.stderr


def test_no_store_over_lost_marker_or_inside_another(store_dir: Path) -> None:
    # the marker deleted: a new one would take over the old topics under a new store id
    marker = store_dir / "_kstore.json"
    saved = marker.read_bytes()
    marker.unlink()
    line = one_error_line(kstore(store_dir, "topics", "create", "x"), 1)
    assert "holds topics/ but no _kstore.json" in line
    assert not marker.exists()
    marker.write_bytes(saved)
    # a store inside another store's topic folder
    inner = store_dir / "topics" / "orders" / "nested"
    line = one_error_line(kstore(inner, "topics", "create", "x"), 1)
    assert f"is inside the store at {str(store_dir)!r}" in line
    assert not inner.exists()


def test_http_and_ftp_stores_name_the_cause() -> None:
    for url in ("http://127.0.0.1:9/x", "https://example.invalid/ks", "ftp://127.0.0.1:9/x"):
        line = one_error_line(runner.invoke(app, ["topics", "list", "--store", url]), 2)
        assert "cannot hold a store" in line or "offers no atomic create" in line, line
        assert "use a local path, s3://bucket/prefix or memory://name" in line


def test_ftp_store_prints_no_traceback() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kstore.cli.app",
            "topics",
            "list",
            "--store",
            "ftp://127.0.0.1:9/x",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("error: store URL scheme 'ftp://'")


# -- 5. help text -----------------------------------------------------------------------------------


def test_help_paragraphs_wrap_to_the_terminal() -> None:
    import typer

    def walk(command: object, path: str) -> None:
        help_text = getattr(command, "help", None) or ""
        for paragraph in help_text.split("\n\n"):
            assert "\n" not in paragraph, (path, paragraph)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "kstore")
    result = runner.invoke(app, ["groups", "describe", "--help"], terminal_width=80)
    assert "one with no committed offset shows '-'" in " ".join(result.stdout.split())
    assert "[[GROUP]]" not in result.stdout


def test_usage_lines_bracket_optional_arguments_once() -> None:
    """kstore verify, topics describe and the maintenance verbs read [[TOPIC]...]...."""
    import click
    import typer

    def walk(command: click.Command, path: str) -> None:
        usage = " ".join(command.collect_usage_pieces(click.Context(command, info_name=path)))
        assert "[[" not in usage, (path, usage)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "kstore")
    for args in (["verify"], ["topics", "describe"]):
        usage = runner.invoke(app, [*args, "--help"]).stdout.strip().splitlines()[0].split()
        assert usage == ["Usage:", "kstore", *args, "[OPTIONS]", "[TOPIC]..."]


def test_delete_offsets_refused_while_a_member_reads_the_topic(store_dir: Path) -> None:
    from kstore import Consumer
    from kstore.groups import Group

    store = Store(str(store_dir))
    consumer = Consumer("orders", store=store, group_id="live", auto_offset_reset="earliest")
    try:
        consumer.poll(timeout_ms=2000)
        consumer.commit()
        before = Group(store, "live").state().offsets
        assert before
        line = one_error_line(
            kstore(store_dir, "groups", "delete-offsets", "live", "--topic", "orders"), 1
        )
        assert "has a live member subscribed to 'orders'" in line
        assert Group(Store(str(store_dir)), "live").state().offsets == before
    finally:
        consumer.close(autocommit=False)
