"""A partition: its manifest log, its state, appends and range reads."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kstore import clock
from kstore.errors import (
    ConcurrentModificationError,
    CorruptLogError,
    InvalidArgumentError,
    InvalidRecordError,
    KStoreError,
    LayoutUpgradeRequiredError,
    MissingSegmentError,
    OffsetOutOfRangeError,
)
from kstore.log import Action, CommitResult, Log, RetryPolicy, protocol_action

# The manifest types live in kstore.manifest (no pyarrow there); they are part of this
# module's API too, and re-exported here.
from kstore.manifest import PRODUCER_EXPIRATION_MS as PRODUCER_EXPIRATION_MS
from kstore.manifest import AppendResult as AppendResult
from kstore.manifest import PartitionState as PartitionState
from kstore.manifest import ProducerBatch as ProducerBatch
from kstore.manifest import ProducerEntry as ProducerEntry
from kstore.manifest import Segment as Segment
from kstore.manifest import add_action, segment_location
from kstore.segments import (
    BINARY,
    FORMAT_ARROW,
    TIMESTAMP_TYPE,
    Layout,
    SegmentCache,
    SegmentFile,
    decode_segment,
    read_segment_data,
    read_segments,
    write_segment,
)
from kstore.settings import is_int

if TYPE_CHECKING:
    from kstore.storage import Storage
    from kstore.topic_log import TopicLog


class Partition:
    """One partition of one topic. Thread-safe; keeps the newest state it has seen."""

    def __init__(
        self,
        storage: Storage,
        topic: str,
        partition: int,
        directory: str,
        *,
        checkpoint_interval: int = 100,
        cache: SegmentCache | None = None,
        retry: RetryPolicy | None = None,
        layout: Layout = BINARY,
        topic_log: TopicLog | None = None,
    ) -> None:
        self.storage = storage
        # What the segments hold (binary, or a typed topic's columns); the store moves it to a
        # newer schema version when it sees one (never back: readers project older data).
        self.layout = layout
        self.topic = topic
        self.partition = partition
        self.directory = directory
        # Layout 3: the topic log this partition shares with others (it then has no log of
        # its own); layout 2: the partition's own log, read but never written.
        self.topic_log = topic_log
        self.log: Log[Any] = (
            topic_log.log
            if topic_log is not None
            else Log(
                storage,
                f"{directory}/_log",
                PartitionState,
                checkpoint_interval=checkpoint_interval,
                retry=retry,
            )
        )
        self.cache = cache or SegmentCache()
        self._state: PartitionState | None = None
        self._lock = threading.Lock()
        # When the cached state was last known to be the newest (monotonic seconds).
        self._confirmed = clock.monotonic()

    def __repr__(self) -> str:
        return f"Partition({self.topic!r}, {self.partition})"

    # -- state ---------------------------------------------------------------------------------

    def state(
        self, *, refresh: bool = True, max_age_s: float = 0.0, tail: bool = False
    ) -> PartitionState:
        """The newest state (polls the next log version by name unless ``refresh`` is False).
        ``max_age_s``: in layout 3, a topic log state confirmed newest less than that long
        ago is used as it is (the partitions of one topic log share one request per poll).
        ``tail``: a poll of a reader that looks again soon (``Log.update``)."""
        if self.topic_log is not None:
            shared = self.topic_log.state(refresh=refresh, max_age_s=max_age_s, tail=tail)
            return shared.partition(self.partition)
        with self._lock:
            current = self._state
        if current is None or (refresh and clock.monotonic() - self._confirmed > STALE_STATE_S):
            # Polling by name cannot step over log versions that vacuum deleted (17.5 of
            # PROTOCOL.md): a state not confirmed for that long is reloaded from a checkpoint.
            current = self.log.load()
            self._remember(current, confirmed=True)
        elif refresh:
            current = self.log.update(current, tail=tail)
            self._remember(current, confirmed=True)
        return current

    def _remember(self, state: PartitionState, *, confirmed: bool = False) -> None:
        with self._lock:
            if self._state is None or state.version >= self._state.version:
                self._state = state
                if confirmed:
                    self._confirmed = clock.monotonic()

    def end_offset(self) -> int:
        return self.state().end_offset

    def start_offset(self) -> int:
        return self.state().start_offset

    # -- writing -------------------------------------------------------------------------------

    def write_segment(
        self,
        table: pa.Table,
        *,
        compression: str = "uncompressed",
        durable: bool = True,
        fmt: str = FORMAT_ARROW,
        name: str | None = None,
    ) -> SegmentFile:
        """Write records to a new, not yet committed segment file (phase one of an append),
        named ``name`` when given (from :func:`kstore.segments.new_segment_name`)."""
        if self.topic_log is None:
            self._refuse_layout2()  # before a file no commit could ever name
        layout = self.layout
        if layout.typed and isinstance(table, pa.Table) and "value" in table.column_names:
            value = table.column("value")
            if value.type != layout.value:
                # Built under an older schema version (a writer's cached metadata): stored as
                # the newest one this partition knows, which can read it.
                from kstore.schema import IncompatibleSchemaError, project

                try:
                    projected = project(value, layout.value)
                except IncompatibleSchemaError as exc:
                    raise InvalidRecordError(f"{self.topic}-{self.partition}: {exc}") from None
                index = table.schema.get_field_index("value")
                table = table.set_column(index, layout.record_schema.field("value"), projected)
        return write_segment(
            self.storage,
            self.directory,
            table,
            compression=compression,
            durable=durable,
            fmt=fmt,
            layout=layout,
            name=name,
        )

    def append(
        self,
        table: pa.Table | pa.RecordBatch,
        *,
        compression: str = "uncompressed",
        durable: bool = True,
        producer: ProducerBatch | None = None,
        txn: tuple[str, int] | None = None,
        log_append_time: bool = False,
    ) -> AppendResult:
        """Append records as one segment and one commit; returns the offsets they got."""
        if isinstance(table, pa.RecordBatch):
            table = pa.Table.from_batches([table])
        if log_append_time:
            # LogAppendTime: the time the segment is written, a moment before its commit.
            stamp = pa.array([int(time.time() * 1_000_000)] * table.num_rows, TIMESTAMP_TYPE)
            if "timestamp" in table.column_names:
                table = table.set_column(
                    table.schema.get_field_index("timestamp"), "timestamp", stamp
                )
            else:
                table = table.append_column("timestamp", stamp)
        segment = self.write_segment(table, compression=compression, durable=durable)
        return self.commit_segments([segment], durable=durable, producer=producer, txn=txn)

    def commit_segments(
        self,
        files: Sequence[SegmentFile],
        *,
        durable: bool = True,
        producer: ProducerBatch | None = None,
        txn: tuple[str, int] | None = None,
        operation: str = "APPEND",
        transaction: str | None = None,
        written_at: float | None = None,
    ) -> AppendResult:
        """Publish written dense segments at the end of the log (phase two of an append).

        Offsets are assigned here, from the state the commit follows. A producer batch is
        checked for fencing and duplicates against that same state; a transaction identifier
        whose version is already committed makes this a no-op (exactly-once sinks).
        ``written_at``: when the oldest file's write started, by ``self.log.retry.clock``
        (:meth:`Log.commit` refuses files too old to commit).
        """
        outcome: dict[str, Any] = {}
        build = self.append_build(
            files, producer=producer, txn=txn, transaction=transaction, outcome=outcome
        )
        result = self._commit(build, operation=operation, durable=durable, written_at=written_at)
        if result is None:
            base, last = outcome["duplicate"]
            # The batch was committed before (a replayed micro-batch, an ambiguous retry).
            # Files of this attempt that no commit references are garbage; a file that the
            # earlier commit does reference (the same file, retried) must stay.
            state = self.state(refresh=False)
            live = {s.path for s in state.segments} | set(state.removed)  # removed: vacuum's job
            # A data object's range is not this partition's to delete: the object holds other
            # partitions' records (vacuum deletes it once nothing references it).
            self.storage.delete(
                [
                    f"{self.directory}/{f.path}"
                    for f in files
                    if f.path not in live and f.byte_range is None
                ]
            )
            return AppendResult(base, last, None, 0, duplicate=True)
        base, last, now = outcome["range"]
        return AppendResult(base, last, result.version, now)

    def append_build(
        self,
        files: Sequence[SegmentFile],
        *,
        producer: ProducerBatch | None = None,
        txn: tuple[str, int] | None = None,
        transaction: str | None = None,
        outcome: dict[str, Any],
    ) -> Callable[[PartitionState], list[Action] | None]:
        """The build of an append commit (see :meth:`commit_segments`), for a commit of one
        partition or, in layout 3, of several at once. After the commit ``outcome`` holds
        ``range`` (base, last, time) or ``duplicate`` (base, last) for this partition."""
        if not files:
            raise ValueError("commit_segments needs at least one segment")
        for f in files:
            if f.sparse:
                raise ValueError(f"{f.path}: only dense segments can be appended")

        def build(state: PartitionState) -> list[Action] | None:
            outcome.clear()  # rebuilt after every lost race: only the last build counts
            if txn is not None and state.txns.get(txn[0], -1) >= txn[1]:
                outcome["duplicate"] = (-1, -1)  # where that batch landed is not recorded
                return None
            if transaction is not None:
                pid, _, version = transaction.rpartition(":")
                if state.ended_transactions.get(pid, -1) >= int(version):
                    # An append that arrives after its transaction's marker must not reopen
                    # it (nothing would ever close it again).
                    raise ConcurrentModificationError(
                        f"{self.topic}-{self.partition}: transaction {transaction} has already ended here"
                    )
            if producer is not None:
                dup = producer.check(state)
                if dup is not None:
                    outcome["duplicate"] = (dup.base_offset, dup.last_offset)
                    return None
            now = int(time.time() * 1000)
            actions: list[Action] = [] if state.version >= 0 else [protocol_action()]
            offset = state.end_offset
            base = offset
            for f in files:
                actions.append(
                    add_action(
                        f.path,
                        offset,
                        offset + f.record_count - 1,
                        f.record_count,
                        f.min_timestamp_ms,
                        f.max_timestamp_ms,
                        f.size_bytes,
                        f.checksum,
                        f.format,
                        False,
                        now,
                        transaction=transaction,
                        byte_range=f.byte_range,
                    )
                )
                offset += f.record_count
            if producer is not None:
                actions.append(producer.action(base, offset - 1, now))
            if txn is not None:
                actions.append({"txn": {"appId": txn[0], "version": txn[1]}})
            outcome["range"] = (base, offset - 1, now)
            return actions

        return build

    def commit_actions(
        self, build: Any, *, operation: str, durable: bool = True, written_at: float | None = None
    ) -> CommitResult[PartitionState] | None:
        """A maintenance commit (compaction, retention, merging): ``build(state)`` returns the
        actions or None; it is re-run on every conflict against the newest state."""

        def guarded(state: PartitionState) -> list[Action] | None:
            actions: list[Action] | None = build(state)
            if actions is not None and state.version < 0:
                actions = [protocol_action(), *actions]
            return actions

        return self._commit(guarded, operation=operation, durable=durable, written_at=written_at)

    def delete_records(self, before_offset: int) -> int:
        """Kafka's DeleteRecords: records below ``before_offset`` are gone for every reader
        (``logStart``, 8.7); retention then removes the segments wholly below it. -1 means
        the end offset. Returns the log start offset after the commit (never lowered)."""
        if not is_int(before_offset):
            raise InvalidArgumentError(f"offset must be an integer, got {before_offset!r}")
        if before_offset < -1:
            raise InvalidArgumentError(f"offset must be -1 (the end) or >= 0, got {before_offset}")

        def build(state: PartitionState) -> list[Action] | None:
            target = state.end_offset if before_offset == -1 else before_offset
            if target > state.end_offset:
                raise OffsetOutOfRangeError(
                    f"{self.topic}-{self.partition}: offset {target} is past the end offset "
                    f"{state.end_offset}"
                )
            if target <= state.start_offset:
                return None  # the start offset only grows
            return [{"logStart": {"offset": target}}]

        self.commit_actions(build, operation="DELETE RECORDS")
        return self.state().start_offset

    def _commit(
        self, build: Any, *, operation: str, durable: bool, written_at: float | None = None
    ) -> CommitResult[PartitionState] | None:
        if self.topic_log is None:
            self._refuse_layout2()
        shared, _ = self.topic_log.commit(
            {self.partition: build},
            operation=operation,
            durable=durable,
            written_at=written_at,
            info={"partition": self.partition},
        )
        if shared is None:
            return None
        return CommitResult(
            shared.version,
            shared.state.partition(self.partition),
            shared.actions,
            shared.attempts,
        )

    def _refuse_layout2(self) -> NoReturn:
        # Layout 2 (a log of the partition's own) is read, never written (PROTOCOL.md 3.4).
        raise LayoutUpgradeRequiredError(
            f"{self.topic}-{self.partition}: the topic has layout 2, which this version reads "
            f"but no longer writes; run `kstore topics upgrade {self.topic}` to move it to "
            "layout 3 in place"
        )

    def end_transaction(self, producer_id: str, epoch: int, version: int, *, commit: bool) -> bool:
        """Write the marker that ends transaction ``version`` of a producer here: on commit its
        records become visible to read_committed readers; on abort its segments are removed in
        the same commit. Idempotent; the marker also fences older epochs of the producer.
        Returns True if a marker was written."""
        build = self.marker_build(producer_id, epoch, version, commit=commit)
        return (
            self.commit_actions(build, operation="COMMIT TXN" if commit else "ABORT TXN")
            is not None
        )

    def marker_build(
        self, producer_id: str, epoch: int, version: int, *, commit: bool
    ) -> Callable[[PartitionState], list[Action] | None]:
        """The build of a transaction marker commit (see :meth:`end_transaction`); in layout
        3 the markers of all the partitions of one topic log go in one commit."""
        key = f"{producer_id}:{version}"

        def build(state: PartitionState) -> list[Action] | None:
            entry = state.producers.get(producer_id)
            if key not in state.open_transactions and entry is not None and entry.epoch >= epoch:
                return None  # already ended here, and no older epoch left to fence
            now = int(time.time() * 1000)
            actions: list[Action] = []
            if not commit and key in state.open_transactions:
                # Only an open transaction's segments go: a state replayed from version 0
                # keeps the tag on segments whose transaction already committed, and a later
                # marker (a newer epoch fencing this producer) must never remove those.
                actions.extend(
                    {"remove": {"path": seg.path, "deletionTimestamp": now}}
                    for seg in state.segments
                    if seg.transaction == key
                )
            actions.append(
                {
                    "txnMarker": {
                        "producerId": producer_id,
                        "epoch": epoch,
                        "version": version,
                        "result": "commit" if commit else "abort",
                        "timestamp": now,
                    }
                }
            )
            return actions

        return build

    # -- reading -------------------------------------------------------------------------------

    def _prefetch(self, segments: Sequence[Segment], columns: list[str] | None) -> None:
        """Fetch the files of several segments concurrently (object stores), so a reader that
        is behind pays one round trip for a run of segments rather than one each."""
        if not self.storage.is_remote or len(segments) < 2:
            return
        missing = [
            s
            for s in segments
            if self.cache.get(f"{self.directory}/{cache_key(s, columns, self.layout)}") is None
        ]
        if len(missing) < 2:
            return
        found = read_segments(self.storage, self.directory, missing)
        for seg in missing:
            data = found.get(seg.path)
            if data is not None:
                self.read_segment(seg, columns, data=data)

    def read_segment(
        self, seg: Segment, columns: list[str] | None = None, *, data: bytes | None = None
    ) -> pa.Table:
        """A live segment's records (READ_SCHEMA), verified against its checksum."""
        key = f"{self.directory}/{cache_key(seg, columns, self.layout)}"
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        return self._decode_segment(seg, columns, key, data)

    def _decode_segment(
        self, seg: Segment, columns: list[str] | None, key: str, data: bytes | None
    ) -> pa.Table:
        """:meth:`read_segment` of a segment not in the cache (``key``, its cache key)."""
        layout = self.layout
        location = segment_location(self.directory, seg.path)
        where = f"{self.storage.display_url}/{location} ({self.topic}-{self.partition})"
        if data is None:
            try:
                data = read_segment_data(self.storage, self.directory, seg, where)
            except MissingSegmentError as exc:
                self._missing(seg, exc)
        table = decode_segment(
            data,
            where=where,
            expected_checksum=seg.checksum,
            fmt=seg.format,
            sparse=seg.sparse,
            base_offset=seg.base_offset,
            record_count=seg.record_count,
            columns=columns,
            layout=layout,
        )
        if seg.sparse and table.num_rows:
            offsets = table.column("offset") if "offset" in table.column_names else None
            if offsets is not None and (
                offsets[0].as_py() < seg.base_offset or offsets[-1].as_py() > seg.last_offset
            ):
                raise CorruptLogError(f"{where}: offsets outside the manifest range")
        self.cache.put(key, table)
        return table

    def _missing(self, seg: Segment, error: MissingSegmentError) -> NoReturn:
        """A segment's file is missing (PROTOCOL.md 24 item 8): the reader's state may be older
        than a merge, compaction or retention that replaced the segment and a vacuum that then
        deleted its file (``file.delete.delay.ms`` after the replacement, 23.1). The
        partition's newest state is loaded, once: if it no longer holds the segment, nothing
        is lost yet and SegmentReplacedError hands the reader that state, to read the
        segment's offsets from its live files; if it still holds it, a live segment is
        missing and ``error`` stands. The one place the rule lives: every read of a segment's
        file through a Partition comes here when the file is missing."""
        try:
            newest = self.state()
        except KStoreError as exc:
            # The log cannot be read either (a deleted topic whose logs were purged): the
            # segment is gone, as the read found.
            raise error from exc
        if _holds(newest, seg) or newest.end_offset <= seg.last_offset:
            # Still live: a live segment is missing. Or the log now ends before the segment,
            # where any newer state of it would reach past it: the log itself is gone (a
            # deleted topic's files purged), and so are the records.
            raise error
        raise SegmentReplacedError(
            f"{self.topic}-{self.partition}: segment {seg.path} (offsets {seg.base_offset}.."
            f"{seg.last_offset}) is no longer live at version {newest.version} of the log and "
            "its file was deleted; its records are read from that version's files",
            newest,
        ) from error

    def read_tables(
        self,
        start: int,
        stop: int,
        *,
        state: PartitionState | None = None,
        segments: Iterable[Segment] | None = None,
        columns: list[str] | None = None,
        keep: Callable[[Segment], bool] | None = None,
        data: Callable[[Segment], bytes | None] | None = None,
        gone: Callable[[int, PartitionState], None] | None = None,
        missing: Callable[[Segment, MissingSegmentError], None] | None = None,
    ) -> Iterator[tuple[Segment, pa.Table, int]]:
        """The live segments holding offsets in ``[start, stop)``, decoded, in offset order:
        each with ``position``, the first offset of it the reader has not been given yet (the
        records below it came from earlier segments). The segments are ``segments`` (a plan's,
        in offset order) or ``state``'s (default: the newest state); ``keep`` skips a segment
        (a pushed-down filter), ``data`` may give a segment's bytes (fetched ahead).

        When a segment's file is missing and the newest state no longer holds the segment
        (:meth:`_missing`), the rest of the range is read from that state's live segments, so
        a reader whose state or plan is older than a merge and vacuum returns every live
        record (PROTOCOL.md 24 item 8). Offsets compaction removed are simply absent there;
        offsets below its log start offset are gone (retention): ``gone(position, newest)``
        is called, by default raising OffsetOutOfRangeError, and the read goes on from the
        log start. A segment the newest state still holds is missing: ``missing(segment,
        error)`` is called, by default raising the error, and the read goes on after it."""
        source: Iterator[Segment] = (
            iter(segments)
            if segments is not None
            else _segments_from(state if state is not None else self.state(), start)
        )
        position = start
        while position < stop:
            seg = next(source, None)
            if seg is None or seg.base_offset >= stop:
                return
            if seg.last_offset < position:
                continue
            if keep is not None and not keep(seg):
                position = seg.last_offset + 1
                continue
            try:
                table = self.read_segment(seg, columns, data=None if data is None else data(seg))
            except SegmentReplacedError as exc:
                newest = exc.state
                if position < newest.start_offset:
                    (gone or self._gone)(position, newest)
                    position = newest.start_offset
                source = _segments_from(newest, position)
                continue
            except MissingSegmentError as exc:
                if missing is None:
                    raise
                missing(seg, exc)
                position = seg.last_offset + 1
                continue
            yield seg, table, position
            position = seg.last_offset + 1

    def _gone(self, position: int, newest: PartitionState) -> None:
        raise OffsetOutOfRangeError(
            f"{self.topic}-{self.partition}: offsets {position}..{newest.start_offset - 1} were "
            f"removed while they were being read; the log now starts at {newest.start_offset}"
        )

    def read(
        self,
        from_offset: int,
        max_records: int | None = None,
        *,
        max_bytes: int | None = None,
        end_offset: int | None = None,
        state: PartitionState | None = None,
        columns: list[str] | None = None,
        committed_only: bool = False,
    ) -> Iterator[pa.RecordBatch]:
        """Records at ``from_offset`` and after, as Arrow batches (READ_SCHEMA), up to
        ``max_records`` / ``max_bytes`` (at least one record is returned when any exists)
        and below ``end_offset`` (and, with ``committed_only``, below the last stable offset).
        Raises OffsetOutOfRangeError outside the live range."""
        for batch, _ in self.read_sized(
            from_offset,
            max_records,
            max_bytes=max_bytes,
            end_offset=end_offset,
            state=state,
            columns=columns,
            committed_only=committed_only,
        ):
            yield batch

    def read_sized(
        self,
        from_offset: int,
        max_records: int | None = None,
        *,
        max_bytes: int | None = None,
        end_offset: int | None = None,
        state: PartitionState | None = None,
        columns: list[str] | None = None,
        committed_only: bool = False,
    ) -> Iterator[tuple[pa.RecordBatch, int]]:
        """:meth:`read`, each batch with its size in bytes as the byte budget counts it: its
        share of its decoded segment's buffers (``Table.nbytes`` of every slice costs more
        than the read of a small range)."""
        state = state or self.state()
        if from_offset < state.start_offset or from_offset > state.end_offset:
            raise OffsetOutOfRangeError(
                f"{self.topic}-{self.partition}: offset {from_offset} is outside the live range "
                f"[{state.start_offset}, {state.end_offset}]"
            )
        stop = state.end_offset if end_offset is None else min(end_offset, state.end_offset)
        if committed_only:
            stop = min(stop, state.last_stable_offset)
        remaining = max_records if max_records is not None else 1 << 62
        budget = max_bytes if max_bytes is not None else 1 << 62
        want = columns if columns is None or "offset" in columns else [*columns, "offset"]
        i = state.segment_index_for(from_offset)
        ahead: list[Segment] = []
        expected = 0
        # Fetched ahead: what the read may reach, and no more than half the (bounded) segment
        # cache, or the segments fetched first are evicted by the last before they are read.
        ahead_bytes = min(budget, self.cache.max_bytes // 2)
        for seg in state.segment_slice(i, i + 32):
            if expected >= remaining or seg.base_offset >= stop or ahead_bytes <= 0:
                break
            ahead.append(seg)
            expected += seg.record_count
            ahead_bytes -= seg.size_bytes
        self._prefetch(ahead, want)
        if remaining <= 0:
            return
        for seg, table, position in self.read_tables(from_offset, stop, state=state, columns=want):
            rows = table.num_rows
            if seg.sparse:
                offsets = table.column("offset")
                lo = _search(offsets, position)
                hi = _search(offsets, stop)
            else:
                lo = max(0, position - seg.base_offset)
                hi = min(rows, stop - seg.base_offset)
            hi = min(hi, lo + remaining)
            if hi <= lo:
                continue
            per_row = max(1, table.get_total_buffer_size() // max(rows, 1))
            count = hi - lo
            trimmed = False
            if budget < count * per_row:
                # Trim to the byte budget, but never below one record so a reader progresses.
                keep = max(1, budget // per_row)
                trimmed = keep < count
                count = min(count, keep)
            piece = table.slice(lo, count)
            for batch in piece.to_batches():
                yield batch, batch.num_rows * per_row
            remaining -= count
            budget -= count * per_row
            # Stop once the budget cut this segment short: going on to the next segment would
            # skip the rest of this one and leave a gap in what the reader sees.
            if remaining <= 0 or budget <= 0 or trimmed:
                return

    def offset_for_timestamp(
        self, timestamp_ms: int, state: PartitionState | None = None
    ) -> int | None:
        """The earliest offset whose timestamp is at or after ``timestamp_ms`` (Kafka's
        offsetsForTimes), or None when no record is that new."""
        state = state or self.state()
        i = state.segments_for_time(timestamp_ms)
        target = pa.scalar(timestamp_ms * 1000, pa.timestamp("us", tz="UTC"))
        while i < len(state.segments):
            seg = state.segments[i]
            i += 1
            if seg.max_timestamp_ms < timestamp_ms:
                continue
            try:
                table = self.read_segment(seg, ["timestamp", "offset"])
            except SegmentReplacedError as exc:
                # Replaced and vacuumed since ``state`` (PROTOCOL.md 24 item 8): the answer
                # is looked up again in the newest state's live files.
                state = exc.state
                i = state.segments_for_time(timestamp_ms)
                continue
            mask = pc.greater_equal(table.column("timestamp"), target)
            index = pc.index(mask, True).as_py()
            if index is not None and index >= 0:
                offset: int = table.column("offset")[index].as_py()
                return max(offset, state.start_offset)
        return None


# A segment prefetch reads: its partition, the segment and its cache key (not in the cache).
_Wanted = tuple[Partition, Segment, str]


def prefetch(
    reads: Sequence[tuple[Partition, PartitionState, int, int]],
    *,
    max_bytes: int,
    partition_max_bytes: int | None = None,
    columns: list[str] | None = None,
) -> None:
    """Fetch at once the segments several partitions are about to read (each read is a
    partition, its state, the position and the end it reads to), so that a reader of many
    partitions on an object store pays one round trip for all of them, not one each: whole
    files concurrently, the ranges of each data object coalesced (PROTOCOL.md 11.7). Decoded
    into the partitions' caches; a segment that cannot be fetched here is read (and its error
    raised) by the read itself.

    At most ``max_bytes`` in all and ``partition_max_bytes`` a partition, as the reads that
    follow, and at most half the segment cache: the cache is bounded, and fetching more than
    it holds would evict what this same fetch decoded before the reads reach it, to be read
    and decoded again."""
    wanted: list[_Wanted] = []
    if not reads:
        return
    budget = min(max_bytes, reads[0][0].cache.max_bytes // 2)
    for partition, state, position, end in reads:
        if position >= end:
            continue  # caught up: most partitions of a tailing reader, at every poll
        remote = partition.storage.is_remote
        own = budget if partition_max_bytes is None else min(budget, partition_max_bytes)
        i = state.segment_index_for(position)
        for seg in state.segment_slice(i, i + 32):
            if seg.base_offset >= end or budget <= 0 or own <= 0:
                break
            if not remote and seg.byte_range is None:
                continue  # a local file costs no round trip; local ranges share one open
            key = f"{partition.directory}/{cache_key(seg, columns, partition.layout)}"
            if partition.cache.get(key) is None:
                wanted.append((partition, seg, key))
            # Cached or not, the reads below spend the segment's bytes of their budget.
            budget -= seg.size_bytes
            own -= seg.size_bytes
    if len(wanted) < 2:
        return
    storage = wanted[0][0].storage
    whole: dict[str, _Wanted] = {}
    ranged: dict[str, list[_Wanted]] = {}
    for item in wanted:
        partition, seg, _ = item
        location = segment_location(partition.directory, seg.path)
        if seg.byte_range is None:
            whole[location] = item
        else:
            ranged.setdefault(location, []).append(item)

    def fetch_object(location: str) -> list[tuple[_Wanted, bytes]]:
        members = ranged[location]
        spans = [
            (seg.byte_range[0], seg.byte_range[0] + seg.byte_range[1])
            for _, seg, _ in members
            if seg.byte_range is not None
        ]
        try:
            pieces = storage.read_ranges(location, spans)
        except (FileNotFoundError, KStoreError):
            return []
        return list(zip(members, pieces, strict=True))

    fetched: list[tuple[_Wanted, bytes]] = []
    if whole:
        try:
            found = storage.read_many(list(whole))
        except KStoreError:
            found = {}
        fetched.extend((whole[loc], data) for loc, data in found.items())
    # Commits that carry their data were kept when the log read them: their ranges cost no
    # request, and a tailing reader's are almost all such. Threads only for the others.
    requested = [loc for loc in ranged if storage.is_remote and not storage.remembers(loc)]
    concurrent_reads = requested if len(requested) > 1 else []
    for location in ranged.keys() - set(concurrent_reads):
        fetched.extend(fetch_object(location))
    if concurrent_reads:
        with concurrent.futures.ThreadPoolExecutor(min(8, len(concurrent_reads))) as pool:
            for part in pool.map(fetch_object, concurrent_reads):
                fetched.extend(part)
    for (partition, seg, key), data in fetched:
        if seg.byte_range is not None and len(data) != seg.byte_range[1]:
            continue  # cut short: the read itself reports it
        partition._decode_segment(seg, columns, key, data)


# A cached state not confirmed as the newest for this long is reloaded from a checkpoint
# before it is used: vacuum keeps log versions at least twice as long (PROTOCOL.md 17.5).
STALE_STATE_S = 24 * 3600.0


class SegmentReplacedError(MissingSegmentError):
    """A segment a reader's state names is missing from storage and no longer live in the
    partition's newest state: a merge, compaction or retention replaced it and vacuum
    deleted its file after ``file.delete.delay.ms`` (PROTOCOL.md 23.1). Nothing is lost: the
    reader reads those offsets from ``state``, the newest state, as
    :meth:`Partition.read_tables` does (24 item 8). A reader that cannot (a maintenance job
    that planned a rewrite of the segment) stands down: the next run plans again."""

    def __init__(self, message: str, state: PartitionState) -> None:
        super().__init__(message)
        self.state = state


def _holds(state: PartitionState, seg: Segment) -> bool:
    """Whether ``seg`` (the same file or range, at the same offsets) is live in ``state``."""
    i = state.segment_index_for(seg.base_offset)
    found = state.segment_slice(i, i + 1)
    return bool(found) and (found[0].path, found[0].byte_range, found[0].base_offset) == (
        seg.path,
        seg.byte_range,
        seg.base_offset,
    )


def _segments_from(state: PartitionState, offset: int) -> Iterator[Segment]:
    """``state``'s live segments from the one holding ``offset`` on, a window at a time (a
    tailing reader reads a few at the end of thousands, between merges)."""
    i = state.segment_index_for(offset)
    while True:
        window = state.segment_slice(i, i + 32)
        if not window:
            return
        yield from window
        i += len(window)


def cache_key(seg: Segment, columns: list[str] | None, layout: Layout) -> str:
    # Decoded tables depend on the schema version they were projected onto.
    key = seg.path if not layout.typed else f"{seg.path}@{layout.schema_id}"
    return key if columns is None else f"{key}|{','.join(columns)}"


def _search(offsets: pa.ChunkedArray | pa.Array, value: int) -> int:
    """First index whose offset is >= value (offsets are strictly increasing)."""
    array = offsets.combine_chunks() if isinstance(offsets, pa.ChunkedArray) else offsets
    return int(np.searchsorted(array.to_numpy(zero_copy_only=False), value, side="left"))
