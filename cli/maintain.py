"""``kstore maintain``: the maintenance service (retention, compaction, merging, vacuum when each
topic's config says they are due), and ``kstore maintain status``.

The service runs in this process, without a JVM; kstore.maintenance is imported inside the
commands so that ``kstore --help`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from kstore.cli.common import UsageError, error_message, human_bytes, ms_to_iso, note, redactor
from kstore.cli.options import shared
from kstore.cli.output import Column, TextOutput
from kstore.cli.timeparse import parse_duration_ms
from kstore.cli.ui import refresh_seconds

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
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            min=0,
            max=65535,
            help="Serve Prometheus metrics on this port (/metrics): the store's topics, "
            "groups, lag and maintenance state, and this process's task runs.",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="Address the metrics are served on.")
    ] = "127.0.0.1",
    metrics_refresh: Annotated[
        str,
        typer.Option(
            "--metrics-refresh",
            help="How often the metrics' snapshot of the store is read (each topic and group "
            "log at most once per refresh, whatever the number of scrapes).",
        ),
    ] = "15s",
) -> None:
    """Run the maintenance service: each interval, plan what is due and run it in this process,
    one log line per task run. SIGTERM or Ctrl-C stops it after the task in progress."""
    if ctx.invoked_subcommand is not None:
        return
    from kstore.maintenance.service import Service, TaskRun

    settings = _settings(interval, vacuum_interval, lease, merge_min_segments)
    refresh_s = refresh_seconds(metrics_refresh, "--metrics-refresh")
    handle = shared(ctx).open_store(segment_cache_bytes=0)
    for name in topic or []:
        handle.topic(name)  # an unknown topic is an error now, not on every pass

    def log(line: str) -> None:
        typer.echo(line)

    exporter = None
    if metrics_port is not None:
        exporter = _Exporter(ctx, settings, metrics_host, metrics_port, refresh_s)
    counts = exporter.runs if exporter is not None else None

    class CountedService(Service):
        """The service, counting its runs for /metrics."""

        def run_once(self) -> list[TaskRun]:
            runs = super().run_once()
            if counts is not None:
                for run in runs:
                    counts.count(run.task, run.outcome, run.records, run.bytes, run.segments)
            return runs

    service = CountedService(handle, settings, topics=topic or None, log=log)
    try:
        _serve(ctx, service, once=once, interval=interval, vacuum_interval=vacuum_interval)
    finally:
        if exporter is not None:
            exporter.close()


def _serve(
    ctx: typer.Context, service: Any, *, once: bool, interval: str, vacuum_interval: str
) -> None:
    from kstore.maintenance.service import handle_stop_signals

    with handle_stop_signals(service):
        if once:
            runs = service.run_once()
            if any(r.outcome == "error" for r in runs):
                raise typer.Exit(1)
            return
        shared(ctx).output.notice(
            f"maintaining every {interval} (vacuum every {vacuum_interval}) as {service.holder}; "
            "SIGTERM or Ctrl-C stops"
        )
        service.run_forever()


class _Exporter:
    """``--metrics-port``: the console's metrics (kstore.console), served by prometheus_client
    from a store object of their own, refreshed in a thread of their own."""

    def __init__(
        self, ctx: typer.Context, settings: Settings, host: str, port: int, refresh_s: float
    ) -> None:
        from kstore.console import RunCounts, Snapshots, StoreCollector, open_coalescing_store
        from kstore.console.metrics import registry_for
        from kstore.console.snapshot import request_counter
        from prometheus_client import start_http_server

        from kstore.storage import redact_url

        given = shared(ctx).settings()
        store = open_coalescing_store(given.url, given.options)
        self.runs = RunCounts()
        self.snapshots = Snapshots(
            store, refresh_s=refresh_s, maintenance_settings=settings, explain=error_message
        )
        self._counting = request_counter(store)
        requests = self._counting.__enter__() if store.storage.counts_requests else None
        collector = StoreCollector(
            self.snapshots,
            cluster_name=redact_url(given.url),
            requests=requests,
            runs=self.runs,
            redact=redactor(),
        )
        try:
            self.server, _ = start_http_server(port, addr=host, registry=registry_for([collector]))
        except OSError as exc:
            self._counting.__exit__(None, None, None)
            raise UsageError(f"--metrics-port: cannot listen on {host}:{port}: {exc}") from None
        self.snapshots.start()
        shown_host = f"[{host}]" if ":" in host else host
        note(f"metrics at http://{shown_host}:{self.server.server_port}/metrics")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.snapshots.stop()
        self._counting.__exit__(None, None, None)


@app.command(
    epilog="Examples:\n\n  kstore maintain status\n\n  kstore maintain status orders -o json"
)
def status(
    ctx: typer.Context,
    topics: TopicsArg = None,
    interval: IntervalOpt = _DEFAULTS["interval"],
    vacuum_interval: VacuumIntervalOpt = _DEFAULTS["vacuum_interval"],
    merge_min_segments: MergeMinOpt = 8,
) -> None:
    """Per topic: each task's last run (when, outcome, what it removed) and when it is due next;
    per partition: dirty ratio and open transactions with their age. Reads only."""
    from kstore.maintenance.service import status as maintenance_status

    settings = _settings(interval, vacuum_interval, _DEFAULTS["lease"], merge_min_segments)
    data = maintenance_status(
        shared(ctx).open_store(segment_cache_bytes=0), settings, topics or None
    )
    shared(ctx).output.record(data, view=lambda text: _show_status(text, data))


def _when(ms: int | None, now: int) -> str:
    if ms is None:
        return "-"
    if ms <= now:
        return "now"
    return ms_to_iso(ms)


def _show_status(text: TextOutput, data: dict[str, Any]) -> None:
    now = int(data["now_ms"])

    def last(field: str, show: Any = None) -> Any:
        """A cell of the task's last run ('-' when it never ran)."""

        def value(row: tuple[str, dict[str, Any]]) -> Any:
            run = row[1]["last_run"]
            return None if not run else (show(run[field]) if show else run[field])

        return value

    rows = [(t["topic"], task) for t in data["topics"] for task in t["tasks"]]
    rows += [("(store)", task) for task in data["store_tasks"]]
    text.table(
        rows,
        [
            Column("TOPIC", 0),
            Column("TASK", lambda row: row[1]["task"]),
            Column("LAST RUN", last("finished_ms", ms_to_iso)),
            Column("OUTCOME", last("outcome")),
            Column("RECORDS", last("records"), right=True),
            Column("BYTES", last("bytes", human_bytes), right=True),
            Column("SEGMENTS", last("segments"), right=True),
            Column("FILES", last("files"), right=True),
            Column("NEXT", lambda row: "due" if row[1]["due"] else _when(row[1]["next_ms"], now)),
            Column("WHY", lambda row: row[1]["reason"]),
        ],
    )

    def oldest_transaction(p: dict[str, Any]) -> str | None:
        ages = [o["age_ms"] for o in p["open_transactions"] if o["age_ms"] is not None]
        return f"{max(ages) / 1000:.1f} s" if ages else None

    text.table(
        [(t["topic"], p) for t in data["topics"] for p in t["partitions"]],
        [
            Column("TOPIC", 0),
            Column("PARTITION", lambda row: row[1]["partition"], right=True),
            Column("SEGMENTS", lambda row: row[1]["segments"], right=True),
            Column("BYTES", lambda row: human_bytes(row[1]["bytes"]), right=True),
            Column("LOG-START", lambda row: row[1]["log_start_offset"], right=True),
            Column("DIRTY-RATIO", lambda row: f"{row[1]['dirty_ratio']:.2f}", right=True),
            Column("OPEN-TXNS", lambda row: len(row[1]["open_transactions"]), right=True),
            Column("OLDEST-TXN-AGE", lambda row: oldest_transaction(row[1])),
            Column("LAST-CHANGED", lambda row: _last_changed(row[1]["last_runs"])),
        ],
    )
    for topic, why in sorted(data["errors"].items()):
        text.message(f"{topic}: not read: {why}")


def _last_changed(runs: list[dict[str, Any]]) -> str | None:
    """The newest run that changed the partition: task, when, and what it removed there."""
    if not runs:
        return None
    run = max(runs, key=lambda r: r["finished_ms"])
    return (
        f"{run['task']} {ms_to_iso(run['finished_ms'])}: -{run['records']} records, "
        f"-{human_bytes(run['bytes'])}, -{run['segments']} segments"
    )
