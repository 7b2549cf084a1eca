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
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import os
import threading
import time
import uuid
import weakref
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kstore.config import MAX_UNCOMMITTED_MS, MIN_ORPHAN_AGE_MS
from kstore.errors import (
    CommitFailedError,
    IllegalStateError,
    InvalidConfigurationError,
    InvalidGroupIdError,
    InvalidRecordError,
    KafkaTimeoutError,
    KStoreError,
    ProducerFencedError,
    RecordTooLargeError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from kstore.groups import Group, normalized_offsets
from kstore.layout import producer_log_dir
from kstore.log import Action, Log, protocol_action
from kstore.names import validate_group_id, validate_topic_name
from kstore.partition import ProducerBatch
from kstore.partitioner import NO_PARTITION, StickyPartitioner, get_partitioner
from kstore.records import ConsumerGroupMetadata, OffsetAndMetadata, RecordMetadata, TopicPartition
from kstore.schema import (
    Validator,
    cast_column,
    conform_values,
    key_bytes,
    record_sizes,
    validator,
)
from kstore.segments import (
    BINARY,
    HEADERS_TYPE,
    TIMESTAMP_TYPE,
    Layout,
    SegmentFile,
    binary_array,
    fixed_array,
    headers_array,
    layout_of,
    numpy_values,
)
from kstore.storage import Storage
from kstore.store import Store, TopicMetadata
from kstore.transactions import TransactionLogState, check_epoch, finish_transaction

log = logging.getLogger(__name__)
_now = time.time

RESERVE_CHUNK_BYTES = 1024 * 1024  # buffer_memory is reserved this much at a time
RECORD_OVERHEAD_BYTES = 70  # Kafka's per-record batch overhead, for size accounting
# The latest record timestamp, in ms since the epoch: Kafka's timestamps are int64 ms, and a
# segment stores them as int64 microseconds, which ends here (in the year 294247).
MAX_TIMESTAMP_MS = ((1 << 63) - 1) // 1000

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


class FutureRecordMetadata(tuple[Any, ...]):
    """The future of one record: ``get()`` returns its :class:`RecordMetadata`.

    A tuple (batch, index) so that creating one costs no Python-level ``__init__``: ``send()``
    makes one per record and is on the hottest path of the library.
    """

    __slots__ = ()

    def get(self, timeout: float | None = None) -> RecordMetadata:
        batch: _Batch = self[0]
        if not batch.done.wait(timeout):
            raise KafkaTimeoutError(f"record not delivered within {timeout} s")
        return batch.metadata(self[1])

    def is_done(self) -> bool:
        return bool(self[0].done.is_set())

    def succeeded(self) -> bool:
        return self.is_done() and self[0].error_for(self[1]) is None

    def failed(self) -> bool:
        return self.is_done() and self[0].error_for(self[1]) is not None

    @property
    def exception(self) -> BaseException | None:
        error: BaseException | None = self[0].error_for(self[1]) if self.is_done() else None
        return error

    @property
    def value(self) -> RecordMetadata | None:
        metadata: RecordMetadata | None = self[0].metadata(self[1]) if self.succeeded() else None
        return metadata

    def add_callback(
        self, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> FutureRecordMetadata:
        """Call ``fn(*args, metadata, **kwargs)`` when the record is committed."""
        self[0].add_callback(self[1], fn, args, kwargs, errback=False)
        return self

    def add_errback(
        self, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> FutureRecordMetadata:
        """Call ``fn(*args, exception, **kwargs)`` when the record cannot be delivered."""
        self[0].add_callback(self[1], fn, args, kwargs, errback=True)
        return self

    def __repr__(self) -> str:
        return f"FutureRecordMetadata({self[0].topic!r}, done={self.is_done()})"


class FutureBatchMetadata:
    """The future of a ``send_batch()``: ``get()`` returns a table of (partition, offset)
    aligned with the input rows."""

    def __init__(self, batch: _Batch) -> None:
        self._batch = batch

    def get(self, timeout: float | None = None) -> pa.Table:
        if not self._batch.done.wait(timeout):
            raise KafkaTimeoutError(f"batch not delivered within {timeout} s")
        errors = self._batch.errors
        if errors:
            raise next(iter(errors.values()))
        return pa.table(
            {
                "partition": pa.array(self._batch.partition_of, pa.int32()),
                "offset": pa.array(self._batch.offset_of, pa.int64()),
            }
        )

    def is_done(self) -> bool:
        return self._batch.done.is_set()


class _Batch:
    """Records accumulated for one topic, then (once drained) their outcome."""

    def __init__(self, topic: str, created: float) -> None:
        self.topic = topic
        self.created = created
        # Column lists, appended by send(); headers and explicit partitions are rare, so they
        # are kept sparsely by record index.
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        # Seconds since the epoch, as C doubles: the sender reads them without touching one
        # Python object per record (it shares the GIL with send()).
        self.timestamps = array("d")
        self.headers: dict[int, list[tuple[str, bytes]]] = {}
        # Timestamps given to send() (ms), kept exact: as float seconds, one late in the range
        # would lose its last digits or overflow the conversion to microseconds.
        self.given_timestamps: dict[int, int] = {}
        self.add_key = self.keys.append
        self.add_value = self.values.append
        self.add_timestamp = self.timestamps.append
        self.partitions: dict[int, int] = {}
        self.nbytes = 0
        self.reserved = 0  # bytes of buffer_memory held by this batch until it completes
        self.mark = 0  # nbytes at which send() must reserve more or seal the batch
        self.limit = 0  # the largest record send()'s fast path may add (0: take the general path)
        self.table: pa.Table | None = None  # set instead of the lists by send_batch()
        self.explicit_partition: int | None = None
        self.key_type: str | None = None  # a typed topic's key type, hashed as Kafka would
        self.typed = False
        self.done = threading.Event()
        self.partition_of: np.ndarray[Any, Any] = np.zeros(0, np.int32)
        self.offset_of: np.ndarray[Any, Any] = np.zeros(0, np.int64)
        self.timestamp_of: Sequence[int] = ()
        self.log_start: dict[int, int] = {}
        self.errors: dict[int, BaseException] = {}  # partition -> why its records failed
        self.fatal: BaseException | None = None  # failed before placement
        self.acks0 = False
        self._callbacks: list[
            tuple[int, Callable[..., Any], tuple[Any, ...], dict[str, Any], bool]
        ] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self.table.num_rows if self.table is not None else len(self.values)

    def error_for(self, index: int) -> BaseException | None:
        if self.fatal is not None:
            return self.fatal
        if not self.errors:
            return None
        return self.errors.get(int(self.partition_of[index]))

    def metadata(self, index: int) -> RecordMetadata:
        error = self.error_for(index)
        if error is not None:
            raise error
        partition = int(self.partition_of[index])
        if self.table is not None or self.typed:
            key_size = value_size = -1
        else:
            key, value = self.keys[index], self.values[index]
            key_size = -1 if key is None else len(key)
            value_size = -1 if value is None else len(value)
        return RecordMetadata(
            topic=self.topic,
            partition=partition,
            topic_partition=TopicPartition(self.topic, partition),
            offset=-1 if self.acks0 else int(self.offset_of[index]),
            timestamp=int(self.timestamp_of[index]),
            log_start_offset=self.log_start.get(partition, -1),
            checksum=None,
            serialized_key_size=key_size,
            serialized_value_size=value_size,
            serialized_header_size=-1,
        )

    def add_callback(
        self,
        index: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        errback: bool,
    ) -> None:
        with self._lock:
            if not self.done.is_set():
                self._callbacks.append((index, fn, args, kwargs, errback))
                return
        self._fire(index, fn, args, kwargs, errback)

    def complete(self) -> None:
        with self._lock:
            self.done.set()
            callbacks, self._callbacks = self._callbacks, []
        for index, fn, args, kwargs, errback in callbacks:
            self._fire(index, fn, args, kwargs, errback)

    def _fire(
        self,
        index: int,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        errback: bool,
    ) -> None:
        error = self.error_for(index)
        try:
            if error is None and not errback:
                fn(*args, self.metadata(index), **kwargs)
            elif error is not None and errback:
                fn(*args, error, **kwargs)
        except Exception:
            log.exception("producer callback raised")


@dataclass
class _TopicInfo:
    metadata: TopicMetadata
    loaded: float
    max_message_bytes: int
    record_limit: int  # the smaller of max.message.bytes and max_request_size
    compression: str
    log_append_time: bool
    layout: Layout = BINARY
    # Typed topics: checks and normalizes a value (a dict, dataclass, pydantic model), and a key.
    check_value: Validator | None = None
    check_key: Validator | None = None


class Producer:
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
        """Send everything queued so far and wait until it is delivered (or failed)."""
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

    def _backoff_s(self, attempt: int) -> float:
        """Exponential backoff before retry ``attempt``, capped at retry_backoff_max_ms."""
        cap, base = self.config["retry_backoff_max_ms"], self.config["retry_backoff_ms"]
        return float(min(cap, base * 2 ** min(attempt, 10))) / 1000

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

    def _run(self) -> None:
        """The sender: drains batches into deliveries, one group at a time. A delivery's
        partition writes run on the pool while the sender converts the next group (the two
        overlap: conversion holds the GIL, writes mostly do not); it is finished (offsets
        given out, futures completed, buffer released) once the next one has started, or
        as soon as its writes are done when nothing else is queued."""
        linger = self.config["linger_ms"] / 1000
        pending: _Delivery | None = None
        while True:
            with self._lock:
                while True:
                    now = time.monotonic()
                    for topic, batch in list(self._open.items()):
                        if self._flush_requested or now - batch.created >= linger:
                            self._queue.append(self._open.pop(topic))
                    self._flush_requested = False
                    if self._queue:
                        work, self._queue = self._queue, []
                        self._in_flight.extend(work)
                        break
                    if pending is not None and pending.written():
                        work = []
                        break
                    if self._closed and pending is None:
                        return
                    wait = None
                    if self._open:
                        oldest = min(b.created for b in self._open.values())
                        wait = max(0.0, oldest + linger - now)
                    self._wakeup.wait(wait)  # new work, lingering over, or pending written
            for group in self._groups(work):
                started = self._start(group)
                if pending is not None:
                    self._finish(pending)
                pending = started
            if not work and pending is not None:
                self._finish(pending)
                pending = None

    def _groups(self, work: list[_Batch]) -> Iterator[list[_Batch]]:
        """Queued batches in delivery groups: consecutive batches of ``send()`` to one topic
        go together (up to four batch sizes, and a quarter of buffer_memory so that the next
        group fills while this one is written), one segment and one commit per partition
        for all of them. A sender that fell behind catches up: the cost of a delivery is
        mostly per commit, not per record."""
        limit = min(4 * self._batch_size, self._buffer_memory // 4)
        group: list[_Batch] = []
        size = 0
        for batch in work:
            if group and (
                batch.table is not None
                or group[0].table is not None
                or batch.topic != group[0].topic
                or size + batch.nbytes > limit
            ):
                yield group
                group, size = [], 0
            group.append(batch)
            size += batch.nbytes
        if group:
            yield group

    def _start(self, group: list[_Batch]) -> _Delivery:
        """Convert and place a group's records and submit its partition writes. Never raises:
        a group that fails here is finished with the error."""
        delivery = _Delivery(group, group[0])
        try:
            info = self._topic_info(delivery.batch.topic)
            if len(group) > 1:
                delivery.batch = _merge(group, info.layout)
            self._submit(delivery, info)
        except BaseException as exc:  # never leave a future hanging
            delivery.error = exc
        return delivery

    def _submit(self, delivery: _Delivery, info: _TopicInfo) -> None:
        batch = delivery.batch
        n_parts = info.metadata.partitions
        table = batch.table if batch.table is not None else _build_table(batch, info.layout)
        if info.log_append_time:
            now_us = int(time.time() * 1_000_000)
            table = table.set_column(
                table.schema.get_field_index("timestamp"),
                "timestamp",
                fixed_array(np.full(table.num_rows, now_us, np.int64), TIMESTAMP_TYPE),
            )
        stamps: Any = numpy_values(table.column("timestamp").cast(pa.int64()), np.int64)
        batch.timestamp_of = stamps // 1000
        parts = self._place(batch, table, n_parts)
        batch.partition_of = parts
        if self._acks == 0:
            batch.acks0 = True
        delivery.order = np.argsort(_sort_key(parts, n_parts), kind="stable")
        counts = np.bincount(parts, minlength=n_parts)
        start = 0
        for nonzero in np.nonzero(counts)[0]:
            p = int(nonzero)
            count = int(counts[p])
            delivery.jobs[p] = (start, count)
            start += count
        pieces = _by_partition(table, parts, n_parts)
        deadline = batch.created + self.config["delivery_timeout_ms"] / 1000
        tag = self._register_partitions(batch.topic, delivery.jobs)
        for p in delivery.jobs:
            # A partition's writes are chained: each waits for the one before (of an earlier
            # delivery), so commits, sequences and epochs stay in send order.
            key = (batch.topic, p)
            write = self._pool.submit(
                self._chained_write, self._last_write.get(key), info, p, pieces[p], deadline, tag
            )
            self._last_write[key] = write
            delivery.writes[p] = write
        for write in delivery.writes.values():
            write.add_done_callback(self._on_written)

    def _on_written(self, _: concurrent.futures.Future[tuple[int, int]]) -> None:
        with self._lock:
            self._wakeup.notify()  # the sender may be waiting to finish a delivery

    def _chained_write(
        self,
        previous: concurrent.futures.Future[tuple[int, int]] | None,
        info: _TopicInfo,
        p: int,
        table: pa.Table,
        deadline: float,
        transaction: str | None,
    ) -> tuple[int, int]:
        if previous is not None:
            concurrent.futures.wait([previous])  # its outcome is its own delivery's
        try:
            return self._write_partition(info, p, table, deadline, transaction)
        except Exception as exc:
            # Before the partition's next write starts: it must see the new epoch. Any failure
            # counts, not only the library's own: the write may have landed, and a later batch
            # must never reuse its sequence numbers (it would be taken for this one's retry).
            self._on_partition_failure(exc)
            raise

    def _finish(self, delivery: _Delivery) -> None:
        """Wait for a delivery's writes, give every record its outcome, release its buffer."""
        group, batch = delivery.group, delivery.batch
        try:
            if delivery.error is not None:
                concurrent.futures.wait(delivery.writes.values())  # any it submitted end first
                raise delivery.error
            self._assign_offsets(delivery)
        except BaseException as exc:  # never leave a future hanging
            log.exception("producer %s: batch for %r failed", self.client_id, batch.topic)
            batch.fatal = exc
            for each in group:
                each.fatal = exc
                self._metrics["record-error-total"] += len(each)
        finally:
            if batch is not group[0]:
                _share_outcome(batch, group)
            for each in group:
                each.complete()
            with self._lock:
                for each in group:
                    self._buffered -= each.reserved
                    self._in_flight.remove(each)
                self._space.notify_all()

    def _assign_offsets(self, delivery: _Delivery) -> None:
        batch, jobs, order = delivery.batch, delivery.jobs, delivery.order
        bases = np.zeros(len(jobs), np.int64)
        for j, (p, write) in enumerate(delivery.writes.items()):
            try:
                bases[j], batch.log_start[p] = write.result()
            except KStoreError as exc:
                batch.errors[p] = exc
                self._metrics["record-error-total"] += jobs[p][1]
        # Each partition's records (contiguous in sorted order) get consecutive offsets from
        # its base: a handful of numpy calls per delivery, not a few per partition.
        starts = np.fromiter((s for s, _ in jobs.values()), np.int64, len(jobs))
        sizes = np.fromiter((c for _, c in jobs.values()), np.int64, len(jobs))
        offsets_sorted = np.arange(len(order), dtype=np.int64) + np.repeat(bases - starts, sizes)
        for p in batch.errors:
            s, c = jobs[p]
            offsets_sorted[s : s + c] = -1
        offset_of = np.empty(len(order), np.int64)
        offset_of[order] = offsets_sorted
        batch.offset_of = offset_of
        self._metrics["batch-total"] += 1
        self._metrics["record-send-total"] += len(order)
        self._metrics["byte-total"] += batch.nbytes

    def _place(self, batch: _Batch, table: pa.Table, n_parts: int) -> np.ndarray[Any, Any]:
        if batch.explicit_partition is not None:
            return np.full(table.num_rows, batch.explicit_partition, np.int32)
        explicit = None
        if batch.table is not None and "partition" in batch.table.column_names:
            explicit = batch.table.column("partition").to_numpy(zero_copy_only=False)
        elif batch.partitions:  # explicit partitions of send() (also of merged batches)
            explicit = np.full(len(batch), NO_PARTITION, np.int32)
            explicit[list(batch.partitions)] = list(batch.partitions.values())
        keys = table.column("key")
        if batch.key_type is not None:
            keys = key_bytes(keys, batch.key_type)  # hashed as Kafka's serializer writes them
        placed = self._partitioner.partition_batch(keys, n_parts)
        if isinstance(placed, pa.Array) and placed.type == pa.int32() and not placed.null_count:
            parts = numpy_values(placed, np.int32).copy()  # np.array(placed) imports pandas
        else:
            parts = np.array(placed, np.int32)
        if explicit is not None:
            parts = np.where(explicit != NO_PARTITION, explicit, parts).astype(np.int32)
        unkeyed = parts == NO_PARTITION
        if unkeyed.any():
            sticky = self._sticky.partition(n_parts)
            parts[unkeyed] = sticky
            self._sticky.on_new_batch(n_parts, sticky)
        if parts.size and (parts.min() < 0 or parts.max() >= n_parts):
            raise UnknownTopicOrPartitionError(
                f"topic {batch.topic!r} has {n_parts} partitions; a record names partition {int(parts.max())}"
            )
        return parts

    def _write_partition(
        self,
        info: _TopicInfo,
        p: int,
        table: pa.Table,
        deadline: float,
        transaction: str | None = None,
    ) -> tuple[int, int]:
        topic = info.metadata.name
        partition = self.store.partition(topic, p, info.metadata)
        producer: ProducerBatch | None = None
        if self._idempotent:
            with self._sequence_lock:
                epoch = self._epoch
                stored_epoch, first = self._sequences.get((topic, p), (epoch, 0))
            if stored_epoch != epoch:
                first = 0  # a new epoch restarts sequences
            producer = ProducerBatch(self._producer_id, epoch, first, first + table.num_rows - 1)
        segment: SegmentFile | None = None
        retry = partition.log.retry
        written_at = 0.0
        attempt = 0
        while True:
            try:
                if segment is not None and retry.too_old(written_at):
                    # Vacuum may take a file this old for an orphan (a pause since the write,
                    # or long retries): never commit it; write the records again. The old file
                    # is left to vacuum (an unknown outcome may have committed it).
                    log.warning(
                        "producer %s: %s-%d segment too old to commit; writing it again",
                        self.client_id,
                        topic,
                        p,
                    )
                    segment = None
                if segment is None:
                    written_at = retry.clock()  # from the start: a pause mid-write counts
                    segment = partition.write_segment(
                        table, compression=info.compression, durable=self._durable
                    )
                self._check_not_fenced()
                started = time.monotonic()
                result = partition.commit_segments(
                    [segment],
                    durable=self._durable,
                    producer=producer,
                    transaction=transaction,
                    written_at=written_at,
                )
                self._metrics["commit-total"] += 1
                self._metrics["commit-time-total-ms"] += (time.monotonic() - started) * 1000
                if producer is not None:
                    with self._sequence_lock:
                        if producer.epoch == self._epoch:
                            self._sequences[(topic, p)] = (
                                producer.epoch,
                                producer.last_sequence + 1,
                            )
                return result.base_offset, partition.state(refresh=False).start_offset
            except KStoreError as exc:
                if (
                    not exc.retriable
                    or attempt >= self.config["retries"]
                    or time.monotonic() >= deadline
                ):
                    raise
                attempt += 1
                self._metrics["record-retry-total"] += table.num_rows
                backoff = self._backoff_s(attempt)
                log.warning(
                    "producer %s: %s-%d attempt %d failed (%s); retrying",
                    self.client_id,
                    topic,
                    p,
                    attempt,
                    exc,
                )
                time.sleep(min(backoff, max(0.0, deadline - time.monotonic())))

    def _on_partition_failure(self, exc: BaseException) -> None:
        if self._txn is not None and self._txn.error is None:
            self._txn.error = exc
        if isinstance(exc, ProducerFencedError):
            self._fence(exc)
        elif self._idempotent and self._transactional_id is None:
            # The failed batch may or may not have landed; a new epoch restarts sequences so
            # later batches are not refused as out of order (Kafka's epoch bump, KIP-360).
            with self._sequence_lock:
                self._epoch += 1
                self._sequences.clear()

    # -- transactional identity ------------------------------------------------------------------

    def _register_transactional_id(self, transactional_id: str) -> tuple[str, int]:
        """Take over the identity with a new epoch (fencing older instances), then finish
        whatever transaction a previous instance left unfinished."""
        registry = Log(
            self.store.storage,
            producer_log_dir(transactional_id),
            TransactionLogState,
            checkpoint_interval=50,
        )
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
        for tp in sorted(txn.partitions):
            self.store.partition(tp.topic, tp.partition).end_transaction(
                self._producer_id, self._epoch, txn.version, commit=commit
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


@dataclass(eq=False)
class _Delivery:
    """A group of batches on its way: its records placed, its partition writes submitted."""

    group: list[_Batch]
    batch: _Batch  # the group's only batch, or all of them merged
    error: BaseException | None = None  # failed before its writes were submitted
    order: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros(0, np.int64))
    jobs: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition -> (start, count)
    writes: dict[int, concurrent.futures.Future[tuple[int, int]]] = field(default_factory=dict)

    def written(self) -> bool:
        return all(write.done() for write in self.writes.values())


@dataclass
class _Transaction:
    version: int
    partitions: set[TopicPartition] = field(default_factory=set)
    group: ConsumerGroupMetadata | None = None
    offsets: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    error: BaseException | None = None
    decided: bool = False
    uncertain: bool = False  # the decision commit failed in a way that may have landed


# -- helpers ---------------------------------------------------------------------------------------


def _in_flight_default(storage: Storage, durable: bool) -> int:
    """Partitions written at once when max_in_flight_partitions is not set. A write that waits
    (on the network of an object store, or on fsync for acks="all") overlaps with others: eight.
    Otherwise, on local disk or in memory, a write is CPU work, much of it under the GIL, and
    more writers than cores only queue for both: on two cores, two writers send 7-9% more
    records per second than eight at acks=1, and 7% fewer at acks="all"."""
    if durable or storage.is_remote:
        return 8
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    return min(8, cores)


def _parse_acks(value: Any) -> int | str:
    if value in (0, "0"):
        return 0
    if value in (1, "1"):
        return 1
    if value in ("all", -1, "-1"):
        return "all"
    raise InvalidConfigurationError(f"acks must be 0, 1 or 'all', got {value!r}")


def _as_bytes(value: Any, field: str) -> bytes:
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise InvalidRecordError(
        f"record {field} must be bytes (or None), got {type(value).__name__}; "
        f"set {field}_serializer to convert {type(value).__name__} values"
    )


def _check_headers(headers: Iterable[Any]) -> list[tuple[str, bytes]]:
    if isinstance(headers, str | bytes | dict):
        raise InvalidRecordError("headers must be a list of (str, bytes) tuples")
    out = []
    for i, item in enumerate(headers):
        if not isinstance(item, tuple | list) or len(item) != 2:
            raise InvalidRecordError(f"headers[{i}] must be a (str, bytes) pair, got {item!r}")
        name, value = item
        if not isinstance(name, str):
            raise InvalidRecordError(f"headers[{i}] name must be str, got {type(name).__name__}")
        if value is not None and not isinstance(value, bytes | bytearray):
            raise InvalidRecordError(
                f"headers[{i}] ({name!r}) value must be bytes, got {type(value).__name__}"
            )
        out.append((name, bytes(value) if value is not None else b""))
    return out


def _merge(group: list[_Batch], layout: Layout) -> _Batch:
    """One batch with the records of ``group`` (batches of send() to one topic, in send order),
    as a table: each batch is converted on its own and the tables joined, which copies no
    Python object reference (concatenating the lists would touch every record again)."""
    first = group[0]
    merged = _Batch(first.topic, first.created)
    merged.typed, merged.key_type = first.typed, first.key_type
    merged.table = pa.concat_tables([_build_table(batch, layout) for batch in group])
    start = 0
    for batch in group:
        for index, partition in batch.partitions.items():
            merged.partitions[start + index] = partition
        merged.nbytes += batch.nbytes
        start += len(batch)
    return merged


def _share_outcome(merged: _Batch, group: list[_Batch]) -> None:
    """Give each batch of a merged delivery its slice of the outcome."""
    start = 0
    for batch in group:
        end = start + len(batch)
        batch.fatal, batch.errors, batch.acks0 = merged.fatal, merged.errors, merged.acks0
        batch.log_start = merged.log_start
        batch.partition_of = merged.partition_of[start:end]
        batch.offset_of = merged.offset_of[start:end]
        batch.timestamp_of = merged.timestamp_of[start:end]
        start = end


def _build_table(batch: _Batch, layout: Layout) -> pa.Table:
    n = len(batch.values)
    try:
        # Binary columns from their buffers: pa.array would import pandas on the first
        # delivery (0.3 s). Typed topics' columns need pyarrow's converter.
        binary = (pa.binary(), pa.large_binary())
        keys = (
            binary_array(batch.keys, layout.key)
            if layout.key in binary
            else pa.array(batch.keys, layout.key)
        )
        values = (
            binary_array(batch.values, layout.value)
            if layout.value in binary
            else pa.array(batch.values, layout.value)
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        # Values were validated when sent; this means the topic's schema changed under them.
        raise InvalidRecordError(f"records do not match the topic's schema: {exc}") from None
    # Seconds to microseconds in Arrow's kernels: a quarter of the time numpy's temporaries
    # take, and this runs on the sender thread, which shares the GIL with send().
    seconds = fixed_array(np.frombuffer(batch.timestamps, np.float64), pa.float64())
    million = fixed_array(np.array([1e6]), pa.float64())[0]  # pa.scalar imports pandas too
    micros = pc.cast(pc.round(pc.multiply(seconds, million)), pa.int64())
    if batch.given_timestamps:
        given = batch.given_timestamps
        exact = numpy_values(micros, np.int64).copy()
        exact[np.fromiter(given.keys(), np.int64, len(given))] = (
            np.fromiter(given.values(), np.int64, len(given)) * 1000
        )
        micros = fixed_array(exact, pa.int64())
    timestamps = micros.cast(TIMESTAMP_TYPE)
    headers = headers_array(batch.headers, n) if batch.headers else pa.nulls(n, HEADERS_TYPE)
    return pa.Table.from_arrays([keys, values, timestamps, headers], schema=layout.record_schema)


def _sort_key(parts: np.ndarray[Any, Any], n_parts: int) -> np.ndarray[Any, Any]:
    """``parts`` in the narrowest integer type: numpy's stable sort is a radix sort for 8- and
    16-bit integers, ten times faster than its merge sort of 32-bit ones."""
    if n_parts <= 128:
        return parts.astype(np.int8)
    if n_parts <= 32768:
        return parts.astype(np.int16)
    return parts


MAX_CHUNKS_REORDERED_APART = 64


def _by_partition(
    table: pa.Table, parts: np.ndarray[Any, Any], n_parts: int
) -> dict[int, pa.Table]:
    """Each partition's records of ``table``, in table order. A table of a few chunks (a
    merged delivery has one per batch) is reordered a chunk at a time, so its chunks are never
    concatenated first (a copy of every record): a partition's table then has a chunk, and
    its segment a record batch, per chunk that has records for it."""
    chunks = table.to_batches()
    if not 1 < len(chunks) <= MAX_CHUNKS_REORDERED_APART:
        chunks = [table.combine_chunks().to_batches()[0]] if table.num_rows else []
    pieces: dict[int, list[pa.RecordBatch]] = {}
    start = 0
    for chunk in chunks:
        rows = parts[start : start + chunk.num_rows]
        start += chunk.num_rows
        order = np.argsort(_sort_key(rows, n_parts), kind="stable")
        indices = fixed_array(order.astype(np.int64, copy=False), pa.int64())
        ordered = chunk.take(indices) if len(order) > 1 else chunk
        counts = np.bincount(rows, minlength=n_parts)
        offset = 0
        for p in np.nonzero(counts)[0].tolist():
            count = int(counts[p])
            pieces.setdefault(p, []).append(ordered.slice(offset, count))
            offset += count
    return {p: pa.Table.from_batches(b, schema=table.schema) for p, b in pieces.items()}


def _to_table(data: Any) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if hasattr(data, "__arrow_c_stream__"):
        return pa.table(data)
    raise InvalidRecordError(
        f"send_batch needs a pyarrow Table/RecordBatch or an Arrow C stream, got {type(data).__name__}"
    )


RECORD_COLUMNS = ("key", "headers", "timestamp", "partition")
_TIMESTAMP_TOO_LATE = (
    "send_batch: column 'timestamp' has a value beyond the largest timestamp "
    f"({MAX_TIMESTAMP_MS} ms; segments keep int64 microseconds)"
)


def _conform_batch(table: pa.Table, info: _TopicInfo, partition: int | None) -> pa.Table:
    layout = info.layout
    allowed = {"key", "value", "headers", "timestamp", "partition"}
    cols: dict[str, pa.ChunkedArray | pa.Array] = {}
    if layout.typed:
        cols["value"] = _typed_values(table, info)
    else:
        if "value" not in table.column_names:
            raise InvalidRecordError(f"send_batch needs a 'value' column; got {table.column_names}")
        extra = set(table.column_names) - allowed
        if extra:
            raise InvalidRecordError(
                f"send_batch: unexpected columns {sorted(extra)}; allowed {sorted(allowed)}"
            )
    n = table.num_rows
    for name, typ in (("key", layout.key), ("value", pa.binary())):
        if name in cols:
            continue
        if name == "key" and layout.key != pa.binary():
            cols[name] = (
                cast_column(table.column(name), typ, "send_batch: column 'key'")
                if name in table.column_names
                else pa.nulls(n, typ)
            )
            continue
        if name in table.column_names:
            col = table.column(name)
            if col.type in (pa.string(), pa.large_string()) or not (
                pa.types.is_binary(col.type)
                or pa.types.is_large_binary(col.type)
                or pa.types.is_fixed_size_binary(col.type)
                or pa.types.is_null(col.type)
            ):
                raise InvalidRecordError(
                    f"send_batch: column {name!r} must be binary, got {col.type}"
                )
            cols[name] = col.cast(typ)
        else:
            cols[name] = pa.nulls(n, typ)
    if "timestamp" in table.column_names:
        col = table.column("timestamp")
        if pa.types.is_timestamp(col.type):
            # Nanoseconds are truncated to the microseconds segments keep, as Spark does (the
            # cast only divides, so it cannot overflow); coarser units are cast with checks.
            safe = col.type.unit != "ns"
            try:
                col = (
                    col.cast(pa.timestamp("us", tz="UTC"), safe=safe)
                    if col.type.tz
                    else col.cast(pa.timestamp("us"), safe=safe).cast(TIMESTAMP_TYPE)
                )
            except pa.ArrowInvalid:
                raise InvalidRecordError(_TIMESTAMP_TOO_LATE) from None
        elif pa.types.is_integer(col.type):
            try:
                col = pc.multiply_checked(col.cast(pa.int64()), 1000).cast(TIMESTAMP_TYPE)
            except (pa.ArrowInvalid, OverflowError):
                raise InvalidRecordError(_TIMESTAMP_TOO_LATE) from None
        else:
            raise InvalidRecordError(
                f"send_batch: column 'timestamp' must be a timestamp or int64 ms, got {col.type}"
            )
        earliest = pc.min(col)
        if earliest.is_valid and earliest.value < 0:
            # As send() refuses timestamp_ms < 0: a record's timestamp is ms since the epoch.
            row = pc.index(col, earliest).as_py()
            raise InvalidRecordError(
                "send_batch: column 'timestamp' must not be before the epoch (1970-01-01); "
                f"row {row} is {earliest.value // 1000} ms"
            )
        if col.null_count:
            now_us = int(time.time() * 1_000_000)
            col = pc.fill_null(col, pa.scalar(now_us, TIMESTAMP_TYPE))
        cols["timestamp"] = col
    else:
        cols["timestamp"] = pa.array(np.full(n, int(time.time() * 1_000_000)), TIMESTAMP_TYPE)
    if "headers" in table.column_names:
        try:
            cols["headers"] = table.column("headers").cast(HEADERS_TYPE)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidRecordError(
                f"send_batch: column 'headers' must be list<struct<key: string, value: binary>>: {exc}"
            ) from None
    else:
        cols["headers"] = pa.nulls(n, HEADERS_TYPE)
    out = pa.Table.from_arrays(
        [cols[f.name] for f in layout.record_schema], schema=layout.record_schema
    )
    n_parts = info.metadata.partitions
    part_col: Any = None
    if partition is not None:
        if partition.__class__ is not int or not 0 <= partition < n_parts:
            raise UnknownTopicOrPartitionError(
                f"send_batch: topic {info.metadata.name!r} has partitions 0..{n_parts - 1}; "
                f"got {partition!r}"
            )
        part_col = pa.array(np.full(n, partition, np.int32))
    elif "partition" in table.column_names:
        try:
            part_col = table.column("partition").cast(pa.int64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InvalidRecordError(
                f"send_batch: column 'partition' must hold partition numbers: {exc}"
            ) from None
        # Checked before nulls become NO_PARTITION (-1): a -1 given is a bad partition.
        low, high = pc.min_max(part_col).values()
        for bad in (low.as_py(), high.as_py()):
            if bad is not None and not 0 <= bad < n_parts:
                raise UnknownTopicOrPartitionError(
                    f"send_batch: topic {info.metadata.name!r} has partitions 0..{n_parts - 1}; "
                    f"column 'partition' has {bad}"
                )
        part_col = part_col.cast(pa.int32())
    if part_col is not None:
        filled = pc.fill_null(part_col, NO_PARTITION)
        values = np.asarray(
            filled.to_numpy(zero_copy_only=False) if hasattr(filled, "to_numpy") else filled,
            np.int32,
        )
        if values.size and (values.max() >= n_parts or (values[values != NO_PARTITION] < 0).any()):
            raise UnknownTopicOrPartitionError(
                f"send_batch: topic {info.metadata.name!r} has partitions 0..{n_parts - 1}"
            )
        out = out.append_column("partition", pa.array(values, pa.int32()))
    return out


def _typed_values(table: pa.Table, info: _TopicInfo) -> pa.Array:
    """The value struct of a typed topic's batch: either a ``value`` struct column or the
    schema's fields as top-level columns (then no row is a tombstone)."""
    schema = info.metadata.schema
    assert schema is not None
    names = set(table.column_names)
    if "value" in names:
        extra = names - {"value", *RECORD_COLUMNS}
        value: Any = table.column("value")
    else:
        fields = [n for n in table.column_names if n not in RECORD_COLUMNS]
        extra = set(fields) - set(schema.field_names())
        if not set(fields) & set(schema.field_names()):
            raise InvalidRecordError(
                f"send_batch: topic {info.metadata.name!r} is typed; give a 'value' struct "
                f"column or the columns {', '.join(schema.field_names())}"
            )
        value = None
        if not extra:
            value = pa.StructArray.from_arrays(
                [table.column(n).combine_chunks() for n in fields], names=fields
            )
    if extra:
        raise InvalidRecordError(
            f"send_batch: unexpected columns {sorted(extra)}; the value schema of "
            f"{info.metadata.name!r} is {schema.ddl()}"
        )
    return conform_values(value, schema, "send_batch")


def _check_batch_record_sizes(table: pa.Table, limit: int, topic: str) -> None:
    sizes = record_sizes(table.column("key"), table.column("value")) + RECORD_OVERHEAD_BYTES
    if sizes.size and int(sizes.max()) > limit:
        index = int(sizes.argmax())
        raise RecordTooLargeError(
            f"send_batch: row {index} is {int(sizes[index])} bytes, over the limit of {limit} for topic {topic!r}"
        )


__all__ = ["DEFAULT_CONFIG", "FutureBatchMetadata", "FutureRecordMetadata", "Producer"]
