"""The CLI's pure parts: option and config parsing, redaction, times, record formats."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kstore.cli.common import (
    Redactor,
    UsageError,
    env_options,
    error_message,
    load_config_file,
    parse_option_args,
    secrets_of_options,
    secrets_of_url,
)
from kstore.cli.consume import Formatter, RecordFormat, record_json
from kstore.cli.produce import InputError, TextParser, parse_json_record, unescape
from kstore.cli.timeparse import parse_datetime_ms, parse_duration_ms

from kstore.errors import StorageError, StoreNotFoundError
from kstore.records import ConsumerRecord

NOW = 1_800_000_000_000


def test_option_args_nest_and_type() -> None:
    got = parse_option_args(
        [
            "client_kwargs.endpoint_url=http://127.0.0.1:8333",
            "client_kwargs.region_name=us-east-1",
            "anon=false",
            "default_block_size=5242880",
            "key=0123",
            "secret=12345678",
            "profile=007",
        ]
    )
    assert got == {
        "client_kwargs": {"endpoint_url": "http://127.0.0.1:8333", "region_name": "us-east-1"},
        "anon": False,
        "default_block_size": 5242880,
        "key": "0123",  # secrets stay strings, even when they look like numbers
        "secret": "12345678",
        "profile": "007",  # a leading zero is not an integer
    }


@pytest.mark.parametrize("bad", ["no-equals-sign-supersecret", "=supersecret", "a..b=supersecret"])
def test_option_args_errors_never_echo_the_value(bad: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_option_args([bad])
    assert "supersecret" not in info.value.format_message()


def test_option_value_cannot_replace_a_table() -> None:
    with pytest.raises(UsageError, match="table of options"):
        parse_option_args(["client_kwargs.endpoint_url=x", "client_kwargs=y"])
    with pytest.raises(UsageError, match="nests under"):
        parse_option_args(["a=1", "a.b=2"])


def test_env_options() -> None:
    environ = {
        "KSTORE_OPTION_CLIENT_KWARGS__ENDPOINT_URL": "http://h:1",
        "KSTORE_OPTION_SECRET": "s3cr3t-value",
        "KSTORE_STORE": "ignored-here",
        "OTHER": "x",
    }
    assert env_options(environ) == {
        "client_kwargs": {"endpoint_url": "http://h:1"},
        "secret": "s3cr3t-value",
    }


def test_config_file(tmp_path: Path) -> None:
    path = tmp_path / "kstore.toml"
    path.write_text(
        'store = "s3://bucket/ks"\n[options]\nkey = "AKIA"\n"client_kwargs.region_name" = "eu"\n'
        '[options.client_kwargs]\nendpoint_url = "http://h:1"\n'
    )
    store, options = load_config_file(path)
    assert store == "s3://bucket/ks"
    assert options == {
        "key": "AKIA",
        "client_kwargs": {"endpoint_url": "http://h:1", "region_name": "eu"},
    }


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("store = ", "not valid TOML"),
        ('stor = "x"', "unknown key"),
        ("store = 1", "must be a string"),
        ('options = "x"', "must be a table"),
    ],
)
def test_config_file_errors(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "kstore.toml"
    path.write_text(content)
    with pytest.raises(UsageError, match=message):
        load_config_file(path)
    with pytest.raises(UsageError, match="does not exist"):
        load_config_file(tmp_path / "missing.toml")


def test_secrets_and_redaction() -> None:
    options = {
        "key": "AKIAEXAMPLE",
        "secret": "wJalr\\XUtnFEMI",
        "token": None,
        "client_kwargs": {"endpoint_url": "http://h:1", "aws_secret_access_key": "nested-secret"},
    }
    assert sorted(secrets_of_options(options)) == [
        "AKIAEXAMPLE",
        "nested-secret",
        "wJalr\\XUtnFEMI",
    ]
    assert secrets_of_url("s3://AKIAX:pa55word@bucket/p") == ["AKIAX:pa55word", "AKIAX", "pa55word"]
    assert secrets_of_url("s3://bucket/p@x") == []
    redact = Redactor([*secrets_of_options(options), "abc"])  # too short to be searched for
    shown = redact(
        f"key AKIAEXAMPLE secret wJalr\\XUtnFEMI json {json.dumps(options)} {options!r} abc"
    )
    assert "AKIAEXAMPLE" not in shown
    assert "XUtnFEMI" not in shown.replace("***", "")
    assert shown.endswith("abc")


def test_error_messages_add_hints() -> None:
    assert "kstore topics create" in error_message(StoreNotFoundError("no kstore store at 'x'"))
    assert "no credentials" in error_message(StorageError("failed: Unable to locate credentials"))
    assert "refused the credentials" in error_message(StorageError("failed: Forbidden"))
    assert "endpoint" in error_message(
        StorageError('Could not connect to the endpoint URL: "http://x"')
    )
    assert error_message(ValueError("boom")).startswith("unexpected ValueError: boom")


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("90s", 90_000),
        ("15m", 900_000),
        ("1h30m", 5_400_000),
        ("2d", 172_800_000),
        ("500ms", 500),
        ("PT1H", 3_600_000),
        ("P1DT2H", 93_600_000),
        ("pt0.5s", 500),
        ("1.5h", 5_400_000),
    ],
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "P", "PT", "5", "5x", "h", "1h-"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration_ms(text)


def test_datetimes() -> None:
    assert parse_datetime_ms("2026-11-21T10:00:00Z") == 1_795_255_200_000
    assert parse_datetime_ms("2026-11-21T10:00:00.250+01:00") == 1_795_251_600_250
    assert parse_datetime_ms("1795255200000") == 1_795_255_200_000
    assert parse_datetime_ms("now", now_ms=NOW) == NOW
    assert parse_datetime_ms("15m", now_ms=NOW) == NOW - 900_000
    assert parse_datetime_ms("-2h", now_ms=NOW) == NOW - 7_200_000
    assert parse_datetime_ms("1h ago", now_ms=NOW) == NOW - 3_600_000
    local = datetime(2026, 11, 21, 10, 0).astimezone()  # no zone: local time, as in Kafka
    assert parse_datetime_ms("2026-11-21T10:00") == int(local.astimezone(UTC).timestamp() * 1000)
    with pytest.raises(ValueError, match="not a time"):
        parse_datetime_ms("yesterday")


def test_text_parser() -> None:
    assert unescape("\\t") == b"\t"
    assert unescape("a\\\\b\\n") == b"a\\b\n"
    plain = TextParser()
    assert plain.parse(b"k:v").value == b"k:v"
    keyed = TextParser(key_separator=b":", null_marker=b"NULL")
    record = keyed.parse(b"user-1:a:b")
    assert (record.key, record.value) == (b"user-1", b"a:b")
    assert keyed.parse(b"k:NULL").value is None
    assert keyed.parse(b"NULL:v").key is None
    with pytest.raises(InputError, match="no key separator"):
        keyed.parse(b"no separator")
    full = TextParser(key_separator=b"\t", parse_headers=True)
    record = full.parse(b"src:web,trace:a:b\tk\tv")
    assert record.headers == [("src", b"web"), ("trace", b"a:b")]
    assert (record.key, record.value) == (b"k", b"v")
    assert full.parse(b"\tk\tv").headers == []
    with pytest.raises(InputError, match="headers delimiter"):
        full.parse(b"k v")
    with pytest.raises(InputError, match="between name and value"):
        full.parse(b"bad\tk\tv")


def test_json_records() -> None:
    record = parse_json_record(
        b'{"key": "k", "value": {"n": 1}, "headers": {"h": "v"}, "partition": 2, "timestamp": 5}'
    )
    assert (record.key, record.value, record.headers, record.partition, record.timestamp_ms) == (
        b"k",
        b'{"n":1}',
        [("h", b"v")],
        2,
        5,
    )
    binary = base64.b64encode(b"\xff\x00").decode()
    record = parse_json_record(
        json.dumps(
            {
                "topic": "ignored",
                "offset": 3,
                "timestamp_type": "CreateTime",
                "key": None,
                "value": binary,
                "value_encoding": "base64",
                "headers": [{"key": "a", "value": binary, "value_encoding": "base64"}, ["b", None]],
                "timestamp": "2026-11-21T10:00:00Z",
            }
        ).encode()
    )
    assert record.value == b"\xff\x00"
    assert record.key is None
    assert record.headers == [("a", b"\xff\x00"), ("b", b"")]
    assert record.timestamp_ms == 1_795_255_200_000
    assert parse_json_record(b'{"value": null}').value is None
    for bad, message in [
        (b"[1]", "JSON object"),
        (b"{", "not valid JSON"),
        (b'{"key": "k"}', 'needs a "value"'),
        (b'{"value": "v", "vaule": 1}', "unknown field"),
        (b'{"value": "v", "partition": "0"}', "partition"),
        (b'{"value": "!!", "value_encoding": "base64"}', "base64"),
        (b'{"value": 1, "value_encoding": "x"}', "encoding"),
        (b'{"value": "v", "headers": 3}', "headers"),
        (b'{"value": "v", "timestamp": true}', "timestamp"),
        (b'{"value": "v", "headers": [[1, "x"]]}', "not a string"),
    ]:
        with pytest.raises(InputError, match=message):
            parse_json_record(bad)


def _record(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]
) -> ConsumerRecord:
    return ConsumerRecord("t", 1, 7, 1_795_255_200_000, 0, key, value, headers, None, -1, -1, -1)


def test_record_formats() -> None:
    record = _record(b"k", b"v\xff", [("h", b"x")])
    shown = record_json(record)
    assert shown["key"] == "k"
    assert shown["value_encoding"] == "base64"
    assert base64.b64decode(shown["value"]) == b"v\xff"
    assert shown["headers"] == [{"key": "h", "value": "x"}]
    # What consume prints, produce reads back to the same bytes.
    again = parse_json_record(json.dumps(shown).encode())
    assert (again.key, again.value, again.headers) == (b"k", b"v\xff", [("h", b"x")])

    everything = Formatter(
        RecordFormat.plain,
        print_key=True,
        print_timestamp=True,
        print_offset=True,
        print_partition=True,
        print_headers=True,
        separator=b"\t",
    )
    assert (
        everything.format(record)
        == b"CreateTime:1795255200000\tPartition:1\tOffset:7\th:x\tk\tv\xff\n"
    )
    assert everything.format(_record(None, None, [])) == (
        b"CreateTime:1795255200000\tPartition:1\tOffset:7\tNO_HEADERS\tnull\tnull\n"
    )
    hexed = Formatter(
        RecordFormat.hex,
        print_key=True,
        print_timestamp=False,
        print_offset=False,
        print_partition=False,
        print_headers=False,
        separator=b" ",
    )
    assert hexed.format(record) == b"6b 76ff\n"
    as_json = Formatter(
        RecordFormat.json,
        print_key=False,
        print_timestamp=False,
        print_offset=False,
        print_partition=False,
        print_headers=False,
        separator=b"\t",
    )
    assert json.loads(as_json.format(record)) == shown
