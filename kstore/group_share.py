"""Shared group commits (PROTOCOL.md 31): the members of one consumer group share the commits
of its log instead of racing for every version.

A member commits its change (an offset commit, a release, a join, a leave) directly, as
always. A member whose commit loses the race writes its change instead as a **pending
request**, ``groups/<group>/_requests/<writer>-<number>.json``, a file only it writes, and
waits: every member that commits to the log while it has met contention in the last 10 s
lists that directory and takes the requests it finds into its own commit, each validated on
the state the commit follows exactly as its member's own commit would be. A request no commit
takes within the takeover time (jittered) is committed by its own member, taking every other
request it finds ("takeover"). So a burst of N changes costs a few commits, not N commits and
N(N-1)/2 refused PUTs.

Each commit that decides a request records it in a ``requests`` action, the request's writer
and number with its error if refused; the group state keeps each writer's last decided number
(checkpointed), which is what makes a request committed at most once, whoever takes it and
however many try, and tells the waiting member its outcome.

This module holds the file format and the roles; what a request means is the group's
(:mod:`kstore.groups` builds the combined commit).
"""

from __future__ import annotations

import contextlib
import logging
import random
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from kstore import clock
from kstore.errors import CorruptLogError, KStoreError, StorageError
from kstore.handoff import read_handed_over
from kstore.storage import Storage, unique_id

log = logging.getLogger("kstore.consumer")

REQUESTS_DIR = "_requests"
REQUEST_SUFFIX = ".json"
REQUEST_KINDS = ("offsets", "release", "join", "leave")
_NAME = re.compile(r"([0-9a-f]{32})-([0-9]{20})\.json")
MAX_REQUEST_BYTES = 1 << 20  # PROTOCOL.md Appendix A
# A member lists pending requests in its commits for this long after it last lost a race,
# waited or took another member's request.
ACTIVE_S = 10.0
# A pending request listed as written longer ago than this is not taken (PROTOCOL.md 31.5).
REQUEST_MAX_AGE_MS = 3_600_000
DEFAULT_TAKEOVER_LOCAL_MS = 20
DEFAULT_TAKEOVER_REMOTE_MS = 250
# Outcomes of pending names a member knows are skipped in later listings this long.
_KNOWN_S = 60.0


def request_name(writer: str, number: int) -> str:
    return f"{writer}-{number:020d}{REQUEST_SUFFIX}"


def parse_request_name(name: str) -> tuple[str, int] | None:
    found = _NAME.fullmatch(name)
    return None if found is None else (found.group(1), int(found.group(2)))


@dataclass(frozen=True)
class GroupRequest:
    """One member's change to its group's log, as data (PROTOCOL.md 31.2).

    ``body`` by kind: ``offsets``: ``generation``, ``offsets`` (items of 8.19); ``release``:
    ``partitions`` ([topic, partition] pairs), ``offsets`` (its final offsets, items);
    ``join``: the join action's body (8.15); ``leave``: ``reason``."""

    kind: str
    member_id: str
    body: dict[str, Any]
    writer: str = ""
    number: int = -1
    listed_ms: int = -1  # foreign requests: the listed modification time (ordering only)

    @property
    def name(self) -> str:
        return request_name(self.writer, self.number)

    @property
    def pending(self) -> bool:
        """Whether a pending file of this request may exist (a number was drawn for it)."""
        return self.number >= 0


@dataclass(frozen=True)
class Decided:
    """A writer's last decided request, as the group state records it (action 8.32)."""

    number: int
    time_ms: int
    error: str | None = None
    message: str | None = None


def encode_request(request: GroupRequest, timestamp_ms: int) -> bytes:
    body = {
        "writer": request.writer,
        "number": request.number,
        "timestamp": timestamp_ms,
        "kind": request.kind,
        "memberId": request.member_id,
        **request.body,
    }
    data: bytes = orjson.dumps({"request": body}) + b"\n"
    if len(data) > MAX_REQUEST_BYTES:
        raise KStoreError(f"a group request of {len(data)} bytes is over the 1 MiB limit")
    return data


def decode_request(data: bytes, *, name: str, where: str) -> GroupRequest:
    """Parse and check a pending request's file; :class:`CorruptLogError` names what is wrong.
    The kind-specific content is checked by the group when it builds on it."""
    parsed = parse_request_name(name)
    if parsed is None:
        raise CorruptLogError(f"{where}: not the name of a pending request")
    if len(data) > MAX_REQUEST_BYTES or not data.endswith(b"\n") or data.count(b"\n") != 1:
        raise CorruptLogError(f"{where}: a pending request is one JSON line of at most 1 MiB")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise CorruptLogError(f"{where}: not JSON ({exc})") from None
    body = obj.get("request") if isinstance(obj, dict) else None
    if not isinstance(body, dict) or len(obj) != 1:
        raise CorruptLogError(f"{where}: expected one object {{'request': ...}}")
    body = dict(body)
    writer, number = body.pop("writer", None), body.pop("number", None)
    kind, member = body.pop("kind", None), body.pop("memberId", None)
    body.pop("timestamp", None)
    if (writer, number) != parsed or isinstance(number, bool):
        raise CorruptLogError(f"{where}: writer and number differ from the file's name")
    if kind not in REQUEST_KINDS:
        raise CorruptLogError(f"{where}: unknown request kind {kind!r}")
    if not isinstance(member, str) or not member:
        raise CorruptLogError(f"{where}: memberId must be a non-empty string")
    return GroupRequest(kind, member, body, writer=parsed[0], number=parsed[1])


def default_takeover_ms(storage: Storage) -> int:
    return DEFAULT_TAKEOVER_REMOTE_MS if storage.is_remote else DEFAULT_TAKEOVER_LOCAL_MS


class RequestRefusedError(KStoreError):
    """A request another member's commit refused, with the error that member met."""


RoundBuilder = Callable[
    [Any, list[GroupRequest]], tuple[list[dict[str, Any]], dict[str, BaseException | None]]
]


class _YieldError(Exception):
    """A direct commit lost the race: the request goes pending."""


class GroupShare:
    """One member process's part in sharing a group log's commits (one request at a time).

    ``log_``: the group's :class:`kstore.log.Log`; ``build``: makes a combined commit's
    actions from a state and requests, and each request's outcome (None: decided without
    error; an exception: refused), keyed by the request's name (``""`` for the member's own
    request without a pending file)."""

    def __init__(
        self,
        *,
        log_: Any,
        storage: Storage,
        requests_dir: str,
        build: RoundBuilder,
        takeover_s: float,
        metrics: dict[str, int],
    ) -> None:
        self.writer_id = unique_id()
        self._log = log_
        self._storage = storage
        self._dir = requests_dir
        self._build = build
        self._takeover_s = takeover_s
        # How long this member's uncontended commits take (a moving average): a waiter takes
        # over after twice that, when it is shorter than ``takeover_s``.
        self._commit_s: float | None = None
        self._metrics = metrics
        self._poll_s = 0.01 if storage.is_remote else 0.002
        self._lock = threading.Lock()
        self._number = 0
        self._listing_until = 0.0
        self._known: dict[str, float] = {}
        for key in (
            "group-commit-total",
            "group-request-pending-total",
            "group-request-taken-total",
            "group-takeover-total",
            "group-race-lost-total",
        ):
            metrics.setdefault(key, 0)

    # -- entry point -----------------------------------------------------------------------------

    def submit(self, request: GroupRequest, operation: str, state: Any, *, shared: bool) -> Any:
        """Commit ``request`` on ``state`` (or newer) directly or, when ``shared`` and the
        direct commit lost a race, as a pending request another member's commit takes.
        Returns the newest state known after it; raises the request's refusal."""
        with self._lock:
            if not shared:
                state, outcome = self._round(request, operation, state, listing=False)
            else:
                listing = clock.monotonic() < self._listing_until
                try:
                    state, outcome = self._round(
                        request, operation, state, listing=listing, voluntary=True
                    )
                except _YieldError:
                    self._metrics["group-race-lost-total"] += 1
                    self._listing_until = clock.monotonic() + ACTIVE_S
                    state, outcome = self._wait(request, operation, state)
            if outcome is not None:
                raise outcome
            return state

    # -- a round -------------------------------------------------------------------------------

    def _round(
        self,
        own: GroupRequest,
        operation: str,
        state: Any,
        *,
        listing: bool,
        voluntary: bool = False,
    ) -> tuple[Any, BaseException | None]:
        """One commit of ``own`` and, when ``listing``, every pending request found. Returns
        the state after it and own's refusal (or None). Raises :class:`_YieldError` when
        ``voluntary`` and the first attempt lost the race."""
        foreign = self._pending() if listing else []
        attempts = [0]
        outcomes: dict[str, BaseException | None] = {}

        def build(current: Any) -> list[dict[str, Any]] | None:
            attempts[0] += 1
            if voluntary and attempts[0] > 1:
                raise _YieldError()
            decided = current.requests
            todo = [r for r in foreign if r.number > decided.get(r.writer, _NONE).number]
            if not own.pending or own.number > decided.get(own.writer, _NONE).number:
                todo.insert(0, own)  # else another commit took it while this one was built
            actions, found = self._build(current, todo)
            outcomes.clear()
            outcomes.update(found)
            return actions or None

        started = clock.monotonic()
        result = self._log.commit(state, build, operation=operation)
        if result is not None and result.attempts == 1:
            took = clock.monotonic() - started
            self._commit_s = took if self._commit_s is None else 0.8 * self._commit_s + 0.2 * took
        if result is not None:
            state = result.state
            self._metrics["group-commit-total"] += 1
            self._metrics["group-race-lost-total"] += result.attempts - 1
        else:
            state = self._log.update(state)
        taken = sum(1 for r in foreign if r.name in outcomes)
        if taken and result is not None:
            self._metrics["group-request-taken-total"] += taken
            self._listing_until = clock.monotonic() + ACTIVE_S
        # Decided in the state (by this commit or an earlier one): their files go.
        decided = state.requests
        self._forget([r.name for r in foreign if r.number <= decided.get(r.writer, _NONE).number])
        if own.pending:
            entry = decided.get(own.writer)
            if entry is None or entry.number < own.number:
                raise KStoreError(f"{operation}: the commit did not decide its own request")
            return state, _refusal(entry)
        return state, outcomes.get("")

    # -- a waiter ------------------------------------------------------------------------------

    def _wait(
        self, request: GroupRequest, operation: str, state: Any
    ) -> tuple[Any, BaseException | None]:
        """Write ``request`` as a pending request and wait for a commit that decides it; take
        over when none comes in time (PROTOCOL.md 31.4)."""
        own = GroupRequest(
            request.kind,
            request.member_id,
            request.body,
            writer=self.writer_id,
            number=self._number,
        )
        self._number += 1
        path = f"{self._dir}/{own.name}"
        payload = encode_request(own, int(time.time() * 1000))
        deadline = clock.monotonic() + self._log.retry.timeout_s
        while True:
            try:
                self._storage.put_if_absent(path, payload, durable=True)
                break
            except FileExistsError:
                if self._storage.read_if_exists(path) == payload:
                    break
                raise StorageError(
                    f"{path}: a pending request of this name holds other bytes"
                ) from None
            except StorageError as exc:
                if clock.monotonic() >= deadline:
                    raise
                log.warning("pending request %s: %s; writing it again", path, exc)
                time.sleep(self._poll_s)
        self._metrics["group-request-pending-total"] += 1
        try:
            last_version, last_change = state.version, clock.monotonic()
            # Jittered, so that members that lost one race do not all take over at once.
            patience = self._patience() * (1 + random.random())
            # The oldest waiting request's member commits for all at once: the others would
            # only wait for a takeover (PROTOCOL.md 31.4).
            first = self._first_waiting(own, state)
            while True:
                try:
                    state = self._log.update(state, tail=True)
                except StorageError as exc:
                    if clock.monotonic() >= deadline:
                        raise _unknown(operation, exc) from exc
                    time.sleep(self._poll_s)
                    continue
                entry = state.requests.get(own.writer)
                if entry is not None and entry.number >= own.number:
                    return state, _refusal(entry)
                now = clock.monotonic()
                if state.version != last_version:
                    last_version, last_change = state.version, now
                    first = self._first_waiting(own, state)
                if now >= deadline:
                    raise _unknown(operation, None)
                if first or now - last_change >= patience:
                    first = False
                    self._metrics["group-takeover-total"] += 1
                    try:
                        return self._round(own, operation, state, listing=True)
                    except KStoreError as exc:
                        if not exc.retriable:
                            raise
                        log.warning("takeover of a group request failed: %s; waiting on", exc)
                        last_change = clock.monotonic()
                time.sleep(self._poll_s)
        finally:
            with contextlib.suppress(KStoreError):
                self._storage.delete([path])

    def _first_waiting(self, own: GroupRequest, state: Any) -> bool:
        """Whether ``own`` is the oldest undecided pending request of the log, by (listed
        modification time, name): every member that lists the same requests agrees on it."""
        try:
            listed = self._storage.list_dir(self._dir)
        except StorageError:
            return False
        decided = state.requests
        now_ms = int(time.time() * 1000)
        waiting = []
        for info in listed:
            parsed = parse_request_name(info.name)
            if parsed is None or parsed[1] <= decided.get(parsed[0], _NONE).number:
                continue
            if info.mtime_ms is not None and now_ms - info.mtime_ms > REQUEST_MAX_AGE_MS:
                continue
            waiting.append((info.mtime_ms or 0, info.name))
        return bool(waiting) and min(waiting)[1] == own.name

    def _patience(self) -> float:
        """The takeover time: twice an uncontended commit of this member, at most the
        configured one (a commit that lists takes a pending request within about one)."""
        if self._commit_s is None:
            return self._takeover_s
        return min(self._takeover_s, max(0.002, 2 * self._commit_s))

    # -- pending requests ------------------------------------------------------------------------

    def _forget(self, names: list[str]) -> None:
        now = clock.monotonic()
        for name in names:
            self._known[name] = now
        if names or len(self._known) > 4096:
            self._known = {n: t for n, t in self._known.items() if now - t < _KNOWN_S}
        if names:
            with contextlib.suppress(KStoreError):
                self._storage.delete([f"{self._dir}/{name}" for name in names])

    def _pending(self) -> list[GroupRequest]:
        """Every other writer's pending request whose outcome this member does not know, read
        and checked, oldest first. A file that fails its checks is deleted: its writer commits
        the request itself after the takeover time."""

        def wanted(name: str) -> bool:
            parsed = parse_request_name(name)
            return parsed is not None and parsed[0] != self.writer_id and name not in self._known

        out: list[GroupRequest] = []
        bad: list[str] = []
        for file in read_handed_over(
            self._storage,
            self._dir,
            wanted=wanted,
            max_age_ms=REQUEST_MAX_AGE_MS,  # older: the housekeeping's
            what="pending requests",
        ):
            name, data, listed_ms = file.name, file.data, file.listed_ms
            try:
                request = decode_request(
                    data, name=name, where=f"{self._storage.display_url}/{self._dir}/{name}"
                )
            except CorruptLogError as exc:
                log.warning("refusing pending request: %s", exc)
                bad.append(name)
                continue
            out.append(
                GroupRequest(
                    request.kind,
                    request.member_id,
                    request.body,
                    writer=request.writer,
                    number=request.number,
                    listed_ms=listed_ms,
                )
            )
        self._forget(bad)
        out.sort(key=lambda r: (r.listed_ms, r.name))
        return out


_NONE = Decided(-1, 0)


def _refusal(entry: Decided) -> BaseException | None:
    if entry.error is None:
        return None
    from kstore import errors

    kind = getattr(errors, entry.error, None)
    message = entry.message or entry.error
    if isinstance(kind, type) and issubclass(kind, KStoreError):
        return kind(message)
    return RequestRefusedError(f"{entry.error}: {message}")


def _unknown(operation: str, cause: BaseException | None) -> KStoreError:
    from kstore.errors import CommitStateUnknownError

    why = f" ({cause})" if cause is not None else ""
    return CommitStateUnknownError(
        f"{operation}: the group request was not decided within the commit timeout{why}; "
        "another member may still commit it"
    )


__all__ = [
    "ACTIVE_S",
    "REQUESTS_DIR",
    "Decided",
    "GroupRequest",
    "GroupShare",
    "decode_request",
    "default_takeover_ms",
    "encode_request",
    "parse_request_name",
    "request_name",
]
