"""The options every command shares: ``--store``, ``--option``, ``--config-file``,
``--output`` and ``--debug``.

They are declared once, on the root command's callback (app.py), and accepted at every level
of the command line: before the command (``kstore --store URL topics list``), after it
(``kstore topics list --store URL``), or between a group and its command. The root command
gives each of its subcommands a copy of them (:func:`share_options`); what any level is given
lands in the one :class:`Shared` object of the invocation, in the typer context, the later
level winning (``--option`` values add up, the later ones overriding). A command that declares
an option of the same name itself keeps its own (``consume --output plain|json|hex``).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from kstore.cli.common import (
    ENV_CONFIG,
    ENV_DEBUG,
    ENV_OPTION_PREFIX,
    ENV_STORE,
    StoreSettings,
    enable_debug,
    open_store,
    resolve_store,
)
from kstore.cli.output import Output, OutputFormat, make_output

if TYPE_CHECKING:
    from kstore.store import Store

_STORE_PANEL = "Store selection"

StoreOpt = Annotated[
    str | None,
    typer.Option(
        "--store",
        "-s",
        metavar="URL",
        rich_help_panel=_STORE_PANEL,
        help="Store URL: file:///path, a local path, s3://bucket/prefix or memory://name. "
        f"Default: ${ENV_STORE}, else 'store' in the config file.",
    ),
]
OptionOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--option",
        "-O",
        metavar="KEY=VALUE",
        rich_help_panel=_STORE_PANEL,
        help="A storage (fsspec/s3fs) option; repeatable; dotted keys nest "
        "(client_kwargs.endpoint_url=http://127.0.0.1:8333). Also "
        f"{ENV_OPTION_PREFIX}<NAME>=value.",
    ),
]
ConfigFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--config-file",
        metavar="PATH",
        rich_help_panel=_STORE_PANEL,
        help=f'TOML file with store = "URL" and an \\[options] table. Default: ${ENV_CONFIG}.',
    ),
]
OutputOpt = Annotated[
    OutputFormat,
    typer.Option("--output", "-o", help="table for people, json for scripts."),
]
DebugOpt = Annotated[
    bool,
    typer.Option(
        "--debug",
        help=f"Show tracebacks of errors (or set {ENV_DEBUG}=1).",
        is_eager=True,  # recorded before any other option can fail
    ),
]

# The root callback's parameters that every subcommand accepts too.
SHARED = ("store", "option", "config_file", "output", "debug")


@dataclass
class Shared:
    """What the shared options were given, at every level of the command line."""

    store: str | None = None
    options: list[str] = field(default_factory=list)
    config_file: Path | None = None
    output_format: OutputFormat = OutputFormat.table

    def given(
        self,
        *,
        store: str | None = None,
        option: Iterable[str] | None = None,
        config_file: Path | None = None,
        output: OutputFormat | None = None,
        debug: bool | None = None,
    ) -> None:
        """Values given at one level, after those of the levels before it."""
        if store:
            self.store = store
        self.options.extend(option or ())
        if config_file is not None:
            self.config_file = config_file
        if output is not None:
            self.output_format = output
        if debug:
            enable_debug()

    @property
    def output(self) -> Output:
        return make_output(self.output_format)

    def settings(self) -> StoreSettings:
        """The store URL and storage options (common.resolve_store: with the environment and
        the config file)."""
        return resolve_store(self.store, self.options, self.config_file)

    def open_store(self, *, create: bool = False, segment_cache_bytes: int | None = None) -> Store:
        return open_store(self.settings(), create=create, segment_cache_bytes=segment_cache_bytes)


def shared(ctx: typer.Context) -> Shared:
    """The invocation's shared options (kept by the root context)."""
    found: Shared = ctx.find_root().ensure_object(Shared)
    return found


def share_options(root: Any) -> None:
    """Give every command under ``root`` (a click group) a copy of root's shared options."""
    originals = [param for param in root.params if param.name in SHARED]

    def walk(group: Any) -> None:
        for command in getattr(group, "commands", {}).values():
            own = {name for param in command.params for name in (param.name, *param.opts)}
            command.params.extend(
                _after_command(param)
                for param in originals
                if param.name not in own and not own.intersection(param.opts)
            )
            walk(command)

    walk(root)


def _after_command(param: Any) -> Any:
    """A copy of a root option for a subcommand: not passed to the command's function, but
    recorded in :class:`Shared`; not given means nothing (None), not the root's default."""
    given = copy.copy(param)
    given.expose_value = False
    given.default = None
    given.callback = _record
    return given


def _record(ctx: typer.Context, param: Any, value: Any) -> Any:
    if not ctx.resilient_parsing:  # shell completion parses without running anything
        shared(ctx).given(**{param.name: value})
    return value
