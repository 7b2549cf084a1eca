"""The transaction manager: the producer's transactional identity (taken over with a new epoch
in the producer log, fencing older instances), Kafka's transaction calls, the partitions a
transaction adds and its end. Kafka's ``TransactionManager``; the producer log it writes and
its recovery are :mod:`kstore.transactions`.

:class:`TransactionManager` holds the producer's transaction methods; it imports neither the
sender nor the producer.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kstore.accumulator import _Batch
from kstore.errors import (
    CommitFailedError,
    IllegalStateError,
    InvalidGroupIdError,
    ProducerFencedError,
)
from kstore.groups import Group, normalized_offsets
from kstore.layout import producer_log_dir
from kstore.log import Action, Log, protocol_action
from kstore.names import validate_group_id
from kstore.records import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition
from kstore.store import Store
from kstore.transactions import (
    TransactionLogState,
    check_epoch,
    end_transaction,
    finish_transaction,
    producer_log,
)

log = logging.getLogger("kstore.producer")


@dataclass
class _Transaction:
    version: int
    partitions: set[TopicPartition] = field(default_factory=set)
    group: ConsumerGroupMetadata | None = None
    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    error: BaseException | None = None
    decided: bool = False
    uncertain: bool = False  # the decision commit failed in a way that may have landed


class TransactionManager:
    """The producer's transaction state machine over the producer log."""

    # State the producer's __init__ sets up and the other parts share.
    config: dict[str, Any]
    store: Store
    _transactional_id: str | None
    _producer_id: str
    _epoch: int
    _txn: _Transaction | None
    _registry: Log[TransactionLogState] | None
    _registry_state: TransactionLogState | None
    _lock: threading.Lock
    _space: threading.Condition
    _open: dict[str, _Batch]
    _usable: bool
    _fatal: BaseException | None

    if TYPE_CHECKING:  # defined by the producer

        def flush(self, timeout: float | None = None) -> None: ...

        def _seal(self, topic: str) -> None: ...

        def _raise_unusable(self) -> None: ...

    # -- transactional identity ------------------------------------------------------------------

    def _register_transactional_id(self, transactional_id: str) -> tuple[str, int]:
        """Take over the identity with a new epoch (fencing older instances), then finish
        whatever transaction a previous instance left unfinished."""
        registry = producer_log(self.store.storage, producer_log_dir(transactional_id))
        pid = hashlib.sha256(f"kstore-producer:{transactional_id}".encode()).hexdigest()[:32]
        timeout = self.config["transaction_timeout_ms"]

        def build(state: TransactionLogState) -> list[Action]:
            actions: list[Action] = [protocol_action()] if state.version < 0 else []
            return [
                *actions,
                {
                    "producerEpoch": {
                        "transactionalId": transactional_id,
                        "producerId": pid,
                        "epoch": state.epoch + 1,
                        "transactionTimeoutMs": timeout,
                    }
                },
            ]

        result = registry.commit(registry.load(), build, operation="INIT PRODUCER")
        assert result is not None
        self._registry = registry
        epoch = result.state.epoch
        finished = finish_transaction(self.store, registry, epoch)
        if finished is not None:
            log.info(
                "transactional id %r: finished the previous instance's transaction (%s)",
                transactional_id,
                finished,
            )
        self._registry_state = registry.load()
        return pid, epoch

    def _registry_commit(
        self, operation: str, actions: Callable[[TransactionLogState], list[Action] | None]
    ) -> None:
        assert self._registry is not None
        assert self._transactional_id is not None
        tid, epoch = self._transactional_id, self._epoch

        def build(state: TransactionLogState) -> list[Action] | None:
            check_epoch(state, epoch, tid)
            return actions(state)

        try:
            result = self._registry.commit(
                self._registry.update(self._registry_state or self._registry.load()),
                build,
                operation=operation,
            )
        except ProducerFencedError as exc:
            self._fence(exc)
            raise
        if result is not None:
            self._registry_state = result.state

    def _check_not_fenced(self) -> None:
        if self._registry is None or self._registry_state is None:
            return
        self._registry_state = self._registry.update(self._registry_state)
        if self._registry_state.epoch != self._epoch:
            exc = ProducerFencedError(
                f"transactional id {self._transactional_id!r}: epoch {self._epoch} was fenced by a "
                f"newer instance (epoch {self._registry_state.epoch})"
            )
            self._fence(exc)
            raise exc

    def _fence(self, exc: ProducerFencedError) -> None:
        self._fatal = exc
        self._usable = False
        with self._lock:
            for topic in list(self._open):  # their records fail; the next send() raises
                self._seal(topic)
            self._space.notify_all()

    # -- transactions (Kafka's API) ----------------------------------------------------------

    def init_transactions(self) -> None:
        """Kafka's call to take over the transactional id. Done when the producer is created
        (fencing older instances and finishing their transaction); kept for API parity."""
        self._require_transactional()

    def begin_transaction(self) -> None:
        self._require_transactional()
        if self._txn is not None:
            raise IllegalStateError("a transaction is already in progress")
        state = self._registry_state
        assert state is not None
        self._txn = _Transaction(version=state.last_version + 1)

    def send_offsets_to_transaction(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata | int],
        consumer_group_metadata: ConsumerGroupMetadata | str,
    ) -> None:
        """Commit these consumer offsets atomically with the transaction's records."""
        txn = self._require_transaction()
        metadata = consumer_group_metadata
        if isinstance(metadata, str):
            metadata = ConsumerGroupMetadata(metadata, -1, None, None)
        if not isinstance(metadata, ConsumerGroupMetadata):
            raise InvalidGroupIdError(
                "consumer_group_metadata must be a group id or a ConsumerGroupMetadata, got "
                f"{type(metadata).__name__}"
            )
        # Everything is checked before the group is recorded in the producer log: a bad group
        # id there would break the recovery of the next instance, and a bad offset would only
        # fail in commit_transaction(), with the transaction's outcome left unknown.
        validate_group_id(metadata.group_id)
        checked = normalized_offsets(offsets)
        if txn.group is not None and txn.group.group_id != metadata.group_id:
            raise IllegalStateError("one transaction can carry the offsets of one consumer group")
        if txn.group is None:
            # Record the group first (Kafka's AddOffsetsToTxn): a successor that finds this
            # transaction unfinished fences the group before deciding its fate.
            version, epoch, group_id = txn.version, self._epoch, metadata.group_id
            self._registry_commit(
                "TXN GROUP",
                lambda s: [
                    {
                        "txnPartitions": {
                            "version": version,
                            "epoch": epoch,
                            "time": int(time.time() * 1000),
                            "group": group_id,
                            "partitions": [],
                        }
                    }
                ],
            )
        txn.group = metadata
        txn.offsets.update(checked)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Make the transaction's records, and its consumer offsets, visible together."""
        txn = self._require_transaction()
        self.flush(timeout)
        if txn.error is not None:
            raise IllegalStateError(
                f"the transaction cannot commit: a record failed ({txn.error}); call abort_transaction()"
            ) from txn.error
        assert self._transactional_id is not None
        tid, epoch, version = self._transactional_id, self._epoch, txn.version
        if not txn.decided:
            if txn.group is not None and txn.offsets:
                self._check_not_fenced()
                try:
                    Group(self.store, txn.group.group_id).commit_offsets(
                        txn.offsets,
                        member_id=txn.group.member_id,
                        generation=txn.group.generation_id,
                        transaction=(tid, version, epoch),
                    )
                except (CommitFailedError, ProducerFencedError):
                    raise  # definitely not decided: abort_transaction() may follow
                except BaseException:
                    # The decision may have landed: only another commit attempt (idempotent
                    # for this version) or a successor instance may resolve it, never an abort.
                    txn.uncertain = True
                    raise
            else:
                self._registry_commit(
                    "TXN DECISION",
                    lambda s: [
                        {"txnDecision": {"version": version, "epoch": epoch, "result": "commit"}}
                    ],
                )
            txn.decided = True
        self._end(txn, commit=True)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Discard the transaction's records; its offsets are not committed."""
        txn = self._require_transaction()
        if txn.decided:
            raise IllegalStateError("the transaction was already decided as committed")
        if txn.uncertain:
            raise IllegalStateError(
                "the outcome of this transaction's commit is unknown: call commit_transaction() "
                "again (it is idempotent), or close this producer and let a new instance with the "
                "same transactional_id resolve it"
            )
        # Every append of the transaction must have landed or failed before the markers: an
        # append landing after the abort marker would reopen the transaction there.
        self.flush(timeout)
        version, epoch = txn.version, self._epoch
        if txn.partitions or txn.group is not None:
            self._registry_commit(
                "TXN DECISION",
                lambda s: [
                    {"txnDecision": {"version": version, "epoch": epoch, "result": "abort"}}
                ],
            )
        self._end(txn, commit=False)

    def _end(self, txn: _Transaction, *, commit: bool) -> None:
        end_transaction(
            self.store, txn.partitions, self._producer_id, self._epoch, txn.version, commit=commit
        )
        version, epoch = txn.version, self._epoch
        if txn.partitions or txn.group is not None:
            self._registry_commit(
                "COMPLETE TXN",
                lambda s: [
                    {
                        "txnComplete": {
                            "version": version,
                            "epoch": epoch,
                            "result": "commit" if commit else "abort",
                        }
                    }
                ],
            )
        else:
            self._registry_commit(
                "COMPLETE TXN",
                lambda s: [
                    {"txnComplete": {"version": version, "epoch": epoch, "result": "empty"}}
                ],
            )
        self._txn = None

    def _require_transactional(self) -> None:
        if self._transactional_id is None:
            raise IllegalStateError("transactions need a producer created with transactional_id")
        if not self._usable:
            self._raise_unusable()

    def _require_transaction(self) -> _Transaction:
        self._require_transactional()
        if self._txn is None:
            raise IllegalStateError("no transaction in progress: call begin_transaction() first")
        return self._txn

    def _register_partitions(self, topic: str, partitions: Iterable[int]) -> str | None:
        """Record the partitions a transaction is about to write (so a successor can finish
        it); returns the transaction tag for their segments, None outside transactions."""
        if self._transactional_id is None:
            return None
        txn = self._txn
        if txn is None:
            raise IllegalStateError("transactional records were sent outside a transaction")
        new = sorted({TopicPartition(topic, int(p)) for p in partitions} - txn.partitions)
        if new:
            version, epoch = txn.version, self._epoch
            self._registry_commit(
                "TXN PARTITIONS",
                lambda s: [
                    {
                        "txnPartitions": {
                            "version": version,
                            "epoch": epoch,
                            "time": int(time.time() * 1000),
                            "group": None,
                            "partitions": [[tp.topic, tp.partition] for tp in new],
                        }
                    }
                ],
            )
            txn.partitions.update(new)
        return f"{self._producer_id}:{txn.version}"
