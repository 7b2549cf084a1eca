"""``kstore compact|retain|vacuum|merge``: the maintenance jobs, from the command line.

Each verb runs one job of :mod:`kstore.compaction` or :mod:`kstore.retention` on a local Spark
(``--spark local[N]``, the default), in this process without a JVM (``--no-spark``), or prints
the ``spark-submit`` command line that runs it on a cluster (``--print-submit``).

Nothing here imports pyspark or the job modules at import time: ``kstore --help`` and the other
commands must stay fast. They are imported inside the commands.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from kstore.cli.common import (
    EXIT_FAILURE,
    StoreSettings,
    UsageError,
    debug_enabled,
    human_bytes,
    note,
    open_store,
    redactor,
)
from kstore.cli.options import shared
from kstore.cli.output import Column, Output, TextOutput
from kstore.cli.timeparse import parse_duration_ms

if TYPE_CHECKING:
    from kstore.compaction.jobs import Summary

ENV_OPTION_PREFIX = "KSTORE_OPTION_"
DEFAULT_MASTER = "local[*]"
_LOCAL_MASTER = re.compile(r"local(\[(\*|[1-9]\d*)(,\s*\d+)?\])?")
_JOB_PANEL = "How to run"


@dataclass(frozen=True)
class Job:
    """One verb: the library function it calls and how the job's own command line names it."""

    verb: str
    module: str  # kstore.compaction or kstore.retention
    function: str
    submit_command: str  # the positional COMMAND of that module's main()


JOBS = {
    "compact": Job("compact", "kstore.compaction", "run_compaction", "compact"),
    "merge": Job("merge", "kstore.compaction", "merge_segments", "merge"),
    "retain": Job("retain", "kstore.retention", "run_retention", "retention"),
    "vacuum": Job("vacuum", "kstore.retention", "vacuum", "vacuum"),
}

# -- options shared by the four verbs ---------------------------------------------------------------

TopicsArg = Annotated[
    list[str] | None,
    typer.Argument(
        metavar="TOPIC",
        help="Topics to maintain (default: every topic the job applies to).",
        show_default=False,
    ),
]
SparkOpt = Annotated[
    str | None,
    typer.Option(
        "--spark",
        metavar="MASTER",
        rich_help_panel=_JOB_PANEL,
        help="Run on a local Spark: local, local[N] or local[*] (the default). With "
        "--print-submit, any master (yarn, spark://..., k8s://...), passed as --master.",
        show_default=False,
    ),
]
NoSparkOpt = Annotated[
    bool,
    typer.Option(
        "--no-spark",
        rich_help_panel=_JOB_PANEL,
        help="Run in this process, without Spark or a JVM (one partition after another).",
    ),
]
PrintSubmitOpt = Annotated[
    bool,
    typer.Option(
        "--print-submit",
        rich_help_panel=_JOB_PANEL,
        help="Run nothing: print the spark-submit command line that runs the job on a "
        f"cluster. Secrets are printed as ${ENV_OPTION_PREFIX}<NAME> references, never as values.",
    ),
]
DryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="Report what the job would do; change nothing.")
]
TasksOpt = Annotated[
    int | None,
    typer.Option(
        "--tasks",
        min=1,
        metavar="N",
        rich_help_panel=_JOB_PANEL,
        help="Spark tasks (default: 4 per core, at most one per partition).",
        show_default=False,
    ),
]


# -- the commands ---------------------------------------------------------------------------------

_COMMON_EPILOG = (
    "Runs on a local Spark unless --no-spark (no JVM) or --print-submit (a cluster).\n\n"
    "Exit code 1 when a partition failed (the errors are listed on stderr)."
)


def _job_command(verb: str, doc: str) -> Callable[..., None]:
    """The command of a verb that takes the options every job shares, and no others."""

    def command(
        ctx: typer.Context,
        topics: TopicsArg = None,
        spark: SparkOpt = None,
        no_spark: NoSparkOpt = False,
        print_submit: PrintSubmitOpt = False,
        dry_run: DryRunOpt = False,
        tasks: TasksOpt = None,
    ) -> None:
        _run(ctx, JOBS[verb], _Args(topics, spark, no_spark, print_submit, dry_run, tasks))

    command.__name__ = command.__qualname__ = verb
    command.__doc__ = doc
    return command


compact = _job_command(
    "compact",
    """Compact topics with cleanup.policy=compact: keep the latest record of each key.

    Kafka's log cleaner: older records of a key are dropped, tombstones after
    delete.retention.ms. Topics whose policy does not include compact are left alone.
    """,
)
merge = _job_command(
    "merge",
    """Merge small segments into Parquet segments near segment.bytes.

    Every record and offset is kept; readers see the same log, in fewer files.
    """,
)
retain = _job_command(
    "retain",
    """Apply retention.ms and retention.bytes: remove old segments, advance the log start.

    Only topics whose cleanup.policy includes delete. Reads manifests only, never records.
    """,
)


def vacuum(
    ctx: typer.Context,
    topics: TopicsArg = None,
    orphan_age: Annotated[
        str | None,
        typer.Option(
            "--orphan-age",
            metavar="DURATION",
            help="Delete unreferenced files older than this (default 1h; at least 10m).",
            show_default=False,
        ),
    ] = None,
    log_retention: Annotated[
        str | None,
        typer.Option(
            "--log-retention",
            metavar="DURATION",
            help="Keep log versions this long (default 2d, at least the minimum the "
            "library allows).",
            show_default=False,
        ),
    ] = None,
    spark: SparkOpt = None,
    no_spark: NoSparkOpt = False,
    print_submit: PrintSubmitOpt = False,
    dry_run: DryRunOpt = False,
    tasks: TasksOpt = None,
) -> None:
    """Delete files no reader needs: removed segments past file.delete.delay.ms, old orphans,
    old log versions and data of deleted topics.

    With --dry-run, lists the files it would delete and deletes nothing.
    """
    ages: dict[str, int] = {}
    try:
        if orphan_age is not None:
            ages["orphan_age_ms"] = parse_duration_ms(orphan_age)
        if log_retention is not None:
            ages["log_retention_ms"] = parse_duration_ms(log_retention)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if ages:
        from kstore.retention import MIN_LOG_RETENTION_MS, MIN_ORPHAN_AGE_MS

        for flag, given, key, minimum, why in (
            ("--orphan-age", orphan_age, "orphan_age_ms", MIN_ORPHAN_AGE_MS,
             "a file that young may still be committed by a producer or a job"),
            ("--log-retention", log_retention, "log_retention_ms", MIN_LOG_RETENTION_MS,
             "a writer or reader may still hold a state that old"),
        ):  # fmt: skip
            if key in ages and ages[key] < minimum:
                raise UsageError(
                    f"{flag} {given} is below the minimum of {_duration(minimum)}: {why}"
                )
    _run(ctx, JOBS["vacuum"], _Args(topics, spark, no_spark, print_submit, dry_run, tasks, ages))


EPILOGS = {
    "compact": "Examples:\n\n"
    "  kstore compact                              (every compacted topic, local Spark)\n\n"
    "  kstore compact users --no-spark --dry-run\n\n"
    "  kstore compact --print-submit --spark yarn  (the command line for a cluster)\n\n"
    + _COMMON_EPILOG,
    "merge": "Examples:\n\n"
    "  kstore merge clicks --no-spark\n\n"
    "  kstore merge --spark 'local[8]' -o json\n\n"
    "  kstore merge --print-submit --store s3://bucket/ks\n\n" + _COMMON_EPILOG,
    "retain": "Examples:\n\n"
    "  kstore retain                               (every topic with cleanup.policy delete)\n\n"
    "  kstore retain orders --no-spark --dry-run\n\n"
    "  kstore retain --print-submit --spark yarn --tasks 64\n\n" + _COMMON_EPILOG,
    "vacuum": "Examples:\n\n"
    "  kstore vacuum --dry-run --no-spark          (list what would be deleted)\n\n"
    "  kstore vacuum --orphan-age 6h --log-retention 7d\n\n"
    "  kstore vacuum --print-submit --spark yarn\n\n" + _COMMON_EPILOG,
}
COMMANDS: dict[str, Callable[..., None]] = {
    "compact": compact,
    "merge": merge,
    "retain": retain,
    "vacuum": vacuum,
}


# -- running a job --------------------------------------------------------------------------------


@dataclass
class _Args:
    topics: list[str] | None
    spark: str | None
    no_spark: bool
    print_submit: bool
    dry_run: bool
    tasks: int | None
    extra: Mapping[str, int] | None = None  # vacuum: orphan_age_ms, log_retention_ms


def _run(ctx: typer.Context, job: Job, args: _Args) -> None:
    if args.no_spark and args.print_submit:
        raise UsageError("--no-spark and --print-submit exclude each other")
    if args.no_spark and args.spark is not None:
        raise UsageError("--no-spark and --spark exclude each other")
    master = args.spark
    if master is not None and not args.print_submit:
        master = "local[*]" if master.strip() == "local" else master.strip()
        if not _LOCAL_MASTER.fullmatch(master):
            raise UsageError(
                f"--spark {args.spark!r}: only a local master (local, local[N], local[*]) runs "
                "here; for a cluster, use --print-submit"
            )
    settings = shared(ctx).settings()
    out = shared(ctx).output
    extra = dict(args.extra or {})
    topics = list(dict.fromkeys(args.topics or [])) or None
    if args.print_submit:
        _print_submit(job, settings, topics, args, master, out)
        return

    from kstore.storage import is_process_local

    if is_process_local(settings.url) and not args.no_spark:
        raise UsageError(
            "a memory:// store exists only in this process, out of Spark's reach: use --no-spark"
        )
    # Fail on a wrong store or topic before starting Spark (seconds) or touching anything.
    # No segment cache: a job reads each segment at most once.
    handle = open_store(settings, segment_cache_bytes=0)
    for name in topics or []:
        handle.topic(name)

    import importlib

    function = getattr(importlib.import_module(job.module), job.function)
    with contextlib.ExitStack() as stack:
        session = None if args.no_spark else stack.enter_context(_local_spark(master, job.verb))
        stack.enter_context(_JobProgress(job.verb))
        summary: Summary = function(
            session,
            handle,
            None,
            topics,
            dry_run=args.dry_run,
            tasks=args.tasks,
            verbose=True,  # progress lines, into the display above
            **extra,
        )
    _report(job, summary, out)


@contextlib.contextmanager
def _local_spark(master: str | None, verb: str) -> Iterator[Any]:
    """A local SparkSession: the running one if there is one (then it is left running), else a
    new one, stopped afterwards. Spark's Python workers run this interpreter (it has kstore)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pyspark and a newer pandas
        from kstore.compaction.jobs import job_session
        from pyspark import SparkContext

        existing = getattr(SparkContext, "_active_spark_context", None) is not None
        # Spark's start-up warnings say nothing about the job; --debug shows them all.
        session = job_session(
            f"kstore-{verb}",
            master=master or DEFAULT_MASTER,
            quiet=not debug_enabled(),
            config={"spark.ui.enabled": "false"},  # (nor a console bar: ours instead)
        )
    try:
        yield session
    finally:
        if not existing:
            session.stop()


class _JobProgress:
    """Shows the job's progress on stderr. On a terminal, a live rich progress line that ends
    at N/N; elsewhere (a pipe, a log file) no live line: the plan line as it comes and the last
    progress step once, at the end. The jobs print progress with
    ``kstore.compaction.jobs.stderr_progress`` (when ``verbose``) and their summary on stdout;
    while a job runs, the former is replaced by this display and the latter is dropped, so that
    stdout carries only our table or JSON."""

    _PLAN = re.compile(r"^\[(?P<op>[\w-]+)\] (?P<n>\d+) partition\(s\) of (?P<t>\d+) topic\(s\)")
    _STEP = re.compile(r"^\[(?P<op>[\w-]+)\] (?P<done>\d+)/(?P<total>\d+) (?P<rest>.*)$")

    def __init__(self, verb: str, *, interactive: bool | None = None) -> None:
        self.verb = verb
        self.interactive = sys.stderr.isatty() if interactive is None else interactive
        self._stack = contextlib.ExitStack()
        self._bar: Any = None
        self._task: Any = None
        self._last_step: str | None = None  # off a terminal: written once, at the end

    def __enter__(self) -> _JobProgress:
        from kstore.compaction import jobs

        if self.interactive:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = self._stack.enter_context(
                Progress(
                    SpinnerColumn(),
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    console=Console(file=sys.stderr, force_terminal=True),
                    transient=False,  # the final N/N stays on screen
                )
            )
            self._task = self._bar.add_task(f"{self.verb}: planning", total=None)
        self._stack.enter_context(_patched(jobs, "stderr_progress", self.update))
        self._stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()
        if self._last_step is not None:
            note(self._last_step)

    def update(self, message: str) -> None:
        message = redactor()(message)
        if self._bar is None:
            if self._STEP.match(message):
                self._last_step = message
            else:
                note(message)
            return
        if plan := self._PLAN.match(message):
            n = int(plan["n"])
            where = "on Spark" if message.endswith("on Spark") else "in this process"
            self._bar.update(
                self._task,
                description=f"{self.verb}: {n} partition(s) of {plan['t']} topic(s) {where}",
                total=None if where == "on Spark" else n,
            )
        elif step := self._STEP.match(message):
            self._bar.update(
                self._task,
                completed=int(step["done"]),
                total=int(step["total"]),
                description=f"{self.verb}: {step['rest']}",
            )


@contextlib.contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


def _duration(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms >= size and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


# -- output ---------------------------------------------------------------------------------------


def _report(job: Job, summary: Summary, out: Output) -> None:
    failed = summary.errors
    out.record(
        {"ok": not failed, **summary.to_dict()}, view=lambda text: _show_summary(text, job, summary)
    )
    for result in failed:
        out.notice(f"error: {result.topic}-{result.partition}: {result.reason or 'failed'}")
    if failed:
        raise typer.Exit(EXIT_FAILURE)


_COLUMNS = (
    "TOPIC",
    "PARTITIONS",
    "COMMITTED",
    "SEGMENTS-REMOVED",
    "SEGMENTS-WRITTEN",
    "BYTES-BEFORE",
    "BYTES-AFTER",
    "RECORDS-DROPPED",
    "FILES-DELETED",
)


def _show_summary(text: TextOutput, job: Job, summary: Summary) -> None:
    changed = "would change" if summary.dry_run else "committed"
    changes = summary.count("dry-run") if summary.dry_run else summary.count("committed")
    text.line(
        f"{summary.operation}{' (dry run)' if summary.dry_run else ''} of {summary.store}: "
        f"{summary.partitions_scanned} partition(s) scanned, {changed} {changes}, "
        f"skipped {summary.count('skipped')}, conflicts {summary.count('conflict')}, "
        f"errors {summary.count('error')}; {summary.tasks} task(s), {summary.elapsed_s:.2f} s"
    )
    text.lines(f"  {line}" for line in summary.notes)
    if not summary.partitions and not summary.extra_files:
        return
    # A dry run changes nothing: its column counts what would change (JSON: dry_run_changes).
    columns = (
        ("TOPIC", "PARTITIONS", "WOULD-CHANGE", *_COLUMNS[3:]) if summary.dry_run else _COLUMNS
    )
    counted = "dry-run" if summary.dry_run else "committed"
    by_topic: dict[str, list[Any]] = {}
    for result in summary.partitions:
        by_topic.setdefault(result.topic, []).append(result)

    def row(name: str, results: Sequence[Any], extra_files: int = 0) -> list[Any]:
        def total(attr: str) -> int:
            return sum(int(getattr(r, attr)) for r in results)

        return [
            name,
            len(results),
            sum(1 for r in results if r.outcome == counted),
            total("segments_removed"),
            total("segments_written"),
            human_bytes(total("bytes_before")),
            human_bytes(total("bytes_after")),
            total("records_before") - total("records_after"),
            total("files_deleted") + extra_files,
        ]

    rows = [row(name, results) for name, results in by_topic.items()]
    if len(by_topic) > 1 or summary.extra_files:
        rows.append(row("TOTAL", summary.partitions, len(summary.extra_files)))
    text.table(rows, [Column(name, index, right=index > 0) for index, name in enumerate(columns)])
    if job.verb == "vacuum" and summary.dry_run and summary.files:
        text.lines(["Would delete:", *(f"  {path}" for path in summary.files)])


# -- spark-submit ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _EnvRef:
    """A value the printed command takes from the environment instead of showing it."""

    name: str


_Word = list[str | _EnvRef]  # one shell word: literal text and environment references
_MARK = re.compile(r"@@KSTORE-ENV:([A-Z0-9_]+)@@")


def _env_name(path: Sequence[str]) -> str:
    """The CLI's own variable for an option (``KSTORE_OPTION_CLIENT_KWARGS__SECRET``)."""
    return ENV_OPTION_PREFIX + "__".join(p.upper() for p in path)


def _with_placeholders(
    options: Mapping[str, Any], shown: Mapping[str, Any], path: tuple[str, ...], refs: list[str]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in options.items():
        hidden = shown.get(name)
        if isinstance(value, Mapping) and isinstance(hidden, Mapping):
            out[name] = _with_placeholders(value, hidden, (*path, name), refs)
        elif hidden == "***" and value is not None:
            env = _env_name((*path, name))
            refs.append(env)
            out[name] = f"@@KSTORE-ENV:{env}@@"
        else:
            out[name] = value
    return out


def _split_marks(literal: str) -> _Word:
    word: _Word = []
    position = 0
    for match in _MARK.finditer(literal):
        if match.start() > position:
            word.append(literal[position : match.start()])
        word.append(_EnvRef(match.group(1)))
        position = match.end()
    if position < len(literal):
        word.append(literal[position:])
    return word


def _option_words(options: Mapping[str, Any]) -> tuple[list[_Word], list[str]]:
    """``--option KEY=VALUE`` words as the job's parser reads them (a VALUE is JSON when it
    parses as JSON; nested options are one JSON object), secrets as environment references."""
    from kstore.storage import redact_options

    refs: list[str] = []
    marked = _with_placeholders(options, redact_options(options), (), refs)
    words: list[_Word] = []
    for name, value in marked.items():
        if isinstance(value, str):
            try:
                json.loads(value)
            except ValueError:
                literal = value  # the job keeps it as the string it is
            else:
                literal = json.dumps(value)  # would be parsed into a number, a bool...
        else:
            literal = json.dumps(value, separators=(",", ":"))
        words += [["--option"], _split_marks(f"{name}={literal}")]
    return words, refs


def _render(word: _Word) -> str:
    if not word:
        return "''"
    return "".join(
        f'"${part.name}"' if isinstance(part, _EnvRef) else shlex.quote(part) for part in word
    )


def submit_command(
    job: Job,
    settings: StoreSettings,
    topics: Sequence[str] | None,
    *,
    dry_run: bool = False,
    tasks: int | None = None,
    extra: Mapping[str, int] | None = None,
    master: str | None = None,
) -> tuple[str, list[str]]:
    """The spark-submit command line that runs ``job`` on a cluster, and the environment
    variables it reads (the secrets, which it never contains)."""
    import importlib

    from kstore.cli.common import secrets_of_url

    script: str = importlib.import_module(job.module).SUBMIT_SCRIPT
    words: list[_Word] = [["spark-submit"]]
    if master:
        words += [["--master"], [master]]
    words.append([script])
    refs: list[str] = []
    if secrets_of_url(settings.url):
        words += [["--store"], [_EnvRef("KSTORE_STORE")]]
        refs.append("KSTORE_STORE")
    else:
        words += [["--store"], [settings.url]]
    option_words, option_refs = _option_words(settings.options)
    words += option_words
    refs += option_refs
    for topic in topics or []:
        words += [["--topic"], [topic]]
    if dry_run:
        words.append(["--dry-run"])
    if tasks is not None:
        words += [["--tasks"], [str(tasks)]]
    for name, value in (extra or {}).items():
        words += [[f"--{name.replace('_', '-')}"], [str(value)]]
    words.append([job.submit_command])
    return " ".join(_render(w) for w in words), refs


def _print_submit(
    job: Job,
    settings: StoreSettings,
    topics: Sequence[str] | None,
    args: _Args,
    master: str | None,
    out: Output,
) -> None:
    from kstore.storage import is_process_local

    if is_process_local(settings.url):
        raise UsageError("a memory:// store exists only in one process: a cluster cannot reach it")
    command, refs = submit_command(
        job,
        settings,
        topics,
        dry_run=args.dry_run,
        tasks=args.tasks,
        extra=args.extra,
        master=master,
    )

    def view(text: TextOutput) -> None:
        text.line(command)
        if refs:
            text.message(f"The command reads these secrets from the environment: {', '.join(refs)}")

    out.record({"command": command, "environment": refs}, view)
