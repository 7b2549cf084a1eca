"""The manifest log: numbered JSON commit files, replay, checkpoints, optimistic commits.

One mechanism serves every log in a store (topic metadata, partition manifests, consumer
groups, producer identities); each kind brings its own state class (a :class:`LogState`).
The normative description is docs/PROTOCOL.md; this module is its implementation.

A commit file holds one JSON object per line. Its first line is ``commitInfo``, whose
``actions`` field counts the lines after it, so a truncated file is detected even when the
cut falls on a line boundary.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import orjson

from kstore import __version__, clock
from kstore.config import MAX_UNCOMMITTED_MS, MIN_ORPHAN_AGE_MS
from kstore.errors import (
    CommitConflictError,
    CommitStateUnknownError,
    ConcurrentModificationError,
    CorruptLogError,
    DurabilityUnknownError,
    InvalidArgumentError,
    InvalidConfigurationError,
    KStoreError,
    StaleWriteError,
    StorageError,
    TopicDeletedError,
    UnsupportedFormatVersionError,
    WithdrawnCommitError,
)
from kstore.rhythm import WriterRhythms
from kstore.settings import is_int
from kstore.storage import Storage, unique_id

log = logging.getLogger(__name__)

READER_VERSION = 6  # highest minReaderVersion this code can read
WRITER_VERSION = 8  # highest minWriterVersion this code can write
# Version 2 adds typed topics (PROTOCOL.md 25); only the logs of typed topics require it, so
# every other log stays readable by version-1 readers.
TYPED_TOPICS_VERSION = 2
# Version 3 adds layout 3 (PROTOCOL.md 26): topic logs shared by partitions, data objects.
# Version 4 adds incremental checkpoints of topic logs (13.4): chains of compressed sidecars.
# Version 5 (writer 6) adds commits that carry their flush's data (11.8).
CARRIED_DATA_VERSION = 5
CARRIED_DATA_WRITER_VERSION = 6
# A ranged add whose path is this names the data a commit carries, by ranges counted from the
# data's start: Log.commit rewrites it into the commit file's own path and the file's offsets.
CARRIED = "<carried>"
LAST_CHECKPOINT = "_last_checkpoint"
MAX_LOG_FILE_BYTES = 256 * 1024 * 1024  # a limit on everything: refuse absurd files early
# A state not confirmed as the newest for this long is reloaded from a checkpoint before it is
# advanced or built on: old versions of any log may have been deleted since (PROTOCOL.md 17.5).
STALE_STATE_S = 24 * 3600.0
# A checkpoint of version v, and a hint naming it, is written only within this of v having been
# confirmed as the newest version (PROTOCOL.md 23.2): a writer paused longer may find v below
# the checkpoints vacuum keeps.
CHECKPOINT_DEADLINE_S = MAX_UNCOMMITTED_MS / 1000
# A writer that found another writer's commit where it meant to write looks for newer
# versions before its next this many commits (on an object store): see Log.commit.
LOOK_FIRST_COMMITS = 16

Action = dict[str, Any]


def version_file(version: int) -> str:
    return f"{version:020d}.json"


def checkpoint_file(version: int) -> str:
    return f"{version:020d}.checkpoint.json"


def parse_log_file_name(name: str) -> tuple[int, bool] | None:
    """(version, is_checkpoint) for a log file name, None for anything else."""
    stem, dot, rest = name.partition(".")
    if len(stem) != 20 or not stem.isdigit() or not dot:
        return None
    if rest == "json":
        return int(stem), False
    if rest == "checkpoint.json":
        return int(stem), True
    return None


# A tailing reader's windows (versions fetched at once), and the longest gap between versions
# it learns from (a quiet log says nothing about the rate of a busy one).
_MAX_WINDOW = 64
_MAX_VERSION_GAP_S = 1.0
# A log none of whose versions came for this many average gaps is quiet: a look asks for one.
_QUIET_GAPS = 4
# A tailing look this share of the gap between versions after the last find is early.
_EARLY_SHARE = 0.5
# A tailing reader keeping up asks past the version due at least once in this many finds (a
# reader that knows its writers' rhythms learns it is behind from them, sooner).
_CONFIRM_AFTER_FINDS = 4
# The most versions a look asks for at first because the writers' rhythms count them due.
_RHYTHM_MAX_DUE = 4
_CONFIRM_AFTER_FINDS_IN_RHYTHM = 16


class LogState:
    """Base of every log's replayed state. Subclasses add fields and handle their actions.

    States are copy-on-write: :meth:`copy` then :meth:`apply` builds the next state, so a
    state handed to a reader never changes under it.
    """

    def __init__(self) -> None:
        self.version = -1
        self.min_reader_version = 1
        self.min_writer_version = 1
        self.last_commit_ms: int | None = None
        # Set by a ``topicDeleted`` action: the log's topic incarnation was deleted (17.3).
        self.topic_deleted: dict[str, Any] | None = None
        # The writer id in ``commitInfo.committer`` of the newest commit that names one, and
        # that commit's version (PROTOCOL.md 30.3: the holder of a shared topic log).
        self.committer: str | None = None
        self.committer_version = -1
        # When (kstore.clock) this state was last known to be the newest of its log.
        self.confirmed_at = clock.monotonic()

    def stale(self) -> bool:
        """Not confirmed as the newest within STALE_STATE_S (or by another clock: a state
        from another process)."""
        confirmed: float | None = getattr(self, "confirmed_at", None)  # None: built elsewhere
        return confirmed is None or not 0 <= clock.monotonic() - confirmed <= STALE_STATE_S

    def stamp(self, version: int) -> None:
        """Mark the state as replayed up to ``version`` (after a commit's actions)."""
        self.version = version

    def copy(self) -> LogState:
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def apply_encoded(self, name: str, body: dict[str, Any], line: str) -> None:
        """Apply one action that a commit holds as ``line`` (compact JSON): a state that keeps
        its actions for a checkpoint's deltas keeps the line too."""
        self.apply(name, body)

    def apply(self, name: str, body: dict[str, Any]) -> None:
        """Apply one action. Unknown action names are ignored (forward compatibility)."""
        if name == "protocol":
            self.min_reader_version = _int_field(body, "minReaderVersion", name)
            self.min_writer_version = _int_field(body, "minWriterVersion", name)
            if self.min_reader_version > READER_VERSION:
                raise UnsupportedFormatVersionError(
                    f"log requires reader version {self.min_reader_version}; this kstore "
                    f"{__version__} reads up to {READER_VERSION}: upgrade kstore"
                )
        elif name == "topicDeleted":
            self.topic_deleted = dict(body)

    def live_add(self, path: str, partition: int | None) -> Action | None:
        """The ``add`` action of the live segment at ``path`` (of ``partition`` in a topic
        log), to add it again: None when it is not live, or the log has no segments."""
        return None

    def checkpoint_actions(self) -> list[Action]:
        """The whole state as actions; replaying them onto an empty state rebuilds it."""
        actions: list[Action] = [
            {
                "protocol": {
                    "minReaderVersion": self.min_reader_version,
                    "minWriterVersion": self.min_writer_version,
                }
            }
        ]
        if self.topic_deleted is not None:
            actions.append({"topicDeleted": self.topic_deleted})
        return actions


S = TypeVar("S", bound=LogState)


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries for commit conflicts: exponential backoff with full jitter.

    Hand-written rather than a retry library because a retry here is not a repeat of the
    same call: each attempt reloads the log and rebuilds the commit from the new state.
    """

    max_attempts: int = 200
    timeout_s: float = 120.0
    base_backoff_s: float = 0.002
    max_backoff_s: float = 0.25
    # A file a writer wrote is committed only while this clock says its write started less
    # than max_uncommitted_s ago (PROTOCOL.md 23.1); both may be lowered (tests), never raised.
    max_uncommitted_s: float = MAX_UNCOMMITTED_MS / 1000
    clock: Callable[[], float] = clock.monotonic

    def __post_init__(self) -> None:
        limit = MAX_UNCOMMITTED_MS / 1000
        if not 0 < self.max_uncommitted_s <= limit:
            raise InvalidConfigurationError(
                f"RetryPolicy.max_uncommitted_s {self.max_uncommitted_s!r} must be in (0, {limit}]: "
                "vacuum may delete an unreferenced file older than twice that"
            )
        if not 0 < self.timeout_s < self.max_uncommitted_s:
            raise InvalidConfigurationError(
                f"RetryPolicy.timeout_s {self.timeout_s!r} (the commit retry budget) must be "
                f"positive and below max_uncommitted_s ({self.max_uncommitted_s})"
            )

    def too_old(self, written_at: float) -> bool:
        """True when a file whose write started at ``written_at`` (by ``clock``) must no
        longer be committed."""
        return self.clock() - written_at >= self.max_uncommitted_s

    def backoff(self, attempt: int) -> float:
        # A lost race is not overload: the winner has already moved on, so the first retries
        # go at once (the rebuild re-reads only the commits that won); backing off starts
        # when a writer keeps losing.
        if attempt <= 2:
            return 0.0
        return random.uniform(
            0, min(self.max_backoff_s, self.base_backoff_s * (2 ** (attempt - 2)))
        )


@dataclass(frozen=True)
class CommitResult(Generic[S]):
    version: int
    state: S  # the state right after this commit
    actions: list[Action]
    attempts: int


# Every compact JSON line (commits, checkpoints, sidecars) through one function. The standard
# encoder is kept for what orjson writes differently: json.dumps with ``separators`` builds a
# new encoder per call, which cost twice the encoding of an action itself.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))


def compact_json(value: Any) -> str:
    """What ``json.dumps`` with compact separators returns.

    orjson writes the same text for what actions hold (string keys; strings, integers within
    64 bits, booleans, None, lists and dicts of them) at a tenth of json's cost: a producer
    encodes two actions per partition per flush, and a checkpoint thousands. It writes other
    text for non-ASCII characters (raw UTF-8 where json escapes them) and refuses integer keys
    and integers past 64 bits: those go through json. A float with an exponent is written
    ``1e-7`` where json writes ``1e-07``, the same number to every reader; no writer puts a
    NaN in an action (configs refuse it), which orjson would write as null. Reading stays
    with json: orjson reads an integer past 64 bits as a float, where PROTOCOL.md 7.1 wants
    integers read exactly."""
    try:
        out = orjson.dumps(value)
    except TypeError:
        return _COMPACT_JSON.encode(value)
    # json escapes DEL (0x7f) as well, which is ASCII: such text goes through json too.
    if out.isascii() and b"\x7f" not in out:
        return out.decode("ascii")
    return _COMPACT_JSON.encode(value)


def encode_commit(actions: Sequence[Action], info: dict[str, Any]) -> bytes:
    return encode_commit_lines(actions, info)[1]


def encode_commit_lines(actions: Sequence[Action], info: dict[str, Any]) -> tuple[list[str], bytes]:
    """A commit's action lines (compact JSON, in order) and the commit's bytes."""
    lines = list(map(compact_json, actions))
    head = compact_json({"commitInfo": {**info, "actions": len(actions)}})
    return lines, "\n".join((head, *lines, "")).encode()


# Stand-ins for the numbers a data-carrying commit's text holds that depend on its own length
# (its ranges and ``dataOffset``): the text is encoded once with them, then they are filled in.
_CARRIED_MARK = re.compile(rb'"@@kstore-(?:range-([0-9]+)|data-offset)@@"')


def encode_carrying_commit(
    actions: Sequence[Action], info: dict[str, Any], data: bytes | memoryview, path: str
) -> tuple[list[Action], bytes]:
    """A commit that carries ``data`` (PROTOCOL.md 7.1, 11.8): its text, spaces up to
    ``dataOffset``, then the data. The ranged adds of ``actions`` whose path is
    :data:`CARRIED` count from the data's start; they come back naming ``path`` (the commit
    file, relative to the incarnation directory) with ranges counted from the file's start.

    The offset is written in the text it precedes, and the ranges after it: the text is
    encoded once with stand-ins for them, and the smallest offset at or past the text's
    length once they are filled in is found by arithmetic (the text's length only grows with
    the offset's digits), not by encoding the actions again."""
    size = len(data)
    if size < 1:
        raise ValueError("a commit carries at least one byte of data")
    placed: list[Action] = []
    marked: list[Action] = []
    ranges: list[tuple[int, int]] = []
    filled: list[dict[str, Any]] = []  # the placed adds, whose ranges are set at the end
    for action in actions:
        body = action.get("add")
        if body is None or body.get("path") != CARRIED:
            placed.append(action)
            marked.append(action)
            continue
        start, length = body["range"]
        marked.append({"add": {**body, "path": path, "range": f"@@kstore-range-{len(ranges)}@@"}})
        ranges.append((start, length))
        filled.append({**body, "path": path})
        placed.append({"add": filled[-1]})
    text = encode_commit(
        marked, {**info, "dataOffset": "@@kstore-data-offset@@", "dataBytes": size}
    )
    marks = list(_CARRIED_MARK.finditer(text))
    if len(marks) != len(ranges) + 1:  # a stand-in's words in some other value: never
        raise ValueError("a commit's actions hold the text of a stand-in for its ranges")
    fixed = len(text) - sum(m.end() - m.start() for m in marks)
    offset = fixed
    while True:
        needed = fixed + len(str(offset)) + sum(len(f"[{offset + s},{n}]") for s, n in ranges)
        if needed <= offset:
            break
        offset = needed
    pieces: list[bytes] = []
    done = 0
    for mark in marks:
        pieces.append(text[done : mark.start()])
        if mark.group(1) is None:
            pieces.append(str(offset).encode())
        else:
            s, n = ranges[int(mark.group(1))]
            pieces.append(f"[{offset + s},{n}]".encode())
        done = mark.end()
    pieces.append(text[done:])
    text = b"".join(pieces)
    for body, (s, n) in zip(filled, ranges, strict=True):
        body["range"] = [offset + s, n]
    return placed, b"".join((text, b" " * (offset - len(text)), data))


def without_carried_data(data: bytes, where: str) -> bytes | None:
    """A commit that carries data, as vacuum leaves it once no partition needs the data
    (PROTOCOL.md 22.5): the same text, its ``commitInfo`` saying ``dataVacuumed`` instead of
    where the data was. None for a commit that carries none."""
    offset = carried_data_offset(data, where)
    if offset is None:
        return None
    text = data[:offset].rstrip(b" ")
    first, _, rest = text.partition(b"\n")
    line = json.loads(first)
    info = line["commitInfo"]
    del info["dataOffset"], info["dataBytes"]
    info["dataVacuumed"] = True
    return compact_json(line).encode() + b"\n" + rest


def decode_commit(
    data: bytes, where: str
) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """Parse a commit file into (commitInfo, [(action name, body)]); CorruptLogError if bad.
    A commit that carries data (PROTOCOL.md 7.1) is parsed from its text alone."""
    if len(data) > MAX_LOG_FILE_BYTES:
        raise CorruptLogError(f"{where}: {len(data)} bytes exceeds the {MAX_LOG_FILE_BYTES} limit")
    offset = carried_data_offset(data, where)
    if offset is not None:
        data = data[:offset].rstrip(b" ")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptLogError(f"{where}: not UTF-8 ({exc})") from None
    if not text.endswith("\n"):
        raise CorruptLogError(f"{where}: truncated (no final newline)")
    fast = _decode_lines_at_once(text)
    if fast is not None:
        return _checked_commit(fast, where)
    actions: list[tuple[str, dict[str, Any]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CorruptLogError(f"{where}: line {number} is not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or len(obj) != 1:
            raise CorruptLogError(f"{where}: line {number} is not a single-action object")
        ((name, body),) = obj.items()
        if not isinstance(body, dict):
            raise CorruptLogError(f"{where}: line {number}: action {name!r} body is not an object")
        actions.append((name, body))
    return _checked_commit(actions, where)


def carried_data_offset(data: bytes, where: str) -> int | None:
    """Where the data a commit file carries starts (``commitInfo.dataOffset``, checked against
    the file: PROTOCOL.md 7.1), or None for a commit without data."""
    end = data.find(b"\n")
    first = data[: end if end >= 0 else len(data)]
    if b'"dataOffset"' not in first:
        return None
    try:
        info = json.loads(first)["commitInfo"]
    except (ValueError, KeyError, TypeError):
        raise CorruptLogError(f"{where}: first line must be commitInfo") from None
    if not isinstance(info, dict) or "dataOffset" not in info:
        return None  # the words in some other field's value: the usual checks follow
    offset, size = info.get("dataOffset"), info.get("dataBytes")
    if not (type(offset) is int and type(size) is int and size >= 1 and 0 < offset <= len(data)):
        raise CorruptLogError(
            f"{where}: commitInfo's dataOffset {offset!r} and dataBytes {size!r} do not name a "
            "data section"
        )
    if offset + size != len(data):
        raise CorruptLogError(
            f"{where}: {len(data)} bytes, but commitInfo announces a data section of {size} "
            f"bytes at {offset} (truncated or altered file)"
        )
    text_end = data.rfind(b"\n", 0, offset) + 1
    if data[text_end:offset].strip(b" "):
        raise CorruptLogError(f"{where}: the bytes between the text and the data are not spaces")
    return offset


def _decode_lines_at_once(text: str) -> list[tuple[str, dict[str, Any]]] | None:
    """A well-formed file's actions from one ``json.loads`` of all its lines as one array:
    a checkpoint holds an action per live segment, and one parse of them all costs a third of
    a parse per line. None when any line is blank or is not one single-action object: the
    line-by-line parse then names the line at fault."""
    lines = text[:-1].split("\n")
    try:
        objects = json.loads("[" + ",".join(lines) + "]")
    except json.JSONDecodeError:
        return None
    if len(objects) != len(lines):  # a line held several values (or none)
        return None
    actions: list[tuple[str, dict[str, Any]]] = []
    for obj in objects:
        if type(obj) is not dict or len(obj) != 1:
            return None
        ((name, body),) = obj.items()
        if type(body) is not dict:
            return None
        actions.append((name, body))
    return actions


def _checked_commit(
    actions: list[tuple[str, dict[str, Any]]], where: str
) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    if not actions or actions[0][0] != "commitInfo":
        raise CorruptLogError(f"{where}: first line must be commitInfo")
    info = actions[0][1]
    expected = info.get("actions")
    if not is_int(expected) or expected != len(actions) - 1:
        raise CorruptLogError(
            f"{where}: commitInfo announces {expected!r} actions but {len(actions) - 1} follow "
            "(truncated or altered file)"
        )
    return info, actions[1:]


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a block (restored as it was)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _int_field(body: dict[str, Any], field: str, action: str) -> int:
    value = body.get(field)
    if not is_int(value):
        raise CorruptLogError(
            f"action {action!r}: field {field!r} must be an integer, got {value!r}"
        )
    return value


class Log(Generic[S]):
    """A manifest log directory on a storage, replayed into states of type ``S``."""

    def __init__(
        self,
        storage: Storage,
        directory: str,
        state_factory: Callable[[], S],
        *,
        checkpoint_interval: int = 100,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.storage = storage
        self.directory = directory.rstrip("/")
        self.state_factory = state_factory
        self.checkpoint_interval = checkpoint_interval
        self.retry = retry or RetryPolicy()
        # Tailing (``update(tail=True)``): when versions were last found, and the average gap
        # between versions, from which a tailing reader sizes its first window.
        self._found_at: float | None = None
        self._version_gap: float | None = None
        self._missed_at: float | None = None  # when a tailing look last found nothing new
        self._unconfirmed = False  # the last tailing look returned without asking past its find
        # This look asks for the version a look moments ago missed, or comes well before the
        # next version is due: a find then says nothing, or much, about versions behind it.
        self._after_miss = False
        self._early = False
        # The last look that asked past the version due found all it asked for: versions land
        # faster than this reader looks, so its looks keep asking past (and widening).
        self._behind = False
        self._in_rhythm = False  # the last look's count of versions due came from rhythms
        self._finds_unconfirmed = 0  # finds in a row by looks that did not ask past them
        # Decayed sums of the time between finding looks and of the versions they found: their
        # ratio is the gap between versions (a look that finds two counts twice).
        self._found_span = 0.0
        self._found_count = 0.0
        self.rhythms = WriterRhythms()  # when its writers' next commits are due (a reader's)
        # The background checkpoint being written, and the one due next (Log.commit's
        # ``background_checkpoint``).
        self._checkpointing: concurrent.futures.Future[None] | None = None
        self._checkpoint_next: S | None = None
        # Writing: how many more commits look for newer versions first (Log.commit).
        self._looks_first = 0

    def _path(self, name: str) -> str:
        return f"{self.directory}/{name}"

    def describe(self, version: int) -> str:
        return f"{self.storage.display_url}/{self._path(version_file(version))}"

    # -- reading -------------------------------------------------------------------------------

    def read_commit(
        self, version: int
    ) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]] | None:
        """The parsed commit at ``version``, or None if it does not exist (yet)."""
        data = self.storage.read_if_exists(self._path(version_file(version)))
        if data is None:
            return None
        return decode_commit(data, self.describe(version))

    def load(self) -> S:
        """The latest state: the newest checkpoint plus the commits after it.

        Checked on the way (PROTOCOL.md 14.1): a checkpoint found through the hint whose own
        commit is gone lies below the versions vacuum keeps (a checkpoint or hint written late,
        23.2), so the log is listed instead; and a missing version with a later one present is
        a gap, refused, never taken for the end of the log."""
        with _collector_paused():
            # A checkpoint replays an action per live segment, each a few new objects that
            # hold no cycles: the cyclic collector would rescan the growing state every 700
            # of them (a third of the time to open 10,000 live segments).
            state, hinted = self._load_checkpoint()
        newest = self.update(state)
        # One round of probes (concurrent HEADs on an object store): the version after the
        # first missing one, and the hinted checkpoint's own commit.
        after_missing = self._path(version_file(newest.version + 2))
        own_commit = self._path(version_file(hinted)) if hinted is not None else None
        found = self.storage.stat_many([after_missing, *([own_commit] if own_commit else [])])
        if own_commit is not None and own_commit not in found:
            log.warning(
                "%s names checkpoint %d of %s, whose commit is gone (written late, or below "
                "what vacuum keeps): listing the log instead",
                LAST_CHECKPOINT,
                hinted,
                self.directory,
            )
            with _collector_paused():
                state = self._listed_checkpoint()
            newest = self.update(state)
            after_missing = self._path(version_file(newest.version + 2))
            found = self.storage.stat_many([after_missing])
        if after_missing in found:
            return self._past_gap(newest)
        return newest

    def _past_gap(self, state: S) -> S:
        """``state``'s next version was missing while the one after it exists: either the
        next version has landed since (a quick writer), or the log has a gap (14.1)."""
        while True:
            newer = self.update(state)
            if newer is state:
                missing = state.version + 1
                raise CorruptLogError(
                    f"{self.storage.display_url}/{self.directory}: version {missing} is missing "
                    f"but version {missing + 1} exists: the log has a gap (a commit file was "
                    f"deleted or lost); nothing past version {state.version} can be read or "
                    "written until it is recovered (`kstore topics recover`, docs/OPERATIONS.md)"
                )
            after_missing = self._path(version_file(newer.version + 2))
            if after_missing not in self.storage.stat_many([after_missing]):
                return newer
            state = newer

    def update(self, state: S, *, tail: bool = False) -> S:
        """``state`` advanced past every commit that exists after it (polls by name, no listing).

        Returns ``state`` itself when nothing is new. On an object store, once one new version
        is found the following ones are fetched concurrently, a growing window at a time: a
        reader that fell behind catches up in a few round trips instead of one per commit.
        A state not confirmed as the newest for a day is reloaded instead (17.5).

        ``tail``: for a reader that looks again soon (a consumer's poll). On an object store
        its first window is the number of versions due since it last found some (from the
        average gap between them). A reader keeping up (one due, or none yet) asks for the
        next version alone and returns it as soon as it is there. Its next look asks for the
        version due and the one after only when that find came well before the version was
        due, when its last such look showed it behind, or after several finds without one (so
        a reader whose looks are slower than the versions learns it). The versions due come
        from the writers' rhythms (kstore.rhythm) when known; then it asks for those alone.
        Otherwise a reader with several due asks for them and the one after at once,
        where one request after another would cost a round trip of latency per version, and
        widens while it finds them all. A look at a log quiet for several gaps asks for one.
        """
        if state.stale():
            return self.load()
        now = clock.monotonic()
        next_state: S | None = None
        version = state.version
        remote = self.storage.is_remote
        window, confirm = self._first_window(now) if tail and remote else (1, True)
        first, hits, confirmed = window, 0, True
        first_round_full = False
        while True:
            paths = [self._path(version_file(v)) for v in range(version + 1, version + 1 + window)]
            found = self.storage.read_many(paths)
            applied = 0
            for offset, path in enumerate(paths):
                data = found.get(path)
                if data is None:
                    if any(found.get(later) is not None for later in paths[offset + 1 :]):
                        # A later version came back and this one did not: it landed between
                        # the two reads, or the log has a gap (14.1). Read it again.
                        data = self.storage.read_if_exists(path)
                    if data is None:
                        if any(found.get(later) is not None for later in paths[offset + 1 :]):
                            raise CorruptLogError(
                                f"{self.storage.display_url}/{self.directory}: version "
                                f"{version + 1 + offset} is missing but a later version exists: "
                                "the log has a gap (a commit file was deleted or lost); see "
                                "`kstore topics recover` (docs/OPERATIONS.md)"
                            )
                        break
                if next_state is None:
                    next_state = state.copy()  # type: ignore[assignment]
                    assert next_state is not None
                info, actions = decode_commit(data, self.describe(version + 1 + offset))
                if "dataOffset" in info:
                    # Its ranges are about to be read: from these bytes, not a GET each.
                    self.storage.remember(path, data)
                self._apply_commit(next_state, version + 1 + offset, info, actions)
                applied += 1
                if tail and remote:
                    self._note_writer(info, actions)
            version += applied
            hits += applied
            if applied < window:
                break
            if hits == first:
                first_round_full = True
            if not confirm and hits == first:
                confirmed = False
                # Found moments after a look that missed it, the version just landed; found at
                # a look about when it was due, it is most likely the one due: the next look
                # asks for the next alone (asking past it costs a GET that finds nothing, two
                # when that look is early). It asks past it when this look came well before
                # the version was due, when the reader's last look past a find showed it
                # behind, and every few finds in any case: a reader whose looks are slower
                # than the versions would otherwise take one a look and never learn it.
                self._finds_unconfirmed += 1
                self._unconfirmed = not self._after_miss and (
                    self._early or self._behind or self._finds_unconfirmed >= self._confirm_after()
                )
                break
            # A reader that is keeping up finds one new version and then a miss: it stays at
            # one request per version. Only a reader that keeps finding versions (it is behind)
            # widens the window: to the commits the writers' rhythms say are due by now past
            # the newest it found, when they know (a reader back from a pause, a garbage
            # collection or a slow round learns in one round how far behind it is, where
            # doubling cost a round trip per doubling and overshot at the end), else twice.
            due = self.rhythms.due_count(time.time()) if tail and remote else None
            if due is not None:
                window = min(max(due + 1, window), _MAX_WINDOW)
            elif hits >= 2 and remote:
                window = min(window * 2, _MAX_WINDOW)
        if tail:
            if hits == 0 and first > 1 and self._in_rhythm:
                # The rhythms said several were due and none was there: they are out of date.
                self.rhythms.forget_overdue(time.time())
            self._note_versions(now, hits)
        newest = next_state if next_state is not None else state
        # Bookkeeping only (the state's content is unchanged): when it was last known newest.
        newest.confirmed_at = now if confirmed else state.confirmed_at
        if confirmed:
            self._unconfirmed = False
            self._finds_unconfirmed = 0
            if tail and remote:
                self._behind = first_round_full
        return newest

    def _confirm_after(self) -> int:
        return _CONFIRM_AFTER_FINDS_IN_RHYTHM if self._in_rhythm else _CONFIRM_AFTER_FINDS

    def _first_window(self, now: float) -> tuple[int, bool]:
        """A tailing reader's first window, and whether it must confirm the newest when it
        finds every version it asked for (else its last look, moments ago, confirmed it)."""
        gap = self._version_gap
        self._after_miss = self._early = self._in_rhythm = False
        if self._found_at is None or not gap:
            return 1, True
        if self._missed_at is not None and now - self._missed_at < gap:
            self._after_miss = True
            # It looked less than a gap ago and found nothing: the version due is the next
            # one. Found, it is returned at once, and is most likely the newest.
            return 1, False
        elapsed = now - self._found_at
        if elapsed > _QUIET_GAPS * gap:
            return 1, True  # a quiet log: a look is one GET, not a window's worth
        in_rhythm = self.rhythms.due_count(time.time())
        self._in_rhythm = in_rhythm is not None
        if in_rhythm is not None:
            # The writers' rhythms say how many of their commits are due by now; at most a few
            # are asked for at first (a writer that stopped still counts commits due until a
            # look finds none), and a reader that finds them all widens from there.
            due, self._early = min(in_rhythm, _RHYTHM_MAX_DUE), in_rhythm == 0
        else:
            due = round(elapsed / gap)
            self._early = elapsed < _EARLY_SHARE * gap
        if not self._unconfirmed and (due <= 1 or self._in_rhythm):
            # Keeping up: the versions due (or a look ahead of the one due), returned as soon
            # as they are there; a later look confirms (asking for the one after them every
            # time costs a GET that finds nothing, two when the look is early). Writers in
            # rhythm whose commits fall due together (producers flushing in step) are asked
            # for together, without the one after.
            return max(due, 1), False
        # What is due (at least one) and the one after, at once: this confirms the newest, and
        # a reader that turns out to be behind widens from here.
        return min(_MAX_WINDOW, max(due, 1) + 1), True

    def _note_writer(self, info: dict[str, Any], actions: list[tuple[str, dict[str, Any]]]) -> None:
        """Learn the rhythm of the producer that wrote a commit a tailing look found (its
        idempotent identity, 15; commits without one have no rhythm to learn)."""
        stamp = info.get("timestamp")
        writer = next((body.get("id") for name, body in actions if name == "producer"), None)
        if isinstance(stamp, int) and isinstance(writer, str):
            # Timed from when the look ended, not started: the next look then comes about a
            # GET after the landing and finds it. Timed from the start (tried, b177a88), looks
            # came earlier, missed more often, and each miss cost a whole round trip: e2e p50
            # minus ack p50 rose from 47 to 69 ms (S3-like, 8 partitions, 6 rounds each side).
            self.rhythms.note(writer, stamp, time.time(), tight=self._after_miss)

    def next_due(self) -> float | None:
        """Seconds until a writer in rhythm is expected to land its next commit (negative: it
        is late), from what tailing looks found; None when none is in a rhythm."""
        now = time.time()
        due = self.rhythms.next_due(now)
        return None if due is None else due - now

    def _note_versions(self, now: float, count: int) -> None:
        if count == 0:
            self._missed_at = now
            return
        self._missed_at = None
        if self._found_at is not None:
            self._found_span = 0.8 * self._found_span + min(
                now - self._found_at, _MAX_VERSION_GAP_S
            )
            # At most two a look: many at once were a reader catching up, not the rate.
            self._found_count = 0.8 * self._found_count + min(count, 2)
            self._version_gap = self._found_span / self._found_count
        self._found_at = now

    def load_version(self, version: int) -> S:
        """The state as of an older ``version`` (time travel), from version 0 or a checkpoint."""
        base = self._checkpoint_at_or_below(version)
        state = base if base is not None else self.state_factory()
        if state.version == -1 and version >= 0 and self.read_commit(0) is None:
            raise CorruptLogError(
                f"{self.storage.display_url}/{self.directory}: version {version} is not available"
            )
        while state.version < version:
            commit = self.read_commit(state.version + 1)
            if commit is None:
                if self.read_commit(state.version + 2) is None:
                    raise InvalidArgumentError(
                        f"{self.storage.display_url}/{self.directory}: version {version} does not exist "
                        f"(the newest is {state.version})"
                    )
                raise CorruptLogError(
                    f"{self.storage.display_url}/{self.directory}: version {state.version + 1} is missing"
                )
            # Applied in place: this state was built here and is handed out only at the end
            # (a copy per commit made time travel quadratic in the live segments).
            self._apply_commit(state, state.version + 1, *commit)
        return state

    def _apply_commit(
        self,
        state: S,
        version: int,
        info: dict[str, Any],
        actions: list[tuple[str, dict[str, Any]]],
    ) -> None:
        self._check_carried(version, info, actions)
        try:
            for name, body in actions:
                state.apply(name, body)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptLogError(f"{self.describe(version)}: malformed action ({exc})") from None
        except CorruptLogError as exc:
            raise CorruptLogError(f"{self.describe(version)}: {exc}") from None
        except UnsupportedFormatVersionError as exc:
            raise UnsupportedFormatVersionError(f"{self.describe(version)}: {exc}") from None
        state.stamp(version)
        ts = info.get("timestamp")
        if isinstance(ts, int):
            state.last_commit_ms = ts
        committer = info.get("committer")
        if isinstance(committer, str):
            state.committer, state.committer_version = committer, version

    def _check_carried(
        self, version: int, info: dict[str, Any], actions: list[tuple[str, dict[str, Any]]]
    ) -> None:
        """A commit's ranges of a commit file name its own file, inside the data it carries
        (PROTOCOL.md 11.8); a checkpoint carries them on unchanged, so only commits are
        checked."""
        offset, size = info.get("dataOffset"), info.get("dataBytes")
        own = self.carried_path(version)
        for name, body in actions:
            if name != "add" or not isinstance(body.get("path"), str):
                continue
            path = body["path"]
            if not path.startswith("_log"):
                continue
            span = body.get("range")
            if path == own and info.get("dataVacuumed") is True:
                continue  # its data vacuumed once no partition needed it (22.5)
            if path != own or not isinstance(offset, int) or not isinstance(size, int):
                raise CorruptLogError(
                    f"{self.describe(version)}: add names {path!r}, which is not data this "
                    "commit carries"
                )
            if not (
                isinstance(span, list)
                and len(span) == 2
                and all(type(v) is int for v in span)
                and offset <= span[0]
                and span[0] + span[1] <= offset + size
            ):
                raise CorruptLogError(
                    f"{self.describe(version)}: add range {span!r} lies outside the data this "
                    f"commit carries (bytes {offset} to {offset + size})"
                )

    def _load_checkpoint(self) -> tuple[S, int | None]:
        """The state to read forward from, and the version of the checkpoint it is when the
        hint named it (its own commit is then confirmed by :meth:`load`)."""
        version = self._hinted_version()
        if version is not None:
            loaded = self._read_checkpoint(version)
            if loaded is not None:
                return loaded, version
        return self._listed_checkpoint(), None

    def _hinted_version(self) -> int | None:
        """The version ``_last_checkpoint`` names, or None (absent or malformed, 7.3)."""
        hint = self.storage.read_if_exists(self._path(LAST_CHECKPOINT))
        if hint is None:
            return None
        try:
            version = json.loads(hint)["version"]
        except (ValueError, KeyError, TypeError):
            version = None
        if is_int(version):
            return version
        log.warning("ignoring malformed %s in %s", LAST_CHECKPOINT, self.directory)
        return None

    def _listed_checkpoint(self) -> S:
        # No usable hint: list once to find the newest checkpoint, and to make sure that
        # a log whose early versions were cleaned up is not mistaken for an empty one.
        versions: list[int] = []
        checkpoints: list[int] = []
        for info in self.storage.list_dir(self.directory):
            parsed = parse_log_file_name(info.name)
            if parsed is not None:
                (checkpoints if parsed[1] else versions).append(parsed[0])
        for version in sorted(checkpoints, reverse=True):
            loaded = self._read_checkpoint(version)
            if loaded is not None:
                return loaded
        if versions and min(versions) > 0:
            raise CorruptLogError(
                f"{self.storage.display_url}/{self.directory}: versions before {min(versions)} are gone "
                "and no checkpoint covers them"
            )
        return self.state_factory()

    def _checkpoint_at_or_below(self, version: int) -> S | None:
        found = [
            parsed[0]
            for info in self.storage.list_dir(self.directory)
            if (parsed := parse_log_file_name(info.name)) is not None
            and parsed[1]
            and parsed[0] <= version
        ]
        for candidate in sorted(found, reverse=True):
            loaded = self._read_checkpoint(candidate)
            if loaded is not None:
                return loaded
        return None

    def _read_checkpoint(self, version: int) -> S | None:
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
        try:
            for name, body in actions:
                state.apply(name, body)
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptLogError(f"{where}: malformed action ({exc})") from None
        except CorruptLogError as exc:
            raise CorruptLogError(f"{where}: {exc}") from None
        except UnsupportedFormatVersionError as exc:
            raise UnsupportedFormatVersionError(f"{where}: {exc}") from None
        state.stamp(version)
        ts = info.get("timestamp")
        if isinstance(ts, int):
            state.last_commit_ms = ts
        return state

    # -- writing -------------------------------------------------------------------------------

    def commit(
        self,
        state: S,
        build: Callable[[S], list[Action] | None],
        *,
        operation: str,
        durable: bool = True,
        info: dict[str, Any] | None = None,
        written_at: float | None = None,
        background_checkpoint: bool = False,
        data: bytes | memoryview | Callable[[], bytes | memoryview] | None = None,
    ) -> CommitResult[S] | None:
        """Build a commit from the newest state and publish it as the next version.

        ``build`` receives the state the commit will follow and returns its actions, None when
        there is nothing to commit, or raises when the state makes the commit invalid (it is
        re-run after every conflict, so validation always sees the latest state). Returns None
        when ``build`` returned None.

        ``written_at`` (by ``retry.clock``) is when the write of the oldest file the commit
        references started: right before every attempt to publish, a file that old is refused
        with :class:`StaleWriteError` (nothing written) or, when an earlier attempt's outcome
        is unknown, :class:`CommitStateUnknownError` (PROTOCOL.md 23.1).

        ``background_checkpoint``: a checkpoint due at the new version is written by a
        background thread (:func:`wait_for_checkpoints`), so the commit returns as soon as it
        has landed: a producer's acknowledgement does not wait for a checkpoint's writes.

        ``data``: bytes the commit carries (PROTOCOL.md 11.8), named by ranged adds whose path
        is :data:`CARRIED`; each attempt names its own version's file. Only a log at reader
        version 5 and writer version 6 takes them. A callable gives each attempt's data after
        its build (a shared commit's data depends on which flushes the state leaves to take,
        PROTOCOL.md 30.5).
        """
        self.storage.check_writable()
        if state.stale():
            state = self.load()
        if self._looks_first > 0 and self.storage.is_remote:
            # Another writer shares this log (its commit took a version this one meant to
            # write, not long ago): look for its newer versions before writing. A GET that
            # finds one costs a twelfth of the PUT it would refuse, and a round trip less.
            newer = self.update(state)
            self._looks_first = LOOK_FIRST_COMMITS if newer is not state else self._looks_first - 1
            state = newer
        commit_id = unique_id()
        deadline = clock.monotonic() + self.retry.timeout_s
        attempt = 0
        while True:
            attempt += 1
            check_writer_version(state)
            actions = build(state)
            if actions is None:
                return None
            carried = data() if callable(data) else data
            version = state.version + 1
            meta = {
                **(info or {}),  # first: a caller's field never replaces one the protocol relies on
                "timestamp": int(time.time() * 1000),
                "operation": operation,
                "commitId": commit_id,
                "writer": f"kstore/{__version__}",
            }
            # Apply the actions to a copy *before* publishing: a commit that does not apply (an
            # add overlapping a live segment, a remove of a segment already gone) must never
            # land, or every later reader of the log would fail on it for good.
            # Encoded first: the state keeps each action's line for its checkpoint's deltas.
            if carried is not None:
                actions, payload = encode_carrying_commit(
                    actions, meta, carried, self.carried_path(version)
                )
                # The text ends right before the data, at the newline after the last action.
                text_end = payload.rfind(b"\n", 0, len(payload) - len(carried)) + 1
                lines = payload[:text_end].decode().split("\n")[1:-1]
            else:
                lines, payload = encode_commit_lines(actions, meta)
            new_state: S = state.copy()  # type: ignore[assignment]
            self.descend(new_state)
            try:
                for (name, body), line in zip(_split(actions), lines, strict=True):
                    new_state.apply_encoded(name, body, line)
            except (CorruptLogError, KeyError, TypeError, ValueError) as exc:
                raise ConcurrentModificationError(
                    f"{self.storage.display_url}/{self.directory}: {operation} commit does not apply to "
                    f"version {state.version}; nothing was written ({exc})"
                ) from None
            if (
                carried is not None
            ):  # by the versions the commit leaves (a new log's first sets them)
                check_carries_data(new_state, self.describe(version))
            else:
                try:  # what readers check (9.3): an add names only data this commit carries
                    self._check_carried(version, meta, _split(actions))
                except CorruptLogError as exc:
                    raise ConcurrentModificationError(
                        f"{operation} commit refused before it was written: {exc}"
                    ) from None
            new_state.stamp(version)
            new_state.last_commit_ms = meta["timestamp"]
            if isinstance(meta.get("committer"), str):
                new_state.committer, new_state.committer_version = meta["committer"], version
            # Checked last, after the build: a pause anywhere before this point counts.
            if state.stale():
                # The version this commit would name may have been written and vacuumed since
                # the state was confirmed (17.5, 23.2): reload, then build again.
                state = self.load()
                continue
            new_state.confirmed_at = state.confirmed_at
            if written_at is not None and self.retry.too_old(written_at):
                raise StaleWriteError(
                    f"{self.storage.display_url}/{self.directory}: a file of this {operation} "
                    f"commit was written {self.retry.clock() - written_at:.1f} s ago, more than "
                    f"{self.retry.max_uncommitted_s} s; nothing was committed (write it again)"
                )
            winner = self._publish(
                version, payload, commit_id, durable=durable, written_at=written_at
            )
            if winner is None:
                if not self._landed_in_time(version, state):
                    # It took a vacuumed version's name: no reader will ever see it. Rebuild on
                    # the newest state, as after a lost race.
                    state = self.load()
                    continue
                if written_at is not None and self.retry.too_old(written_at):
                    self._confirm_files(version, state, actions, operation, written_at)
                new_state.confirmed_at = clock.monotonic()
                if background_checkpoint:
                    self._checkpoint_later(new_state)
                else:
                    self._maybe_checkpoint(new_state)
                return CommitResult(version, new_state, actions, attempt)
            # Lost the race for this version: rebuild on the newer state, which starts with the
            # winner's commit (already read) and goes on with any after it.
            self._looks_first = LOOK_FIRST_COMMITS
            if attempt >= self.retry.max_attempts or clock.monotonic() > deadline:
                raise CommitConflictError(
                    f"{self.storage.display_url}/{self.directory}: gave up after {attempt} conflicting "
                    f"attempts ({operation})"
                )
            time.sleep(self.retry.backoff(min(attempt, 10)))
            state = self.update(self._advanced(state, version, winner))

    def carried_path(self, version: int) -> str:
        """The path by which a ranged add names data that ``version``'s commit file carries:
        relative to the directory that holds this log (a topic log's incarnation directory)."""
        return f"{self.directory.rsplit('/', 1)[-1]}/{version_file(version)}"

    def _publish(
        self,
        version: int,
        payload: bytes,
        commit_id: str,
        *,
        durable: bool,
        written_at: float | None = None,
    ) -> bytes | None:
        """Try to create ``version``: None once our payload is there, else the bytes of the
        commit that holds the version (another writer's).

        An error that leaves the outcome unknown is resolved by reading the version back;
        re-sending the identical payload is safe because put-if-absent admits only one, but
        not once its files are too old to commit (``written_at``).
        """
        path = self._path(version_file(version))
        unknown_attempts = 0
        while True:
            if unknown_attempts and written_at is not None and self.retry.too_old(written_at):
                raise CommitStateUnknownError(
                    f"{self.describe(version)}: not sent again, its files are too old to commit; "
                    "whether the earlier attempt landed is unknown"
                )
            try:
                self.storage.put_if_absent(path, payload, durable=durable)
                return None
            except FileExistsError:
                pass  # someone's commit is there; maybe ours, if a lower layer retried the PUT
            except DurabilityUnknownError as exc:
                # Our commit is in the log, but it may not survive a machine crash: neither a
                # success to acknowledge nor a failure to write again. Not retriable: a retry
                # would find the commit and report it durable.
                unknown = CommitStateUnknownError(
                    f"{self.describe(version)}: committed but not known to be durable ({exc})"
                )
                unknown.retriable = False
                raise unknown from exc
            except StorageError as exc:
                unknown_attempts += 1
                log.warning(
                    "commit %s of %s: outcome unknown (%s); reading it back",
                    version,
                    self.directory,
                    exc,
                )
                if unknown_attempts > 5:
                    raise CommitStateUnknownError(
                        f"{self.describe(version)}: the storage kept failing; whether the commit "
                        f"landed is unknown ({exc})"
                    ) from exc
                time.sleep(self.retry.backoff(unknown_attempts + 3))
            try:
                existing = self.storage.read_if_exists(path)
            except StorageError as exc:
                unknown_attempts += 1
                if unknown_attempts > 5:
                    raise CommitStateUnknownError(
                        f"{self.describe(version)}: cannot read back an uncertain commit ({exc})"
                    ) from exc
                continue
            if existing is None:
                # "Exists" but unreadable (deleted meanwhile, or a store whose reads lag its
                # writes): count it as an unknown outcome and back off before sending again.
                unknown_attempts += 1
                if unknown_attempts > 5:
                    raise CommitStateUnknownError(
                        f"{self.describe(version)}: the storage says the version exists but it "
                        "cannot be read"
                    )
                time.sleep(self.retry.backoff(unknown_attempts + 3))
                continue
            if _commit_id_of(existing) != commit_id:
                return existing
            if existing != payload:
                # Our commit id, but not our bytes: a torn or damaged copy of this very commit
                # (its first line survived). Readers will refuse it; so must the writer, rather
                # than acknowledge records that no reader can see.
                raise CorruptLogError(
                    f"{self.describe(version)}: holds a damaged copy of this commit "
                    f"({len(existing)} of {len(payload)} bytes)"
                )
            return None

    def _advanced(self, state: S, version: int, data: bytes) -> S:
        """A copy of ``state`` with the commit ``data`` (the next version, already read)
        applied."""
        advanced: S = state.copy()  # type: ignore[assignment]
        info, actions = decode_commit(data, self.describe(version))
        self._apply_commit(advanced, version, info, actions)
        return advanced

    def _landed_in_time(self, version: int, base: S) -> bool:
        """Whether commit ``version``, built on ``base`` and just created, extends the log
        (PROTOCOL.md 23.2). The name was checked free of vacuum's reach before the write: the
        base was confirmed newest within the staleness bound, and vacuum deletes only versions
        below a checkpoint recorded more than the log retention (twice that bound) ago. Only a
        write that returned past the bound could have landed on a deleted version's name; then
        the log is listed: a checkpoint above ``version`` that the storage recorded well
        before this commit means the name had been taken and vacuumed (any checkpoint written
        after this commit is recorded after it)."""
        if 0 <= clock.monotonic() - base.confirmed_at <= STALE_STATE_S:
            return True
        ours = version_file(version)
        listing = {info.name: info for info in self.storage.list_dir(self.directory)}
        mine = listing.get(ours)
        if mine is None or mine.mtime_ms is None:
            raise CommitStateUnknownError(
                f"{self.describe(version)}: written more than {STALE_STATE_S / 3600:.0f} h after "
                "its state was confirmed, and the storage does not say when it landed; whether "
                "it extends the log is unknown"
            )
        horizon = mine.mtime_ms - int(STALE_STATE_S * 1000)
        for name, info in listing.items():
            parsed = parse_log_file_name(name)
            if (
                parsed is not None
                and parsed[1]
                and parsed[0] > version
                and info.mtime_ms is not None
                and info.mtime_ms < horizon
            ):
                log.warning(
                    "%s landed after checkpoint %d, which the storage recorded %.1f h before "
                    "it: the version had been vacuumed; its file is deleted and the commit is "
                    "built again",
                    self.describe(version),
                    parsed[0],
                    (mine.mtime_ms - info.mtime_ms) / 3_600_000,
                )
                with contextlib.suppress(StorageError):
                    self.storage.delete([self._path(ours)])
                return False
        return True

    def _confirm_files(
        self, version: int, base: S, actions: list[Action], operation: str, written_at: float
    ) -> None:
        """Commit ``version`` landed past the commit deadline of the files it adds: the write
        paused after the last check. Confirm by the storage's clock that vacuum cannot have
        taken them for orphans before the commit landed (PROTOCOL.md 23.2): each file exists and
        was recorded less than the minimum orphan age before the commit. Otherwise withdraw
        the commit's adds (a commit that removes them, so no reader meets a missing file, and
        adds back what it removed: a merge's originals are still there, their delete delay
        counts from this commit) and raise :class:`WithdrawnCommitError`: its records are not
        acknowledged."""
        root = self.directory.rsplit("/", 1)[0]
        adds = [
            body
            for name, body in _split(actions)
            if name == "add" and isinstance(body.get("path"), str)
        ]
        files = sorted({f"{root}/{b['path']}" for b in adds if not b["path"].startswith("_log")})
        if not files:
            return
        commit_path = self._path(version_file(version))
        found = self.storage.stat_many([commit_path, *files])
        landed = found.get(commit_path)
        margin_ms = MIN_ORPHAN_AGE_MS - 1000  # S3 records times to the second
        late = [
            path
            for path in files
            if landed is None
            or landed.mtime_ms is None
            or path not in found
            or found[path].mtime_ms is None
            or landed.mtime_ms - (found[path].mtime_ms or 0) >= margin_ms
        ]
        if not late:
            log.warning(
                "%s landed %.0f s after its files were written; the storage's times confirm it",
                self.describe(version),
                self.retry.clock() - written_at,
            )
            return
        log.error(
            "%s landed %.0f s after its files were written, too late to be sure vacuum left %s "
            "in place: withdrawing what it added",
            self.describe(version),
            self.retry.clock() - written_at,
            ", ".join(late),
        )
        # A maintenance commit (merging, compaction) removed what its files replace: those
        # segments are added back, from the state the commit was built on.
        restored: list[Action] = []
        for name, body in _split(actions):
            if name == "remove":
                original = base.live_add(body["path"], body.get("partition"))
                if original is None or str(original["add"]["path"]).startswith("_log"):
                    # Not live any more, or a range another commit carries (11.8): no add
                    # may name that commit's file again.
                    raise WithdrawnCommitError(
                        f"{self.describe(version)}: an {operation} commit landed too late to be "
                        f"sure its files were still there ({', '.join(late)}), and what it "
                        f"removed ({body['path']}) cannot be added back; run `kstore verify`"
                    )
                restored.append(original)
        now_ms = int(time.time() * 1000)
        undo: list[Action] = []
        for body in adds:
            remove: dict[str, Any] = {"path": body["path"], "deletionTimestamp": now_ms}
            if "partition" in body:
                remove["partition"] = body["partition"]
            undo.append({"remove": remove})
        undo += restored  # after the removes: the originals take back the offsets (9.1)
        try:
            self.commit(self.load(), lambda _: undo, operation="WITHDRAW")
        except KStoreError as exc:
            raise WithdrawnCommitError(
                f"{self.describe(version)}: an {operation} commit landed too late to be sure its "
                f"files were still there ({', '.join(late)}), and taking it back failed ({exc}); "
                "run `kstore verify` on the topic"
            ) from exc
        taken_back = (
            "it was taken back (its adds removed, what it removed added back): nothing changed"
            if restored
            else "its records were withdrawn (a later commit removes them) and are not "
            "acknowledged: send them again"
        )
        raise WithdrawnCommitError(
            f"{self.describe(version)}: an {operation} commit landed too late to be sure its "
            f"files were still there ({', '.join(late)}); {taken_back}"
        )

    def _checkpoint_later(self, state: S) -> None:
        """Write the checkpoint due at ``state`` on the background thread. While this log's
        previous one is being written, it waits and is written next, unless a newer one
        comes due first and takes its place (any version may have a checkpoint or none, 13.1)."""
        if state.version <= 0 or state.version % self.checkpoint_interval:
            return
        snapshot: S = state.copy()  # type: ignore[assignment]  # the committer goes on from state
        with _BACKGROUND_LOCK:
            running = self._checkpointing
            if running is not None and running in _PENDING:
                self._checkpoint_next = snapshot
                return
            global _BACKGROUND
            if _BACKGROUND is None:
                _BACKGROUND = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="kstore-checkpoint"
                )
            future = _BACKGROUND.submit(self._checkpoints_from, snapshot)
            self._checkpointing = future
            _PENDING.add(future)
            future.add_done_callback(_PENDING.discard)

    def _checkpoints_from(self, state: S | None) -> None:
        while state is not None:
            self._maybe_checkpoint(state)
            with _BACKGROUND_LOCK:
                state, self._checkpoint_next = self._checkpoint_next, None
                if state is None:
                    self._checkpointing = None

    def descend(self, state: S) -> None:
        """Ready ``state``, a private copy about to take a commit or be checkpointed, to write
        checkpoints: a topic log's states keep their actions for deltas and descend from the
        newest checkpoint written here, which a background write may have finished after they
        were copied (its chains of sidecars, 13.4). Nothing to do for other logs."""

    def _maybe_checkpoint(self, state: S) -> None:
        if state.version <= 0 or state.version % self.checkpoint_interval:
            return
        if not self.checkpoint_in_time(state):
            log.warning(
                "checkpoint %s of %s not written: its commit was confirmed %.0f s ago, more than "
                "%.0f s (PROTOCOL.md 23.2); a later checkpoint will be",
                state.version,
                self.directory,
                clock.monotonic() - state.confirmed_at,
                CHECKPOINT_DEADLINE_S,
            )
            return
        try:
            self.write_checkpoint(state)
        except Exception as exc:  # a checkpoint is an optimisation; the commit has landed
            log.warning("checkpoint %s of %s failed: %s", state.version, self.directory, exc)

    def write_checkpoint(self, state: S) -> None:
        self._publish_checkpoint(state, state.checkpoint_actions())

    def _publish_checkpoint(self, state: S, actions: list[Action]) -> None:
        """Write the checkpoint of ``state`` holding ``actions``, and point the hint at it."""
        payload = encode_commit(
            actions,
            {
                "checkpointVersion": state.version,
                "timestamp": state.last_commit_ms or 0,
                "writer": f"kstore/{__version__}",
            },
        )
        if not self.checkpoint_in_time(state):
            raise StaleWriteError(
                f"{self.storage.display_url}/{self._path(checkpoint_file(state.version))}: not "
                f"written, version {state.version} was confirmed as the newest "
                f"{clock.monotonic() - state.confirmed_at:.0f} s ago (PROTOCOL.md 23.2)"
            )
        path = self._path(checkpoint_file(state.version))
        # Another writer may have checkpointed the same version: same content by construction.
        with contextlib.suppress(FileExistsError):
            self.storage.put_if_absent(path, payload)
        if not self.checkpoint_in_time(state):
            # Landed late: the version may lie below what vacuum keeps by now. Readers ignore
            # a checkpoint whose commit is gone; the hint is not pointed at it.
            if not self.storage.exists(self._path(version_file(state.version))):
                with contextlib.suppress(StorageError):
                    self.storage.delete([path])
            raise StaleWriteError(
                f"{self.storage.display_url}/{path}: landed "
                f"{clock.monotonic() - state.confirmed_at:.0f} s after version "
                f"{state.version} was confirmed (PROTOCOL.md 23.2); the hint is left as it is"
            )
        self._advance_hint(state.version)

    def checkpoint_in_time(self, state: LogState) -> bool:
        """Whether a checkpoint of ``state`` (and a hint naming it) may still be written: within
        CHECKPOINT_DEADLINE_S of its version being confirmed as the newest (23.2)."""
        confirmed: float | None = getattr(state, "confirmed_at", None)
        return confirmed is not None and 0 <= clock.monotonic() - confirmed <= CHECKPOINT_DEADLINE_S

    def _advance_hint(self, version: int) -> None:
        """Point ``_last_checkpoint`` at ``version`` unless it names that or a newer one: the
        hint never moves back (7.3)."""
        current = self._hinted_version()
        if current is not None and current >= version:
            return
        self.storage.put(self._path(LAST_CHECKPOINT), json.dumps({"version": version}).encode())


# Checkpoints written in the background (Log.commit's ``background_checkpoint``): one thread
# for the process, and the checkpoints it has yet to finish.
_BACKGROUND: concurrent.futures.ThreadPoolExecutor | None = None
_BACKGROUND_LOCK = threading.Lock()
_PENDING: set[concurrent.futures.Future[None]] = set()


def _forget_background_after_fork() -> None:
    # A forked child has none of its parent's threads: it starts its own, and does not wait
    # for checkpoints its parent is writing.
    global _BACKGROUND, _BACKGROUND_LOCK
    _BACKGROUND, _BACKGROUND_LOCK = None, threading.Lock()
    _PENDING.clear()


os.register_at_fork(after_in_child=_forget_background_after_fork)


def wait_for_checkpoints(timeout: float | None = None) -> bool:
    """Wait until the checkpoints this process is writing in the background are written (or
    have failed, which only costs readers some replay). False if ``timeout`` passed first."""
    with _BACKGROUND_LOCK:
        pending = list(_PENDING)
    _, not_done = concurrent.futures.wait(pending, timeout=timeout)
    return not not_done


def check_writer_version(state: LogState) -> None:
    if state.topic_deleted is not None:
        raise TopicDeletedError(
            f"topic {state.topic_deleted.get('topic', '?')!r} (id "
            f"{state.topic_deleted.get('id', '?')}) was deleted; its logs take no more commits "
            "(nothing was written: look the topic up again)"
        )
    if state.min_writer_version > WRITER_VERSION:
        raise UnsupportedFormatVersionError(
            f"log requires writer version {state.min_writer_version}; this kstore {__version__} "
            f"writes up to {WRITER_VERSION}: upgrade kstore to write here"
        )


def may_carry_data(state: LogState) -> bool:
    """Whether a commit may carry data in a log at ``state``'s versions: reader version 5 and
    writer version 6 (PROTOCOL.md 3.2)."""
    return (
        state.min_reader_version >= CARRIED_DATA_VERSION
        and state.min_writer_version >= CARRIED_DATA_WRITER_VERSION
    )


def check_carries_data(state: LogState, where: str) -> None:
    """A commit may carry data only in a log at reader version 5 and writer version 6."""
    if not may_carry_data(state):
        raise ValueError(
            f"{where}: a commit that carries data needs a log at reader version "
            f"{CARRIED_DATA_VERSION} and writer version {CARRIED_DATA_WRITER_VERSION}; this log "
            f"is at {state.min_reader_version}/{state.min_writer_version}"
        )


def protocol_action(version: int = 1, writer: int | None = None) -> Action:
    """The protocol a new log starts at: the lowest versions its content needs (``writer``:
    when writers need a higher version than readers)."""
    return {
        "protocol": {
            "minReaderVersion": version,
            "minWriterVersion": version if writer is None else writer,
        }
    }


def _split(actions: Sequence[Action]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for action in actions:
        ((name, body),) = action.items()
        out.append((name, body))
    return out


def _commit_id_of(data: bytes) -> str | None:
    first = data.split(b"\n", 1)[0]
    try:
        obj = json.loads(first)
        value = obj["commitInfo"]["commitId"]
    except (ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, str) else None
