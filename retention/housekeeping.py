"""Housekeeping of the logs that are not partition data: transaction timeouts, and pruning of
old versions of group, producer and topic metadata logs. No Spark: both read and write logs
only, and the maintenance service calls them in its own process.

:func:`abort_expired_transactions` enforces ``transaction_timeout_ms`` (PROTOCOL.md 20.6): an
unfinished transaction older than the timeout its producer recorded, by the storage's clock, is
finished as a new instance of its transactional id would finish it (20.4): a new epoch fences
the old instance, then the transaction is aborted, or rolled forward if its commit decision had
landed.

:func:`prune_logs` deletes the commits and checkpoints of group, producer and topic metadata
logs below the newest checkpoint older than the log retention, as vacuum does for partition
logs and topic logs (17.5, 22.5), and writes a checkpoint where a log's old commits have none
after them, so that a later run can delete them.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kstore.config import MIN_ORPHAN_AGE_MS
from kstore.errors import (
    InvalidConfigurationError,
    KStoreError,
    ProducerFencedError,
    UnknownTopicOrPartitionError,
)
from kstore.group_share import REQUEST_MAX_AGE_MS, REQUESTS_DIR, parse_request_name
from kstore.groups import Group
from kstore.layout import GROUPS, PRODUCERS, TOPICS, group_dir
from kstore.log import Action, Log, LogState, parse_log_file_name
from kstore.names import validate_group_id, validate_topic_name
from kstore.storage import FileInfo, Storage
from kstore.store import Store, require_layout3
from kstore.transactions import TransactionLogState, finish_transaction, producer_log

from .vacuum import (
    DEFAULT_LOG_RETENTION_MS,
    LogScan,
    StorageClock,
    VersionTimes,
    _point_hint_at,
    check_ages,
    old_log_files,
)

_PRODUCER_DIR = re.compile(r"[0-9a-f]{40}")  # PROTOCOL.md 4.3, 5.6


def _check_now(now_ms: int | None) -> None:
    if now_ms is not None and (
        not isinstance(now_ms, int) or isinstance(now_ms, bool) or now_ms < 0
    ):
        raise InvalidConfigurationError(f"now_ms must be an integer >= 0, got {now_ms!r}")


def _producer_logs(storage: Storage, listing: list[FileInfo]) -> Iterator[tuple[str, Log[Any]]]:
    for info in sorted(listing, key=lambda i: i.name):
        if _PRODUCER_DIR.fullmatch(info.name):  # anything else is not part of a store (4.3)
            yield info.name, producer_log(storage, f"{PRODUCERS}/{info.name}/_log")


# -- transaction timeouts ----------------------------------------------------------------------


@dataclass
class ExpiredTransaction:
    """One unfinished transaction past its timeout, and what was done with it.

    ``outcome``: ``aborted`` or ``committed`` (finished as recovery finishes it: rolled forward
    when its commit decision had landed), ``would abort`` / ``would commit`` (dry run), or
    ``skipped`` (``reason`` says why: the transaction moved on, or a new instance took over)."""

    transactional_id: str
    version: int
    epoch: int  # the epoch of the instance that left it unfinished
    age_ms: int
    timeout_ms: int
    decided: str | None  # its decision, in the producer log or (commit) the group's, if any
    group: str | None
    partitions: list[tuple[str, int]]
    outcome: str = "skipped"
    reason: str = ""
    fenced_epoch: int | None = None  # the epoch that fenced the old instance


@dataclass
class TransactionReport:
    now_ms: int
    dry_run: bool
    producer_logs: int = 0  # producer logs read
    open: int = 0  # unfinished transactions seen (in the topics asked for)
    expired: list[ExpiredTransaction] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # producer logs that could not be read

    def count(self, outcome: str) -> int:
        return sum(1 for e in self.expired if e.outcome == outcome)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nowMs": self.now_ms,
            "dryRun": self.dry_run,
            "producerLogs": self.producer_logs,
            "open": self.open,
            "expired": [
                {**asdict(e), "partitions": [list(p) for p in e.partitions]} for e in self.expired
            ],
            "errors": self.errors,
        }

    def format(self) -> str:
        """One line."""
        if self.dry_run:
            done = f"{len(self.expired)} expired (dry run: nothing changed)"
        else:
            done = (
                f"{self.count('aborted')} aborted, {self.count('committed')} rolled forward, "
                f"{self.count('skipped')} skipped"
            )
        return (
            f"transaction timeouts: {self.producer_logs} producer log(s), {self.open} open "
            f"transaction(s), {done}" + "".join(f"; {error}" for error in self.errors)
        )


def abort_expired_transactions(
    store: Store,
    topics: Sequence[str] | None = None,
    now_ms: int | None = None,
    *,
    dry_run: bool = False,
) -> TransactionReport:
    """Finish every unfinished transaction open longer than its ``transaction_timeout_ms``
    (with ``topics``, only those that wrote to one of them), exactly as a new producer instance
    with its transactional id would (PROTOCOL.md 20.4, 20.6): one conditional commit of a new
    epoch to the producer log fences the old instance (refused if that log changed the
    transaction meanwhile), then the markers are written, one commit per topic log (a transaction over a layout-2
    topic is reported in ``errors`` and left alone: it is finished once the topic is upgraded).

    The age counts from the storage time of the producer-log commit that recorded the
    transaction's first partition (or group), or, once its producer recorded a decision, of
    that decision. ``now_ms`` fixes the storage's clock (tests); ``dry_run`` reports what is
    expired and changes nothing."""
    _check_now(now_ms)
    wanted = (
        None
        if topics is None
        else {validate_topic_name(t) for t in ([topics] if isinstance(topics, str) else topics)}
    )
    storage = store.storage
    now, listing = StorageClock(storage, PRODUCERS, now_ms, dry_run=dry_run).list()
    report = TransactionReport(now_ms=now, dry_run=dry_run)
    for _, log in _producer_logs(storage, listing):
        try:
            _judge(store, log, now, wanted, report, dry_run=dry_run)
        except KStoreError as exc:  # one bad log does not stop the others
            report.errors.append(f"{log.directory}: {exc}")
    return report


def _judge(
    store: Store,
    log: Log[TransactionLogState],
    now: int,
    wanted: set[str] | None,
    report: TransactionReport,
    *,
    dry_run: bool,
) -> None:
    """Find out whether the producer log's unfinished transaction is expired; finish it if so."""
    storage = store.storage
    state = log.load()
    report.producer_logs += 1
    current = state.current
    if current is None:
        return
    if wanted is not None and not any(tp.topic in wanted for tp in current.partitions):
        return
    report.open += 1
    since = current.decided_in if current.decision is not None else current.started_in
    at = None if since is None else VersionTimes(storage.list_dir(log.directory)).at(since)
    if at is None or now - at <= state.transaction_timeout_ms:
        return  # not expired (or recorded after the clock was read)
    tid = state.transactional_id or ""
    for topic in sorted({tp.topic for tp in current.partitions}):
        # Refused before the fence: its markers could not be written (a deleted topic's are
        # skipped).
        with contextlib.suppress(UnknownTopicOrPartitionError):
            require_layout3(store.topic(topic), f"ending transaction {tid!r}")
    decision = current.decision
    if (
        decision is None
        and current.group is not None
        and Group(store, current.group).state().transactions.get(tid, -1) >= current.version
    ):
        decision = "commit"  # decided in the group log (20.3)
    item = ExpiredTransaction(
        transactional_id=tid,
        version=current.version,
        epoch=state.epoch,
        age_ms=now - at,
        timeout_ms=state.transaction_timeout_ms,
        decided=decision,
        group=current.group,
        partitions=sorted((tp.topic, tp.partition) for tp in current.partitions),
    )
    report.expired.append(item)
    if dry_run:
        item.outcome = "would commit" if decision == "commit" else "would abort"
        item.reason = "dry run"
        return
    _expire(store, log, state, item)


def _expire(
    store: Store, log: Log[TransactionLogState], seen: TransactionLogState, item: ExpiredTransaction
) -> None:
    """Finish ``item`` as 20.6 says: a decided transaction as its own instance (no fence: the
    decision is final, and a live producer finishing it at the same time writes the same
    markers); an undecided one after fencing the instance that left it."""
    assert seen.current is not None
    version, decision, epoch = seen.current.version, item.decided, seen.epoch
    if decision is not None:
        finish_as = epoch
    else:

        def fence(s: TransactionLogState) -> list[Action] | None:
            # Re-run on every conflict: a decision, a completion or a new instance that
            # landed first wins, and no fence is committed.
            c = s.current
            if s.epoch != epoch or c is None or c.version != version or c.decision is not None:
                return None
            return [
                {
                    "producerEpoch": {
                        "transactionalId": s.transactional_id,
                        "producerId": s.producer_id,
                        "epoch": s.epoch + 1,
                        "transactionTimeoutMs": s.transaction_timeout_ms,
                    }
                }
            ]

        result = log.commit(seen, fence, operation="EXPIRE TXN")
        if result is None:
            item.reason = "the transaction changed meanwhile (decided, finished or taken over)"
            return
        finish_as = item.fenced_epoch = result.state.epoch
    try:
        finished = finish_transaction(store, log, finish_as)
    except ProducerFencedError:
        # A new instance took over meanwhile: it finishes the transaction itself.
        item.reason = "a new instance of the transactional id took over"
        return
    if finished is None:
        item.reason = "finished meanwhile"
        return
    item.outcome = "committed" if finished == "commit" else "aborted"
    item.reason = (
        "past transaction_timeout_ms"
        if decision is None
        else "past transaction_timeout_ms after its decision: markers written"
    )


# -- pruning old log versions ------------------------------------------------------------------


@dataclass
class PrunedLog:
    """What pruning did (or, dry run, would do) to one log."""

    kind: str  # "group", "producer" or "topic" (a topic's metadata log)
    name: str  # the group id, the producer directory (5.6) or the topic name
    directory: str
    kept_from: int | None = None  # K: the oldest version kept, when versions were old enough
    files: list[str] = field(default_factory=list)  # deleted (dry run: deletable), from the root
    bytes: int = 0
    checkpoint: int | None = None  # the version checkpointed (dry run: to be checkpointed)
    error: str | None = None  # the log could not be pruned (the others were)


@dataclass
class PruneReport:
    now_ms: int
    keep_ms: int
    dry_run: bool
    logs_scanned: int = 0
    logs: list[PrunedLog] = field(default_factory=list)  # those with something done

    @property
    def files(self) -> list[str]:
        return [f for entry in self.logs for f in entry.files]

    @property
    def bytes(self) -> int:
        return sum(entry.bytes for entry in self.logs)

    @property
    def checkpoints(self) -> int:
        return sum(1 for entry in self.logs if entry.checkpoint is not None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "nowMs": self.now_ms,
            "keepMs": self.keep_ms,
            "dryRun": self.dry_run,
            "logsScanned": self.logs_scanned,
            "filesDeleted": len(self.files),
            "bytesDeleted": self.bytes,
            "checkpointsWritten": self.checkpoints,
            "errors": sum(1 for entry in self.logs if entry.error is not None),
            "logs": [asdict(entry) for entry in self.logs],
        }

    def format(self) -> str:
        """One line."""
        verb = "would delete" if self.dry_run else "deleted"
        written = "would write" if self.dry_run else "wrote"
        return (
            f"log pruning{' (dry run)' if self.dry_run else ''}: {self.logs_scanned} group, "
            f"producer and topic metadata log(s); {verb} {len(self.files)} file(s), "
            f"{self.bytes} bytes; {written} {self.checkpoints} checkpoint(s)"
            + "".join(f"; {e.kind} {e.name}: {e.error}" for e in self.logs if e.error is not None)
        )


def prune_logs(
    store: Store,
    keep_ms: int = DEFAULT_LOG_RETENTION_MS,
    now_ms: int | None = None,
    dry_run: bool = False,
) -> PruneReport:
    """Delete old versions of every group log, producer log and topic metadata log: with K the
    newest checkpoint the storage recorded more than ``keep_ms`` ago (the log retention, at
    least 2 days), every commit and checkpoint below K (PROTOCOL.md 17.5). ``_last_checkpoint``
    is pointed at K first when it names an older one. A log with commits older than
    ``keep_ms`` after its newest checkpoint gets a checkpoint of its newest version, so that a
    later run can delete them (17.6). A log that cannot be pruned is reported with its error. Partition logs and layout 3's topic logs are vacuum's
    (``kstore vacuum``). ``dry_run`` reports the same files and deletes and writes nothing."""
    _check_now(now_ms)
    check_ages(MIN_ORPHAN_AGE_MS, keep_ms)
    storage = store.storage
    # One clock for the run, probed under producers/, where a probe can never be taken for a
    # name (4.3): topics/ and groups/ are listed without one.
    now, producers = StorageClock(storage, PRODUCERS, now_ms, dry_run=dry_run).list()
    report = PruneReport(now_ms=now, keep_ms=keep_ms, dry_run=dry_run)
    logs = itertools.chain(
        (("group", n, log) for n, log in _group_logs(store, storage.list_dir(GROUPS))),
        (("producer", n, log) for n, log in _producer_logs(storage, producers)),
        (("topic", n, log) for n, log in _topic_logs(store, storage.list_dir(TOPICS))),
    )
    for kind, name, log in logs:
        report.logs_scanned += 1
        entry = PrunedLog(kind, name, log.directory)
        try:
            _prune(entry, log, now, keep_ms, dry_run=dry_run)
            if kind == "group":
                _prune_requests(entry, storage, name, now, dry_run=dry_run)
        except KStoreError as exc:  # one bad log does not stop the others
            entry.error = str(exc)
        if entry.files or entry.checkpoint is not None or entry.error is not None:
            report.logs.append(entry)
    return report


def _prune_requests(
    entry: PrunedLog, storage: Storage, group_id: str, now: int, *, dry_run: bool
) -> None:
    """Pending requests (PROTOCOL.md 31.6) a crash left: older than any commit may take."""
    directory = f"{group_dir(group_id)}/{REQUESTS_DIR}"
    doomed = [
        info
        for info in storage.list_dir(directory)
        if (parse_request_name(info.name) is not None or info.name.startswith(".tmp-"))
        and info.mtime_ms is not None
        and now - info.mtime_ms > REQUEST_MAX_AGE_MS
    ]
    files = [f"{directory}/{info.name}" for info in doomed]
    entry.files.extend(files)
    entry.bytes += sum(info.size for info in doomed)
    if files and not dry_run:
        storage.delete(files)


def _group_logs(store: Store, listing: list[FileInfo]) -> Iterator[tuple[str, Log[Any]]]:
    for info in sorted(listing, key=lambda i: i.name):
        try:
            name = validate_group_id(info.name)
        except ValueError:
            continue  # not ours: never follow an unchecked name (4.3)
        yield name, Group(store, name).log


def _topic_logs(store: Store, listing: list[FileInfo]) -> Iterator[tuple[str, Log[Any]]]:
    for info in sorted(listing, key=lambda i: i.name):
        try:
            name = validate_topic_name(info.name)
        except ValueError:
            continue
        yield name, store._topic_log(name)  # the topic metadata log, deleted topics' too


def _prune(entry: PrunedLog, log: Log[Any], now: int, keep_ms: int, *, dry_run: bool) -> None:
    storage = log.storage
    # The log's start, as far as its first commit within keep_ms (PROTOCOL.md 22.5): K, the
    # files below it and the .tmp- files (they sort before every version) are all there.
    scan = LogScan(storage, log.directory)
    scan.scan(now, keep_ms)
    keep_from, old = old_log_files(scan.files, now, keep_ms)
    entry.kept_from = keep_from
    doomed = [
        info
        for info in scan.temporary()  # a local write cut short, long ago
        if info.mtime_ms is not None and now - info.mtime_ms > keep_ms
    ]
    doomed.extend(old)
    entry.files = [f"{log.directory}/{info.name}" for info in doomed]
    entry.bytes = sum(info.size for info in doomed)
    # Commits older than keep_ms after the newest checkpoint stay for good unless a later
    # checkpoint follows them: write one of the newest state, so that a later run, once that
    # checkpoint is older than keep_ms, can delete them. The old commits are in the scan; a
    # checkpoint above them is looked for further on, and only without one is the log's end
    # (its newest commit) listed.
    old_commits = [
        name[0]
        for info in scan.files
        if (name := parse_log_file_name(info.name)) is not None
        and not name[1]
        and info.mtime_ms is not None
        and now - info.mtime_ms > keep_ms
    ]
    if old_commits:
        scan.extend_to_checkpoint_above(max(old_commits))
    parsed = [(p, info) for info in scan.files if (p := parse_log_file_name(info.name)) is not None]
    newest_checkpoint = max((v for (v, is_cp), _ in parsed if is_cp), default=-1)
    newest_commit = max((v for (v, is_cp), _ in parsed if not is_cp), default=-1)
    if any(
        not is_cp
        and newest_checkpoint < v < newest_commit
        and info.mtime_ms is not None
        and now - info.mtime_ms > keep_ms
        for (v, is_cp), info in parsed
    ):
        state: LogState = log.load()
        if state.version > newest_checkpoint:
            entry.checkpoint = state.version
            if not dry_run:
                log.write_checkpoint(state)
    if dry_run or not doomed:
        return
    if keep_from is not None:
        _point_hint_at(storage, log.directory, keep_from)
    storage.delete(entry.files)


__all__ = [
    "ExpiredTransaction",
    "PruneReport",
    "PrunedLog",
    "TransactionReport",
    "abort_expired_transactions",
    "prune_logs",
]
