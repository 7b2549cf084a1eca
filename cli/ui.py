"""``kstore ui``: the web console and ``/metrics`` of a store (kstore.console), until Ctrl-C or
SIGTERM (exit 0)."""

from __future__ import annotations

import signal
from types import FrameType
from typing import Annotated

import typer
from kstore.cli.common import UsageError, error_message, note, redactor
from kstore.cli.options import shared
from kstore.cli.timeparse import parse_duration_ms

HostOpt = Annotated[
    str,
    typer.Option(
        "--host",
        help="Address to listen on. The default, 127.0.0.1, serves this machine only; "
        "0.0.0.0 serves every network the machine is on (the console has no login).",
    ),
]
PortOpt = Annotated[int, typer.Option("--port", min=0, max=65535, help="Port (0: any free one).")]
RefreshOpt = Annotated[
    str,
    typer.Option(
        "--refresh",
        help="How often the store is read (each topic and group log at most once per "
        "refresh, whatever the number of browsers and scrapes); the pages reload as often.",
    ),
]


def refresh_seconds(text: str, option: str = "--refresh") -> float:
    try:
        ms = parse_duration_ms(text)
    except ValueError as exc:
        raise UsageError(f"{option} {text!r}: {exc}") from None
    if ms < 500:
        raise UsageError(f"{option} must be at least 500ms, got {text!r}")
    return ms / 1000


def ui(
    ctx: typer.Context,
    port: PortOpt = 8080,
    host: HostOpt = "127.0.0.1",
    refresh: RefreshOpt = "5s",
    allow_writes: Annotated[
        bool,
        typer.Option(
            "--allow-writes",
            help="Offer the two actions that change the store, each confirmed on a second "
            "page: reset a group's offsets, delete a partition's records.",
        ),
    ] = False,
    cluster_name: Annotated[
        str | None,
        typer.Option(
            "--cluster-name",
            help="The cluster_name label of the group-lag metrics (default: the store URL, "
            "credentials removed).",
        ),
    ] = None,
) -> None:
    """Serve a web console of the store: topics, records, consumer groups and their lag,
    maintenance; and its Prometheus metrics at /metrics. Read-only unless --allow-writes."""
    from kstore.console import serve

    from kstore.storage import redact_url

    refresh_s = refresh_seconds(refresh)
    settings = shared(ctx).settings()
    try:
        server = serve(
            settings.url,
            settings.options,
            host=host,
            port=port,
            refresh_s=refresh_s,
            allow_writes=allow_writes,
            cluster_name=cluster_name,
            redact=redactor(),
            explain=error_message,
            log=note,
            in_thread=False,
        )
    except OSError as exc:
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    mode = "read-write" if allow_writes else "read-only"
    note(
        f"kstore console of {redact_url(settings.url)} ({mode}, refreshed every {refresh}) at "
        f"{server.url}/ ; metrics at {server.url}/metrics ; Ctrl-C stops"
    )
    previous = signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop: as Ctrl-C
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        note("stopping")
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
        server.console.close()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt
