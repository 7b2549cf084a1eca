"""Vacuum: delete from storage what no reader may still need.

Per partition:

Every age is judged by the storage's clock (PROTOCOL.md 23.1): "now" is the modification time
of a probe file vacuum writes (on local disk and in memory, this machine's clock; in a dry run,
which writes nothing, too), never a time another machine wrote into a file.

1. **Removed segments** (``state.removed``, the checkpoint's ``tombstone`` entries) once
   ``file.delete.delay.ms`` (at least 10 s) has passed since the storage recorded the commit
   that removed them: until then a reader holding an older manifest version can still read
   them. After deleting them a ``vacuumed`` commit drops their entries, so checkpoints stop
   carrying them.
2. **Orphans**: files under ``segments/`` that neither the newest state nor its removed
   entries name (a writer crashed or lost an ambiguous commit after writing its segment), and
   ``.tmp-*`` files (local-disk writes cut short), once older than the orphan age. A file's
   age counts from its storage modification time (or the time in its name, when later: that
   only keeps a file longer). Writers commit a file within ``MAX_UNCOMMITTED_MS`` (5 min, by
   their monotonic clock) of starting to write it, or never; the orphan age is at least
   twice that (10 minutes; default 1 hour).
3. **Old log versions**: with K the newest checkpoint written more than the log retention ago
   (Delta's ``logRetentionDuration``, 30 days by default), every commit and checkpoint below K.
   K itself and everything after it always stay, so the newest state, and time travel back to
   K, remain possible. A writer could otherwise still build on a state older than K and take
   a deleted version's name: writers and readers reload a cached state that has not been
   confirmed as the newest for a day (``kstore.partition.STALE_STATE_S``), and vacuum refuses
   a log retention below two days.

The directory is listed *before* the newest state is read, and that state is refreshed again
just before deleting, so a file committed while vacuum runs is seen as referenced.

Per store (on the driver, one listing per topic): data directories of topic incarnations
that are no longer current (a topic deleted or re-created whose old files were not all
deleted), once the topic log has been unchanged for the orphan age.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from kstore.compaction.jobs import PartitionResult, WorkItem, name_time_ms

from kstore.config import INTENT_PROTECTION_MS, MIN_FILE_DELETE_DELAY_MS
from kstore.config import MIN_ORPHAN_AGE_MS as MIN_ORPHAN_AGE_MS
from kstore.errors import InvalidConfigurationError
from kstore.layout import TOPICS, partition_dir, topic_data_dir, topic_log_dir
from kstore.log import LAST_CHECKPOINT, Action, Log, checkpoint_file, parse_log_file_name
from kstore.names import validate_topic_name
from kstore.partition import STALE_STATE_S, PartitionState
from kstore.storage import FileInfo, Storage, unique_id
from kstore.store import Store, TopicState

OPERATION = "vacuum"
DEFAULT_ORPHAN_AGE_MS = 60 * 60_000
_PROBE = ".probe-"
DEFAULT_LOG_RETENTION_MS = 30 * 24 * 60 * 60_000
# Writers and readers reload a cached state not confirmed as the newest for STALE_STATE_S, so
# that they never build on, or poll past, log versions vacuum deleted; keep versions longer.
MIN_LOG_RETENTION_MS = int(2 * STALE_STATE_S * 1000)
_TOPIC_ID = re.compile(r"[0-9a-f]{32}")


def check_ages(orphan_age_ms: int, log_retention_ms: int) -> None:
    for name, value in (("orphan_age_ms", orphan_age_ms), ("log_retention_ms", log_retention_ms)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise InvalidConfigurationError(f"{name} must be an integer (ms), got {value!r}")
    if orphan_age_ms < MIN_ORPHAN_AGE_MS:
        raise InvalidConfigurationError(
            f"orphan_age_ms {orphan_age_ms} is below {MIN_ORPHAN_AGE_MS}: a file that young may "
            "still be committed by a producer or a maintenance job"
        )
    if log_retention_ms < MIN_LOG_RETENTION_MS:
        raise InvalidConfigurationError(
            f"log_retention_ms {log_retention_ms} is below {MIN_LOG_RETENTION_MS}: a writer or "
            "reader may still hold a state that old"
        )


def _age_reference(info: FileInfo) -> int | None:
    """When the storage recorded a file (a later time in its name only keeps it longer); None
    when the storage reports no time: such a file is never taken for an orphan."""
    if info.mtime_ms is None:
        return None
    named = name_time_ms(info.name)
    return info.mtime_ms if named is None else max(info.mtime_ms, named)


class StorageClock:
    """The storage's idea of now, read once per directory listing (PROTOCOL.md 23.1).

    On an object store a probe file is written into the directory before it is listed, and
    its modification time is now; local disk and memory share this machine's clock. A fixed
    ``now_ms`` (tests) or a dry run (which must not write) uses that instead of a probe."""

    def __init__(self, storage: Storage, directory: str, fixed_ms: int | None, *, dry_run: bool):
        self.storage = storage
        self.fixed_ms = fixed_ms
        self.probe: str | None = None
        if fixed_ms is None and storage.is_remote and not dry_run:
            self.probe = f"{_PROBE}{unique_id()}"
            storage.put(f"{directory}/{self.probe}", b"{}", durable=False)
        self.directory = directory

    def list(self) -> tuple[int, list[FileInfo]]:
        """(now, the directory's files other than the probe), and the probe deleted."""
        listing = self.storage.list_dir(self.directory)
        now = self.fixed_ms
        if self.probe is not None:
            for info in listing:
                if info.name == self.probe and info.mtime_ms is not None:
                    now = info.mtime_ms
            self.storage.delete([f"{self.directory}/{self.probe}"])
            listing = [info for info in listing if info.name != self.probe]
        return (int(time.time() * 1000) if now is None else now), listing


class RemovalState(PartitionState):
    """A partition state that also knows which version removed each removed file: the
    storage's modification time of that commit file is when the removal happened."""

    def __init__(self) -> None:
        super().__init__()
        # path -> the removing version; None: at or before the checkpoint this was loaded from
        self.removed_in: dict[str, int | None] = {}
        self._tombstones = False  # some removed_in entries are still None

    def copy(self) -> RemovalState:
        clone: RemovalState = super().copy()  # type: ignore[assignment]
        clone.removed_in = dict(self.removed_in)
        return clone

    def apply(self, name: str, body: dict[str, Any]) -> None:
        super().apply(name, body)
        if self._tombstones and self.version >= 0:
            # Past the checkpoint: its tombstones were removed at or before its version.
            self.removed_in = {
                p: self.version if v is None else v for p, v in self.removed_in.items()
            }
            self._tombstones = False
        if name == "remove":
            self.removed_in[str(body["path"])] = self.version + 1  # version is set after apply
        elif name == "tombstone":
            self.removed_in[str(body["path"])] = None
            self._tombstones = True

    def removal_version(self, path: str) -> int:
        """The version whose commit removed ``path`` (or a later one: never an earlier one)."""
        found = self.removed_in.get(path)
        return self.version if found is None else found


def _removed_at(state: RemovalState, path: str, log_files: list[FileInfo]) -> int | None:
    """When the storage recorded the commit that removed ``path`` (or a later file, which
    only keeps it longer); None when unknown (the commit landed after the listing)."""
    version = state.removal_version(path)
    times: dict[tuple[int, bool], int | None] = {}
    oldest: int | None = None
    for info in log_files:
        parsed = parse_log_file_name(info.name)
        if parsed is not None:
            times[parsed] = info.mtime_ms
            oldest = parsed[0] if oldest is None else min(oldest, parsed[0])
    for key in ((version, False), (version, True)):  # the commit, else its checkpoint
        if times.get(key) is not None:
            return times[key]
    if oldest is not None and version < oldest:
        return 0  # below every kept version: removed before the log retention, long due
    return None


def old_log_files(
    listing: list[FileInfo], now: int, log_retention_ms: int
) -> tuple[int | None, list[FileInfo]]:
    """(K, the commits and checkpoints below K): K is the newest checkpoint older than the log
    retention, as 3. above says."""
    parsed = [(p, info) for info in listing if (p := parse_log_file_name(info.name)) is not None]
    old_checkpoints = [
        v
        for (v, is_cp), info in parsed
        if is_cp and info.mtime_ms is not None and now - info.mtime_ms > log_retention_ms
    ]
    if not old_checkpoints:
        return None, []
    keep_from = max(old_checkpoints)
    return keep_from, sorted(
        (info for (v, _), info in parsed if v < keep_from), key=lambda i: i.name
    )


SPARK_PENDING = "spark/pending"  # the Spark sink's write intents (spark_ext/pending.py)


def _written_by_running_spark_jobs(storage: Any, partition_directory: str, now: int) -> set[str]:
    """Segment paths (relative to the partition) that a Spark sink task has written and its
    driver has not yet committed or cleaned up. A long micro-batch may hold its files for
    longer than the orphan age; they are not orphans while their intent is recorded (and
    younger than a week: a crashed driver's stale intents stop protecting after that).
    Read as plain JSON: the jobs must not import the Spark extension's module to read them."""
    protected: set[str] = set()
    for info in storage.list_dir(SPARK_PENDING):
        if not info.name.endswith(".json") or (
            info.mtime_ms is not None and now - info.mtime_ms > INTENT_PROTECTION_MS
        ):
            continue
        data = storage.read_if_exists(f"{SPARK_PENDING}/{info.name}")
        try:
            for item in json.loads(data) if data else []:
                directory = partition_dir(
                    str(item["topic"]), str(item["topicId"]), int(item["partition"])
                )
                if directory == partition_directory:
                    protected.add(str(item["path"]))
        except (ValueError, KeyError, TypeError):
            continue  # malformed: protects nothing (vacuum errs on the side of keeping files)
    return protected


def vacuum_partition(store: Store, item: WorkItem, options: dict[str, Any]) -> PartitionResult:
    """The vacuum job's per-partition function (runs on an executor)."""
    part = item.open(store)
    storage = part.storage
    orphan_age = int(options["orphan_age_ms"])
    check_ages(orphan_age, int(options["log_retention_ms"]))
    segments_dir, log_dir = f"{part.directory}/segments", f"{part.directory}/_log"
    fixed = options.get("now_ms")
    clock = StorageClock(
        storage,
        segments_dir,
        None if fixed is None else int(fixed),
        dry_run=bool(options.get("dry_run")),
    )
    # List first, then read the state: a file committed meanwhile is then seen as live.
    now, segment_files = clock.list()
    log_files = storage.list_dir(log_dir)
    removals: Log[RemovalState] = Log(
        storage, log_dir, RemovalState, checkpoint_interval=part.log.checkpoint_interval
    )
    state = removals.load()
    result = PartitionResult.starting(item, OPERATION, state)
    if state.version < 0 and not segment_files and not log_files:
        result.reason = "no data"
        return result
    # A smaller value stored before the floor existed is read as the floor (PROTOCOL.md 17.1).
    delay = max(int(item.config["file.delete.delay.ms"]), MIN_FILE_DELETE_DELAY_MS)
    by_name = {f.name: f for f in segment_files}
    doomed: dict[str, int] = {}  # path relative to the partition directory -> size
    expired = sorted(
        p
        for p in state.removed
        if (at := _removed_at(state, p, log_files)) is not None and now - at >= delay
    )
    for path in expired:
        info = by_name.get(path.removeprefix("segments/"))
        if info is not None:
            doomed[path] = info.size
    live = {s.path for s in state.segments}
    intended = _written_by_running_spark_jobs(storage, part.directory, now)
    for info in segment_files:
        path = f"segments/{info.name}"
        if (
            path in live
            or path in state.removed
            or path in intended
            or info.name in ("", ".", "..")
        ):
            continue
        written = _age_reference(info)
        if written is not None and now - written > orphan_age:
            doomed[path] = info.size
    for info in log_files:
        written = info.mtime_ms
        if info.name.startswith(".tmp-") and written is not None and now - written > orphan_age:
            doomed[f"_log/{info.name}"] = info.size
    keep_from, old = old_log_files(log_files, now, int(options["log_retention_ms"]))
    for info in old:
        doomed[f"_log/{info.name}"] = info.size
    # Refresh: anything a commit made live since is not ours to delete.
    newest = removals.update(state)
    for seg in newest.segments:
        doomed.pop(seg.path, None)
    for path in set(newest.removed) - set(expired):
        doomed.pop(path, None)
    result.files = [f"{part.directory}/{p}" for p in sorted(doomed)]
    result.files_deleted = len(doomed)
    result.bytes_deleted = sum(doomed.values())
    if not doomed and not expired:
        result.reason = "nothing to delete"
        return result
    if options.get("dry_run"):
        result.outcome = "dry-run"
        result.reason = f"would delete {len(doomed)} file(s)"
        return result
    if keep_from is not None:
        _point_hint_at(storage, log_dir, keep_from)
    storage.delete(result.files)
    result.outcome = "committed"
    result.reason = f"deleted {len(doomed)} file(s)"
    if expired:
        forget = set(expired)

        def build(s: PartitionState) -> list[Action] | None:
            paths = sorted(forget & set(s.removed))
            return [{"vacuumed": {"paths": paths}}] if paths else None

        if part.commit_actions(build, operation="VACUUM") is not None:
            result.commits = 1
    return result


def _point_hint_at(storage: Storage, log_dir: str, keep_from: int) -> None:
    """Make ``_last_checkpoint`` name a checkpoint that stays, if it names one about to go, so
    that readers do not have to list the log to find one."""
    raw = storage.read_if_exists(f"{log_dir}/{LAST_CHECKPOINT}")
    try:
        version = json.loads(raw)["version"] if raw is not None else None
    except (ValueError, KeyError, TypeError):
        version = None
    if isinstance(version, int) and version >= keep_from:
        return
    if storage.exists(f"{log_dir}/{checkpoint_file(keep_from)}"):
        storage.put(f"{log_dir}/{LAST_CHECKPOINT}", json.dumps({"version": keep_from}).encode())


def stale_incarnations(
    store: Store,
    topics: list[str] | None,
    now_ms: int | None,
    orphan_age_ms: int,
    *,
    dry_run: bool = False,
) -> list[str]:
    """Data directories of topic incarnations other than the current one, under topics whose
    log has not changed for ``orphan_age_ms`` (so no writer can still be using them), judged by
    the storage's clock (``now_ms`` fixes it: tests)."""
    storage = store.storage
    if topics:
        names = list(topics)
    else:
        names = []
        for info in storage.list_dir(TOPICS):
            try:
                names.append(validate_topic_name(info.name))
            except ValueError:
                continue  # not a topic directory: never build a path from it
    stale: list[str] = []
    for name in names:
        # First the listing, then the newest topic state.
        now, entries = StorageClock(storage, f"{TOPICS}/{name}", now_ms, dry_run=dry_run).list()
        state = Log(storage, topic_log_dir(name), TopicState, checkpoint_interval=20).load()
        if state.version < 0:
            continue  # no topic log: not ours to judge
        # When the storage recorded the topic log's newest file (its last change).
        changed = [i.mtime_ms for i in storage.list_dir(topic_log_dir(name))]
        if not changed or None in changed or now - max(t for t in changed if t) < orphan_age_ms:
            continue
        current = None if state.deleted or state.metadata is None else state.metadata.get("id")
        for entry in entries:
            if _TOPIC_ID.fullmatch(entry.name) and entry.name != current:
                stale.append(topic_data_dir(name, entry.name))
    return sorted(stale)
