"""The maintenance service: plan what is due, take its lease, run it, record it.

One pass (:func:`run_due`) reads every topic's metadata and partition manifests and the
service's records (``_maintenance/``), asks each task of :data:`~kstore.maintenance.tasks.TASKS`
whether it is due, and runs the due ones: in this process, or spread over Spark executors
(one Spark task per topic, its due tasks in registry order). Both forms run the same
:func:`run_item`, which takes the (topic, task) lease with a put-if-absent, so of several
maintainers that planned the same work exactly one runs it. :class:`Service` repeats passes
every interval until it is asked to stop.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kstore.errors import KStoreError, UnknownTopicOrPartitionError
from kstore.store import Store, layout2_refusal

from .coordination import LastRun, Lease, Record, Records, new_holder
from .tasks import TASKS, Decision, RunContext, Settings, Task, TaskResult, TopicView, dirty_ratio

Log = Callable[[str], None]


def wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class TaskPlan:
    """One (topic, task) as the planner saw it. Picklable: it travels to Spark executors."""

    topic: str | None  # None: a store-wide task
    topic_id: str | None
    task: str
    decision: Decision
    last: LastRun | None
    newest: Record | None  # the newest record: the lease is taken by writing the next one
    held_by: str | None = None


@dataclass
class TaskRun:
    """What one maintainer did with one due (topic, task)."""

    topic: str | None
    task: str
    outcome: str  # ok, nothing, conflict, error, or taken (another maintainer has it)
    detail: str = ""
    records: int = 0
    bytes: int = 0
    segments: int = 0
    files: int = 0
    elapsed_s: float = 0.0

    def line(self) -> str:
        where = self.topic if self.topic is not None else "(store)"
        counts = (
            f" removed {self.records} records, {self.bytes} bytes, {self.segments} segments, "
            f"{self.files} files"
            if self.outcome == "ok"
            else ""
        )
        detail = f": {self.detail}" if self.detail else ""
        return f"[maintain] {self.task} {where}: {self.outcome}{counts} in {self.elapsed_s:.2f} s{detail}"


@dataclass
class Plan:
    """A planner pass: every (topic, task) decision and the topics as read."""

    now_ms: int
    tasks: list[TaskPlan] = field(default_factory=list)
    views: dict[str, TopicView] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # topic -> why it was not planned

    @property
    def due(self) -> list[TaskPlan]:
        return [t for t in self.tasks if t.decision.due]


def task_named(name: str, tasks: Sequence[Task] | None = None) -> Task:
    for task in tasks if tasks is not None else TASKS:
        if task.name == name:
            return task
    raise KeyError(f"no maintenance task {name!r}")


def read_view(store: Store, topic: str) -> TopicView:
    """A topic's metadata and the state of each partition. The partitions are
    the Store's own, so a long-lived maintainer polls for newer log versions instead of
    loading each partition's log again on every pass."""
    meta = store.topic(topic)
    return TopicView(
        topic,
        meta,
        {p: store.partition(topic, p, meta).state() for p in range(meta.partitions)},
    )


def _decide(
    task: Task,
    view: TopicView | None,
    newest: Record | None,
    topic_id: str | None,
    now_ms: int,
    settings: Settings,
) -> tuple[Decision, LastRun | None, str | None]:
    last = newest.last_run if newest is not None else None
    if last is not None and topic_id is not None and last.topic_id != topic_id:
        last = None  # a run on an earlier incarnation of the topic says nothing about this one
    if newest is not None and newest.held_at(now_ms):
        return (
            Decision(False, f"running by {newest.holder}", newest.expires_ms),
            last,
            newest.holder,
        )
    return task.due(view, last, now_ms, settings), last, None


def plan(
    store: Store,
    settings: Settings,
    now_ms: int,
    topics: Sequence[str] | None = None,
    tasks: Sequence[Task] | None = None,
) -> Plan:
    """Every (topic, task) decision of one pass (and of the store-wide tasks unless ``topics``
    names topics). Reads topic logs, partition manifests and the records; writes nothing."""
    tasks = list(tasks if tasks is not None else TASKS)
    records = Records(store.storage)
    out = Plan(now_ms)
    topic_tasks = [t for t in tasks if t.scope == "topic"]
    for name in list(topics) if topics else store.list_topics():
        try:
            view = read_view(store, name)
            listing = records.listing(name)
            newest = records.newest(listing, [t.name for t in topic_tasks])
        except UnknownTopicOrPartitionError:
            if topics:
                raise
            continue  # deleted since the listing
        except KStoreError as exc:
            out.errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        if view.meta.layout != 3:
            # Read but never written by this version: reported, the other topics go on.
            out.errors[name] = layout2_refusal(name, "maintenance")
            continue
        out.views[name] = view
        for task in topic_tasks:
            decision, last, held = _decide(
                task, view, newest.get(task.name), view.meta.topic_id, now_ms, settings
            )
            out.tasks.append(
                TaskPlan(
                    name, view.meta.topic_id, task.name, decision, last, newest.get(task.name), held
                )
            )
    store_tasks = [t for t in tasks if t.scope == "store"]
    if store_tasks and not topics:
        listing = records.listing(None)
        newest = records.newest(listing, [t.name for t in store_tasks])
        for task in store_tasks:
            decision, last, held = _decide(
                task, None, newest.get(task.name), None, now_ms, settings
            )
            out.tasks.append(
                TaskPlan(None, None, task.name, decision, last, newest.get(task.name), held)
            )
    return out


def run_item(
    store: Store,
    item: TaskPlan,
    settings: Settings,
    *,
    holder: str,
    fixed_now_ms: int | None = None,
    tasks: Sequence[Task] | None = None,
) -> TaskRun:
    """Take the lease of one due (topic, task), run it, record the run and end the lease.
    Another maintainer's lease (or a record written since ``item`` was planned) means it is
    theirs: nothing runs. Used by both the process and the Spark form."""
    task = task_named(item.task, tasks)
    records = Records(store.storage)
    started_ms = fixed_now_ms if fixed_now_ms is not None else wall_ms()
    started = time.monotonic()
    lease = records.acquire(
        item.topic,
        item.task,
        holder=holder,
        now_ms=started_ms,
        lease_ms=settings.lease_ms,
        newest=item.newest,
    )
    if lease is None:
        return TaskRun(item.topic, item.task, "taken", "another maintainer has it")
    context = RunContext(store, item.topic, item.topic_id, fixed_now_ms, settings)
    heartbeat = None if fixed_now_ms is not None else _Heartbeat(records, lease, settings.lease_ms)
    try:
        result = task.run(context)
    except KStoreError as exc:
        result = TaskResult("error", f"{type(exc).__name__}: {exc}"[:500])
    except Exception as exc:  # a bug: recorded, so the service goes on with other work
        result = TaskResult("error", f"{type(exc).__name__}: {exc}"[:500])
    except BaseException:
        # Stopped hard in the middle (a second Ctrl-C): give the lease back, then stop.
        if heartbeat is not None:
            heartbeat.stop()
        records.release(lease, now_ms=fixed_now_ms if fixed_now_ms is not None else wall_ms())
        raise
    if heartbeat is not None:
        heartbeat.stop()
    finished_ms = fixed_now_ms if fixed_now_ms is not None else wall_ms()
    run = LastRun(
        started_ms,
        finished_ms,
        result.outcome,
        result.detail,
        result.records,
        result.bytes,
        result.segments,
        result.files,
        holder,
        item.topic_id,
        result.partitions,
    )
    recorded = records.finish(lease, run, now_ms=finished_ms)
    detail = result.detail if recorded else f"{result.detail} (lease ran out; not recorded)"
    return TaskRun(
        item.topic,
        item.task,
        result.outcome,
        detail,
        result.records,
        result.bytes,
        result.segments,
        result.files,
        time.monotonic() - started,
    )


class _Heartbeat:
    """Renews a lease every third of its length while its task runs (on the wall clock), so
    that a long run keeps it; stops renewing once a renewal fails (the lease was lost)."""

    def __init__(self, records: Records, lease: Lease, lease_ms: int):
        self.records, self.lease, self.lease_ms = records, lease, lease_ms
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kstore-maintain-lease", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(self.lease_ms / 3000):
            try:
                if not self.records.renew(self.lease, now_ms=wall_ms(), lease_ms=self.lease_ms):
                    return
            except KStoreError:
                continue  # the storage is unreachable now: try again at the next beat

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


def run_due(
    store: Store,
    settings: Settings | None = None,
    *,
    now_ms: int | None = None,
    holder: str | None = None,
    spark: Any = None,
    topics: Sequence[str] | None = None,
    log: Log | None = None,
    stop: threading.Event | None = None,
    tasks: Sequence[Task] | None = None,
) -> list[TaskRun]:
    """One pass: plan, then run every due (topic, task) in this process (``spark`` None) or
    on Spark executors. ``now_ms`` fixes every clock (tests); ``stop`` ends the pass after
    the task in progress."""
    settings = settings or Settings()
    holder = holder or new_holder()
    the_plan = plan(store, settings, now_ms if now_ms is not None else wall_ms(), topics, tasks)
    for topic, why in sorted(the_plan.errors.items()):
        if log is not None:
            log(f"[maintain] {topic}: not planned: {why}")
    due = the_plan.due
    if spark is not None and due:
        runs = _run_on_spark(spark, store, due, settings, holder, now_ms)
        for run in runs:
            if log is not None:
                log(run.line())
        return runs
    runs = []
    for item in due:
        if stop is not None and stop.is_set():
            break
        run = run_item(store, item, settings, holder=holder, fixed_now_ms=now_ms, tasks=tasks)
        runs.append(run)
        if log is not None:
            log(run.line())
    return runs


def _run_on_spark(
    spark: Any,
    store: Store,
    due: list[TaskPlan],
    settings: Settings,
    holder: str,
    now_ms: int | None,
) -> list[TaskRun]:
    """One Spark task per topic, running its due tasks in registry order."""
    by_topic: dict[str | None, list[TaskPlan]] = {}
    for item in due:
        by_topic.setdefault(item.topic, []).append(item)
    groups = list(by_topic.values())
    url, options = store.url, dict(store.storage.storage_options)

    def run_group(group: list[TaskPlan]) -> list[dict[str, Any]]:
        executor_store = Store(url, options, create=False, segment_cache_bytes=0)
        return [
            asdict(run_item(executor_store, item, settings, holder=holder, fixed_now_ms=now_ms))
            for item in group
        ]

    sc = spark.sparkContext
    rows = sc.parallelize(groups, len(groups)).flatMap(run_group).collect()
    return [TaskRun(**row) for row in rows]


class Service:
    """The long-running form: a pass every ``settings.interval_ms`` until :meth:`stop`."""

    def __init__(
        self,
        store: Store,
        settings: Settings | None = None,
        *,
        holder: str | None = None,
        clock: Callable[[], int] | None = None,
        spark: Any = None,
        topics: Sequence[str] | None = None,
        log: Log | None = print,
    ):
        self.store = store
        self.settings = settings or Settings()
        self.holder = holder or new_holder()
        self.clock = clock  # None: the wall clock, and the jobs read their own
        self.spark = spark
        self.topics = list(topics) if topics else None
        self.log = log
        self.stopping = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def run_once(self) -> list[TaskRun]:
        return run_due(
            self.store,
            self.settings,
            now_ms=self.clock() if self.clock is not None else None,
            holder=self.holder,
            spark=self.spark,
            topics=self.topics,
            log=self.log,
            stop=self.stopping,
        )

    def run_forever(self) -> None:
        while not self.stopping.is_set():
            started = time.monotonic()
            try:
                self.run_once()
            except Exception as exc:  # the store unreachable, or a bug: try again next interval
                if self.log is not None:
                    self.log(f"[maintain] pass failed: {type(exc).__name__}: {exc}")
            elapsed_ms = (time.monotonic() - started) * 1000
            self.stopping.wait(max(0.0, (self.settings.interval_ms - elapsed_ms) / 1000))


@contextlib.contextmanager
def handle_stop_signals(service: Service) -> Iterator[None]:
    """While active, SIGTERM and SIGINT ask ``service`` to stop after its current task (which
    then records its run and ends its lease); a second SIGINT interrupts at once (the lease
    is still given back)."""
    previous: dict[signal.Signals, Any] = {}

    def on_signal(signum: int, _frame: Any) -> None:
        if service.stopping.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if service.log is not None:
            service.log(
                f"[maintain] {signal.Signals(signum).name}: stopping after the current task"
            )
        service.stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, on_signal)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


# -- status -------------------------------------------------------------------------------------


def status(
    store: Store,
    settings: Settings | None = None,
    topics: Sequence[str] | None = None,
    *,
    now_ms: int | None = None,
) -> dict[str, Any]:
    """What ``kstore maintain status`` shows, as plain data (the text form prints this)."""
    settings = settings or Settings()
    now = now_ms if now_ms is not None else wall_ms()
    the_plan = plan(store, settings, now, topics)
    out_topics = []
    for name, view in the_plan.views.items():
        partitions = []
        for p, state in sorted(view.states.items()):
            opened = []
            for txn, first in sorted(state.open_transactions.items(), key=lambda kv: kv[1]):
                i = state.segment_index_for(first)
                since = state.segments[i].min_timestamp_ms if i < len(state.segments) else None
                opened.append(
                    {
                        "transaction": txn,
                        "first_offset": first,
                        "age_ms": None if since is None else max(0, now - since),
                    }
                )
            # Each task's newest run that changed this partition, and what it removed there.
            last_runs = [
                {"task": t.task, "finished_ms": t.last.finished_ms, **t.last.partitions[p]}
                for t in the_plan.tasks
                if t.topic == name and t.last is not None and p in t.last.partitions
            ]
            partitions.append(
                {
                    "partition": p,
                    "segments": len(state.segments),
                    "bytes": state.size_bytes,
                    "log_start_offset": state.log_start_offset,
                    "cleaned_offset": state.cleaned_offset,
                    "dirty_ratio": round(dirty_ratio(state), 4),
                    "open_transactions": opened,
                    "last_runs": last_runs,
                }
            )
        out_topics.append(
            {
                "topic": name,
                "topic_id": view.meta.topic_id,
                "tasks": [_task_status(t) for t in the_plan.tasks if t.topic == name],
                "partitions": partitions,
            }
        )
    return {
        "now_ms": now,
        "interval_ms": settings.interval_ms,
        "topics": out_topics,
        "store_tasks": [_task_status(t) for t in the_plan.tasks if t.topic is None],
        "errors": the_plan.errors,
    }


def _task_status(item: TaskPlan) -> dict[str, Any]:
    return {
        "task": item.task,
        "due": item.decision.due,
        "reason": item.decision.reason,
        "next_ms": item.decision.next_ms,
        "running_by": item.held_by,
        "last_run": None if item.last is None else item.last.as_dict(),
    }
