"""The maintenance tasks: what each decides from a topic's config and manifests, and how it runs.

A task has a ``name``, a ``scope`` (``topic``: one lease and record per topic; ``store``: one
for the whole store) and two methods: ``due`` (from the manifests already read, no I/O of its
own) and ``run`` (the job, in this process). :data:`TASKS` is the registry, in the order the
tasks run within a topic: retention before merging, so that a merge never folds records that
retention is about to remove into a segment with newer ones.

A new task plugs in with one line in :data:`TASKS`, typically an :class:`IntervalTask` around a
library function (``IntervalTask("name", "store", lambda ctx: fn(ctx.store, now_ms=ctx.now_ms))``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kstore.compaction import merge_segments, run_compaction
from kstore.compaction.cleaner import plan_compaction
from kstore.compaction.jobs import Summary, policies
from kstore.compaction.merger import plan_merge
from kstore.retention import (
    abort_expired_transactions,
    prune_logs,
    purge_deleted_topics,
    run_retention,
    vacuum,
)
from kstore.retention.deletion import plan_retention

from kstore.errors import InvalidConfigurationError
from kstore.partition import PartitionState
from kstore.store import Store, TopicMetadata

from .coordination import LastRun, Records

# Kafka's log.retention.check.interval.ms.
DEFAULT_INTERVAL_MS = 300_000
DEFAULT_VACUUM_INTERVAL_MS = 3_600_000
# A partition is merged once its mergeable groups hold this many segments (the merge job's own
# tiered rule then picks which): fewer would rewrite data after every few flushes.
DEFAULT_MERGE_MIN_SEGMENTS = 8
# A lease outlives any single task run by far; a dead holder's lease is taken over after it.
DEFAULT_LEASE_MS = 15 * 60_000


@dataclass(frozen=True)
class Settings:
    """The service's own settings (the topics' configs say the rest)."""

    interval_ms: int = DEFAULT_INTERVAL_MS  # also the least time between two runs of a task
    vacuum_interval_ms: int = DEFAULT_VACUUM_INTERVAL_MS
    merge_min_segments: int = DEFAULT_MERGE_MIN_SEGMENTS
    lease_ms: int = DEFAULT_LEASE_MS

    def __post_init__(self) -> None:
        for name, minimum in (
            ("interval_ms", 1),
            ("vacuum_interval_ms", 1),
            ("merge_min_segments", 2),
            ("lease_ms", 1),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise InvalidConfigurationError(
                    f"{name} must be an integer >= {minimum}, got {value!r}"
                )


@dataclass
class TopicView:
    """A topic as the planner read it: metadata, effective config, partition states."""

    name: str
    meta: TopicMetadata
    states: dict[int, PartitionState]

    @property
    def config(self) -> Mapping[str, Any]:
        return self.meta.effective_config


@dataclass(frozen=True)
class Decision:
    """Whether a task is due now, why (or why not), and when it is next due if known."""

    due: bool
    reason: str
    next_ms: int | None = None


@dataclass
class RunContext:
    """What a task's ``run`` gets. ``now_ms`` is None on the wall clock (the jobs then read
    their own clocks, the storage's where they need it), or the fixed time of a test."""

    store: Store
    topic: str | None
    topic_id: str | None
    now_ms: int | None
    settings: Settings


@dataclass
class TaskResult:
    """What a run did: the fields of its last-run record."""

    outcome: str  # ok, nothing, conflict, error
    detail: str = ""
    records: int = 0
    bytes: int = 0
    segments: int = 0
    files: int = 0
    partitions: dict[int, dict[str, int]] = field(default_factory=dict)


class Task(Protocol):
    name: str
    scope: str  # "topic" or "store"

    def due(
        self, view: TopicView | None, last: LastRun | None, now_ms: int, settings: Settings
    ) -> Decision: ...

    def run(self, ctx: RunContext) -> TaskResult: ...


def from_summary(summary: Summary) -> TaskResult:
    """A job's summary as a task result."""
    removed = max(0, summary.bytes_before - summary.bytes_after) + summary.bytes_deleted
    if summary.errors:
        first = summary.errors[0]
        outcome, detail = "error", f"{first.topic}-{first.partition}: {first.reason}"
    elif summary.count("conflict"):
        outcome, detail = "conflict", f"{summary.count('conflict')} partition(s) changed under it"
    elif summary.count("committed") or summary.files_deleted:
        outcome = "ok"
        detail = "; ".join(
            f"{p.partition}: {p.reason}" for p in summary.partitions if p.outcome == "committed"
        )
    else:
        outcome = "nothing"
        reasons = sorted({p.reason for p in summary.partitions if p.reason})
        detail = "; ".join(reasons)
    return TaskResult(
        outcome,
        detail[:500],
        records=summary.records_dropped,
        bytes=removed,
        segments=summary.segments_removed,
        files=summary.files_deleted,
        partitions={
            p.partition: {
                "records": p.records_dropped,
                "bytes": max(0, p.bytes_before - p.bytes_after) + p.bytes_deleted,
                "segments": p.segments_removed,
            }
            for p in summary.partitions
            if p.outcome == "committed" and p.partition >= 0
        },
    )


def result_of(value: Any) -> TaskResult:
    """A library function's return value as a task result: a job Summary, a TaskResult, a
    mapping of counts (``records``, ``bytes``, ``segments``, ``files``), or None."""
    if isinstance(value, TaskResult):
        return value
    if isinstance(value, Summary):
        return from_summary(value)
    if isinstance(value, Mapping):
        counts = {k: int(value.get(k, 0) or 0) for k in ("records", "bytes", "segments", "files")}
        return TaskResult(
            "ok" if any(counts.values()) else "nothing",
            records=counts["records"],
            bytes=counts["bytes"],
            segments=counts["segments"],
            files=counts["files"],
        )
    return TaskResult("ok" if value else "nothing", "" if value is None else str(value)[:500])


def _rested(last: LastRun | None, now_ms: int, settings: Settings) -> Decision | None:
    """A task whose last run did not get anywhere (``nothing``, ``conflict``, ``error``) while
    its plan said it was due waits one interval from that run's start before the next try, so
    that a failing task is retried once per interval, not on every pass. A run that removed
    something never makes the next one wait: work left over is due at the next pass."""
    if last is None or last.outcome == "ok":
        return None
    retry_ms = last.started_ms + settings.interval_ms
    if now_ms < retry_ms:
        return Decision(False, f"last run: {last.outcome}; retried after one interval", retry_ms)
    return None


class RetentionTask:
    """``retention.ms`` / ``retention.bytes``: checked every interval (Kafka's
    log.retention.check.interval.ms), run when some partition has segments to remove."""

    name = "retention"
    scope = "topic"

    def due(
        self, view: TopicView | None, last: LastRun | None, now_ms: int, settings: Settings
    ) -> Decision:
        assert view is not None
        if "delete" not in policies(view.config):
            return Decision(False, "cleanup.policy does not include delete")
        rested = _rested(last, now_ms, settings)
        expiring = [
            p
            for p, state in sorted(view.states.items())
            if plan_retention(state, view.config, now_ms) is not None
        ]
        if expiring:
            if rested is not None:
                return Decision(
                    False, f"partitions {expiring} wait: {rested.reason}", rested.next_ms
                )
            return Decision(True, f"partitions {expiring} have segments past retention", now_ms)
        return Decision(False, "nothing past retention.ms or retention.bytes", self._next(view))

    @staticmethod
    def _next(view: TopicView) -> int | None:
        """When the oldest segment of some partition passes ``retention.ms``."""
        retention_ms = int(view.config["retention.ms"])
        if retention_ms < 0:
            return None
        times = [s.segments[0].max_timestamp_ms for s in view.states.values() if s.segments]
        return min(times) + retention_ms + 1 if times else None

    def run(self, ctx: RunContext) -> TaskResult:
        assert ctx.topic is not None
        return from_summary(
            run_retention(None, ctx.store, topics=[ctx.topic], verbose=False, now_ms=ctx.now_ms)
        )


def dirty_ratio(state: PartitionState) -> float:
    """Bytes at or after the cleaned offset over all bytes, from the manifest."""
    total = state.size_bytes
    if not total:
        return 0.0
    dirty = sum(s.size_bytes for s in state.segments if s.last_offset >= state.cleaned_offset)
    return dirty / total


class CompactionTask:
    """Key compaction, when a partition's dirty ratio reaches ``min.cleanable.dirty.ratio`` or
    its oldest dirty record is older than ``max.compaction.lag.ms`` (the cleaner's own plan
    decides, from the manifest)."""

    name = "compaction"
    scope = "topic"

    def due(
        self, view: TopicView | None, last: LastRun | None, now_ms: int, settings: Settings
    ) -> Decision:
        assert view is not None
        if "compact" not in policies(view.config):
            return Decision(False, "cleanup.policy does not include compact")
        rested = _rested(last, now_ms, settings)
        ready, reasons = [], set()
        for p, state in sorted(view.states.items()):
            plan = plan_compaction(state, view.config, now_ms)
            if isinstance(plan, str):
                reasons.add(plan)
            else:
                ready.append(f"{p} ({plan.why})")
        if ready:
            if rested is not None:
                return Decision(
                    False, f"partitions {', '.join(ready)} wait: {rested.reason}", rested.next_ms
                )
            return Decision(True, f"partitions {', '.join(ready)}", now_ms)
        return Decision(False, "; ".join(sorted(reasons)) or "no partition", self._next(view))

    @staticmethod
    def _next(view: TopicView) -> int | None:
        """When the oldest dirty record passes ``max.compaction.lag.ms`` (if ever)."""
        lag = int(view.config["max.compaction.lag.ms"])
        times = [
            seg.min_timestamp_ms
            for state in view.states.values()
            for seg in state.segments
            if seg.last_offset >= state.cleaned_offset
        ]
        if not times or min(times) > (1 << 62) - lag:
            return None
        return min(times) + lag + 1

    def run(self, ctx: RunContext) -> TaskResult:
        assert ctx.topic is not None
        return from_summary(
            run_compaction(None, ctx.store, topics=[ctx.topic], verbose=False, now_ms=ctx.now_ms)
        )


class MergeTask:
    """Segment merging, when a partition's mergeable groups (the merge job's plan) hold at
    least ``merge_min_segments`` segments."""

    name = "merge"
    scope = "topic"

    def due(
        self, view: TopicView | None, last: LastRun | None, now_ms: int, settings: Settings
    ) -> Decision:
        assert view is not None
        counts = {
            p: sum(len(g) for g in plan_merge(state, view.config))
            for p, state in sorted(view.states.items())
        }
        ready = [p for p, n in counts.items() if n >= settings.merge_min_segments]
        if not ready:
            most = max(counts.values(), default=0)
            return Decision(
                False,
                f"at most {most} mergeable segment(s) in a partition, below {settings.merge_min_segments}",
            )
        rested = _rested(last, now_ms, settings)
        if rested is not None:
            return Decision(False, f"partitions {ready} wait: {rested.reason}", rested.next_ms)
        return Decision(
            True, f"partitions {ready} have >= {settings.merge_min_segments} small segments", now_ms
        )

    def run(self, ctx: RunContext) -> TaskResult:
        assert ctx.topic is not None
        return from_summary(
            merge_segments(None, ctx.store, topics=[ctx.topic], verbose=False, now_ms=ctx.now_ms)
        )


class VacuumTask:
    """Vacuum of removed files, orphans, old log versions and stale incarnations: on its own
    interval."""

    name = "vacuum"
    scope = "topic"

    def due(
        self, view: TopicView | None, last: LastRun | None, now_ms: int, settings: Settings
    ) -> Decision:
        if last is None:
            return Decision(True, "never ran", now_ms)
        next_ms = last.finished_ms + settings.vacuum_interval_ms
        if now_ms >= next_ms:
            return Decision(True, "vacuum interval passed", now_ms)
        return Decision(False, "ran less than one vacuum interval ago", next_ms)

    def run(self, ctx: RunContext) -> TaskResult:
        assert ctx.topic is not None
        return from_summary(
            vacuum(None, ctx.store, topics=[ctx.topic], verbose=False, now_ms=ctx.now_ms)
        )


class IntervalTask:
    """A task that is due once per interval and runs ``fn``; its return value is read by
    :func:`result_of`. The interval is ``interval_ms``, a function of the settings, or (None)
    the service's interval."""

    def __init__(
        self,
        name: str,
        scope: str,
        fn: Callable[[RunContext], Any],
        interval_ms: int | Callable[[Settings], int] | None = None,
    ):
        if scope not in ("topic", "store"):
            raise ValueError(f"task scope must be 'topic' or 'store', got {scope!r}")
        self.name, self.scope, self.fn, self.interval_ms = name, scope, fn, interval_ms

    def interval(self, settings: Settings) -> int:
        if self.interval_ms is None:
            return settings.interval_ms
        return self.interval_ms if isinstance(self.interval_ms, int) else self.interval_ms(settings)

    def due(
        self, view: TopicView | None, last: LastRun | None, now_ms: int, settings: Settings
    ) -> Decision:
        # Half an interval since the last run started: a maintainer's passes are one interval
        # apart, start to start, and its last run began some time into the previous pass, so
        # a full interval since that run (let alone since its end) is not reached at the next
        # pass and the task ran every other pass. Another maintainer's run within half an
        # interval still makes this one skip it.
        interval = self.interval(settings)
        next_ms = last.started_ms + interval // 2 if last is not None else now_ms
        if now_ms >= next_ms:
            return Decision(True, "interval passed" if last else "never ran", now_ms)
        return Decision(False, "ran less than half an interval ago", next_ms)

    def run(self, ctx: RunContext) -> TaskResult:
        return result_of(self.fn(ctx))


def abort_transactions(ctx: RunContext) -> TaskResult:
    """Transactions open past their producer's ``transaction_timeout_ms``, finished as a new
    instance of their producer would (PROTOCOL.md 20.6): an open transaction holds back
    read_committed readers and every other job on its partitions."""
    report = abort_expired_transactions(ctx.store, now_ms=ctx.now_ms)
    finished = report.count("aborted") + report.count("committed")
    outcome = "ok" if finished else "error" if report.errors else "nothing"
    return TaskResult(outcome, report.format()[:500])


def purge_topics(ctx: RunContext) -> TaskResult:
    """Deleted topics' files, once their ``file.delete.delay.ms`` has passed (17.3), and the
    service's own records of topics that no longer exist."""
    report = purge_deleted_topics(ctx.store, now_ms=ctx.now_ms)
    forgotten = Records(ctx.store.storage).forget_topics(ctx.store.topic_exists)
    outcome = "ok" if report.removed or forgotten else "nothing"
    detail = report.format().splitlines()[0]
    if forgotten:
        detail += f"; records of {len(forgotten)} deleted topic(s) dropped"
    return TaskResult(outcome, detail, files=len(report.removed))


def prune_old_log_versions(ctx: RunContext) -> TaskResult:
    """Old versions of group, producer and topic metadata logs (17.6); partition and topic
    logs are vacuum's."""
    report = prune_logs(ctx.store, now_ms=ctx.now_ms)
    errors = [entry for entry in report.logs if entry.error is not None]
    outcome = "ok" if report.files or report.checkpoints else "error" if errors else "nothing"
    return TaskResult(outcome, report.format()[:500], bytes=report.bytes, files=len(report.files))


# The registry, in run order within a topic; the store-wide tasks run after the topics' ones.
TASKS: list[Task] = [
    RetentionTask(),
    CompactionTask(),
    MergeTask(),
    VacuumTask(),
    IntervalTask("abort-transactions", "store", abort_transactions),
    IntervalTask("purge-deleted-topics", "store", purge_topics),
    IntervalTask("prune-logs", "store", prune_old_log_versions, lambda s: s.vacuum_interval_ms),
]
