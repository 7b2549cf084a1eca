"""``kstore maintain``: the maintenance service (retention, compaction, merging, vacuum when each
topic's config says they are due), and ``kstore maintain status``.

The service runs in this process, without a JVM; kstore.maintenance is imported inside the
commands so that ``kstore --help`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from kstore.cli.common import (
    ConfigFileOpt,
    DebugOpt,
    OptionOpt,
    OutputFormat,
    OutputOpt,
    StoreOpt,
    UsageError,
    human_bytes,
    ms_to_iso,
    new_table,
    note,
    print_json,
    print_table,
    store_from,
    text,
)
from kstore.cli.timeparse import parse_duration_ms

if TYPE_CHECKING:
    from kstore.maintenance import Settings

app = typer.Typer(
    name="maintain",
    help="Run maintenance when each topic's config says it is due (retention every interval, "
    "compaction by dirty ratio, merging, vacuum); several at once are safe.",
    epilog="Examples:\n\n"
    "  kstore maintain                       (every 5 minutes until SIGTERM)\n\n"
    "  kstore maintain --once --interval 1m  (one pass, for cron)\n\n"
    "  kstore maintain status orders -o json",
    invoke_without_command=True,
)

_DEFAULTS = {"interval": "5m", "vacuum_interval": "1h", "lease": "15m"}


def _duration(name: str, value: str) -> int:
    try:
        ms = parse_duration_ms(value)
    except ValueError as exc:
        raise UsageError(f"--{name.replace('_', '-')} {value!r}: {exc}") from None
    if ms < 1:
        raise UsageError(f"--{name.replace('_', '-')} must be at least 1ms, got {value!r}")
    return ms


def _settings(interval: str, vacuum_interval: str, lease: str, merge_min_segments: int) -> Settings:
    from kstore.maintenance import Settings

    if merge_min_segments < 2:
        raise UsageError(f"--merge-min-segments must be at least 2, got {merge_min_segments}")
    return Settings(
        interval_ms=_duration("interval", interval),
        vacuum_interval_ms=_duration("vacuum_interval", vacuum_interval),
        merge_min_segments=merge_min_segments,
        lease_ms=_duration("lease", lease),
    )


IntervalOpt = Annotated[
    str,
    typer.Option(
        "--interval",
        help="How often to check (Kafka's log.retention.check.interval.ms); also the least time "
        "between two runs of one task on one topic.",
    ),
]
VacuumIntervalOpt = Annotated[
    str, typer.Option("--vacuum-interval", help="How often each topic is vacuumed.")
]
LeaseOpt = Annotated[
    str,
    typer.Option(
        "--lease",
        help="How long a task's lease lasts: a dead maintainer's work is taken over after it.",
    ),
]
MergeMinOpt = Annotated[
    int,
    typer.Option(
        "--merge-min-segments", help="Merge a partition once this many of its segments can merge."
    ),
]
TopicsArg = Annotated[
    list[str] | None,
    typer.Argument(metavar="TOPIC", help="Only these topics (default: all).", show_default=False),
]


@app.callback()
def maintain(
    ctx: typer.Context,
    topic: Annotated[
        list[str] | None, typer.Option("--topic", help="Only this topic (repeatable).")
    ] = None,
    once: Annotated[
        bool, typer.Option("--once", help="One pass, then exit (cron, tests).")
    ] = False,
    interval: IntervalOpt = _DEFAULTS["interval"],
    vacuum_interval: VacuumIntervalOpt = _DEFAULTS["vacuum_interval"],
    lease: LeaseOpt = _DEFAULTS["lease"],
    merge_min_segments: MergeMinOpt = 8,
    store: StoreOpt = None,
    option: OptionOpt = None,
    config_file: ConfigFileOpt = None,
    debug: DebugOpt = False,
) -> None:
    """Run the maintenance service: each interval, plan what is due and run it in this process,
    one log line per task run. SIGTERM or Ctrl-C stops it after the task in progress."""
    if ctx.invoked_subcommand is not None:
        return
    from kstore.maintenance.service import Service, handle_stop_signals

    settings = _settings(interval, vacuum_interval, lease, merge_min_segments)
    handle = store_from(ctx, store, option, config_file, segment_cache_bytes=0)
    for name in topic or []:
        handle.topic(name)  # an unknown topic is an error now, not on every pass

    def log(line: str) -> None:
        typer.echo(line)

    service = Service(handle, settings, topics=topic or None, log=log)
    with handle_stop_signals(service):
        if once:
            runs = service.run_once()
            if any(r.outcome == "error" for r in runs):
                raise typer.Exit(1)
            return
        note(
            f"maintaining every {interval} (vacuum every {vacuum_interval}) as {service.holder}; "
            "SIGTERM or Ctrl-C stops"
        )
        service.run_forever()


@app.command(
    epilog="Examples:\n\n  kstore maintain status\n\n  kstore maintain status orders -o json"
)
def status(
    ctx: typer.Context,
    topics: TopicsArg = None,
    interval: IntervalOpt = _DEFAULTS["interval"],
    vacuum_interval: VacuumIntervalOpt = _DEFAULTS["vacuum_interval"],
    merge_min_segments: MergeMinOpt = 8,
    store: StoreOpt = None,
    option: OptionOpt = None,
    config_file: ConfigFileOpt = None,
    output: OutputOpt = OutputFormat.table,
    debug: DebugOpt = False,
) -> None:
    """Per topic: each task's last run (when, outcome, what it removed) and when it is due next;
    per partition: dirty ratio and open transactions with their age. Reads only."""
    from kstore.maintenance.service import status as maintenance_status

    settings = _settings(interval, vacuum_interval, _DEFAULTS["lease"], merge_min_segments)
    handle = store_from(ctx, store, option, config_file, segment_cache_bytes=0)
    data = maintenance_status(handle, settings, topics or None)
    if output is OutputFormat.json:
        print_json(data)
        return
    _print_status(data)


def _when(ms: int | None, now: int) -> str:
    if ms is None:
        return "-"
    if ms <= now:
        return "now"
    return ms_to_iso(ms)


def _print_status(data: dict[str, Any]) -> None:
    now = int(data["now_ms"])
    tasks = new_table(
        "TOPIC",
        "TASK",
        "LAST RUN",
        "OUTCOME",
        "RECORDS",
        "BYTES",
        "SEGMENTS",
        "FILES",
        "NEXT",
        "WHY",
        right=("RECORDS", "BYTES", "SEGMENTS", "FILES"),
    )
    rows = [(t["topic"], task) for t in data["topics"] for task in t["tasks"]]
    rows += [("(store)", task) for task in data["store_tasks"]]
    for topic, task in rows:
        last = task["last_run"]
        tasks.add_row(
            text(topic),
            text(task["task"]),
            text(ms_to_iso(last["finished_ms"]) if last else None),
            text(last["outcome"] if last else None),
            text(last["records"] if last else None),
            text(human_bytes(last["bytes"]) if last else None),
            text(last["segments"] if last else None),
            text(last["files"] if last else None),
            text("due" if task["due"] else _when(task["next_ms"], now)),
            text(task["reason"]),
        )
    print_table(tasks)
    parts = new_table(
        "TOPIC",
        "PARTITION",
        "SEGMENTS",
        "BYTES",
        "LOG-START",
        "DIRTY-RATIO",
        "OPEN-TXNS",
        "OLDEST-TXN-AGE",
        "LAST-CHANGED",
        right=("PARTITION", "SEGMENTS", "BYTES", "LOG-START", "DIRTY-RATIO", "OPEN-TXNS"),
    )
    for t in data["topics"]:
        for p in t["partitions"]:
            ages = [o["age_ms"] for o in p["open_transactions"] if o["age_ms"] is not None]
            parts.add_row(
                text(t["topic"]),
                text(p["partition"]),
                text(p["segments"]),
                text(human_bytes(p["bytes"])),
                text(p["log_start_offset"]),
                text(f"{p['dirty_ratio']:.2f}"),
                text(len(p["open_transactions"])),
                text(f"{max(ages) / 1000:.1f} s" if ages else None),
                text(_last_changed(p["last_runs"])),
            )
    print_table(parts)
    for topic, why in sorted(data["errors"].items()):
        note(f"{topic}: not read: {why}")


def _last_changed(runs: list[dict[str, Any]]) -> str | None:
    """The newest run that changed the partition: task, when, and what it removed there."""
    if not runs:
        return None
    run = max(runs, key=lambda r: r["finished_ms"])
    return (
        f"{run['task']} {ms_to_iso(run['finished_ms'])}: -{run['records']} records, "
        f"-{human_bytes(run['bytes'])}, -{run['segments']} segments"
    )
