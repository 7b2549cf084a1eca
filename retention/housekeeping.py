"""Housekeeping of the logs that are not partition data: transaction timeouts. No Spark: it
reads and writes logs only, and runs in the caller's process.

:func:`abort_expired_transactions` enforces ``transaction_timeout_ms`` (PROTOCOL.md 20.6): an
unfinished transaction older than the timeout its producer recorded, by the storage's clock, is
finished as a new instance of its transactional id would finish it (20.4): a new epoch fences
the old instance, then the transaction is aborted, or rolled forward if its commit decision had
landed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kstore.errors import InvalidConfigurationError, ProducerFencedError
from kstore.groups import Group
from kstore.layout import PRODUCERS
from kstore.log import Action, Log
from kstore.names import validate_topic_name
from kstore.storage import FileInfo, Storage
from kstore.store import Store
from kstore.transactions import TransactionLogState, finish_transaction

from .vacuum import StorageClock, VersionTimes

_PRODUCER_DIR = re.compile(r"[0-9a-f]{40}")  # PROTOCOL.md 4.3, 5.6


def _check_now(now_ms: int | None) -> None:
    if now_ms is not None and (
        not isinstance(now_ms, int) or isinstance(now_ms, bool) or now_ms < 0
    ):
        raise InvalidConfigurationError(f"now_ms must be an integer >= 0, got {now_ms!r}")


def _producer_logs(storage: Storage, listing: list[FileInfo]) -> Iterator[tuple[str, Log[Any]]]:
    for info in sorted(listing, key=lambda i: i.name):
        if _PRODUCER_DIR.fullmatch(info.name):  # anything else is not part of a store (4.3)
            directory = f"{PRODUCERS}/{info.name}/_log"
            yield info.name, Log(storage, directory, TransactionLogState, checkpoint_interval=50)


# -- transaction timeouts ----------------------------------------------------------------------


@dataclass
class ExpiredTransaction:
    """One unfinished transaction past its timeout, and what was done with it.

    ``outcome``: ``aborted`` or ``committed`` (finished as recovery finishes it: rolled forward
    when its commit decision had landed), ``would abort`` / ``would finish`` (dry run), or
    ``skipped`` (``reason`` says why: the transaction moved on, or a new instance took over)."""

    transactional_id: str
    version: int
    epoch: int  # the epoch of the instance that left it unfinished
    age_ms: int
    timeout_ms: int
    decided: str | None  # the decision recorded in the producer log, if any
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
            f"transaction(s), {done}"
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
    transaction meanwhile), then the markers are written, one commit per topic log in layout 3.

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
        state = log.load()
        report.producer_logs += 1
        current = state.current
        if current is None:
            continue
        if wanted is not None and not any(tp.topic in wanted for tp in current.partitions):
            continue
        report.open += 1
        since = current.decided_in if current.decision is not None else current.started_in
        at = None if since is None else VersionTimes(storage.list_dir(log.directory)).at(since)
        if at is None or now - at <= state.transaction_timeout_ms:
            continue  # not expired (or recorded after the clock was read)
        item = ExpiredTransaction(
            transactional_id=state.transactional_id or "",
            version=current.version,
            epoch=state.epoch,
            age_ms=now - at,
            timeout_ms=state.transaction_timeout_ms,
            decided=current.decision,
            group=current.group,
            partitions=sorted((tp.topic, tp.partition) for tp in current.partitions),
        )
        report.expired.append(item)
        if dry_run:
            item.outcome = "would abort" if current.decision != "commit" else "would finish"
            item.reason = "dry run"
            continue
        _expire(store, log, state, item)
    return report


def _expire(
    store: Store, log: Log[TransactionLogState], seen: TransactionLogState, item: ExpiredTransaction
) -> None:
    """Finish ``item`` as 20.6 says: a decided transaction as its own instance (no fence: the
    decision is final, and a live producer finishing it at the same time writes the same
    markers); an undecided one after fencing the instance that left it."""
    assert seen.current is not None
    version, decision, epoch = seen.current.version, seen.current.decision, seen.epoch
    tid = seen.transactional_id or ""
    group = seen.current.group
    # Decided in the group log: finished as its own instance would, like a producer-log one.
    if (
        decision is None
        and group is not None
        and Group(store, group).state().transactions.get(tid, -1) >= version
    ):
        decision = "commit"
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


__all__ = [
    "ExpiredTransaction",
    "TransactionReport",
    "abort_expired_transactions",
]
