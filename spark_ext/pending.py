"""Write intents: which segment files each Spark task writes, recorded in the store.

A task reports its files in its commit message, but Spark drops the message of a task that is
killed after it wrote them (its stage was cancelled because another task failed, or its query
was stopped), and a driver that crashes loses every message of the micro-batch it was
committing. So each task also records its files here, as
``spark/pending/<job>.<task marker>.json``: before each segment write it records every file it
has written and the one it is about to write, under a name chosen beforehand. A worker killed
at any point after a write thus leaves a file its intent names; an intent may also name a file
that was never written (deleting it is a no-op). The driver's commit or abort deletes every
recorded file that no manifest references, then the records. A streaming job is named by (app
id, batch id), so the replay of a micro-batch also cleans up after the attempt that crashed or
was aborted; a streaming abort therefore keeps the records, for a cancelled task that records
and writes a file after the abort's cleanup (Spark does not wait for it). An aborted batch job keeps a flag, so that a cancelled task still writing when the
driver cleaned up removes its own files. These files are a writer's private bookkeeping:
readers never look at them, and losing them costs at most leftover files (vacuum's orphan
scan removes those).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Protocol

from kstore.errors import InvalidArgumentError
from kstore.layout import partition_dir
from kstore.store import Store

log = logging.getLogger(__name__)

PENDING = "spark/pending"
MAX_MARKER_BYTES = 16 * 1024 * 1024  # a limit on everything


class FileLike(Protocol):
    @property
    def topic(self) -> str: ...

    @property
    def topic_id(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def path(self) -> str: ...


@dataclass(frozen=True)
class FileRef:
    """A segment file as a write intent names it."""

    topic: str
    topic_id: str
    partition: int
    path: str

    def storage_path(self) -> str:
        return f"{partition_dir(self.topic, self.topic_id, self.partition)}/{self.path}"


def stream_job(app_id: str, batch_id: int) -> str:
    # Hashed: an app id may be any string, and no string reaches a path unchecked.
    digest = hashlib.sha256(app_id.encode()).hexdigest()[:32]
    return f"stream-{digest}-{batch_id:020d}"


def batch_job(job_id: str) -> str:
    if not job_id.isalnum():
        raise InvalidArgumentError(f"illegal job id {job_id!r}")
    return f"job-{job_id}"


# One flat directory that is never deleted: a worker process caches the directories it has
# created, so deleting one under it (another process cleaning up) would break its next write.
def _name(job: str, marker: str) -> str:
    return f"{PENDING}/{job}.{marker}.json"


def _markers(store: Store, job: str) -> list[tuple[str, int]]:
    """(marker, size) of the job's write intents."""
    prefix = f"{job}."
    out = []
    for info in store.storage.list_dir(PENDING):
        name = info.name
        if name.startswith(prefix) and name.endswith(".json"):
            out.append((name[len(prefix) : -len(".json")], info.size))
    return out


def record(store: Store, job: str, marker: str, files: list[FileLike]) -> None:
    """Record (replacing the task's earlier record) the files a task attempt wrote and the one
    it is about to write."""
    body = [
        {"topic": f.topic, "topicId": f.topic_id, "partition": f.partition, "path": f.path}
        for f in files
    ]
    store.storage.put(_name(job, marker), json.dumps(body).encode(), durable=True)


def recorded(store: Store, job: str, *, skip: set[str] | None = None) -> list[FileRef]:
    """The files recorded for ``job``, except in the markers named in ``skip``."""
    out: list[FileRef] = []
    for marker, size in _markers(store, job):
        if skip is not None and marker in skip:
            continue
        if size > MAX_MARKER_BYTES:
            log.warning("kstore sink: ignoring oversized write intent %s.%s", job, marker)
            continue
        data = store.storage.read_if_exists(_name(job, marker))
        if data is None:
            continue
        try:
            for item in json.loads(data):
                ref = FileRef(
                    str(item["topic"]),
                    str(item["topicId"]),
                    int(item["partition"]),
                    str(item["path"]),
                )
                if ref.path.startswith("segments/") and ".." not in ref.path:
                    out.append(ref)
        except (ValueError, KeyError, TypeError):
            log.warning("kstore sink: ignoring malformed write intent %s.%s", job, marker)
    return out


ABORTED = "aborted"
ABORTED_FLAG_TTL_MS = 24 * 3600 * 1000  # far longer than any cancelled task keeps running


def mark_aborted(store: Store, job: str) -> None:
    """Flag a batch job as aborted: a task that finishes writing after the driver's cleanup
    (Spark does not wait for cancelled tasks) sees the flag and deletes its own files."""
    store.storage.put(f"{PENDING}/{job}.{ABORTED}", b"aborted\n", durable=True)


def is_aborted(store: Store, job: str) -> bool:
    return store.storage.exists(f"{PENDING}/{job}.{ABORTED}")


def forget(store: Store, job: str, marker: str) -> None:
    store.storage.delete([_name(job, marker)])


def clear(store: Store, job: str) -> None:
    """Delete the job's write intents (an aborted flag stays), and aborted flags of old jobs."""
    try:
        names = [_name(job, marker) for marker, _ in _markers(store, job)]
        now = int(time.time() * 1000)
        for info in store.storage.list_dir(PENDING):
            if (
                info.name.endswith(f".{ABORTED}")
                and info.mtime_ms is not None
                and now - info.mtime_ms > ABORTED_FLAG_TTL_MS
            ):
                names.append(f"{PENDING}/{info.name}")
        store.storage.delete(names)
    except Exception:  # bookkeeping only: leftovers cost space, never correctness
        log.warning("kstore sink: could not remove write intents of %s", job, exc_info=True)
