"""The CLI's output object (text and JSON) and its shared options (``--store``, ``--option``,
``--config-file``, ``--output``, ``--debug``) given before the command, after it and between a
group and its command."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kstore.cli.app import app
from kstore.cli.common import begin_invocation, debug_enabled, redactor
from kstore.cli.options import Shared
from kstore.cli.output import Column, JsonOutput, OutputFormat, TextOutput, make_output
from typer.main import get_command
from typer.testing import CliRunner

runner = CliRunner()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("KSTORE_"):
            monkeypatch.delenv(name)
    begin_invocation()


@dataclass
class Part:
    partition: int
    records: int | None


COLUMNS = [
    Column("TOPIC", "topic"),
    Column("PARTITIONS", "partitions", right=True),
    Column("POLICY", lambda row: row["policy"].upper()),
]
ROWS = [
    {"topic": "orders", "partitions": 12, "policy": "delete"},
    {"topic": "users", "partitions": None, "policy": "compact"},
]


# -- the output object ------------------------------------------------------------------------------


def test_text_table_aligns_numbers_and_shows_none_as_a_dash(
    capsys: pytest.CaptureFixture[str],
) -> None:
    TextOutput().table(ROWS, COLUMNS)
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split() == ["TOPIC", "PARTITIONS", "POLICY"]
    assert lines[2].split() == ["orders", "12", "DELETE"]
    assert lines[3].split() == ["users", "-", "COMPACT"]
    # PARTITIONS is right-aligned: 12 and - end in the header's last column.
    end = lines[0].index("PARTITIONS") + len("PARTITIONS")
    assert lines[2][end - 2 : end] == "12"
    assert lines[3][end - 1] == "-"
    assert err == ""


def test_json_table_prints_the_rows_themselves(capsys: pytest.CaptureFixture[str]) -> None:
    JsonOutput().table(ROWS, COLUMNS, empty="No topics.")
    out, err = capsys.readouterr()
    assert json.loads(out) == ROWS
    assert err == ""


def test_an_empty_table_is_its_message_in_text_and_an_empty_array_in_json(
    capsys: pytest.CaptureFixture[str],
) -> None:
    TextOutput().table([], COLUMNS, empty="No topics.")
    assert capsys.readouterr() == ("", "No topics.\n")
    TextOutput().table([], COLUMNS)  # no message: the table's headers alone
    assert capsys.readouterr().out.split()[:3] == ["TOPIC", "PARTITIONS", "POLICY"]
    JsonOutput().table([], COLUMNS, empty="No topics.")
    assert capsys.readouterr() == ("[]\n", "")


def test_columns_read_keys_attributes_indexes_and_functions() -> None:
    assert Column("A", "records").cell(Part(0, 7)) == 7
    assert Column("A", "records").cell({"records": 8}) == 8
    assert Column("A", 1).cell(("x", 9)) == 9
    assert Column("A", lambda p: p.partition + 1).cell(Part(4, None)) == 5
    with pytest.raises(KeyError):
        Column("A", "missing").cell({"records": 8})


def test_record_is_the_document_in_json_and_the_view_in_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    document = {"topic": "orders", "created": True}
    views: list[str] = []

    def view(text: TextOutput) -> None:
        views.append("drawn")
        text.line("Topic: orders")
        text.lines(["a", "b"])
        text.table([Part(0, 3)], [Column("PARTITION", "partition"), Column("RECORDS", "records")])

    JsonOutput().record(document, view)
    out, err = capsys.readouterr()
    assert json.loads(out) == document
    assert views == []
    assert err == ""

    TextOutput().record(document, view)
    out, err = capsys.readouterr()
    assert views == ["drawn"]
    assert out.splitlines()[:3] == ["Topic: orders", "a", "b"]
    assert out.splitlines()[3].split() == ["PARTITION", "RECORDS"]
    assert err == ""

    TextOutput().record(document)  # no view: the messages say it all
    assert capsys.readouterr() == ("", "")


def test_properties_view(capsys: pytest.CaptureFixture[str]) -> None:
    TextOutput().properties({"store": "memory://x", "topics": 3})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["PROPERTY", "VALUE"]
    assert [line.split() for line in lines[2:]] == [["store", "memory://x"], ["topics", "3"]]


def test_messages_are_for_people_notices_for_everyone(capsys: pytest.CaptureFixture[str]) -> None:
    TextOutput().message("Created topic 'orders'.")
    TextOutput().notice("error: orders-0: failed")
    assert capsys.readouterr() == ("", "Created topic 'orders'.\nerror: orders-0: failed\n")
    JsonOutput().message("Created topic 'orders'.")
    JsonOutput().notice("error: orders-0: failed")
    assert capsys.readouterr() == ("", "error: orders-0: failed\n")


def test_every_output_is_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    secret = "s3cr3t-value-123"
    redactor().add([secret])
    rows = [{"topic": f"t-{secret}", "partitions": 1, "policy": "delete"}]
    for out in (TextOutput(), JsonOutput()):
        out.table(rows, COLUMNS)
        out.record({"url": f"s3://k:{secret}@b"}, lambda text: text.line(secret))
        out.message(f"message {secret}")
        out.notice(f"notice {secret}")
    captured = capsys.readouterr()
    assert secret not in captured.out + captured.err
    assert "***" in captured.out
    assert "***" in captured.err


def test_progress_is_drawn_only_for_people_on_a_terminal() -> None:
    def total() -> int:
        raise AssertionError("the total is not wanted without a bar")

    with JsonOutput().progress("verifying", total) as bar:
        assert bar is None
    with TextOutput().progress("verifying", total) as bar:  # stderr is no terminal here
        assert bar is None


def test_make_output() -> None:
    assert isinstance(make_output(OutputFormat.json), JsonOutput)
    assert isinstance(make_output(OutputFormat.table), TextOutput)


# -- the shared options -----------------------------------------------------------------------------


def test_later_levels_win_and_options_add_up(tmp_path: Path) -> None:
    shared = Shared()
    shared.given(store="file:///a", option=["k=1"], output=OutputFormat.json)
    shared.given(store=None, option=None, config_file=None, output=None, debug=None)
    assert (shared.store, shared.options, shared.output_format) == (
        "file:///a",
        ["k=1"],
        OutputFormat.json,
    )
    config = tmp_path / "kstore.toml"
    config.write_text('store = "file:///c"\n[options]\nk = 0\nm = 4\n')
    shared.given(store="memory://b", option=["k=2", "j=3"], config_file=config)
    assert shared.store == "memory://b"
    assert shared.options == ["k=1", "k=2", "j=3"]
    assert shared.config_file == config
    settings = shared.settings()  # the config file below the command line
    assert (settings.url, settings.options) == ("memory://b", {"k": 2, "m": 4, "j": 3})
    assert isinstance(shared.output, JsonOutput)
    assert not debug_enabled()
    shared.given(debug=True)
    assert debug_enabled()


def test_every_command_accepts_the_shared_options() -> None:
    def walk(command: Any, path: str) -> list[tuple[str, Any]]:
        found = [(path, command)]
        for name, sub in getattr(command, "commands", {}).items():
            found += walk(sub, f"{path} {name}")
        return found

    commands = walk(get_command(app), "kstore")
    assert len(commands) > 27
    for path, command in commands:
        opts = {opt for param in command.params for opt in param.opts}
        assert {"--store", "-s", "--option", "-O", "--config-file", "--debug"} <= opts, path
        assert {"--output", "-o"} <= opts, path
        outputs = [p for p in command.params if p.name == "output"]
        assert len(outputs) == 1, path  # a command's own --output replaces the shared one


@pytest.fixture
def stores(tmp_path: Path) -> tuple[str, str]:
    """Two stores, each with one topic named after it."""
    urls = []
    for name in ("one", "two"):
        url = str(tmp_path / name)
        result = runner.invoke(app, ["topics", "create", name, "--store", url])
        assert result.exit_code == 0, result.stderr
        urls.append(url)
    return urls[0], urls[1]


def listed(*args: str, env: dict[str, str] | None = None) -> Any:
    result = runner.invoke(app, list(args), env=env)
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return json.loads(result.stdout)


@pytest.mark.parametrize(
    "args",
    [
        ["--store", "{one}", "-o", "json", "topics", "list"],  # before the command
        ["topics", "list", "--store", "{one}", "-o", "json"],  # after it
        ["topics", "--store", "{one}", "list", "--output", "json"],  # between group and command
        ["-s", "{one}", "topics", "-o", "json", "list"],
        ["-o", "json", "topics", "list", "-s", "{one}"],
    ],
)
def test_shared_options_before_between_and_after(stores: tuple[str, str], args: list[str]) -> None:
    one, _ = stores
    rows = listed(*(arg.replace("{one}", one) for arg in args))
    assert [row["topic"] for row in rows] == ["one"]


def test_options_after_the_command_win(stores: tuple[str, str], tmp_path: Path) -> None:
    one, two = stores
    assert listed("--store", one, "topics", "list", "--store", two, "-o", "json")[0]["topic"] == (
        "two"
    )
    assert listed("--store", one, "topics", "--store", two, "list", "-o", "json")[0]["topic"] == (
        "two"
    )
    assert listed("topics", "list", "-s", two, "-o", "json", env={"KSTORE_STORE": one})[0][
        "topic"
    ] == ("two")
    assert listed("topics", "list", "-o", "json", env={"KSTORE_STORE": one})[0]["topic"] == "one"
    config = tmp_path / "kstore.toml"
    config.write_text(f'store = "{one}"\n')
    assert listed("--config-file", str(config), "-o", "json", "topics", "list", "-s", two)[0][
        "topic"
    ] == ("two")
    # -o json before, -o table after: a table.
    result = runner.invoke(app, ["-o", "json", "topics", "list", "-s", one, "-o", "table"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split()[:3] == ["TOPIC", "PARTITIONS", "CLEANUP.POLICY"]


def test_storage_options_add_up_across_levels(stores: tuple[str, str]) -> None:
    one, _ = stores
    info = listed(
        "-O", "auto_mkdir=true", "-O", "timeout_ms=5000", "info", "-O", "timeout_ms=6000",
        "-s", one, "-o", "json",
    )  # fmt: skip
    assert info["storage_options"] == {"auto_mkdir": True, "timeout_ms": 6000}


def test_debug_before_or_after_the_command(tmp_path: Path) -> None:
    missing = str(tmp_path / "typo")
    for args in (
        ["--debug", "topics", "describe", "x", "-s", missing],
        ["topics", "describe", "x", "-s", missing, "--debug"],
    ):
        begin_invocation()
        result = runner.invoke(app, args)
        assert result.exit_code == 1
        assert "Traceback" in result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("error: ")
    result = runner.invoke(app, ["topics", "describe", "x", "-s", missing])
    assert result.exit_code == 1
    assert "Traceback" not in result.stderr


def test_json_before_consume_prints_json_records(stores: tuple[str, str]) -> None:
    one, _ = stores
    result = runner.invoke(app, ["produce", "one", "-s", one], input="hello\n")
    assert result.exit_code == 0, result.stderr
    (record,) = [
        json.loads(line)
        for line in runner.invoke(
            app, ["-o", "json", "consume", "one", "-s", one]
        ).stdout.splitlines()
    ]
    assert record["value"] == "hello"
    # Its own --output wins: hex after the command.
    result = runner.invoke(app, ["-o", "json", "consume", "one", "-s", one, "-o", "hex"])
    assert result.stdout == b"hello".hex() + "\n"
    assert runner.invoke(app, ["consume", "one", "-s", one]).stdout == "hello\n"


def test_maintain_takes_the_store_before_its_subcommand(stores: tuple[str, str]) -> None:
    one, _ = stores
    status = listed("maintain", "--store", one, "status", "-o", "json")
    assert [t["topic"] for t in status["topics"]] == ["one"]


@pytest.mark.parametrize(
    "args",
    [
        ["--option", "no-equals", "topics", "list", "-s", "{one}"],
        ["topics", "list", "-s", "{one}", "--option", "no-equals"],
        ["topics", "list", "-s", "{one}", "-O", "=value"],
    ],
)
def test_bad_option_syntax_is_a_usage_error(stores: tuple[str, str], args: list[str]) -> None:
    one, _ = stores
    result = runner.invoke(app, [arg.replace("{one}", one) for arg in args])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: --option expects KEY=VALUE")
    assert "no-equals" not in line
    assert "value" not in line.partition("(")[0]
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["-o", "yaml", "topics", "list", "-s", "{one}"],
        ["topics", "list", "-s", "{one}", "-o", "yaml"],
        ["topics", "--output", "yaml", "list", "-s", "{one}"],
        ["consume", "one", "-s", "{one}", "-o", "table"],  # consume's own: plain, json, hex
    ],
)
def test_unknown_output_format_is_a_usage_error(stores: tuple[str, str], args: list[str]) -> None:
    one, _ = stores
    result = runner.invoke(app, [arg.replace("{one}", one) for arg in args])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: Invalid value for '--output' / '-o'")
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compact"], "use --no-spark"),
        (["compact", "--print-submit"], "a cluster cannot reach it"),
    ],
)
def test_a_job_on_a_store_in_this_process_alone_is_refused_before_spark(
    args: list[str], message: str
) -> None:
    """A memory:// store lives in one process: a Spark job (its executors, spark-submit) could
    not see it, so the command says so before starting anything."""
    result = runner.invoke(app, ["--store", "memory://kstore-test-jobs/store", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_only_memory_stores_are_process_local() -> None:
    from kstore.storage import is_process_local

    assert is_process_local("memory://bucket/store")
    assert is_process_local("MEMORY://bucket/store")
    for url in ("s3://bucket/store", "file:///tmp/store", "/tmp/memory://x", "gs://b/s"):
        assert not is_process_local(url), url
