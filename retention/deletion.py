"""Time and size retention of one partition (Kafka's ``cleanup.policy=delete``).

Decided from the manifest alone, never from segment data:

- by time: the oldest segments whose newest record (``maxTimestamp``) is more than
  ``retention.ms`` old;
- by size: while the partition is larger than ``retention.bytes``, the oldest segment, if the
  partition stays at least ``retention.bytes`` without it (Kafka's rule: retention never takes
  a partition below its limit);
- segments wholly below the log start offset.

Only a prefix of the log goes (whole segments, oldest first), so the live range stays
contiguous; it never reaches the last stable offset (an open transaction's records stay).
The commit removes those segments and advances the log start offset past them. ``build`` is
re-run on the newest state after every conflict, so concurrent appends (which only add at the
end) and concurrent maintenance jobs are taken into account.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kstore.compaction.jobs import PartitionResult, WorkItem, now_ms, policies

from kstore.log import Action
from kstore.partition import PartitionState, Segment
from kstore.store import Store

OPERATION = "retention"


@dataclass(frozen=True)
class RetentionPlan:
    remove: list[Segment]
    log_start_offset: int
    why: str


def plan_retention(
    state: PartitionState, config: Mapping[str, Any], now: int
) -> RetentionPlan | None:
    """The prefix of segments retention removes, or None when nothing is due."""
    segments = state.segments
    lso = state.last_stable_offset
    limit = 0
    while limit < len(segments) and segments[limit].last_offset < lso:
        limit += 1
    counts: dict[str, int] = {"log start offset": 0, "retention.ms": 0, "retention.bytes": 0}
    while (
        counts["log start offset"] < limit
        and segments[counts["log start offset"]].last_offset < state.log_start_offset
    ):
        counts["log start offset"] += 1
    if "delete" in policies(config):
        retention_ms = int(config["retention.ms"])
        if retention_ms >= 0:
            n = 0
            while n < limit and now - segments[n].max_timestamp_ms > retention_ms:
                n += 1
            counts["retention.ms"] = n
        retention_bytes = int(config["retention.bytes"])
        if retention_bytes >= 0:
            excess, n = state.size_bytes - retention_bytes, 0
            while n < limit and excess - segments[n].size_bytes >= 0:
                excess -= segments[n].size_bytes
                n += 1
            counts["retention.bytes"] = n
    n = max(counts.values())
    if n == 0:
        return None
    why = ", ".join(name for name, count in counts.items() if count)
    start = max(state.log_start_offset, segments[n - 1].last_offset + 1)
    return RetentionPlan(segments[:n], start, why)


def _why_not(state: PartitionState, config: Mapping[str, Any], now: int) -> str:
    """Why retention removes nothing: an empty partition, an open transaction holding back
    segments that are due, or nothing due."""
    if not state.segments:
        return "empty"
    lso = state.last_stable_offset
    retention_ms = int(config["retention.ms"])
    first = state.segments[0]
    if first.last_offset >= lso and 0 <= retention_ms < now - first.max_timestamp_ms:
        return f"open transaction at offset {lso}: segments past retention.ms wait for it"
    return "nothing past retention.ms or retention.bytes"


def retention_partition(store: Store, item: WorkItem, options: dict[str, Any]) -> PartitionResult:
    """The retention job's per-partition function (runs on an executor)."""
    part = item.open(store)
    state = part.state()
    now = now_ms(options)
    result = PartitionResult.starting(item, OPERATION, state)
    plan = plan_retention(state, item.config, now)
    if plan is None:
        result.reason = _why_not(state, item.config, now)
        return result
    if options.get("dry_run"):
        size = sum(s.size_bytes for s in plan.remove)
        records = sum(s.record_count for s in plan.remove)
        result.outcome = "dry-run"
        result.reason = (
            f"{plan.why}: would remove {len(plan.remove)} segment(s), {records} record(s), "
            f"{size} bytes; log start {state.log_start_offset} -> {plan.log_start_offset}"
        )
        result.segments_removed = len(plan.remove)
        result.bytes_after -= size
        result.records_after -= records
        return result
    chosen: dict[str, RetentionPlan] = {}

    def build(newest: PartitionState) -> list[Action] | None:
        fresh = plan_retention(newest, item.config, now)
        if fresh is None:
            return None
        chosen["plan"] = fresh
        actions: list[Action] = [
            {"remove": {"path": s.path, "deletionTimestamp": now}} for s in fresh.remove
        ]
        if fresh.log_start_offset > newest.log_start_offset:
            actions.append({"logStart": {"offset": fresh.log_start_offset}})
        return actions

    committed = part.commit_actions(build, operation=OPERATION.upper())
    if committed is None:
        result.reason = "nothing left to remove (a concurrent job removed it)"
        return result
    done = chosen["plan"]
    after = committed.state
    result.outcome = "committed"
    result.reason = f"{done.why}: log start {state.log_start_offset} -> {after.log_start_offset}"
    result.commits = 1
    result.segments_removed = len(done.remove)
    result.bytes_after, result.records_after = after.size_bytes, after.record_count
    result.bytes_before = after.size_bytes + sum(s.size_bytes for s in done.remove)
    result.records_before = after.record_count + sum(s.record_count for s in done.remove)
    result.log_start_offset = after.log_start_offset
    return result
