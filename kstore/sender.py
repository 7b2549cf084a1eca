"""The sender (Kafka's ``Sender``): a thread that drains the accumulator's batches into
deliveries, writes each topic log's part of a delivery as data its commit carries or as one
data object, commits it (with the producer id, epoch and sequences that make retries
idempotent), retries with backoff, and completes the records' futures.

It is given its parts: the accumulator it drains (:mod:`kstore.accumulator`), the transaction
manager (:mod:`kstore.transaction_manager`) it asks for each write's producer batches and
tells of each failure, and the function that gives a topic's metadata; none of them knows
the sender.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from kstore.accumulator import (
    Batch,
    RecordAccumulator,
    build_table,
    by_partition,
    merge,
    share_outcome,
    sort_key,
)
from kstore.commit_share import CommitShare, Outcome, carried_parts, default_takeover_ms
from kstore.errors import KStoreError, UnknownTopicOrPartitionError
from kstore.log import CARRIED, may_carry_data
from kstore.partitioner import NO_PARTITION, Partitioner, StickyPartitioner
from kstore.producer_metadata import Backoff, TopicInfo
from kstore.schema import key_bytes
from kstore.segments import (
    TIMESTAMP_TYPE,
    SegmentFile,
    encode_data_object,
    fixed_array,
    new_data_object_name,
    numpy_values,
    put_data_object,
    write_data_object,
)
from kstore.storage import Storage
from kstore.store import Store
from kstore.topic_log import TopicLogState
from kstore.transaction_manager import TransactionManager

log = logging.getLogger("kstore.producer")


def default_in_flight(storage: Storage, durable: bool) -> int:
    """Writes at once when max_in_flight_partitions is not set. A write that waits
    (on the network of an object store, or on fsync for acks="all") overlaps with others: eight.
    Otherwise, on local disk or in memory, a write is CPU work, much of it under the GIL, and
    more writers than cores only queue for both: on two cores, two writers send 7-9% more
    records per second than eight at acks=1, and 7% fewer at acks="all"."""
    if durable or storage.is_remote:
        return 8
    affinity = getattr(os, "sched_getaffinity", None)
    cores = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    return min(8, cores)


@dataclass(frozen=True)
class _Data:
    """One topic log's part of a flush, ready to commit: its ranges; when the data object's
    write started (by the retry policy's clock, which bounds how long it may wait for its
    commit); or, instead of a data object, the bytes the commit carries."""

    files: dict[int, SegmentFile]
    written_at: float
    carried: bytes | None


def _carries_data(state: TopicLogState) -> bool:
    """Whether a commit to this topic log may carry its data: the log exists (its first
    commit sets its versions) at reader version 5 and writer version 6."""
    return state.version >= 0 and may_carry_data(state)


@dataclass(eq=False)
class _Delivery:
    """A group of batches on its way: its records placed, its topic-log writes submitted."""

    group: list[Batch]
    batch: Batch  # the group's only batch, or all of them merged
    error: BaseException | None = None  # failed before its writes were submitted
    order: np.ndarray[Any, Any] = field(default_factory=lambda: np.zeros(0, np.int64))
    jobs: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition -> (start, count)
    # Partition -> its write's outcome (``result()`` gives its base offset and log start).
    writes: dict[int, _LogWriteOutcome] = field(default_factory=dict)
    # What it waits on: the topic-log writes (a few, however many partitions: the sender
    # looks at these after every wakeup).
    waits: list[concurrent.futures.Future[Any]] = field(default_factory=list)

    def written(self) -> bool:
        return all(wait.done() for wait in self.waits)


class Sender:
    """The producer's sender thread: batches in, data and commits out.

    ``topic_info`` gives the metadata of a topic a delivery goes to (the producer's cached
    metadata); ``max_in_flight``: the pool threads that write topic logs at once (see
    :func:`default_in_flight`). ``metrics`` holds the counters the producer reports."""

    def __init__(
        self,
        store: Store,
        accumulator: RecordAccumulator,
        transactions: TransactionManager,
        topic_info: Callable[[str], TopicInfo],
        *,
        partitioner: Partitioner,
        backoff: Backoff,
        max_in_flight: int,
        client_id: str,
        acks: int | str = 1,
        linger_ms: int = 5,
        delivery_timeout_ms: int = 120_000,
        retries: int = 2_147_483_647,
        shared_commits: bool = True,
        takeover_ms: int | None = None,
    ) -> None:
        self.store = store
        self._accumulator = accumulator
        self._transactions = transactions
        self._topic_info = topic_info
        self._partitioner = partitioner
        self._sticky = StickyPartitioner()
        self._backoff = backoff
        self._client_id = client_id
        self._acks = acks
        self._durable = acks == "all"
        self._linger_s = linger_ms / 1000
        self._delivery_timeout_s = delivery_timeout_ms / 1000
        self._retries = retries
        self._shared_commits = shared_commits
        self._takeover_s = (
            takeover_ms if takeover_ms is not None else default_takeover_ms(store.storage)
        ) / 1000
        # Each topic log's share of commits with its other writers, by (topic, id, log index).
        self._shares: dict[tuple[str, str, int], CommitShare] = {}
        self._shares_lock = threading.Lock()
        # The last write of each topic log, by (topic, log index): the next waits for it.
        self._last_write: dict[
            tuple[str, int], concurrent.futures.Future[dict[int, tuple[int, int] | BaseException]]
        ] = {}
        self.metrics: dict[str, float] = {
            "record-send-total": 0,
            "record-error-total": 0,
            "record-retry-total": 0,
            "batch-total": 0,
            "commit-total": 0,
            "commit-time-total-ms": 0.0,
            "byte-total": 0,
        }
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_in_flight, thread_name_prefix=f"kstore-{client_id}"
        )
        self._thread = threading.Thread(
            target=self._run, name=f"kstore-sender-{client_id}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout: float | None = None) -> None:
        """Wait (at most ``timeout``) for the thread, which stops once the accumulator is
        closed and drained, then for the writes on the pool."""
        self._thread.join(timeout)
        self._pool.shutdown(wait=True)
        with self._shares_lock:
            shares = list(self._shares.values())
        for share in shares:
            share.close(timeout)

    def _share(self, info: TopicInfo, index: int, incarnation_dir: str) -> CommitShare:
        meta = info.metadata
        key = (meta.name, meta.topic_id, index)
        with self._shares_lock:
            share = self._shares.get(key)
            if share is None:
                share = self._shares[key] = CommitShare(
                    self.store.topic_log(meta.name, meta, index),
                    self.store.storage,
                    incarnation_dir=incarnation_dir,
                    partitions=meta.partitions,
                    commit_logs=meta.commit_logs,
                    takeover_s=self._takeover_s,
                    metrics=self.metrics,
                    client_id=self._client_id,
                )
            return share

    def _write_shared(
        self,
        info: TopicInfo,
        index: int,
        tables: dict[int, pa.Table],
        written: _Data,
        producers: dict[int, Any],
        transaction: str | None,
        deadline: float,
    ) -> dict[int, Outcome] | None:
        """The flush committed through the topic log's share of commits (PROTOCOL.md 30), or
        None where it cannot be: sharing is off, the flush is not carried data of an idempotent
        producer, or the log is below writer version 8."""
        if not self._shared_commits or written.carried is None or set(producers) != set(tables):
            return None
        meta = info.metadata
        first = self.store.partition(meta.name, next(iter(tables)), meta)
        share = self._share(info, index, first.directory.rsplit("/", 1)[0])
        if not share.eligible(self.store.topic_log(meta.name, meta, index).state(refresh=False)):
            return None
        flush = share.new_flush(
            carried_parts(written.files, producers, transaction),
            written.carried,
            durable=self._durable,
            compression=info.compression,
        )
        return share.write(flush, deadline)

    def _run(self) -> None:
        """The sender: drains batches into deliveries, one group at a time. While a delivery
        is written, new records keep filling their batches (unless a full batch waits or a
        flush is asked for): cut when the write ends, they go out in one delivery after one
        write's wait. A delivery's writes run on the pool while the sender converts the next
        group where that pays (see ``_overlaps``); it is finished (offsets given out, futures
        completed, buffer released) once the next one has started, or before it starts where
        they do not overlap or its writes are done, or as soon as its writes are done when
        nothing else is queued."""
        drain = self._accumulator.drain
        linger = self._linger_s
        pending: _Delivery | None = None
        while True:
            work = drain(linger, None if pending is None else pending.written)
            if work is None:
                return
            # A delivery already written is finished first: its acknowledgements do not
            # wait for the next group's conversion.
            overlap = self._overlaps(work) and not (pending is not None and pending.written())
            for group in self._groups(work):
                if pending is not None and not overlap:
                    self._finish(pending)
                    pending = None
                started = self._start(group)
                if pending is not None:
                    self._finish(pending)
                pending = started
            if not work and pending is not None:
                self._finish(pending)
                pending = None

    def _overlaps(self, work: list[Batch]) -> bool:
        """Whether to convert the groups of ``work`` (the batches taken at once) while the
        delivery before each is still being written, rather than after it. Overlapping pays
        when those writes wait: on an object store (the requests), or when the sender has
        fallen behind (a full batch or more taken, the producer filling batches faster than
        they go out), where conversion and writes both release the GIL for long stretches. A
        producer that keeps up on a local disk takes a few records at a time, whose commits
        are CPU work under the GIL: converting the next group beside one delays it, and a
        record's acknowledgement waits for about three such commits instead of two
        (benchmarks/ack_latency.py: at 5,000 records/s on 64 partitions, p50 a fifth lower
        finished first; on 1 and 8 alike within the noise)."""
        if self.store.storage.is_remote:
            return True
        return sum(batch.nbytes for batch in work) >= self._accumulator.batch_size

    def _groups(self, work: list[Batch]) -> Iterator[list[Batch]]:
        """Queued batches in delivery groups: consecutive batches of ``send()`` to one topic
        go together (up to four batch sizes, and a quarter of buffer_memory so that the next
        group fills while this one is written), one commit per topic log
        for all of them. A sender that fell behind catches up: the cost of a delivery is
        mostly per commit, not per record."""
        limit = min(4 * self._accumulator.batch_size, self._accumulator.buffer_memory // 4)
        group: list[Batch] = []
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

    def _start(self, group: list[Batch]) -> _Delivery:
        """Convert and place a group's records and submit its topic-log writes. Never raises:
        a group that fails here is finished with the error."""
        delivery = _Delivery(group, group[0])
        try:
            info = self._topic_info(delivery.batch.topic)
            if len(group) > 1:
                delivery.batch = merge(group, info.layout)
            self._submit(delivery, info)
        except BaseException as exc:  # never leave a future hanging
            delivery.error = exc
        return delivery

    def _submit(self, delivery: _Delivery, info: TopicInfo) -> None:
        batch = delivery.batch
        n_parts = info.metadata.partitions
        table = batch.table if batch.table is not None else build_table(batch, info.layout)
        if info.log_append_time:
            now_us = int(time.time() * 1_000_000)
            table = table.set_column(
                table.schema.get_field_index("timestamp"),
                "timestamp",
                fixed_array(np.full(table.num_rows, now_us, np.int64), TIMESTAMP_TYPE),
            )
        stamps: Any = numpy_values(table.column("timestamp"), np.int64)  # microseconds
        batch.timestamp_of = stamps // 1000
        parts = self._place(batch, table, n_parts)
        batch.partition_of = parts
        if self._acks == 0:
            batch.acks0 = True
        delivery.order = np.argsort(sort_key(parts, n_parts), kind="stable")
        counts = np.bincount(parts, minlength=n_parts)
        start = 0
        for nonzero in np.nonzero(counts)[0]:
            p = int(nonzero)
            count = int(counts[p])
            delivery.jobs[p] = (start, count)
            start += count
        # Built here from send() records, the table holds them alone (_by_partition).
        pieces = by_partition(table, parts, n_parts, compact=batch.table is None)
        deadline = batch.created + self._delivery_timeout_s
        tag = self._transactions.add_partitions(batch.topic, delivery.jobs)
        self._submit_writes(delivery, info, pieces, deadline, tag)

    def _submit_writes(
        self,
        delivery: _Delivery,
        info: TopicInfo,
        pieces: dict[int, pa.Table],
        deadline: float,
        tag: str | None,
    ) -> None:
        """One data object (or carried data) and one commit per topic log for all the
        partitions of the delivery in that log (PROTOCOL.md 12.7), whatever their number."""
        topic, meta = delivery.batch.topic, info.metadata
        by_log: dict[int, dict[int, pa.Table]] = {}
        for p in delivery.jobs:
            by_log.setdefault(p % meta.commit_logs, {})[p] = pieces[p]
        inline = self._writes_inline(delivery, len(by_log))
        for index, tables in by_log.items():
            # Writes to one topic log are chained: commits, sequences and epochs stay in send
            # order.
            key = (topic, index)
            previous = self._last_write.get(key)
            job: concurrent.futures.Future[dict[int, tuple[int, int] | BaseException]]
            if inline and (previous is None or previous.done()):
                job = concurrent.futures.Future()
                try:
                    job.set_result(self._chained_write(None, info, index, tables, deadline, tag))
                except BaseException as exc:  # as the pool would: the outcome is the future's
                    job.set_exception(exc)
            else:
                job = self._pool.submit(
                    self._chained_write, previous, info, index, tables, deadline, tag
                )
            self._last_write[key] = job
            for p in tables:
                delivery.writes[p] = _LogWriteOutcome(job, p)
            job.add_done_callback(self._on_written)
            delivery.waits.append(job)

    def _writes_inline(self, delivery: _Delivery, logs: int) -> bool:
        """Whether the sender writes a delivery to one topic log itself rather than on the
        pool: when it would not overlap the delivery with the next (``_overlaps``), the write
        is CPU work under the GIL that the sender only waits for, and handing it to a pool
        thread and back costs two thread switches a flush (about 0.1 ms of CPU for the two
        on a 2-core machine) and adds their wakeups to every record's latency."""
        return logs == 1 and not self._overlaps(delivery.group)

    def _chained_write(
        self,
        previous: concurrent.futures.Future[dict[int, tuple[int, int] | BaseException]] | None,
        info: TopicInfo,
        index: int,
        tables: dict[int, pa.Table],
        deadline: float,
        transaction: str | None,
    ) -> dict[int, tuple[int, int] | BaseException]:
        # The data object is written before waiting for the previous delivery to this topic
        # log: only commits must keep their order, so this delivery's upload overlaps that
        # delivery's commit (on an object store, one request of latency per flush). Failing
        # here is not final: the write is retried with the commit below.
        early: _Data | None = None
        if previous is not None:
            with contextlib.suppress(KStoreError):
                early = self._write_data(info, tables)
            concurrent.futures.wait([previous])
        try:
            results = self._write_log(info, index, tables, deadline, transaction, early)
        except Exception as exc:
            self._transactions.on_write_failure(exc)
            raise
        for outcome in results.values():
            if isinstance(outcome, BaseException):
                self._transactions.on_write_failure(outcome)
                break
        return results

    def _write_log(
        self,
        info: TopicInfo,
        index: int,
        tables: dict[int, pa.Table],
        deadline: float,
        transaction: str | None = None,
        written: _Data | None = None,
    ) -> dict[int, tuple[int, int] | BaseException]:
        """Write the partitions of one topic log as one data object, or as data the commit
        carries (PROTOCOL.md 11.8), and commit them in one commit; retried as a whole
        (sequences make a retry of a landed commit a duplicate). A partition the commit
        refuses (fenced, out of order) fails alone. ``written``: the data already written or
        encoded (:meth:`_write_data`)."""
        meta = info.metadata
        topic = meta.name
        partitions = {p: self.store.partition(topic, p, meta) for p in tables}
        shared = self.store.topic_log(topic, meta, next(iter(tables)))
        producers = self._transactions.producer_batches(
            topic, {p: table.num_rows for p, table in tables.items()}
        )
        retry = shared.log.retry
        attempt = 0
        while True:
            try:
                if (
                    written is not None
                    and written.carried is None
                    and retry.too_old(written.written_at)
                ):
                    log.warning(
                        "producer %s: %s data object too old to commit; writing it again",
                        self._client_id,
                        topic,
                    )
                    written = None
                if written is None:
                    written = self._write_data(info, tables)
                files = written.files
                self._transactions.check_not_fenced()
                shared_outcomes = self._write_shared(
                    info, index, tables, written, producers, transaction, deadline
                )
                if shared_outcomes is not None:
                    for p, outcome in shared_outcomes.items():
                        if not isinstance(outcome, BaseException):
                            self._transactions.landed(topic, p, producers[p])
                    return shared_outcomes
                outcomes: dict[int, dict[str, Any]] = {p: {} for p in tables}
                builds = {
                    p: partitions[p].append_build(
                        [files[p]],
                        producer=producers.get(p),
                        transaction=transaction,
                        outcome=outcomes[p],
                    )
                    for p in tables
                }
                started = time.monotonic()
                result, refused = shared.commit(
                    builds,
                    operation="APPEND",
                    durable=self._durable,
                    # Carried data was written by no one yet: no deadline of 23.1 applies.
                    written_at=None if written.carried is not None else written.written_at,
                    isolate=True,
                    background_checkpoint=True,
                    data=written.carried,
                )
                self.metrics["commit-total"] += 1
                self.metrics["commit-time-total-ms"] += (time.monotonic() - started) * 1000
                state = result.state if result is not None else shared.state(refresh=False)
                results: dict[int, tuple[int, int] | BaseException] = {}
                for p in tables:
                    if p in refused:
                        results[p] = refused[p]
                        continue
                    landed = outcomes[p].get("range") or outcomes[p].get("duplicate")
                    if landed is None:
                        # Neither refused nor built: the commit left it out (TopicLog.commit
                        # keeps every partition it does not refuse). Its own failure, never
                        # the landed partitions': they are acknowledged below.
                        results[p] = KStoreError(
                            f"{topic}-{p}: the commit of topic log {index} (version "
                            f"{state.version}) neither holds this partition's records nor "
                            "refused them; they were not written"
                        )
                        continue
                    # The partition's own state, read only: no view made per partition.
                    raw = state.partitions.get(p)
                    results[p] = (landed[0], 0 if raw is None else raw.start_offset)
                    producer = producers.get(p)
                    if producer is not None:
                        self._transactions.landed(topic, p, producer)
                return results
            except KStoreError as exc:
                rows = sum(t.num_rows for t in tables.values())
                attempt = self._retry_or_raise(exc, attempt, deadline, rows, f"{topic} log {index}")

    def _write_data(self, info: TopicInfo, tables: dict[int, pa.Table]) -> _Data:
        """The data of one topic log's part of a flush: carried by its commit when it is small
        enough and the log is at version 5/6 (PROTOCOL.md 11.8), else one data object written
        now (11.7)."""
        meta = info.metadata
        first = self.store.partition(meta.name, next(iter(tables)), meta)
        shared = self.store.topic_log(meta.name, meta, first.partition)
        parts = [(p, tables[p], first.layout) for p in sorted(tables)]
        incarnation_dir = first.directory.rsplit("/", 1)[0]
        limit = int(meta.effective_config["commit.inline.bytes"])
        if limit > 0 and _carries_data(shared.state(refresh=False)):
            data, files = encode_data_object(parts, CARRIED, compression=info.compression)
            if len(data) <= limit:
                blob = data if isinstance(data, bytes) else memoryview(data).tobytes()
                return _Data(files, 0.0, blob)
            # Too large to carry: the same bytes go to a data object (not encoded again).
            written_at = shared.log.retry.clock()
            name = new_data_object_name()
            put_data_object(
                self.store.storage, f"{incarnation_dir}/{name}", data, durable=self._durable
            )
            named = {p: dataclasses.replace(f, path=name) for p, f in files.items()}
            return _Data(named, written_at, None)
        written_at = shared.log.retry.clock()
        files = write_data_object(
            self.store.storage,
            incarnation_dir,
            parts,
            compression=info.compression,
            durable=self._durable,
        )
        return _Data(files, written_at, None)

    def _on_written(self, _: concurrent.futures.Future[Any]) -> None:
        self._accumulator.wake()  # the sender may be waiting to finish a delivery

    def _finish(self, delivery: _Delivery) -> None:
        """Wait for a delivery's writes, give every record its outcome, release its buffer."""
        group, batch = delivery.group, delivery.batch
        try:
            if delivery.error is not None:
                concurrent.futures.wait(delivery.waits)  # any it submitted end first
                raise delivery.error
            self._assign_offsets(delivery)
        except BaseException as exc:  # never leave a future hanging
            log.exception("producer %s: batch for %r failed", self._client_id, batch.topic)
            batch.fatal = exc
            for each in group:
                each.fatal = exc
                self.metrics["record-error-total"] += len(each)
        finally:
            if batch is not group[0]:
                share_outcome(batch, group)
            for each in group:
                each.complete()
            self._accumulator.release(group)

    def _assign_offsets(self, delivery: _Delivery) -> None:
        batch, jobs, order = delivery.batch, delivery.jobs, delivery.order
        # One row per partition of the delivery, in the order of ``jobs`` (partition order,
        # the order of the sorted records); each row's base is looked up by its partition.
        # ``writes`` is in no such order (it is filled one topic log at a time: with
        # commit.logs > 1, partitions 0, 2, 1 for three partitions in two logs), so pairing
        # it with ``jobs`` by position would hand records another partition's offsets.
        bases = np.zeros(len(jobs), np.int64)
        for j, (p, (_, size)) in enumerate(jobs.items()):
            try:
                bases[j], batch.log_start[p] = delivery.writes[p].result()
            except Exception as exc:  # this partition's records fail, not the delivery's
                if not isinstance(exc, KStoreError):
                    log.error(
                        "producer %s: %s-%d failed", self._client_id, batch.topic, p, exc_info=exc
                    )
                batch.errors[p] = exc
                self.metrics["record-error-total"] += size
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
        self.metrics["batch-total"] += 1
        self.metrics["record-send-total"] += len(order)
        self.metrics["byte-total"] += batch.nbytes

    def _place(self, batch: Batch, table: pa.Table, n_parts: int) -> np.ndarray[Any, Any]:
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

    def _retry_or_raise(
        self, exc: KStoreError, attempt: int, deadline: float, rows: int, what: str
    ) -> int:
        """After a failed write attempt: raise ``exc`` when it is final (not retriable, out of
        retries or past the delivery deadline), else back off and return the next attempt."""
        if not exc.retriable or attempt >= self._retries or time.monotonic() >= deadline:
            raise exc
        attempt += 1
        self.metrics["record-retry-total"] += rows
        log.warning(
            "producer %s: %s attempt %d failed (%s); retrying", self._client_id, what, attempt, exc
        )
        time.sleep(min(self._backoff.seconds(attempt), max(0.0, deadline - time.monotonic())))
        return attempt


class _LogWriteOutcome:
    """One partition's outcome of a topic log's write, read from that write's
    future when asked. A future per partition (a condition, a lock, a deque and a handful of
    bound methods each) was most of what a delivery to many partitions left for the garbage
    collector to promote and scan."""

    __slots__ = ("_job", "_partition")

    def __init__(
        self,
        job: concurrent.futures.Future[dict[int, tuple[int, int] | BaseException]],
        partition: int,
    ) -> None:
        self._job, self._partition = job, partition

    def result(self) -> tuple[int, int]:
        outcome = self._job.result()[self._partition]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
