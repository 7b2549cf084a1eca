"""Segment merging: many small producer segments become few Parquet segments near
``segment.bytes``, every record kept at its offset (the small-files problem of short flushes).

Which segments merge (from the manifest alone):

- only segments wholly below the last stable offset (never an open transaction's);
- adjacent segments are packed greedily, in offset order, into groups of at most
  ``segment.bytes``; a group never spans the cleaned point (so compaction's dirty ratio stays
  exact) nor mixes segments whose tombstones wait for different delete horizons (the merged
  segment would keep the earlier ones too long), nor covers a time span (newest record minus
  oldest) beyond the time window (:func:`~kstore.compaction.cleaner.time_window_ms`:
  ``segment.ms``, at most a tenth of ``retention.ms``), so that merging never makes retention
  later than that window;
- a group is merged only if it has two or more segments and none of them holds more than half
  of its bytes. A segment that dominates its group is left out and the rest of the group is
  reconsidered on each side. This makes merging tiered: a byte is rewritten only when the
  segment holding it at least doubles, so each byte is rewritten O(log(segment.bytes /
  flush size)) times, however often the job runs;
- layout 3: a group holding a ranged add (a partition's range of a shared data object) is
  merged even when it is alone or dominant, so that after a run every range below the last
  stable offset lives in a per-partition file (whole-file reads for Spark, and data objects
  that vacuum can delete). A range is rewritten once this way; afterwards the tiered rule
  applies to its file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kstore import clock
from kstore.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    ConcurrentModificationError,
    MissingSegmentError,
    StaleWriteError,
    StorageError,
    UnknownTopicOrPartitionError,
    WithdrawnCommitError,
)
from kstore.log import Action
from kstore.manifest import segment_location
from kstore.partition import Partition, PartitionState, Segment, SegmentReplacedError
from kstore.segments import (
    FORMAT_PARQUET,
    SegmentFile,
    read_object_ranges,
    read_segments,
    write_segment,
)
from kstore.store import Store
from kstore.topic_log import TopicLog, TopicLogState

from .cleaner import (
    _codec,
    _discard,
    _Span,
    compatible,
    delete_horizon,
    replace_segments,
    replacement_actions,
    time_window_ms,
)
from .jobs import PartitionResult, WorkItem, now_ms

OPERATION = "merge"

log = logging.getLogger(__name__)

# Failures of the shared rewrite that the partitions' own merges, which follow, meet as well
# or recover from (the storage failed, or the state changed under the rewrite: a concurrent
# commit, a range rewritten and vacuumed, the topic deleted). Any other failure (a range that
# does not decode or verify, a bug) is the shared rewrite's own: it is reported as an error
# even when each partition's own merge then does the work (rewrite_ranges).
_RECOVERED_BY_OWN_MERGE = (
    StorageError,
    MissingSegmentError,
    CommitStateUnknownError,
    CommitConflictError,
    ConcurrentModificationError,
    StaleWriteError,
    WithdrawnCommitError,
    UnknownTopicOrPartitionError,
)


def plan_merge(state: PartitionState, config: Mapping[str, Any]) -> list[list[Segment]]:
    """The groups of segments a merge run would replace, one new segment each."""
    target = int(config["segment.bytes"])
    lso = state.last_stable_offset
    cleaned = state.cleaned_offset
    groups: list[list[Segment]] = []
    current: list[Segment] = []
    size, horizon = 0, None
    span = _Span(time_window_ms(config))
    for seg in state.segments:
        if seg.last_offset >= lso:
            break
        crosses = bool(current) and current[-1].last_offset < cleaned <= seg.last_offset
        full = size + seg.size_bytes > target
        if current and (
            full or crosses or not compatible(horizon, seg.delete_horizon_ms) or not span.fits(seg)
        ):
            groups.extend(_undominated(current))
            current, size, horizon = [], 0, None
            span.reset()
        current.append(seg)
        span.add(seg)
        size += seg.size_bytes
        horizon = horizon if seg.delete_horizon_ms is None else seg.delete_horizon_ms
    groups.extend(_undominated(current))
    return groups


def _undominated(group: list[Segment]) -> list[list[Segment]]:
    # A ranged add (layout 3) is always rewritten: merging is what turns data objects into
    # per-partition files, so a lone or dominant range is merged too (PROTOCOL.md 22.4 allows
    # it). Only a dominant segment file is left out, as the tiered rule says.
    if not group or (len(group) < 2 and group[0].byte_range is None):
        return []
    total = sum(s.size_bytes for s in group)
    biggest = max(range(len(group)), key=lambda i: group[i].size_bytes)
    if 2 * group[biggest].size_bytes <= total or group[biggest].byte_range is not None:
        return [group]
    return _undominated(group[:biggest]) + _undominated(group[biggest + 1 :])


def _why_not(state: PartitionState) -> str:
    """Why no group is merged."""
    if not state.segments:
        return "empty"
    lso = state.last_stable_offset
    below = [s for s in state.segments if s.last_offset < lso]
    if len(below) < 2 and len(below) < len(state.segments):
        return f"open transaction at offset {lso}"
    return "no small segments to merge"


def _horizon(
    group: list[Segment], tables: list[pa.Table], cleaned: int, first_seen: int
) -> int | None:
    """The merged segment's delete horizon: the latest of its sources'. A source below the
    cleaned point that holds tombstones but no horizon (none of kstore's own writers makes
    one) counts as seen for the first time now, so that its tombstones still get their full
    delete.retention.ms."""
    horizons = [s.delete_horizon_ms for s in group if s.delete_horizon_ms is not None]
    for seg, table in zip(group, tables, strict=True):
        if seg.delete_horizon_ms is None and seg.base_offset < cleaned:
            tombstones = pc.and_(
                pc.is_null(table.column("value")), pc.is_valid(table.column("key"))
            )
            below = pc.less(table.column("offset"), cleaned)
            if pc.any(pc.and_(tombstones, below)).as_py():
                horizons.append(first_seen)
    return max(horizons) if horizons else None


def write_merged(
    part: Partition,
    state: PartitionState,
    group: list[Segment],
    tables: list[pa.Table],
    config: Mapping[str, Any],
    now: int,
) -> tuple[SegmentFile, int | None, float]:
    """The merged segment of ``group`` (whose records are ``tables``), written: its file, its
    delete horizon, and when its write started (``kstore.clock.monotonic()``, for the commit
    deadline: a slow write counts too)."""
    written_at = clock.monotonic()
    written = write_segment(
        part.storage,
        part.directory,
        pa.concat_tables(tables),
        compression=_codec(config),
        fmt=FORMAT_PARQUET,
        layout=part.layout,
    )
    first_seen = delete_horizon(now, int(config["delete.retention.ms"]))
    return written, _horizon(group, tables, state.cleaned_offset, first_seen), written_at


def read_group(part: Partition, group: list[Segment]) -> list[pa.Table]:
    """The group's records. On an object store its files are fetched together (the ranges of
    one data object in one coalesced request, objects and files concurrently) rather than one
    round trip per segment."""
    fetched: dict[str, bytes] = {}
    if part.storage.is_remote and len(group) > 1:
        fetched = read_segments(part.storage, part.directory, group)
    return [part.read_segment(seg, data=fetched.get(seg.path)) for seg in group]


def rewrite_ranges(
    store: Store, items: list[WorkItem], options: dict[str, Any]
) -> list[PartitionResult]:
    """Layout 3, the merge's part that the partitions of one topic log share: the ranges of
    data objects that their plans rewrite, read a window of objects at a time with ONE request
    per object for all the partitions (a merge of one partition at a time sends one per
    partition and object). Each partition's ranges in a window become one Parquet segment (one
    per plan group), and a window's replacements land in one commit. A window holds at most
    ``segment.bytes`` of ranges, the memory one partition's merge may take, so with many
    partitions its segments are smaller; the tiered merge packs them on a later run.

    Only runs of ranges are taken (a file of the partition between them is left to the
    partition's own merge, which follows and also takes what this leaves).

    A failure is never silent, though the partitions' own merges take what is left: it is
    logged as a warning with its cause, and in each row's reason. A failure the own merges
    recover from (the storage's, or a state changed under the rewrite: _RECOVERED_BY_OWN_MERGE)
    leaves the rows' outcomes to what landed, so the run's outcome is the own merges'. Any
    other (a range that does not verify where the partition's own read of it does, a bug)
    makes each row an ``error``: the run fails, as the maintenance records then show, even
    though the own merges did the work. Such a failure means the shared rewrite mapped ranges
    wrongly, and it hid exactly that (issue 45: a rewrite that handed a partition another
    partition's range was noticed only by a request count)."""
    rows: dict[int, PartitionResult] = {}
    if options.get("dry_run"):
        return []  # each partition's own part reports what a run would do
    try:
        parts = {item.partition: item.open(store) for item in items}
        topic_log = parts[items[0].partition].topic_log
        if topic_log is None or any(part.topic_log is not topic_log for part in parts.values()):
            raise ValueError("rewrite_ranges takes the partitions of one topic log")
        shared = topic_log.state()
        now = now_ms(options)
        config = items[0].config
        queues: dict[int, list[list[Segment]]] = {}
        for item in items:
            state = shared.partition(item.partition)
            rows[item.partition] = PartitionResult.starting(item, OPERATION, state)
            queues[item.partition] = [
                run for group in plan_merge(state, config) for run in _runs_of_ranges(group)
            ]
        _rewrite_windows(store, topic_log, shared, parts, queues, rows, config, now)
    except Exception as exc:
        return _failed_together(items, rows, exc)
    for row in rows.values():
        if row.outcome == "committed":
            row.reason = (
                f"rewrote {row.segments_removed} ranges of data objects into "
                f"{row.segments_written} segments, with the topic log's other partitions"
            )
    return list(rows.values())


def _failed_together(
    items: list[WorkItem], rows: dict[int, PartitionResult], exc: Exception
) -> list[PartitionResult]:
    """The rows of a shared rewrite that failed with ``exc`` (see :func:`rewrite_ranges`)."""
    recovered = isinstance(exc, _RECOVERED_BY_OWN_MERGE)
    first = items[0]
    log.warning(
        "merge of %s, partitions %s (one topic log): rewriting their ranges together failed "
        "(%s: %s); %s",
        first.topic,
        ",".join(str(item.partition) for item in items),
        type(exc).__name__,
        exc,
        "each partition's own merge takes what is left"
        if recovered
        else "reported as an error; each partition's own merge still takes what is left",
        exc_info=not recovered,  # a failure of the shared rewrite itself: its traceback
    )
    reason = f"rewriting the ranges together failed ({type(exc).__name__}: {exc})"
    out = []
    for item in items:
        row = rows.get(item.partition) or PartitionResult(item.topic, item.partition, OPERATION)
        landed = (
            f"rewrote {row.segments_removed} ranges into {row.segments_written} segments, then "
            if row.commits
            else ""
        )
        row.reason = landed + reason
        if not recovered:
            row.outcome = "error"
        out.append(row)
    return out


def _rewrite_windows(
    store: Store,
    topic_log: TopicLog,
    shared: TopicLogState,
    parts: dict[int, Partition],
    queues: dict[int, list[list[Segment]]],
    rows: dict[int, PartitionResult],
    config: Mapping[str, Any],
    now: int,
) -> None:
    """:func:`rewrite_ranges`' windows, one after the other, counted in ``rows``."""
    window = 0
    while any(queues.values()):
        window += 1
        pieces = _next_window(queues, int(config["segment.bytes"]))
        data = _fetch(store, parts, pieces)
        written: dict[int, list[tuple[list[Segment], SegmentFile, int | None, float]]] = {}
        try:
            for p, runs in pieces.items():
                part, state = parts[p], shared.partition(p)
                for run in runs:
                    tables = [part.read_segment(seg, data=data.get((p, seg.path))) for seg in run]
                    new, horizon, written_at = write_merged(part, state, run, tables, config, now)
                    written.setdefault(p, []).append((run, new, horizon, written_at))
        except SegmentReplacedError as exc:
            # A range was rewritten and vacuumed since the plan (PROTOCOL.md 24 item 8): a
            # lost race; each partition's own merge, next, plans from the newest state.
            for p, done in written.items():
                _discard(parts[p], [new.path for _, new, _, _ in done])
            for row in rows.values():
                row.outcome = "conflict" if row.outcome != "committed" else row.outcome
                row.reason = f"{exc}; the partitions' own merges plan again"
            return
        landed = _commit_window(topic_log, written, now)
        for p, done in written.items():
            row = rows[p]
            if landed is None or p not in landed:
                _discard(parts[p], [new.path for _, new, _, _ in done])
                queues[p] = []  # its own merge, next, plans again from the newest state
                if landed is None:
                    row.outcome = "conflict"
                    row.reason = (
                        f"a concurrent commit to the topic log won over window {window}; the "
                        "next run starts over"
                    )
                continue
            row.outcome = "committed"
            row.commits += 1
            for run, new, _, _ in done:
                row.segments_removed += len(run)
                row.segments_written += 1
                row.bytes_after += new.size_bytes - sum(seg.size_bytes for seg in run)
        if landed is None:
            break


def _fetch(
    store: Store, parts: dict[int, Partition], pieces: dict[int, list[list[Segment]]]
) -> dict[tuple[int, str], bytes]:
    """The bytes of a window's ranges, by partition and object: each object's ranges (of
    every partition) in one coalesced request, the objects concurrently. A missing object is
    left out (the partition's read of it alone then reports it)."""
    wanted: dict[str, list[tuple[int, int]]] = {}
    order: list[tuple[int, str, str]] = []
    for p, runs in pieces.items():
        for seg in (seg for run in runs for seg in run):
            assert seg.byte_range is not None  # runs of ranges only
            start, length = seg.byte_range
            location = segment_location(parts[p].directory, seg.path)
            wanted.setdefault(location, []).append((start, start + length))
            order.append((p, seg.path, location))
    fetched = {
        location: iter(pieces_of)
        for location, pieces_of in read_object_ranges(store.storage, wanted).items()
    }
    out: dict[tuple[int, str], bytes] = {}
    for p, path, location in order:  # each object's pieces come back in the order asked
        piece = next(fetched[location], None) if location in fetched else None
        if piece is not None:
            out[(p, path)] = piece
    return out


def _runs_of_ranges(group: list[Segment]) -> list[list[Segment]]:
    """The runs of adjacent ranges (layout 3) in a merge group."""
    runs: list[list[Segment]] = []
    current: list[Segment] = []
    for seg in group:
        if seg.byte_range is None:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(seg)
    if current:
        runs.append(current)
    return runs


def _next_window(
    queues: dict[int, list[list[Segment]]], budget: int
) -> dict[int, list[list[Segment]]]:
    """Takes the next window of work off ``queues``: the data objects first by name (their
    names start with the time they were written) up to ``budget`` bytes of queued ranges,
    and from each partition's queue the longest prefix whose ranges all lie in them. A range
    whose object was written earlier than one the partition committed before it (two
    producers' clocks) waits for the next window, and its object is read again then."""
    sizes: dict[str, int] = {}
    for runs in queues.values():
        for run in runs:
            for seg in run:
                sizes[seg.path] = sizes.get(seg.path, 0) + seg.size_bytes
    total, limit = 0, ""
    for name in sorted(sizes):
        limit, total = name, total + sizes[name]
        if total >= budget:
            break
    # Progress: at least the partition whose next range is first by name takes it.
    limit = max(limit, min(runs[0][0].path for runs in queues.values() if runs))
    pieces: dict[int, list[list[Segment]]] = {}
    for p, runs in queues.items():
        while runs:
            run = runs[0]
            n = 0
            while n < len(run) and run[n].path <= limit:
                n += 1
            if n == 0:
                break
            pieces.setdefault(p, []).append(run[:n])
            if n < len(run):
                runs[0] = run[n:]
                break
            runs.pop(0)
    return pieces


def _commit_window(
    topic_log: TopicLog,
    written: dict[int, list[tuple[list[Segment], SegmentFile, int | None, float]]],
    now: int,
) -> set[int] | None:
    """One commit replacing the runs of a window in every partition. Returns the partitions
    it holds (a partition with a run no longer all live is left out), or None when a
    concurrent commit made it fail with nothing committed."""
    included: set[int] = set()

    def build_for(
        p: int, done: list[tuple[list[Segment], SegmentFile, int | None, float]]
    ) -> Callable[[PartitionState], list[Action] | None]:
        def build(state: PartitionState) -> list[Action] | None:
            actions: list[Action] = []
            for run, new, horizon, written_at in done:
                replaced = replacement_actions(state, run, new, horizon, now, written_at=written_at)
                if replaced is None:
                    included.discard(p)
                    return None
                actions.extend(replaced)
            included.add(p)
            return actions

        return build

    oldest = min(written_at for done in written.values() for *_, written_at in done)
    try:
        result, _ = topic_log.commit(
            {p: build_for(p, done) for p, done in written.items()},
            operation=OPERATION.upper(),
            written_at=oldest,
        )
    except (StaleWriteError, ConcurrentModificationError, CommitConflictError):
        return None  # certainly not committed
    return included if result is not None else set()


def merge_partition(store: Store, item: WorkItem, options: dict[str, Any]) -> PartitionResult:
    """The merge job's per-partition function (runs on an executor)."""
    part = item.open(store)
    state = part.state()
    now = now_ms(options)
    result = PartitionResult.starting(item, OPERATION, state)
    groups = plan_merge(state, item.config)
    if not groups:
        result.reason = _why_not(state)
        return result
    merging = sum(len(g) for g in groups)
    if options.get("dry_run"):
        size = sum(s.size_bytes for g in groups for s in g)
        result.outcome = "dry-run"
        result.segments_removed = merging
        result.segments_written = len(groups)
        result.reason = (
            f"would merge {merging} segments ({size} bytes) into {len(groups)}; no record is "
            "dropped (the new files' size is known once written)"
        )
        return result
    for number, group in enumerate(groups):
        try:
            tables = read_group(part, group)
        except SegmentReplacedError as exc:
            # Replaced and vacuumed since the plan (PROTOCOL.md 24 item 8): a lost race.
            result.outcome = "conflict"
            result.reason = f"{exc}; the next run starts over"
            return result
        written, horizon, written_at = write_merged(part, state, group, tables, item.config, now)
        if not replace_segments(
            part, group, written, horizon, now, OPERATION, written_at=written_at
        ):
            result.outcome = "conflict"
            result.reason = (
                f"a concurrent commit changed segments of group {number + 1} of "
                f"{len(groups)}; the next run starts over"
            )
            return result
        result.outcome = "committed"
        result.commits += 1
        result.segments_removed += len(group)
        result.segments_written += 1
        result.bytes_after += written.size_bytes - sum(s.size_bytes for s in group)
    result.reason = f"merged {merging} segments into {len(groups)}"
    return result
