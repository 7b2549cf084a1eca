"""Vacuum: delete from storage what no reader may still need.

Per partition:

1. **Removed segments** (``state.removed``, the checkpoint's ``tombstone`` entries) once
   ``file.delete.delay.ms`` has passed since their ``remove``: until then a reader holding an
   older manifest version can still read them. After deleting them a ``vacuumed`` commit drops
   their entries, so checkpoints stop carrying them.
2. **Orphans**: files under ``segments/`` that neither the newest state nor its removed
   entries name (a writer crashed or lost an ambiguous commit after writing its segment), and
   ``.tmp-*`` files (local-disk writes cut short), once older than the orphan age. A file's
   age counts from the later of the time in its name and its storage modification time. The
   orphan age must exceed the longest time any writer holds a written file before committing
   it: a producer's ``delivery_timeout_ms`` (120 s by default) and a maintenance job's
   ``MAX_UNCOMMITTED_MS`` (5 min; a job abandons a commit whose new files are older). The
   default, 1 hour, leaves room for clock skew between machines; less than 10 minutes is
   refused.
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
from typing import Any

from kstore.compaction.jobs import PartitionResult, WorkItem, name_time_ms, now_ms

from kstore.errors import InvalidConfigurationError
from kstore.layout import TOPICS, partition_dir, topic_data_dir, topic_log_dir
from kstore.log import LAST_CHECKPOINT, Action, Log, checkpoint_file, parse_log_file_name
from kstore.names import validate_topic_name
from kstore.partition import STALE_STATE_S, PartitionState
from kstore.storage import FileInfo, Storage
from kstore.store import Store, TopicState

OPERATION = "vacuum"
DEFAULT_ORPHAN_AGE_MS = 60 * 60_000
MIN_ORPHAN_AGE_MS = 10 * 60_000
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
    """When a file was written, as late as we can tell; None when unknown."""
    times = [t for t in (name_time_ms(info.name), info.mtime_ms) if t is not None]
    return max(times) if times else None


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
INTENT_PROTECTION_MS = 7 * 24 * 3600 * 1000


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
    now = now_ms(options)
    orphan_age = int(options["orphan_age_ms"])
    check_ages(orphan_age, int(options["log_retention_ms"]))
    segments_dir, log_dir = f"{part.directory}/segments", f"{part.directory}/_log"
    # List first, then read the state: a file committed meanwhile is then seen as live.
    segment_files = storage.list_dir(segments_dir)
    log_files = storage.list_dir(log_dir)
    state = part.state()
    result = PartitionResult.starting(item, OPERATION, state)
    if state.version < 0 and not segment_files and not log_files:
        result.reason = "no data"
        return result
    delay = int(item.config["file.delete.delay.ms"])
    by_name = {f.name: f for f in segment_files}
    doomed: dict[str, int] = {}  # path relative to the partition directory -> size
    expired = sorted(p for p, removed_ms in state.removed.items() if now - removed_ms >= delay)
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
    newest = part.state()
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
    store: Store, topics: list[str] | None, now: int, orphan_age_ms: int
) -> list[str]:
    """Data directories of topic incarnations other than the current one, under topics whose
    log has not changed for ``orphan_age_ms`` (so no writer can still be using them)."""
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
        entries = storage.list_dir(f"{TOPICS}/{name}")  # first, then the newest topic state
        state = Log(storage, topic_log_dir(name), TopicState, checkpoint_interval=20).load()
        if state.version < 0 or state.last_commit_ms is None:
            continue  # no topic log: not ours to judge
        if now - state.last_commit_ms < orphan_age_ms:
            continue
        current = None if state.deleted or state.metadata is None else state.metadata.get("id")
        for entry in entries:
            if _TOPIC_ID.fullmatch(entry.name) and entry.name != current:
                stale.append(topic_data_dir(name, entry.name))
    return sorted(stale)
