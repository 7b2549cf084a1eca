"""What the console and the exporter show: one snapshot of the store, refreshed at most once per
interval by one thread, whatever the number of browsers and scrapes.

A refresh reuses the library's own answers (``Store.describe_topic``, ``describe_group``, the
maintenance service's ``status``), which each poll the logs they need. Called one after the
other they would poll the same log several times (a group's describe polls each partition's
topic log; the maintenance planner polls them again), so a refresh reads through a
:class:`CoalescingStorage`: while the refreshing thread is inside :meth:`CoalescingStorage.once`,
each storage call with the same arguments is answered once and then from memory. Each topic log,
group log, lease directory and maintenance record is therefore requested at most once per
refresh, and a refresh is all the store ever sees of the console's pages and scrapes (the record
browser and the write actions read and write the store themselves).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from kstore.records import TopicPartition
from kstore.storage import FileInfo, Storage
from kstore.storage.facade import COALESCE_GAP, LIST_PAGE_SIZE

if TYPE_CHECKING:
    import collections

    from kstore.groups import GroupDescription
    from kstore.manifest import PartitionState
    from kstore.store import Store, TopicDescription

T = TypeVar("T")

# The lag history a group's page draws: an hour of samples.
HISTORY_S = 3600
# A refresh never waits less than this after the previous one (a refresh interval of 0).
MIN_REFRESH_S = 0.5
# The maintenance state (each topic's last runs, what is due) is read at most this often: it
# costs a listing per topic, the dearest request on S3, and tasks run minutes apart.
MAINTENANCE_REFRESH_S = 60.0


class CoalescingStorage(Storage):
    """A :class:`Storage` whose reads, made by one thread inside :meth:`once`, are each sent
    once: a repeated call with the same arguments gets the first answer (or error). Any write
    forgets what was read. Other threads, and calls outside :meth:`once`, go to the store."""

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        allow_unsafe_writes: bool = False,
    ) -> None:
        super().__init__(url, storage_options, allow_unsafe_writes=allow_unsafe_writes)
        self._init_counts()

    def _init_counts(self) -> None:
        self._coalescing = threading.local()
        self._counts_lock = threading.Lock()
        self.sent = 0  # storage calls made inside once() that reached the store
        # Every call that reached the store, from any thread, inside once() or not: by
        # (method, path), a call on several paths counted once for each.
        self.reached: collections.Counter[tuple[str, str]] = collections.Counter()

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._init_counts()

    def _count(self, method: str, paths: tuple[str, ...], coalescing: bool) -> None:
        with self._counts_lock:
            if coalescing:
                self.sent += 1
            for path in paths:
                self.reached[(method, path)] += 1

    @contextlib.contextmanager
    def once(self) -> Iterator[None]:
        """Within the block, on this thread: every read with the same arguments is sent once."""
        self._coalescing.memo = {}
        try:
            yield
        finally:
            self._coalescing.memo = None

    def _memo(self) -> dict[Hashable, Any] | None:
        memo: dict[Hashable, Any] | None = getattr(self._coalescing, "memo", None)
        return memo

    def _cached(
        self, method: str, paths: tuple[str, ...], call: Callable[[], T], *, key: Hashable = None
    ) -> T:
        """``call``, sent to the store unless this refresh sent the same one already; counted
        in :attr:`reached` whenever it is sent (a call the facade makes inside another is
        part of that one)."""
        memo = self._memo()
        local = self._coalescing
        if getattr(local, "inside", False):
            return call()
        key = (method, paths) if key is None else key
        if memo is not None and key in memo:
            found = memo[key]
            if isinstance(found, BaseException):
                raise found
            value: T = found
            return value
        self._count(method, paths, memo is not None)
        local.inside = True
        try:
            value = call()
        except Exception as exc:
            if memo is not None:
                memo[key] = exc
            raise
        finally:
            local.inside = False
        if memo is not None:
            memo[key] = value
        return value

    def _write(self, method: str, paths: tuple[str, ...], call: Callable[[], None]) -> None:
        self._forget()
        if getattr(self._coalescing, "inside", False):
            call()
            return
        self._count(method, paths, False)
        self._coalescing.inside = True
        try:
            call()
        finally:
            self._coalescing.inside = False

    def _forget(self) -> None:
        memo = self._memo()
        if memo is not None:
            memo.clear()

    # -- reads ---------------------------------------------------------------------------------

    def read(self, rel: str) -> bytes:
        return self._cached("read", (rel,), lambda: super(CoalescingStorage, self).read(rel))

    def read_if_exists(self, rel: str) -> bytes | None:
        return self._cached(
            "read_if_exists", (rel,), lambda: super(CoalescingStorage, self).read_if_exists(rel)
        )

    def read_many(self, rels: list[str]) -> dict[str, bytes]:
        return dict(
            self._cached(
                "read_many",
                tuple(rels),
                lambda: super(CoalescingStorage, self).read_many(rels),
            )
        )

    def read_ranges(
        self, rel: str, ranges: Sequence[tuple[int, int]], *, gap: int = COALESCE_GAP
    ) -> list[bytes]:
        return list(
            self._cached(
                "read_ranges",
                (rel,),
                lambda: super(CoalescingStorage, self).read_ranges(rel, ranges, gap=gap),
                key=("read_ranges", rel, tuple(ranges), gap),
            )
        )

    def exists(self, rel: str) -> bool:
        return self._cached("exists", (rel,), lambda: super(CoalescingStorage, self).exists(rel))

    def list_dir(self, rel: str) -> list[FileInfo]:
        return list(
            self._cached("list_dir", (rel,), lambda: super(CoalescingStorage, self).list_dir(rel))
        )

    def list_pages(
        self, rel: str, *, start_after: str = "", page_size: int = LIST_PAGE_SIZE
    ) -> Generator[list[FileInfo], None, None]:
        pages = self._cached(
            "list_pages",
            (rel,),
            lambda: list(
                super(CoalescingStorage, self).list_pages(
                    rel, start_after=start_after, page_size=page_size
                )
            ),
            key=("list_pages", rel, start_after, page_size),
        )
        yield from pages

    def stat_many(self, rels: list[str]) -> dict[str, FileInfo]:
        return dict(
            self._cached(
                "stat_many",
                tuple(rels),
                lambda: super(CoalescingStorage, self).stat_many(rels),
            )
        )

    # -- writes: what was read may have changed ---------------------------------------------------

    def put_if_absent(self, rel: str, data: bytes | memoryview, *, durable: bool = True) -> None:
        self._write(
            "put_if_absent",
            (rel,),
            lambda: super(CoalescingStorage, self).put_if_absent(rel, data, durable=durable),
        )

    def put_new(self, rel: str, data: bytes | memoryview, *, durable: bool = True) -> None:
        self._write(
            "put_new",
            (rel,),
            lambda: super(CoalescingStorage, self).put_new(rel, data, durable=durable),
        )

    def put_new_many(self, files: dict[str, bytes], *, durable: bool = True) -> None:
        self._write(
            "put_new_many",
            tuple(files),
            lambda: super(CoalescingStorage, self).put_new_many(files, durable=durable),
        )

    def put(self, rel: str, data: bytes, *, durable: bool = True) -> None:
        self._write(
            "put", (rel,), lambda: super(CoalescingStorage, self).put(rel, data, durable=durable)
        )

    def delete(self, rels: Any) -> None:
        listed = list(rels)
        self._write("delete", tuple(listed), lambda: super(CoalescingStorage, self).delete(listed))

    def delete_tree(self, rel: str) -> None:
        self._write("delete_tree", (rel,), lambda: super(CoalescingStorage, self).delete_tree(rel))


# -- the snapshot -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicFacts:
    """One topic as ``kstore topics describe`` shows it, or why it could not be read."""

    name: str
    description: TopicDescription | None
    table: dict[str, Any] | None = None  # a Delta table: format, location, version
    error: str | None = None
    # Per partition, the producers its manifest remembers (idempotence and fencing).
    producers: dict[int, tuple[ProducerFacts, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ProducerFacts:
    producer_id: str
    epoch: int
    last_sequence: int
    last_offset: int
    timestamp_ms: int


@dataclass(frozen=True)
class PartitionLagFacts:
    """A group's lag on one partition: in records (``describe_group``) and in seconds."""

    topic: str
    partition: int
    current_offset: int | None
    log_start_offset: int
    log_end_offset: int
    lag: int | None
    lag_seconds: float | None
    member_id: str | None
    client_id: str | None


@dataclass(frozen=True)
class GroupFacts:
    """One group as ``kstore groups describe`` shows it, with lag in seconds, or its error."""

    group_id: str
    description: GroupDescription | None
    partitions: tuple[PartitionLagFacts, ...] = ()
    error: str | None = None

    @property
    def max_lag(self) -> int:
        return max((p.lag or 0 for p in self.partitions), default=0)

    @property
    def max_lag_seconds(self) -> float:
        return max((p.lag_seconds or 0.0 for p in self.partitions), default=0.0)


@dataclass(frozen=True)
class Snapshot:
    """The store as one refresh read it."""

    taken_ms: int  # wall clock, when the refresh began
    elapsed_s: float
    store_id: str
    topics: dict[str, TopicFacts]
    groups: dict[str, GroupFacts]
    maintenance: dict[str, Any] | None  # maintenance.status(), as ``kstore maintain status``
    maintenance_error: str | None = None
    maintenance_ms: int | None = None  # when the maintenance state was read (its own pace)
    storage_calls: int = 0  # storage calls this refresh sent (after coalescing)


@dataclass
class LagSample:
    taken_ms: int
    lag: int
    lag_seconds: float


def lag_seconds(state: PartitionState, committed: int | None, now_ms: int) -> float | None:
    """How far behind, in seconds, a reader at ``committed`` is: the age of the next record it
    would read, estimated from the manifest alone (no data read). Within the segment holding
    that offset, the record's time is interpolated between the segment's oldest and newest
    timestamps by its position; a caught-up reader is 0; no committed offset is unknown."""
    if committed is None:
        return None
    position = max(committed, state.start_offset)
    if position >= state.end_offset:
        return 0.0
    segments = state.segments
    i = state.segment_index_for(position)
    if i >= len(segments):
        return 0.0  # no live record left to read (compacted or transaction markers only)
    seg = segments[i]
    if position <= seg.base_offset:
        timestamp = float(seg.min_timestamp_ms)
    else:
        span = max(1, seg.last_offset - seg.base_offset)
        share = min(1.0, (position - seg.base_offset) / span)
        timestamp = seg.min_timestamp_ms + (seg.max_timestamp_ms - seg.min_timestamp_ms) * share
    return max(0.0, (now_ms - timestamp) / 1000)


Explain = Callable[[BaseException], str]


def _plain(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


class Snapshots:
    """Keeps the newest :class:`Snapshot` of a store, refreshed every ``refresh_s`` seconds by
    its own thread (:meth:`start`), or on demand (:meth:`refresh`, tests). Readers take
    :meth:`latest`: they never read the store themselves, so the store sees one refresh per
    interval whatever the number of readers. ``explain`` turns an error into the one line a
    page shows (the CLI's, with its hints)."""

    def __init__(
        self,
        store: Store,
        *,
        refresh_s: float = 5.0,
        maintenance_settings: Any = None,
        maintenance_refresh_s: float | None = None,
        explain: Explain | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.store = store
        self.refresh_s = max(MIN_REFRESH_S, float(refresh_s))
        self.maintenance_refresh_s = max(
            self.refresh_s,
            MAINTENANCE_REFRESH_S
            if maintenance_refresh_s is None
            else float(maintenance_refresh_s),
        )
        self.maintenance_settings = maintenance_settings
        self.explain = explain or _plain
        self.clock = clock or (lambda: int(time.time() * 1000))
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._latest: Snapshot | None = None
        self._error: str | None = None  # the newest refresh's failure (None: it succeeded)
        self._error_ms: int | None = None
        self._history: dict[tuple[str, str, int], deque[LagSample]] = {}
        self._group_history: dict[str, deque[LagSample]] = {}
        self.refreshes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading ---------------------------------------------------------------------------------

    def latest(self) -> Snapshot | None:
        with self._lock:
            return self._latest

    def failure(self) -> tuple[str, int] | None:
        """The newest refresh's error and when it happened, if it failed."""
        with self._lock:
            if self._error is None or self._error_ms is None:
                return None
            return self._error, self._error_ms

    def group_history(self, group: str) -> list[LagSample]:
        with self._lock:
            return list(self._group_history.get(group, ()))

    def partition_history(self, group: str, tp: TopicPartition) -> list[LagSample]:
        with self._lock:
            return list(self._history.get((group, tp.topic, tp.partition), ()))

    # -- refreshing ------------------------------------------------------------------------------

    def start(self) -> None:
        """Refresh now, then every ``refresh_s`` in a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._run, name="kstore-console-refresh", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            self.refresh()
            self._stop.wait(max(MIN_REFRESH_S, self.refresh_s - (time.monotonic() - began)))

    def refresh(self) -> Snapshot | None:
        """One refresh (one at a time): the new snapshot, or None when the store could not be
        read (the previous snapshot stays, with :meth:`failure` saying why)."""
        with self._refreshing:
            now = self.clock()
            try:
                snap = self._take(now)
            except Exception as exc:  # the store unreachable, or a bug: shown, retried next time
                with self._lock:
                    self.failures += 1
                    self._error, self._error_ms = self.explain(exc), now
                return None
            with self._lock:
                self.refreshes += 1
                self._latest = snap
                self._error = self._error_ms = None
                self._record_history(snap)
            return snap

    def _coalesced(self) -> contextlib.AbstractContextManager[None]:
        storage = self.store.storage
        if isinstance(storage, CoalescingStorage):
            return storage.once()
        return contextlib.nullcontext()

    def _take(self, now_ms: int) -> Snapshot:
        storage = self.store.storage
        before = storage.sent if isinstance(storage, CoalescingStorage) else 0
        began = time.monotonic()
        previous = self.latest()
        with self._coalesced():
            topics = self._topics()
            groups = self._groups(now_ms)
            if (
                previous is not None
                and previous.maintenance_ms is not None
                and now_ms - previous.maintenance_ms < self.maintenance_refresh_s * 1000
            ):
                maintenance, maintenance_error, maintenance_ms = (
                    previous.maintenance,
                    previous.maintenance_error,
                    previous.maintenance_ms,
                )
            else:
                maintenance, maintenance_error = self._maintenance(now_ms)
                maintenance_ms = now_ms
        sent = storage.sent - before if isinstance(storage, CoalescingStorage) else 0
        return Snapshot(
            taken_ms=now_ms,
            elapsed_s=time.monotonic() - began,
            store_id=self.store.store_id,
            topics=topics,
            groups=groups,
            maintenance=maintenance,
            maintenance_error=maintenance_error,
            maintenance_ms=maintenance_ms,
            storage_calls=sent,
        )

    def _topics(self) -> dict[str, TopicFacts]:
        from kstore.errors import KStoreError

        out: dict[str, TopicFacts] = {}
        for name in self.store.list_topics():  # a failure here fails the refresh: no store
            try:
                desc = self.store.describe_topic(name)
                out[name] = TopicFacts(
                    name, desc, self._table_of(desc), producers=self._producers(desc)
                )
            except (KStoreError, OSError) as exc:
                out[name] = TopicFacts(name, None, error=self.explain(exc))
        return out

    def _producers(self, desc: TopicDescription) -> dict[int, tuple[ProducerFacts, ...]]:
        """Coalesced: the partition states describe_topic just read, not more requests."""
        out = {}
        for p in range(desc.metadata.partitions):
            state = self.store.partition_state(desc.name, p, desc.metadata)
            out[p] = tuple(
                ProducerFacts(pid, e.epoch, e.last_sequence, e.last_offset, e.timestamp_ms)
                for pid, e in sorted(state.producers.items())
            )
        return out

    def _table_of(self, desc: TopicDescription) -> dict[str, Any] | None:
        """A topic with table.format=delta: its table's location and newest version, as
        ``kstore topics describe`` shows them (one listing of the Delta log)."""
        from kstore.lakehouse import enabled, newest_version, table_url

        from kstore.storage import redact_url

        meta = desc.metadata
        if not enabled(meta.effective_config):
            return None
        version = newest_version(self.store, meta)
        return {
            "format": "delta",
            "location": redact_url(table_url(self.store, meta)),
            "version": version,
        }

    def _groups(self, now_ms: int) -> dict[str, GroupFacts]:
        from kstore.errors import KStoreError
        from kstore.groups import Group, describe_group
        from kstore.layout import GROUPS
        from kstore.names import validate_group_id

        out: dict[str, GroupFacts] = {}
        # As kstore.groups.list_groups, but a group whose log cannot be read is listed with its
        # error instead of failing the whole refresh (list_groups raises for it).
        for info in self.store.storage.list_dir(GROUPS):
            name = info.name
            try:
                validate_group_id(name)
            except ValueError:
                continue
            try:
                if not Group(self.store, name).exists():
                    continue
                desc = describe_group(self.store, name)
                out[name] = GroupFacts(name, desc, self._lag_rows(desc, now_ms))
            except (KStoreError, OSError) as exc:
                out[name] = GroupFacts(name, None, error=self.explain(exc))
        return out

    def _lag_rows(self, desc: GroupDescription, now_ms: int) -> tuple[PartitionLagFacts, ...]:
        rows = []
        metas: dict[str, Any] = {}
        for p in desc.partitions:
            meta = metas.get(p.topic)
            if meta is None:
                meta = metas[p.topic] = self.store.topic(p.topic)
            # Coalesced: the state describe_group just read, not another request.
            state = self.store.partition_state(p.topic, p.partition, meta)
            rows.append(
                PartitionLagFacts(
                    topic=p.topic,
                    partition=p.partition,
                    current_offset=p.current_offset,
                    log_start_offset=state.start_offset,
                    log_end_offset=p.log_end_offset,
                    lag=p.lag,
                    lag_seconds=lag_seconds(state, p.current_offset, now_ms),
                    member_id=p.member_id,
                    client_id=p.client_id,
                )
            )
        return tuple(rows)

    def _maintenance(self, now_ms: int) -> tuple[dict[str, Any] | None, str | None]:
        from kstore.maintenance.service import status

        from kstore.errors import KStoreError

        try:
            return status(self.store, self.maintenance_settings, now_ms=now_ms), None
        except (KStoreError, OSError) as exc:
            return None, self.explain(exc)

    def _record_history(self, snap: Snapshot) -> None:
        """Called with the lock held: an hour of lag samples per group and per partition."""
        horizon = snap.taken_ms - HISTORY_S * 1000
        for name, facts in snap.groups.items():
            total = LagSample(
                snap.taken_ms,
                sum(p.lag or 0 for p in facts.partitions),
                facts.max_lag_seconds,
            )
            _append(self._group_history.setdefault(name, deque()), total, horizon)
            for p in facts.partitions:
                sample = LagSample(snap.taken_ms, p.lag or 0, p.lag_seconds or 0.0)
                key = (name, p.topic, p.partition)
                _append(self._history.setdefault(key, deque()), sample, horizon)
        for gone in set(self._group_history) - set(snap.groups):
            del self._group_history[gone]
        for key in [k for k in self._history if k[0] not in snap.groups]:
            del self._history[key]


def _append(samples: deque[LagSample], sample: LagSample, horizon_ms: int) -> None:
    samples.append(sample)
    while samples and samples[0].taken_ms < horizon_ms:
        samples.popleft()


def open_coalescing_store(url: str, options: Mapping[str, Any]) -> Store:
    """The console's store: reads coalesced within a refresh (:class:`CoalescingStorage`);
    ``StoreNotFoundError`` when the URL holds no store (the console never creates one)."""
    from kstore.store import Store

    return Store.from_storage(CoalescingStorage(url, options), create=False)


def request_counter(store: Store) -> contextlib.AbstractContextManager[collections.Counter[str]]:
    """The storage requests this process sends, by kind (S3 only; elsewhere nothing counted)."""
    if store.storage.counts_requests:
        return store.storage.count_requests()
    import collections as _collections

    return contextlib.nullcontext(_collections.Counter())


@dataclass
class RunCounts:
    """The maintenance runs this process made, by task and outcome (``kstore maintain``)."""

    runs: dict[tuple[str, str], int] = field(default_factory=dict)
    removed: dict[tuple[str, str], int] = field(default_factory=dict)  # (task, unit) -> amount
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, task: str, outcome: str, records: int, bytes_: int, segments: int) -> None:
        with self.lock:
            self.runs[(task, outcome)] = self.runs.get((task, outcome), 0) + 1
            for unit, amount in (("records", records), ("bytes", bytes_), ("segments", segments)):
                self.removed[(task, unit)] = self.removed.get((task, unit), 0) + amount

    def copy(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        with self.lock:
            return dict(self.runs), dict(self.removed)
