"""Key compaction of one partition: Kafka's log cleaner over a kstore manifest.

Terms (Kafka's):

- the **cleaned point** ``C`` (``state.cleaned_offset``): below it every key has at most one
  record, the one with its highest offset (null-key records aside, see below);
- the **cleanable range**: the live segments from the start up to (not including) the first
  segment that is still in the *head*: one at or after the last stable offset (an open
  transaction), or one holding a record younger than ``min.compaction.lag.ms``;
- **dirty** segments: cleanable segments with records at or after ``C``; **clean** ones lie
  wholly below it. The dirty ratio is dirty bytes / cleanable bytes.

A run builds the offset map of the dirty segments (key -> highest offset, with pyarrow's hash
group-by), then rewrites, as sparse Parquet segments that keep every record's offset:

- every dirty segment, keeping a record only if it is the latest for its key;
- only those clean segments that hold a key the map supersedes, or tombstones whose
  ``deleteHorizon`` has passed: the rest of the clean prefix is left as it is (incremental).

Record tombstones (null value) are kept until ``delete.retention.ms`` after the cleaning that
first saw them: a segment written here records that time as its ``deleteHorizon`` (the latest
such time of the tombstones it holds), and a later cleaning drops the tombstones of a clean
segment whose horizon has passed. Records with a null key are never dropped (Kafka refuses
them on compacted topics; kstore accepts them and leaves them alone).

Work is committed group by group (contiguous rewritten segments up to ``segment.bytes`` of
input, as Kafka's cleaner groups them, and within the time window of :func:`time_window_ms`, so
that a rewrite never delays retention by more than that window), each commit removing its group's segments and adding
the group's output; the last one advances ``cleaned``. Every intermediate state is a valid
compacted log: only records superseded by a later record of the same key, which stays, are
gone. A group whose segments a concurrent job removed is abandoned, and so is the rest of the
run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kstore import clock
from kstore.config import defaults
from kstore.errors import CommitConflictError, ConcurrentModificationError, StaleWriteError
from kstore.log import Action
from kstore.manifest import DATA_PREFIX
from kstore.partition import Partition, PartitionState, Segment, SegmentReplacedError
from kstore.segments import FORMAT_PARQUET, SegmentFile, write_segment
from kstore.store import Store

from .jobs import PartitionResult, WorkItem, now_ms, policies, too_old_to_commit

OPERATION = "compaction"
# Kafka bounds a cleaning by its dedupe buffer; here by the dirty records one run maps.
DEFAULT_MAX_DIRTY_RECORDS = 50_000_000
# Decoded segments kept between the map pass and the rewrite pass; beyond, they are re-read.
DEFAULT_MEMORY_BYTES = 1 << 30


@dataclass(frozen=True)
class CompactionPlan:
    clean: list[Segment]  # wholly below the cleaned point
    dirty: list[Segment]  # cleaned by this run, in offset order
    cleaned_offset: int  # C before the run
    new_cleaned_offset: int  # C after it
    dirty_ratio: float
    why: str
    expired: frozenset[str]  # clean segments whose tombstones are past their horizon


def plan_compaction(
    state: PartitionState,
    config: Mapping[str, Any],
    now: int,
    max_dirty_records: int = DEFAULT_MAX_DIRTY_RECORDS,
) -> CompactionPlan | str:
    """What a run would clean, from the manifest alone, or why it would not run."""
    if "compact" not in policies(config):
        return f"cleanup.policy={config['cleanup.policy']}, nothing to compact"
    if not state.segments:
        return "empty"
    lso = state.last_stable_offset
    lag = int(config["min.compaction.lag.ms"])
    young = now - lag
    cleanable: list[Segment] = []
    head = ""
    for seg in state.segments:
        # The head stays: an open transaction, and anything younger than the minimum lag.
        if seg.last_offset >= lso:
            head = f"open transaction at offset {lso}"
            break
        if seg.max_timestamp_ms > young:
            head = f"records younger than min.compaction.lag.ms ({lag} ms) from offset "
            head += str(seg.base_offset)
            break
        cleanable.append(seg)
    if not cleanable:
        return f"no cleanable segment: {head}"
    c = state.cleaned_offset
    clean = [s for s in cleanable if s.last_offset < c]
    dirty_all = [s for s in cleanable if s.last_offset >= c]
    total = sum(s.size_bytes for s in cleanable)
    ratio = sum(s.size_bytes for s in dirty_all) / total if total else 0.0
    expired = frozenset(
        s.path for s in clean if s.delete_horizon_ms is not None and s.delete_horizon_ms <= now
    )
    min_ratio = float(config["min.cleanable.dirty.ratio"])
    overdue = bool(dirty_all) and (
        now - min(s.min_timestamp_ms for s in dirty_all) > int(config["max.compaction.lag.ms"])
    )
    if dirty_all and ratio >= min_ratio:
        why = f"dirty ratio {ratio:.2f}"
    elif overdue:
        why = "max.compaction.lag.ms passed"
    elif expired:
        why = "tombstones past delete.retention.ms"
    else:
        return f"dirty ratio {ratio:.2f} below min.cleanable.dirty.ratio {min_ratio:g}"
    dirty: list[Segment] = []
    records = 0
    for seg in dirty_all:
        if dirty and records + seg.record_count > max_dirty_records:
            break  # the rest waits for the next run
        dirty.append(seg)
        records += seg.record_count
    new_c = max(c, dirty[-1].last_offset + 1) if dirty else c
    return CompactionPlan(clean, dirty, c, new_c, ratio, why, expired)


def compact_partition(store: Store, item: WorkItem, options: dict[str, Any]) -> PartitionResult:
    """The compaction job's per-partition function (runs on an executor)."""
    part = item.open(store)
    state = part.state()
    now = now_ms(options)
    result = PartitionResult.starting(item, OPERATION, state)
    plan = plan_compaction(
        state, item.config, now, int(options.get("max_dirty_records") or DEFAULT_MAX_DIRTY_RECORDS)
    )
    if isinstance(plan, str):
        result.reason = plan
        return result
    try:
        _Cleaner(
            part,
            plan,
            item.config,
            now,
            int(options.get("memory_bytes") or DEFAULT_MEMORY_BYTES),
        ).run(result, dry_run=bool(options.get("dry_run")))
    except SegmentReplacedError as exc:
        # A planned segment was replaced and vacuumed since the plan (PROTOCOL.md 24 item 8):
        # a lost race, not a missing segment; the next run plans from the newest state.
        result.outcome = "conflict"
        result.reason = f"{exc}; the next run starts over"
    return result


class _Cleaner:
    def __init__(
        self,
        part: Partition,
        plan: CompactionPlan,
        config: Mapping[str, Any],
        now: int,
        memory_bytes: int,
    ) -> None:
        self.part = part
        self.plan = plan
        self.config = config
        self.now = now
        self.memory_bytes = memory_bytes
        self.tables: dict[str, pa.Table] = {}  # decoded segments kept for the rewrite pass
        self.kept_bytes = 0
        self.compression = _codec(config)
        self.superseded: dict[str, np.ndarray[Any, Any]] = {}

    # -- reading -------------------------------------------------------------------------------

    def _read(self, seg: Segment) -> pa.Table:
        table = self.tables.pop(seg.path, None)
        if table is not None:
            self.kept_bytes -= table.nbytes
            return table
        return self.part.read_segment(seg)

    def _keep(self, seg: Segment, table: pa.Table) -> bool:
        if self.kept_bytes + table.nbytes > self.memory_bytes:
            return False
        self.tables[seg.path] = table
        self.kept_bytes += table.nbytes
        return True

    def _offset_map(self) -> tuple[pa.Array, np.ndarray[Any, Any]]:
        """(keys the dirty range holds, the sorted highest offset of each)."""
        pieces = []
        for seg in self.plan.dirty:
            table = self.part.read_segment(seg)
            kept = self._keep(seg, table)
            keys, offsets = (
                table.column("key").combine_chunks(),
                table.column("offset").combine_chunks(),
            )
            if not kept:  # copy out of the file's buffers so that they can be freed
                keys = pa.concat_arrays([keys, keys.slice(0, 0)])
                offsets = pa.concat_arrays([offsets, offsets.slice(0, 0)])
            pieces.append(pa.table({"key": keys, "offset": offsets}))
        if not pieces:
            return pa.array([], pa.binary()), np.empty(0, np.int64)
        records = pa.concat_tables(pieces)
        records = records.filter(pc.is_valid(records.column("key")))
        latest = records.group_by("key", use_threads=True).aggregate([("offset", "max")])
        offsets = np.sort(latest.column("offset_max").to_numpy())
        return latest.column("key").combine_chunks(), offsets

    def _superseded_clean(self, keys: pa.Array) -> dict[str, np.ndarray[Any, Any]]:
        """For each clean segment holding a key the dirty range supersedes (it must be
        rewritten), which of its records are superseded. One hash lookup for the whole clean
        prefix: only its key column is decoded."""
        if len(keys) == 0 or not self.plan.clean:
            return {}
        pieces, bounds = [], [0]
        for seg in self.plan.clean:
            column = self.part.read_segment(seg, ["key"]).column("key").combine_chunks()
            pieces.append(pa.concat_arrays([column, column.slice(0, 0)]))
            bounds.append(bounds[-1] + len(column))
        hits = pc.is_in(pa.concat_arrays(pieces), value_set=keys).to_numpy(zero_copy_only=False)
        masks = {}
        for i, seg in enumerate(self.plan.clean):
            mask = hits[bounds[i] : bounds[i + 1]]
            if mask.any():
                masks[seg.path] = mask
        return masks

    # -- the run -------------------------------------------------------------------------------

    def run(self, result: PartitionResult, *, dry_run: bool = False) -> None:
        """Clean, committing group by group; a dry run does the same reading and filtering,
        writes nothing and reports exactly the records and segments that would go."""
        keys, latest = self._offset_map()
        self.superseded = self._superseded_clean(keys)
        rewrite = set(self.superseded) | set(self.plan.expired) | {s.path for s in self.plan.dirty}
        key_set = keys if len(keys) else None
        retention = int(self.config["delete.retention.ms"])
        fresh = delete_horizon(self.now, retention)

        def horizon_of(seg: Segment) -> int | None:
            if seg.last_offset >= self.plan.cleaned_offset:
                return fresh  # dirty: its tombstones are seen for the first time
            if seg.path in self.plan.expired:
                return None  # its tombstones go now
            return seg.delete_horizon_ms

        groups = _groups(
            [*self.plan.clean, *self.plan.dirty],
            rewrite,
            int(self.config["segment.bytes"]),
            horizon_of,
            time_window_ms(self.config),
        )
        is_latest = _Membership(latest, self.plan.cleaned_offset, self.plan.new_cleaned_offset)
        reasons = [self.plan.why]
        would = _DryRun()
        replaced: set[str] = set()  # segments this run's commits removed
        for number, group in enumerate(groups):
            tables, horizon, read = [], None, 0
            for seg in group:
                source = self._read(seg)
                read += source.num_rows
                table, seg_horizon = self._filter(seg, source, key_set, is_latest, fresh)
                if table.num_rows:
                    tables.append(table)
                if seg_horizon is not None:
                    horizon = seg_horizon if horizon is None else max(horizon, seg_horizon)
            if dry_run:
                would.add(group, read, sum(t.num_rows for t in tables))
                continue
            last = number == len(groups) - 1
            written = None
            written_at = clock.monotonic()  # before the write: a slow write counts too
            if tables:
                written = write_segment(
                    self.part.storage,
                    self.part.directory,
                    pa.concat_tables(tables),
                    compression=self.compression,
                    fmt=FORMAT_PARQUET,
                    layout=self.part.layout,
                )
            new_c = self.plan.new_cleaned_offset if last else None
            # The dirty segments this run has not replaced yet hold the newest record of each
            # key, which decided what this group drops: were one removed meanwhile (a late
            # commit withdrawn, PROTOCOL.md 23.2; a merge), a record dropped here could be its
            # key's newest left. The group commits only while they are all still live.
            deciding = {s.path for s in self.plan.dirty} - replaced
            if not replace_segments(
                self.part,
                group,
                written,
                horizon,
                self.now,
                OPERATION,
                new_c,
                written_at,
                still_live=deciding,
            ):
                result.outcome = "conflict"
                reasons.append(
                    f"a concurrent commit changed segments of group {number + 1} of "
                    f"{len(groups)}; the next run starts over"
                )
                break
            replaced.update(s.path for s in group)
            result.outcome = "committed"
            result.commits += 1
            result.segments_removed += len(group)
            result.bytes_after -= sum(s.size_bytes for s in group)
            result.records_after -= sum(s.record_count for s in group)
            if written is not None:
                result.segments_written += 1
                result.bytes_after += written.size_bytes
                result.records_after += written.record_count
            if new_c is not None:
                result.cleaned_offset = new_c
        if not groups:  # only possible when nothing at all is to be rewritten
            reasons.append("nothing to rewrite")
        if dry_run:
            would.report(result, self.plan.why, self.plan.new_cleaned_offset)
            return
        result.reason = "; ".join(reasons)

    def _filter(
        self,
        seg: Segment,
        table: pa.Table,
        keys: pa.Array | None,
        is_latest: _Membership,
        fresh: int,
    ) -> tuple[pa.Table, int | None]:
        """The records of ``seg`` that survive, and the delete horizon of the tombstones kept."""
        offsets = table.column("offset").to_numpy()
        key = table.column("key")
        null_key = pc.is_null(key).to_numpy(zero_copy_only=False)
        tombstone = pc.is_null(table.column("value")).to_numpy(zero_copy_only=False) & ~null_key
        dirty = offsets >= self.plan.cleaned_offset
        keep = np.ones(len(offsets), bool)
        if dirty.any():
            keep[dirty] = is_latest(offsets[dirty])
        clean = ~dirty
        expired = seg.delete_horizon_ms is not None and seg.delete_horizon_ms <= self.now
        if clean.any():
            superseded = self.superseded.get(seg.path)
            if (
                superseded is None
                and keys is not None
                and seg.last_offset >= self.plan.cleaned_offset
            ):
                # A dirty segment that also holds clean records (written by an interrupted run).
                superseded = pc.is_in(key, value_set=keys).to_numpy(zero_copy_only=False)
            if superseded is not None:
                keep &= ~(clean & superseded)
            if expired:
                keep &= ~(clean & tombstone)
        keep |= null_key  # never dropped
        horizon = None
        kept_tombstones = keep & tombstone
        if kept_tombstones.any():
            # First seen now (dirty, or a clean segment with no horizon): now + retention.
            if (kept_tombstones & dirty).any() or seg.delete_horizon_ms is None:
                horizon = fresh
            if (kept_tombstones & clean).any() and seg.delete_horizon_ms is not None:
                horizon = max(horizon or 0, seg.delete_horizon_ms)
        if keep.all():
            return table, horizon
        return table.filter(pa.array(keep)), horizon


@dataclass
class _DryRun:
    """What a dry run would do: counted group by group as a real run would commit."""

    segments: int = 0
    written: int = 0
    records: int = 0
    dropped: int = 0
    bytes: int = 0
    kept_bytes: int = 0

    def add(self, group: list[Segment], read: int, kept: int) -> None:
        size = sum(s.size_bytes for s in group)
        self.segments += len(group)
        self.written += 1 if kept else 0
        self.records += read
        self.dropped += read - kept
        self.bytes += size
        # The new file's size is known only once written: the kept records' share of the input.
        self.kept_bytes += size * kept // read if read else 0

    def report(self, result: PartitionResult, why: str, cleaned: int) -> None:
        result.outcome = "dry-run"
        result.segments_removed = self.segments
        result.segments_written = self.written
        result.records_after = result.records_before - self.dropped
        result.bytes_after = result.bytes_before - self.bytes + self.kept_bytes
        result.reason = (
            f"{why}: would drop {self.dropped} of {self.records} record(s), rewriting {self.segments} "
            f"segment(s) ({self.bytes} bytes) into {self.written} (about {self.kept_bytes} "
            f"bytes), cleaned point {result.cleaned_offset} -> {cleaned}"
        )


class _Membership:
    """Is an offset one of a sorted set? A bitmap over the dirty range when it is dense enough,
    else a binary search."""

    def __init__(self, members: np.ndarray[Any, Any], low: int, high: int) -> None:
        self.members = members
        self.low = low
        self.bitmap: np.ndarray[Any, Any] | None = None
        span = high - low
        if 0 < span <= 8 * len(members) + (1 << 24):
            self.bitmap = np.zeros(span, bool)
            self.bitmap[members - low] = True

    def __call__(self, offsets: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        if self.bitmap is not None:
            inside = (offsets >= self.low) & (offsets < self.low + len(self.bitmap))
            out = np.zeros(len(offsets), bool)
            out[inside] = self.bitmap[offsets[inside] - self.low]
            return out
        index = np.searchsorted(self.members, offsets)
        found = index < len(self.members)
        out = np.zeros(len(offsets), bool)
        out[found] = self.members[index[found]] == offsets[found]
        return out


def delete_horizon(now: int, retention_ms: int) -> int:
    """The delete horizon given to tombstones first seen at ``now``: ``now + retention_ms``
    rounded up to an eighth of ``retention_ms``. Rounding makes the tombstones of nearby runs
    share one horizon, so that their segments may be grouped and merged (segments with
    different horizons never are: a merged segment would keep the older tombstones too long)."""
    quantum = max(1, retention_ms // 8)
    return -(-(now + retention_ms) // quantum) * quantum


# Retention may be late by at most this fraction of retention.ms because of a rewrite.
RETENTION_LATENESS_FRACTION = 10


def time_window_ms(config: Mapping[str, Any]) -> int:
    """The largest time span (newest minus oldest record timestamp) of a segment that merging or
    compaction writes from several inputs: ``segment.ms``, and, on a topic whose
    ``cleanup.policy`` includes delete with a finite ``retention.ms``, at most a tenth of
    ``retention.ms``. Retention removes a segment when its newest record has expired, so a
    rewritten segment's oldest record outlives its retention deadline by at most this window
    (PROTOCOL.md 22.4); records of different ages never hide behind one another for longer."""
    config = {**defaults(), **config}  # a partial config (a plan made by hand) gets defaults
    window = int(config["segment.ms"])
    retention = int(config["retention.ms"])
    if "delete" in policies(config) and retention >= 0:
        window = min(window, max(1, retention // RETENTION_LATENESS_FRACTION))
    return window


@dataclass
class _Span:
    """The timestamps a group of segments covers, to keep it within the time window."""

    window: int
    low: int | None = None
    high: int | None = None

    def fits(self, seg: Segment) -> bool:
        if self.low is None or self.high is None:
            return True
        low, high = min(self.low, seg.min_timestamp_ms), max(self.high, seg.max_timestamp_ms)
        return high - low <= self.window

    def add(self, seg: Segment) -> None:
        self.low = seg.min_timestamp_ms if self.low is None else min(self.low, seg.min_timestamp_ms)
        self.high = (
            seg.max_timestamp_ms if self.high is None else max(self.high, seg.max_timestamp_ms)
        )

    def reset(self) -> None:
        self.low = self.high = None


def compatible(horizon: int | None, other: int | None) -> bool:
    """May segments with these horizons share an output? None: holds no tombstone that waits."""
    return horizon is None or other is None or horizon == other


def _groups(
    segments: list[Segment],
    rewrite: set[str],
    max_bytes: int,
    horizon_of: Callable[[Segment], int | None],
    window_ms: int,
) -> list[list[Segment]]:
    """Runs of adjacent segments to rewrite, each up to ``max_bytes`` of input (at least one
    segment), of one delete horizon and within the time window, in offset order."""
    groups: list[list[Segment]] = []
    current: list[Segment] = []
    size, horizon = 0, None
    span = _Span(window_ms)
    for seg in segments:
        if seg.path not in rewrite:
            if current:
                groups.append(current)
            current, size, horizon = [], 0, None
            span.reset()
            continue
        mine = horizon_of(seg)
        if current and (
            size + seg.size_bytes > max_bytes or not compatible(horizon, mine) or not span.fits(seg)
        ):
            groups.append(current)
            current, size, horizon = [], 0, None
            span.reset()
        current.append(seg)
        span.add(seg)
        size += seg.size_bytes
        horizon = horizon if mine is None else mine
    if current:
        groups.append(current)
    return groups


def _codec(config: Mapping[str, Any]) -> str:
    # "producer" keeps what the producer chose; the producer's default is uncompressed.
    codec = str(config.get("compression.type", "producer"))
    return "uncompressed" if codec == "producer" else codec


def replace_segments(
    part: Partition,
    group: list[Segment],
    written: SegmentFile | None,
    horizon: int | None,
    now: int,
    operation: str,
    cleaned: int | None = None,
    written_at: float | None = None,
    *,
    still_live: Collection[str] = (),
) -> bool:
    """Commit: remove ``group``, add ``written`` over the same offset range (and advance the
    cleaned point). False, with the new file deleted, when a concurrent commit removed any of
    the group's segments or of ``still_live`` first (a producer's appends never cause that), or
    when ``written``, whose write started at ``written_at`` (``kstore.clock.monotonic()``), is
    too old to commit."""
    new_paths = [written.path] if written is not None else []

    def build(state: PartitionState) -> list[Action] | None:
        return replacement_actions(
            state, group, written, horizon, now, cleaned, written_at, still_live=still_live
        )

    try:
        landed = (
            part.commit_actions(
                build,
                operation=operation.upper(),
                written_at=written_at if new_paths else None,
            )
            is not None
        )
    except StaleWriteError:
        landed = False  # refused before sending: certainly not committed
    except (ConcurrentModificationError, CommitConflictError):
        _discard(part, new_paths)  # certainly not committed; an unknown outcome keeps the file
        raise
    if not landed:
        _discard(part, new_paths)
    return landed


def replacement_actions(
    state: PartitionState,
    group: list[Segment],
    written: SegmentFile | None,
    horizon: int | None,
    now: int,
    cleaned: int | None = None,
    written_at: float | None = None,
    *,
    still_live: Collection[str] = (),
) -> list[Action] | None:
    """The actions that replace ``group`` with ``written`` in ``state`` (:func:`replace_segments`), or
    None when a segment of the group, or one of ``still_live`` (the segments whose records
    decided what ``written`` leaves out), is no longer live, or ``written`` is too old to
    commit."""
    live = {s.path for s in state.segments}
    if not ({s.path for s in group} | set(still_live)) <= live or (
        written_at is not None and too_old_to_commit(written_at)
    ):
        return None
    actions: list[Action] = [{"remove": {"path": s.path, "deletionTimestamp": now}} for s in group]
    if written is not None:
        actions.append(
            Segment(
                path=written.path,
                base_offset=group[0].base_offset,
                last_offset=group[-1].last_offset,
                record_count=written.record_count,
                min_timestamp_ms=written.min_timestamp_ms,
                max_timestamp_ms=written.max_timestamp_ms,
                size_bytes=written.size_bytes,
                checksum=written.checksum,
                format=written.format,
                sparse=True,
                created_ms=int(time.time() * 1000),
                delete_horizon_ms=horizon,
            ).to_action()
        )
    if cleaned is not None and cleaned > state.cleaned_offset:
        actions.append({"cleaned": {"offset": cleaned}})
    return actions


def _discard(part: Partition, paths: list[str]) -> None:
    """Delete new files no commit references (they would otherwise wait for vacuum). Only a
    partition's own segment files: a data object (layout 3, ``_data/``) holds other
    partitions' records too, and only vacuum may delete it."""
    mine = [f"{part.directory}/{p}" for p in paths if not p.startswith(DATA_PREFIX)]
    if mine:
        part.storage.delete(mine)
