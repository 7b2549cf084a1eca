"""Recovering a damaged log: ``kstore topics recover`` (docs/PROTOCOL.md 17.7).

A commit file that is cut, overwritten with garbage or deleted from the middle of a log stops
every reader of the log at it (9.3, 14.1): in layout 3 every partition of its topic log. Kafka
recovers a damaged log segment by truncating it to its last valid batch; here the versions
after the damaged one hold acknowledged records whose data is intact, so a recovery keeps
them, at their offsets, and gives up only what the damaged versions held:

1. Readers start from the newest checkpoint that loads (its sidecars included); the versions
   after it are checked one by one, as a reader replays them.
2. A version that is missing (with a later one present) or corrupt gets a **RECOVER commit**
   in its place, so the log has no gap and every later version replays as before. It holds no
   action but the ``protocol`` at version 0 and, from a damaged file, the part of a partition
   that can be verified: an append's adds whose data objects still have their size and
   CRC-32C, starting at the partition's end offset. The damaged file is moved to the recovery
   folder first, never deleted.
3. A later version that no longer applies without the lost ones (a merge's ``remove`` of a
   range the lost version added) is rewritten without what does not apply, one partition at a
   time: a ``remove`` of a segment that is not live is left out; a partition whose actions
   still do not apply is left out of that commit (its records stay where they were). The
   original goes to the recovery folder; a data-carrying commit keeps its data bytes.
4. A corrupt checkpoint (newer than the one readers start from, or the hinted one) is moved to
   the recovery folder, and a ``_last_checkpoint`` that would send readers to it, or through a
   damaged version below the start, names the checkpoint readers start from (or is moved away
   when none loads).
5. Offsets are never reused: where the records a lost version held are known to reach past
   the partition's end offset (lines of a cut file that still parse, a consumer group's
   committed offset), one more RECOVER commit, after the newest version, raises the end
   offset with ``endOffset`` actions.

Nothing changes without ``apply``: :func:`recover_topic` then first copies every file it
replaces or moves into ``<incarnation>/_recovery/<id>/`` (which readers ignore, 4.3), with the
report as ``recovery.json``, then writes, then loads every log again as a reader does.
Stop the topic's writers first: a writer that read a version before it was damaged would
build on what the recovery takes away.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import crc32c

from kstore import __version__
from kstore.errors import (
    CorruptLogError,
    IllegalStateError,
    KStoreError,
    UnknownTopicOrPartitionError,
)
from kstore.layout import partition_dir, topic_data_dir
from kstore.log import (
    LAST_CHECKPOINT,
    Action,
    Log,
    LogState,
    carried_data_offset,
    checkpoint_file,
    decode_commit,
    encode_commit,
    parse_log_file_name,
    protocol_action,
    version_file,
)
from kstore.manifest import PartitionState, Segment
from kstore.settings import is_int
from kstore.storage import unique_id
from kstore.topic_log import TopicLogFiles, TopicLogState, shared_log_dir

if TYPE_CHECKING:
    from kstore.store import Store, TopicMetadata

OPERATION = "RECOVER"
RECOVERY_DIR = "_recovery"  # in the incarnation directory: not part of the store (4.3)
REPORT_FILE = "recovery.json"

Actions = list[tuple[str, dict[str, Any]]]


# -- the report ------------------------------------------------------------------------------


@dataclass
class LostRecords:
    """Offsets of one partition that no version holds any more. ``end_offset`` (exclusive) is
    None when nothing after the loss shows where it ended: the lost version may have held
    records there, how many is unknown."""

    partition: int
    first_offset: int
    end_offset: int | None
    cause: str

    @property
    def records(self) -> int | None:
        return None if self.end_offset is None else self.end_offset - self.first_offset

    def describe(self) -> str:
        if self.end_offset is None:
            return (
                f"partition {self.partition}: any records {self.cause} held from offset "
                f"{self.first_offset} on (no later version shows whether it held any, nor how "
                "many; those offsets will be given to new records)"
            )
        last = self.end_offset - 1
        span = (
            f"offset {last}" if last == self.first_offset else f"offsets {self.first_offset}-{last}"
        )
        return f"partition {self.partition}: {span} ({self.records} record(s)), {self.cause}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "records": self.records}


@dataclass
class Fix:
    """One file of a log and what the recovery does to it."""

    version: int | None  # None: the _last_checkpoint hint
    kind: str  # "missing", "corrupt", "rewritten", "checkpoint", "hint", "end offsets"
    path: str  # store-relative
    problem: str  # what a reader meets there
    action: str  # what the recovery does about it
    moved_to: str | None = None  # where the original goes (store-relative)
    dropped: list[str] = field(default_factory=list)  # actions left out of a rewritten commit
    kept: list[str] = field(default_factory=list)  # a damaged file's adds kept (verified)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LogRecovery:
    """One log of the topic (a topic log, or in layout 2 a partition log)."""

    name: str  # "topic log 1", "partition 3"
    directory: str
    start: int  # the checkpoint readers start from (-1: version 0)
    newest: int  # the newest version found (-1: an empty log)
    fixes: list[Fix] = field(default_factory=list)
    lost: list[LostRecords] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # damage readers never meet, and the like
    end_offsets: dict[int, int] = field(default_factory=dict)  # partition -> raised end offset
    # What is written, by store-relative path: the bytes, and whether the path exists (a
    # replacement, after its copy) or not (put-if-absent). Not part of the report.
    writes: dict[str, tuple[bytes, bytes | None]] = field(default_factory=dict, repr=False)
    moves: dict[str, bytes] = field(default_factory=dict, repr=False)  # path -> original bytes
    reader: Log[Any] | None = field(default=None, repr=False)  # loads the log as readers do

    @property
    def needed(self) -> bool:
        return bool(self.fixes)

    def to_json(self) -> dict[str, Any]:
        return {
            "log": self.name,
            "directory": self.directory,
            "start": self.start,
            "newest": self.newest,
            "fixes": [f.to_json() for f in self.fixes],
            "lost": [lost.to_json() for lost in self.lost],
            "end_offsets": {str(p): e for p, e in sorted(self.end_offsets.items())},
            "notes": self.notes,
        }


@dataclass
class RecoveryReport:
    topic: str
    topic_id: str
    applied: bool
    logs: list[LogRecovery]
    recovery_id: str | None = None
    folder: str | None = None  # store-relative; set when applied (and something was done)

    @property
    def needed(self) -> bool:
        return any(log.needed for log in self.logs)

    @property
    def lost(self) -> list[LostRecords]:
        return [lost for log in self.logs for lost in log.lost]

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "topic_id": self.topic_id,
            "applied": self.applied,
            "needed": self.needed,
            "recovery_id": self.recovery_id,
            "folder": self.folder,
            "logs": [log.to_json() for log in self.logs],
        }


# -- planning ----------------------------------------------------------------------------------


@dataclass
class _Kind:
    """What differs between a topic log (layout 3) and a partition log (layout 2)."""

    log: Log[Any]
    info: dict[str, Any]  # commitInfo fields naming the log (topic, log or partition)
    partition: int | None  # layout 2: the log's partition; None: actions name theirs
    incarnation: str  # the topic incarnation's directory (store-relative)
    members: list[int]  # the partitions whose state the log holds

    def partition_root(self, partition: int) -> str:
        """The directory a partition's ``segments/`` paths are relative to (4.2)."""
        return f"{self.incarnation}/{partition}"

    def key(self, body: dict[str, Any]) -> int | None:
        if self.partition is not None:
            return self.partition
        value = body.get("partition")
        return value if is_int(value) else None

    def part(self, state: LogState, partition: int) -> PartitionState:
        if isinstance(state, TopicLogState):
            return state.partition(partition)
        assert isinstance(state, PartitionState)
        return state

    def partitions(self, state: LogState) -> list[int]:
        if isinstance(state, TopicLogState):
            return sorted(state.partitions)
        return [self.partition] if self.partition is not None else []

    def end_action(self, partition: int, offset: int) -> Action:
        body: dict[str, Any] = {"offset": offset}
        if self.partition is None:
            body["partition"] = partition
        return {"endOffset": body}


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _where(kind: _Kind, name: str) -> str:
    return f"{kind.log.storage.display_url}/{kind.log.directory}/{name}"


class _Planner:
    """Plans the recovery of one log: reads only."""

    def __init__(
        self,
        kind: _Kind,
        label: str,
        protocol: Action,
        recovery_id: str,
        folder: str,
        group_offsets: dict[int, tuple[int, str]],
    ) -> None:
        self.kind = kind
        self.log = kind.log
        self.storage = kind.log.storage
        self.directory = kind.log.directory
        self.protocol = protocol
        self.recovery_id = recovery_id
        self.folder = folder
        self.group_offsets = group_offsets
        self.out = LogRecovery(label, self.directory, -1, -1)
        self.out.reader = kind.log
        # Offsets known to have been given out (a cut file's readable adds): partition -> end.
        self.seen_ends: dict[int, tuple[int, str]] = {}
        self.damaged: list[int] = []  # versions replaced by a RECOVER commit, in order
        self.attributed: set[int] = set()  # ... that some lost records were traced to
        # The newest version with an action for each partition (the checkpoint, at first).
        self.touched: dict[int, int] = {}
        self.unreadable_below: set[int] = set()  # versions below the start readers cannot read
        self.listed: set[int] = set()  # the commit versions listed

    # -- helpers -----------------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return f"{self.directory}/{name}"

    def _moved(self, name: str) -> str:
        """Where the original of ``name`` is kept: its path below the incarnation directory
        (``_log.2/...``; in layout 2 ``<partition>/_log/...``), below the recovery folder."""
        below = self.directory.removeprefix(f"{self.kind.incarnation}/")
        return f"{self.folder}/{below}/{name}"

    def _info(self, version: int, replaces: str) -> dict[str, Any]:
        return {
            **self.kind.info,
            "timestamp": int(time.time() * 1000),
            "operation": OPERATION,
            "commitId": unique_id(),
            "writer": f"kstore/{__version__}",
            "recovery": {"id": self.recovery_id, "version": version, "replaces": replaces},
        }

    def _apply(self, state: LogState, version: int, actions: Actions) -> LogState:
        """``actions`` applied to a copy of ``state`` (raises as replay does); the copy."""
        trial = state.copy()
        for name, body in actions:
            trial.apply(name, body)
        trial.stamp(version)
        return trial

    def _note_adds(self, before: LogState, actions: Actions, version: int) -> None:
        """An add whose offsets start past its partition's end (appends never do, 10): the
        offsets between were given to records of the damaged versions since the partition's
        previous version, and are lost."""
        for name, body in actions:
            partition = self.kind.key(body)
            if partition is None:
                continue
            base = body.get("baseOffset")
            if name == "add" and is_int(base):
                end = self.kind.part(before, partition).end_offset
                if base > end:
                    cause = self._cause(partition, version)
                    self.out.lost.append(LostRecords(partition, end, base, cause))
            self.touched[partition] = version

    def _cause(self, partition: int, version: int) -> str:
        since = self.touched.get(partition, self.out.start)
        damaged = [v for v in self.damaged if since < v < version]
        if not damaged:
            return "lost before this recovery (no damaged version explains them)"
        self.attributed.update(damaged)
        shown = ", ".join(map(str, damaged[:5])) + (" ..." if len(damaged) > 5 else "")
        return f"held by {'version' if len(damaged) == 1 else 'versions'} {shown}"

    # -- the walk ------------------------------------------------------------------------------

    def plan(self) -> tuple[LogRecovery, LogState | None]:
        listing = self.storage.list_dir(self.directory)
        versions: set[int] = set()
        checkpoints: list[int] = []
        hint_present = False
        for info in listing:
            parsed = parse_log_file_name(info.name)
            if parsed is not None:
                (checkpoints.append(parsed[0]) if parsed[1] else versions.add(parsed[0]))
            elif info.name == LAST_CHECKPOINT:
                hint_present = True
        if not versions and not checkpoints:
            return self.out, None  # a log never written to: nothing to recover

        self.listed = versions
        hinted = self._hinted() if hint_present else None
        start, bad_checkpoints = self._start(sorted(checkpoints, reverse=True), hinted)
        state: LogState = start if start is not None else self.log.state_factory()
        if isinstance(state, TopicLogState):
            state.keeps_pending, state.pending = False, {}  # no checkpoint is written from it
        self.out.start = state.version
        newest = max(versions | {state.version})
        self.out.newest = newest
        if state.version < 0 and versions and min(versions) > 0:
            raise CorruptLogError(
                f"{self.storage.display_url}/{self.directory}: versions before {min(versions)} "
                "are gone and no checkpoint that loads covers them; a recovery cannot rebuild "
                "them (restore the log from a backup)"
            )
        self._below_start(state, hinted)
        for version in range(state.version + 1, newest + 1):
            state = self._version(state, version, version in versions, newest)
        self._checkpoints(bad_checkpoints, start, hint_present)
        self._raise_ends(state, newest)
        self._settle(state)
        return self.out, state

    def _hinted(self) -> int | None:
        """The version ``_last_checkpoint`` names, or None (absent or malformed: 7.3)."""
        hint = self.storage.read_if_exists(self._path(LAST_CHECKPOINT))
        try:
            named = json.loads(hint or b"")["version"]
        except (ValueError, KeyError, TypeError):
            return None
        return named if is_int(named) else None

    def _settle(self, state: LogState) -> None:
        """Lost offsets that a kept segment covers after all (a merge, written before the
        damage, of the ranges a lost version added) are not lost: only what no live segment
        of the recovered state covers is reported."""
        settled: list[LostRecords] = []
        for lost in self.out.lost:
            if lost.end_offset is None:
                settled.append(lost)
                continue
            position = lost.first_offset
            for seg in self.kind.part(state, lost.partition).segments:
                if seg.last_offset < position or seg.base_offset >= lost.end_offset:
                    continue
                if seg.base_offset > position:
                    settled.append(
                        LostRecords(lost.partition, position, seg.base_offset, lost.cause)
                    )
                position = max(position, seg.last_offset + 1)
            if position < lost.end_offset:
                settled.append(LostRecords(lost.partition, position, lost.end_offset, lost.cause))
        self.out.lost = settled

    def _start(
        self, newest_first: list[int], hinted: int | None
    ) -> tuple[LogState | None, list[tuple[int, str]]]:
        """The newest checkpoint that loads, and those that do not among the newer ones and
        the one the hint names (the only ones readers start from, 14.1)."""
        bad: list[tuple[int, str]] = []
        found: LogState | None = None
        for version in newest_first:
            try:
                found = self.log._read_checkpoint(version)  # the sidecars too (as verify does)
            except CorruptLogError as exc:
                bad.append((version, _short(exc)))
                continue
            if found is not None:
                break
        if (
            hinted is not None
            and hinted in newest_first
            and (found is None or hinted < found.version)
        ):
            try:
                self.log._read_checkpoint(hinted)
            except CorruptLogError as exc:
                bad.append((hinted, _short(exc)))
        return found, bad

    def _below_start(self, state: LogState, hinted: int | None) -> None:
        """Versions at or below the checkpoint readers start from are not changed (readers
        never replay them) and not all read: only those a reader following the hint replays
        (between the checkpoint it names and this one), and those whose carried data (11.8)
        is still live. A damaged one is noted, with the live offsets it may no longer hold."""
        live: dict[int, list[tuple[int, Segment]]] = {}  # version -> (partition, segment)
        prefix = self.log.carried_path(0)[: -len(version_file(0))]
        for partition in self.kind.partitions(state):
            for seg in self.kind.part(state, partition).segments:
                if seg.path.startswith(prefix):
                    parsed = parse_log_file_name(seg.path[len(prefix) :])
                    if parsed is not None and not parsed[1]:
                        live.setdefault(parsed[0], []).append((partition, seg))
        wanted = set(live)
        if hinted is not None and hinted < state.version:
            wanted.update(range(hinted + 1, state.version + 1))
        versions = sorted(v for v in wanted if v <= state.version)
        for first in range(0, len(versions), 256):
            chunk = versions[first : first + 256]
            found = self.storage.read_many([self._path(version_file(v)) for v in chunk])
            for version in chunk:
                data = found.get(self._path(version_file(version)))
                if data is None:
                    self.unreadable_below.add(version)
                    continue
                try:
                    decode_commit(data, _where(self.kind, version_file(version)))
                except CorruptLogError as exc:
                    self.unreadable_below.add(version)
                    unreadable = [
                        (p, seg) for p, seg in live.get(version, []) if not _range_ok(data, seg)
                    ]
                    self.out.notes.append(self._below_note(state, version, _short(exc), unreadable))

    def _below_note(
        self, state: LogState, version: int, problem: str, unreadable: list[tuple[int, Segment]]
    ) -> str:
        text = (
            f"version {version} is damaged ({problem}), below checkpoint {state.version} that "
            "readers start from: left as it is (only time travel to the versions before that "
            "checkpoint meets it; the log retention deletes it)"
        )
        for partition, seg in unreadable:
            text += (
                f"; its data is still live: partition {partition} offsets "
                f"{seg.base_offset}-{seg.last_offset} cannot be read"
            )
        return text

    def _version(self, state: LogState, version: int, listed: bool, newest: int) -> LogState:
        name = version_file(version)
        path = self._path(name)
        data = self.storage.read_if_exists(path) if listed else None
        if data is None:
            later = "the newest version" if version == newest else f"versions up to {newest} exist"
            return self._replace(
                state,
                version,
                "missing",
                None,
                f"the commit file is missing ({later})",
            )
        try:
            info, actions = decode_commit(data, _where(self.kind, name))
            self.log._check_carried(version, info, actions)  # as replay checks it
        except CorruptLogError as exc:
            return self._replace(state, version, "corrupt", data, _short(exc))
        try:
            applied = self._apply(state, version, actions)
        except (CorruptLogError, KeyError, TypeError, ValueError) as exc:
            return self._rewrite(state, version, data, info, actions, _short(exc))
        self._note_adds(state, actions, version)
        return applied

    def _replace(
        self, state: LogState, version: int, kind: str, data: bytes | None, problem: str
    ) -> LogState:
        """A RECOVER commit in place of a missing or corrupt version: empty, but for the
        ``protocol`` at version 0 and what a damaged file still holds that can be verified
        (:meth:`_salvage`)."""
        name = version_file(version)
        actions: list[Action] = [self.protocol] if version == 0 else []
        kept: list[str] = []
        if data is not None:
            for partition, group in self._salvage(data, version).items():
                # An append starts at the partition's end offset (10): a damaged line that says
                # otherwise, or a partition that lost records before, is not trusted.
                expected = self.kind.part(state, partition).end_offset
                trusted = True
                for action in group:
                    body = action.get("add")
                    if body is None:
                        continue
                    trusted = trusted and body.get("baseOffset") == expected
                    last = body.get("lastOffset")
                    expected = last + 1 if isinstance(last, int) else -1
                if not trusted:
                    continue
                try:
                    self._apply(state, version, [(n, b) for a in group for n, b in a.items()])
                except (CorruptLogError, KeyError, TypeError, ValueError):
                    continue  # does not apply: its offsets stay known as given out
                actions.extend(group)
                for action in group:
                    body = action.get("add")
                    if body is not None:
                        kept.append(
                            f"partition {partition}: offsets {body['baseOffset']}-"
                            f"{body['lastOffset']} ({body['records']} record(s); "
                            f"{body['path']}, checksum verified)"
                        )
        salvaged = [(n, b) for a in actions for n, b in a.items() if n != "protocol"]
        self._note_adds(state, salvaged, version)
        payload = encode_commit(actions, self._info(version, kind))
        moved = self._moved(name) if data is not None else None
        self.out.fixes.append(
            Fix(
                version,
                kind,
                self._path(name),
                problem,
                ("a RECOVER commit" if kept else "an empty RECOVER commit")
                + " takes its place"
                + (" (with the log's protocol)" if version == 0 else "")
                + (", keeping what the damaged file still names" if kept else "")
                + (", the damaged file is moved to the recovery folder" if moved else ""),
                moved,
                kept=kept,
            )
        )
        self.out.writes[self._path(name)] = (payload, data)
        if data is not None:
            self.out.moves[self._path(name)] = data
        self.damaged.append(version)
        return self._apply(state, version, [(k, v) for a in actions for k, v in a.items()])

    def _salvage(self, data: bytes, version: int) -> dict[int, list[Action]]:
        """What a damaged commit still holds, line by line. Every ``add`` that parses tells
        offsets given out (kept as evidence, 5 in the module docstring). A partition's part is
        kept, in the RECOVER commit, when it is an append's (only ``add``, ``producer``,
        ``txn``: never part of a maintenance commit, whose removes without their add would
        lose records) and each of its adds names a file other than this commit whose bytes
        still match the add's size and checksum."""
        groups: dict[int, list[Action]] = {}
        refused: set[int] = set()
        for line in data.split(b"\n")[1:]:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if not isinstance(obj, dict) or len(obj) != 1:
                continue
            ((name, body),) = obj.items()
            if not isinstance(body, dict):
                continue
            partition = self.kind.key(body)
            if partition is None:
                continue
            last = body.get("lastOffset")
            if name == "add" and is_int(last):
                known = self.seen_ends.get(partition)
                if known is None or last + 1 > known[0]:
                    self.seen_ends[partition] = (
                        last + 1,
                        f"the lines of version {version} that can still be read",
                    )
            if name not in ("add", "producer", "txn") or (
                name == "add" and not self._verified(partition, body, version)
            ):
                refused.add(partition)
                continue
            groups.setdefault(partition, []).append({name: body})
        return {
            p: group
            for p, group in sorted(groups.items())
            if p not in refused and any("add" in a for a in group)
        }

    def _verified(self, partition: int, body: dict[str, Any], version: int) -> bool:
        """Whether the file an add names (not the damaged commit itself) still holds, at its
        range, bytes of the add's size and checksum (11.5)."""
        path, size, checksum = body.get("path"), body.get("size"), body.get("checksum")
        if not (isinstance(path, str) and isinstance(size, int) and isinstance(checksum, str)):
            return False
        if ".." in path or "\\" in path or path.startswith("_log"):
            return False  # the commit's own data (11.8) went with it
        span = body.get("range")
        try:
            if isinstance(span, list) and len(span) == 2 and all(type(v) is int for v in span):
                if not path.startswith("_data/"):
                    return False
                (found,) = self.storage.read_ranges(
                    f"{self.kind.incarnation}/{path}", [(span[0], span[0] + span[1])]
                )
            elif path.startswith("segments/"):
                found = self.storage.read(f"{self.kind.partition_root(partition)}/{path}")
            else:
                return False
        except FileNotFoundError:
            return False
        return len(found) == size and checksum == f"crc32c:{crc32c.crc32c(found):08x}"

    def _rewrite(
        self,
        state: LogState,
        version: int,
        data: bytes,
        info: dict[str, Any],
        actions: Actions,
        problem: str,
    ) -> LogState:
        """A version that does not apply on what the recovery keeps: rewritten one partition
        at a time, without what does not apply."""
        order: list[int | None] = []
        groups: dict[int | None, Actions] = {}
        for name, body in actions:
            key = self.kind.key(body) if name != "protocol" else None
            if key not in groups:
                order.append(key)
                groups[key] = []
            groups[key].append((name, body))
        kept: Actions = []
        dropped: list[str] = []
        current = state
        for key in order:
            group = groups[key]
            try:
                current = self._apply(current, state.version, group)
                kept.extend(group)
                continue
            except (CorruptLogError, KeyError, TypeError, ValueError):
                if key is None:  # not a partition's: nothing to leave out
                    raise CorruptLogError(
                        f"{_where(self.kind, version_file(version))}: does not apply ({problem})"
                    ) from None
            live = {s.path for s in self.kind.part(current, key).segments}
            without = [
                (n, b) for n, b in group if not (n == "remove" and b.get("path") not in live)
            ]
            try:
                current = self._apply(current, state.version, without)
                kept.extend(without)
                dropped.extend(
                    f"partition {key}: remove {b.get('path')} (not live: it was added by a "
                    "lost version)"
                    for n, b in group
                    if (n, b) not in without
                )
            except (CorruptLogError, KeyError, TypeError, ValueError) as exc:
                dropped.append(
                    f"partition {key}: all {len(group)} action(s) of this commit "
                    f"({', '.join(sorted({n for n, _ in group}))}; {_short(exc)})"
                )
        name = version_file(version)
        payload = self._rewritten(data, info, kept, version)
        self.out.fixes.append(
            Fix(
                version,
                "rewritten",
                self._path(name),
                f"does not apply once the damaged versions are replaced ({problem})",
                "rewritten without what does not apply; the original is moved to the recovery "
                "folder",
                self._moved(name),
                dropped,
            )
        )
        self.out.writes[self._path(name)] = (payload, data)
        self.out.moves[self._path(name)] = data
        applied = self._apply(state, version, kept)
        self._note_adds(state, kept, version)
        return applied

    def _rewritten(self, data: bytes, info: dict[str, Any], kept: Actions, version: int) -> bytes:
        actions = [{name: body} for name, body in kept]
        fields = {k: v for k, v in info.items() if k != "actions"}
        marked = {**fields, "recovery": {"id": self.recovery_id, "version": version}}
        offset = carried_data_offset(data, _where(self.kind, version_file(version)))
        if offset is None:
            return encode_commit(actions, marked)
        # A data-carrying commit (7.1, 11.8): the same data section at the same offset, so
        # that the ranges its adds name stay where they were; the text is shorter (actions
        # were left out), padded with spaces up to the data.
        for head in (marked, fields):
            text = encode_commit(actions, head)
            if len(text) <= offset:
                return text + b" " * (offset - len(text)) + data[offset:]
        raise CorruptLogError(  # cannot happen: leaving actions out never lengthens the text
            f"{_where(self.kind, version_file(version))}: the rewritten text does not fit before "
            "the data it carries"
        )

    def _checkpoints(
        self, bad: list[tuple[int, str]], start: LogState | None, hint_present: bool
    ) -> None:
        for version, problem in bad:
            name = checkpoint_file(version)
            data = self.storage.read_if_exists(self._path(name))
            if data is None:
                continue
            self.out.fixes.append(
                Fix(
                    version,
                    "checkpoint",
                    self._path(name),
                    problem,
                    "moved to the recovery folder (readers start from an older checkpoint)",
                    self._moved(name),
                )
            )
            self.out.moves[self._path(name)] = data
        hint_path = self._path(LAST_CHECKPOINT)
        hint = self.storage.read_if_exists(hint_path) if hint_present else None
        if hint is None:
            return
        try:
            named = json.loads(hint)["version"]
        except (ValueError, KeyError, TypeError):
            named = None
        if not is_int(named):
            return  # ignored by readers (7.3)
        moved = {version for version, _ in bad}
        if start is not None:
            # A hint readers would follow into trouble: to a checkpoint that does not load, or
            # to one below the start whose later versions up to it cannot all be read.
            blocked = named in moved or (
                named < start.version
                and any(
                    v in self.unreadable_below or v not in self.listed
                    for v in range(named + 1, start.version + 1)
                )
            )
            if not blocked:
                return
            payload = json.dumps({"version": start.version}).encode()
            action = f'set to {{"version": {start.version}}}, the checkpoint readers start from'
            self.out.writes[hint_path] = (payload, hint)
        elif named in moved:
            action = "moved to the recovery folder (no checkpoint loads: readers list the log)"
        else:
            return  # names a checkpoint that is not there: readers list the log (14.1)
        self.out.fixes.append(
            Fix(
                None,
                "hint",
                hint_path,
                f"names checkpoint {named}, which readers cannot start from",
                action,
                self._moved(LAST_CHECKPOINT),
            )
        )
        self.out.moves[hint_path] = hint

    def _raise_ends(self, state: LogState, newest: int) -> None:
        """Offsets known to have been given out past a partition's end are never given again:
        a RECOVER commit after the newest version raises the end offset (PROTOCOL.md 8.8)."""
        evidence: dict[int, tuple[int, str]] = {}
        for source in (self.seen_ends, self.group_offsets):
            for partition, (end, why) in source.items():
                if partition not in evidence or end > evidence[partition][0]:
                    evidence[partition] = (end, why)
        raised: list[Action] = []
        for partition, (end, why) in sorted(evidence.items()):
            current = self.kind.part(state, partition).end_offset
            # Only where no later action of the partition says where its offsets went on.
            open_ended = bool(self.damaged) and self.touched.get(partition, self.out.start) < max(
                self.damaged
            )
            if end > current and open_ended:
                self.out.end_offsets[partition] = end
                raised.append(self.kind.end_action(partition, end))
                cause = self._cause(partition, newest + 1)
                self.out.lost.append(LostRecords(partition, current, end, f"{cause} ({why})"))
        # A partition with no action after a damaged version: whether that version held
        # records of it, nothing shows (its end offset may be given out again from here).
        for partition in self.kind.members:
            if partition in self.out.end_offsets:
                continue
            since = self.touched.get(partition, self.out.start)
            if any(v > since for v in self.damaged):
                end = self.kind.part(state, partition).end_offset
                cause = self._cause(partition, newest + 1).removeprefix("held by ")
                self.out.lost.append(LostRecords(partition, end, None, cause))
        self._open_transactions(state)
        if not raised:
            return
        version = newest + 1
        name = version_file(version)
        payload = encode_commit(raised, self._info(version, "end offsets"))
        self.out.fixes.append(
            Fix(
                version,
                "end offsets",
                self._path(name),
                "offsets were given out past the end the kept versions reach",
                "a RECOVER commit raises the end offset of partition(s) "
                + ", ".join(f"{p} to {e}" for p, e in sorted(self.out.end_offsets.items()))
                + ": those offsets are never given out again",
            )
        )
        self.out.writes[self._path(name)] = (payload, None)

    def _open_transactions(self, state: LogState) -> None:
        """Transactions left open once versions were replaced: a lost version may have held
        their marker (18.2), and the last stable offset waits for them (18.3)."""
        if not self.damaged:
            return
        for partition in self.kind.members:
            part = self.kind.part(state, partition)
            for tag, first in sorted(part.open_transactions.items(), key=lambda item: item[1]):
                producer, _, version = tag.rpartition(":")
                ended = part.ended_transactions.get(producer, -1)
                certain = version.isdigit() and ended > int(version)
                self.out.notes.append(
                    f"partition {partition}: transaction {tag} is open from offset {first}"
                    + (
                        " although a later transaction of its producer ended here: its marker "
                        "was lost"
                        if certain
                        else " (its marker may have been in a lost version)"
                    )
                    + "; read_committed readers wait for it until `kstore transactions "
                    "abort-expired` aborts it (after its producer's transaction timeout)"
                )


def _range_ok(data: bytes, seg: Segment) -> bool:
    """Whether a commit file's bytes still hold a live segment's range: its size and CRC-32C
    (11.5), as a reader checks it."""
    if seg.byte_range is None:
        return False
    start, length = seg.byte_range
    piece = data[start : start + length]
    return len(piece) == length and f"crc32c:{crc32c.crc32c(piece):08x}" == seg.checksum


def _group_offsets(store: Store, topic: str) -> tuple[dict[int, tuple[int, str]], list[str]]:
    """The highest offset any consumer group committed for each partition of ``topic``: the
    records below it were read, so offsets below it were given out."""
    from kstore.groups import Group, list_groups

    out: dict[int, tuple[int, str]] = {}
    notes: list[str] = []
    try:
        names = list_groups(store)
    except KStoreError as exc:
        return out, [f"consumer groups not read ({_short(exc)})"]
    for group_id in names:
        try:
            offsets = Group(store, group_id).state().offsets
        except KStoreError as exc:
            notes.append(f"group {group_id!r} not read ({_short(exc)})")
            continue
        for tp, committed in offsets.items():
            if tp.topic != topic:
                continue
            offset = committed.offset
            if offset > out.get(tp.partition, (-1, ""))[0]:
                out[tp.partition] = (offset, f"group {group_id!r}'s committed offset {offset}")
    return out, notes


def _topic_protocol(store: Store, meta: TopicMetadata) -> Action:
    """The protocol a RECOVER commit at version 0 carries: the versions of the topic's
    metadata log, which the topic logs were created and are raised with (3.2, 27.4)."""
    state = store.topic_state(meta.name)
    return protocol_action(state.min_reader_version, state.min_writer_version)


def plan_recovery(store: Store, topic: str) -> RecoveryReport:
    """What :func:`recover_topic` would do (reads only)."""
    return recover_topic(store, topic, apply=False)


def recover_topic(store: Store, topic: str, *, apply: bool = False) -> RecoveryReport:
    """Recover the topic's logs as the module docstring says; with ``apply=False`` (a dry
    run) nothing is written. Raises :class:`CorruptLogError` when a log cannot be recovered
    (its early versions gone with no checkpoint), :class:`IllegalStateError` when a writer
    wrote meanwhile."""
    meta = store.topic(topic)
    if meta.layout not in (2, 3):
        raise UnknownTopicOrPartitionError(f"topic {topic!r} has unknown layout {meta.layout}")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    recovery_id = f"{stamp}-{unique_id()[:8]}"
    incarnation = topic_data_dir(meta.name, meta.topic_id)
    folder = f"{incarnation}/{RECOVERY_DIR}/{recovery_id}"
    protocol = _topic_protocol(store, meta)
    offsets, group_notes = _group_offsets(store, meta.name)
    logs: list[LogRecovery] = []
    for label, kind in _kinds(store, meta):
        ends = {p: e for p, e in offsets.items() if kind.partition in (None, p)}
        if kind.partition is None:
            count = max(1, min(meta.commit_logs, meta.partitions))
            index = kind.info["log"]
            ends = {p: e for p, e in ends.items() if p % count == index}
        planner = _Planner(kind, label, protocol, recovery_id, folder, ends)
        recovery, _ = planner.plan()
        if recovery.needed:
            recovery.notes.extend(group_notes)
        logs.append(recovery)
    report = RecoveryReport(meta.name, meta.topic_id, apply, logs, recovery_id)
    if apply and report.needed:
        _apply(store, report, folder)
        report.folder = folder
    return report


def _kinds(store: Store, meta: TopicMetadata) -> Iterable[tuple[str, _Kind]]:
    storage = store.storage
    incarnation = topic_data_dir(meta.name, meta.topic_id)
    if meta.layout == 3:
        count = max(1, min(meta.commit_logs, meta.partitions))
        for index in range(count):
            directory = shared_log_dir(incarnation, index)
            yield (
                f"topic log {index}",
                _Kind(
                    TopicLogFiles(storage, directory, TopicLogState),
                    {"topic": meta.name, "log": index},
                    None,
                    incarnation,
                    [p for p in range(meta.partitions) if p % count == index],
                ),
            )
        return
    for partition in range(meta.partitions):
        directory = f"{partition_dir(meta.name, meta.topic_id, partition)}/_log"
        yield (
            f"partition {partition}",
            _Kind(
                Log(storage, directory, PartitionState),
                {"topic": meta.name, "partition": partition},
                partition,
                incarnation,
                [partition],
            ),
        )


# -- applying ------------------------------------------------------------------------------------


def _apply(store: Store, report: RecoveryReport, folder: str) -> None:
    storage = store.storage
    storage.check_writable()
    # 1. Copies of everything replaced or moved, and the report, before any change.
    for log in report.logs:
        targets = {f.path: f.moved_to for f in log.fixes if f.moved_to is not None}
        for path, original in log.moves.items():
            storage.put_if_absent(targets[path], original)
    storage.put_if_absent(
        f"{folder}/{REPORT_FILE}",
        json.dumps(report.to_json(), indent=1, sort_keys=True).encode(),
    )
    # 2. The log files, in version order: a file that changed since it was read, or a missing
    #    version another writer created meanwhile, stops the recovery (nothing is overwritten
    #    that was not read).
    for log in report.logs:
        for path, (payload, original) in _in_order(log.writes):
            if original is None:
                try:
                    storage.put_if_absent(path, payload)
                except FileExistsError:
                    raise IllegalStateError(
                        f"{storage.display_url}/{path} was written while recovering: a writer is "
                        "running; stop the topic's writers and run the recovery again"
                    ) from None
                continue
            _check_unchanged(storage, path, original)
            storage.put(path, payload)
        for path, original in log.moves.items():
            if path not in log.writes:
                _check_unchanged(storage, path, original)
                storage.delete([path])
    # 3. Every log loads again, as a reader loads it.
    for log in report.logs:
        if not log.needed or log.reader is None:
            continue
        try:
            log.reader.load()
        except KStoreError as exc:
            raise CorruptLogError(
                f"{storage.display_url}/{log.directory}: still does not load after the "
                f"recovery ({_short(exc)}); the originals are in {folder}"
            ) from None


def _in_order(writes: dict[str, tuple[bytes, bytes | None]]) -> list[Any]:
    """Commits in version order, then the hint."""

    def key(item: tuple[str, Any]) -> tuple[int, str]:
        parsed = parse_log_file_name(item[0].rsplit("/", 1)[-1])
        return (parsed[0], item[0]) if parsed is not None else (1 << 62, item[0])

    return sorted(writes.items(), key=key)


def _check_unchanged(storage: Any, path: str, original: bytes) -> None:
    if storage.read_if_exists(path) != original:
        raise IllegalStateError(
            f"{storage.display_url}/{path} changed while recovering: a writer is running; stop "
            "the topic's writers and run the recovery again"
        )


def describe(report: RecoveryReport) -> list[str]:
    """The report as lines for people (the CLI's output)."""
    lines: list[str] = []
    for log in report.logs:
        if not log.needed and not log.notes:
            continue
        start = "replay from version 0" if log.start < 0 else f"start from checkpoint {log.start}"
        lines.append(f"{log.name} ({log.directory}): readers {start}; newest version {log.newest}")
        for fix in log.fixes:
            what = (
                LAST_CHECKPOINT
                if fix.version is None
                else (
                    f"checkpoint {fix.version}"
                    if fix.kind == "checkpoint"
                    else f"version {fix.version}"
                )
            )
            lines.append(f"  {what}: {fix.problem}")
            lines.append(f"    -> {fix.action}" + (f" ({fix.moved_to})" if fix.moved_to else ""))
            for item in fix.kept:
                lines.append(f"       kept: {item}")
            for item in fix.dropped:
                lines.append(f"       left out: {item}")
        for lost in log.lost:
            lines.append(f"  lost: {lost.describe()}")
        for note in log.notes:
            lines.append(f"  note: {note}")
    return lines
