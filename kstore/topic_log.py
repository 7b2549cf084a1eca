"""Layout 3's topic logs: one commit log shared by many partitions of a topic.

A topic of layout 3 keeps no log per partition. Its partitions share ``commit.logs`` topic
logs (partition ``p`` belongs to log ``p mod commit.logs``); every partition-scoped action in
a topic log names its ``partition``, and one commit may change many partitions at once, all
visible together. Replaying a topic log yields one :class:`PartitionState` per partition,
exactly the state a layout-2 partition log would replay to (docs/PROTOCOL.md 26).

Pure data and replay rules, like :mod:`kstore.manifest`: no pyarrow.
"""

from __future__ import annotations

import gzip
import re
import threading
import zlib
from collections.abc import Callable, Mapping
from typing import Any

from kstore import clock
from kstore.errors import CorruptLogError, InvalidArgumentError, UnsupportedFormatVersionError
from kstore.log import (
    MAX_LOG_FILE_BYTES,
    Action,
    CommitResult,
    Log,
    LogState,
    RetryPolicy,
    checkpoint_file,
    compact_json,
    decode_commit,
    protocol_action,
)
from kstore.manifest import PartitionState
from kstore.settings import is_int
from kstore.storage import unique_id

LAYOUT_V2 = 2
LAYOUT_V3 = 3
# The log protocol version that introduced layout 3 (PROTOCOL.md 3.2): topic logs written
# before version 4 are at it, and an upgrade seals partition logs with it.
LAYOUT3_VERSION = 3
# Version 4: a partition's state in a checkpoint may be a chain of sidecars, base and deltas,
# compressed (PROTOCOL.md 13.4). New topic logs, and the metadata logs of their topics, start at
# it; a topic log at version 3 keeps whole uncompressed sidecars until it is upgraded (27.4).
CHAIN_VERSION = 4
# Writer version 5: a checkpoint names no sidecar written more than SIDECAR_HORIZON versions
# before it (PROTOCOL.md 13.4), so vacuum can tell which old sidecars no kept checkpoint names
# from their names and the oldest kept checkpoint, without listing or reading the log (22.5).
# Readers are unaffected: new topic logs, and the metadata logs of their topics, start at
# {minReaderVersion 4, minWriterVersion 5}.
HORIZON_VERSION = 5
# Reader version 5, writer version 6: a commit may carry its flush's data (PROTOCOL.md 11.8),
# which a reader of version 4 would take for a corrupt file.
# Reader version 6, writer version 7: one sidecar file holds the new sidecars of a checkpoint,
# each named by its byte range (7.4), which a reader of version 5 would take for a corrupt
# sidecar. New topic logs, and the metadata logs of their topics, start at
# {minReaderVersion 6, minWriterVersion 7}.
SHARED_SIDECAR_VERSION = 6
SHARED_SIDECAR_WRITER_VERSION = 7
# Writer version 8: writers share a topic log's commits (PROTOCOL.md 30): pending flushes in
# ``_flushes*/`` that any writer's commit takes, and that vacuum must know. Nothing a reader
# reads changes, so readers stay at 6. New topic logs, and the metadata logs of their topics,
# start at {minReaderVersion 6, minWriterVersion 8}.
SHARED_COMMITS_WRITER_VERSION = 8
TOPIC_LOG_VERSION = SHARED_SIDECAR_VERSION
TOPIC_LOG_WRITER_VERSION = SHARED_COMMITS_WRITER_VERSION
SIDECAR_HORIZON = 10_000
# The bounds of a chain (PROTOCOL.md 13.4): a writer starts a new base rather than name more
# deltas than this, or deltas whose sizes add up to more than the base's: so loading a
# checkpoint reads at most twice the bytes of the partition's whole state, in at most
# MAX_DELTAS + 1 files read concurrently. A partition changed by every commit writes its base
# once per MAX_DELTAS + 1 checkpoints: 64 keeps that share near the deltas' own (13.4).
MAX_DELTAS = 64
# gzip level of compressed sidecars: JSON lines of paths, ids and numbers shrink ~4x at level 1
# and ~4.8x at 6, at ~5x the time; a checkpoint is written once and read by every reader.
SIDECAR_GZIP_LEVEL = 6

# A partition build: receives the partition's state as of the commit's base version and
# returns its actions (None: nothing to commit for it) or raises to refuse the commit.
PartitionBuild = Callable[[PartitionState], "list[Action] | None"]


def shares_sidecars(state: LogState) -> bool:
    """Whether a checkpoint of a log at ``state``'s versions may write its new sidecars as one
    shared file (PROTOCOL.md 7.4): reader version 6 and writer version 7."""
    return (
        state.min_reader_version >= SHARED_SIDECAR_VERSION
        and state.min_writer_version >= SHARED_SIDECAR_WRITER_VERSION
    )


def shares_commits(state: LogState) -> bool:
    """Whether the writers of a topic log at ``state``'s versions may share its commits
    (PROTOCOL.md 30.1): writer version 8, at reader version 6."""
    return (
        state.min_reader_version >= SHARED_SIDECAR_VERSION
        and state.min_writer_version >= SHARED_COMMITS_WRITER_VERSION
    )


def topic_log_protocol() -> Action:
    """The ``protocol`` a new topic log starts at (PROTOCOL.md 3.2)."""
    return protocol_action(TOPIC_LOG_VERSION, TOPIC_LOG_WRITER_VERSION)


_SIDECAR_NAME = re.compile(r"(0|[1-9][0-9]*)-([0-9]{20})-[0-9a-f]{32}\.json(?:\.gz)?")


def sidecar_name(name: str) -> tuple[int, int] | None:
    """(partition, version of the checkpoint that wrote it) of a sidecar's file name
    (PROTOCOL.md 5.8), or None when the name is not one a writer makes."""
    found = _SIDECAR_NAME.fullmatch(name)
    return None if found is None else (int(found.group(1)), int(found.group(2)))


def within_horizon(chain: list[Action], version: int) -> bool:
    """Whether a checkpoint of ``version`` may name every sidecar of ``chain`` (13.4): each was
    written at most SIDECAR_HORIZON versions before it, as its name says. The base is the
    oldest (each delta was written by a later checkpoint), so it alone is checked."""
    parsed = sidecar_name(str(chain[0]["path"]).removeprefix(f"{SIDECARS}/"))
    return parsed is not None and parsed[1] >= version - SIDECAR_HORIZON


def shared_log_dir(incarnation_dir: str, index: int) -> str:
    """Topic log ``index`` of an incarnation: ``_log`` for log 0, ``_log.<k>`` after it."""
    if not is_int(index) or index < 0:
        raise InvalidArgumentError(f"illegal topic log index {index!r}")
    return f"{incarnation_dir}/_log" if index == 0 else f"{incarnation_dir}/_log.{index}"


def log_index(partition: int, commit_logs: int) -> int:
    return partition % commit_logs


class TopicLogState(LogState):
    """A topic log replayed: partition number -> that partition's state.

    Copy-on-write per partition: a commit copies only the partitions it touches, so applying a
    commit costs what the commit changes, not the number of partitions of the topic.
    """

    def __init__(self) -> None:
        super().__init__()
        self.partitions: dict[int, PartitionState] = {}
        # Partitions already copied for the version being built (safe to change in place).
        self._own: set[int] = set()
        # Partition -> the topic log version that last changed it (checkpoint sidecars).
        self.changed: dict[int, int] = {}
        self._views: dict[int, PartitionState] = {}
        # The checkpoint this state descends from: its version and, per partition, the chain
        # of sidecars (a base, then deltas) that names its state there (a partition unchanged
        # since keeps its chain in the next checkpoint; a changed one may extend it).
        self.sidecar_version = -1
        self.sidecars: dict[int, list[Action]] = {}
        self.sidecars_seen = 0.0  # when that checkpoint was read or written (monotonic)
        # A writer's states (from its first commit on), and a state loaded from a checkpoint
        # for ``pending_limit`` versions past it, keep per partition its actions of the
        # versions after ``pending_since``, newest first, as an immutable linked list (node:
        # previous node, action name, body, version) shared by copies: the deltas of the next
        # checkpoint (13.4). A chain extends when ``pending_since`` is at most
        # ``sidecar_version`` (else a changed partition gets a new base). Other readers' states
        # keep none: they would only add to every garbage collection.
        self.keeps_pending = False
        self.pending: dict[int, _Pending] = {}
        self.pending_since = -1
        self.pending_limit = 1000  # versions past pending_since to keep actions for

    def copy(self) -> TopicLogState:
        clone: TopicLogState = super().copy()  # type: ignore[assignment]
        clone.partitions = dict(self.partitions)
        clone._own = set()
        clone.changed = dict(self.changed)
        clone._views = {}
        clone.sidecars = dict(self.sidecars)
        clone.pending = dict(self.pending)
        return clone

    def apply(self, name: str, body: dict[str, Any]) -> None:
        self._apply(name, body, None)

    def apply_encoded(self, name: str, body: dict[str, Any], line: str) -> None:
        self._apply(name, body, line)

    def _apply(self, name: str, body: dict[str, Any], line: str | None) -> None:
        partition = body.get("partition")
        if partition is None:
            if name in PARTITION_ACTIONS:
                raise CorruptLogError(f"action {name!r} in a topic log must name its partition")
            super().apply(name, body)
            return
        if name == "sidecar":  # checkpoints only: loaded by TopicLogFiles
            return
        if type(partition) is not int or partition < 0:
            raise CorruptLogError(f"action {name!r}: illegal partition {partition!r}")
        state = self.partitions.get(partition)
        if partition not in self._own:
            state = PartitionState() if state is None else state.copy()
            self.partitions[partition] = state
            self._own.add(partition)
        assert state is not None
        state.apply(name, body)
        self._views.pop(partition, None)
        if self.keeps_pending and name in PARTITION_ACTIONS:
            cut = None if line is None else _without_partition(line, partition, body)
            if cut is not None and name == "add":
                # The new segment's line in a base sidecar is this line without its partition,
                # when the body is exactly the one the segment's own action encodes.
                seg = state.last_segment
                if seg is not None and seg.path == body["path"]:
                    seg.keep_line(body, cut)
            # Kept for the delta of a checkpoint (13.4), with the version being built: the
            # line cut from its commit's, else the body (not changed once applied, so a
            # reference is enough) to encode then. A node of strings and numbers holds nothing
            # the garbage collector must follow, and it stops tracking it.
            self.pending[partition] = (
                self.pending.get(partition),
                name,
                body if cut is None else None,
                self.version + 1,
                cut,
            )

    def pending_lines(self, partition: int, after: int) -> list[str]:
        """The partition's actions of the versions after ``after``, in log order, without
        ``partition``, as compact JSON lines (a delta sidecar's content). An action whose
        commit line is known and ends with its partition is cut from that line, not encoded
        again: a checkpoint's deltas hold every action since the last, and encoding them
        again cost most of a checkpoint."""
        out: list[str] = []
        node = self.pending.get(partition)
        while node is not None and node[3] > after:
            node, name, body, _, cut = node
            if cut is None:
                assert body is not None
                cut = compact_json({name: {k: v for k, v in body.items() if k != "partition"}})
            out.append(cut)
        out.reverse()
        return out

    def adopt(self, lineage: Lineage) -> None:
        """Descend from ``lineage``, a checkpoint newer than this state's own and older than
        it (one written from an earlier state, in the background): a partition keeps its chain
        there if it has not changed since, or if its actions since are kept to extend it; any
        other partition gets a new base at the next checkpoint."""
        version, chains, seen = lineage
        complete = self.keeps_pending and self.pending_since <= version
        self.sidecars = {
            partition: chain
            for partition, chain in chains.items()
            if complete or self.changed.get(partition, -1) <= version
        }
        self.sidecar_version, self.sidecars_seen = version, seen
        if complete:
            newer = ((p, _newer_than(node, version)) for p, node in self.pending.items())
            self.pending = {p: node for p, node in newer if node is not None}
            self.pending_since = version

    def stamp(self, version: int) -> None:
        super().stamp(version)
        # Partitions copied since this state was copied: at most the ones changed up to here.
        for partition in self._own:
            self.changed[partition] = version
        self._views = {}
        if self.keeps_pending and version - self.pending_since > self.pending_limit:
            # A state that no checkpoint follows (a reader's) keeps no more than this; a
            # writer's starts again at its next commit (TopicLogFiles.descend).
            self.keeps_pending, self.pending = False, {}

    def partition(self, partition: int) -> PartitionState:
        """The state of one partition as of this topic log version (a read-only view whose
        ``version`` is the topic log's)."""
        view = self._views.get(partition)
        if view is not None:
            return view
        state = self.partitions.get(partition)
        # A shallow copy: it shares the state's lists, which no one changes once handed out.
        view = PartitionState() if state is None else state.view()
        view.version = self.version
        view.last_commit_ms = self.last_commit_ms
        view.min_reader_version = self.min_reader_version
        view.min_writer_version = self.min_writer_version
        self._views[partition] = view
        return view

    def live_add(self, path: str, partition: int | None) -> Action | None:
        if partition is None or partition not in self.partitions:
            return None
        found = self.partition(partition).live_add(path, None)
        return None if found is None else tag_actions([found], partition)[0]

    def checkpoint_actions(self) -> list[Action]:
        actions = super().checkpoint_actions()
        for partition in sorted(self.partitions):
            actions.extend(self.partition_checkpoint_actions(partition))
        return actions

    def partition_checkpoint_actions(self, partition: int) -> list[Action]:
        """One partition's whole state as topic-log actions (each naming the partition)."""
        state = self.partition(partition)
        return tag_actions(
            [a for a in state.checkpoint_actions() if "protocol" not in a], partition
        )


def _without_partition(line: str, partition: int, body: dict[str, Any]) -> str | None:
    """The compact JSON line of an action without its ``partition``, cut from ``line``, the
    action's compact JSON with it; None unless ``partition`` is the body's last field (so
    cutting it from the end of the line is exact)."""
    suffix = f',"partition":{partition}}}}}'
    if line.endswith(suffix) and next(reversed(body)) == "partition":
        return line[: -len(suffix)] + "}}"
    return None


def tag_actions(actions: list[Action], partition: int) -> list[Action]:
    """Partition actions as a topic log records them: each names its partition."""
    out: list[Action] = []
    for action in actions:
        ((name, body),) = action.items()
        out.append({name: {**body, "partition": partition}})
    return out


SIDECARS = "_sidecars"
# A pending action list node: (the previous node or None, action name, the action's body
# unless its line is known, the topic log version that holds the action, its line without
# the partition when cut from that version's commit).
_Pending = tuple[Any, str, dict[str, Any] | None, int, str | None]
# A checkpoint as its writer knows it: its version, each partition's chain of sidecars, and
# when it was written (monotonic).
Lineage = tuple[int, dict[int, list[Action]], float]


def _newer_than(node: _Pending | None, version: int) -> _Pending | None:
    """The pending list ``node`` heads, without its actions of ``version`` and older."""
    head, newer = node, []
    while node is not None and node[3] > version:
        newer.append(node)
        node = node[0]
    if node is None:
        return head  # nothing of ``version`` or older in it
    rebuilt: _Pending | None = None
    for _, name, body, held_in, line in reversed(newer):
        rebuilt = (rebuilt, name, body, held_in, line)
    return rebuilt


# Actions that belong to one partition (PROTOCOL.md 8.27): in a topic log each names it.
PARTITION_ACTIONS = frozenset(
    {
        "add",
        "remove",
        "logStart",
        "endOffset",
        "producer",
        "txn",
        "cleaned",
        "tombstone",
        "txnMarker",
        "vacuumed",
        "txnEnded",
    }
)


def encode_sidecar_lines(
    partition: int,
    version: int,
    lines: list[str],
    *,
    delta: tuple[int, int] | None = None,
    compress: bool = False,
) -> bytes:
    """A sidecar file (PROTOCOL.md 7.4): a header line, then one partition's actions, each a
    compact JSON line: its whole state (a base) or, with ``delta``, its actions of that range
    of versions (13.4); ``compress``: gzip (version 4)."""
    header: dict[str, Any] = {"partition": partition, "version": version, "actions": len(lines)}
    if delta is not None:
        header["delta"] = list(delta)
    text = "\n".join((compact_json({"sidecar": header}), *lines, "")).encode()
    return gzip.compress(text, SIDECAR_GZIP_LEVEL, mtime=0) if compress else text


def decode_sidecar(
    data: bytes, where: str, partition: int, *, compressed: bool = False
) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """A sidecar's header and actions; CorruptLogError when it is damaged, truncated or holds
    another partition."""
    if compressed:
        data = _gunzip(data, where)
    # The same line syntax and truncation checks as a commit, with its own header line.
    if not data.startswith(b'{"sidecar":'):
        raise CorruptLogError(f"{where}: the first line must be the sidecar header")
    info, actions = decode_commit(data.replace(b'{"sidecar":', b'{"commitInfo":', 1), where)
    if info.get("partition") != partition:
        raise CorruptLogError(
            f"{where}: holds partition {info.get('partition')!r}, not {partition}"
        )
    return info, actions


def _gunzip(data: bytes, where: str) -> bytes:
    """One gzip member, whole: its CRC-32 and length checked (zlib), nothing after it, and no
    more than the limit on a log file once inflated."""
    inflater = zlib.decompressobj(wbits=31)
    try:
        text = inflater.decompress(data, MAX_LOG_FILE_BYTES + 1)
    except zlib.error as exc:
        raise CorruptLogError(f"{where}: not a valid gzip stream ({exc})") from None
    if len(text) > MAX_LOG_FILE_BYTES:
        raise CorruptLogError(f"{where}: inflates beyond the {MAX_LOG_FILE_BYTES}-byte limit")
    if not inflater.eof:
        raise CorruptLogError(f"{where}: truncated (the gzip stream does not end)")
    if inflater.unused_data:
        raise CorruptLogError(f"{where}: bytes after the end of the gzip stream")
    return text


def _is_compressed(path: str) -> bool:
    return path.endswith(".json.gz")


def _chain_end(chain: list[Action]) -> int | None:
    """The last version a chain covers: its last delta's, or its base's ``version`` (None for
    a base written before version 4, which does not record it)."""
    last = chain[-1]
    if "delta" in last:
        return int(last["delta"][1])
    version = last.get("version")
    return version if type(version) is int else None


def _nonneg_int(value: Any) -> bool:
    return type(value) is int and value >= 0


def _nonneg_pair(value: Any) -> bool:
    """A list of two non-negative integers (a delta's versions, a member's byte range)."""
    return type(value) is list and len(value) == 2 and all(_nonneg_int(v) for v in value)


class TopicLogFiles(Log[TopicLogState]):
    """A topic log's files: checkpoints keep each partition's state in sidecar files, and a
    partition that did not change since the previous checkpoint keeps its sidecars by
    reference (Delta's v2 checkpoints): a checkpoint writes what changed, not the whole topic
    (PROTOCOL.md 7.4, 13.2). From version 4 a changed partition's state is a chain, its
    previous sidecars and one delta of its actions since (13.4): a checkpoint writes what the
    commits since the previous one wrote, not the partitions' whole states."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Actions are kept for deltas while a state is at most this far past its checkpoint:
        # a writer that missed a few of the checkpoints other writers wrote still extends.
        self.pending_limit = 10 * max(1, self.checkpoint_interval)
        # The newest checkpoint written here, which states older than it do not know (they
        # were copied before a background write finished): a writer's states adopt it at their
        # next commit, and the next checkpoint's state before it is written (descend).
        self._lineage: Lineage | None = None
        self._checkpoint_lock = threading.Lock()  # one checkpoint of this log at a time

    def _sidecar_dir(self) -> str:
        return f"{self.directory.rsplit('/', 1)[0]}/{SIDECARS}"

    def descend(self, state: TopicLogState) -> None:
        if not state.keeps_pending:  # its first commit here: it keeps its actions from now on
            state.keeps_pending, state.pending, state.pending_since = True, {}, state.version
            state.pending_limit = self.pending_limit
        lineage = self._lineage
        if lineage is not None and state.sidecar_version < lineage[0] <= state.version:
            state.adopt(lineage)

    def write_checkpoint(self, state: TopicLogState) -> None:
        with self._checkpoint_lock:
            self.descend(state)
            self._write_checkpoint(state)
            if self._lineage is None or self._lineage[0] < state.version:
                self._lineage = (state.version, state.sidecars, state.sidecars_seen)

    def _write_checkpoint(self, state: TopicLogState) -> None:
        chains: dict[int, list[Action]] = {}
        # A sidecar is reused only from a checkpoint this writer read or wrote recently:
        # vacuum may delete sidecars that no checkpoint newer than the log retention names.
        fresh = clock.monotonic() - state.sidecars_seen < STALE_STATE_S
        # Chains and compression are version 4: a log at version 3 keeps whole sidecars that
        # readers of version 3 can read.
        v4 = min(state.min_reader_version, state.min_writer_version) >= CHAIN_VERSION
        # Every new sidecar (a base or a delta per changed partition) is encoded first and
        # then written at once: at 6/7 as the members of one file (7.4), else a file each.
        new: list[tuple[Action, bytes]] = []
        for partition in sorted(state.partitions):
            known = state.sidecars.get(partition) if fresh else None
            if known is not None and not within_horizon(known, state.version):
                known = None  # too old to name (writer version 5): a new base
            if known is not None and state.changed.get(partition, 0) <= state.sidecar_version:
                chains[partition] = known
                continue
            chain = self._extended(state, partition, known, new) if v4 and known else None
            if chain is None:
                lines = state.partition(partition).checkpoint_lines()
                payload = encode_sidecar_lines(partition, state.version, lines, compress=v4)
                body = self._new_sidecar(new, partition, payload, len(lines))
                if v4:
                    body["version"] = state.version
                chain = [body]
            chains[partition] = chain
        self.storage.put_new_many(self._sidecar_files(state, new, compress=v4))
        top: list[Action] = [*LogState.checkpoint_actions(state)]
        for partition in sorted(chains):
            top.extend({"sidecar": body} for body in chains[partition])
        self._publish_checkpoint(state, top)
        state.sidecars, state.sidecar_version = chains, state.version
        state.sidecars_seen = clock.monotonic()
        state.pending, state.pending_since = {}, state.version
        state.pending_limit = self.pending_limit

    def _extended(
        self,
        state: TopicLogState,
        partition: int,
        chain: list[Action],
        new: list[tuple[Action, bytes]],
    ) -> list[Action] | None:
        """``chain`` and a new delta of the partition's actions since it (13.4), added to
        ``new`` (to be written), or None when the chain cannot be extended or would exceed
        its bounds (then a new base is due)."""
        end = _chain_end(chain)
        complete = state.keeps_pending and state.pending_since <= state.sidecar_version
        if end is None or not complete or end >= state.version:
            return None
        deltas = chain[1:]
        if len(deltas) >= MAX_DELTAS:
            return None
        lines = state.pending_lines(partition, end)
        if not lines:
            return None
        span = (end + 1, state.version)
        payload = encode_sidecar_lines(partition, state.version, lines, delta=span, compress=True)
        if sum(int(d["size"]) for d in deltas) + len(payload) > int(chain[0]["size"]):
            return None  # reading the chain would cost more than twice the state: a new base
        body = self._new_sidecar(new, partition, payload, len(lines))
        body["delta"] = list(span)
        return [*chain, body]

    @staticmethod
    def _new_sidecar(
        new: list[tuple[Action, bytes]], partition: int, payload: bytes, count: int
    ) -> Action:
        """The action naming a new sidecar, added with its bytes to ``new``: its path (and, in
        a shared file, its range) are set when the checkpoint's files are (:meth:`_sidecar_files`)."""
        body: Action = {"partition": partition, "actions": count, "size": len(payload)}
        new.append((body, payload))
        return body

    def _sidecar_files(
        self, state: TopicLogState, new: list[tuple[Action, bytes]], *, compress: bool
    ) -> dict[str, bytes]:
        """The files of a checkpoint's new sidecars, named (5.8) and their actions completed:
        at 6/7 one shared file whose members they are, each named by its byte range (7.4), so
        that a checkpoint writes one file however many partitions changed; below, a file each."""
        suffix = ".json.gz" if compress else ".json"
        version = state.version
        if len(new) > 1 and shares_sidecars(state):
            name = f"{min(body['partition'] for body, _ in new)}-{version:020d}-{unique_id()}"
            offset = 0
            for body, payload in new:
                body["path"] = f"{SIDECARS}/{name}{suffix}"
                body["range"] = [offset, len(payload)]
                offset += len(payload)
            return {f"{self._sidecar_dir()}/{name}{suffix}": b"".join(p for _, p in new)}
        files: dict[str, bytes] = {}
        for body, payload in new:
            name = f"{body['partition']}-{version:020d}-{unique_id()}{suffix}"
            body["path"] = f"{SIDECARS}/{name}"
            files[f"{self._sidecar_dir()}/{name}"] = payload
        return files

    def _read_checkpoint(self, version: int) -> TopicLogState | None:
        where = f"{self.storage.display_url}/{self._path(checkpoint_file(version))}"
        data = self.storage.read_if_exists(self._path(checkpoint_file(version)))
        if data is None:
            return None
        info, actions = decode_commit(data, where)
        header = info.get("checkpointVersion")
        if not is_int(header) or header != version:
            raise CorruptLogError(
                f"{where}: checkpoint header names version {info.get('checkpointVersion')!r}"
            )
        state = self.state_factory()
        chains: dict[int, list[Action]] = {}
        try:
            for name, body in actions:
                if name == "sidecar":
                    partition, path = body["partition"], body["path"]
                    if (
                        not _nonneg_int(partition)
                        or not isinstance(path, str)
                        or not path.startswith(f"{SIDECARS}/")
                        or ".." in path
                        or "\\" in path
                    ):
                        raise CorruptLogError(f"sidecar: illegal partition or path in {body!r}")
                    chains.setdefault(partition, []).append(body)
                else:
                    state.apply(name, body)
            self._load_chains(state, chains, version)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptLogError(f"{where}: malformed checkpoint ({exc})") from None
        except CorruptLogError as exc:
            raise CorruptLogError(f"{where}: {exc}") from None
        except UnsupportedFormatVersionError as exc:
            raise UnsupportedFormatVersionError(f"{where}: {exc}") from None
        state.stamp(version)
        state.sidecars, state.sidecar_version = chains, version
        state.sidecars_seen = clock.monotonic()
        # Kept from here: a process that loads the log to write to it soon extends the chains.
        state.keeps_pending, state.pending, state.pending_since = True, {}, version
        state.pending_limit = self.pending_limit
        ts = info.get("timestamp")
        if isinstance(ts, int):
            state.last_commit_ms = ts
        return state

    def _load_chains(
        self, state: TopicLogState, chains: dict[int, list[Action]], version: int
    ) -> None:
        """Every partition's chain checked (7.4, 13.4) and applied: its base, then its deltas."""
        v4 = min(state.min_reader_version, state.min_writer_version) >= CHAIN_VERSION
        shared = shares_sidecars(state)
        for partition, chain in chains.items():
            for position, body in enumerate(chain):
                if not _nonneg_int(body.get("actions")) or not _nonneg_int(body.get("size")):
                    raise CorruptLogError(f"sidecar: illegal actions or size in {body!r}")
                member = body.get("range")
                if member is not None and not (
                    shared and _nonneg_pair(member) and member[1] == body["size"] >= 1
                ):
                    raise CorruptLogError(
                        f"sidecar: illegal range in {body!r}"
                        + ("" if shared else " (a shared sidecar file below version 6/7)")
                    )
                if not v4 and (position or _is_compressed(body["path"]) or "delta" in body):
                    raise CorruptLogError(
                        f"partition {partition}: a chain of sidecars or a compressed one in a "
                        "checkpoint of a log below version 4"
                    )
                if position == 0 and "delta" in body:
                    raise CorruptLogError(f"partition {partition}: the first sidecar is a delta")
                if position and "delta" not in body:
                    raise CorruptLogError(f"partition {partition}: names two base sidecars")
                span = body.get("delta")
                if span is not None and not (_nonneg_pair(span) and span[0] <= span[1] <= version):
                    raise CorruptLogError(f"sidecar: illegal delta range in {body!r}")
        incarnation = self.directory.rsplit("/", 1)[0]
        # A shared file (7.4) is read once for all the members the checkpoint names in it.
        paths = list(
            dict.fromkeys(
                f"{incarnation}/{body['path']}" for chain in chains.values() for body in chain
            )
        )
        found = self.storage.read_many(paths)
        for partition, chain in chains.items():
            end = -1
            for body in chain:
                path = f"{incarnation}/{body['path']}"
                content = found.get(path)
                if content is None:
                    raise CorruptLogError(f"sidecar {path} of partition {partition} is missing")
                member = body.get("range")
                if member is not None:
                    start, length = member
                    if start + length > len(content):
                        raise CorruptLogError(
                            f"sidecar {path} has {len(content)} bytes, shorter than the range "
                            f"{member!r} of partition {partition}'s member"
                        )
                    content = content[start : start + length]
                elif len(content) != body["size"]:
                    raise CorruptLogError(
                        f"sidecar {path} has {len(content)} bytes, the checkpoint records "
                        f"{body['size']!r}"
                    )
                header, partition_actions = decode_sidecar(
                    content, path, partition, compressed=_is_compressed(path)
                )
                if len(partition_actions) != body["actions"]:
                    raise CorruptLogError(
                        f"sidecar {path}: action count differs from the checkpoint's"
                    )
                span = body.get("delta")
                if span is None:
                    if "delta" in header:
                        raise CorruptLogError(
                            f"sidecar {path}: a delta, named by the checkpoint as a base"
                        )
                    end = header.get("version")  # type: ignore[assignment]
                    if not _nonneg_int(end) or end > version:
                        raise CorruptLogError(f"sidecar {path}: illegal version {end!r}")
                    if "version" in body and body["version"] != end:
                        raise CorruptLogError(
                            f"sidecar {path}: holds version {end}, the checkpoint records "
                            f"{body['version']!r}"
                        )
                else:
                    if header.get("delta") != span:
                        raise CorruptLogError(
                            f"sidecar {path}: covers versions {header.get('delta')!r}, the "
                            f"checkpoint records {span!r}"
                        )
                    if span[0] != end + 1:
                        raise CorruptLogError(
                            f"sidecar {path}: covers versions from {span[0]}, but the chain "
                            f"before it ends at {end}"
                        )
                    end = span[1]
                for name, action in partition_actions:
                    state.apply(name, {**action, "partition": partition})


class TopicLog:
    """One topic log, shared by the partitions of a topic that belong to it (thread-safe).

    It keeps the newest state it has seen, so that a reader of many partitions asks the
    storage once per poll, not once per partition.
    """

    def __init__(
        self,
        storage: Any,
        directory: str,
        *,
        topic: str,
        index: int,
        checkpoint_interval: int = 100,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.topic = topic
        self.index = index
        self.directory = directory
        self.log: Log[TopicLogState] = TopicLogFiles(
            storage,
            directory,
            TopicLogState,
            checkpoint_interval=checkpoint_interval,
            retry=retry,
        )
        self._state: TopicLogState | None = None
        self._lock = threading.Lock()
        self._confirmed = clock.monotonic()  # when the cached state was last known newest

    def __repr__(self) -> str:
        return f"TopicLog({self.topic!r}, {self.index})"

    def state(
        self, *, refresh: bool = True, max_age_s: float = 0.0, tail: bool = False
    ) -> TopicLogState:
        """The newest state. ``max_age_s``: a state confirmed newest less than that long ago is
        returned as it is (readers of many partitions share one request per poll). ``tail``:
        a poll of a reader that looks again soon (``Log.update``)."""
        with self._lock:
            current, confirmed = self._state, self._confirmed
        now = clock.monotonic()
        if current is None or (refresh and now - confirmed > STALE_STATE_S):
            # Polling by name cannot step over versions vacuum deleted (PROTOCOL.md 17.5).
            current = self.log.load()
            self._remember(current, confirmed=True)
        elif refresh and now - confirmed >= max_age_s:
            current = self.log.update(current, tail=tail)
            self._remember(current, confirmed=True)
        return current

    def _remember(self, state: TopicLogState, *, confirmed: bool = False) -> None:
        with self._lock:
            if self._state is None or state.version >= self._state.version:
                self._state = state
                if confirmed:
                    self._confirmed = clock.monotonic()

    def commit(
        self,
        builds: Mapping[int, PartitionBuild],
        *,
        operation: str,
        durable: bool = True,
        written_at: float | None = None,
        isolate: bool = False,
        info: dict[str, Any] | None = None,
        background_checkpoint: bool = False,
        data: bytes | memoryview | None = None,
    ) -> tuple[CommitResult[TopicLogState] | None, dict[int, BaseException]]:
        """One commit holding the actions of several partitions, built against the newest
        state and rebuilt after every lost race.

        With ``isolate``, a partition whose build raises is left out of the commit and its
        error returned (a producer's batches fail one partition at a time, as in Kafka);
        without it the error is raised and nothing is committed. Returns the commit (None when
        no partition had anything to commit) and the refused partitions' errors.
        ``background_checkpoint``, ``data``: as :meth:`Log.commit`'s.
        """
        refused: dict[int, BaseException] = {}

        def build(state: TopicLogState) -> list[Action] | None:
            refused.clear()
            per_partition: dict[int, list[Action]] = {}
            for partition, partition_build in builds.items():
                try:
                    actions = partition_build(state.partition(partition))
                except Exception as exc:
                    if not isolate:
                        raise
                    refused[partition] = exc
                    continue
                if actions:
                    per_partition[partition] = actions
            if not per_partition:
                return None
            out: list[Action] = []
            if state.version < 0:
                out.append(topic_log_protocol())
            for partition in sorted(per_partition):
                # A partition build written for a layout-2 log may open a new log with a
                # protocol action; a topic log has its own, above.
                body = [a for a in per_partition[partition] if "protocol" not in a]
                out.extend(tag_actions(body, partition))
            return out

        state = self._base_state()
        result = self.log.commit(
            state,
            build,
            operation=operation,
            durable=durable,
            info={"topic": self.topic, "log": self.index, **(info or {})},
            written_at=written_at,
            background_checkpoint=background_checkpoint,
            data=data,
        )
        if result is not None:
            self._remember(result.state, confirmed=True)
        else:
            self._remember(self.log.update(state), confirmed=True)
        return result, dict(refused)

    def commit_state_build(
        self,
        build: Callable[[TopicLogState], list[Action] | None],
        data: Callable[[], bytes | memoryview],
        *,
        operation: str,
        durable: bool,
        info: dict[str, Any],
    ) -> CommitResult[TopicLogState] | None:
        """One commit built from the whole state (a shared commit, PROTOCOL.md 30.5: its
        actions name partitions themselves) with the data ``data`` gives after each build;
        rebuilt after every lost race, as :meth:`commit`. The state the last build saw is
        remembered too when it committed nothing: it may be newer than any committed here."""
        seen: list[TopicLogState] = []

        def building(state: TopicLogState) -> list[Action] | None:
            seen[:] = [state]
            return build(state)

        result = self.log.commit(
            self._base_state(),
            building,
            operation=operation,
            durable=durable,
            info={"topic": self.topic, "log": self.index, **info},
            background_checkpoint=True,
            data=data,
        )
        if result is not None:
            self._remember(result.state, confirmed=True)
        elif seen:
            self._remember(seen[0])
        return result

    def _base_state(self) -> TopicLogState:
        state = self.state(refresh=False)
        if clock.monotonic() - self._confirmed > STALE_STATE_S:
            # A commit built on a state older than the versions vacuum deleted could take a
            # deleted version's name and be lost: reload it first.
            state = self.state()
        return state


# A cached state not confirmed as the newest for this long is reloaded from a checkpoint
# before it is used: vacuum keeps log versions at least twice as long (PROTOCOL.md 17.5).
STALE_STATE_S = 24 * 3600.0
