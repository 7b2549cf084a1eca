"""A partition's manifest, replayed: segments, offsets, producers, transactions.

Pure data and replay rules, with no pyarrow: administration (describing topics and groups)
reads manifests without paying for the data libraries' import.
"""

from __future__ import annotations

import bisect
import heapq
import operator
import re
from dataclasses import dataclass, field
from typing import Any

from kstore.errors import (
    CorruptLogError,
    DuplicateSequenceError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)
from kstore.log import Action, LogState, compact_json
from kstore.settings import is_int

# Layout 3's data objects live in the topic incarnation directory, beside the partitions.
DATA_PREFIX = "_data/"
PRODUCER_EXPIRATION_MS = 86_400_000  # Kafka's producer.id.expiration.ms default: one day
# An entry whose batch is among the newest this many batches of a partition's producer entries
# (by offset: the log's own order, which no writer's clock moves) stays in checkpoints whatever
# the times say (PROTOCOL.md 8.9): a producer whose clock runs a day behind is still live.
RECENT_PRODUCERS = 1_000


# Layout 3 at version 5: a range of the data a commit file carries names that file (11.8).
_CARRIED_PATH = re.compile(r"_log(?:\.[1-9][0-9]*)?/[0-9]{20}\.json")


def is_carried_path(path: str) -> bool:
    """Whether a ranged add's path names a commit file of a topic log (PROTOCOL.md 11.8)."""
    return _CARRIED_PATH.fullmatch(path) is not None


def in_incarnation(path: str) -> bool:
    """Whether a manifest path lives in the topic incarnation directory: a data object or a
    commit file that carries data (else it is in the partition directory)."""
    return path.startswith(DATA_PREFIX) or is_carried_path(path)


def segment_location(partition_dir: str, path: str) -> str:
    """Where a manifest path lives: a data object, or a commit file that carries data, in the
    topic incarnation directory (the partition directory's parent), anything else in the
    partition directory."""
    if path.startswith((DATA_PREFIX, "_log")):
        return f"{partition_dir.rsplit('/', 1)[0]}/{path}"
    return f"{partition_dir}/{path}"


_BASE_OFFSET = operator.attrgetter("base_offset")
_set = object.__setattr__


@dataclass(frozen=True, slots=True)
class Segment:
    """A live segment as the manifest records it. ``base_offset``..``last_offset`` is the
    offset range it covers; a sparse segment may hold fewer records than that range.

    Slotted: a state holds every live segment and a reader or writer adds one per partition a
    commit touches; without a ``__dict__`` each is one object for the garbage collector to
    promote and scan instead of two."""

    path: str
    base_offset: int
    last_offset: int
    record_count: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    size_bytes: int
    checksum: str
    format: str
    sparse: bool
    created_ms: int
    # "<producer id>:<transaction version>" while written by an open transaction; records of
    # an open transaction are invisible to read_committed readers until its marker commits.
    transaction: str | None = None
    # Compaction's tombstone clock (Kafka's deleteHorizonMs, KIP-534): no record tombstone in
    # this segment below the cleaned point may be dropped before this time, ms.
    delete_horizon_ms: int | None = None
    # Layout 3: the bytes ``[start, start + length)`` of a shared data object ("_data/...",
    # relative to the topic incarnation directory) rather than a whole per-partition file.
    byte_range: tuple[int, int] | None = None
    # The segment's add action as a compact JSON line, once made (add_line, keep_line).
    _add_line: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def in_data_object(self) -> bool:
        return self.byte_range is not None

    def to_action(self, *, open_transaction: bool = True) -> Action:
        return add_action(
            self.path,
            self.base_offset,
            self.last_offset,
            self.record_count,
            self.min_timestamp_ms,
            self.max_timestamp_ms,
            self.size_bytes,
            self.checksum,
            self.format,
            self.sparse,
            self.created_ms,
            transaction=self.transaction if open_transaction else None,
            delete_horizon_ms=self.delete_horizon_ms,
            byte_range=self.byte_range,
        )

    def keep_line(self, body: dict[str, Any], line: str) -> None:
        """Keep ``line``, the compact JSON of ``body`` (without ``partition``), as this
        segment's :meth:`add_line` if ``body`` is exactly this segment's :meth:`to_action`:
        the same fields in the same order, so its encoding is the same line. A writer then
        encodes a new segment once, for its commit, not again for each base that holds it."""
        if (
            tuple(body) == (_ADD_KEYS if self.byte_range is None else _RANGED_ADD_KEYS)
            and type(body["sparse"]) is bool
            and type(body["createdTime"]) is int
            and self.transaction is None
            and self.delete_horizon_ms is None
        ):
            object.__setattr__(self, "_add_line", line)

    def add_line(self, *, open_transaction: bool = True) -> str:
        """:meth:`to_action` as a compact JSON line, kept once made (for a segment outside
        an open transaction, whose line never changes)."""
        if self.transaction is not None and open_transaction:
            return compact_json(self.to_action(open_transaction=True))
        line = self._add_line
        if line is None:
            line = compact_json(self.to_action(open_transaction=False))
            object.__setattr__(self, "_add_line", line)
        return line

    @classmethod
    def from_action(cls, body: dict[str, Any]) -> Segment:
        get = body.get
        path, checksum, fmt = get("path"), get("checksum"), get("format")
        base, last, records = get("baseOffset"), get("lastOffset"), get("records")
        min_ts, max_ts, size = get("minTimestamp"), get("maxTimestamp"), get("size")
        # Exact types in one test (a checkpoint holds an add per live segment); anything else
        # takes the checks that name the field at fault.
        if not (
            type(path) is str
            and type(checksum) is str
            and type(fmt) is str
            and type(base) is int
            and type(last) is int
            and type(records) is int
            and type(min_ts) is int
            and type(max_ts) is int
            and type(size) is int
        ):
            path, base, last = (
                _str(body, "path"),
                _int(body, "baseOffset"),
                _int(body, "lastOffset"),
            )
            records, min_ts = _int(body, "records"), _int(body, "minTimestamp")
            max_ts, size = _int(body, "maxTimestamp"), _int(body, "size")
            checksum, fmt = _str(body, "checksum"), _str(body, "format")
        transaction = get("transaction")
        value = get("range")
        if (
            type(value) is list
            and len(value) == 2
            and type(value[0]) is int
            and type(value[1]) is int
            and value[0] >= 0
            and value[1] >= 1
        ):
            byte_range: tuple[int, int] | None = (value[0], value[1])
        else:
            byte_range = _range(body)  # absent, or an error naming the field
        horizon = get("deleteHorizon")
        if horizon is not None and type(horizon) is not int:
            horizon = _optional_int(body, "deleteHorizon")
        created = get("createdTime", 0)
        # The fields set directly, as the frozen dataclass's __init__ sets them (through
        # object.__setattr__) but without its keyword handling: a checkpoint holds an add per
        # live segment, and opening a partition of 10,000 of them is mostly this.
        seg = object.__new__(cls)
        _set(seg, "path", path)
        _set(seg, "base_offset", base)
        _set(seg, "last_offset", last)
        _set(seg, "record_count", records)
        _set(seg, "min_timestamp_ms", min_ts)
        _set(seg, "max_timestamp_ms", max_ts)
        _set(seg, "size_bytes", size)
        _set(seg, "checksum", checksum)
        _set(seg, "format", fmt)
        _set(seg, "sparse", bool(get("sparse", False)))
        _set(seg, "created_ms", created if type(created) is int else int(created))
        _set(seg, "transaction", transaction if isinstance(transaction, str) else None)
        _set(seg, "delete_horizon_ms", horizon)
        _set(seg, "byte_range", byte_range)
        _set(seg, "_add_line", None)
        prefix = "segments/" if byte_range is None else DATA_PREFIX
        if (not seg.path.startswith(prefix) or ".." in seg.path or "\\" in seg.path) and not (
            byte_range is not None and is_carried_path(seg.path)
        ):
            raise CorruptLogError(f"add: illegal segment path {seg.path!r}")
        if byte_range is not None and (byte_range[1] != seg.size_bytes or seg.format != "arrow"):
            raise CorruptLogError(
                f"add {seg.path}: a range must be an arrow stream of 'size' bytes"
            )
        if seg.base_offset < 0 or seg.last_offset < seg.base_offset - 1 or seg.record_count < 0:
            raise CorruptLogError(f"add {seg.path}: inconsistent offsets/records")
        if seg.sparse and seg.record_count > seg.last_offset - seg.base_offset + 1:
            raise CorruptLogError(f"add {seg.path}: more records than offsets in its range")
        if not seg.sparse and seg.record_count != seg.last_offset - seg.base_offset + 1:
            raise CorruptLogError(
                f"add {seg.path}: dense segment record count does not match its offsets"
            )
        return seg


def add_action(
    path: str,
    base_offset: int,
    last_offset: int,
    record_count: int,
    min_timestamp_ms: int,
    max_timestamp_ms: int,
    size_bytes: int,
    checksum: str,
    fmt: str,
    sparse: bool,
    created_ms: int,
    *,
    transaction: str | None = None,
    delete_horizon_ms: int | None = None,
    byte_range: tuple[int, int] | None = None,
) -> Action:
    """A segment's ``add`` action (Segment.to_action), made from its fields: a writer's
    append makes one per partition it commits without building the Segment first."""
    body: dict[str, Any] = {
        "path": path,
        "baseOffset": base_offset,
        "lastOffset": last_offset,
        "records": record_count,
        "minTimestamp": min_timestamp_ms,
        "maxTimestamp": max_timestamp_ms,
        "size": size_bytes,
        "checksum": checksum,
        "format": fmt,
        "sparse": sparse,
        "createdTime": created_ms,
    }
    if transaction is not None:
        body["transaction"] = transaction
    if delete_horizon_ms is not None:
        body["deleteHorizon"] = delete_horizon_ms
    if byte_range is not None:
        body["range"] = list(byte_range)
    return {"add": body}


# The fields of a segment's add action without a transaction or delete horizon, in the
# order of Segment.to_action, as a writer's commit holds them (the partition last).
_ADD_KEYS = (
    "path",
    "baseOffset",
    "lastOffset",
    "records",
    "minTimestamp",
    "maxTimestamp",
    "size",
    "checksum",
    "format",
    "sparse",
    "createdTime",
    "partition",
)
_RANGED_ADD_KEYS = (*_ADD_KEYS[:-1], "range", "partition")


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """The last batch a producer committed to this partition (idempotence and fencing)."""

    epoch: int
    first_sequence: int
    last_sequence: int
    base_offset: int
    last_offset: int
    timestamp_ms: int


@dataclass(frozen=True)
class AppendResult:
    base_offset: int
    last_offset: int
    version: int | None  # None when the batch had already been committed (a duplicate)
    log_append_time_ms: int
    duplicate: bool = False


class _LiveIndex:
    """Live segments by path, cheap to copy: a base dict shared by copies and never changed
    once shared, and this copy's additions and removals since. A reader or writer copies the
    state of every partition a commit changes; copying a dict of thousands of live segments
    for each cost more than the rest of the commit. The changes are folded into a new base once
    they outnumber the square root of its size (at least 64): copies stay small, and folding
    costs a constant share per change. A base no copy shares yet (a state being loaded from a
    checkpoint, or one just folded) takes changes in place: replaying a checkpoint of 10,000
    live segments through additions and folds cost a quarter of opening its partition."""

    __slots__ = ("_added", "_base", "_dropped", "_owned")

    def __init__(self, base: dict[str, Segment] | None = None) -> None:
        self._base: dict[str, Segment] = {} if base is None else base
        self._added: dict[str, Segment] = {}
        # Immutable: copies share it (removals are rare, a copy is made per commit).
        self._dropped: frozenset[str] = frozenset()
        self._owned = True  # no copy shares ``_base`` (nor are there changes beside it)

    def copy(self) -> _LiveIndex:
        clone = _LiveIndex.__new__(_LiveIndex)
        clone._base, clone._added, clone._dropped = self._base, dict(self._added), self._dropped
        self._owned = clone._owned = False
        return clone

    def __contains__(self, path: str) -> bool:
        return path in self._added or (path in self._base and path not in self._dropped)

    def add(self, seg: Segment) -> None:
        if self._owned:
            self._base[seg.path] = seg
            return
        self._added[seg.path] = seg
        self._fold_when_due()

    def pop(self, path: str) -> Segment | None:
        """Remove ``path`` and return its segment; None when it is not live."""
        if self._owned:
            return self._base.pop(path, None)
        seg = self._added.pop(path, None)
        if seg is None and path not in self._dropped:
            seg = self._base.get(path)
            if seg is not None:
                self._dropped = self._dropped | {path}
        self._fold_when_due()
        return seg

    def _fold_when_due(self) -> None:
        changes = len(self._added) + len(self._dropped)
        if changes > 64 and changes * changes > len(self._base):
            dropped = self._dropped
            if dropped:
                base = {k: v for k, v in self._base.items() if k not in dropped}
            else:
                base = dict(self._base)
            base.update(self._added)
            self._base, self._added, self._dropped, self._owned = base, {}, frozenset(), True


class PartitionState(LogState):
    """A partition's replayed manifest."""

    def __init__(self) -> None:
        super().__init__()
        # The live segments, sorted by base offset and non-overlapping, in two runs: a base
        # that copies share and no one changes once shared, and this state's own tail of the
        # segments appended since. A reader or writer copies the state of every partition a
        # commit touches: copying one list of thousands of live segments (between merges) cost
        # more than the rest of the commit, and grew with them. The tail is folded into a new
        # base once it outgrows the square root of the base (at least 64): copies stay small,
        # and folding costs a constant share per append.
        self._base: list[Segment] = []
        self._tail: list[Segment] = []
        self._base_owned = True  # no copy shares ``_base``: it may change in place
        self._flat: list[Segment] | None = None  # ``segments`` as one list, once asked for
        # The same segments by path: replay checks and removes a path in constant time, where
        # a scan of the list made opening a partition quadratic in its live segments.
        self._live = _LiveIndex()
        self.end_offset = 0  # the next offset to assign (Kafka's log end offset)
        self.log_start_offset = 0
        self.producers: dict[str, ProducerEntry] = {}
        self.txns: dict[str, int] = {}  # app id -> highest committed version
        self.removed: dict[str, int] = {}  # path -> time removed (for vacuum)
        # Whether ``removed`` is this state's own: copies share it until one changes it (it
        # holds every removed file until vacuum deletes it, tens of thousands after merges,
        # and a commit that adds a segment does not touch it).
        self._removed_owned = True
        self.cleaned_offset = 0  # compaction's cleaner point: below it the log is compacted
        self._time_index: list[int] | None = None  # running max of segment max timestamps
        self.open_transactions: dict[str, int] = {}  # "<producer>:<version>" -> first offset
        self.ended_transactions: dict[str, int] = {}  # producer -> newest version with a marker
        # Whether ``txns``, ``open_transactions`` and ``ended_transactions`` are this state's
        # own: copies share them until one changes them (most commits touch none of them).
        self._txns_owned = True
        # Layout 2 only: the partition log was sealed by an upgrade to this layout (26.9).
        self.sealed_layout: int | None = None

    def copy(self) -> PartitionState:
        clone: PartitionState = super().copy()  # type: ignore[assignment]
        clone._tail = list(self._tail)
        self._base_owned = clone._base_owned = False
        clone._live = self._live.copy()
        clone.producers = dict(self.producers)
        self._removed_owned = clone._removed_owned = False
        self._txns_owned = clone._txns_owned = False
        clone._time_index = None
        return clone

    def view(self) -> PartitionState:
        """A shallow copy (shares the lists and dicts): for read-only use of a published state."""
        clone = object.__new__(PartitionState)
        clone.__dict__.update(self.__dict__)
        # Neither changes the removed files or the segments they share in place (a copy of
        # the view may change its own).
        self._removed_owned = clone._removed_owned = False
        self._base_owned = clone._base_owned = False
        self._txns_owned = clone._txns_owned = False
        return clone

    # -- replay --------------------------------------------------------------------------------

    def apply(self, name: str, body: dict[str, Any]) -> None:
        if name == "add":
            seg = Segment.from_action(body)
            last = self.last_segment
            # Appends and checkpoints add in offset order: after the last segment, which is
            # then the only one that can overlap.
            at_end = last is None or last.base_offset <= seg.base_offset
            if at_end:
                overlaps = last is not None and last.last_offset >= seg.base_offset
            else:
                overlaps = seg.base_offset < self.end_offset and self._overlaps(seg)
            if overlaps:
                raise CorruptLogError(f"add {seg.path}: overlaps a live segment")
            if seg.path in self._live:
                raise CorruptLogError(f"add {seg.path}: the path is already a live segment")
            if at_end:
                self._append(seg)
            else:
                bisect.insort(self._own_segments(), seg, key=_BASE_OFFSET)
            self._live.add(seg)
            self._time_index = None
            self.end_offset = max(self.end_offset, seg.last_offset + 1)
            if seg.transaction is not None:
                self._own_txns()
                first = self.open_transactions.get(seg.transaction)
                self.open_transactions[seg.transaction] = (
                    seg.base_offset if first is None else min(first, seg.base_offset)
                )
            if seg.path in self.removed:
                self._own_removed().pop(seg.path)
        elif name == "remove":
            path = _str(body, "path")
            gone = self._live.pop(path)
            if gone is None:
                raise CorruptLogError(f"remove {path}: not a live segment")
            segments = self._own_segments()
            # Only empty segments share a base offset: the walk past equal ones is short.
            i = bisect.bisect_left(segments, gone.base_offset, key=_BASE_OFFSET)
            while segments[i].path != path:
                i += 1
            del segments[i]
            self._time_index = None
            self._own_removed()[path] = _int(body, "deletionTimestamp")
        elif name == "logStart":
            self.log_start_offset = max(self.log_start_offset, _int(body, "offset"))
        elif name == "endOffset":  # only in checkpoints: the end survives removal of all segments
            self.end_offset = max(self.end_offset, _int(body, "offset"))
        elif name == "producer":
            get = body.get
            pid, epoch, first_seq = get("id"), get("epoch"), get("firstSequence")
            last_seq, base, end = get("lastSequence"), get("baseOffset"), get("lastOffset")
            # Exact types in one test (a producer action per partition of every append);
            # anything else takes the checks that name the field at fault.
            if not (
                type(pid) is str
                and type(epoch) is int
                and type(first_seq) is int
                and type(last_seq) is int
                and type(base) is int
                and type(end) is int
            ):
                pid, epoch = _str(body, "id"), _int(body, "epoch")
                first_seq, last_seq = _int(body, "firstSequence"), _int(body, "lastSequence")
                base, end = _int(body, "baseOffset"), _int(body, "lastOffset")
            self.producers[pid] = ProducerEntry(
                epoch, first_seq, last_seq, base, end, int(get("timestamp", 0))
            )
        elif name == "txn":
            self._own_txns()
            app = _str(body, "appId")
            self.txns[app] = max(self.txns.get(app, -1), _int(body, "version"))
        elif name == "txnMarker":
            # Ends a transaction: its records become visible (commit) or were removed in the
            # same commit (abort). The marker's epoch fences older instances of the producer.
            key = f"{_str(body, 'producerId')}:{_int(body, 'version')}"
            self._own_txns()
            self.open_transactions.pop(key, None)
            pid, epoch = _str(body, "producerId"), _int(body, "epoch")
            self.ended_transactions[pid] = max(
                self.ended_transactions.get(pid, -1), _int(body, "version")
            )
            entry = self.producers.get(pid)
            if entry is None or entry.epoch < epoch:
                self.producers[pid] = ProducerEntry(
                    epoch, -1, -1, -1, -1, int(body.get("timestamp", 0))
                )
        elif name == "txnEnded":  # only in checkpoints: the newest ended transaction per producer
            pid = _str(body, "producerId")
            self._own_txns()
            self.ended_transactions[pid] = max(
                self.ended_transactions.get(pid, -1), _int(body, "version")
            )
        elif name == "sealed":
            self.sealed_layout = _int(body, "layout")
        elif name == "cleaned":
            self.cleaned_offset = max(self.cleaned_offset, _int(body, "offset"))
        elif name == "tombstone":  # only in checkpoints: a removed file awaiting vacuum
            self._own_removed()[_str(body, "path")] = _int(body, "deletionTimestamp")
        elif name == "vacuumed":  # removed files now deleted from storage: forget them
            paths = body.get("paths")
            if not isinstance(paths, list) or not all(isinstance(p, str) for p in paths):
                raise CorruptLogError(f"field 'paths' must be a list of strings, got {paths!r}")
            for path in paths:
                if path in self.removed:
                    self._own_removed().pop(path)
        else:
            super().apply(name, body)

    def _own_txns(self) -> None:
        """Copy the transaction dicts first if a copy of this state shares them."""
        if not self._txns_owned:
            self.txns = dict(self.txns)
            self.open_transactions = dict(self.open_transactions)
            self.ended_transactions = dict(self.ended_transactions)
            self._txns_owned = True

    def _own_removed(self) -> dict[str, int]:
        """``removed``, copied first if a copy of this state shares it."""
        if not self._removed_owned:
            self.removed = dict(self.removed)
            self._removed_owned = True
        return self.removed

    def _overlaps(self, seg: Segment) -> bool:
        segments = self.segments
        i = bisect.bisect_right(segments, seg.base_offset, key=_BASE_OFFSET)
        if i > 0 and segments[i - 1].last_offset >= seg.base_offset:
            return True
        return i < len(segments) and segments[i].base_offset <= seg.last_offset

    def _append(self, seg: Segment) -> None:
        tail = self._tail
        tail.append(seg)
        self._flat = None
        if len(tail) > 64 and len(tail) * len(tail) > len(self._base):
            self._base, self._tail, self._base_owned = self._base + tail, [], True

    def _own_segments(self) -> list[Segment]:
        """All live segments as one list that no copy shares, to change in place (the rare
        changes that are not appends: removals, an add before the last segment)."""
        if self._tail or not self._base_owned:
            self._base, self._tail, self._base_owned = self._base + self._tail, [], True
        self._flat = None
        return self._base

    @property
    def segments(self) -> list[Segment]:
        """The live segments, sorted by base offset, as one list (made once per state, on
        first use). Read-only: replay keeps an index of them (assign a new list to replace
        them). A reader of a few segments near an offset uses :meth:`segment_index_for`,
        :meth:`segment_count` and :meth:`segment_slice`, which make no list of all of them."""
        flat = self._flat
        if flat is None:
            flat = self._flat = self._base + self._tail if self._tail else self._base
        return flat

    @segments.setter
    def segments(self, segments: list[Segment]) -> None:
        self._base, self._tail, self._base_owned = list(segments), [], True
        self._flat = None
        self._live = _LiveIndex({s.path: s for s in self._base})
        self._time_index = None

    @property
    def last_segment(self) -> Segment | None:
        """The live segment with the highest base offset, if any."""
        run = self._tail or self._base
        return run[-1] if run else None

    def segment_count(self) -> int:
        return len(self._base) + len(self._tail)

    def segment_slice(self, start: int, stop: int) -> list[Segment]:
        """``segments[start:stop]`` (non-negative bounds), without making the whole list."""
        base, tail = self._base, self._tail
        n = len(base)
        if not tail or stop <= n:
            return base[start:stop]
        if start >= n:
            return tail[start - n : stop - n]
        return base[start:] + tail[: stop - n]

    def live_add(self, path: str, partition: int | None) -> Action | None:
        for segment in self.segments:  # a rare path (a late commit taken back): no index
            if segment.path == path:
                return segment.to_action()
        return None

    def checkpoint_actions(self) -> list[Action]:
        return [
            *self._checkpoint_head(),
            *(
                s.to_action(open_transaction=s.transaction in self.open_transactions)
                for s in self.segments
            ),
            *self._checkpoint_rest(),
        ]

    def checkpoint_lines(self) -> list[str]:
        """:meth:`checkpoint_actions` without ``protocol``, as compact JSON lines (a base
        sidecar's content, PROTOCOL.md 7.4). Each new base of a partition holds all its live
        segments again: a segment's line is encoded once and kept (segments never change)."""
        head = [compact_json(a) for a in self._checkpoint_head() if "protocol" not in a]
        open_transactions = self.open_transactions
        return [
            *head,
            *(
                s.add_line(open_transaction=s.transaction in open_transactions)
                for s in self.segments
            ),
            *map(compact_json, self._checkpoint_rest()),
        ]

    def _checkpoint_head(self) -> list[Action]:
        actions = super().checkpoint_actions()
        actions.append({"endOffset": {"offset": self.end_offset}})
        actions.append({"logStart": {"offset": self.log_start_offset}})
        if self.cleaned_offset:
            actions.append({"cleaned": {"offset": self.cleaned_offset}})
        return actions

    def _checkpoint_rest(self) -> list[Action]:
        actions: list[Action] = []
        # Producer entries expire as in Kafka (producer.id.expiration.ms): without it, every
        # producer instance that ever wrote here would stay in every checkpoint. Judged by times
        # in the state alone, so the checkpoint of a version is deterministic; and since those
        # are writers' clocks, no single writer may move the cut-off: it runs from the last
        # commit's time but no later than the lower median of the entries' own times, so a
        # minority of clocks running fast cannot drop the other producers' entries.
        #
        # A time cut-off alone lost the entries of a producer whose clock runs a day behind
        # the others (issue 45): every entry it wrote looked a day old to the median, so after
        # a reload its retry of an ambiguous batch was appended again. So an entry also stays
        # while its batch is among the newest RECENT_PRODUCERS entries' batches by offset, an
        # order no clock moves; only an entry that is old by the times *and* that that many
        # producers have followed in the partition goes (PROTOCOL.md 8.9).
        times = sorted(p.timestamp_ms for p in self.producers.values() if p.timestamp_ms > 0)
        reference = self.last_commit_ms or 0
        if times:
            reference = min(reference, times[(len(times) - 1) // 2])
        horizon = reference - PRODUCER_EXPIRATION_MS
        # The lowest lastOffset among the newest RECENT_PRODUCERS batches (0: every batch is;
        # a marker's entry, lastOffset -1, has none and goes by the times alone).
        recent = 0
        if any(p.timestamp_ms < horizon for p in self.producers.values()):
            batches = [p.last_offset for p in self.producers.values() if p.last_offset >= 0]
            if len(batches) > RECENT_PRODUCERS:
                recent = heapq.nlargest(RECENT_PRODUCERS, batches)[-1]
        for pid, p in sorted(self.producers.items()):
            if p.timestamp_ms <= 0:
                continue
            if p.timestamp_ms < horizon and not 0 <= recent <= p.last_offset:
                continue
            actions.append(
                {
                    "producer": {
                        "id": pid,
                        "epoch": p.epoch,
                        "firstSequence": p.first_sequence,
                        "lastSequence": p.last_sequence,
                        "baseOffset": p.base_offset,
                        "lastOffset": p.last_offset,
                        "timestamp": p.timestamp_ms,
                    }
                }
            )
        for pid, version in sorted(self.ended_transactions.items()):
            actions.append({"txnEnded": {"producerId": pid, "version": version}})
        for app, version in sorted(self.txns.items()):
            actions.append({"txn": {"appId": app, "version": version}})
        for path, when in sorted(self.removed.items()):
            actions.append({"tombstone": {"path": path, "deletionTimestamp": when}})
        if self.sealed_layout is not None:
            actions.append({"sealed": {"layout": self.sealed_layout}})
        return actions

    # -- lookups -------------------------------------------------------------------------------

    @property
    def last_stable_offset(self) -> int:
        """Below this offset no record belongs to an open transaction (Kafka's LSO):
        read_committed readers stop here."""
        if not self.open_transactions:
            return self.end_offset
        return min(self.end_offset, *self.open_transactions.values())

    @property
    def start_offset(self) -> int:
        """The first offset a reader may ask for (Kafka's log start offset)."""
        return self.log_start_offset

    def segment_index_for(self, offset: int) -> int:
        """Index of the first live segment that may hold ``offset`` or anything after it."""
        base, tail = self._base, self._tail
        seg: Segment | None
        if tail and tail[0].base_offset <= offset:
            j = bisect.bisect_right(tail, offset, key=_BASE_OFFSET) - 1
            i, seg = len(base) + j, tail[j]
        else:
            i = bisect.bisect_right(base, offset, key=_BASE_OFFSET) - 1
            seg = base[i] if i >= 0 else None
        if seg is not None and seg.last_offset >= offset:
            return i
        return i + 1

    def segments_for_time(self, timestamp_ms: int) -> int:
        """Index of the first segment that has a record at or after ``timestamp_ms``.

        Timestamps are not monotonic across segments (CreateTime), but the running maximum of
        each segment's newest timestamp is, and it first reaches ``timestamp_ms`` exactly at
        the first segment holding such a record: a binary search over it is exact.
        """
        if self._time_index is None:
            running, index = -(1 << 62), []
            for seg in self.segments:
                running = max(running, seg.max_timestamp_ms)
                index.append(running)
            self._time_index = index
        return bisect.bisect_left(self._time_index, timestamp_ms)

    @property
    def size_bytes(self) -> int:
        return sum(s.size_bytes for s in self.segments)

    @property
    def record_count(self) -> int:
        return sum(s.record_count for s in self.segments)


@dataclass
class ProducerBatch:
    """Idempotence data a producer attaches to one partition commit."""

    producer_id: str
    epoch: int
    first_sequence: int
    last_sequence: int
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= self.first_sequence <= self.last_sequence:
            raise ValueError(
                f"bad producer sequence range {self.first_sequence}..{self.last_sequence}"
            )

    def check(self, state: PartitionState) -> ProducerEntry | None:
        """None if this batch is new and in order; the committed entry if it is the last
        batch already committed (a retried or ambiguous commit); raises otherwise."""
        entry = state.producers.get(self.producer_id)
        if entry is None:
            return None
        if self.epoch < entry.epoch:
            raise ProducerFencedError(
                f"producer {self.producer_id} epoch {self.epoch} is fenced by epoch {entry.epoch}"
            )
        if self.epoch > entry.epoch:
            return None  # a new instance; sequences restart
        if (
            self.first_sequence == entry.first_sequence
            and self.last_sequence == entry.last_sequence
        ):
            return entry
        if self.first_sequence <= entry.last_sequence:
            raise DuplicateSequenceError(
                f"producer {self.producer_id}: sequence {self.first_sequence} was already committed "
                f"(last {entry.last_sequence})"
            )
        if self.first_sequence != entry.last_sequence + 1:
            raise OutOfOrderSequenceError(
                f"producer {self.producer_id}: sequence {self.first_sequence} does not follow "
                f"{entry.last_sequence}"
            )
        return None

    def action(self, base_offset: int, last_offset: int, now_ms: int) -> Action:
        return {
            "producer": {
                **self.extra,  # first: never replaces the fields idempotence relies on
                "id": self.producer_id,
                "epoch": self.epoch,
                "firstSequence": self.first_sequence,
                "lastSequence": self.last_sequence,
                "baseOffset": base_offset,
                "lastOffset": last_offset,
                "timestamp": now_ms,
            }
        }


def _range(body: dict[str, Any]) -> tuple[int, int] | None:
    value = body.get("range")
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(type(v) is int for v in value)
        or value[0] < 0
        or value[1] < 1
    ):
        raise CorruptLogError(f"field 'range' must be [start >= 0, length >= 1], got {value!r}")
    return value[0], value[1]


def _str(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str):
        raise CorruptLogError(f"field {name!r} must be a string, got {value!r}")
    return value


def _optional_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not is_int(value):
        raise CorruptLogError(f"field {name!r} must be an integer, got {value!r}")
    return value


def _int(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if not is_int(value):
        raise CorruptLogError(f"field {name!r} must be an integer, got {value!r}")
    return value
