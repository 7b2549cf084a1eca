"""Publishing the tail on demand: rewrite every segment below the last stable offset that is
not yet a per-partition Parquet file (producers' Arrow segments, layout 3's ranges of data
objects, and the dominant segments the merger's tiered rule leaves alone) into Parquet, so
that the table reaches the last stable offset.

It is the merger (``kstore.compaction.merger``) with another choice of groups: the same reads,
the same Parquet output, the same delete horizons and the same replacement commit (PROTOCOL.md
22.4 allows a writer to rewrite groups the tiered rule leaves alone). The compaction package is
imported here only, when a tail is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kstore.errors import CommitConflictError, ConcurrentModificationError
from kstore.manifest import PartitionState, Segment
from kstore.store import Store, TopicMetadata

from .publish import is_table_file


def tail_groups(state: PartitionState, config: Mapping[str, Any]) -> list[list[Segment]]:
    """Runs of adjacent segments below the last stable offset that are not per-partition
    Parquet files, each of at most ``segment.bytes`` (at least one segment), never across the
    cleaned point nor mixing delete horizons (the merger's rules)."""
    from kstore.compaction.cleaner import compatible

    target = int(config["segment.bytes"])
    lso, cleaned = state.last_stable_offset, state.cleaned_offset
    groups: list[list[Segment]] = []
    current: list[Segment] = []
    size, horizon = 0, None
    for seg in state.segments:
        if seg.last_offset >= lso:
            break
        if is_table_file(seg):
            if current:
                groups.append(current)
            current, size, horizon = [], 0, None
            continue
        crosses = bool(current) and current[-1].last_offset < cleaned <= seg.last_offset
        full = size + seg.size_bytes > target
        if current and (full or crosses or not compatible(horizon, seg.delete_horizon_ms)):
            groups.append(current)
            current, size, horizon = [], 0, None
        current.append(seg)
        size += seg.size_bytes
        horizon = horizon if seg.delete_horizon_ms is None else seg.delete_horizon_ms
    if current:
        groups.append(current)
    return groups


def merge_tail(store: Store, meta: TopicMetadata, now_ms: int | None = None) -> int:
    """Rewrite the tail of every partition of ``meta`` into Parquet (see the module docstring);
    returns the number of segments replaced. A group that a concurrent commit changed is left
    to the next publication."""
    import time

    from kstore.compaction.cleaner import replace_segments
    from kstore.compaction.jobs import WorkItem
    from kstore.compaction.merger import read_group, write_merged

    from kstore.partition import SegmentReplacedError
    from kstore.segments import layout_of

    config = meta.effective_config
    replaced = 0
    for p in range(meta.partitions):
        item = WorkItem(meta.name, meta.topic_id, p, config, layout_of(meta), meta)
        part = item.open(store)
        state = part.state()
        now = int(time.time() * 1000) if now_ms is None else now_ms
        groups = tail_groups(state, config)
        replanned = False
        while groups:
            group = groups.pop(0)
            try:
                tables = read_group(part, group)
            except SegmentReplacedError as exc:
                # Rewritten and vacuumed since this state (another merge, then a vacuum past
                # file.delete.delay.ms): planned again, once, from the newest state's live
                # files (PROTOCOL.md 24 item 8).
                if replanned:
                    break
                replanned = True
                state = exc.state
                groups = tail_groups(state, config)
                continue
            written, horizon, written_at = write_merged(part, state, group, tables, config, now)
            try:
                landed = replace_segments(
                    part, group, written, horizon, now, "merge", written_at=written_at
                )
            except (ConcurrentModificationError, CommitConflictError):
                landed = False
            if not landed:
                break
            replaced += len(group)
    return replaced
