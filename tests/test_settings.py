"""The typed settings model (kstore/settings.py), and the docs' config tables checked against
the declarations: the topic configs (PROTOCOL.md 17.1) and the Spark options
(spark_ext/README.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kstore.spark_ext import options

from kstore import config
from kstore.errors import InvalidConfigurationError, KStoreError
from kstore.settings import (
    Setting,
    Settings,
    boolean_text,
    choice,
    duration_ms,
    integer,
    is_int,
    size_bytes,
)

ROOT = Path(__file__).resolve().parent.parent

GROUP = Settings(
    "test setting",
    [
        Setting("count", 3, integer(1, 10), "how many"),
        Setting("size", "64m", size_bytes, "how big"),
        Setting("mode", "fast", choice(("fast", "safe"), lower=True), "how"),
        Setting("on", False, boolean_text, "whether"),
        Setting("wait", "1s", duration_ms, "how long"),
        Setting("secret_key", None, choice(("ok",)), "a credential", secret=True),
    ],
)


def test_valid_values_are_parsed_into_canonical_types() -> None:
    got = GROUP.validate({"count": "4", "size": "2k", "mode": " SAFE ", "on": "True", "wait": "2m"})
    assert got == {"count": 4, "size": 2048, "mode": "safe", "on": True, "wait": 120_000}
    assert GROUP.defaults()["count"] == 3


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("count", True, "config 'count': expected an integer, got a boolean"),
        ("count", 0, "config 'count': 0 is out of range [1, 10]"),
        ("count", 2.5, "config 'count': expected an integer, got float"),
        ("count", "x", "config 'count': expected an integer, got 'x'"),
        ("size", "-5", "config 'size': expected a size"),
        ("size", "0", "config 'size': must be positive"),
        ("size", True, "config 'size': expected a size"),
        ("mode", "slow", "config 'mode': 'slow' is not one of fast, safe"),
        ("mode", 1, "config 'mode': expected a string, got int"),
        ("on", "yes", "config 'on': expected true or false, got 'yes'"),
        ("wait", "5 fortnights", "config 'wait': expected a duration"),
    ],
)
def test_a_bad_value_names_the_key_the_value_and_what_is_allowed(
    name: str, value: object, message: str
) -> None:
    with pytest.raises(InvalidConfigurationError) as info:
        GROUP.parse(name, value)
    assert str(info.value).startswith(message)
    assert isinstance(info.value, KStoreError)
    assert isinstance(info.value, ValueError)


def test_an_unknown_key_is_refused_with_a_suggestion() -> None:
    with pytest.raises(InvalidConfigurationError, match="unknown test setting 'cuont'; did you"):
        GROUP.validate({"cuont": 1})
    with pytest.raises(InvalidConfigurationError, match="must be a mapping"):
        GROUP.validate([("count", 1)])  # type: ignore[arg-type]


def test_a_secret_is_never_echoed() -> None:
    with pytest.raises(InvalidConfigurationError) as info:
        GROUP.parse("secret_key", "AKIA-very-secret")
    assert "secret_key" in str(info.value)
    assert "AKIA" not in str(info.value)


def test_is_int_refuses_bools() -> None:
    assert is_int(3)
    assert is_int(-1)
    assert not is_int(True)
    assert not is_int(3.0)
    assert not is_int("3")


def test_topic_config_errors_keep_their_messages() -> None:
    with pytest.raises(
        InvalidConfigurationError,
        match=r"config .retention\.ms.: expected an integer, got a boolean",
    ):
        config.validate_config({"retention.ms": True})
    with pytest.raises(InvalidConfigurationError, match=r"-5 is out of range \[0, .*\(or -1"):
        config.validate_config({"retention.bytes": -5})
    with pytest.raises(
        InvalidConfigurationError,
        match=r"unknown topic config .retention\.mss.; did you mean .retention\.ms.",
    ):
        config.validate_config({"retention.mss": 1})
    with pytest.raises(InvalidConfigurationError, match="'gzip' is not one of"):
        config.validate_config({"compression.type": "gzip"})
    assert config.validate_config({"compression.type": "none", "retention.ms": "-1"}) == {
        "compression.type": "uncompressed",
        "retention.ms": -1,
    }
    # Reading is lenient: an old small delay reads as the floor, a bad value as unset.
    assert config.read_config({"file.delete.delay.ms": 5, "segment.ms": "x", "new.key": 1}) == {
        "file.delete.delay.ms": config.MIN_FILE_DELETE_DELAY_MS,
        "new.key": 1,
    }


def _table(text: str, heading: str) -> list[list[str]]:
    """The rows of the first Markdown table after ``heading``."""
    rest = text[text.index(heading) :]
    rows: list[list[str]] = []
    for line in rest.splitlines()[1:]:
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    return rows[2:]  # header and separator


def _number(cell: str) -> str:
    return cell.strip("`").split(" ")[0]


def test_protocol_topic_config_table_matches_the_declarations() -> None:
    rows = _table((ROOT / "docs" / "PROTOCOL.md").read_text(), "### 17.1 Configuration")
    documented = {row[0].strip("`"): row for row in rows}
    assert set(documented) == set(config.SPECS)
    for name, setting in config.SPECS.items():
        _, kind, default, _allowed, meaning = documented[name]
        assert _number(default) == str(setting.default), name
        assert kind == {int: "integer", float: "number", str: "string"}[type(setting.default)]
        assert meaning, name
        assert setting.doc, name
        # The documented default is itself valid.
        assert config.parse_config_value(name, setting.default) == setting.default


def _documented_options(heading: str) -> dict[str, str]:
    rows = _table((ROOT / "spark_ext" / "README.md").read_text(), heading)
    out: dict[str, str] = {}
    for row in rows:
        for name in re.findall(r"`([A-Za-z.<>]+)`", row[0].split("(")[0]):
            out[name] = row[-1]
    return out


def test_spark_options_tables_match_the_declarations() -> None:
    read_doc = _documented_options("## Read options")
    write_doc = _documented_options("## Write options")
    read_doc.pop("storage.<name>")
    declared = {s.name: s for s in (*options.STORE_SETTINGS, *options.READ_SETTINGS)}
    assert set(read_doc) == set(declared)
    assert set(write_doc) - {"storage.<name>"} == {s.name for s in options.WRITE_SETTINGS} | {
        "store",
        "storageOptions",
    }
    for setting in (*options.READ_SETTINGS, *options.WRITE_SETTINGS):
        if setting.default is not None:
            cell = read_doc.get(setting.name) or write_doc[setting.name]
            assert f"`{setting.default}`" in cell, setting.name
            # A declared default passes the option's own validator.
            setting.parse(setting.default)


def test_spark_option_errors_name_the_option_as_spelt() -> None:
    with pytest.raises(
        options.InvalidOptionError,
        match="kstore option 'failOnDataLoss': expected true or false, got 'yes'",
    ):
        options.parse_bool("failondataloss", "yes")
    with pytest.raises(
        options.InvalidOptionError, match="kstore option 'minPartitions': 0 is out of range"
    ):
        options.parse_int("minpartitions", "0", minimum=1)
    with pytest.raises(options.InvalidOptionError, match="'segmentBytes': must be positive"):
        options.parse_bytes("segmentbytes", "0")
