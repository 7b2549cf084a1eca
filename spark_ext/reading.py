"""Planning and executing reads: topic-partitions, offset ranges, read tasks, Arrow batches.

The driver side (:class:`Resolver`, :func:`plan_tasks`) works from partition manifests only: a
manifest says, for every live segment, its offset range, record count, timestamp range and
size, so offsets, limits and splits are decided without opening a segment file (timestamp
lookups excepted: they open the one segment that holds the answer). Each streaming read task
carries the manifest entries of the segments it reads, so executors read the planned snapshot
and touch no manifest, unless a planned file is gone: a merge, compaction or retention replaced
it and vacuum deleted it before the task ran (a late task, a retried one). The task then loads
the partition's newest state and reads the rest of its range from the live files
(:meth:`kstore.partition.Partition.read_tables`, PROTOCOL.md 24 item 8); only offsets below
the log start offset are data loss.
"""

from __future__ import annotations

import concurrent.futures
import functools
import itertools
import logging
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from kstore.errors import (
    InvalidArgumentError,
    InvalidTopicError,
    KStoreError,
    MissingSegmentError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from kstore.layout import TOPICS
from kstore.manifest import segment_location
from kstore.partition import Partition, PartitionState, Segment, cache_key
from kstore.records import TopicPartition
from kstore.store import Store, TopicMetadata

from .filters import Pushdown
from .options import (
    EARLIEST,
    LATEST,
    InvalidOptionError,
    OffsetSpec,
    ReadOptions,
    StoreRef,
    Subscription,
)
from .schema import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    SEGMENT_COLUMNS,
    ConstantColumns,
    Projection,
    output_batch,
)
from .stores import get_store

log = logging.getLogger(__name__)

ROWS_PER_BATCH = 65_536  # rows per Arrow batch handed to Spark
# On an object store a task fetches its next segments together, up to this many bytes.
FETCH_AHEAD_BYTES = 64 << 20
Offsets = dict[TopicPartition, int]


class DataLossError(OffsetOutOfRangeError):
    """Offsets a query was to read are gone (retention, a deleted topic) and failOnDataLoss is true."""


def report_data_loss(fail: bool, message: str) -> None:
    """Kafka's ``failOnDataLoss``: raise, or warn and go on with what is still there."""
    if fail:
        raise DataLossError(
            f"{message}. Some data may have been lost because it is no longer in the store: "
            "retention removed it, or the topic was deleted before the query read it. If you "
            "want the query to go on in such cases, set the source option 'failOnDataLoss' to 'false'."
        )
    log.warning("%s. Some data may have been lost (failOnDataLoss=false: going on).", message)


# -- offsets as Spark stores them ---------------------------------------------------------------


def to_json_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    """Kafka's offset JSON: ``{"topic": {"0": 23}}``, sorted, so that equal positions always
    serialise to equal strings (Spark compares offsets by their JSON)."""
    out: dict[str, dict[str, int]] = {}
    for tp in sorted(offsets):
        out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
    return out


def from_json_offsets(data: object) -> Offsets:
    if not isinstance(data, dict):
        raise InvalidArgumentError(f"kstore source: offsets must be a JSON object, got {data!r}")
    out: Offsets = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise InvalidArgumentError(
                f"kstore source: offsets for topic {topic!r} must be an object"
            )
        for p, offset in parts.items():
            out[TopicPartition(str(topic), int(p))] = int(offset)
    return out


# -- read tasks -----------------------------------------------------------------------------------


class ReadTask(InputPartition):
    """One Spark task: offsets [start, end) of one topic-partition.

    A streaming task carries the manifest entries of its segments (``segments``): it reads
    the planned snapshot and touches no manifest while its files are there (see the module
    docstring for when one is not). A batch task leaves ``segments``
    None and looks at the partition's manifest when it runs, because Spark plans a Python
    source's batch read once per DataFrame (or view) and re-runs that plan for every later
    query on it: with ``open_end`` the task reads up to what is "latest" when it runs, and
    with ``earliest_start`` from the log start offset of that moment, so every query sees the
    records committed by then, as the Kafka source's batch reads do.
    """

    def __init__(
        self,
        metadata: TopicMetadata,
        partition: int,
        start: int,
        end: int,
        timestamp_type: int,
        segments: Sequence[Segment] | None,
        *,
        open_end: bool = False,
        earliest_start: bool = False,
    ) -> None:
        self.metadata = metadata
        self.partition = partition
        self.start = start
        self.end = end
        self.timestamp_type = timestamp_type
        self.segments = None if segments is None else tuple(segments)
        self.open_end = open_end
        self.earliest_start = earliest_start

    @property
    def topic(self) -> str:
        return self.metadata.name

    def __repr__(self) -> str:
        end = "latest" if self.open_end else str(self.end)
        segs = (
            "manifest at read time" if self.segments is None else f"{len(self.segments)} segments"
        )
        return f"ReadTask({self.topic}-{self.partition} [{self.start}, {end}), {segs})"


@dataclass(frozen=True)
class ReadContext:
    """What every task of one read needs besides its range (picklable)."""

    store: StoreRef
    projection: Projection
    fail_on_data_loss: bool
    cache_bytes: int
    pushdown: Pushdown = field(default_factory=Pushdown)
    read_committed: bool = True


def _slice_bounds(seg: Segment, table: pa.Table, start: int, end: int) -> tuple[int, int]:
    if not seg.sparse:
        lo = max(0, start - seg.base_offset)
        hi = min(table.num_rows, end - seg.base_offset)
        return lo, max(lo, hi)
    offsets = table.column("offset").combine_chunks().to_numpy(zero_copy_only=False)
    lo = int(np.searchsorted(offsets, start, side="left"))
    hi = int(np.searchsorted(offsets, end, side="left"))
    return lo, hi


def _segment_in_time(seg: Segment, low_us: int | None, high_us: int | None) -> bool:
    # Manifest timestamps are milliseconds (floored), records microseconds.
    if low_us is not None and seg.max_timestamp_ms * 1000 + 999 < low_us:
        return False
    return not (high_us is not None and seg.min_timestamp_ms * 1000 > high_us)


def _resolve_at_read_time(
    task: ReadTask, state: PartitionState, ctx: ReadContext
) -> tuple[int, int]:
    """A batch task's range against the manifest as it is when the task runs."""
    latest = state.last_stable_offset if ctx.read_committed else state.end_offset
    end = max(task.end, latest) if task.open_end else task.end
    start = task.start
    if start < state.start_offset and task.earliest_start:
        start = state.start_offset  # "earliest" is wherever the log starts now
    r = check_range(
        TopicPartition(task.topic, task.partition),
        start,
        end,
        state,
        fail_on_data_loss=ctx.fail_on_data_loss,
    )
    return r.start, r.end


def read_task(task: ReadTask, ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    """The Arrow batches of one task (runs on an executor)."""
    pushdown = ctx.pushdown
    if pushdown.impossible() or not pushdown.accepts_task(
        task.topic, task.partition, task.timestamp_type
    ):
        return
    store = get_store(ctx.store, ctx.cache_bytes)
    partition = store.partition(task.topic, task.partition, task.metadata)
    start, end = task.start, task.end
    segments: Sequence[Segment] | None = task.segments
    if segments is None:
        state = partition.state()
        start, end = _resolve_at_read_time(task, state, ctx)
        low, high = pushdown.bounds("offset")  # exact once they narrow the range
        start = start if low is None else max(start, low)
        end = end if high is None else min(end, high + 1)
        segments = segments_between(state, start, end) if start < end else []
    if start >= end:
        return
    projection = ctx.projection
    schema = projection.arrow_schema()
    need_mask = pushdown.needs_mask()
    wanted = set(projection.segment_columns)
    if need_mask and pushdown.on("timestamp"):
        wanted.add("timestamp")
    # The segment columns in their file order, plus the offsets (an arange for dense segments).
    segment_columns = [c for c in SEGMENT_COLUMNS if c in wanted] + ["offset"]
    low_us, high_us = pushdown.bounds("timestamp")
    constants = ConstantColumns(task.topic, task.partition, task.timestamp_type)

    def in_time(seg: Segment) -> bool:
        return _segment_in_time(seg, low_us, high_us)

    wanted_segments = [
        seg
        for seg in segments
        if seg.last_offset >= start and seg.base_offset < end and in_time(seg)
    ]
    # Where each planned segment is in the plan, for fetching the next ones ahead of it.
    order = {_key(seg): i for i, seg in enumerate(wanted_segments)}
    fetched: dict[SegmentKey, bytes] = {}

    def data(seg: Segment) -> bytes | None:
        i = order.get(_key(seg))
        if i is None:
            return None  # not planned: read after a reload (below), on its own
        if _key(seg) not in fetched:
            fetched.update(_fetch_ahead(partition, wanted_segments[i:], segment_columns, fetched))
        return fetched.pop(_key(seg), None)

    def gone(position: int, newest: PartitionState) -> None:
        report_data_loss(
            ctx.fail_on_data_loss,
            f"{task.topic}-{task.partition}: offsets {position}.."
            f"{min(newest.start_offset, end) - 1} were to be read, but the log now starts at "
            f"{newest.start_offset}",
        )

    def missing(seg: Segment, exc: MissingSegmentError) -> None:
        # Live in the newest state too, and its file is gone (a deleted topic's data purged).
        report_data_loss(
            ctx.fail_on_data_loss,
            f"{task.topic}-{task.partition}: offsets {seg.base_offset}..{seg.last_offset} "
            f"are gone ({exc})",
        )

    # A planned segment whose file is missing makes the partition's state reload, and the rest
    # of the planned range is read from the live files of the newest state: a task that runs
    # after a merge and vacuum returns every record (PROTOCOL.md 24 item 8). Only offsets
    # truly gone (below the log start now) are data loss; compaction's are simply absent.
    for seg, table, position in partition.read_tables(
        start,
        end,
        segments=wanted_segments,
        columns=segment_columns,
        keep=in_time,
        data=data,
        gone=gone,
        missing=missing,
    ):
        lo, hi = _slice_bounds(seg, table, position, end)
        if hi <= lo:
            continue
        piece = table.slice(lo, hi - lo)
        for batch in piece.to_batches(max_chunksize=ROWS_PER_BATCH):
            if need_mask:
                mask = pushdown.mask(batch)
                if mask is not None:
                    batch = batch.filter(mask)
            if batch.num_rows:
                yield output_batch(batch, projection, schema, constants)


SegmentKey = tuple[str, tuple[int, int] | None]


def _key(seg: Segment) -> SegmentKey:
    return seg.path, seg.byte_range


def _fetch_ahead(
    partition: Partition,
    segments: Sequence[Segment],
    columns: list[str],
    held: Mapping[SegmentKey, bytes],
) -> dict[SegmentKey, bytes]:
    """On an object store, the bytes of the next segments this task reads, fetched together
    rather than one round trip each: the ranges of one data object (layout 3) in one
    coalesced request, whole files and different objects concurrently. Up to
    FETCH_AHEAD_BYTES ahead, counting what is ``held`` already (not fetched again); segments
    decoded in the cache are skipped. A segment that cannot be fetched here is left out: its
    own read reports the error."""
    storage = partition.storage
    if not storage.is_remote:
        return {}  # a local read costs no round trip
    window: list[Segment] = []
    size = 0
    for seg in segments:
        if size + seg.size_bytes > FETCH_AHEAD_BYTES and (window or size):
            break
        if _key(seg) in held:
            size += seg.size_bytes
            continue
        # The partition's own cache key (decoded tables are cached per columns and schema).
        key = f"{partition.directory}/{cache_key(seg, columns, partition.layout)}"
        if partition.cache.get(key) is None:
            window.append(seg)
            size += seg.size_bytes
    if len(window) < 2:
        return {}
    whole = {
        segment_location(partition.directory, s.path): s for s in window if s.byte_range is None
    }
    ranged: dict[str, list[Segment]] = {}
    for seg in window:
        if seg.byte_range is not None:
            ranged.setdefault(segment_location(partition.directory, seg.path), []).append(seg)

    def whole_files() -> dict[SegmentKey, bytes]:
        found = storage.read_many(list(whole))
        return {_key(whole[location]): data for location, data in found.items()}

    def one_object(location: str) -> dict[SegmentKey, bytes]:
        members, spans = [], []
        for s in ranged[location]:
            if s.byte_range is not None:
                members.append(s)
                spans.append((s.byte_range[0], s.byte_range[0] + s.byte_range[1]))
        pieces = storage.read_ranges(location, spans)
        return {
            _key(s): data
            for s, (start, end), data in zip(members, spans, pieces, strict=True)
            if len(data) == end - start  # cut short: the segment's own read reports it
        }

    jobs: list[Callable[[], dict[SegmentKey, bytes]]] = [whole_files] if whole else []
    jobs.extend(functools.partial(one_object, location) for location in ranged)
    out: dict[SegmentKey, bytes] = {}
    with concurrent.futures.ThreadPoolExecutor(min(8, len(jobs))) as pool:
        for future in [pool.submit(job) for job in jobs]:
            try:
                out.update(future.result())
            except (FileNotFoundError, KStoreError):
                continue
    return out


# -- the driver side ------------------------------------------------------------------------------


def timestamp_type_of(metadata: TopicMetadata) -> int:
    kind = metadata.effective_config.get("message.timestamp.type", "CreateTime")
    return LOG_APPEND_TIME if kind == "LogAppendTime" else CREATE_TIME


def find_topics(store: Store, sub: Subscription, *, strict: bool) -> dict[str, TopicMetadata]:
    """The subscribed topics that exist now. ``strict``: a named topic that does not exist is
    an error."""
    if sub.kind == "subscribePattern":
        assert sub.pattern is not None
        pattern = re.compile(sub.pattern)
        # One listing of the topic names; only the matching topics' logs are read.
        names = sorted(
            info.name for info in store.storage.list_dir(TOPICS) if pattern.fullmatch(info.name)
        )
    elif sub.kind == "assign":
        names = list(dict.fromkeys(t for t, _ in sub.assigned))
    else:
        names = list(sub.topics)
    found: dict[str, TopicMetadata] = {}
    for name in names:
        try:
            found[name] = store.topic(name)
        except InvalidTopicError:
            continue  # a stray entry in the topics directory, not a topic
        except UnknownTopicOrPartitionError:
            if strict:
                raise UnknownTopicOrPartitionError(
                    f"kstore source: topic {name!r} (option {sub.kind!r}) does not exist in "
                    f"store {store!r}"
                ) from None
            log.info("subscribed topic %r does not exist (yet)", name)
    return found


class Resolver:
    """Topics, partitions and manifest states for one query, from one Store (driver side)."""

    def __init__(self, store: Store, options: ReadOptions) -> None:
        self.store = store
        self.options = options
        self.metadata: dict[str, TopicMetadata] = {}

    def topics(self, *, strict: bool) -> dict[str, TopicMetadata]:
        """The subscribed topics that exist now (metadata refreshed by polling each topic's
        next log version). ``strict``: a named topic that does not exist is an error."""
        self.metadata = find_topics(self.store, self.options.subscription, strict=strict)
        return self.metadata

    def topic_partitions(self, *, strict: bool) -> list[TopicPartition]:
        topics = self.topics(strict=strict)
        sub = self.options.subscription
        if sub.kind == "assign":
            out = []
            for topic, p in sub.assigned:
                meta = topics.get(topic)
                if meta is None:
                    continue
                if p >= meta.partitions:
                    raise UnknownTopicOrPartitionError(
                        f"kstore source: option 'assign' names {topic}-{p}, but topic {topic!r} "
                        f"has partitions 0..{meta.partitions - 1}"
                    )
                out.append(TopicPartition(topic, p))
            return sorted(out)
        return sorted(
            TopicPartition(t, p) for t, meta in topics.items() for p in range(meta.partitions)
        )

    def _partition(self, tp: TopicPartition) -> Partition:
        meta = self.metadata.get(tp.topic)
        if meta is None:
            meta = self.metadata[tp.topic] = self.store.topic(tp.topic)
        return self.store.partition(tp.topic, tp.partition, meta)

    def state(self, tp: TopicPartition, *, refresh: bool = True) -> PartitionState:
        return self._partition(tp).state(refresh=refresh)

    def states(
        self, tps: Iterable[TopicPartition], *, refresh: bool = True
    ) -> dict[TopicPartition, PartitionState]:
        """The states of ``tps``. Layout 3: each topic log is asked once (its partitions
        share it), not once per partition, and its partitions are seen at one version."""
        out: dict[TopicPartition, PartitionState] = {}
        polled: set[int] = set()
        for tp in tps:
            part = self._partition(tp)
            fresh = refresh
            if part.topic_log is not None:
                fresh = refresh and id(part.topic_log) not in polled
                polled.add(id(part.topic_log))
            out[tp] = part.state(refresh=fresh)
        return out

    def visible_end(self, state: PartitionState) -> int:
        """Where "latest" is: the log end offset, or with read_committed (the default) the last
        stable offset, below which no record belongs to an open transaction."""
        return state.last_stable_offset if self.options.read_committed else state.end_offset

    def offset_for_time(
        self, tp: TopicPartition, timestamp_ms: int, state: PartitionState
    ) -> int | None:
        meta = self.metadata[tp.topic]
        return self.store.partition(tp.topic, tp.partition, meta).offset_for_timestamp(
            timestamp_ms, state
        )

    def resolve(
        self,
        spec: OffsetSpec,
        states: Mapping[TopicPartition, PartitionState],
        *,
        ending: bool,
    ) -> Offsets:
        """Concrete offsets for a starting or ending spec, for every partition in ``states``."""
        out: Offsets = {}
        if spec.kind in ("offsets", "timestamps"):
            given = set(spec.offsets if spec.kind == "offsets" else spec.timestamps)
            missing = sorted(set(states) - {TopicPartition(t, p) for t, p in given})
            extra = sorted({TopicPartition(t, p) for t, p in given} - set(states))
            if missing or extra:
                problem = (
                    f"it does not give the partitions {', '.join(f'{t.topic}-{t.partition}' for t in missing)}"
                    if missing
                    else f"it names partitions the query does not read: "
                    f"{', '.join(f'{t.topic}-{t.partition}' for t in extra)}"
                )
                raise InvalidOptionError(
                    f"kstore option {spec.option!r}: specific offsets must cover exactly the "
                    f"partitions the query reads; {problem}"
                )
        committed: dict[TopicPartition, int] = {}
        if spec.kind == "group":
            from kstore.groups import Group

            assert self.options.group_id is not None
            group_state = Group(self.store, self.options.group_id).state()
            committed = {tp: om.offset for tp, om in group_state.offsets.items()}
        for tp, state in states.items():
            latest = self.visible_end(state)
            if spec.kind == "group":
                # Where the group left off; a partition it never committed starts at the
                # beginning, and an offset retention removed starts at the log start.
                out[tp] = min(
                    max(committed.get(tp, state.start_offset), state.start_offset), latest
                )
            elif spec.kind == "earliest":
                out[tp] = state.start_offset
            elif spec.kind == "latest":
                out[tp] = latest
            elif spec.kind == "offsets":
                value = spec.offsets[(tp.topic, tp.partition)]
                if value == EARLIEST:
                    out[tp] = state.start_offset
                elif value == LATEST:
                    out[tp] = latest
                else:
                    if value > latest:
                        what = (
                            "log end offset" if latest == state.end_offset else "last stable offset"
                        )
                        raise InvalidOptionError(
                            f"kstore option {spec.option!r}: offset {value} for "
                            f"{tp.topic}-{tp.partition} is beyond the {what} {latest}"
                        )
                    out[tp] = value
            else:
                stamp = (
                    spec.timestamp_ms
                    if spec.kind == "timestamp"
                    else spec.timestamps[(tp.topic, tp.partition)]
                )
                assert stamp is not None
                found = self.offset_for_time(tp, stamp, state)
                if found is None:
                    if not ending and self.options.timestamp_strategy == "error":
                        raise InvalidOptionError(
                            f"kstore option {spec.option!r}: {tp.topic}-{tp.partition} has no record "
                            f"at or after timestamp {stamp}; set "
                            "startingOffsetsByTimestampStrategy=latest to start at the end instead"
                        )
                    found = latest
                out[tp] = min(found, latest) if ending else found
        return out


@dataclass(frozen=True)
class Range:
    tp: TopicPartition
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def segments_between(state: PartitionState, start: int, end: int) -> list[Segment]:
    """The live segments holding offsets in [start, end), in offset order (from the manifest)."""
    out = []
    i = state.segment_index_for(start)
    while i < len(state.segments) and state.segments[i].base_offset < end:
        out.append(state.segments[i])
        i += 1
    return out


def _split(segments: list[Segment], start: int, end: int, parts: int) -> list[tuple[int, int]]:
    """Cut [start, end) into ``parts`` pieces of similar offset counts (at most one per
    offset), as Kafka's source splits a range for minPartitions. A cut moves to a segment
    boundary within a tenth of a piece of it: a segment cut in two is decoded by both tasks."""
    parts = min(parts, end - start)
    if parts <= 1:
        return [(start, end)]
    target = (end - start) / parts
    boundaries = [s.last_offset + 1 for s in segments if start < s.last_offset + 1 < end]
    cuts = [start]
    for k in range(1, parts):
        cut = start + round(k * target)
        near = min(boundaries, key=lambda b: abs(b - cut), default=None)
        if near is not None and abs(near - cut) <= target / 10:
            cut = near
        if cuts[-1] < cut < end:
            cuts.append(cut)
    cuts.append(end)
    return list(itertools.pairwise(cuts))


def plan_tasks(
    ranges: Sequence[Range],
    states: Mapping[TopicPartition, PartitionState],
    metadata: Mapping[str, TopicMetadata],
    *,
    min_partitions: int | None,
    max_records_per_partition: int | None = None,
    snapshot: bool,
    open_end: bool = False,
    earliest_start: bool = False,
) -> list[ReadTask]:
    """Tasks for ``ranges``: one per range, more when ``minPartitions`` or
    ``maxRecordsPerPartition`` ask for them (cut inside segments too, at boundaries when near). ``snapshot``: tasks carry their segments (streaming); otherwise they
    read the manifest when they run, and with ``open_end`` a range's last task reads up to
    the latest offset of that moment (batch)."""
    total = sum(r.size for r in ranges)
    tasks: list[ReadTask] = []
    for r in ranges:
        if r.size <= 0 and not open_end:
            continue
        state = states[r.tp]
        meta = metadata[r.tp.topic]
        kind = timestamp_type_of(meta)
        segs = segments_between(state, r.start, r.end) if r.size > 0 else []
        if snapshot and not segs:
            continue
        parts = 1
        if min_partitions is not None and total > 0 and len(ranges) < min_partitions:
            parts = max(1, math.floor(r.size / total * min_partitions + 0.5))
        if max_records_per_partition is not None and r.size > max_records_per_partition:
            parts = max(parts, -(-r.size // max_records_per_partition))
        pieces = _split(segs, r.start, r.end, parts) if segs else [(r.start, r.end)]
        for i, (lo, hi) in enumerate(pieces):
            piece = (
                [s for s in segs if s.last_offset >= lo and s.base_offset < hi]
                if snapshot
                else None
            )
            tasks.append(
                ReadTask(
                    meta,
                    r.tp.partition,
                    lo,
                    hi,
                    kind,
                    piece,
                    open_end=open_end and i == len(pieces) - 1,
                    earliest_start=earliest_start and i == 0,
                )
            )
    return tasks


def check_range(
    tp: TopicPartition,
    start: int,
    end: int,
    state: PartitionState,
    *,
    fail_on_data_loss: bool,
) -> Range:
    """[start, end) made safe against what the log holds now: offsets below the log start
    offset are gone (retention), offsets beyond its end mean the topic was re-created."""
    if end < start:
        report_data_loss(
            fail_on_data_loss,
            f"{tp.topic}-{tp.partition}: the offset went back from {start} to {end} "
            "(the topic was deleted and re-created?)",
        )
        start = state.start_offset
    if start < state.start_offset:
        report_data_loss(
            fail_on_data_loss,
            f"{tp.topic}-{tp.partition}: offsets {start}..{state.start_offset - 1} were to be "
            f"read, but the log now starts at {state.start_offset}",
        )
        start = state.start_offset
    if end > state.end_offset:
        report_data_loss(
            fail_on_data_loss,
            f"{tp.topic}-{tp.partition}: offsets up to {end} were to be read, but the log ends "
            f"at {state.end_offset} (the topic was deleted and re-created?)",
        )
        end = state.end_offset
    return Range(tp, start, max(start, end))


# -- admission control (streaming) ----------------------------------------------------------------


def rate_limit(
    limit: int, begin: Mapping[TopicPartition, int], until: Mapping[TopicPartition, int]
) -> Offsets:
    """Kafka's ``maxOffsetsPerTrigger``: the limit shared among partitions in proportion to
    their backlog (each with a backlog advances by at least one offset)."""
    sizes = {tp: end - begin.get(tp, 0) for tp, end in until.items() if end > begin.get(tp, 0)}
    total = sum(sizes.values())
    if total <= limit:
        return dict(until)
    out = dict(until)
    for tp, size in sizes.items():
        prorate = limit * (size / total)
        step = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(begin.get(tp, 0) + step, until[tp])
    return out


def bytes_per_offset(state: PartitionState, start: int, end: int) -> float:
    """Average stored bytes per offset over [start, end), from the manifest's segment sizes."""
    size = 0
    span = 0
    for seg in segments_between(state, start, end):
        size += seg.size_bytes
        span += seg.last_offset - seg.base_offset + 1
    return size / span if span else 0.0


def byte_limit(
    limit: int,
    begin: Mapping[TopicPartition, int],
    until: Mapping[TopicPartition, int],
    states: Mapping[TopicPartition, PartitionState],
) -> Offsets:
    """``maxBytesPerTrigger``: as :func:`rate_limit`, in bytes estimated from the manifest."""
    per_offset = {}
    backlog = {}
    for tp, end in until.items():
        start = begin.get(tp, 0)
        if end > start and tp in states:
            per_offset[tp] = bytes_per_offset(states[tp], start, end)
            backlog[tp] = (end - start) * per_offset[tp]
    total = sum(backlog.values())
    if total <= limit:
        return dict(until)
    out = dict(until)
    for tp, size in backlog.items():
        share = limit * (size / total)
        step = max(1, math.floor(share / per_offset[tp])) if per_offset[tp] > 0 else until[tp]
        out[tp] = min(begin.get(tp, 0) + step, until[tp])
    return out
