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

import time
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kstore.partition import Partition, PartitionState, Segment
from kstore.segments import FORMAT_PARQUET, read_segments, write_segment
from kstore.store import Store

from .cleaner import _codec, _replace, _Span, compatible, delete_horizon, time_window_ms
from .jobs import PartitionResult, WorkItem, now_ms

OPERATION = "merge"


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


def _read_group(part: Partition, group: list[Segment]) -> list[pa.Table]:
    """The group's records. On an object store its files are fetched together (the ranges of
    one data object in one coalesced request, objects and files concurrently) rather than one
    round trip per segment."""
    fetched: dict[str, bytes] = {}
    if part.storage.is_remote and len(group) > 1:
        fetched = read_segments(part.storage, part.directory, group)
    return [part.read_segment(seg, data=fetched.get(seg.path)) for seg in group]


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
    codec = _codec(item.config)
    for number, group in enumerate(groups):
        tables = _read_group(part, group)
        written_at = time.monotonic()  # before the write: a slow write counts too
        written = write_segment(
            part.storage,
            part.directory,
            pa.concat_tables(tables),
            compression=codec,
            fmt=FORMAT_PARQUET,
            layout=part.layout,
        )
        first_seen = delete_horizon(now, int(item.config["delete.retention.ms"]))
        horizon = _horizon(group, tables, state.cleaned_offset, first_seen)
        if not _replace(part, group, written, horizon, now, OPERATION, written_at=written_at):
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
