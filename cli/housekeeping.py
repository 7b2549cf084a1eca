"""``kstore transactions abort-expired``: transaction timeouts, enforced when it runs
(docs/PROTOCOL.md 20.6); ``kstore prune-logs``: old versions of group, producer and topic
metadata logs (17.5). Registered on the root app by :func:`register`."""

from __future__ import annotations

from typing import Annotated

import typer
from kstore.cli.common import UsageError
from kstore.cli.options import shared
from kstore.cli.timeparse import parse_duration_ms

DryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="Report what would be done; change nothing.")
]

transactions = typer.Typer(
    name="transactions",
    help="Transactions of transactional producers: finish those open past their timeout.",
    epilog="Examples:\n\n  kstore transactions abort-expired --dry-run",
    no_args_is_help=True,
)


@transactions.command(
    "abort-expired",
    epilog="Examples:\n\n  kstore transactions abort-expired --dry-run\n\n"
    "  kstore transactions abort-expired orders -o json",
)
def abort_expired(
    ctx: typer.Context,
    topics: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="TOPIC",
            help="Only transactions that wrote to these topics (default: every one).",
            show_default=False,
        ),
    ] = None,
    dry_run: DryRunOpt = False,
) -> None:
    """Abort every transaction open longer than its producer's transaction_timeout_ms (by the
    storage's clock), as a new producer with its transactional id would: the old producer is
    fenced, and a transaction whose commit was already decided is rolled forward instead."""
    from kstore.retention import abort_expired_transactions

    report = abort_expired_transactions(shared(ctx).open_store(), topics or None, dry_run=dry_run)
    shared(ctx).output.record(report.to_dict(), view=lambda text: text.line(report.format()))


def prune_logs(
    ctx: typer.Context,
    log_retention: Annotated[
        str,
        typer.Option(
            "--log-retention",
            metavar="DURATION",
            help="Keep log versions this long (at least 2d).",
        ),
    ] = "2d",
    dry_run: DryRunOpt = False,
) -> None:
    """Delete old versions of consumer group, producer and topic metadata logs: below the
    newest checkpoint older than --log-retention, and write a checkpoint where old commits have
    none after them (a later run deletes them). Partition and topic logs are vacuum's."""
    from kstore.retention import MIN_LOG_RETENTION_MS
    from kstore.retention import prune_logs as prune

    try:
        keep_ms = parse_duration_ms(log_retention)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if keep_ms < MIN_LOG_RETENTION_MS:
        raise UsageError(
            f"--log-retention {log_retention} is below the minimum of 2d: a writer or reader "
            "may still hold a state that old"
        )
    report = prune(shared(ctx).open_store(), keep_ms=keep_ms, dry_run=dry_run)
    shared(ctx).output.record(report.to_dict(), view=lambda text: text.line(report.format()))


def register(app: typer.Typer) -> None:
    """Add these commands to the root ``kstore`` app."""
    app.add_typer(transactions, name="transactions")
    app.command(
        "prune-logs",
        epilog="Examples:\n\n  kstore prune-logs --dry-run\n\n"
        "  kstore prune-logs --log-retention 7d -o json",
    )(prune_logs)
