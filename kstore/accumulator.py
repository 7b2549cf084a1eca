"""The record accumulator (Kafka's ``RecordAccumulator``): :class:`RecordAccumulator` holds each
topic's open batch, the batches queued for the sender and in flight, and the buffer memory they
reserve; :class:`Batch` is a batch's records and then their outcome; the futures ``send()`` and
``send_batch()`` return; and the conversion of a drained batch to Arrow columns (conformed to
the topic, placed, sorted by partition). The sender (:mod:`kstore.sender`) drains it.

Nothing here imports the sender, the transaction manager or the producer: the dependencies
point one way.
"""

from __future__ import annotations

import logging
import threading
import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kstore.errors import (
    IllegalStateError,
    InvalidRecordError,
    KafkaTimeoutError,
    RecordTooLargeError,
    UnknownTopicOrPartitionError,
)
from kstore.partitioner import NO_PARTITION
from kstore.producer_metadata import TopicInfo
from kstore.records import RecordMetadata, TopicPartition
from kstore.schema import cast_column, conform_values, record_sizes
from kstore.segments import (
    HEADERS_TYPE,
    TIMESTAMP_TYPE,
    Layout,
    binary_array,
    fixed_array,
    headers_array,
    null_headers,
    numpy_values,
)

# Named as the producer's: callbacks that raise are logged where they always were.
log = logging.getLogger("kstore.producer")

RESERVE_CHUNK_BYTES = 1024 * 1024  # buffer_memory is reserved this much at a time
RECORD_OVERHEAD_BYTES = 70  # Kafka's per-record batch overhead, for size accounting
# The latest record timestamp, in ms since the epoch: Kafka's timestamps are int64 ms, and a
# segment stores them as int64 microseconds, which ends here (in the year 294247).
MAX_TIMESTAMP_MS = ((1 << 63) - 1) // 1000


class FutureRecordMetadata(tuple[Any, ...]):
    """The future of one record: ``get()`` returns its :class:`RecordMetadata`.

    A tuple (batch, index) so that creating one costs no Python-level ``__init__``: ``send()``
    makes one per record and is on the hottest path of the library.
    """

    __slots__ = ()

    def get(self, timeout: float | None = None) -> RecordMetadata:
        batch: Batch = self[0]
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

    def __init__(self, batch: Batch) -> None:
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


class Batch:
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


class RecordAccumulator:
    """The producer's batches between ``send()`` and the sender: each topic's open batch, the
    batches queued for the sender and those in flight, the ``buffer_memory`` they hold, and
    whether the producer still takes records (not closed, forked or failed).

    ``lock`` guards all of it. ``send()``'s fast path takes it and reads ``open`` itself (the
    hottest path of the library: no call per record); everything else goes through the
    methods, the producer's side from ``send()``/``flush()``/``close()``, the sender's side
    (:meth:`drain`, :meth:`wake`, :meth:`release`) from the sender thread."""

    def __init__(self, *, batch_size: int, buffer_memory: int, max_block_ms: int) -> None:
        self.batch_size = batch_size
        self.buffer_memory = buffer_memory
        self._max_block_ms = max_block_ms
        self.lock = threading.Lock()
        self._wakeup = threading.Condition(self.lock)  # the sender waits on it for work
        self._space = threading.Condition(self.lock)  # senders blocked on buffer_memory
        self.open: dict[str, Batch] = {}  # never replaced: send() holds it bound
        self._queue: list[Batch] = []
        self._in_flight: list[Batch] = []
        self.buffered = 0  # bytes of buffer_memory reserved by batches not yet complete
        self._flush_requested = False
        self.closed = False
        self.forked = False
        self._fatal: BaseException | None = None
        self.usable = True  # False once closed, forked or fatally failed

    # -- the producer's side -----------------------------------------------------------------------

    def check_usable(self) -> None:
        """Raise why the producer takes no more records, if it does not."""
        if self.usable:
            return
        if self.forked:
            raise IllegalStateError(
                "this producer was created before os.fork(); create a new one in the child"
            )
        if self._fatal is not None:
            raise self._fatal
        raise IllegalStateError("producer is closed")

    def open_batch(self, topic: str, size: int, info: TopicInfo | None) -> Batch:
        """Open a batch for ``topic`` with room for a first record of ``size`` bytes (lock
        held; the caller has checked that records are taken). Buffer space is reserved a
        chunk at a time (as Kafka's buffer pool hands out buffers), so send() pays for buffer
        accounting once per chunk, not once per record."""
        batch = Batch(topic, time.monotonic())
        if info is not None and info.layout.typed:
            batch.typed = True
            batch.key_type = info.metadata.schema.key_declared  # type: ignore[union-attr]
        self._reserve(batch, size)
        self.open[topic] = batch
        self._wakeup.notify()
        return batch

    def grow_or_seal(self, topic: str, batch: Batch) -> None:
        """The batch reached its reservation (lock held): reserve more if it is not full and
        the buffer has room now, else send it (never block here: this batch is open, and
        waiting for space hands open batches to the sender)."""
        chunk = max(batch.nbytes - batch.reserved, min(RESERVE_CHUNK_BYTES, self.batch_size))
        if batch.nbytes >= self.batch_size or self.buffered + chunk > self.buffer_memory:
            self._seal(topic)
        else:
            self._reserve(batch, chunk)

    def enqueue(self, batch: Batch) -> None:
        """Queue a batch complete as it is (send_batch()'s table), after the records sent
        earlier to its topic; blocks while buffer_memory is full."""
        size = batch.nbytes
        with self.lock:
            self.check_usable()
            if self.buffered + size > self.buffer_memory and self.buffered > 0:
                self._wait_for_space(size)
            # Keep send order: records sent earlier to this topic go first.
            earlier = self.open.pop(batch.topic, None)
            if earlier is not None:
                self._queue.append(earlier)
            self._queue.append(batch)
            batch.reserved = size
            self.buffered += size
            self._wakeup.notify()

    def flush(self) -> list[Batch]:
        """Hand every open batch to the sender now; returns the batches to wait for (all
        those not yet complete)."""
        with self.lock:
            self._queue.extend(self.open.values())
            self.open.clear()
            waiting = [*self._in_flight, *self._queue]
            self._flush_requested = True
            self._wakeup.notify()
        return waiting

    def close(self) -> None:
        """Take no more records; the open batches still go out (no future is left hanging),
        and the sender stops once nothing is left."""
        with self.lock:
            self.closed = True
            self.usable = False
            for topic in list(self.open):
                self._seal(topic)
            self._wakeup.notify()

    def fail(self, exc: BaseException) -> None:
        """A fatal error (the producer was fenced): the open batches fail with it once sent,
        and every later send() raises it."""
        self._fatal = exc
        self.usable = False
        with self.lock:
            for topic in list(self.open):
                self._seal(topic)
            self._space.notify_all()

    def after_fork(self) -> None:
        """In a child process: the batches are the parent's, and no sender runs here."""
        self.forked = True
        self.usable = False
        self.open.clear()  # the next send() opens a batch, which raises

    def _reserve(self, batch: Batch, needed: int) -> None:
        """Reserve another chunk of buffer_memory for ``batch`` (lock held; may block)."""
        chunk = max(needed, min(RESERVE_CHUNK_BYTES, self.batch_size, self.buffer_memory))
        if self.buffered + chunk > self.buffer_memory:
            self._wait_for_space(chunk)
        batch.reserved += chunk
        self.buffered += chunk
        batch.mark = min(batch.reserved, self.batch_size)

    def _seal(self, topic: str) -> None:
        """Hand a batch to the sender (lock held)."""
        batch = self.open.pop(topic)
        self._queue.append(batch)
        self._wakeup.notify()

    def _wait_for_space(self, size: int) -> None:
        """Block (lock held, released while waiting) until ``size`` bytes fit; backpressure."""
        deadline = time.monotonic() + self._max_block_ms / 1000
        self._queue.extend(self.open.values())  # make room by sending what we have now
        self.open.clear()
        self._wakeup.notify()
        while self.buffered > 0 and self.buffered + size > self.buffer_memory:
            left = deadline - time.monotonic()
            if left <= 0:
                raise KafkaTimeoutError(
                    f"buffer_memory ({self.buffer_memory} bytes) stayed full for "
                    f"max_block_ms={self._max_block_ms}"
                )
            self._space.wait(left)
            self.check_usable()

    # -- the sender's side ---------------------------------------------------------------------

    def drain(self, linger_s: float, written: Callable[[], bool] | None) -> list[Batch] | None:
        """The sender's next work, waiting for it: the queued batches, with the open ones
        whose ``linger_ms`` has passed or that a flush asks for. ``written``: whether the
        delivery the sender is writing is written (None: none is). Returns ``[]`` once that
        delivery is written and nothing is queued, None once closed with nothing left."""
        with self.lock:
            while True:
                now = time.monotonic()
                # While a delivery is being written, what arrives keeps filling the open
                # batches instead of being cut into the next delivery now, which would then
                # wait for the write anyway: it is cut when the write ends (or once a full
                # batch waits), so a record waits for about one write, not two.
                hold = (
                    written is not None
                    and not written()
                    and not self._queue
                    and not self._flush_requested
                )
                if not hold:
                    for topic, batch in list(self.open.items()):
                        if self._flush_requested or now - batch.created >= linger_s:
                            self._queue.append(self.open.pop(topic))
                    self._flush_requested = False
                if self._queue:
                    work, self._queue = self._queue, []
                    self._in_flight.extend(work)
                    return work
                if written is not None and written():
                    return []
                if self.closed and written is None:
                    return None
                wait = None
                if self.open and not hold:
                    oldest = min(b.created for b in self.open.values())
                    wait = max(0.0, oldest + linger_s - now)
                self._wakeup.wait(wait)  # new work, lingering over, or the delivery written

    def wake(self) -> None:
        """Wake the sender (a write it may be waiting for ended)."""
        with self.lock:
            self._wakeup.notify()

    def release(self, batches: Iterable[Batch]) -> None:
        """Completed batches give their buffer_memory back."""
        with self.lock:
            for batch in batches:
                self.buffered -= batch.reserved
                self._in_flight.remove(batch)
            self._space.notify_all()


# -- a drained batch as Arrow columns -----------------------------------------------------------


def as_bytes(value: Any, field: str) -> bytes:
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise InvalidRecordError(
        f"record {field} must be bytes (or None), got {type(value).__name__}; "
        f"set {field}_serializer to convert {type(value).__name__} values"
    )


def check_headers(headers: Iterable[Any]) -> list[tuple[str, bytes]]:
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


def merge(group: list[Batch], layout: Layout) -> Batch:
    """One batch with the records of ``group`` (batches of send() to one topic, in send order),
    as a table: each batch is converted on its own and the tables joined, which copies no
    Python object reference (concatenating the lists would touch every record again)."""
    first = group[0]
    merged = Batch(first.topic, first.created)
    merged.typed, merged.key_type = first.typed, first.key_type
    merged.table = pa.concat_tables([build_table(batch, layout) for batch in group])
    start = 0
    for batch in group:
        for index, partition in batch.partitions.items():
            merged.partitions[start + index] = partition
        merged.nbytes += batch.nbytes
        start += len(batch)
    return merged


def share_outcome(merged: Batch, group: list[Batch]) -> None:
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


def build_table(batch: Batch, layout: Layout) -> pa.Table:
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
    # Seconds to microseconds. A large batch in Arrow's kernels: a quarter of the time numpy's
    # temporaries take, and this runs on the sender thread, which shares the GIL with send().
    # A small one (most flushes of a producer that keeps up) in numpy: its three kernel calls
    # cost more than the conversion. Both round half to even.
    floats = np.frombuffer(batch.timestamps, np.float64)
    micros: np.ndarray[Any, Any]
    if n <= SMALL_BATCH:
        micros = np.rint(floats * 1e6).astype(np.int64)
    else:
        seconds = fixed_array(floats, pa.float64())
        million = fixed_array(np.array([1e6]), pa.float64())[0]  # pa.scalar imports pandas too
        rounded = pc.cast(pc.round(pc.multiply(seconds, million)), pa.int64())
        micros = numpy_values(rounded, np.int64)
    if batch.given_timestamps:
        given = batch.given_timestamps
        micros = micros.copy()
        micros[np.fromiter(given.keys(), np.int64, len(given))] = (
            np.fromiter(given.values(), np.int64, len(given)) * 1000
        )
    timestamps = fixed_array(micros, TIMESTAMP_TYPE)  # timestamp[us]: int64 microseconds
    headers = headers_array(batch.headers, n) if batch.headers else null_headers(n)
    return pa.Table.from_arrays([keys, values, timestamps, headers], schema=layout.record_schema)


# Records in a batch up to which numpy converts its timestamps (see build_table).
SMALL_BATCH = 1024


def sort_key(parts: np.ndarray[Any, Any], n_parts: int) -> np.ndarray[Any, Any]:
    """``parts`` in the narrowest integer type: numpy's stable sort is a radix sort for 8- and
    16-bit integers, ten times faster than its merge sort of 32-bit ones."""
    if n_parts <= 128:
        return parts.astype(np.int8)
    if n_parts <= 32768:
        return parts.astype(np.int16)
    return parts


MAX_CHUNKS_REORDERED_APART = 64


def by_partition(
    table: pa.Table, parts: np.ndarray[Any, Any], n_parts: int, *, compact: bool = False
) -> dict[int, pa.Table]:
    """Each partition's records of ``table``, in table order. A table of a few chunks (a
    merged delivery has one per batch) is reordered a chunk at a time, so its chunks are never
    concatenated first (a copy of every record): a partition's table then has a chunk, and
    its segment a record batch, per chunk that has records for it.

    The reordering (a take) copies the records into arrays that hold them alone, which is
    what a segment must be written from: an IPC message of a slice can carry buffers of the
    whole array it was cut from (a list column's children). Only a ``compact`` table, one the
    sender built itself from ``send()`` records, is sliced without a take where its records
    are in partition order already (every delivery to a one-partition topic)."""
    chunks = table.to_batches()
    if not 1 < len(chunks) <= MAX_CHUNKS_REORDERED_APART:
        chunks = [table.combine_chunks().to_batches()[0]] if table.num_rows else []
    pieces: dict[int, list[pa.RecordBatch]] = {}
    start = 0
    for chunk in chunks:
        rows = parts[start : start + chunk.num_rows]
        start += chunk.num_rows
        counts = np.bincount(rows, minlength=n_parts)
        if compact and in_order(rows):
            ordered = chunk
        else:
            order = np.argsort(sort_key(rows, n_parts), kind="stable")
            ordered = chunk.take(fixed_array(order.astype(np.int64, copy=False), pa.int64()))
        offset = 0
        for p in np.nonzero(counts)[0].tolist():
            count = int(counts[p])
            pieces.setdefault(p, []).append(ordered.slice(offset, count))
            offset += count
    return {p: pa.Table.from_batches(b, schema=table.schema) for p, b in pieces.items()}


def in_order(rows: np.ndarray[Any, Any]) -> bool:
    """Whether the partitions of ``rows`` never go down (every record of a one-partition topic,
    a delivery that sends one partition's records together)."""
    return len(rows) < 2 or bool((rows[1:] >= rows[:-1]).all())


def to_table(data: Any) -> pa.Table:
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


def conform_batch(table: pa.Table, info: TopicInfo, partition: int | None) -> pa.Table:
    layout = info.layout
    allowed = {"key", "value", "headers", "timestamp", "partition"}
    cols: dict[str, pa.ChunkedArray | pa.Array] = {}
    if layout.typed:
        cols["value"] = typed_values(table, info)
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
        cols["headers"] = null_headers(n)
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


def typed_values(table: pa.Table, info: TopicInfo) -> pa.Array:
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


def check_batch_record_sizes(table: pa.Table, limit: int, topic: str) -> None:
    sizes = record_sizes(table.column("key"), table.column("value")) + RECORD_OVERHEAD_BYTES
    if sizes.size and int(sizes.max()) > limit:
        index = int(sizes.argmax())
        raise RecordTooLargeError(
            f"send_batch: row {index} is {int(sizes[index])} bytes, over the limit of {limit} for topic {topic!r}"
        )
