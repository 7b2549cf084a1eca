"""Layout-2 topics for tests, written file by file as PROTOCOL.md specifies (3.2, 8, 18).

This module exists because kstore no longer writes layout 2: ``Store.create_topic`` refuses
``layout=2``, and every writer (producer, maintenance jobs, DeleteRecords, the Spark sink)
refuses a layout-2 topic and names ``kstore topics upgrade``. The topics that older versions
wrote must still be read and upgraded in place, so the tests of reading, upgrading and
refusing need such topics: this is the one place that writes them.

It writes with kstore's format primitives only: the log's commit encoding (``Log.commit``),
segment files (``kstore.segments.write_segment``), and the partition actions a commit holds
(``Partition.append_build``, ``Partition.marker_build``), never through a product write path.
A topic's metadata log starts as a writer before layout 3 started it (``protocol`` 1/1, 2/2 for
a typed topic; no ``layout`` field: layout 2), and each partition keeps its own log,
``<topic>/<topic id>/<partition>/_log``, with its segments under ``segments/``.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from kstore import config as topic_config
from kstore.layout import partition_dir, producer_log_dir, topic_log_dir
from kstore.log import TYPED_TOPICS_VERSION, Action, CommitResult, Log, protocol_action
from kstore.manifest import AppendResult, PartitionState, ProducerBatch
from kstore.partition import Partition
from kstore.records import TopicPartition
from kstore.segments import TIMESTAMP_TYPE, layout_of, write_segment
from kstore.store import Store, TopicMetadata, TopicState
from kstore.transactions import TransactionLogState, producer_log

BASE_US = 1_700_000_000_000_000


def create_topic(
    store: Store,
    name: str,
    partitions: int = 1,
    config: Mapping[str, Any] | None = None,
    *,
    value_schema: Any = None,
    key_schema: Any = None,
) -> TopicMetadata:
    """A new layout-2 topic: its metadata log's first commit, as a writer of version 1 (2 for
    a typed topic) wrote it. Partition logs start with their first append."""
    now = int(time.time() * 1000)
    metadata: dict[str, Any] = {
        "name": name,
        "id": uuid.uuid4().hex,
        "partitions": partitions,
        "config": topic_config.validate_config(config or {}),
        "createdTime": now,
    }
    version = 1
    if value_schema is not None:
        from kstore.schema import new_schema_entry

        metadata["schemas"] = [new_schema_entry(value_schema, key_schema, 1, now)]
        version = TYPED_TOPICS_VERSION

    def build(state: TopicState) -> list[Action]:
        assert state.metadata is None or state.deleted, f"topic {name!r} exists"
        first = [protocol_action(version)] if state.version < 0 else []
        return [*first, {"metaData": metadata}]

    Log(store.storage, topic_log_dir(name), TopicState).commit(
        Log(store.storage, topic_log_dir(name), TopicState).load(), build, operation="CREATE TOPIC"
    )
    meta = store.topic(name)
    assert meta.layout == 2
    return meta


def records(values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None) -> pa.Table:
    """Binary records with increasing timestamps from BASE_US."""
    n = len(values)
    return pa.table(
        {
            "key": pa.array(list(keys) if keys is not None else [None] * n, pa.binary()),
            "value": pa.array(list(values), pa.binary()),
            "timestamp": pa.array([BASE_US + i for i in range(n)], TIMESTAMP_TYPE),
        }
    )


def partition_log(store: Store, meta: TopicMetadata, partition: int) -> Log[PartitionState]:
    """The partition's own log (layout 2)."""
    return Log(
        store.storage,
        f"{partition_dir(meta.name, meta.topic_id, partition)}/_log",
        PartitionState,
        checkpoint_interval=int(meta.effective_config["checkpoint.interval"]),
    )


def _reader(store: Store, meta: TopicMetadata, partition: int) -> Partition:
    """A partition object for its builds only (it is never asked to commit)."""
    return Partition(
        store.storage,
        meta.name,
        partition,
        partition_dir(meta.name, meta.topic_id, partition),
        layout=layout_of(meta),
    )


def append(
    store: Store,
    topic: str,
    partition: int,
    table: pa.Table,
    *,
    producer: ProducerBatch | None = None,
    transaction: str | None = None,
) -> AppendResult:
    """One segment and one commit that adds it (8.1, 11): ``table`` in the topic's record
    layout, optionally with a producer batch (idempotence, 8.9) and a transaction tag
    (``"<producer id>:<version>"``, 18)."""
    meta = store.topic(topic)
    directory = partition_dir(meta.name, meta.topic_id, partition)
    segment = write_segment(store.storage, directory, table, layout=layout_of(meta))
    outcome: dict[str, Any] = {}
    build = _reader(store, meta, partition).append_build(
        [segment], producer=producer, transaction=transaction, outcome=outcome
    )
    log = partition_log(store, meta, partition)
    result = log.commit(log.load(), build, operation="APPEND")
    assert result is not None, "a duplicate batch: the builder writes new ones only"
    base, last, now = outcome["range"]
    return AppendResult(base, last, result.version, now)


def mark(
    store: Store,
    topic: str,
    partition: int,
    producer_id: str,
    epoch: int,
    version: int,
    *,
    commit: bool,
) -> None:
    """The marker that ends a transaction in one partition (18.2)."""
    meta = store.topic(topic)
    build = _reader(store, meta, partition).marker_build(producer_id, epoch, version, commit=commit)
    log = partition_log(store, meta, partition)
    log.commit(log.load(), build, operation="COMMIT TXN" if commit else "ABORT TXN")


class Transactional:
    """A transactional id's producer log (5.6, 20), and its records in layout-2 partitions, as
    a transactional producer of an older version wrote them. Each instance takes over the id
    with a new epoch."""

    def __init__(self, store: Store, transactional_id: str) -> None:
        self.store = store
        self.transactional_id = transactional_id
        self.log = producer_log(store.storage, producer_log_dir(transactional_id))
        self.producer_id = hashlib.sha256(
            f"kstore-producer:{transactional_id}".encode()
        ).hexdigest()[:32]
        state = self.log.load()
        self.epoch = state.epoch + 1
        self.version = state.last_version + 1
        self._sequences: dict[TopicPartition, int] = {}
        self._partitions: set[TopicPartition] = set()
        self._commit(
            [
                {
                    "producerEpoch": {
                        "transactionalId": transactional_id,
                        "producerId": self.producer_id,
                        "epoch": self.epoch,
                        "transactionTimeoutMs": 60_000,
                    }
                }
            ],
            "INIT PRODUCER",
        )

    def _commit(self, actions: list[Action], operation: str) -> None:
        def build(state: TransactionLogState) -> list[Action]:
            return [protocol_action(), *actions] if state.version < 0 else actions

        self.log.commit(self.log.load(), build, operation=operation)

    def send(self, topic: str, partition: int, table: pa.Table) -> AppendResult:
        """Records of the open transaction: its partition recorded first (20.1), then the
        append, tagged with the transaction."""
        tp = TopicPartition(topic, partition)
        if tp not in self._partitions:
            self._partitions.add(tp)
            self._commit(
                [
                    {
                        "txnPartitions": {
                            "version": self.version,
                            "epoch": self.epoch,
                            "time": int(time.time() * 1000),
                            "partitions": [[topic, partition]],
                        }
                    }
                ],
                "ADD PARTITIONS",
            )
        first = self._sequences.get(tp, 0)
        self._sequences[tp] = first + table.num_rows
        batch = ProducerBatch(self.producer_id, self.epoch, first, first + table.num_rows - 1)
        return append(
            self.store,
            topic,
            partition,
            table,
            producer=batch,
            transaction=f"{self.producer_id}:{self.version}",
        )

    def decide(self, result: str) -> None:
        """The decision (20.2), without its markers: what a producer that died right after
        it left."""
        body = {"version": self.version, "epoch": self.epoch, "result": result}
        self._commit([{"txnDecision": body}], "COMMIT TXN" if result == "commit" else "ABORT TXN")

    def commit(self) -> None:
        """Decision, markers in every partition, completion: a committed transaction."""
        self.decide("commit")
        for tp in sorted(self._partitions):
            mark(
                self.store,
                tp.topic,
                tp.partition,
                self.producer_id,
                self.epoch,
                self.version,
                commit=True,
            )
        body = {"version": self.version, "epoch": self.epoch, "result": "commit"}
        self._commit([{"txnComplete": body}], "COMPLETE TXN")


class Idempotent:
    """An idempotent producer's batches (8.9): one producer id and epoch, sequences counted
    per partition from 0."""

    def __init__(self, store: Store, producer_id: str | None = None, epoch: int = 0) -> None:
        self.store = store
        self.producer_id = producer_id or uuid.uuid4().hex
        self.epoch = epoch
        self._sequences: dict[tuple[str, int], int] = {}

    def send(self, topic: str, partition: int, table: pa.Table) -> AppendResult:
        first = self._sequences.get((topic, partition), 0)
        self._sequences[(topic, partition)] = first + table.num_rows
        batch = ProducerBatch(self.producer_id, self.epoch, first, first + table.num_rows - 1)
        return append(self.store, topic, partition, table, producer=batch)


class WritablePartition(Partition):
    """A partition with a log of its own (layout 2) whose commits go to that log, as versions
    before layout 3 wrote them: for the property tests of a partition log's replay rules
    (tests/test_properties.py), which drive every kind of partition commit."""

    def _commit(
        self, build: Any, *, operation: str, durable: bool, written_at: float | None = None
    ) -> CommitResult[PartitionState] | None:
        result = self.log.commit(
            self.state(),
            build,
            operation=operation,
            durable=durable,
            info={"topic": self.topic, "partition": self.partition},
            written_at=written_at,
        )
        if result is not None:
            self._remember(result.state, confirmed=True)
        return result
