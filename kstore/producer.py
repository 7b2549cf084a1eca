"""The producer: Kafka's client API over the store, batching records into segments.

``send()`` only appends the record to the topic's open batch (a few list appends under a lock)
and returns a future. A background sender drains batches when they reach ``batch_size`` bytes,
when ``linger_ms`` has passed, or on ``flush()``; it converts each batch to Arrow columns at
once, places keyed records with a vectorised partitioner, and writes one segment and one
commit per partition. Placing records at drain time rather than in ``send()`` is what makes
``send()`` cheap; the placement is the same, and records of one key keep their order.

Idempotence: every commit carries the producer id, epoch and the batch's sequence range for
that partition. A retry after an error that left the outcome unknown commits the same
sequences again, and the log recognises its own batch instead of writing it twice.

The parts are split as in Kafka's client: :mod:`kstore.accumulator` (batches, futures, the
conversion to Arrow), :mod:`kstore.sender` (the sender thread's writes and commits) and
:mod:`kstore.transaction_manager` (the transactional id and Kafka's transaction calls).
:class:`Producer` is the facade; ``send()`` stays here, on the instance's own attributes.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from kstore.accumulator import (
    MAX_TIMESTAMP_MS,
    RECORD_OVERHEAD_BYTES,
    RESERVE_CHUNK_BYTES,
    FutureBatchMetadata,
    FutureRecordMetadata,
    _as_bytes,
    _Batch,
    _check_batch_record_sizes,
    _check_headers,
    _conform_batch,
    _to_table,
    _TopicInfo,
)
from kstore.config import MAX_UNCOMMITTED_MS, MIN_ORPHAN_AGE_MS
from kstore.errors import (
    IllegalStateError,
    InvalidConfigurationError,
    InvalidRecordError,
    KafkaTimeoutError,
    RecordTooLargeError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from kstore.log import Log, wait_for_checkpoints
from kstore.names import validate_topic_name
from kstore.partitioner import NO_PARTITION, StickyPartitioner, get_partitioner
from kstore.schema import validator
from kstore.segments import layout_of
from kstore.sender import Sender, _in_flight_default
from kstore.store import Store, TopicMetadata
from kstore.transaction_manager import TransactionManager, _Transaction
from kstore.transactions import TransactionLogState

log = logging.getLogger(__name__)
_now = time.time


DEFAULT_CONFIG: dict[str, Any] = {
    "acks": 1,
    "linger_ms": 5,
    "batch_size": 16 * 1024 * 1024,  # bytes per topic batch before it is sent without lingering
    "buffer_memory": 64 * 1024 * 1024,
    "max_block_ms": 60_000,
    "max_request_size": 1_048_576,
    "compression_type": None,  # None: the topic's compression.type
    "retries": 2_147_483_647,
    "retry_backoff_ms": 100,
    "retry_backoff_max_ms": 1_000,
    "delivery_timeout_ms": 120_000,
    "enable_idempotence": True,
    "transactional_id": None,
    "transaction_timeout_ms": 60_000,
    "partitioner": "murmur2",
    "key_serializer": None,
    "value_serializer": None,
    "client_id": None,
    "metadata_max_age_ms": 300_000,
    "max_in_flight_partitions": None,  # partitions written at once; None: see _in_flight_default
    "storage_options": None,
}

_LIVE_PRODUCERS: weakref.WeakSet[Producer] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for producer in list(_LIVE_PRODUCERS):
        producer._forked = True
        producer._usable = False
        producer._open = {}  # the next send() opens a batch, which raises


os.register_at_fork(after_in_child=_after_fork_in_child)


class Producer(Sender, TransactionManager):
    """Writes records to a store's topics, with kafka-python's ``KafkaProducer`` API.

    >>> producer = Producer("file:///tmp/ks", acks="all", linger_ms=5)  # doctest: +SKIP
    >>> producer.send("clicks", key=b"user-1", value=b"...").get(timeout=10)  # doctest: +SKIP
    """

    def __init__(self, store: Store | str, **configs: Any) -> None:
        unknown = sorted(set(configs) - set(DEFAULT_CONFIG))
        if unknown:
            raise InvalidConfigurationError(
                f"unknown producer config {unknown[0]!r}; known: {', '.join(sorted(DEFAULT_CONFIG))}"
            )
        cfg = {**DEFAULT_CONFIG, **configs}
        if cfg["transactional_id"] is not None:
            # As in Kafka: transactions need durable appends, or a machine crash could lose
            # an append of a transaction whose (durable) decision says it committed.
            if "acks" in configs and _parse_acks(configs["acks"]) != "all":
                raise InvalidConfigurationError("a transactional producer needs acks='all'")
            cfg["acks"] = "all"
        self.config = cfg
        self._acks = _parse_acks(cfg["acks"])
        self._durable = self._acks == "all"
        for name in (
            "linger_ms",
            "batch_size",
            "buffer_memory",
            "max_block_ms",
            "max_request_size",
            "retries",
            "retry_backoff_ms",
            "retry_backoff_max_ms",
            "delivery_timeout_ms",
            "metadata_max_age_ms",
            "max_in_flight_partitions",
        ):
            value = cfg[name]
            if value is None and name == "max_in_flight_partitions":
                continue  # chosen for the store below
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidConfigurationError(
                    f"producer config {name!r} must be a non-negative integer, got {value!r}"
                )
        if cfg["delivery_timeout_ms"] > MAX_UNCOMMITTED_MS:
            # PROTOCOL.md 23.1: no writer holds a written segment longer than this.
            raise InvalidConfigurationError(
                f"producer config 'delivery_timeout_ms' {cfg['delivery_timeout_ms']} exceeds "
                f"{MAX_UNCOMMITTED_MS}, the longest a written segment may wait for its commit "
                f"(half the minimum orphan age, {MIN_ORPHAN_AGE_MS} ms, after which vacuum may "
                "delete it)"
            )
        timeout = cfg["transaction_timeout_ms"]
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 1:
            # Checked here, before the value is recorded in the producer log (INIT PRODUCER).
            raise InvalidConfigurationError(
                f"producer config 'transaction_timeout_ms' must be a positive integer, got {timeout!r}"
            )
        if (
            cfg["max_in_flight_partitions"] == 0
            or cfg["batch_size"] < 1
            or cfg["buffer_memory"] < 1
        ):
            raise InvalidConfigurationError(
                "batch_size, buffer_memory and max_in_flight_partitions must be positive"
            )
        compression = cfg["compression_type"]
        if compression is not None:
            compression = {
                "none": "uncompressed",
                "uncompressed": "uncompressed",
                "zstd": "zstd",
                "lz4": "lz4",
            }.get(str(compression).lower())
            if compression is None:
                raise InvalidConfigurationError(
                    f"compression_type {cfg['compression_type']!r} is not supported; use zstd, lz4 "
                    "or none (segments are Arrow IPC, whose codecs are zstd and lz4)"
                )
        self._compression: str | None = compression
        for name in ("key_serializer", "value_serializer"):
            if cfg[name] is not None and not callable(cfg[name]):
                raise InvalidConfigurationError(f"producer config {name!r} must be callable")
        self._key_serializer: Callable[[Any], bytes] | None = cfg["key_serializer"]
        self._value_serializer: Callable[[Any], bytes] | None = cfg["value_serializer"]
        self._serializing = self._key_serializer is not None or self._value_serializer is not None
        self._partitioner = get_partitioner(cfg["partitioner"])
        self._sticky = StickyPartitioner()
        self.store = store if isinstance(store, Store) else Store(store, cfg["storage_options"])
        self.store.storage.check_writable()
        if cfg["max_in_flight_partitions"] is None:
            cfg["max_in_flight_partitions"] = _in_flight_default(self.store.storage, self._durable)
        self.client_id = cfg["client_id"] or f"producer-{uuid.uuid4().hex[:8]}"

        self._idempotent = bool(cfg["enable_idempotence"]) or cfg["transactional_id"] is not None
        self._transactional_id: str | None = cfg["transactional_id"]
        self._registry: Log[TransactionLogState] | None = None
        self._registry_state: TransactionLogState | None = None
        self._txn: _Transaction | None = None
        if self._transactional_id is not None:
            self._producer_id, self._epoch = self._register_transactional_id(self._transactional_id)
        else:
            self._producer_id, self._epoch = uuid.uuid4().hex, 0
        # The next sequence of each partition, with the epoch it belongs to (a write that
        # started before an epoch bump must not carry its sequence into the new epoch).
        self._sequences: dict[tuple[str, int], tuple[int, int]] = {}
        self._sequence_lock = threading.Lock()
        self._last_write: dict[tuple[str, int], concurrent.futures.Future[tuple[int, int]]] = {}
        self._shared_writes = {}

        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._space = threading.Condition(self._lock)
        self._open: dict[str, _Batch] = {}
        self._queue: list[_Batch] = []
        self._in_flight: list[_Batch] = []
        self._buffered = 0
        self._flush_requested = False
        self._closed = False
        self._forked = False
        self._fatal: BaseException | None = None
        self._usable = True  # False once closed, forked or fatally failed; read by every send()
        self._topics: dict[str, _TopicInfo] = {}
        self._batch_size: int = cfg["batch_size"]
        self._buffer_memory: int = cfg["buffer_memory"]
        self._metrics = {
            "record-send-total": 0,
            "record-error-total": 0,
            "record-retry-total": 0,
            "batch-total": 0,
            "commit-total": 0,
            "commit-time-total-ms": 0.0,
            "byte-total": 0,
        }
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=cfg["max_in_flight_partitions"],
            thread_name_prefix=f"kstore-{self.client_id}",
        )
        self._sender = threading.Thread(
            target=self._run, name=f"kstore-sender-{self.client_id}", daemon=True
        )
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
            info = self._topic_info(topic)  # checks the name first
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
                value = _as_bytes(value, "value")
            size += len(value) if value is not None else 0
        if info.check_key is not None:
            if key is not None:
                key, key_size = info.check_key(key, "key")
                size += key_size
        else:
            if self._key_serializer is not None and key is not None:
                key = self._key_serializer(key)
            if key.__class__ is not bytes and key is not None:
                key = _as_bytes(key, "key")
            size += len(key) if key is not None else 0
        if headers is not None:
            headers = _check_headers(headers)
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

    def _new_batch(self, topic: str, size: int) -> _Batch:
        """Open a batch for ``topic`` (lock held). Checks that happen once per batch rather
        than once per record live here: usability and transactions. Buffer space is reserved
        a chunk at a time (as Kafka's buffer pool hands out buffers), so send() pays for
        buffer accounting once per chunk, not once per record."""
        if not self._usable:
            self._raise_unusable()
        if self._transactional_id is not None and self._txn is None:
            raise IllegalStateError(
                "a transactional producer sends inside a transaction: call begin_transaction() first"
            )
        batch = _Batch(topic, time.monotonic())
        info = self._topics.get(topic)
        if info is not None and info.layout.typed:
            batch.typed = True
            batch.key_type = info.metadata.schema.key_declared  # type: ignore[union-attr]
        self._reserve(batch, size)
        self._open[topic] = batch
        self._wakeup.notify()
        return batch

    def _reserve(self, batch: _Batch, needed: int) -> None:
        """Reserve another chunk of buffer_memory for ``batch`` (lock held; may block)."""
        chunk = max(needed, min(RESERVE_CHUNK_BYTES, self._batch_size, self._buffer_memory))
        if self._buffered + chunk > self._buffer_memory:
            self._wait_for_space(chunk)
        batch.reserved += chunk
        self._buffered += chunk
        batch.mark = min(batch.reserved, self._batch_size)

    def _grow_or_seal(self, topic: str, batch: _Batch) -> None:
        """The batch reached its reservation: reserve more if it is not full and the buffer
        has room now, else send it (never block here: this batch is open, and waiting for
        space hands open batches to the sender)."""
        chunk = max(batch.nbytes - batch.reserved, min(RESERVE_CHUNK_BYTES, self._batch_size))
        if batch.nbytes >= self._batch_size or self._buffered + chunk > self._buffer_memory:
            self._seal(topic)
        else:
            self._reserve(batch, chunk)

    def _seal(self, topic: str) -> None:
        """Hand a full batch to the sender (lock held)."""
        batch = self._open.pop(topic)
        self._queue.append(batch)
        self._wakeup.notify()

    def send_batch(
        self, topic: str, data: Any, *, partition: int | None = None
    ) -> FutureBatchMetadata:
        """Queue a whole table of records (columns ``value`` and optionally ``key``,
        ``headers``, ``timestamp``, ``partition``); placed with the same partitioner,
        vectorised. Accepts a pyarrow Table / RecordBatch or anything exporting the Arrow C
        stream interface."""
        table = _to_table(data)
        info = self._topic_info(topic)
        table = _conform_batch(table, info, partition)
        size = int(table.nbytes) + RECORD_OVERHEAD_BYTES * table.num_rows
        limit = min(info.max_message_bytes, self.config["max_request_size"])
        _check_batch_record_sizes(table, limit, topic)
        batch = _Batch(topic, time.monotonic())
        batch.table = table
        batch.nbytes = size
        if info.layout.typed:
            batch.typed = True
            batch.key_type = info.metadata.schema.key_declared  # type: ignore[union-attr]
        with self._lock:
            if not self._usable:
                self._raise_unusable()
            if self._buffered + size > self._buffer_memory and self._buffered > 0:
                self._wait_for_space(size)
            # Keep send order: records sent earlier to this topic go first.
            earlier = self._open.pop(topic, None)
            if earlier is not None:
                self._queue.append(earlier)
            self._queue.append(batch)
            batch.reserved = size
            self._buffered += size
            self._wakeup.notify()
        return FutureBatchMetadata(batch)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued so far and wait until it is delivered (or failed), and
        until the checkpoints its commits made due are written (in the background, 13.1)."""
        with self._lock:
            self._queue.extend(self._open.values())
            self._open.clear()
            waiting = [*self._in_flight, *self._queue]
            self._flush_requested = True
            self._wakeup.notify()
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
        if self._closed:
            return
        try:
            if not self._forked:
                self.flush(timeout)
        finally:
            with self._lock:
                self._closed = True
                self._usable = False
                # Records another thread added after the flush still go out before the
                # sender stops: no future is left hanging.
                for topic in list(self._open):
                    self._seal(topic)
                self._wakeup.notify()
            if not self._forked:
                self._sender.join(timeout)
                self._pool.shutdown(wait=True)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def partitions_for(self, topic: str) -> set[int]:
        info = self._topic_info(topic, refresh=True)
        return set(range(info.metadata.partitions))

    def metrics(self) -> dict[str, float]:
        m: dict[str, float] = dict(self._metrics)
        commits = m["commit-total"] or 1
        m["commit-latency-avg-ms"] = m.pop("commit-time-total-ms") / commits
        m["records-per-commit-avg"] = m["record-send-total"] / commits
        m["buffer-available-bytes"] = self.config["buffer_memory"] - self._buffered
        m["producer-epoch"] = self._epoch
        return m

    @property
    def producer_id(self) -> str:
        return self._producer_id

    @property
    def epoch(self) -> int:
        return self._epoch

    # -- internals -----------------------------------------------------------------------------

    def _raise_unusable(self) -> None:
        if self._forked:
            raise IllegalStateError(
                "this producer was created before os.fork(); create a new one in the child"
            )
        if self._fatal is not None:
            raise self._fatal
        raise IllegalStateError("producer is closed")

    def _wait_for_space(self, size: int) -> None:
        """Block (lock held, released while waiting) until ``size`` bytes fit; backpressure."""
        deadline = time.monotonic() + self.config["max_block_ms"] / 1000
        self._queue.extend(self._open.values())  # make room by sending what we have now
        self._open.clear()
        self._wakeup.notify()
        while self._buffered > 0 and self._buffered + size > self.config["buffer_memory"]:
            left = deadline - time.monotonic()
            if left <= 0:
                raise KafkaTimeoutError(
                    f"buffer_memory ({self.config['buffer_memory']} bytes) stayed full for "
                    f"max_block_ms={self.config['max_block_ms']}"
                )
            self._space.wait(left)
            if not self._usable:
                self._raise_unusable()

    def _topic_info(self, topic: str, *, refresh: bool = False) -> _TopicInfo:
        try:
            info = self._topics.get(topic)
        except TypeError:  # unhashable, so not a name: raises InvalidTopicError naming it
            validate_topic_name(topic)
            raise
        max_age = self.config["metadata_max_age_ms"] / 1000
        if info is not None and not refresh and time.monotonic() - info.loaded < max_age:
            return info
        validate_topic_name(topic)
        if info is None:
            meta = self._read_topic(topic)
        else:
            try:
                meta = self.store.topic(topic)
            except StorageError as exc:
                # Kafka keeps producing with the metadata it has while a refresh fails: so
                # does this producer (a batch's own retries and delivery timeout still apply).
                log.warning(
                    "producer %s: metadata of %r not refreshed (%s); using the cached copy",
                    self.client_id,
                    topic,
                    exc,
                )
                return info
        effective = meta.effective_config
        topic_compression = effective["compression.type"]
        compression = self._compression or (
            "uncompressed" if topic_compression == "producer" else topic_compression
        )
        info = _TopicInfo(
            metadata=meta,
            loaded=time.monotonic(),
            max_message_bytes=int(effective["max.message.bytes"]),
            record_limit=min(int(effective["max.message.bytes"]), self.config["max_request_size"]),
            compression=compression,
            log_append_time=effective["message.timestamp.type"] == "LogAppendTime",
            layout=layout_of(meta),
        )
        schema = meta.schema
        if schema is not None:
            info.check_value = validator(schema.value, schema.value_nulls)
            if schema.key is not None:
                info.check_key = validator(schema.key)
        self._topics[topic] = info
        return info

    def _read_topic(self, topic: str) -> TopicMetadata:
        """The topic's metadata, retrying transient storage errors with backoff for at most
        ``max_block_ms`` (as Kafka's metadata fetch blocks); then the last error."""
        deadline = time.monotonic() + self.config["max_block_ms"] / 1000
        attempt = 0
        while True:
            try:
                return self.store.topic(topic)
            except StorageError as exc:
                attempt += 1
                backoff = self._backoff_s(attempt)
                if time.monotonic() + backoff >= deadline:
                    raise
                log.warning(
                    "producer %s: reading the metadata of %r failed (%s); retrying",
                    self.client_id,
                    topic,
                    exc,
                )
                time.sleep(backoff)


# -- helpers ---------------------------------------------------------------------------------------


def _parse_acks(value: Any) -> int | str:
    if value in (0, "0"):
        return 0
    if value in (1, "1"):
        return 1
    if value in ("all", -1, "-1"):
        return "all"
    raise InvalidConfigurationError(f"acks must be 0, 1 or 'all', got {value!r}")


__all__ = ["DEFAULT_CONFIG", "FutureBatchMetadata", "FutureRecordMetadata", "Producer"]
