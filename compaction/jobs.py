"""The machinery shared by the maintenance jobs (compaction, merging, retention, vacuum).

The driver reads topic metadata only (one topic log per topic), turns every partition to
maintain into a small :class:`WorkItem`, and spreads the items over Spark tasks, one task per
group of partitions. A task opens the store on its executor and runs the job's per-partition
function, which reads that partition's manifest, decides, writes new segments and commits with
:meth:`kstore.Partition.commit_actions`. Only a :class:`PartitionResult` (counts and bytes)
comes back to the driver: records never do.

Without a Spark session (``spark=None``) the same per-partition functions run in this process,
one after the other: the CLI uses that to maintain a store without a JVM, and tests to check
the rules quickly.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from kstore import clock
from kstore.config import MAX_UNCOMMITTED_MS
from kstore.errors import (
    CommitConflictError,
    ConcurrentModificationError,
    InvalidConfigurationError,
    KStoreError,
    UnknownTopicOrPartitionError,
)
from kstore.partition import Partition, PartitionState
from kstore.segments import BINARY, Layout, layout_of
from kstore.storage import redact_url
from kstore.store import Store, TopicMetadata, require_layout3
from kstore.topic_log import log_index

# A new file that a maintenance job wrote is committed within MAX_UNCOMMITTED_MS of the start
# of its write, by this machine's monotonic clock, or not at all (the job abandons the commit
# and deletes the file); vacuum's orphan age is at least twice that (PROTOCOL.md 23.1).

_NAME_TIME = re.compile(r"^(\d{13})-[0-9a-f]{32}\.(arrow|parquet|kdat)$")

Progress = Callable[[str], None]
# What a job that a topic's cleanup.policy leaves out says about that topic.
_NOTHING_TO = {"compaction": "nothing to compact", "retention": "no retention to apply"}


def stderr_progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class WorkItem:
    """One partition to maintain, with what the executor needs to open it without reading the
    topic log again."""

    topic: str
    topic_id: str
    partition: int
    config: dict[str, Any]  # the topic's effective config
    layout: Layout = BINARY  # what the segments hold: binary, or a typed topic's columns
    # The topic's metadata as planned; None: looked up when the item is opened.
    metadata: TopicMetadata | None = None

    def open(self, store: Store) -> Partition:
        """The partition, with the topic log it shares. A layout-2 topic is refused: the jobs
        write layout 3 only (``kstore topics upgrade`` moves it there)."""
        meta = self.metadata
        if meta is None:
            meta = store.topic(self.topic)
            if meta.topic_id != self.topic_id:
                raise UnknownTopicOrPartitionError(
                    f"topic {self.topic!r} was re-created (id {meta.topic_id}, the work item "
                    f"names {self.topic_id})"
                )
        require_layout3(meta, "maintenance")
        return store.partition(self.topic, self.partition, meta)


@dataclass
class PartitionResult:
    """What one job did to one partition: the row a task sends back to the driver.

    ``outcome`` is ``committed`` (changed the partition), ``skipped`` (nothing to do;
    ``reason`` says why), ``dry-run`` (would have changed it), ``conflict`` (a concurrent
    maintenance commit got there first; the next run starts over) or ``error``.
    """

    topic: str
    partition: int
    operation: str
    outcome: str = "skipped"
    reason: str = ""
    segments_scanned: int = 0
    segments_removed: int = 0
    segments_written: int = 0
    bytes_before: int = 0  # live segment bytes before and after the job's own commits
    bytes_after: int = 0
    records_before: int = 0
    records_after: int = 0
    commits: int = 0
    log_start_offset: int = 0
    cleaned_offset: int = 0
    files_deleted: int = 0  # vacuum: files deleted from storage (or, dry run, deletable)
    bytes_deleted: int = 0
    files: list[str] = field(default_factory=list)  # vacuum: their paths, relative to the root
    elapsed_s: float = 0.0

    @classmethod
    def starting(cls, item: WorkItem, operation: str, state: PartitionState) -> PartitionResult:
        """The row for a job about to work on ``item``, with the partition as it is now."""
        return cls(
            item.topic,
            item.partition,
            operation,
            segments_scanned=len(state.segments),
            bytes_before=state.size_bytes,
            bytes_after=state.size_bytes,
            records_before=state.record_count,
            records_after=state.record_count,
            log_start_offset=state.log_start_offset,
            cleaned_offset=state.cleaned_offset,
        )

    @property
    def records_dropped(self) -> int:
        return self.records_before - self.records_after

    def followed_by(self, later: PartitionResult) -> PartitionResult:
        """One row for the partition: this (the part of the job shared with the other
        partitions of its topic log) then ``later`` (the partition's own part): the counts of
        both, the partition as it was before the first and is after the second."""
        if later.outcome in ("error", "conflict") or self.outcome == "error":
            # An error of the first part stands even when the second did its work: a first
            # part reports as errors only the failures the second does not cover for
            # (merger.rewrite_ranges), which a run must not hide.
            outcome = "error" if self.outcome == "error" else later.outcome
        elif "committed" in (self.outcome, later.outcome):
            outcome = "committed"  # a first part's conflict whose work the second part did
        elif self.outcome == "conflict":
            outcome = self.outcome
        else:
            outcome = later.outcome
        return PartitionResult(
            later.topic,
            later.partition,
            later.operation,
            outcome,
            "; ".join(r for r in (self.reason, later.reason) if r),
            segments_scanned=self.segments_scanned,
            segments_removed=self.segments_removed + later.segments_removed,
            segments_written=self.segments_written + later.segments_written,
            bytes_before=self.bytes_before,
            bytes_after=later.bytes_after,
            records_before=self.records_before,
            records_after=later.records_after,
            commits=self.commits + later.commits,
            log_start_offset=later.log_start_offset,
            cleaned_offset=later.cleaned_offset,
            files_deleted=self.files_deleted + later.files_deleted,
            bytes_deleted=self.bytes_deleted + later.bytes_deleted,
            files=self.files + later.files,
            elapsed_s=self.elapsed_s + later.elapsed_s,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> PartitionResult:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class Summary:
    """The outcome of one job run over a store, with the per-partition rows."""

    operation: str
    store: str
    dry_run: bool
    tasks: int
    elapsed_s: float
    partitions: list[PartitionResult] = field(default_factory=list)
    extra_files: list[str] = field(default_factory=list)  # vacuum: store-level deletions
    # Why whole topics were left out (their cleanup.policy has nothing for this job).
    notes: list[str] = field(default_factory=list)

    def _total(self, name: str) -> int:
        return sum(int(getattr(p, name)) for p in self.partitions)

    @property
    def partitions_scanned(self) -> int:
        return len(self.partitions)

    @property
    def segments_removed(self) -> int:
        return self._total("segments_removed")

    @property
    def segments_written(self) -> int:
        return self._total("segments_written")

    @property
    def bytes_before(self) -> int:
        return self._total("bytes_before")

    @property
    def bytes_after(self) -> int:
        return self._total("bytes_after")

    @property
    def records_dropped(self) -> int:
        return self._total("records_before") - self._total("records_after")

    @property
    def files_deleted(self) -> int:
        return self._total("files_deleted") + len(self.extra_files)

    @property
    def bytes_deleted(self) -> int:
        return self._total("bytes_deleted")

    def count(self, outcome: str) -> int:
        return sum(1 for p in self.partitions if p.outcome == outcome)

    @property
    def errors(self) -> list[PartitionResult]:
        return [p for p in self.partitions if p.outcome == "error"]

    @property
    def files(self) -> list[str]:
        return [*self.extra_files, *(f for p in self.partitions for f in p.files)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "store": self.store,
            "dry_run": self.dry_run,
            "tasks": self.tasks,
            "elapsed_s": round(self.elapsed_s, 3),
            "partitions_scanned": self.partitions_scanned,
            "committed": self.count("committed"),
            "skipped": self.count("skipped"),
            "dry_run_changes": self.count("dry-run"),
            "conflicts": self.count("conflict"),
            "errors": self.count("error"),
            "segments_removed": self.segments_removed,
            "segments_written": self.segments_written,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "records_dropped": self.records_dropped,
            "files_deleted": self.files_deleted,
            "bytes_deleted": self.bytes_deleted,
            "extra_files": self.extra_files,
            "notes": self.notes,
            "partitions": [asdict(p) for p in self.partitions],
        }

    def format(self) -> str:
        head = f"{self.operation}{' (dry run)' if self.dry_run else ''} of {self.store}: "
        lines = [
            head + f"{self.partitions_scanned} partitions in {self.tasks} task(s), "
            f"{self.elapsed_s:.2f} s",
            f"  committed {self.count('committed')}, would change {self.count('dry-run')}, "
            f"skipped {self.count('skipped')}, conflicts {self.count('conflict')}, "
            f"errors {self.count('error')}",
            f"  segments removed {self.segments_removed}, written {self.segments_written}",
            f"  bytes before {_size(self.bytes_before)}, after {_size(self.bytes_after)}",
            f"  records dropped {self.records_dropped}",
        ]
        if self.files_deleted or self.operation == "vacuum":
            verb = "deletable" if self.dry_run else "deleted"
            lines.append(f"  files {verb} {self.files_deleted} ({_size(self.bytes_deleted)})")
        lines.extend(f"  {note}" for note in self.notes)
        for p in self.errors[:20]:
            lines.append(f"  ERROR {p.topic}-{p.partition}: {p.reason}")
        return "\n".join(lines)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{n} B"
        value /= 1024
    return f"{n} B"


# -- planning on the driver ---------------------------------------------------------------------


def plan_items(
    store: Store,
    topics: Sequence[str] | None,
    wanted: Callable[[Mapping[str, Any]], bool],
    left_out: list[tuple[str, Mapping[str, Any]]] | None = None,
) -> list[WorkItem]:
    """One item per partition of every topic (or of ``topics``) whose config ``wanted``
    accepts; the others, with their config, go to ``left_out``. Reads topic logs only."""
    # One topic name given as a string is that topic, not one topic per character.
    names = (
        ([topics] if isinstance(topics, str) else list(topics)) if topics else store.list_topics()
    )
    items: list[WorkItem] = []
    for name in names:
        meta = store.topic(name)  # a named topic that does not exist is an error
        config = meta.effective_config
        if not wanted(config):
            if left_out is not None:
                left_out.append((name, config))
            continue
        layout = layout_of(meta)
        items.extend(
            WorkItem(name, meta.topic_id, p, config, layout, meta) for p in range(meta.partitions)
        )
    return items


def policies(config: Mapping[str, Any]) -> set[str]:
    return set(str(config["cleanup.policy"]).split(","))


# -- running ------------------------------------------------------------------------------------

PartitionFn = Callable[[Store, WorkItem, dict[str, Any]], PartitionResult]
# A job's part that the partitions of one layout-3 topic log share (the merge's rewrite of data
# objects): run once for them, before each partition's own part; a row per partition.
SharedFn = Callable[[Store, list[WorkItem], dict[str, Any]], list[PartitionResult]]


def run_item(
    fn: PartitionFn, store: Store, item: WorkItem, options: dict[str, Any], operation: str
) -> PartitionResult:
    """Run one item, turning failures into a result row: one bad partition must not stop the
    maintenance of the others, and the driver reports it."""
    started = time.monotonic()
    try:
        result = fn(store, item, options)
    except Exception as exc:  # an unexpected bug too: still reported against the partition
        result = _failed(item, operation, exc)
    result.elapsed_s = time.monotonic() - started
    return result


def _failed(item: WorkItem, operation: str, exc: Exception) -> PartitionResult:
    if isinstance(exc, (ConcurrentModificationError, CommitConflictError)):
        return PartitionResult(item.topic, item.partition, operation, "conflict", str(exc))
    return PartitionResult(
        item.topic, item.partition, operation, "error", f"{type(exc).__name__}: {exc}"
    )


def topic_logs_of(items: list[WorkItem]) -> list[list[WorkItem]]:
    """The items of each layout-3 topic log that holds two or more of them."""
    by_log: dict[tuple[str, str, int], list[WorkItem]] = {}
    for item in items:
        meta = item.metadata
        if meta is not None and meta.layout == 3:
            key = (item.topic, item.topic_id, log_index(item.partition, meta.commit_logs))
            by_log.setdefault(key, []).append(item)
    return [unit for unit in by_log.values() if len(unit) > 1]


def run_shared(
    shared: SharedFn, store: Store, unit: list[WorkItem], options: dict[str, Any], operation: str
) -> list[PartitionResult]:
    """A job's shared part on the partitions of one topic log, failures as their rows."""
    started = time.monotonic()
    try:
        rows = shared(store, unit, options)
    except Exception as exc:  # as run_item: reported against the partitions, not raised
        rows = [_failed(item, operation, exc) for item in unit]
    for row in rows:
        row.elapsed_s = (time.monotonic() - started) / len(unit)
    return rows


def open_store(store_url: str | Store, storage_options: Mapping[str, Any] | None) -> Store:
    if isinstance(store_url, Store):
        return store_url
    # No segment cache: a job reads each segment once or keeps what it needs itself.
    return Store(store_url, storage_options, create=False, segment_cache_bytes=0)


def default_tasks(spark: Any, items: int) -> int:
    try:
        parallelism = int(spark.sparkContext.defaultParallelism)
    except Exception:  # Spark Connect has no SparkContext
        parallelism = 2
    return max(1, min(items, 4 * parallelism))


def run_partitions(
    spark: Any,
    store: Store,
    items: list[WorkItem],
    fn: PartitionFn,
    options: dict[str, Any],
    *,
    operation: str,
    tasks: int | None = None,
    progress: Progress | None = stderr_progress,
    shared: SharedFn | None = None,
) -> tuple[list[PartitionResult], int]:
    """Run ``fn`` on every item: in Spark tasks (one per group of items) when ``spark`` is a
    session, else here. Returns the result rows and the number of tasks.

    ``shared``: the part of the job that the partitions of one layout-3 topic log share (the
    merge's rewrite of data objects). It runs first, once per topic log (one task each), then
    ``fn`` on every partition as without it, spread over the tasks; a partition's row holds
    both parts. A shared part that fails changes nothing else: each partition's own part
    still runs (the merge's takes the ranges left), and the failure is in the row's reason;
    one that the shared part reports as an error (not the storage's, nor a lost race: its
    own) keeps the row an error, though the partition's own part did the work."""
    if not items:
        return [], 0
    first: dict[tuple[str, int], PartitionResult] = {}
    n_shared = 0
    if shared is not None:
        part = shared
        rows, n_shared = _fan_out(
            spark,
            store,
            topic_logs_of(items),
            lambda s, unit: run_shared(part, s, unit, options, operation),
            operation=operation,
            tasks=tasks,
            progress=None,
        )
        first = {(row.topic, row.partition): row for row in rows}
    rows, n = _fan_out(
        spark,
        store,
        items,
        lambda s, item: [run_item(fn, s, item, options, operation)],
        operation=operation,
        tasks=tasks,
        progress=progress,
    )
    results = []
    for row in rows:
        before = first.get((row.topic, row.partition))
        results.append(row if before is None else before.followed_by(row))
    return results, max(n, n_shared)


def _fan_out(
    spark: Any,
    store: Store,
    work: Sequence[Any],
    run_one: Callable[[Store, Any], list[PartitionResult]],
    *,
    operation: str,
    tasks: int | None,
    progress: Progress | None,
) -> tuple[list[PartitionResult], int]:
    """``run_one`` on every piece of ``work`` (a partition, or a topic log's partitions): in
    Spark tasks when ``spark`` is a session, else here, one after the other."""
    if not work:
        return [], 0
    if spark is None:
        results = []
        for piece in work:
            for result in run_one(store, piece):
                results.append(result)
                if progress is not None:
                    progress(
                        f"[{operation}] {len(results)}/{len(work)} {result.topic}-"
                        f"{result.partition}: {result.outcome}"
                        f"{': ' + result.reason if result.reason else ''}"
                    )
        return results, 1
    n = max(1, min(tasks or default_tasks(spark, len(work)), len(work)))
    # Round robin, so that every task gets partitions of every topic: sizes are unknown on the
    # driver (it reads no partition manifest) and neighbours in a topic tend to be alike.
    groups = [work[i::n] for i in range(n)]
    url, storage_options = store.url, dict(store.storage.storage_options)

    def task(group_ids: Iterable[int]) -> Iterator[str]:
        executor_store = open_store(url, storage_options)
        for group_id in group_ids:
            for piece in groups[group_id]:
                for result in run_one(executor_store, piece):
                    yield result.to_json()

    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect: no RDDs; one row, hence one group, per task instead
        frame = spark.range(0, n, 1, n).mapInArrow(_arrow_task(task), "result string")
        rows = [r["result"] for r in frame.collect()]
    else:
        # parallelize(range(n), n): exactly one group id per task.
        rows = _collect_with_progress(
            sc, sc.parallelize(range(n), n).mapPartitions(task), operation, n, progress
        )
    return [PartitionResult.from_json(r) for r in rows], n


def _arrow_task(
    task: Callable[[Iterable[int]], Iterator[str]],
) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        for batch in batches:
            rows = list(task(batch.column("id").to_pylist()))
            yield pa.RecordBatch.from_pydict({"result": pa.array(rows, pa.string())})

    return run


def _collect_with_progress(
    sc: Any, rdd: Any, operation: str, tasks: int, progress: Progress | None
) -> list[str]:
    """``rdd.collect()``, reporting finished tasks every few seconds while it runs."""
    tracker = sc.statusTracker()
    group = f"kstore-{operation}-{time.monotonic_ns()}"
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            sc.setJobGroup(group, f"kstore {operation}")
            outcome["rows"] = rdd.collect()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"kstore-{operation}", daemon=True)
    thread.start()
    last = ""
    while thread.is_alive():
        thread.join(2.0)
        if progress is None or not thread.is_alive():
            continue
        done = 0
        for job in tracker.getJobIdsForGroup(group):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info else []:
                stage_info = tracker.getStageInfo(stage)
                if stage_info is not None:
                    done += stage_info.numCompletedTasks
        message = f"[{operation}] {done}/{tasks} tasks done"
        if message != last:
            progress(message)
            last = message
    if "error" in outcome:
        raise outcome["error"]
    # The last poll may predate the last tasks (a short job: none at all): the end is N/N.
    if progress is not None:
        progress(f"[{operation}] {tasks}/{tasks} tasks done")
    return list(outcome["rows"])


# -- shared helpers for the per-partition functions ----------------------------------------------


def now_ms(options: Mapping[str, Any]) -> int:
    """The job's clock: ``options["now_ms"]`` when a caller fixes it (tests), else the wall clock."""
    fixed = options.get("now_ms")
    return int(fixed) if fixed is not None else int(time.time() * 1000)


def name_time_ms(path: str) -> int | None:
    """The time a segment or data object was named (5.4 of PROTOCOL.md), or None for another
    kind of name."""
    match = _NAME_TIME.match(path.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def too_old_to_commit(written_at: float) -> bool:
    """True when the write of a new file started (``kstore.clock.monotonic()``) more than
    MAX_UNCOMMITTED_MS ago: committing it now could race with a vacuum that already takes it
    for an orphan. Monotonic: a pause or a wall-clock step since the write counts as it is."""
    return (clock.monotonic() - written_at) * 1000 > MAX_UNCOMMITTED_MS


# -- command line -------------------------------------------------------------------------------


def command_line(run: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None) -> int:
    """Run a job's command line: a kstore error (bad store, topic, option) is one clear
    line and exit status 2, not a traceback."""
    try:
        return run(argv)
    except KStoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def base_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "--store", required=True, help="store URL (file://, s3://, memory://, path)"
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="storage option (repeatable); VALUE is parsed as JSON when it can be",
    )
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        metavar="NAME",
        help="only this topic (repeatable); default: every topic",
    )
    parser.add_argument("--dry-run", action="store_true", help="report, change nothing")
    parser.add_argument("--tasks", type=int, default=None, help="Spark tasks (default: 4 per core)")
    parser.add_argument(
        "--local", action="store_true", help="run in this process without Spark (no JVM needed)"
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="also write the summary as JSON to PATH ('-' for stdout)",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def parse_storage_options(pairs: Sequence[str]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--option expects KEY=VALUE, got {pair!r}")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return options


# Shipped in this package (package data): errors only, for the driver JVM kstore starts itself.
LOG4J2_CONFIG = "log4j2.properties"


def starts_jvm() -> bool:
    """True when a SparkSession made now would launch its own driver JVM: no session is
    running and this process was not started by spark-submit (whose JVM is up already)."""
    from pyspark import SparkContext

    return (
        getattr(SparkContext, "_active_spark_context", None) is None
        and "PYSPARK_GATEWAY_PORT" not in os.environ
    )


# The JVM's own notice, written before any logging exists and whatever it is set to: Spark 4's
# launcher always adds --add-modules=jdk.incubator.vector, and no JVM flag hides the notice.
_JVM_NOTICE = b"WARNING: Using incubator modules:"


def _start_context(settings: Mapping[str, str]) -> None:
    """Start the driver JVM and its SparkContext, the JVM's stderr passed on to ours by a
    thread that leaves out its incubator notice (and nothing else). The thread reads from the
    start: a JVM that fails to start says why on stderr, and is never blocked on a full pipe."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    read_end, write_end = os.pipe()

    def forward() -> None:
        with os.fdopen(read_end, "rb") as stream:
            for line in stream:
                if not line.startswith(_JVM_NOTICE):
                    os.write(2, line)

    thread = threading.Thread(target=forward, name="kstore-jvm-stderr", daemon=True)
    thread.start()
    conf = SparkConf().setAll(list(settings.items()))
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stderr": write_end})  # type: ignore[no-untyped-call]
    except BaseException:
        os.close(write_end)
        thread.join(5.0)  # what the JVM said before it exited, ahead of the error
        raise
    os.close(write_end)  # the JVM holds its own copy
    SparkContext(conf=conf, gateway=gateway)


def job_session(
    app_name: str,
    *,
    master: str | None = None,
    quiet: bool = True,
    config: Mapping[str, str] | None = None,
) -> Any:
    """The SparkSession a job runs on: the running one (or spark-submit's), else a new one
    (on ``master``). A new one draws no console progress bar (the job prints its own
    progress lines, and the bar's carriage returns garble a log file) and, when ``quiet``,
    logs errors only: its driver JVM takes this package's log4j2 configuration (set before the
    JVM starts), its stderr loses the JVM's incubator notice, and ``setLogLevel`` covers the
    rest. An existing JVM (spark-submit's, a running session's) logs as its owner set it up."""
    from pyspark.sql import SparkSession

    settings: dict[str, Any] = {"spark.app.name": app_name, **(config or {})}
    if master is not None:
        settings["spark.master"] = master
    new_jvm = starts_jvm()
    if new_jvm:
        settings["spark.ui.showConsoleProgress"] = "false"
    log_config = Path(__file__).with_name(LOG4J2_CONFIG)
    quiet = quiet and new_jvm and log_config.is_file()  # no file: Spark's own defaults
    if quiet:
        settings["spark.driver.extraJavaOptions"] = (
            f"-Dlog4j2.configurationFile={log_config.as_uri()}"
        )
        _start_context(settings)
    session = SparkSession.builder.config(map=settings).getOrCreate()
    if quiet:
        session.sparkContext.setLogLevel("ERROR")
    return session


def get_spark(local: bool, app_name: str) -> Any:
    """The Spark session for a job run (spark-submit's, or a new local one), or None."""
    return None if local else job_session(app_name)


def report(summaries: Sequence[Summary], json_path: str | None, *, printed: bool) -> int:
    """Print the summaries (unless the run already did), write the JSON, and give the exit
    status: 1 when any partition failed."""
    for summary in summaries if not printed else ():
        print(summary.format(), flush=True)
    if json_path is not None:
        payload = json.dumps([s.to_dict() for s in summaries], indent=2)
        if json_path == "-":
            print(payload, flush=True)
        else:
            with open(json_path, "w", encoding="utf-8") as f:
                f.write(payload)
    return 1 if any(s.errors for s in summaries) else 0


def check_tasks(tasks: object) -> None:
    """``tasks`` is None (the default) or an integer >= 1; checked before the store is opened,
    so a bad value is a clear error rather than ignored here and handed to Spark."""
    if tasks is not None and (not isinstance(tasks, int) or isinstance(tasks, bool) or tasks < 1):
        raise InvalidConfigurationError(f"tasks must be an integer >= 1, got {tasks!r}")


def run_job(
    operation: str,
    fn: PartitionFn,
    wanted: Callable[[Mapping[str, Any]], bool],
    spark: Any,
    store_url: str | Store,
    storage_options: Mapping[str, Any] | None,
    topics: Sequence[str] | None,
    *,
    dry_run: bool,
    tasks: int | None,
    verbose: bool,
    options: Mapping[str, Any],
    print_summary: bool = True,
    shared: SharedFn | None = None,
) -> Summary:
    """Plan on the driver, run every partition, print and return the summary."""
    check_tasks(tasks)
    started = time.monotonic()
    progress = stderr_progress if verbose else None
    store = open_store(store_url, storage_options)
    left_out: list[tuple[str, Mapping[str, Any]]] = []
    items = plan_items(store, topics, wanted, left_out)
    if progress is not None:
        where = "in this process" if spark is None else "on Spark"
        progress(
            f"[{operation}] {len(items)} partition(s) of "
            f"{len({i.topic for i in items})} topic(s), {where}"
        )
    results, n = run_partitions(
        spark,
        store,
        items,
        fn,
        {**options, "dry_run": dry_run},
        operation=operation,
        tasks=tasks,
        progress=progress,
        shared=shared,
    )
    if not dry_run and operation in ("merge", "compaction", "retention"):
        # Topics with table.format=delta: their Delta table follows the commits just made
        # (PROTOCOL.md 29). A failed publication is an error row; the next one completes it.
        from kstore.lakehouse import publish_after_job

        for topic, error in publish_after_job(store, {i.topic for i in items}, progress):
            results.append(PartitionResult(topic, -1, "publish", "error", error))
    summary = Summary(
        operation, redact_url(store.url), dry_run, n, time.monotonic() - started, results
    )
    summary.notes = [
        f"topic {name}: cleanup.policy={config['cleanup.policy']}, "
        f"{_NOTHING_TO.get(operation, 'nothing to do')}"
        for name, config in left_out
    ]
    if verbose and print_summary:
        print(summary.format(), flush=True)
    return summary
