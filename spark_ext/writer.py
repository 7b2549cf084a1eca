"""The Spark writers (batch ``df.write`` and streaming ``writeStream``): executors write segment
files, the driver commits them, one manifest commit per touched partition.

Exactly-once: a commit carries a transaction identifier ``(app id, version)``, and a partition
that already holds that version for that app id commits nothing (kstore's txn action, as Delta's
``txnAppId``/``txnVersion``). A streaming query uses its query id (or option ``txnAppId``) and the
micro-batch id, so a replayed micro-batch is recognised partition by partition: when a driver
died after committing some partitions of a batch, the replay commits the remaining ones only.
For that to hold, a replayed batch must place every record in the partition it chose the first
time; records are placed by their key (the producer's partitioners), their ``partition``
column, or, without either, by a choice derived from (app id, batch id, task), never at random.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    BinaryType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampType,
)

from kstore.config import INTENT_PROTECTION_MS, MAX_SINK_UNCOMMITTED_MS
from kstore.errors import (
    CommitStateUnknownError,
    ConcurrentModificationError,
    InvalidRecordError,
    RecordTooLargeError,
    StaleWriteError,
    UnknownTopicOrPartitionError,
)
from kstore.partition import AppendResult
from kstore.partitioner import NO_PARTITION, get_partitioner
from kstore.schema import cast_column, conform_values, key_bytes, record_sizes
from kstore.segments import (
    FORMAT_ARROW,
    HEADERS_TYPE,
    TIMESTAMP_TYPE,
    SegmentFile,
    layout_of,
    new_segment_name,
)
from kstore.store import Store, TopicMetadata, require_layout3

from . import pending
from .options import InvalidOptionError, WriteOptions
from .pending import FileLike, FileRef
from .schema import HEADERS_SPARK_TYPE
from .stores import get_store

log = logging.getLogger(__name__)

QUERY_ID_PROPERTY = "sql.streaming.queryId"  # set by Spark on every task of a streaming query
BATCH_ID_PROPERTY = "streaming.sql.batchId"
COMMIT_THREADS = 8  # partitions committed concurrently (object-store round trips dominate)
RECORD_OVERHEAD_BYTES = 70  # as the producer: Kafka's per-record overhead, for size limits
# Records with neither key nor partition move to the next partition after this many bytes of
# them, as Kafka's sticky partitioner moves on when a batch fills (its default batch.size).
STICKY_BATCH_BYTES = 16 * 1024

# A struct value (and a typed key) is for typed topics; checked against the topic's schema.
_INPUT_TYPES: dict[str, tuple[type[DataType], ...]] = {
    "value": (BinaryType, StringType, StructType),
    "key": (BinaryType, StringType, LongType, IntegerType, ShortType, DoubleType, FloatType),
    "topic": (StringType,),
    "partition": (IntegerType, ShortType, LongType),
    "timestamp": (TimestampType,),
}


def check_input_schema(schema: StructType, options: WriteOptions) -> dict[str, str]:
    """The input columns the sink uses (lower-case name -> column name), as the Kafka sink:
    ``value`` required, ``key``, ``topic``, ``partition``, ``headers`` optional (``timestamp``
    too with option keepTimestamp), other columns ignored. Raises naming the column at fault."""
    names = {f.name.lower(): f for f in schema.fields}
    if "value" not in names:
        raise InvalidRecordError(
            f"kstore sink: the input needs a 'value' column (string or binary, or a struct for "
            "a typed topic); it has "
            f"{', '.join(schema.fieldNames()) or 'no columns'}"
        )
    # Without keepTimestamp the 'timestamp' column is ignored like any other: Kafka's sink
    # stamps the time of writing.
    used = ("value", "key", "topic", "partition", "headers") + (
        ("timestamp",) if options.keep_timestamp else ()
    )
    for name, kinds in _INPUT_TYPES.items():
        if name not in used:
            continue
        f = names.get(name)
        if f is not None and not isinstance(f.dataType, kinds):
            typed_only = name in ("key", "value")
            wanted = " or ".join(k.typeName() for k in (kinds[:2] if typed_only else kinds))
            extra = " (a typed topic's takes its declared type)" if typed_only else ""
            raise InvalidRecordError(
                f"kstore sink: column {f.name!r} must be {wanted}, got "
                f"{f.dataType.simpleString()}{extra}"
            )
    f = names.get("headers")
    if f is not None and f.dataType.simpleString() != HEADERS_SPARK_TYPE.simpleString():
        raise InvalidRecordError(
            f"kstore sink: column {f.name!r} must be {HEADERS_SPARK_TYPE.simpleString()}, got "
            f"{f.dataType.simpleString()}"
        )
    if options.topic is None and "topic" not in names:
        raise InvalidOptionError(
            "kstore sink: no topic: set the option 'topic' or give the input a 'topic' column"
        )
    return {n: f.name for n, f in names.items() if n in used}


@dataclass(frozen=True)
class WrittenFile:
    topic: str
    topic_id: str
    partition: int
    file: SegmentFile
    order: tuple[int, int]  # (task partition id, sequence): commit order within a partition

    @property
    def path(self) -> str:
        return self.file.path


@dataclass
class KStoreCommitMessage(WriterCommitMessage):
    """What one task reports to the driver: the segment files it wrote."""

    files: list[WrittenFile] = field(default_factory=list)
    records: int = 0
    query_id: str | None = None
    batch_id: int | None = None
    marker: str | None = None  # the task's write-intent record (see pending.py)


def _task_info() -> tuple[int, str | None, int | None]:
    """(task partition id, query id, batch id) from Spark's task context, when there is one."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, None, None
    query = ctx.getLocalProperty(QUERY_ID_PROPERTY)
    batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
    return ctx.partitionId(), query, int(batch) if batch is not None else None


def _binary(column: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if column.type == pa.binary():
        return column
    if (
        pa.types.is_large_binary(column.type)
        or pa.types.is_large_string(column.type)
        or pa.types.is_string(column.type)
    ):
        return column.cast(pa.binary())
    raise InvalidRecordError(f"kstore sink: expected string or binary, got {column.type}")


def _as_layout(table: pa.Table, meta: TopicMetadata, topic: str) -> pa.Table:
    """Key and value converted to the topic's layout: binary, or its declared types."""
    schema = meta.schema
    key, value = table.column("key"), table.column("value")
    if schema is None:
        if pa.types.is_struct(value.type):
            raise InvalidRecordError(
                f"kstore sink: topic {topic!r} is binary; its 'value' must be string or binary, "
                f"got a struct (serialize it, e.g. to_json(value), or write to a typed topic)"
            )
        key, value = _binary(key), _binary(value)
    else:
        what = f"kstore sink: topic {topic!r}"
        value = conform_values(value, schema, what)
        key = cast_column(
            key.combine_chunks() if isinstance(key, pa.ChunkedArray) else key,
            schema.key_type,
            f"{what}: column 'key'",
        )
    return pa.Table.from_arrays(
        [key, value, table.column("timestamp"), table.column("headers")],
        schema=layout_of(meta).record_schema,
    )


class TaskSink:
    """Buffers one task's records per (topic, partition) and writes them as segments."""

    def __init__(
        self,
        options: WriteOptions,
        store: Store,
        columns: dict[str, str],
        *,
        seed: str,
        task: int,
        on_written: Callable[[list[FileLike]], None] | None = None,
    ) -> None:
        # Called before each segment write with every file the task has written and the one
        # it is about to write: the task's write intent (pending.py).
        self.on_written = on_written
        self.options = options
        self.store = store
        self.columns = columns
        self.seed = seed
        self.task = task
        self.partitioner = get_partitioner(options.partitioner)
        self.topics: dict[str, TopicMetadata] = {}
        self.buffers: dict[tuple[str, int], list[pa.Table]] = {}
        self.buffered: dict[tuple[str, int], int] = {}
        self.written: list[WrittenFile] = []
        self._planned: FileRef | None = None  # named in the intent, being written
        self.records = 0
        self._sequence = 0
        self._sticky: dict[str, int] = {}
        self._unkeyed_bytes: dict[str, int] = {}

    def _topic(self, name: str) -> TopicMetadata:
        meta = self.topics.get(name)
        if meta is None:
            try:
                meta = self.topics[name] = self.store.topic(name)
            except UnknownTopicOrPartitionError:
                raise UnknownTopicOrPartitionError(
                    f"kstore sink: topic {name!r} does not exist in store {self.store!r}; create it "
                    "first (kstore topics create)"
                ) from None
            require_layout3(meta, "the kstore sink")  # before any file is written
        return meta

    def _sticky_partitions(self, topic: str, n: int, sizes: np.ndarray) -> np.ndarray:
        """Partitions for records with neither key nor partition (``sizes``: their key plus
        value bytes, in input order): the task starts at a partition derived from its seed and
        moves to the next one, round robin, after every STICKY_BATCH_BYTES of such records.
        Derived, not random, and counted per record (not per Arrow batch): a replayed
        micro-batch puts them where it put them the first time (exactly-once depends on it)."""
        start = self._sticky.get(topic)
        if start is None:
            start = self._sticky[topic] = zlib.crc32(f"{self.seed}/{topic}".encode())
        before = self._unkeyed_bytes.get(topic, 0)
        ends = before + np.cumsum(sizes, dtype=np.int64)
        self._unkeyed_bytes[topic] = int(ends[-1]) if ends.size else before
        chosen: np.ndarray = ((start + (ends - sizes) // STICKY_BATCH_BYTES) % n).astype(np.int32)
        return chosen

    def add(self, batch: pa.RecordBatch) -> None:
        rows = batch.num_rows
        if rows == 0:
            return
        cols = self.columns
        table = self._records(batch)
        if self.options.topic is not None:
            self._add_topic(self.options.topic, table, self._column(batch, "partition"), batch)
            return
        topics = batch.column(cols["topic"])
        if topics.null_count:
            raise InvalidRecordError(
                "kstore sink: a record has a null 'topic' (and no option 'topic' is set)"
            )
        groups = pc.unique(topics).to_pylist()
        for name in groups:
            if len(groups) == 1:
                part, sub = table, batch
            else:
                mask = pc.equal(topics, pa.scalar(name, topics.type))
                part, sub = table.filter(mask), batch.filter(mask)
            self._add_topic(str(name), part, self._column(sub, "partition"), sub)

    def _column(self, batch: pa.RecordBatch, name: str) -> pa.Array | None:
        column = self.columns.get(name)
        return None if column is None else batch.column(column)

    def _records(self, batch: pa.RecordBatch) -> pa.Table:
        """The batch as segment records (RECORD_SCHEMA), validated."""
        rows = batch.num_rows
        cols = self.columns
        # Key and value as given: each topic's _add_topic converts them to its layout.
        value = batch.column(cols["value"])
        key = batch.column(cols["key"]) if "key" in cols else pa.nulls(rows, pa.binary())
        now_us = int(time.time() * 1_000_000)
        if "timestamp" in cols:
            stamps = batch.column(cols["timestamp"]).cast(TIMESTAMP_TYPE)
            if stamps.null_count:
                stamps = pc.fill_null(stamps, pa.scalar(now_us, TIMESTAMP_TYPE))
        else:
            stamps = pa.array(np.full(rows, now_us, np.int64)).cast(TIMESTAMP_TYPE)
        if "headers" in cols:
            headers = batch.column(cols["headers"]).cast(HEADERS_TYPE)
        else:
            headers = pa.nulls(rows, HEADERS_TYPE)
        return pa.Table.from_arrays(
            [key, value, stamps, headers], names=["key", "value", "timestamp", "headers"]
        )

    def _add_topic(
        self, topic: str, table: pa.Table, explicit: pa.Array | None, batch: pa.RecordBatch
    ) -> None:
        meta = self._topic(topic)
        n = meta.partitions
        config = meta.effective_config
        table = _as_layout(table, meta, topic)
        self._check_sizes(table, topic, int(config["max.message.bytes"]))
        if config["message.timestamp.type"] == "LogAppendTime":
            now = pa.array(np.full(table.num_rows, int(time.time() * 1_000_000), np.int64)).cast(
                TIMESTAMP_TYPE
            )
            table = table.set_column(2, "timestamp", now)
        # A copy: the partitioner's Arrow result may be read-only memory.
        schema = meta.schema
        keys = table.column("key").combine_chunks()
        if schema is not None and schema.key_declared is not None:
            keys = key_bytes(keys, schema.key_declared)  # hashed as Kafka's serializer writes them
        parts = np.array(self.partitioner.partition_batch(keys, n), dtype=np.int32)
        if explicit is not None:
            given = explicit.cast(pa.int64()).to_numpy(zero_copy_only=False)
            valid = ~np.asarray(explicit.is_null().to_numpy(zero_copy_only=False), dtype=bool)
            bad = valid & ((given < 0) | (given >= n))
            if bad.any():
                raise UnknownTopicOrPartitionError(
                    f"kstore sink: topic {topic!r} has partitions 0..{n - 1}; a record names "
                    f"partition {int(given[bad][0])}"
                )
            parts = np.where(valid, given, parts).astype(np.int32)
        unkeyed = parts == NO_PARTITION
        if unkeyed.any():
            sizes = record_sizes(table.column("key"), table.column("value"))[unkeyed]
            parts[unkeyed] = self._sticky_partitions(topic, n, sizes)
        if parts.size and bool((parts == parts[0]).all()):
            self._buffer(topic, int(parts[0]), table)
            return
        order = np.argsort(parts, kind="stable")
        counts = np.bincount(parts, minlength=n)
        ordered = table.take(pa.array(order))
        start = 0
        for p in np.nonzero(counts)[0]:
            count = int(counts[p])
            self._buffer(topic, int(p), ordered.slice(start, count))
            start += count

    @staticmethod
    def _check_sizes(table: pa.Table, topic: str, limit: int) -> None:
        sizes = pa.array(record_sizes(table.column("key"), table.column("value")))
        largest = pc.max(sizes).as_py() or 0
        headers = table.column("headers").combine_chunks()
        if headers.null_count < len(headers):
            flat = pc.list_flatten(headers)
            if len(flat):
                pair = pc.add(
                    pc.fill_null(pc.binary_length(pc.struct_field(flat, [0]).cast(pa.binary())), 0),
                    pc.fill_null(pc.binary_length(pc.struct_field(flat, [1])), 0),
                ).to_numpy(zero_copy_only=False)
                parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
                per_row = np.bincount(parents, weights=pair, minlength=len(headers))
                total = np.asarray(sizes.to_numpy(zero_copy_only=False), dtype=np.float64) + per_row
                largest = int(total.max())
        if largest + RECORD_OVERHEAD_BYTES > limit:
            raise RecordTooLargeError(
                f"kstore sink: a record of {largest + RECORD_OVERHEAD_BYTES} bytes is larger than "
                f"topic {topic!r}'s max.message.bytes={limit}"
            )

    def _buffer(self, topic: str, partition: int, table: pa.Table) -> None:
        key = (topic, partition)
        self.buffers.setdefault(key, []).append(table)
        self.buffered[key] = self.buffered.get(key, 0) + table.nbytes
        self.records += table.num_rows
        if self.buffered[key] >= self.options.segment_bytes:
            self._flush(key)

    def _flush(self, key: tuple[str, int]) -> None:
        tables = self.buffers.pop(key, [])
        self.buffered.pop(key, None)
        if not tables:
            return
        topic, p = key
        meta = self._topic(topic)
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        compression = self.options.compression
        if compression is None:
            configured = meta.effective_config["compression.type"]
            compression = "uncompressed" if configured == "producer" else str(configured)
        partition = self.store.partition(topic, p, meta)
        retry = partition.log.retry
        while True:
            started = retry.clock()  # before the intent and the write: a slow one counts too
            # The intent names the file before it exists: a worker killed at any point after
            # the write leaves a file its job's cleanup finds (PROTOCOL.md 23, point 29).
            planned = FileRef(topic, meta.topic_id, p, new_segment_name(FORMAT_ARROW))
            self._planned = planned
            if self.on_written is not None:
                self.on_written([*self.written, planned])
            written = partition.write_segment(
                table, compression=compression, durable=self.options.durable, name=planned.path
            )
            self.written.append(
                WrittenFile(topic, meta.topic_id, p, written, (self.task, self._sequence))
            )
            self._planned = None
            self._sequence += 1
            if not retry.too_old(started):
                return
            # The intent has protected the file since before its write, but the task hands on
            # no file older than the commit deadline by its own clock (PROTOCOL.md 23.1): a
            # task paused while recording or writing writes the data again, under a new name.
            log.warning(
                "kstore sink: %s-%d segment too old when written; writing it again", topic, p
            )
            delete_files(self.store, [self.written.pop()])

    def finish(self) -> list[WrittenFile]:
        for key in sorted(self.buffers):
            self._flush(key)
        return list(self.written)

    def discard(self) -> None:
        """Delete what this task wrote (it failed; nothing of it is committed), and the file
        it was writing when it failed (its put may have landed)."""
        planned = [self._planned] if self._planned is not None else []
        delete_files(self.store, [*self.written, *planned])
        self.written = []
        self._planned = None


def delete_files(store: Store, files: Iterable[FileLike]) -> None:
    paths = [FileRef(f.topic, f.topic_id, f.partition, f.path).storage_path() for f in files]
    if paths:
        try:
            store.storage.delete(paths)
        except Exception:  # a leftover file costs space, never correctness: vacuum removes it
            log.warning(
                "kstore sink: could not delete %d uncommitted segment files",
                len(paths),
                exc_info=True,
            )


def delete_uncommitted(store: Store, files: Sequence[FileLike]) -> None:
    """Delete the files that no manifest references (an aborted or replayed batch's files).
    Each partition's manifest is read first: a file that did get committed stays, live or
    removed since (PROTOCOL.md 12.6): a reader may still need a removed file, which only
    vacuum deletes (22.5)."""
    by_partition: dict[tuple[str, str, int], list[FileLike]] = {}
    for f in files:
        by_partition.setdefault((f.topic, f.topic_id, f.partition), []).append(f)
    orphans: list[FileLike] = []
    for (topic, topic_id, p), group in by_partition.items():
        try:
            meta = store.topic(topic)
        except UnknownTopicOrPartitionError:
            meta = None
        if meta is None or meta.topic_id != topic_id or p >= meta.partitions:
            orphans.extend(group)  # the topic is gone: nothing can reference these files
            continue
        state = store.partition(topic, p, meta).state()
        committed = {s.path for s in state.segments} | state.removed.keys()
        orphans.extend(f for f in group if f.path not in committed)
    delete_files(store, orphans)


def _check_sink_ages(topic: str, p: int, files: Sequence[WrittenFile]) -> None:
    """Refuse to commit a file written more than MAX_SINK_UNCOMMITTED_MS ago (the time in its
    name, 5.4 of PROTOCOL.md, is the task's clock at the start of the write): its write intent
    stops protecting it from vacuum after INTENT_PROTECTION_MS (PROTOCOL.md 23.1)."""
    now = int(time.time() * 1000)
    for f in files:
        stem = f.path.rsplit("/", 1)[-1][:13]
        if not stem.isdigit():
            continue  # not a name this sink wrote: no time to judge by
        age = now - int(stem)
        if age > MAX_SINK_UNCOMMITTED_MS:
            raise StaleWriteError(
                f"kstore sink: {topic}-{p}: segment {f.path} was written {age} ms before this "
                f"commit, more than {MAX_SINK_UNCOMMITTED_MS} ms (vacuum may delete it "
                f"{INTENT_PROTECTION_MS} ms after its write); nothing was committed, run the "
                "batch again"
            )


def _messages(messages: Sequence[WriterCommitMessage | None]) -> list[KStoreCommitMessage]:
    return [m for m in messages if isinstance(m, KStoreCommitMessage)]


def clean_up(
    store: Store,
    job: str,
    messages: Sequence[WriterCommitMessage | None],
    *,
    aborted: bool,
    keep_intents: bool = False,
) -> None:
    """After a commit or an abort: delete every file of the job that no manifest references
    (reported in messages when aborting, and recorded by tasks whose messages were lost or by
    an earlier attempt of the batch), then the job's write intents (unless ``keep_intents``:
    an aborted micro-batch leaves them to its replay)."""
    reported = _messages(messages)
    known = {m.marker for m in reported if m.marker is not None}
    files: list[FileLike] = list(pending.recorded(store, job, skip=known))
    if aborted:
        files.extend(f for m in reported for f in m.files)
    if files:
        log.info("kstore sink: deleting up to %d uncommitted segment files of %s", len(files), job)
        delete_uncommitted(store, files)
    if not keep_intents:
        pending.clear(store, job)


def commit_files(
    store: Store,
    messages: Sequence[WriterCommitMessage | None],
    *,
    txn: tuple[str, int] | None,
    durable: bool,
) -> dict[tuple[str, int], AppendResult]:
    """Phase two on the driver: one commit per touched partition, in parallel.

    With ``txn``, a partition that already committed that transaction commits nothing and the
    files written for it now are deleted. If any partition fails, the files of the partitions
    not committed are deleted before the error propagates, except where the outcome is unknown
    (the commit may have landed): those are resolved by the replay, and vacuum removes leftovers.
    """
    groups: dict[tuple[str, str, int], list[WrittenFile]] = {}
    for message in messages:
        if isinstance(message, KStoreCommitMessage):
            for f in message.files:
                groups.setdefault((f.topic, f.topic_id, f.partition), []).append(f)
    if not groups:
        return {}

    def check_topic(topic: str, topic_id: str) -> TopicMetadata:
        meta = store.topic(topic)
        if meta.topic_id != topic_id:
            raise ConcurrentModificationError(
                f"kstore sink: topic {topic!r} was deleted and re-created while this write ran"
            )
        return meta

    def commit_one(key: tuple[str, str, int]) -> dict[tuple[str, int], AppendResult]:
        topic, topic_id, p = key
        files = sorted(groups[key], key=lambda f: f.order)
        meta = check_topic(topic, topic_id)
        _check_sink_ages(topic, p, files)
        result = store.partition(topic, p, meta).commit_segments(
            [f.file for f in files], txn=txn, durable=durable, operation="SPARK WRITE"
        )
        if result.duplicate:
            # An earlier attempt of this batch committed this partition with its own files.
            delete_files(store, files)
        return {(topic, p): result}

    def commit_shared(unit: tuple[str, str, int]) -> dict[tuple[str, int], AppendResult]:
        """Layout 3: the partitions of one topic log in one commit, atomic across them."""
        topic, topic_id, _ = unit
        meta = check_topic(topic, topic_id)
        outcomes: dict[int, dict[str, Any]] = {}
        builds = {}
        for key in units[unit]:
            p = key[2]
            files = sorted(groups[key], key=lambda f: f.order)
            _check_sink_ages(topic, p, files)
            outcomes[p] = {}
            builds[p] = store.partition(topic, p, meta).append_build(
                [f.file for f in files], txn=txn, outcome=outcomes[p]
            )
        shared = store.topic_log(topic, meta, units[unit][0][2])
        result, _ = shared.commit(builds, operation="SPARK WRITE", durable=durable)
        out: dict[tuple[str, int], AppendResult] = {}
        for key in units[unit]:
            p = key[2]
            landed = outcomes[p].get("range")
            if result is None or landed is None:
                # An earlier attempt of this batch committed this partition with its own files.
                delete_files(store, groups[key])
                out[(topic, p)] = AppendResult(-1, -1, None, 0, duplicate=True)
            else:
                out[(topic, p)] = AppendResult(landed[0], landed[1], result.version, landed[2])
        return out

    # A commit unit: one partition (layout 2), or one topic log's partitions (layout 3).
    units: dict[tuple[str, str, int], list[tuple[str, str, int]]] = {}
    layouts: dict[str, TopicMetadata] = {}
    for key in sorted(groups):
        meta = layouts.get(key[0]) or store.topic(key[0])
        layouts[key[0]] = meta
        if meta.layout == 3 and meta.topic_id == key[1]:
            units.setdefault((key[0], key[1], -1 - key[2] % meta.commit_logs), []).append(key)
        else:
            units[key] = [key]

    def commit_unit(unit: tuple[str, str, int]) -> dict[tuple[str, int], AppendResult]:
        return commit_shared(unit) if unit[2] < 0 else commit_one(unit)

    results: dict[tuple[str, int], AppendResult] = {}
    failures: list[tuple[tuple[str, str, int], BaseException]] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(COMMIT_THREADS, len(units))) as pool:
        futures = {pool.submit(commit_unit, unit): unit for unit in sorted(units)}
        for future in concurrent.futures.as_completed(futures):
            unit = futures[future]
            try:
                results.update(future.result())
            except BaseException as exc:  # collected, then re-raised after the cleanup
                failures.extend((key, exc) for key in units[unit])
    if failures:
        unknown = {key for key, exc in failures if isinstance(exc, CommitStateUnknownError)}
        leftovers = [f for key, _ in failures if key not in unknown for f in groups[key]]
        delete_uncommitted(store, leftovers)
        raise failures[0][1]
    return results


def _app_id(options: WriteOptions, messages: Sequence[WriterCommitMessage | None]) -> str | None:
    if options.txn_app_id is not None:
        return options.txn_app_id
    ids = {m.query_id for m in messages if isinstance(m, KStoreCommitMessage) and m.query_id}
    if len(ids) > 1:
        raise ConcurrentModificationError(
            f"kstore sink: tasks of one batch report several query ids {sorted(ids)}"
        )
    if ids:
        return ids.pop()
    return query_id_from_checkpoint(options.checkpoint_location)


def query_id_from_checkpoint(location: str | None) -> str | None:
    """The query id Spark keeps in ``<checkpointLocation>/metadata`` (stable across restarts):
    the driver's way to the query id when no task reported it (every task failed)."""
    if not location:
        return None
    try:
        import fsspec

        with fsspec.open(f"{location.rstrip('/')}/metadata", "rb") as f:
            data = json.loads(f.read(64 * 1024).decode().splitlines()[0])
        query_id = data.get("id") if isinstance(data, dict) else None
        return query_id if isinstance(query_id, str) and query_id else None
    except Exception:  # unreadable from here (credentials, scheme): the caller copes without it
        log.info("kstore sink: could not read the query id from %s", location, exc_info=True)
        return None


class _WriterBase:
    options: WriteOptions
    columns: dict[str, str]

    def _job(self, app_id: str | None, batch_id: int | None) -> str:
        raise NotImplementedError

    def _write(self, iterator: Iterator[pa.RecordBatch], *, streaming: bool) -> KStoreCommitMessage:
        task, query_id, batch_id = _task_info()
        store = get_store(self.options.store)
        app_id = self.options.txn_app_id or query_id
        if streaming:
            seed = f"{app_id}/{batch_id}/{task}"
        elif self.options.txn_app_id is not None:
            seed = f"{self.options.txn_app_id}/{self.options.txn_version}/{task}"
        else:
            seed = uuid.uuid4().hex  # a plain batch write: nothing to replay, spread the load
        job = self._job(app_id, batch_id)
        marker = f"{task}-{uuid.uuid4().hex}"

        def on_written(files: list[FileLike]) -> None:
            pending.record(store, job, marker, files)

        sink = TaskSink(
            self.options, store, self.columns, seed=seed, task=task, on_written=on_written
        )
        try:
            for batch in iterator:
                sink.add(batch)
            files = sink.finish()
        except BaseException:
            sink.discard()
            raise
        if not streaming and files and pending.is_aborted(store, job):
            # Cancelled while writing, after the driver cleaned up: nobody else will.
            sink.discard()
            pending.forget(store, job, marker)
            files = []
        return KStoreCommitMessage(
            files=files, records=sink.records, query_id=query_id, batch_id=batch_id, marker=marker
        )


class KStoreBatchWriter(_WriterBase, DataSourceArrowWriter):
    """``df.write.format("kstore")``: append to topics. With options txnAppId and txnVersion
    the write is idempotent (a repeated job with the same version commits nothing)."""

    def __init__(self, options: WriteOptions, columns: dict[str, str]) -> None:
        self.options = options
        self.columns = columns
        # Made on the driver, shipped with this object to the tasks and back to commit/abort.
        self.job_id = uuid.uuid4().hex

    def _job(self, app_id: str | None, batch_id: int | None) -> str:
        return pending.batch_job(self.job_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KStoreCommitMessage:
        return self._write(iterator, streaming=False)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        txn = None
        if self.options.txn_app_id is not None and self.options.txn_version is not None:
            txn = (self.options.txn_app_id, self.options.txn_version)
        store = get_store(self.options.store)
        commit_files(store, messages, txn=txn, durable=self.options.durable)
        clean_up(store, self._job(None, None), messages, aborted=False)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        store = get_store(self.options.store)
        job = self._job(None, None)
        pending.mark_aborted(store, job)  # first: a task recording later sees it
        clean_up(store, job, messages, aborted=True)


class KStoreStreamWriter(_WriterBase, DataSourceStreamArrowWriter):
    """``writeStream.format("kstore")``: each micro-batch commits at most once per partition,
    under the transaction (query id or txnAppId, batch id)."""

    def __init__(self, options: WriteOptions, columns: dict[str, str]) -> None:
        self.options = options
        self.columns = columns

    def _job(self, app_id: str | None, batch_id: int | None) -> str:
        return pending.stream_job(app_id or "unknown-query", -1 if batch_id is None else batch_id)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KStoreCommitMessage:
        return self._write(iterator, streaming=True)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        store = get_store(self.options.store)
        app_id = _app_id(self.options, messages)
        if app_id is None:
            files = [f for m in _messages(messages) for f in m.files]
            if not files:
                return  # an empty micro-batch: nothing written, nothing to recognise
            delete_uncommitted(store, files)
            raise InvalidOptionError(
                "kstore sink: cannot tell which query this micro-batch belongs to, so a replay "
                "could not be recognised; set the option 'txnAppId'"
            )
        commit_files(store, messages, txn=(app_id, batchId), durable=self.options.durable)
        clean_up(store, self._job(app_id, batchId), messages, aborted=False)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        app_id = _app_id(self.options, messages)
        store = get_store(self.options.store)
        if app_id is None:
            delete_uncommitted(store, [f for m in _messages(messages) for f in m.files])
            return
        # The intents stay for the replay of this micro-batch: Spark does not wait for the
        # tasks it cancels, and one still writing records its file after this cleanup.
        clean_up(store, self._job(app_id, batchId), messages, aborted=True, keep_intents=True)
