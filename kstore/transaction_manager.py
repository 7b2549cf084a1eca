"""The transaction manager (Kafka's ``TransactionManager``): the producer's identity (its
producer id and epoch, taken over for a transactional id with a new epoch in the producer log,
fencing older instances), the sequences that make its writes idempotent, Kafka's transaction
calls, the partitions a transaction adds and its end. The producer log it writes and its
recovery are :mod:`kstore.transactions`.

It imports neither the sender nor the producer: the sender asks it for each write's producer
batches and tells it of each failure; the producer forwards Kafka's transaction calls, and
flushes between a commit's or an abort's checks and the decision.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from kstore.errors import (
    CommitFailedError,
    IllegalStateError,
    InvalidGroupIdError,
    ProducerFencedError,
)
from kstore.groups import Group, normalized_offsets
from kstore.layout import producer_log_dir
from kstore.log import Action, Log, protocol_action
from kstore.manifest import ProducerBatch
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
    """A producer's identity, its sequences and its transactions over the producer log.

    ``transactional_id``: taken over here, in the constructor (INIT PRODUCER: a new epoch
    that fences older instances; then their unfinished transaction is finished). Without
    one the producer id is random and the epoch starts at 0. ``idempotent``: writes carry
    the producer id, epoch and sequences (always, with a transactional id). ``on_fenced``:
    called with the error once a newer instance is found to have taken over (the producer
    fails its batches and takes no more records)."""

    def __init__(
        self,
        store: Store,
        *,
        transactional_id: str | None = None,
        idempotent: bool = True,
        transaction_timeout_ms: int = 60_000,
        on_fenced: Callable[[ProducerFencedError], None] = lambda exc: None,
    ) -> None:
        self.store = store
        self.transactional_id = transactional_id
        self.idempotent = idempotent or transactional_id is not None
        self._on_fenced = on_fenced
        self._registry: Log[TransactionLogState] | None = None
        self._registry_state: TransactionLogState | None = None
        self._txn: _Transaction | None = None
        # The next sequence of each partition, with the epoch it belongs to (a write that
        # started before an epoch bump must not carry its sequence into the new epoch).
        self._sequences: dict[tuple[str, int], tuple[int, int]] = {}
        self._sequence_lock = threading.Lock()
        if transactional_id is not None:
            self._producer_id, self._epoch = self._register_transactional_id(
                transactional_id, transaction_timeout_ms
            )
        else:
            self._producer_id, self._epoch = uuid.uuid4().hex, 0

    @property
    def producer_id(self) -> str:
        return self._producer_id

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def in_transaction(self) -> bool:
        """Whether a transaction is open (begun, not yet ended)."""
        return self._txn is not None

    # -- sequences (idempotence) -----------------------------------------------------------------

    def producer_batches(self, topic: str, counts: Mapping[int, int]) -> dict[int, ProducerBatch]:
        """The producer batch of each partition's next write of ``counts[p]`` records: the
        producer id, the epoch and the sequences that follow the last write that landed in
        this epoch. Empty for a producer that is not idempotent."""
        if not self.idempotent:
            return {}
        batches: dict[int, ProducerBatch] = {}
        with self._sequence_lock:
            epoch = self._epoch
            for p, count in counts.items():
                stored_epoch, first = self._sequences.get((topic, p), (epoch, 0))
                if stored_epoch != epoch:
                    first = 0  # a new epoch restarts sequences
                batches[p] = ProducerBatch(self._producer_id, epoch, first, first + count - 1)
        return batches

    def landed(self, topic: str, p: int, batch: ProducerBatch) -> None:
        """``batch`` landed in ``topic``-``p``: the partition's next write follows it (unless
        the epoch moved on since the write started)."""
        with self._sequence_lock:
            if batch.epoch == self._epoch:
                self._sequences[(topic, p)] = (batch.epoch, batch.last_sequence + 1)

    def on_write_failure(self, exc: BaseException) -> None:
        """A write failed (before the same partition's next write starts: it must see the new
        epoch). Any failure counts, not only the library's own: the write may have landed,
        and a later batch must never reuse its sequence numbers (it would be taken for this
        one's retry). An open transaction can then only abort."""
        txn = self._txn
        if txn is not None and txn.error is None:
            txn.error = exc
        if isinstance(exc, ProducerFencedError):
            self._on_fenced(exc)
        elif self.idempotent and self.transactional_id is None:
            # The failed batch may or may not have landed; a new epoch restarts sequences so
            # later batches are not refused as out of order (Kafka's epoch bump, KIP-360).
            with self._sequence_lock:
                self._epoch += 1
                self._sequences.clear()

    # -- transactional identity ------------------------------------------------------------------

    def _register_transactional_id(self, transactional_id: str, timeout: int) -> tuple[str, int]:
        """Take over the identity with a new epoch (fencing older instances), then finish
        whatever transaction a previous instance left unfinished."""
        registry = producer_log(self.store.storage, producer_log_dir(transactional_id))
        pid = hashlib.sha256(f"kstore-producer:{transactional_id}".encode()).hexdigest()[:32]

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
        assert self.transactional_id is not None
        tid, epoch = self.transactional_id, self._epoch

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
            self._on_fenced(exc)
            raise
        if result is not None:
            self._registry_state = result.state

    def check_not_fenced(self) -> None:
        """Raise ProducerFencedError if a newer instance took the transactional id over
        (a read of the producer log's newer versions; nothing to do without one)."""
        if self._registry is None or self._registry_state is None:
            return
        self._registry_state = self._registry.update(self._registry_state)
        if self._registry_state.epoch != self._epoch:
            exc = ProducerFencedError(
                f"transactional id {self.transactional_id!r}: epoch {self._epoch} was fenced by a "
                f"newer instance (epoch {self._registry_state.epoch})"
            )
            self._on_fenced(exc)
            raise exc

    # -- transactions (Kafka's calls; the producer checks that it is transactional and usable)

    def begin(self) -> None:
        if self._txn is not None:
            raise IllegalStateError("a transaction is already in progress")
        state = self._registry_state
        assert state is not None
        self._txn = _Transaction(version=state.last_version + 1)

    def send_offsets(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata | int],
        consumer_group_metadata: ConsumerGroupMetadata | str,
    ) -> None:
        """Commit these consumer offsets atomically with the transaction's records."""
        txn = self._current()
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

    def prepare_commit(self) -> None:
        """The checks before a commit's flush: a transaction is open."""
        self._current()

    def commit(self) -> None:
        """Make the transaction's records, and its consumer offsets, visible together
        (once its records are delivered: after the producer's flush)."""
        txn = self._current()
        if txn.error is not None:
            raise IllegalStateError(
                f"the transaction cannot commit: a record failed ({txn.error}); call abort_transaction()"
            ) from txn.error
        assert self.transactional_id is not None
        tid, epoch, version = self.transactional_id, self._epoch, txn.version
        if not txn.decided:
            if txn.group is not None and txn.offsets:
                self.check_not_fenced()
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

    def prepare_abort(self) -> None:
        """The checks before an abort's flush: a transaction is open and not decided."""
        txn = self._current()
        if txn.decided:
            raise IllegalStateError("the transaction was already decided as committed")
        if txn.uncertain:
            raise IllegalStateError(
                "the outcome of this transaction's commit is unknown: call commit_transaction() "
                "again (it is idempotent), or close this producer and let a new instance with the "
                "same transactional_id resolve it"
            )

    def abort(self) -> None:
        """Discard the transaction's records; its offsets are not committed. Every append of
        the transaction must have landed or failed before (the producer's flush): an append
        landing after the abort marker would reopen the transaction there."""
        self.prepare_abort()
        txn = self._current()
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

    def _current(self) -> _Transaction:
        if self._txn is None:
            raise IllegalStateError("no transaction in progress: call begin_transaction() first")
        return self._txn

    def add_partitions(self, topic: str, partitions: Iterable[int]) -> str | None:
        """Record the partitions a transaction is about to write (so a successor can finish
        it); returns the transaction tag for their segments, None outside transactions."""
        if self.transactional_id is None:
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
