"""The producer: Kafka's client API over the store, batching records into segments.

``send()`` only appends the record to the topic's open batch (a few list appends under a lock)
and returns a future. A background sender drains batches when they reach ``batch_size`` bytes,
when ``linger_ms`` has passed, or on ``flush()``; it converts each batch to Arrow columns at
once, places keyed records with a vectorised partitioner, and writes one commit per topic
log (carrying the records' data, or with one data object). Placing records at drain time rather than in ``send()`` is what makes
``send()`` cheap; the placement is the same, and records of one key keep their order.

Idempotence: every commit carries the producer id, epoch and the batch's sequence range for
that partition. A retry after an error that left the outcome unknown commits the same
sequences again, and the log recognises its own batch instead of writing it twice.

The producer is composed as Kafka's client is: it holds its parts as objects, each built
here and given what it needs. :mod:`kstore.producer_config` (its configuration, validated
once, when it is built), :mod:`kstore.producer_metadata` (what it knows of each topic),
:mod:`kstore.accumulator` (the batches, their futures and the buffer),
:mod:`kstore.transaction_manager` (the producer id, epoch, sequences and Kafka's transaction
calls) and :mod:`kstore.sender` (the sender thread's writes and commits). ``send()`` stays here, on attributes bound once to the
accumulator's lock and open batches: no call per record.
"""

from __future__ import annotations

import os
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from kstore.accumulator import (
    MAX_TIMESTAMP_MS,
    RECORD_OVERHEAD_BYTES,
    Batch,
    FutureBatchMetadata,
    FutureRecordMetadata,
    RecordAccumulator,
    as_bytes,
    check_batch_record_sizes,
    check_headers,
    conform_batch,
    to_table,
)
from kstore.errors import (
    IllegalStateError,
    InvalidRecordError,
    KafkaTimeoutError,
    RecordTooLargeError,
    UnknownTopicOrPartitionError,
)
from kstore.log import wait_for_checkpoints
from kstore.partitioner import NO_PARTITION, get_partitioner
from kstore.producer_config import DEFAULT_CONFIG, producer_config
from kstore.producer_metadata import Backoff, ProducerMetadata
from kstore.records import ConsumerGroupMetadata, OffsetAndMetadata, TopicPartition
from kstore.sender import Sender, default_in_flight
from kstore.store import Store
from kstore.transaction_manager import TransactionManager

_now = time.time


_LIVE_PRODUCERS: weakref.WeakSet[Producer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for producer in list(_LIVE_PRODUCERS):
        producer._accumulator.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Producer:
    """Writes records to a store's topics, with kafka-python's ``KafkaProducer`` API.

    >>> producer = Producer("file:///tmp/ks", acks="all", linger_ms=5)  # doctest: +SKIP
    >>> producer.send("clicks", key=b"user-1", value=b"...").get(timeout=10)  # doctest: +SKIP
    """

    def __init__(self, store: Store | str, **configs: Any) -> None:
        # Validated here, once (kstore.producer_config); send() reads only what is bound below.
        cfg = producer_config(configs)
        self.config = cfg
        acks = cfg["acks"]
        compression = cfg["compression_type"]
        self._key_serializer: Callable[[Any], bytes] | None = cfg["key_serializer"]
        self._value_serializer: Callable[[Any], bytes] | None = cfg["value_serializer"]
        self._serializing = self._key_serializer is not None or self._value_serializer is not None
        partitioner = get_partitioner(cfg["partitioner"])
        self.store = store if isinstance(store, Store) else Store(store, cfg["storage_options"])
        self.store.storage.check_writable()
        if cfg["max_in_flight_partitions"] is None:
            cfg["max_in_flight_partitions"] = default_in_flight(self.store.storage, acks == "all")
        self.client_id = cfg["client_id"] or f"producer-{uuid.uuid4().hex[:8]}"
        backoff = Backoff(cfg["retry_backoff_ms"], cfg["retry_backoff_max_ms"])

        self._metadata = ProducerMetadata(
            self.store,
            max_age_ms=cfg["metadata_max_age_ms"],
            max_block_ms=cfg["max_block_ms"],
            max_request_size=cfg["max_request_size"],
            compression=compression,
            backoff=backoff,
            client_id=self.client_id,
        )
        self._accumulator = RecordAccumulator(
            batch_size=cfg["batch_size"],
            buffer_memory=cfg["buffer_memory"],
            max_block_ms=cfg["max_block_ms"],
        )
        self._transactional = cfg["transactional_id"] is not None
        # A transactional id is taken over here (fencing older instances).
        self._transactions = TransactionManager(
            self.store,
            transactional_id=cfg["transactional_id"],
            idempotent=bool(cfg["enable_idempotence"]),
            transaction_timeout_ms=cfg["transaction_timeout_ms"],
            on_fenced=self._accumulator.fail,
        )
        self._sender = Sender(
            self.store,
            self._accumulator,
            self._transactions,
            self._metadata.topic,
            partitioner=partitioner,
            backoff=backoff,
            max_in_flight=cfg["max_in_flight_partitions"],
            client_id=self.client_id,
            acks=acks,
            linger_ms=cfg["linger_ms"],
            delivery_timeout_ms=cfg["delivery_timeout_ms"],
            retries=cfg["retries"],
            shared_commits=cfg["shared_commits"],
            takeover_ms=cfg["shared_commit_takeover_ms"],
        )
        # send()'s fast path reads these on every record: bound once, never replaced.
        self._lock = self._accumulator.lock
        self._open = self._accumulator.open
        self._grow_or_seal = self._accumulator.grow_or_seal
        self._topics = self._metadata.cached
        self._sender.start()
        _LIVE_PRODUCERS.add(self)

    # -- public API ----------------------------------------------------------------------------

    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> FutureRecordMetadata:
        """Queue one record; returns a future of its :class:`RecordMetadata`."""
        # The common case (bytes, no headers, no explicit partition or timestamp, a known
        # topic, not transactional) in as few operations as possible: this is the hottest
        # path of the library. Everything else takes the general path below.
        if (
            headers is None
            and partition is None
            and timestamp_ms is None
            and value.__class__ is bytes
            and (key is None or key.__class__ is bytes)
        ):
            size = RECORD_OVERHEAD_BYTES + len(value) + (0 if key is None else len(key))
            # acquire/release rather than ``with``: half the cost, on the hottest line.
            lock = self._lock
            lock.acquire()
            try:
                try:
                    batch = self._open.get(topic)
                except TypeError:  # an unhashable topic: _send() names it (no cost otherwise)
                    batch = None
                # An open batch means a known topic, a usable producer, no serializers (its
                # limit is 0 otherwise) and, if transactional, an open transaction: checked
                # when the batch was opened (the general path).
                if batch is not None and size <= batch.limit:
                    index = len(batch.values)
                    batch.add_value(value)  # bound methods: one lookup fewer per column
                    batch.add_key(key)
                    batch.add_timestamp(_now())
                    batch.nbytes += size
                    if batch.nbytes >= batch.mark:
                        self._grow_or_seal(topic, batch)
                    return FutureRecordMetadata((batch, index))
            finally:
                lock.release()
        return self._send(topic, value, key, headers, partition, timestamp_ms)

    def _send(
        self,
        topic: str,
        value: Any,
        key: Any,
        headers: Sequence[tuple[str, bytes]] | None,
        partition: int | None,
        timestamp_ms: int | None,
    ) -> FutureRecordMetadata:
        info = self._topics.get(topic) if topic.__class__ is str else None
        if info is None:
            info = self._metadata.topic(topic)  # checks the name first
        size = RECORD_OVERHEAD_BYTES
        if info.check_value is not None:
            # A typed topic: the value is validated against the schema (serializers are for
            # binary topics); a None value is a tombstone as ever.
            if value is not None:
                value, value_size = info.check_value(value, "")
                size += value_size
        else:
            if self._value_serializer is not None and value is not None:
                value = self._value_serializer(value)
            if value.__class__ is not bytes and value is not None:
                value = as_bytes(value, "value")
            size += len(value) if value is not None else 0
        if info.check_key is not None:
            if key is not None:
                key, key_size = info.check_key(key, "key")
                size += key_size
        else:
            if self._key_serializer is not None and key is not None:
                key = self._key_serializer(key)
            if key.__class__ is not bytes and key is not None:
                key = as_bytes(key, "key")
            size += len(key) if key is not None else 0
        if headers is not None:
            headers = check_headers(headers)
            size += sum(len(k) + len(v) for k, v in headers)
        if timestamp_ms is None:
            timestamp = _now()
        elif timestamp_ms.__class__ is int and 0 <= timestamp_ms <= MAX_TIMESTAMP_MS:
            timestamp = 0.0  # a placeholder: the exact value goes in batch.given_timestamps
        else:
            raise InvalidRecordError(
                f"timestamp_ms must be a non-negative integer of at most {MAX_TIMESTAMP_MS} "
                f"(segments keep int64 microseconds), got {timestamp_ms!r}"
            )
        if partition is None:
            partition = NO_PARTITION
        elif partition.__class__ is not int or not 0 <= partition < info.metadata.partitions:
            raise UnknownTopicOrPartitionError(
                f"topic {topic!r} has partitions 0..{info.metadata.partitions - 1}; got {partition!r}"
            )
        if size > info.record_limit:
            raise RecordTooLargeError(
                f"record of {size} bytes is larger than the limit "
                f"({topic!r} max.message.bytes={info.max_message_bytes}, producer max_request_size="
                f"{self.config['max_request_size']})"
            )
        with self._lock:
            batch = self._open.get(topic)
            if batch is None:
                batch = self._new_batch(topic, size)
                # send()'s fast path takes bytes as they are, so typed topics and serializing
                # producers never use it.
                batch.limit = 0 if info.layout.typed or self._serializing else info.record_limit
            index = len(batch.values)
            batch.values.append(value)
            batch.keys.append(key)
            batch.timestamps.append(timestamp)
            if timestamp_ms is not None:
                batch.given_timestamps[index] = timestamp_ms
            if headers is not None:
                batch.headers[index] = headers
            if partition != NO_PARTITION:
                batch.partitions[index] = partition
            batch.nbytes += size
            if batch.nbytes >= batch.mark:
                self._grow_or_seal(topic, batch)
        return FutureRecordMetadata((batch, index))

    def _new_batch(self, topic: str, size: int) -> Batch:
        """Open a batch for ``topic`` (lock held). Checks that happen once per batch rather
        than once per record live here: usability and transactions."""
        self._accumulator.check_usable()
        if self._transactional and not self._transactions.in_transaction:
            raise IllegalStateError(
                "a transactional producer sends inside a transaction: call begin_transaction() first"
            )
        return self._accumulator.open_batch(topic, size, self._topics.get(topic))

    def send_batch(
        self, topic: str, data: Any, *, partition: int | None = None
    ) -> FutureBatchMetadata:
        """Queue a whole table of records (columns ``value`` and optionally ``key``,
        ``headers``, ``timestamp``, ``partition``); placed with the same partitioner,
        vectorised. Accepts a pyarrow Table / RecordBatch or anything exporting the Arrow C
        stream interface."""
        table = to_table(data)
        info = self._metadata.topic(topic)
        table = conform_batch(table, info, partition)
        size = int(table.nbytes) + RECORD_OVERHEAD_BYTES * table.num_rows
        limit = min(info.max_message_bytes, self.config["max_request_size"])
        check_batch_record_sizes(table, limit, topic)
        batch = Batch(topic, time.monotonic())
        batch.table = table
        batch.nbytes = size
        if info.layout.typed:
            batch.typed = True
            batch.key_type = info.metadata.schema.key_declared  # type: ignore[union-attr]
        self._accumulator.enqueue(batch)
        return FutureBatchMetadata(batch)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued so far and wait until it is delivered (or failed), and
        until the checkpoints its commits made due are written (in the background, 13.1)."""
        waiting = self._accumulator.flush()
        deadline = None if timeout is None else time.monotonic() + timeout
        for batch in waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not batch.done.wait(left):
                raise KafkaTimeoutError(f"flush did not finish within {timeout} s")
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not wait_for_checkpoints(left):
            raise KafkaTimeoutError(f"flush did not finish within {timeout} s")

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued (waiting at most ``timeout``), then stop the sender."""
        accumulator = self._accumulator
        if accumulator.closed:
            return
        try:
            if not accumulator.forked:
                self.flush(timeout)
        finally:
            # Records another thread added after the flush still go out before the sender
            # stops: no future is left hanging.
            accumulator.close()
            if not accumulator.forked:
                self._sender.close(timeout)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def partitions_for(self, topic: str) -> set[int]:
        info = self._metadata.topic(topic, refresh=True)
        return set(range(info.metadata.partitions))

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = dict(self._sender.metrics)
        commits = m["commit-total"] or 1
        m["commit-latency-avg-ms"] = m.pop("commit-time-total-ms") / commits
        m["records-per-commit-avg"] = m["record-send-total"] / commits
        m["buffer-available-bytes"] = self.config["buffer_memory"] - self._accumulator.buffered
        m["producer-epoch"] = self._transactions.epoch
        return m

    @property
    def producer_id(self) -> str:
        return self._transactions.producer_id

    @property
    def epoch(self) -> int:
        return self._transactions.epoch

    # -- transactions (Kafka's API) ------------------------------------------------------------

    def init_transactions(self) -> None:
        """Kafka's call to take over the transactional id. Done when the producer is created
        (fencing older instances and finishing their transaction); kept for API parity."""
        self._transaction_manager()

    def begin_transaction(self) -> None:
        self._transaction_manager().begin()

    def send_offsets_to_transaction(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata | int],
        consumer_group_metadata: ConsumerGroupMetadata | str,
    ) -> None:
        """Commit these consumer offsets atomically with the transaction's records."""
        self._transaction_manager().send_offsets(offsets, consumer_group_metadata)

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Make the transaction's records, and its consumer offsets, visible together."""
        transactions = self._transaction_manager()
        transactions.prepare_commit()
        self.flush(timeout)
        transactions.commit()

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Discard the transaction's records; its offsets are not committed."""
        transactions = self._transaction_manager()
        transactions.prepare_abort()
        # Every append of the transaction must have landed or failed before the markers: an
        # append landing after the abort marker would reopen the transaction there.
        self.flush(timeout)
        transactions.abort()

    def _transaction_manager(self) -> TransactionManager:
        if not self._transactional:
            raise IllegalStateError("transactions need a producer created with transactional_id")
        self._accumulator.check_usable()
        return self._transactions


__all__ = ["DEFAULT_CONFIG", "FutureBatchMetadata", "FutureRecordMetadata", "Producer"]
