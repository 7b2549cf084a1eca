"""The config tables of docs/PRODUCER.md and docs/CONSUMER.md against the declarations:
every declared key has a row, every row a declared key, and each row's default is the
declared default."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest

from kstore.consumer.config import CONSUMER_SETTINGS
from kstore.producer_config import PRODUCER_SETTINGS
from kstore.settings import Settings

DOCS = Path(__file__).resolve().parent.parent / "docs"
_ROW = re.compile(r"^\| (?P<names>`[^|]+`) \| `(?P<default>[^`]+)`[^|]* \|")


def config_table(path: Path) -> dict[str, Any]:
    """The rows of the document's Configuration table: each key's documented default (a row
    that names several keys gives each the same one)."""
    text = path.read_text()
    section = text.split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, Any] = {}
    for line in section.splitlines():
        match = _ROW.match(line)
        if match is None:
            continue
        literal = match.group("default")
        default = float("inf") if literal == "inf" else ast.literal_eval(literal)
        for name in re.findall(r"`([^`]+)`", match.group("names")):
            rows[name] = default
    return rows


@pytest.mark.parametrize(
    ("doc", "settings"),
    [("PRODUCER.md", PRODUCER_SETTINGS), ("CONSUMER.md", CONSUMER_SETTINGS)],
)
def test_the_config_table_matches_the_declarations(doc: str, settings: Settings) -> None:
    table = config_table(DOCS / doc)
    assert sorted(table) == sorted(settings), f"{doc}'s config table and the declared keys differ"
    wrong = {
        name: (table[name], settings[name].default)
        for name in settings
        if table[name] != settings[name].default
    }
    assert wrong == {}, f"{doc}: documented default != declared default"


def test_a_wrong_row_is_caught(tmp_path: Path) -> None:
    doc = tmp_path / "X.md"
    doc.write_text(
        "# X\n\n## Configuration\n\n| Name | Default | Meaning |\n|---|---|---|\n"
        "| `linger_ms` | `50` | x |\n| `key_serializer`, `value_serializer` | `None` | y |\n"
    )
    table = config_table(doc)
    assert table == {"linger_ms": 50, "key_serializer": None, "value_serializer": None}
    assert table["linger_ms"] != PRODUCER_SETTINGS["linger_ms"].default


@pytest.mark.parametrize("settings", [PRODUCER_SETTINGS, CONSUMER_SETTINGS])
def test_every_declared_default_passes_its_own_validator(settings: Settings) -> None:
    for name, setting in settings.items():
        assert settings.parse(name, setting.default) == setting.default, name
