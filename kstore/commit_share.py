"""Shared commits (PROTOCOL.md 30): the writers of one topic log share its commits instead of
racing for every version.

A writer alone commits its own flushes directly (solo). A writer that finds another writer
committing for the log (the **holder**, named by ``commitInfo.committer`` of the newest commit)
writes its flush as a pending flush (:mod:`kstore.pending`) and waits: the holder's next round
lists the pending flushes, checks each as the writer's own commit would be checked, and commits
them all in one commit. The waiter learns its outcome from the state it tails, exactly as a
retry of its own commit would (its producer batch is the partition's last: committed). When no
commit comes within the takeover time, or three come without its flush, it commits a round
itself and so becomes the holder. Nothing about correctness depends on who holds: every part
is validated on the state its commit follows, and put-if-absent admits one commit per version.

One :class:`CommitShare` per topic log per producer. It is given the topic log, the storage and
the producer's metrics; the sender hands it one flush at a time (its writes to one log are
chained) and gets each partition's offsets or error back.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc

from kstore import clock
from kstore.errors import (
    CommitStateUnknownError,
    ConcurrentModificationError,
    CorruptLogError,
    KStoreError,
    ProducerFencedError,
    StorageError,
)
from kstore.handoff import read_handed_over
from kstore.log import CARRIED, Action
from kstore.manifest import PartitionState, ProducerEntry, add_action
from kstore.pending import (
    Flush,
    Part,
    decode_pending,
    encode_pending,
    parse_pending_name,
    pending_dir,
)
from kstore.segments import FORMAT_ARROW, SegmentFile, checksum, encode_arrow
from kstore.storage import Storage, unique_id
from kstore.topic_log import (
    TopicLog,
    TopicLogState,
    shares_commits,
    tag_actions,
    topic_log_protocol,
)

log = logging.getLogger("kstore.producer")

# A combined commit's bounds (PROTOCOL.md Appendix A): the flushes past them wait a round.
MAX_SHARED_DATA = 16 << 20
MAX_SHARED_TEXT = 4 << 20
_TEXT_PER_PART = 400  # bytes of commit text a part adds (an add's share and a producer line)
# A committer lists pending flushes in its rounds for this long after it last took another
# writer's flush, lost a race or took over; then it commits alone again (solo).
ACTIVE_S = 10.0
# Pending names whose outcome a committer knows are skipped in later listings this long (their
# files are deleted right after the commit, so they rarely outlive one round).
_KNOWN_S = 60.0
# After this many commits that land after its pending write without taking it, a waiter
# commits itself (a committer past its bounds, or one that does not list).
_COMMITS_BEFORE_TAKEOVER = 3
# A pending flush listed as written longer ago than this (the storage's time against this
# writer's clock) is not taken: its writer has given up on it long since, and taking it must
# not outlast its producer entry (a day, PROTOCOL.md 8.9), which makes a second take a
# duplicate. A clock this far off only makes a committer leave fresh flushes to their writers.
PENDING_MAX_AGE_MS = 3_600_000
# The counters a share adds to its producer's metrics (Producer.metrics()).
SHARE_METRICS = (
    "shared-commit-total",
    "shared-flush-taken-total",
    "pending-flush-total",
    "shared-takeover-total",
    "shared-yield-total",
    "commit-race-lost-total",
    "shared-round-total",
    "shared-list-ms-total",
    "shared-build-ms-total",
    "shared-publish-ms-total",
    "shared-look-total",
)
# A waiter's patience: this many average gaps between the versions it saw, when longer than the
# takeover time, and at most this many takeover times.
_PATIENCE_GAPS = 3.0
_PATIENCE_MAX = 8.0
# A listing started during a commit serves the round right after it, not one this much later.
_AHEAD_MAX_S = 1.0
DEFAULT_TAKEOVER_LOCAL_MS = 100
DEFAULT_TAKEOVER_REMOTE_MS = 250

Outcome = tuple[int, int] | BaseException  # (base offset, log start) or the partition's error


def default_takeover_ms(storage: Storage) -> int:
    """The takeover time when none is configured: at least four commit PUTs of the store."""
    return DEFAULT_TAKEOVER_REMOTE_MS if storage.is_remote else DEFAULT_TAKEOVER_LOCAL_MS


class _YieldError(Exception):
    """A commit attempt met a newer commit by another committer: that one holds the log."""


@dataclass(eq=False)
class _Own:
    """One of this writer's flushes on its way: its outcome per partition once known."""

    flush: Flush
    deadline: float
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)
    handed_back: bool = False  # the committer yielded before taking it: the caller waits
    took_over: bool = False  # its writer committed a round for it (PROTOCOL.md 30.6)


@dataclass
class _Plan:
    """What one commit attempt takes, built on one state (PROTOCOL.md 30.5)."""

    placed: dict[int, list[tuple[Flush, Part]]] = field(default_factory=dict)
    tags: dict[int, str | None] = field(default_factory=dict)
    taken: dict[str, list[int]] = field(default_factory=dict)
    refused: list[tuple[str, int, BaseException]] = field(default_factory=list)
    duplicates: dict[tuple[str, int], ProducerEntry] = field(default_factory=dict)
    deferred: list[Flush] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    data: bytes = b""


def _all_duplicate(plan: _Plan, flush: Flush) -> bool:
    return all((flush.name, p) in plan.duplicates for p in flush.parts)


def _check_part(part: Part, state: PartitionState) -> ProducerEntry | None:
    """A part validated as its writer's own commit would be (15, 18.5): the committed entry
    when it is a duplicate, None when it may be taken; raises its refusal."""
    dup = part.producer.check(state)
    if dup is not None:
        return dup
    if part.transaction is not None:
        pid, _, version = part.transaction.rpartition(":")
        if state.ended_transactions.get(pid, -1) >= int(version):
            raise ConcurrentModificationError(
                f"partition {part.partition}: transaction {part.transaction} has already ended"
            )
    return None


def resolve(flush: Flush, state: TopicLogState) -> dict[int, Outcome | None]:
    """Each partition's outcome of ``flush`` as ``state`` shows it (PROTOCOL.md 30.6): its
    batch is the partition's last of its producer (committed there), a refusal, or None
    (not committed yet)."""
    out: dict[int, Outcome | None] = {}
    for p, part in flush.parts.items():
        view = state.partition(p)
        try:
            dup = _check_part(part, view)
        except KStoreError as exc:
            out[p] = exc
            continue
        out[p] = None if dup is None else (dup.base_offset, view.start_offset)
    return out


def _schema_of(data: memoryview) -> pa.Schema:
    return ipc.RecordBatchFileReader(pa.py_buffer(data)).schema


def plan_round(state: TopicLogState, flushes: list[Flush]) -> _Plan:
    """Which parts of ``flushes`` (in order) one commit on ``state`` takes. A flush is taken
    whole or partly (refused and duplicate parts), or waits whole for the next round: a
    second flush of one writer, a second part of one producer in a partition, a part whose
    transaction tag or record schema differs from the partition's parts placed before it, or
    a flush past the commit's bounds."""
    plan = _Plan()
    writers: set[str] = set()
    producers: set[tuple[str, int]] = set()
    schemas: dict[int, pa.Schema] = {}
    size = text = 0
    for flush in flushes:
        if flush.writer in writers:
            plan.deferred.append(flush)
            continue
        decided: dict[int, ProducerEntry | BaseException | None] = {}
        fits = True
        for p, part in flush.parts.items():
            try:
                decided[p] = _check_part(part, state.partition(p))
            except KStoreError as exc:
                decided[p] = exc
                continue
            if decided[p] is not None:
                continue
            if (part.producer.producer_id, p) in producers or (
                p in plan.tags and plan.tags[p] != part.transaction
            ):
                fits = False
                break
            if p in plan.placed:
                if p not in schemas:
                    first, first_part = plan.placed[p][0]
                    schemas[p] = _schema_of(first.part_bytes(first_part))
                if not _schema_of(flush.part_bytes(part)).equals(schemas[p]):
                    fits = False
                    break
        adds = sum(flush.parts[p].file.size_bytes for p, d in decided.items() if d is None)
        lines = _TEXT_PER_PART * len(flush.parts)
        if not fits or (
            plan.taken and (size + adds > MAX_SHARED_DATA or text + lines > MAX_SHARED_TEXT)
        ):
            plan.deferred.append(flush)
            continue
        writers.add(flush.writer)
        size, text = size + adds, text + lines
        for p, decision in decided.items():
            part = flush.parts[p]
            if isinstance(decision, BaseException):
                plan.refused.append((flush.name, p, decision))
            elif decision is not None:
                plan.duplicates[(flush.name, p)] = decision
            else:
                plan.placed.setdefault(p, []).append((flush, part))
                plan.tags[p] = part.transaction
                producers.add((part.producer.producer_id, p))
                plan.taken.setdefault(flush.name, []).append(p)
    return plan


def commit_actions(plan: _Plan, state: TopicLogState, now_ms: int) -> list[Action]:
    """The actions of a combined commit on ``state``, and its data (set on the plan): per
    partition one ranged add of all its placed records and a producer action per part
    (PROTOCOL.md 30.5), then the ``flushes`` action."""
    data, files = _combined_data(plan)
    plan.data = data
    actions: list[Action] = []
    for p in sorted(plan.placed):
        base = state.partition(p).end_offset
        f = files[p]
        own = [
            add_action(
                CARRIED,
                base,
                base + f.record_count - 1,
                f.record_count,
                f.min_timestamp_ms,
                f.max_timestamp_ms,
                f.size_bytes,
                f.checksum,
                FORMAT_ARROW,
                False,
                now_ms,
                transaction=plan.tags[p],
                byte_range=f.byte_range,
            )
        ]
        offset = base
        for flush, part in plan.placed[p]:
            count = part.file.record_count
            own.append(part.producer.action(offset, offset + count - 1, now_ms))
            plan.offsets[(flush.name, p)] = offset
            offset += count
        actions.extend(tag_actions(own, p))
    # A committer's own flush has no pending file, so no name here (PROTOCOL.md 30.5).
    foreign = {f.name for placed in plan.placed.values() for f, _ in placed if f.listed_ms >= 0}
    flushes: dict[str, Any] = {
        "taken": [
            {"name": name, "partitions": parts}
            for name, parts in plan.taken.items()
            if name in foreign
        ]
    }
    if plan.refused:
        flushes["refused"] = [
            {"name": name, "partition": p, "error": type(exc).__name__}
            for name, p, exc in plan.refused
        ]
    actions.append({"flushes": flushes})
    if state.version < 0:
        actions.insert(0, topic_log_protocol())  # this commit creates the log
    return actions


def _combined_data(plan: _Plan) -> tuple[bytes, dict[int, SegmentFile]]:
    """The data section of a combined commit: one range per partition. A partition with one
    placed part keeps that part's bytes (and checksum); several are decoded and encoded as
    one IPC file of all their records, in order."""
    pieces: list[bytes | memoryview] = []
    files: dict[int, SegmentFile] = {}
    position = 0
    for p in sorted(plan.placed):
        placed = plan.placed[p]
        if len(placed) == 1:
            flush, part = placed[0]
            blob: bytes | memoryview = flush.part_bytes(part)
            crc = part.file.checksum
        else:
            tables = [
                ipc.RecordBatchFileReader(pa.py_buffer(flush.part_bytes(part))).read_all()
                for flush, part in placed
            ]
            blob = memoryview(encode_arrow(pa.concat_tables(tables), placed[0][0].compression))
            crc = checksum(blob)
        files[p] = SegmentFile(
            path=CARRIED,
            record_count=sum(part.file.record_count for _, part in placed),
            min_timestamp_ms=min(part.file.min_timestamp_ms for _, part in placed),
            max_timestamp_ms=max(part.file.max_timestamp_ms for _, part in placed),
            size_bytes=len(blob),
            checksum=crc,
            format=FORMAT_ARROW,
            sparse=False,
            byte_range=(position, len(blob)),
        )
        pieces.append(blob)
        position += len(blob)
    return b"".join(pieces), files


class CommitShare:
    """A writer's part in sharing one topic log's commits (thread-safe).

    ``takeover_s``: how long a waiter waits for a commit before it commits itself;
    ``metrics``: the producer's counters, to which it adds its own."""

    def __init__(
        self,
        topic_log: TopicLog,
        storage: Storage,
        *,
        incarnation_dir: str,
        partitions: int,
        commit_logs: int,
        takeover_s: float,
        metrics: dict[str, float],
        client_id: str = "",
    ) -> None:
        self.writer_id = unique_id()
        self._log = topic_log
        self._storage = storage
        self._dir = pending_dir(incarnation_dir, topic_log.index)
        self._partitions = partitions
        self._commit_logs = commit_logs
        self._takeover_s = takeover_s
        self._metrics = metrics
        self._client_id = client_id
        remote = storage.is_remote
        self._wait_poll_s = 0.01 if remote else 0.002
        self._list_poll_s = 0.01 if remote else 0.003
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._round_lock = threading.Lock()  # one round at a time, whoever runs it
        self._queue: list[_Own] = []
        self._thread: threading.Thread | None = None
        self._listing_until = 0.0
        self._known: dict[str, float] = {}
        self._number = 0
        self._seen_version = -1
        self._seen_at = 0.0
        self._gap: float | None = None  # the average gap between new versions seen, s
        self._closed = False
        # The committer's next listing, started while its current commit is written
        # (PROTOCOL.md 30.4: rounds overlap), and the names of the flushes that commit takes,
        # which that listing does not read again.
        self._lister: concurrent.futures.ThreadPoolExecutor | None = None
        self._next_listing: concurrent.futures.Future[list[Flush]] | None = None
        self._next_listing_at = 0.0
        self._in_round: set[str] = set()
        # Pending files to delete, off every flush's path (a DELETE is one request of latency).
        self._deletes: queue.Queue[list[str] | None] = queue.Queue()
        self._deleter: threading.Thread | None = None
        for key in SHARE_METRICS:
            metrics.setdefault(key, 0)

    # -- the sender's entry point ------------------------------------------------------------

    def eligible(self, state: TopicLogState) -> bool:
        """Whether flushes to this log may be shared: the log is at writer version 8, or is
        yet to be created (its first commit, by whichever writer, starts it there)."""
        return not self._closed and (state.version < 0 or shares_commits(state))

    def new_flush(
        self,
        parts: dict[int, Part],
        data: bytes,
        *,
        durable: bool,
        compression: str,
    ) -> Flush:
        with self._lock:
            number = self._number
            self._number += 1
        return Flush(
            writer=self.writer_id,
            number=number,
            log=self._log.index,
            data=data,
            parts=parts,
            durable=durable,
            compression=compression,
            timestamp_ms=int(time.time() * 1000),
        )

    def write(self, flush: Flush, deadline: float) -> dict[int, Outcome]:
        """Commit ``flush``: alone, through this writer's committer rounds, or as a pending
        flush another writer's commit takes. Returns each partition's outcome."""
        own = _Own(flush, deadline)
        self._observe(self._log.state(refresh=False))
        with self._wake:
            queued = self._thread is not None
            if queued:
                self._queue.append(own)
                self._wake.notify_all()
        if queued:
            own.done.wait()
            if not own.handed_back:
                return own.outcomes
        elif not self._other_holds():
            try:
                with self._round_lock:
                    listing = clock.monotonic() < self._listing_until
                    took, lost = self._round([own], voluntary=True, listing=listing)
                if took or lost:
                    # Another writer takes this log's versions too: from now on this one
                    # lists and commits for both (PROTOCOL.md 30.3).
                    self._start_committing()
                if self._resolved(own):
                    return own.outcomes
            except _YieldError:
                self._metrics["shared-yield-total"] += 1
        return self._wait(own)

    def close(self, timeout: float | None = None) -> None:
        """Stop committing for others (after the queued flushes): their writers take over."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._lock:
            lister, self._lister = self._lister, None
            deleter, self._deleter = self._deleter, None
        if lister is not None:
            lister.shutdown(wait=True)
        if deleter is not None:
            self._deletes.put(None)
            deleter.join(timeout)

    # -- roles ---------------------------------------------------------------------------------

    def _observe(self, state: TopicLogState) -> None:
        if state.version != self._seen_version:
            now = clock.monotonic()
            if 0 <= self._seen_version < state.version:
                # One idle spell does not make a waiter slow to take over from a crashed holder.
                gap = min((now - self._seen_at) / (state.version - self._seen_version), 1.0)
                self._gap = gap if self._gap is None else 0.8 * self._gap + 0.2 * gap
            self._seen_version, self._seen_at = state.version, now

    def _patience(self) -> float:
        """How long this writer waits for a new version before it takes over: the takeover
        time, or, where the log's versions have lately come further apart (a loaded machine,
        a slow store), ``_PATIENCE_GAPS`` of their average gap, at most ``_PATIENCE_MAX`` takeover
        times (PROTOCOL.md 30.6): a committer merely slow is not taken over round after round."""
        gap = self._gap or 0.0
        return max(self._takeover_s, min(_PATIENCE_GAPS * gap, _PATIENCE_MAX * self._takeover_s))

    def _other_holds(self) -> bool:
        """Whether another writer committed this log's newest commit, seen less than the
        takeover time ago: then a flush waits for its next round."""
        state = self._log.state(refresh=False)
        self._observe(state)
        return (
            state.committer is not None
            and state.committer != self.writer_id
            and state.committer_version == state.version
            and clock.monotonic() - self._seen_at < self._patience()
        )

    def _start_committing(self) -> None:
        with self._wake:
            self._listing_until = clock.monotonic() + ACTIVE_S
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run,
                    name=f"kstore-committer-{self._client_id}-{self._log.index}",
                    daemon=True,
                )
                self._thread.start()

    def _run(self) -> None:
        """The committer: rounds for others' pending flushes (and this writer's own, queued by
        :meth:`write`) until it has taken none for ``ACTIVE_S``, or yields to another."""
        while True:
            with self._wake:
                owns, self._queue = self._queue, []
                idle = not owns and clock.monotonic() >= self._listing_until
                if (self._closed and not owns) or idle:
                    self._thread = None
                    return
            try:
                with self._round_lock:
                    took, _ = self._round(owns, voluntary=True, listing=True, ahead=True)
            except _YieldError:
                self._metrics["shared-yield-total"] += 1
                with self._wake:
                    owns += self._queue
                    self._queue = []
                    self._thread, self._listing_until = None, 0.0
                for own in owns:
                    own.handed_back = True
                    own.done.set()
                return
            except Exception as exc:  # a round that failed: its own flushes try again
                log.warning("shared commit round of %s failed: %s", self._log, exc)
                took = False
                time.sleep(self._list_poll_s)
            again = [o for o in owns if not self._finish_if_resolved(o)]
            with self._wake:
                self._queue[:0] = again
                if took:
                    self._listing_until = clock.monotonic() + ACTIVE_S
                if not took and not self._queue and not self._closed:
                    self._wake.wait(self._list_poll_s)

    def _finish_if_resolved(self, own: _Own) -> bool:
        if self._resolved(own) or clock.monotonic() >= own.deadline:
            self._give_up_unresolved(own)
            own.done.set()
            return True
        return False

    def _resolved(self, own: _Own) -> bool:
        return len(own.outcomes) == len(own.flush.parts)

    def _give_up_unresolved(self, own: _Own, cause: KStoreError | None = None) -> None:
        why = (
            "was not committed within its delivery timeout"
            if cause is None
            else f"cannot be committed by this writer ({cause})"
        )
        for p in own.flush.parts:
            if p not in own.outcomes:
                unknown = CommitStateUnknownError(
                    f"{self._log}: partition {p}'s pending flush {why}; another writer may "
                    "still commit it"
                )
                unknown.retriable = False
                own.outcomes[p] = unknown

    # -- a waiter ------------------------------------------------------------------------------

    def _wait(self, own: _Own) -> dict[int, Outcome]:
        """Write ``own`` as a pending flush and wait for a commit that takes it; take over when
        none comes in time (PROTOCOL.md 30.6)."""
        flush = own.flush
        path = f"{self._dir}/{flush.name}"
        payload = encode_pending(flush)
        put_started = clock.monotonic()
        while True:
            try:
                # Created whole or not at all (a committer may list it at any moment); "exists"
                # can only be this write's own earlier attempt, its name being this writer's.
                self._storage.put_if_absent(path, payload, durable=flush.durable)
                break
            except FileExistsError:
                if self._storage.read_if_exists(path) == payload:
                    break
                raise StorageError(
                    f"{path}: a pending flush of this name holds other bytes"
                ) from None
            except StorageError as exc:
                if clock.monotonic() >= own.deadline:
                    self._give_up_unresolved(own)
                    return own.outcomes
                log.warning("pending flush %s: %s; writing it again", path, exc)
                time.sleep(self._wait_poll_s)
        self._metrics["pending-flush-total"] += 1
        written = clock.monotonic()
        # No commit can take the flush before a committer has listed it, read it and written
        # its commit: three requests of about the PUT's latency. The first look waits for two
        # of them (a look costs a GET and CPU, which 16 waiters on 2 cores feel).
        first_look = written + min(2 * (written - put_started), self._takeover_s / 4)
        # Commits are counted from the first look after the write (the cached state may be
        # versions behind the log: counted from it, a waiter would take over at once).
        base: int | None = None
        last_version, last_change = self._log.state(refresh=False).version, written
        try:
            while True:
                wait = first_look - clock.monotonic()
                if wait > 0:
                    time.sleep(wait)
                self._metrics["shared-look-total"] += 1
                try:
                    state = self._log.state(tail=True)
                except StorageError as exc:
                    # The flush may be taken meanwhile: only its deadline ends the wait.
                    if clock.monotonic() >= own.deadline:
                        self._give_up_unresolved(own)
                        return own.outcomes
                    log.warning("tailing %s failed: %s", self._log, exc)
                    time.sleep(self._wait_poll_s)
                    continue
                self._observe(state)
                for p, outcome in resolve(flush, state).items():
                    if outcome is not None:
                        own.outcomes[p] = outcome
                if self._resolved(own):
                    return own.outcomes
                now = clock.monotonic()
                if base is None:
                    base = state.version
                if state.version != last_version:
                    last_version, last_change = state.version, now
                if now >= own.deadline:
                    self._give_up_unresolved(own)
                    return own.outcomes
                stalled = now - last_change >= self._patience()
                if stalled or state.version - base >= _COMMITS_BEFORE_TAKEOVER:
                    self._metrics["shared-takeover-total"] += 1
                    own.took_over = True
                    try:
                        with self._round_lock:
                            self._round([own], voluntary=False, listing=True)
                        self._start_committing()
                    except KStoreError as exc:
                        if not exc.retriable:
                            # Nothing this writer commits can take it; another writer still may.
                            self._give_up_unresolved(own, cause=exc)
                            return own.outcomes
                        log.warning("takeover of %s failed: %s; waiting on", self._log, exc)
                    if self._resolved(own):
                        return own.outcomes
                    base, last_change = None, clock.monotonic()
                    continue
                time.sleep(self._wait_poll_s)
        finally:
            # A flush another writer's commit took is deleted by that committer (PROTOCOL.md
            # 30.4 step 7); the writer deletes its file itself in every other case.
            if not (
                self._resolved(own)
                and not own.took_over
                and all(isinstance(o, tuple) for o in own.outcomes.values())
            ):
                self._delete_later([path])

    # -- a round -------------------------------------------------------------------------------

    def _round(
        self, owns: list[_Own], *, voluntary: bool, listing: bool, ahead: bool = False
    ) -> tuple[bool, bool]:
        """One commit of this writer's ``owns`` (first) and, when ``listing``, every valid
        pending flush it finds; only a listing round names this writer as the log's holder.
        Sets each own flush's outcomes that the commit decides. Returns whether it took
        another writer's flush, and whether it met another writer's commits. Raises :class:`_YieldError` when
        ``voluntary`` and another committer's commit is newer than the state it started on."""
        started = time.perf_counter()
        foreign = self._listing(ahead) if listing else []
        flushes = [own.flush for own in owns] + foreign
        if not flushes:
            return False, False
        listed = time.perf_counter()
        self._metrics["shared-round-total"] += 1
        self._metrics["shared-list-ms-total"] += (listed - started) * 1000
        start = self._log.state(refresh=False).version
        plans: list[_Plan] = []
        built_on: list[int] = []

        def build(state: TopicLogState) -> list[Action] | None:
            built_on.append(state.version)
            # A voluntary round gives way to another writer's commits (PROTOCOL.md 30.3 rule
            # 2): a listing committer's newer than its state, or any that won a race against
            # it. Its own flush then waits for that writer, or commits after the takeover time
            # (a takeover does not give way), so racing writers settle instead of starving.
            if voluntary and (
                len(built_on) > 1
                or (
                    state.committer not in (None, self.writer_id)
                    and state.committer_version > start
                )
            ):
                raise _YieldError()
            build_started = time.perf_counter()
            plan = plan_round(state, flushes)
            plans[:] = [plan]
            if not plan.placed:
                return None
            if listing:
                # The next round's listing runs while this commit is written: it starts after
                # the state this commit follows landed, so a flush written before then is seen
                # by the commit after this one (PROTOCOL.md 30.7, I4).
                self._list_ahead({f.name for f in foreign if f not in plan.deferred})
            actions = commit_actions(plan, state, int(time.time() * 1000))
            self._metrics["shared-build-ms-total"] += (time.perf_counter() - build_started) * 1000
            return actions

        result = self._log.commit_state_build(
            build,
            lambda: plans[0].data,
            operation="APPEND",
            durable=any(f.durable for f in flushes),
            info={"committer": self.writer_id} if listing else {},
        )
        self._metrics["shared-publish-ms-total"] += (time.perf_counter() - listed) * 1000
        plan = plans[0]
        state = result.state if result is not None else self._log.state(refresh=False)
        self._observe(state)
        if result is not None:
            self._metrics["shared-commit-total"] += 1
            self._metrics["commit-total"] = self._metrics.get("commit-total", 0) + 1
            self._metrics["commit-race-lost-total"] += result.attempts - 1
        for own in owns:
            name = own.flush.name
            for p in own.flush.parts:
                if (name, p) in plan.offsets:
                    own.outcomes[p] = (plan.offsets[(name, p)], state.partition(p).start_offset)
                elif (name, p) in plan.duplicates:
                    own.outcomes[p] = (
                        plan.duplicates[(name, p)].base_offset,
                        state.partition(p).start_offset,
                    )
            for fname, p, exc in plan.refused:
                if fname == name:
                    own.outcomes[p] = exc
        # A flush is decided once taken by a commit that landed, or found a duplicate (for
        # good: its batch is in the log). A refusal is final where the commit landed (its
        # build saw the newest state) or where a newer state cannot undo it (a newer epoch,
        # an ended transaction); an out-of-order batch on a state that may be behind is tried
        # again next round.
        final = (ProducerFencedError, ConcurrentModificationError)
        refused = {
            name for name, _, exc in plan.refused if result is not None or isinstance(exc, final)
        }
        undecided = {name for name, _, _ in plan.refused} - refused
        decided = [
            f.name
            for f in foreign
            if f not in plan.deferred
            and f.name not in undecided
            and (f.name in plan.taken or f.name in refused or _all_duplicate(plan, f))
        ]
        took = any(f.name in plan.taken for f in foreign)
        if took:
            self._metrics["shared-flush-taken-total"] += sum(
                1 for f in foreign if f.name in plan.taken
            )
        self._forget_decided(decided)
        with self._lock:
            self._in_round.clear()
        # Met another writer: a lost race, or (an object store's look before the PUT) versions
        # written since this writer's state was last its own.
        met = (result is not None and result.attempts > 1) or (
            bool(built_on) and built_on[0] > start
        )
        return took, met

    def _forget_decided(self, names: list[str]) -> None:
        """Remember the outcome of ``names`` is known and delete their files."""
        now = clock.monotonic()
        with self._lock:
            for name in names:
                self._known[name] = now
            if len(self._known) > 4096 or names:
                self._known = {n: t for n, t in self._known.items() if now - t < _KNOWN_S}
        if names:
            self._delete_later([f"{self._dir}/{name}" for name in names])

    def _delete_later(self, paths: list[str]) -> None:
        """Delete ``paths`` on this writer's deleting thread: no flush waits for a DELETE. One
        that fails costs nothing (PROTOCOL.md 30.4 step 7: vacuum deletes what is left)."""
        with self._lock:
            if self._deleter is None:
                self._deleter = threading.Thread(
                    target=self._delete_loop,
                    name=f"kstore-pending-delete-{self._client_id}-{self._log.index}",
                    daemon=True,
                )
                self._deleter.start()
        self._deletes.put(paths)

    def _delete_loop(self) -> None:
        while True:
            paths = self._deletes.get()
            try:
                if paths is None:
                    return
                self._storage.delete(paths)
            except Exception as exc:  # a failed DELETE, or the store closed: vacuum's then
                log.debug("deleting pending flushes %s failed: %s", paths, exc)
            finally:
                self._deletes.task_done()

    def wait_for_deletes(self) -> None:
        """Return once the DELETEs asked for so far are done (or failed)."""
        self._deletes.join()

    def _list_ahead(self, in_round: set[str]) -> None:
        """Start the next round's listing now, leaving out ``in_round`` (the flushes the commit
        being built decides)."""
        with self._lock:
            self._in_round = set(in_round)
            if self._closed or self._next_listing is not None:
                return
            if self._lister is None:
                self._lister = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"kstore-lister-{self._client_id}"
                )
            self._next_listing = self._lister.submit(self._pending_flushes)
            self._next_listing_at = clock.monotonic()

    def _listing(self, use_ahead: bool) -> list[Flush]:
        """The pending flushes for this round: when ``use_ahead`` (the committer's rounds, one
        after another), the listing started during the last commit, if any (less those
        decided since), else a listing now."""
        with self._lock:
            ahead, self._next_listing = self._next_listing, None
            if not use_ahead:
                ahead = None
            if ahead is not None and clock.monotonic() - self._next_listing_at > _AHEAD_MAX_S:
                ahead = None  # started for a round that did not follow: list afresh
            if ahead is None:
                self._in_round.clear()  # no commit is being written: nothing to leave out
        if ahead is None:
            return self._pending_flushes()
        try:
            flushes = ahead.result()
        except Exception as exc:  # listed again now: a failed listing is not a round's
            log.warning("listing pending flushes of %s failed: %s", self._dir, exc)
            return self._pending_flushes()
        with self._lock:
            known = set(self._known)
            self._in_round.clear()
        return [f for f in flushes if f.name not in known]

    def _pending_flushes(self) -> list[Flush]:
        """Every pending flush of another writer whose outcome this writer does not know, read
        and checked, oldest first (by listed time, then name). A file that fails its checks is
        deleted with a warning: its writer commits the flush itself after the takeover time."""
        with self._lock:
            known = set(self._known) | self._in_round

        def wanted(name: str) -> bool:
            parsed = parse_pending_name(name)
            return parsed is not None and parsed[0] != self.writer_id and name not in known

        flushes: list[Flush] = []
        bad: list[str] = []
        for file in read_handed_over(
            self._storage,
            self._dir,
            wanted=wanted,
            max_age_ms=PENDING_MAX_AGE_MS,  # older: vacuum's (PROTOCOL.md 30.8)
            what="pending flushes",
        ):
            where = f"{self._storage.display_url}/{self._dir}/{file.name}"
            try:
                flush = decode_pending(file.data, name=file.name, log=self._log.index, where=where)
                self._check_partitions(flush, where)
            except CorruptLogError as exc:
                log.warning("refusing pending flush: %s", exc)
                bad.append(file.name)
                continue
            flush.listed_ms = file.listed_ms
            flushes.append(flush)
        self._forget_decided(bad)
        flushes.sort(key=lambda f: (f.listed_ms, f.name))
        return flushes

    def _check_partitions(self, flush: Flush, where: str) -> None:
        for p in flush.parts:
            if p >= self._partitions or p % self._commit_logs != self._log.index:
                raise CorruptLogError(
                    f"{where}: partition {p} is not a partition of topic log {self._log.index}"
                )


def carried_parts(
    files: dict[int, SegmentFile],
    producers: dict[int, Any],
    transaction: str | None,
) -> dict[int, Part]:
    """A sender's flush as parts: each partition's carried range and producer batch."""
    return {p: Part(p, files[p], producers[p], transaction) for p in files}


__all__ = [
    "SHARE_METRICS",
    "CommitShare",
    "Outcome",
    "carried_parts",
    "default_takeover_ms",
    "plan_round",
    "resolve",
]
