"""Typed topics through the ``kstore`` command: topics create/describe/alter-schema/schema,
the console producer (JSON values validated line by line) and the console consumer (typed
values printed as JSON), on memory:// and a local directory, and the essentials on SeaweedFS."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from pathlib import Path
from typing import Any

import pytest
from kstore.cli.app import app
from typer.testing import CliRunner

from kstore import Store
from kstore.producer import Producer
from tests.test_cli import Cli, flat

runner = CliRunner()
SCHEMA = (
    "id BIGINT NOT NULL, name STRING, born DATE, seen TIMESTAMP, amount DECIMAL(10,2), "
    "photo BINARY, tags ARRAY<STRING>, attrs MAP<STRING, INT>, address STRUCT<city: STRING>"
)


@pytest.fixture(params=["memory", "local", pytest.param("seaweed", marks=pytest.mark.s3)])
def cli(request: pytest.FixtureRequest) -> Cli:
    fixture = {
        "memory": "memory_store_url",
        "local": "local_store_url",
        "seaweed": "seaweed_bucket_url",
    }[request.param]
    url, options = request.getfixturevalue(fixture)
    return Cli(request.param, url, options)


@pytest.fixture
def local_cli(local_store_url: tuple[str, dict[str, Any]]) -> Cli:
    return Cli("local", *local_store_url)


def store_of(cli: Cli) -> Store:
    return Store(cli.url, cli.options)


def test_create_describe_and_schema_history(cli: Cli) -> None:
    out = cli.run(
        "topics", "create", "users", "-p", "2", "--value-schema", SCHEMA, "--key-schema", "long"
    )
    assert "typed" in out.stderr
    meta = store_of(cli).topic("users")
    assert meta.schema is not None
    assert meta.schema.key_declared == "long"
    assert meta.schema.ddl() == store_of(cli).topic("users").schema.ddl()  # type: ignore[union-attr]
    described = cli.run("topics", "describe", "users").stdout
    assert "Schema: version 1" in described
    assert "Key: long" in described
    assert "id BIGINT NOT NULL" in flat(described)
    as_json = json.loads(cli.run("topics", "describe", "users", "-o", "json").stdout)
    assert as_json[0]["schema"]["id"] == 1
    assert as_json[0]["schema"]["key"] == "long"
    assert as_json[0]["schema"]["value"] == meta.schema.ddl()
    assert as_json[0]["schema"]["value_json"]["type"] == "struct"
    # A binary topic has no schema.
    cli.run("topics", "create", "raw")
    raw = json.loads(cli.run("topics", "describe", "raw", "-o", "json").stdout)
    assert raw[0]["schema"] is None
    assert "Schema:" not in cli.run("topics", "describe", "raw").stdout
    assert "no schema" in cli.run("topics", "schema", "raw").stderr
    assert json.loads(cli.run("topics", "schema", "raw", "-o", "json").stdout) == []


def test_alter_schema_and_history(local_cli: Cli) -> None:
    cli = local_cli
    cli.run("topics", "create", "t", "--value-schema", "id INT NOT NULL")
    out = cli.run("topics", "alter-schema", "t", "--value-schema", "id BIGINT, email STRING")
    assert "version 2" in out.stderr
    history = json.loads(cli.run("topics", "schema", "t", "-o", "json").stdout)
    assert [(h["id"], h["key"], h["value"]) for h in history] == [
        (1, "binary", "id INT NOT NULL"),
        (2, "binary", "id BIGINT, email STRING"),
    ]
    assert all(isinstance(h["created_ms"], int) for h in history)
    table = flat(cli.run("topics", "schema", "t").stdout)
    assert "VERSION" in table
    assert "id BIGINT, email STRING" in table
    # Refused changes name the field, exit 1, and change nothing.
    bad = cli.run("topics", "alter-schema", "t", "--value-schema", "id BIGINT", code=1)
    assert "email" in bad.stderr
    bad = cli.run("topics", "alter-schema", "t", "--value-schema", "id INT, email STRING", code=1)
    assert "'id'" in bad.stderr or "id" in bad.stderr
    assert len(json.loads(cli.run("topics", "schema", "t", "-o", "json").stdout)) == 2
    cli.run("topics", "create", "raw")
    assert (
        "binary"
        in cli.run("topics", "alter-schema", "raw", "--value-schema", "a INT", code=1).stderr
    )


def test_schema_from_a_file_and_as_spark_json(local_cli: Cli, tmp_path: Path) -> None:
    cli = local_cli
    spark_json = {
        "type": "struct",
        "fields": [{"name": "a", "type": "long", "nullable": False, "metadata": {}}],
    }
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(spark_json))
    cli.run("topics", "create", "from-file", "--value-schema", f"@{path}")
    cli.run("topics", "create", "inline", "--value-schema", json.dumps(spark_json))
    for name in ("from-file", "inline"):
        assert store_of(cli).topic(name).schema.ddl() == "a BIGINT NOT NULL"  # type: ignore[union-attr]
    missing = cli.run("topics", "create", "x", "--value-schema", f"@{tmp_path / 'nope'}", code=2)
    assert "cannot read" in flat(missing.stderr)


def test_bad_schemas_are_refused(local_cli: Cli) -> None:
    cli = local_cli
    bad = cli.run("topics", "create", "t", "--value-schema", "id BIGINT NOT", code=1)
    assert "value schema" in bad.stderr
    bad = cli.run(
        "topics", "create", "t", "--value-schema", "a INT", "--key-schema", "date", code=1
    )
    assert "key schema" in bad.stderr
    usage = cli.run("topics", "create", "t", "--key-schema", "long", code=2)
    assert "--value-schema" in flat(usage.stderr)
    assert store_of(cli).list_topics() == []


def test_produce_text_lines_and_consume_them_as_json(cli: Cli) -> None:
    cli.run("topics", "create", "users", "--value-schema", SCHEMA, "--key-schema", "long")
    photo = base64.b64encode(b"\x00\xffpng").decode()
    lines = [
        '7:{"id": 7, "name": "Ada", "born": "1815-12-10", "seen": "2024-05-06T07:08:09.5+02:00", '
        f'"amount": "12.34", "photo": "{photo}", "tags": ["x"], "attrs": {{"a": 1}}, '
        '"address": {"city": "London"}}',
        '8:{"id": 8, "amount": 0.1}',
        "7:NULL",
    ]
    out = cli.run(
        "produce",
        "users",
        "--key-separator",
        ":",
        "--null-marker",
        "NULL",
        input="\n".join(lines) + "\n",
    )
    assert "Produced 3 record(s)" in out.stderr
    records = [
        json.loads(line) for line in cli.run("consume", "users", "-o", "json").stdout.splitlines()
    ]
    assert [(r["key"], r["offset"]) for r in records] == [(7, 0), (8, 1), (7, 2)]
    assert records[0]["value"] == {
        "id": 7,
        "name": "Ada",
        "born": "1815-12-10",
        "seen": "2024-05-06T05:08:09.500000+00:00",
        "amount": "12.34",
        "photo": photo,
        "tags": ["x"],
        "attrs": {"a": 1},
        "address": {"city": "London"},
    }
    assert records[1]["value"]["amount"] == "0.10"  # exact: never through a float
    assert records[2]["value"] is None
    # Through the library: real types.
    value = next(iter(_read(cli, "users")))
    assert value["born"] == dt.date(1815, 12, 10)
    assert value["amount"] == decimal.Decimal("12.34")
    assert value["photo"] == b"\x00\xffpng"
    # Plain output: the value as a JSON object, the typed key as its text.
    plain = cli.run("consume", "users", "--print-key").stdout.splitlines()
    assert plain[1] == '8\t{"id":8,"name":null,"born":null,"seen":null,"amount":"0.10",' + (
        '"photo":null,"tags":null,"attrs":null,"address":null}'
    )
    assert plain[2] == "7\tnull"


def _read(cli: Cli, topic: str) -> list[Any]:
    from kstore.consumer import Consumer
    from kstore.records import TopicPartition

    consumer = Consumer(store=store_of(cli), auto_offset_reset="earliest")
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values = [r.value for r in consumer.poll(timeout_ms=0).get(tp, [])]
    consumer.close(autocommit=False)
    return values


def test_consume_json_output_produces_back_unchanged(local_cli: Cli) -> None:
    cli = local_cli
    for name in ("a", "b"):
        cli.run(
            "topics", "create", name, "-p", "3", "--value-schema", SCHEMA, "--key-schema", "string"
        )
    producer = Producer(store_of(cli))
    for i in range(20):
        producer.send(
            "a",
            key=f"user-{i}",
            value={
                "id": i,
                "born": dt.date(2000, 1, 1) + dt.timedelta(days=i),
                "seen": dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i),
                "amount": decimal.Decimal(i) / 4,
                "photo": bytes([i, 255 - i]),
                "attrs": {"n": i},
            },
            headers=[("h", b"%d" % i)],
        )
    producer.close()
    dumped = cli.run("consume", "a", "-o", "json").stdout
    cli.run("produce", "b", "--format", "json", input=dumped)
    again = cli.run("consume", "b", "-o", "json").stdout

    def essentials(text: str) -> list[Any]:
        rows = [json.loads(line) for line in text.splitlines()]
        return sorted((r["partition"], r["key"], r["value"], r["headers"]) for r in rows)

    assert essentials(again) == essentials(dumped)
    assert len(dumped.splitlines()) == 20


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "seven"}', "field 'id': expected long"),
        ('{"name": "no id"}', "field 'id' is required"),
        ('{"id": 1, "nick": "x"}', "unknown field 'nick'"),
        ('{"id": 1, "amount": "1.234"}', "field 'amount': 1.234 has more than 2 decimal places"),
        ('{"id": 1, "born": "yesterday"}', "field 'born': 'yesterday' is not an ISO 8601 date"),
        ('{"id": 1, "seen": "2024-01-01T00:00:00"}', "field 'seen': a timestamp is an instant"),
        ('{"id": 1, "photo": "not base64!"}', "field 'photo' is not valid base64"),
        ('{"id": 1, "address": {"city": 5}}', "field 'address.city': expected string"),
        ('{"id": 2147483648000000000000}', "field 'id': .* out of range for long"),
        ("[1, 2]", "must be a JSON object"),
        ("not json", "must be a JSON object"),
    ],
)
def test_a_bad_line_names_the_line_and_the_field_and_writes_nothing_of_it(
    local_cli: Cli, line: str, message: str
) -> None:
    import re

    cli = local_cli
    cli.run("topics", "create", "users", "--value-schema", SCHEMA)
    good = '{"id": 1}'
    out = cli.run("produce", "users", input=f"{good}\n{line}\n{good}\n", code=1)
    text = flat(out.stderr)
    assert "line 2:" in text
    assert re.search(message, text), text
    # The line before was delivered; the bad line and everything after it were not.
    assert _read(cli, "users") == [
        {
            "id": 1,
            "name": None,
            "born": None,
            "seen": None,
            "amount": None,
            "photo": None,
            "tags": None,
            "attrs": None,
            "address": None,
        }
    ]


def test_json_mode_typed_keys_and_errors(local_cli: Cli) -> None:
    cli = local_cli
    cli.run("topics", "create", "t", "-p", "4", "--value-schema", "v INT", "--key-schema", "long")
    cli.run("topics", "create", "raw", "-p", "4")
    lines = [json.dumps({"key": k, "value": {"v": k}}) for k in range(30)]
    cli.run("produce", "t", "--format", "json", input="\n".join(lines) + "\n")
    import struct

    raw_lines = [
        json.dumps(
            {
                "key": base64.b64encode(struct.pack(">q", k)).decode(),
                "key_encoding": "base64",
                "value": "x",
            }
        )
        for k in range(30)
    ]
    cli.run("produce", "raw", "--format", "json", input="\n".join(raw_lines) + "\n")
    typed = {
        (r["key"], r["partition"])
        for r in map(json.loads, cli.run("consume", "t", "-o", "json").stdout.splitlines())
    }
    raw = {
        (struct.unpack(">q", _raw_key(r))[0], r["partition"])
        for r in map(json.loads, cli.run("consume", "raw", "-o", "json").stdout.splitlines())
    }
    assert typed == raw  # a typed long key lands where its 8 big-endian bytes land
    bad = cli.run(
        "produce", "t", "--format", "json", input='{"key": "abc", "value": {"v": 1}}\n', code=1
    )
    assert "line 1:" in flat(bad.stderr)
    assert "not a long" in flat(bad.stderr)
    bad = cli.run("produce", "t", "-k", ":", input='x:{"v": 1}\n', code=1)
    assert "'x' is not a long" in flat(bad.stderr)
    bad = cli.run(
        "produce",
        "t",
        "--format",
        "json",
        input='{"key": 1, "value": "aGk=", "value_encoding": "base64"}\n',
        code=1,
    )
    assert "value_encoding" in flat(bad.stderr)


def _raw_key(record: dict[str, Any]) -> bytes:
    key: str = record["key"]
    if record.get("key_encoding") == "base64":
        return base64.b64decode(key)
    return key.encode("utf-8")


def test_hex_output_of_typed_values(local_cli: Cli) -> None:
    cli = local_cli
    cli.run("topics", "create", "t", "--value-schema", "v INT")
    cli.run("produce", "t", input='{"v": 1}\n')
    assert cli.run("consume", "t", "-o", "hex").stdout.strip() == b'{"v":1}'.hex()


def test_help_lists_the_typed_options() -> None:
    create = runner.invoke(app, ["topics", "create", "--help"]).stdout
    assert "--value-schema" in create
    assert "--key-schema" in create
    topics = runner.invoke(app, ["topics", "--help"]).stdout
    assert "alter-schema" in topics
    assert "schema" in topics
