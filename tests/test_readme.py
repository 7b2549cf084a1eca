"""Every Python code block in the README runs, as written (with its store path moved into a
temporary directory)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_blocks() -> None:
    assert BLOCKS


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs(index: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = BLOCKS[index].replace("file:///tmp/kstore-readme", (tmp_path / "readme").as_uri())
    exec(compile(code, f"README.md block {index}", "exec"), {"__name__": "__readme__"})
    assert capsys.readouterr().out.strip()  # the examples print what they read
