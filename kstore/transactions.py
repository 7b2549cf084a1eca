"""Transactions: a producer identity's log, and how an unfinished transaction is finished.

A ``transactional_id`` owns a log at ``producers/<sha256>/_log`` (Kafka's transaction
coordinator state, without a coordinator). Each new producer instance commits a new epoch
there, which fences every older instance: their later commits to this log are refused, and
the markers the new instance writes raise the producer's epoch in each partition it touched.

A transaction ``v``:
1. before writing to a partition, the producer records the partition (``txnPartitions``);
   records are written as *open* segments tagged ``<producer id>:<v>``;
2. the decision: with consumer offsets, the group log's offset commit tagged with the
   transaction is the decision (validated against the member's generation and the producer's
   epoch in the same atomic commit); without offsets, a ``txnDecision`` in this log;
3. markers in every recorded partition make the records visible (commit) or remove them
   (abort); then ``txnComplete``.
A new instance finds an unfinished transaction at start-up, fences the group against the old
epoch, and finishes it: rolled forward if the decision landed, aborted otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kstore.errors import ProducerFencedError, TopicDeletedError, UnknownTopicOrPartitionError
from kstore.log import Action, Log, LogState, RetryPolicy
from kstore.records import TopicPartition
from kstore.store import require_layout3

if TYPE_CHECKING:
    from kstore.storage import Storage
    from kstore.store import Store

CHECKPOINT_INTERVAL = 50  # of producer logs (PROTOCOL.md 13.1)


@dataclass
class OpenTransaction:
    version: int
    partitions: set[TopicPartition] = field(default_factory=set)
    group: str | None = None
    decision: str | None = None  # "commit" / "abort" once decided in this log
    started_ms: int = 0
    # The log versions that first recorded the transaction and its decision (a checkpoint's
    # version when replayed from one: a later file, whose storage time only makes the
    # transaction look younger). Their commit files' storage times are when the transaction
    # started and was decided, by the storage's clock (transaction timeouts, PROTOCOL.md 20.6).
    started_in: int | None = None
    decided_in: int | None = None


class TransactionLogState(LogState):
    def __init__(self) -> None:
        super().__init__()
        self.epoch = -1
        self.producer_id: str | None = None
        self.transactional_id: str | None = None
        self.transaction_timeout_ms = 60_000
        self.current: OpenTransaction | None = None  # the newest unfinished transaction
        self.last_version = -1  # newest transaction version ever started

    def copy(self) -> TransactionLogState:
        clone: TransactionLogState = super().copy()  # type: ignore[assignment]
        if self.current is not None:
            clone.current = replace(self.current, partitions=set(self.current.partitions))
        return clone

    def stamp(self, version: int) -> None:
        super().stamp(version)
        current = self.current
        if current is not None:
            if current.started_in is None:
                current.started_in = version
            if current.decision is not None and current.decided_in is None:
                current.decided_in = version

    def apply(self, name: str, body: dict[str, Any]) -> None:
        if name == "producerEpoch":
            self.epoch = int(body["epoch"])
            self.producer_id = str(body["producerId"])
            self.transactional_id = str(body["transactionalId"])
            self.transaction_timeout_ms = int(
                body.get("transactionTimeoutMs", self.transaction_timeout_ms)
            )
        elif name == "txnPartitions":
            version = int(body["version"])
            if self.current is None or self.current.version != version:
                self.current = OpenTransaction(version, started_ms=int(body.get("time", 0)))
            self.current.partitions.update(
                TopicPartition(str(t), int(p)) for t, p in body.get("partitions", [])
            )
            if body.get("group") is not None:
                self.current.group = str(body["group"])
            self.last_version = max(self.last_version, version)
        elif name == "txnDecision":
            if self.current is not None and self.current.version == int(body["version"]):
                self.current.decision = str(body["result"])
        elif name == "txnComplete":
            if self.current is not None and self.current.version == int(body["version"]):
                self.current = None
            self.last_version = max(self.last_version, int(body["version"]))
        else:
            super().apply(name, body)

    def checkpoint_actions(self) -> list[Action]:
        actions = super().checkpoint_actions()
        if self.producer_id is not None:
            actions.append(
                {
                    "producerEpoch": {
                        "transactionalId": self.transactional_id,
                        "producerId": self.producer_id,
                        "epoch": self.epoch,
                        "transactionTimeoutMs": self.transaction_timeout_ms,
                    }
                }
            )
        if self.last_version >= 0:
            actions.append({"txnComplete": {"version": self.last_version, "epoch": self.epoch}})
        if self.current is not None:
            c = self.current
            actions.append(
                {
                    "txnPartitions": {
                        "version": c.version,
                        "epoch": self.epoch,
                        "time": c.started_ms,
                        "group": c.group,
                        "partitions": sorted([tp.topic, tp.partition] for tp in c.partitions),
                    }
                }
            )
            if c.decision is not None:
                actions.append({"txnDecision": {"version": c.version, "result": c.decision}})
        return actions


def producer_log(
    storage: Storage, directory: str, retry: RetryPolicy | None = None
) -> Log[TransactionLogState]:
    """The producer log in ``directory`` (``producers/<h>/_log``, PROTOCOL.md 5.6)."""
    return Log(
        storage,
        directory,
        TransactionLogState,
        checkpoint_interval=CHECKPOINT_INTERVAL,
        retry=retry,
    )


def check_epoch(state: TransactionLogState, epoch: int, transactional_id: str) -> None:
    if state.epoch != epoch:
        raise ProducerFencedError(
            f"transactional id {transactional_id!r}: epoch {epoch} was fenced by a newer instance "
            f"(epoch {state.epoch})"
        )


def end_transaction(
    store: Store,
    partitions: Iterable[TopicPartition],
    producer_id: str,
    epoch: int,
    version: int,
    *,
    commit: bool,
) -> None:
    """Write the markers of transaction ``version`` in every partition it touched (PROTOCOL.md
    18.2). The markers of all the partitions of one topic log land in one commit: atomic across
    them. Partitions of a topic deleted meanwhile are skipped; a layout-2 topic is refused
    (it is upgraded first)."""
    operation = "COMMIT TXN" if commit else "ABORT TXN"
    shared: dict[tuple[str, int], dict[int, Any]] = {}
    for tp in sorted(partitions):
        try:
            meta = store.topic(tp.topic)
            partition = store.partition(tp.topic, tp.partition, meta)
        except UnknownTopicOrPartitionError:  # deleted meanwhile: nothing to mark
            continue
        require_layout3(meta, f"the markers of transaction {producer_id}:{version}")
        assert partition.topic_log is not None
        build = partition.marker_build(producer_id, epoch, version, commit=commit)
        shared.setdefault((tp.topic, partition.topic_log.index), {})[tp.partition] = (
            partition.topic_log,
            build,
        )
    for builds in shared.values():
        topic_log = next(iter(builds.values()))[0]
        with contextlib.suppress(TopicDeletedError):  # sealed by a delete: nothing to mark
            topic_log.commit({p: b for p, (_, b) in builds.items()}, operation=operation)


def finish_transaction(store: Store, log: Log[TransactionLogState], epoch: int) -> str | None:
    """Finish the unfinished transaction of this identity, if any, as epoch ``epoch``.
    Returns "commit" or "abort" for what was done, None when nothing was unfinished."""
    from kstore.groups import Group  # groups import nothing from here; avoid a cycle at load

    state = log.load()
    current = state.current
    if current is None:
        return None
    tid = state.transactional_id or ""
    pid = state.producer_id or ""
    result = current.decision
    if result is None and current.group is not None:
        group = Group(store, current.group)
        group.fence_transaction(tid, epoch)  # no older instance can decide any more
        committed = group.state().transactions.get(tid, -1) >= current.version
        result = "commit" if committed else "abort"
    if result is None:
        result = "abort"
    end_transaction(
        store, current.partitions, pid, epoch, current.version, commit=result == "commit"
    )

    def complete(s: TransactionLogState) -> list[Action] | None:
        check_epoch(s, epoch, tid)
        if s.current is None or s.current.version != current.version:
            return None
        return [{"txnComplete": {"version": current.version, "epoch": epoch, "result": result}}]

    log.commit(log.load(), complete, operation="COMPLETE TXN")
    return result
