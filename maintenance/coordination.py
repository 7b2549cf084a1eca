"""Leases and last-run records of the maintenance service, under ``_maintenance/`` (PROTOCOL.md 28).

Every (topic, task) pair, and every store-wide task, has a numbered sequence of small JSON
records, ``<task>.<20-digit n>.json``, in one directory per topic (``_maintenance/topics/
<topic>/``) or for the store (``_maintenance/store/``). A record is only ever created with
put-if-absent, so of several maintainers that read record *n* and write *n* + 1 exactly one
succeeds: that is the whole coordination. A record is in one of three states:

- ``running``: its ``holder`` holds the lease until ``expiresMs``; nobody else runs the task;
- ``done``: the holder finished; ``lastRun`` says when, how it went and what it removed;
- ``released``: the holder gave the lease up without finishing (it was stopped).

Every record carries ``lastRun``, the newest finished run, so the newest record alone answers
both "may I take the lease?" and "when did it last run?". A dead holder's lease runs out at
``expiresMs``, judged by the taker's clock: clocks that disagree cost a repeated run or a late
one, never data, since the jobs themselves commit with optimistic concurrency.
"""

from __future__ import annotations

import json
import os
import re
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from kstore.errors import StorageError
from kstore.names import validate_topic_name
from kstore.storage import Storage, unique_id

ROOT = "_maintenance"
FORMAT_VERSION = 1
# A task name is a reserved word of the service, never user input: lowercase and hyphens.
_TASK_NAME = re.compile(r"[a-z][a-z0-9-]{0,63}")
_RECORD = re.compile(r"^([a-z][a-z0-9-]{0,63})\.(\d{20})\.json$")
# Records kept per task: the newest and the one before it (a reader that listed just before a
# write may still read the older one).
_KEEP = 2


def new_holder() -> str:
    """A maintainer's identity in the records: host, process and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{unique_id()[:8]}"


def check_task_name(name: str) -> str:
    if not _TASK_NAME.fullmatch(name):
        raise ValueError(f"illegal maintenance task name {name!r}: lowercase letters, digits, '-'")
    return name


def directory(topic: str | None) -> str:
    """The record directory of a topic, or of the store's own tasks (``topic`` None)."""
    if topic is None:
        return f"{ROOT}/store"
    return f"{ROOT}/topics/{validate_topic_name(topic)}"


@dataclass
class LastRun:
    """One finished run of a task: what the service shows and plans from."""

    started_ms: int
    finished_ms: int
    outcome: str  # ok, nothing (ran, removed nothing), conflict, error
    detail: str = ""
    records: int = 0  # records removed
    bytes: int = 0  # bytes removed (live segment bytes, and for vacuum the deleted files)
    segments: int = 0  # segments removed
    files: int = 0  # files deleted from storage
    holder: str = ""
    topic_id: str | None = None  # the topic incarnation it ran on
    # What it removed in each partition it changed: {partition: {records, bytes, segments}}.
    partitions: dict[int, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "startedMs": self.started_ms,
            "finishedMs": self.finished_ms,
            "outcome": self.outcome,
            "detail": self.detail,
            "records": self.records,
            "bytes": self.bytes,
            "segments": self.segments,
            "files": self.files,
            "holder": self.holder,
            "topicId": self.topic_id,
            "partitions": {str(p): counts for p, counts in sorted(self.partitions.items())},
        }

    @classmethod
    def from_json(cls, data: Any) -> LastRun | None:
        if not isinstance(data, dict):
            return None
        try:
            return cls(
                started_ms=int(data["startedMs"]),
                finished_ms=int(data["finishedMs"]),
                outcome=str(data["outcome"]),
                detail=str(data.get("detail", "")),
                records=int(data.get("records", 0)),
                bytes=int(data.get("bytes", 0)),
                segments=int(data.get("segments", 0)),
                files=int(data.get("files", 0)),
                holder=str(data.get("holder", "")),
                topic_id=None if data.get("topicId") is None else str(data["topicId"]),
                partitions={
                    int(p): {k: int(v) for k, v in counts.items()}
                    for p, counts in (data.get("partitions") or {}).items()
                },
            )
        except (AttributeError, KeyError, TypeError, ValueError):
            return None  # a damaged lastRun is as good as none: the task is simply due

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Record:
    """One record file of a (topic, task) sequence."""

    task: str
    number: int
    state: str  # running, done, released
    holder: str
    written_ms: int
    expires_ms: int = 0
    last_run: LastRun | None = None

    def encode(self, topic: str | None) -> bytes:
        body = {
            "version": FORMAT_VERSION,
            "task": self.task,
            "topic": topic,
            "state": self.state,
            "holder": self.holder,
            "writtenMs": self.written_ms,
            "expiresMs": self.expires_ms,
            "lastRun": None if self.last_run is None else self.last_run.to_json(),
        }
        return json.dumps(body, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, task: str, number: int, data: bytes) -> Record:
        """A record as read; anything unreadable is a ``released`` record with no last run,
        so a damaged file never blocks the task (the next record replaces it)."""
        try:
            body = json.loads(data)
            if not isinstance(body, dict):
                raise ValueError("not an object")
            return cls(
                task,
                number,
                str(body.get("state", "released")),
                str(body.get("holder", "")),
                int(body.get("writtenMs", 0)),
                int(body.get("expiresMs", 0)),
                LastRun.from_json(body.get("lastRun")),
            )
        except (TypeError, ValueError):
            return cls(task, number, "released", "", 0)

    def held_at(self, now_ms: int) -> bool:
        return self.state == "running" and self.expires_ms > now_ms


def _name(task: str, number: int) -> str:
    return f"{task}.{number:020d}.json"


@dataclass
class Lease:
    """A lease this maintainer holds: the record it wrote, and where."""

    topic: str | None
    task: str
    number: int
    holder: str
    last_run: LastRun | None


@dataclass
class TaskRecords:
    """The record numbers of every task in one directory, from one listing."""

    topic: str | None
    numbers: dict[str, list[int]] = field(default_factory=dict)

    def newest(self, task: str) -> int | None:
        found = self.numbers.get(task)
        return max(found) if found else None


class Records:
    """Reads and writes the records of one store."""

    def __init__(self, storage: Storage):
        self.storage = storage

    def listing(self, topic: str | None) -> TaskRecords:
        """One LIST of the directory: every task's record numbers."""
        out = TaskRecords(topic)
        for info in self.storage.list_dir(directory(topic)):
            match = _RECORD.match(info.name)
            if match:  # anything else (a stray file, a future name) is ignored
                out.numbers.setdefault(match.group(1), []).append(int(match.group(2)))
        return out

    def newest(self, listing: TaskRecords, tasks: list[str]) -> dict[str, Record]:
        """The newest record of each of ``tasks`` that has one (read concurrently)."""
        paths = {}
        for task in tasks:
            number = listing.newest(task)
            if number is not None:
                paths[f"{directory(listing.topic)}/{_name(task, number)}"] = (task, number)
        if not paths:
            return {}
        data = self.storage.read_many(list(paths))
        return {
            task: Record.decode(task, number, data[path])
            for path, (task, number) in paths.items()
            if path in data
        }

    def acquire(
        self,
        topic: str | None,
        task: str,
        *,
        holder: str,
        now_ms: int,
        lease_ms: int,
        newest: Record | None,
    ) -> Lease | None:
        """Take the lease of (topic, task) after ``newest`` (None: no record yet), or None
        when it is held by another maintainer or another one took it first."""
        check_task_name(task)
        if newest is not None and newest.held_at(now_ms):
            return None
        number = 1 if newest is None else newest.number + 1
        last = None if newest is None else newest.last_run
        record = Record(task, number, "running", holder, now_ms, now_ms + lease_ms, last)
        if not self._create(topic, record):
            return None
        return Lease(topic, task, number, holder, last)

    def renew(self, lease: Lease, *, now_ms: int, lease_ms: int) -> bool:
        """Extend a lease held by a task still running: a new ``running`` record after the
        lease's own, so that a run longer than one lease is not taken over. False: the lease had
        run out and another maintainer took it (the caller's run then records nothing)."""
        record = Record(
            lease.task,
            lease.number + 1,
            "running",
            lease.holder,
            now_ms,
            now_ms + lease_ms,
            lease.last_run,
        )
        if not self._create(lease.topic, record):
            return False
        lease.number = record.number
        return True

    def finish(self, lease: Lease, run: LastRun, *, now_ms: int) -> bool:
        """Record the run and end the lease. False: the lease had run out and another
        maintainer took it over (its record comes after ours; ours is then not written)."""
        record = Record(lease.task, lease.number + 1, "done", lease.holder, now_ms, 0, run)
        written = self._create(lease.topic, record)
        if written:
            self._prune(lease.topic, lease.task, record.number)
        return written

    def release(self, lease: Lease, *, now_ms: int) -> bool:
        """End the lease without a run (the maintainer is stopping)."""
        record = Record(
            lease.task, lease.number + 1, "released", lease.holder, now_ms, 0, lease.last_run
        )
        return self._create(lease.topic, record)

    def _create(self, topic: str | None, record: Record) -> bool:
        path = f"{directory(topic)}/{_name(record.task, record.number)}"
        data = record.encode(topic)
        try:
            self.storage.put_if_absent(path, data)
        except FileExistsError:
            return False
        except StorageError:
            # The outcome is unknown: the write may have landed. It is ours if it holds our
            # bytes (the holder field makes them unique).
            found = self.storage.read_if_exists(path)
            if found is None:
                raise
            return found == data
        return True

    def forget_topics(self, exists: Callable[[str], bool]) -> list[str]:
        """Delete the records of topics that no longer exist (``exists`` is asked after the
        listing, so a topic created meanwhile keeps its records); returns their names. A
        topic re-created later starts without a last run: its tasks are due at once, which
        is harmless."""
        gone = []
        for info in self.storage.list_dir(f"{ROOT}/topics"):
            try:
                name = validate_topic_name(info.name)
            except ValueError:
                continue  # never build a path from a name that is not a topic's
            if not exists(name):
                self.storage.delete_tree(directory(name))
                gone.append(name)
        return gone

    def _prune(self, topic: str | None, task: str, newest: int) -> None:
        """Delete a task's records older than the newest ``_KEEP``: they are never read again
        (every record repeats ``lastRun``)."""
        numbers = self.listing(topic).numbers.get(task, [])
        old = [n for n in numbers if n <= newest - _KEEP]
        if old:
            self.storage.delete([f"{directory(topic)}/{_name(task, n)}" for n in old])
