"""A command's output, in the format ``--output`` chose: one object the command writes its
result to, so that no command branches on the format (as pyiceberg's CLI does).

- ``table(rows, columns)``: a result that is a list of rows: a table, or a JSON array of them;
- ``record(data, view)``: a result that is one JSON document: the document, or in text what
  ``view`` draws with :class:`TextOutput`'s primitives (nothing without a view);
- ``message(text)``: a sentence for people, on stderr; JSON leaves it out (its document says
  it);
- ``notice(text)``: a line on stderr in every format (a part that failed, a warning);
- ``progress(description, total)``: a progress bar on a terminal, in text only.

Everything is written redacted (:func:`~kstore.cli.common.write_out`,
:func:`~kstore.cli.common.note`). rich is imported only when a table is drawn.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from kstore.cli.common import note, write_out

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


class OutputFormat(enum.StrEnum):
    table = "table"
    json = "json"


@dataclass(frozen=True)
class Column:
    """A table column: its header and where a row's cell comes from: the row's key (a
    mapping) or attribute, a tuple row's index, or a function of the row."""

    header: str
    value: str | int | Callable[[Any], Any]
    right: bool = False  # right-aligned: numbers

    def cell(self, row: Any) -> Any:
        if callable(self.value):
            return self.value(row)
        if isinstance(row, Mapping) or isinstance(self.value, int):
            return row[self.value]
        return getattr(row, self.value)


class Bar(Protocol):
    """A progress bar being drawn."""

    def update(self, description: str) -> None: ...

    def advance(self, amount: int) -> None: ...


class Output(Protocol):
    """Where a command's result goes (see the module docstring)."""

    def table(
        self, rows: Iterable[Any], columns: Sequence[Column], *, empty: str | None = None
    ) -> None:
        """The result as rows (JSON: the rows themselves, which must be JSON values). With
        ``empty``, no rows is that message rather than an empty table."""

    def record(self, data: Any, view: Callable[[TextOutput], None] | None = None) -> None:
        """The result as one JSON document; in text, what ``view`` draws."""

    def message(self, text: str) -> None:
        """A sentence for people (stderr); not part of a JSON result."""

    def notice(self, text: str) -> None:
        """A line on stderr, whatever the format."""

    def progress(
        self, description: str, total: Callable[[], int]
    ) -> contextlib.AbstractContextManager[Bar | None]:
        """A byte progress bar while the block runs (None when none is drawn). ``total`` is
        called only for a bar: it may cost a listing."""


class TextOutput:
    """For people: rich tables and lines on stdout, messages on stderr."""

    def table(
        self, rows: Iterable[Any], columns: Sequence[Column], *, empty: str | None = None
    ) -> None:
        rows = list(rows)
        if not rows and empty is not None:
            self.message(empty)
            return
        table = new_table(
            *(c.header for c in columns), right=[c.header for c in columns if c.right]
        )
        for row in rows:
            table.add_row(*(cell(c.cell(row)) for c in columns))
        print_table(table)

    def record(self, data: Any, view: Callable[[TextOutput], None] | None = None) -> None:
        if view is not None:
            view(self)

    def properties(self, data: Mapping[str, Any]) -> None:
        """A document's fields as a PROPERTY/VALUE table."""
        self.table(data.items(), [Column("PROPERTY", 0), Column("VALUE", 1)])

    def line(self, text: str) -> None:
        write_out(text + "\n")

    def lines(self, texts: Iterable[str]) -> None:
        """Lines on stdout, written at once (nothing for none)."""
        joined = "".join(f"{text}\n" for text in texts)
        if joined:
            write_out(joined)

    def message(self, text: str) -> None:
        note(text)

    def notice(self, text: str) -> None:
        note(text)

    @contextlib.contextmanager
    def progress(self, description: str, total: Callable[[], int]) -> Iterator[Bar | None]:
        if not sys.stderr.isatty():
            yield None
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=Console(file=sys.stderr),
            transient=True,
        ) as progress:
            yield _RichBar(progress, progress.add_task(description, total=total() or None))


class _RichBar:
    def __init__(self, progress: Any, task: Any) -> None:
        self._progress = progress
        self._task = task

    def update(self, description: str) -> None:
        self._progress.update(self._task, description=description)

    def advance(self, amount: int) -> None:
        self._progress.advance(self._task, amount)


class JsonOutput:
    """For scripts: the result as one JSON document on stdout; stderr only for notices."""

    def table(
        self, rows: Iterable[Any], columns: Sequence[Column], *, empty: str | None = None
    ) -> None:
        print_json(list(rows))

    def record(self, data: Any, view: Callable[[TextOutput], None] | None = None) -> None:
        print_json(data)

    def message(self, text: str) -> None:
        pass

    def notice(self, text: str) -> None:
        note(text)

    @contextlib.contextmanager
    def progress(self, description: str, total: Callable[[], int]) -> Iterator[Bar | None]:
        yield None


def make_output(output_format: OutputFormat) -> Output:
    return JsonOutput() if output_format is OutputFormat.json else TextOutput()


# -- rendering ------------------------------------------------------------------------------------


def print_json(data: Any) -> None:
    write_out(json.dumps(data, indent=2, default=str) + "\n")


def _console(stream: Any) -> Console:
    from rich.console import Console

    interactive = hasattr(stream, "isatty") and stream.isatty()
    columns = os.environ.get("COLUMNS", "")
    # Piped output is not cut at 80 columns (rich's default off a terminal).
    width = (
        None if interactive else (int(columns) if columns.isdigit() and int(columns) > 0 else 200)
    )
    return Console(file=stream, width=width, highlight=False, soft_wrap=False)


def print_table(table: Table) -> None:
    """Render a rich table to stdout, with every secret redacted."""
    console = _console(sys.stdout)
    with console.capture() as captured:
        console.print(table)
    write_out(captured.get())


def new_table(*columns: str, right: Iterable[str] = ()) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    numeric = set(right)
    for column in columns:
        table.add_column(column, justify="right" if column in numeric else "left", overflow="fold")
    return table


def cell(value: Any) -> Any:
    """A table cell that rich prints literally (no markup, no emoji); None as '-'."""
    from rich.text import Text

    return Text("-" if value is None else str(value))
