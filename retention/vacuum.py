"""Vacuum: delete from storage what no reader may still need.

The rules, stated for one partition (a layout-3 topic incarnation applies them to all its
partitions at once, below; a layout-2 topic is refused until ``kstore topics upgrade``):

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
   (Delta's ``logRetentionDuration``; 2 days by default, the least allowed), every commit and
   checkpoint below K.
   K itself and everything after it always stay, so the newest state, and time travel back to
   K, remain possible. A writer could otherwise still build on a state older than K and take
   a deleted version's name: writers and readers reload a cached state that has not been
   confirmed as the newest for a day (``kstore.partition.STALE_STATE_S``), and vacuum refuses
   a log retention below two days.

The directories are listed *before* the newest state is read, and that state is refreshed
again just before deleting, so a file committed while vacuum runs is seen as referenced.

**How much of ``_log/`` is listed** (:class:`LogScan`; PROTOCOL.md 22.5). Not the whole
directory, which holds every version of the log retention (2 days at 20 commits/s: 3.5 million
files; 52 million with 30 days): the listing goes in name order (version order: names are 20-digit versions) from the
log's start, a page (one S3 LIST) at a time, and stops after the first page that shows a
commit the storage recorded within the log retention. Earlier runs deleted everything below
their K, so the files this run may delete, and K, are in that listing; so are the ``.tmp-*``
files, which sort before every version, and vacuum's clock probe (``.probe-*``, layout 3).
A commit is written only after the one before it landed, and a checkpoint after the commit of
its version, so no checkpoint past the stop is older than the log retention; if the storage's
times were out of order, K would be an older checkpoint (more kept), never a newer one.
The times of the commits that removed files still pending (1.) come from that listing when it
reached them, else from a HEAD of each such commit file (its checkpoint's when the commit is
gone), or from one listing from the oldest of them past the newest when that costs fewer
requests (a LIST is priced as ten HEADs); a version below the log's first file is long due.
So a run lists about (files it deletes + 1) / 1000 pages, however long the log is. Local disk
and memory, which are not billed per request, hand out their sorted listing the same way.

Per topic incarnation of layout 3 (PROTOCOL.md 22.5), in partition 0's task: the partitions
share topic logs, data objects (``_data/``) and checkpoint sidecars (``_sidecars/``), so they
are judged together. The steps are the ones above, with every partition of every topic log:

- a data object goes only when no partition has it live and every partition that removed it
  did so ``file.delete.delay.ms`` ago; then one ``vacuumed`` commit per topic log forgets it
  in each partition that recorded it;
- an object no partition names, live or removed, is an orphan (the orphan age);
- a sidecar no kept checkpoint (at or above K) names goes once older than the log retention;
  the kept checkpoints are read only when such an old sidecar exists;
- old versions of each topic log go as 3. says, each topic log's start listed as above (the
  removal times of its partitions' removed files, as above, from its commit files). Only when
  a sidecar older than the log retention exists is the rest of each topic log listed, to find
  the kept checkpoints (reading them all costs more than that listing). On a topic whose
  partitions keep changing that is most runs: K's own sidecars are that old.

Per store (on the driver, one listing per topic): data directories of deleted topic
incarnations once their ``file.delete.delay.ms`` has passed (``purge.py``), and of other
incarnations that are not current (left by a crashed creation, or by a deletion in an older
format), once the topic log has been unchanged for the orphan age.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from kstore.compaction.jobs import PartitionResult, WorkItem, name_time_ms
from kstore.lakehouse import referenced_paths

from kstore.config import INTENT_PROTECTION_MS, MIN_FILE_DELETE_DELAY_MS
from kstore.config import MIN_ORPHAN_AGE_MS as MIN_ORPHAN_AGE_MS
from kstore.errors import InvalidConfigurationError, KStoreError, UnknownTopicOrPartitionError
from kstore.layout import TOPICS, partition_dir, topic_data_dir, topic_log_dir
from kstore.log import (
    LAST_CHECKPOINT,
    Action,
    Log,
    checkpoint_file,
    decode_commit,
    parse_log_file_name,
    version_file,
    without_carried_data,
)
from kstore.manifest import DATA_PREFIX, in_incarnation, is_carried_path, segment_location
from kstore.names import validate_topic_name
from kstore.partition import STALE_STATE_S, PartitionState
from kstore.pending import pending_dir
from kstore.storage import LIST_PAGE_SIZE, FileInfo, Storage, unique_id
from kstore.store import DELETED_WRITER_VERSION, Store, TopicMetadata, TopicState, require_layout3
from kstore.topic_log import (
    HORIZON_VERSION,
    SIDECAR_HORIZON,
    SIDECARS,
    TopicLogFiles,
    TopicLogState,
    sidecar_name,
)

OPERATION = "vacuum"
DEFAULT_ORPHAN_AGE_MS = 60 * 60_000
_PROBE = ".probe-"
# Writers and readers reload a cached state not confirmed as the newest for STALE_STATE_S, so
# that they never build on, or poll past, log versions vacuum deleted; keep versions longer.
MIN_LOG_RETENTION_MS = int(2 * STALE_STATE_S * 1000)
# Old log versions are history no reader needs (PROTOCOL.md 17.5): kept the minimum by
# default. In a topic log at 5/6 a longer retention keeps each commit's data as long, or costs
# a PUT per commit to remove it (22.5 step 4).
DEFAULT_LOG_RETENTION_MS = MIN_LOG_RETENTION_MS
_TOPIC_ID = re.compile(r"[0-9a-f]{32}")
# Names per page when vacuum and log pruning list a log from its start (PROTOCOL.md 22.5):
# S3's largest page, one LIST request each.
LOG_PAGE_SIZE = LIST_PAGE_SIZE
# A LIST request is priced as about ten GETs or HEADs (AWS S3: $0.005 against $0.0004 per
# 1,000): removal times are looked up by HEADs unless a listing would cost less.
HEADS_PER_LIST = 10
_LISTING_THREADS = 16
# A data object's name carries the time its writer started it (PROTOCOL.md 5).
_DATA_NAME_TIME = re.compile(r"^(\d{13})-[0-9a-f]{32}\.kdat$")


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
    if named is None and (match := _DATA_NAME_TIME.match(info.name)) is not None:
        named = int(match.group(1))
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

    def scan(self, log: LogScan, log_retention_ms: int) -> int:
        """now, read while listing the start of the log in this clock's directory: the probe
        sorts before every version, so it is seen before any version is judged."""
        now = self.fixed_ms
        if now is None and self.probe is None:
            now = int(time.time() * 1000)
        found = log.scan(now, log_retention_ms, self.probe)
        return int(time.time() * 1000) if found is None else found


class VersionTimes:
    """When the storage recorded each version of a log, from a listing of its directory that
    starts at the log's first file (and, possibly, from further files of the log)."""

    def __init__(self, log_files: list[FileInfo]) -> None:
        self.times: dict[tuple[int, bool], int | None] = {}
        self.oldest: int | None = None
        self.add(log_files)

    def add(self, log_files: list[FileInfo]) -> None:
        """Learn the times of more files of the log. The oldest version stays the one of the
        first listing: ``log_files`` must not name versions below it that it lacks."""
        for info in log_files:
            parsed = parse_log_file_name(info.name)
            if parsed is not None:
                self.times[parsed] = info.mtime_ms
                self.oldest = parsed[0] if self.oldest is None else min(self.oldest, parsed[0])

    def known(self, version: int) -> bool:
        """Whether :meth:`at` can answer for ``version`` as the whole listing would: its commit
        file is known, or it lies below the log's first file."""
        return (version, False) in self.times or (self.oldest is not None and version < self.oldest)

    def at(self, version: int) -> int | None:
        """The storage time of ``version``'s commit (else its checkpoint: a later file, which
        only keeps things longer); None when unknown (it landed after the listing)."""
        for key in ((version, False), (version, True)):
            if self.times.get(key) is not None:
                return self.times[key]
        if self.oldest is not None and version < self.oldest:
            return 0  # below every kept version: removed before the log retention, long due
        return None


def old_log_files(
    listing: list[FileInfo], now: int, log_retention_ms: int
) -> tuple[int | None, list[FileInfo]]:
    """(K, the commits and checkpoints below K): K is the newest checkpoint older than the log
    retention, as 3. above says. ``listing`` may be the start of the log only (a
    :class:`LogScan`): K is then the newest such checkpoint in it, never a later one."""
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


class LogScan:
    """The start of a log directory, listed in name order (PROTOCOL.md 22.5).

    Log file names are 20-digit versions, so name order is version order, and ``.tmp-*``
    leftovers and the clock's ``.probe-*`` sort before every version (``.`` before digits);
    ``_last_checkpoint`` sorts after them. Earlier runs deleted everything below their K, so
    what this run may delete lies at the log's start: the listing goes on, a page at a time,
    until a page shows a commit the storage recorded within the log retention (or one without
    a time), and stops there. A commit is written only after the one before it landed, so a
    later commit is not recorded earlier; a checkpoint of a version is written after its
    commit. So no checkpoint past that commit is older than the log retention, and
    :func:`old_log_files` of the scan finds the K the whole listing would. Where storage
    times are not in version order, a checkpoint past the stop can be missed: K is then an
    older checkpoint, and more is kept, never less."""

    def __init__(self, storage: Storage, directory: str) -> None:
        self.storage = storage
        self.directory = directory
        self.files: list[FileInfo] = []  # in name order
        self.complete = False  # the listing reached the directory's end
        self.requests = 0  # pages listed

    def scan(self, now: int | None, log_retention_ms: int, probe: str | None = None) -> int | None:
        """List from the start until past the log retention; returns the probe's time when
        ``probe`` (a file of this directory, deleted here) is seen, else ``now``."""
        own = self.directory.rsplit("/", 1)[-1]
        pages = self.storage.list_pages(self.directory, page_size=LOG_PAGE_SIZE)
        for page in pages:
            self.requests += 1
            stop = False
            for info in page:
                if info.name == own and info.size == 0:
                    continue  # a directory marker (see _files)
                if probe is not None and info.name == probe:
                    if info.mtime_ms is not None:
                        now = info.mtime_ms
                    continue
                if now is None and parse_log_file_name(info.name) is not None:
                    # The probe sorts before every version: not listed, so this machine's
                    # clock stands in, as StorageClock.list does.
                    now = int(time.time() * 1000)
                self.files.append(info)
                parsed = parse_log_file_name(info.name)
                if (
                    parsed is not None
                    and not parsed[1]
                    and (
                        info.mtime_ms is None
                        or now is None
                        or now - info.mtime_ms <= log_retention_ms
                    )
                ):
                    stop = True
            if stop:
                pages.close()
                break
        else:
            self.complete = True
        if probe is not None:
            self.storage.delete([f"{self.directory}/{probe}"])
        return now

    def whole(self) -> list[FileInfo]:
        """Every file of the directory: the rest is listed once, after the scanned start."""
        if not self.complete:
            own = self.directory.rsplit("/", 1)[-1]
            after = self.files[-1].name if self.files else ""
            for page in self.storage.list_pages(
                self.directory, start_after=after, page_size=LOG_PAGE_SIZE
            ):
                self.requests += 1
                self.files.extend(i for i in page if not (i.name == own and i.size == 0))
            self.complete = True
        return self.files

    def extend_to_checkpoint_above(self, version: int) -> None:
        """List on, a page at a time, until a checkpoint above ``version`` is listed or the
        directory ends."""

        def above(infos: list[FileInfo]) -> bool:
            return any(
                parsed[1] and parsed[0] > version
                for info in infos
                if (parsed := parse_log_file_name(info.name)) is not None
            )

        if self.complete or above(self.files):
            return
        own = self.directory.rsplit("/", 1)[-1]
        after = self.files[-1].name if self.files else ""
        pages = self.storage.list_pages(self.directory, start_after=after, page_size=LOG_PAGE_SIZE)
        for page in pages:
            self.requests += 1
            self.files.extend(i for i in page if not (i.name == own and i.size == 0))
            if above(page):
                pages.close()
                return
        self.complete = True

    def temporary(self) -> list[FileInfo]:
        """The ``.tmp-*`` files: all of them, as they sort before the first version."""
        return [info for info in self.files if info.name.startswith(".tmp-")]

    def removal_times(self, versions: set[int], checkpoint_interval: int) -> VersionTimes:
        """The storage times of ``versions`` (those that removed files still pending), from
        the scan, else from the storage: per version a HEAD of its commit file (its
        checkpoint's if the commit is gone), or, when that would cost more, one listing that
        starts at the oldest of them and stops past the newest. A version below the log's
        first file counts as long due (:meth:`VersionTimes.at`)."""
        times = VersionTimes(self.files)
        if self.complete:
            return times
        missing = sorted(v for v in versions if not times.known(v))
        if not missing:
            return times
        span = missing[-1] - missing[0] + 1
        pages = -(
            -span * (checkpoint_interval + 1) // (max(checkpoint_interval, 1) * LOG_PAGE_SIZE)
        )
        if len(missing) > HEADS_PER_LIST * pages:
            after = version_file(missing[0] - 1) if missing[0] > 0 else ""
            for page in self.storage.list_pages(
                self.directory, start_after=after, page_size=LOG_PAGE_SIZE
            ):
                self.requests += 1
                times.add(page)
                last = parse_log_file_name(page[-1].name)
                if last is None or last[0] > missing[-1]:
                    break
            return times
        commits = [f"{self.directory}/{version_file(v)}" for v in missing]
        found = self.storage.stat_many(commits)
        times.add(list(found.values()))
        gone = [v for v in missing if (v, False) not in times.times]
        if gone:
            found = self.storage.stat_many([f"{self.directory}/{checkpoint_file(v)}" for v in gone])
            times.add(list(found.values()))
        return times


SPARK_PENDING = "spark/pending"  # the Spark sink's write intents (spark_ext/pending.py)


def _spark_intents(storage: Any, now: int) -> set[tuple[str, str]]:
    """(partition directory, path as the intent names it) of every write intent that still
    protects its file. A long micro-batch may hold its files for longer than the orphan age;
    they are not orphans while their intent is recorded (and younger than a week: a crashed
    driver's stale intents stop protecting after that). Read as plain JSON: the jobs must not
    import the Spark extension's module to read them."""
    protected: set[tuple[str, str]] = set()
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
                protected.add((directory, str(item["path"])))
        except (ValueError, KeyError, TypeError):
            continue  # malformed: protects nothing (vacuum errs on the side of keeping files)
    return protected


def vacuum_partition(store: Store, item: WorkItem, options: dict[str, Any]) -> PartitionResult:
    """The vacuum job's per-partition function (runs on an executor). The partitions of a
    topic share its topic logs and data objects: partition 0's task vacuums the whole
    incarnation, the other partitions' tasks have nothing to do. A layout-2 topic is refused
    (``kstore topics upgrade`` moves it to layout 3)."""
    try:
        meta: TopicMetadata | None = store.topic(item.topic)
    except UnknownTopicOrPartitionError:
        meta = None
    if meta is None or meta.topic_id != item.topic_id:
        return PartitionResult(
            item.topic,
            item.partition,
            OPERATION,
            reason="deleted or re-created since planned: left to the stale-incarnation sweep",
        )
    require_layout3(meta, "vacuum")
    if item.partition != 0:
        return PartitionResult(
            item.topic, item.partition, OPERATION, reason="vacuumed with partition 0"
        )
    return vacuum_incarnation(store, item, meta, options)


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


def topic_directory_names(storage: Storage) -> list[str]:
    """The names under ``topics/`` (existing and deleted topics alike) that are topic names."""
    names = []
    for info in storage.list_dir(TOPICS):
        try:
            names.append(validate_topic_name(info.name))
        except ValueError:
            continue  # not a topic directory: never build a path from it
    return names


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
    names = list(topics) if topics else topic_directory_names(storage)
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
            # A deleted incarnation waits for its file.delete.delay.ms (purge.py), not this.
            if (
                _TOPIC_ID.fullmatch(entry.name)
                and entry.name != current
                and entry.name not in state.deletions
            ):
                stale.append(topic_data_dir(name, entry.name))
    return sorted(stale)


# -- layout 3: a topic incarnation's topic logs, data objects and sidecars -----------------------


class TopicRemovalState(TopicLogState):
    """A topic log state that also knows which version removed each partition's removed
    files: the storage's modification time of that commit file is when the removal happened."""

    def __init__(self) -> None:
        super().__init__()
        # (partition, path) -> the removing version; None: at or before the checkpoint (or the
        # upgrade's version 0) that carried it as a tombstone, set when that version is stamped
        self.removed_in: dict[tuple[int, str], int | None] = {}
        self._tombstones = False

    def copy(self) -> TopicRemovalState:
        clone: TopicRemovalState = super().copy()  # type: ignore[assignment]
        clone.removed_in = dict(self.removed_in)
        return clone

    def apply(self, name: str, body: dict[str, Any]) -> None:
        super().apply(name, body)
        partition = body.get("partition")
        if type(partition) is not int:
            return
        if name == "remove" and self.version >= 0:
            self.removed_in[(partition, str(body["path"]))] = self.version + 1
        elif name in ("remove", "tombstone"):
            # A checkpoint's: a tombstone, or a ``remove`` a delta carries (13.4), whose commit
            # the delta does not say. Counted from the checkpoint's version (set by stamp), the
            # latest it can be: a removal is never taken for older than it is.
            self.removed_in[(partition, str(body["path"]))] = None
            self._tombstones = True

    def stamp(self, version: int) -> None:
        super().stamp(version)
        if self._tombstones:
            self.removed_in = {
                key: version if v is None else v for key, v in self.removed_in.items()
            }
            self._tombstones = False

    def removal_version(self, partition: int, path: str) -> int:
        """The version whose commit removed ``path`` from ``partition`` (or a later one)."""
        found = self.removed_in.get((partition, path))
        return self.version if found is None else found


def _retained_sidecars(
    storage: Storage, log_dir: str, listing: list[FileInfo], keep_from: int | None
) -> set[str] | None:
    """The sidecar paths (``_sidecars/...``) that the checkpoints vacuum keeps (those at or
    above ``keep_from``; all when None) name; None when one of them cannot be read (then no
    sidecar of the incarnation can be judged unreferenced)."""
    versions = [
        parsed[0]
        for info in listing
        if (parsed := parse_log_file_name(info.name)) is not None
        and parsed[1]
        and (keep_from is None or parsed[0] >= keep_from)
    ]
    tops = _checkpoint_tops(storage, log_dir, versions)
    if tops is None:
        return None
    return {path for _, named in tops.values() for path in named}


def _checkpoint_tops(
    storage: Storage, log_dir: str, versions: list[int]
) -> dict[int, tuple[int, set[str]]] | None:
    """Of each checkpoint of ``versions`` that exists: its ``minWriterVersion`` and the sidecar
    paths it names; None when one of them cannot be read."""
    paths = {v: f"{log_dir}/{checkpoint_file(v)}" for v in versions}
    found = storage.read_many(list(paths.values()))
    out: dict[int, tuple[int, set[str]]] = {}
    for version, path in paths.items():
        data = found.get(path)
        if data is None:
            continue  # deleted since the listing: a newer checkpoint exists, and is read
        writer, named = 1, set()
        try:
            _, actions = decode_commit(data, path)
            for name, body in actions:
                if name == "sidecar":
                    named.add(str(body["path"]))
                elif name == "protocol":
                    writer = int(body.get("minWriterVersion", 1))
        except (KStoreError, KeyError, TypeError, ValueError):
            return None
        out[version] = (writer, named)
    return out


def _unnamed_sidecars(
    storage: Storage,
    sidecar_dir: str,
    log_dirs: list[str],
    scans: list[LogScan],
    keep_from: list[int | None],
    partitions: int,
    old: Callable[[FileInfo], bool],
) -> dict[str, int]:
    """The sidecars of an incarnation that no checkpoint vacuum keeps names and that are older
    than the log retention (``old``): path relative to the store root -> size.

    When the oldest checkpoint each topic log keeps (K, or its first when it keeps all) is of
    writer version 5, a kept checkpoint names no sidecar written more than SIDECAR_HORIZON
    versions before it (PROTOCOL.md 13.4). Then only the sidecars written before that oldest
    checkpoint can go, and they are found by their names: each partition's names sort together
    by version (5.8), so each is listed from its first up to that checkpoint's version (about
    one LIST per partition). Those written more than the horizon before it are named by no kept
    checkpoint; the others are checked against the kept checkpoints up to the horizon past it
    (a listing of that window of the log, and a read of each checkpoint in it). Otherwise (a log
    raised from version 4 within the log retention) the whole of each topic log is listed to
    find every kept checkpoint, and each is read."""
    oldest: list[int | None] = [
        kept if kept is not None else _first_checkpoint(scan.files)
        for kept, scan in zip(keep_from, scans, strict=True)
    ]
    tops: list[tuple[int, set[str]] | None] = []
    for log_dir, version in zip(log_dirs, oldest, strict=True):
        read = None if version is None else _checkpoint_tops(storage, log_dir, [version])
        tops.append(None if read is None or version not in read else read[version])
    # (A deleted incarnation's logs are at a writer version no writer has: one deleted by a
    # writer of version 4 took no horizon into account.)
    if all(top is not None and HORIZON_VERSION <= top[0] < DELETED_WRITER_VERSION for top in tops):
        first = [cast(int, v) for v in oldest]
        named = {path for top in tops if top is not None for path in top[1]}
        logs = len(log_dirs)
        # Candidates by topic log: (file, the version in its name).
        found: dict[int, dict[str, tuple[FileInfo, int]]] = {}
        bounds = {p: first[p % logs] for p in range(partitions)}
        for info, partition, version in _sidecars_below(storage, sidecar_dir, bounds):
            path = f"{SIDECARS}/{info.name}"
            if old(info) and path not in named:
                found.setdefault(partition % logs, {})[path] = (info, version)
        for k, in_log in found.items():
            horizon = first[k] - SIDECAR_HORIZON
            if all(version < horizon for _, version in in_log.values()):
                continue  # all past the horizon: named by no kept checkpoint
            # Within it: gone unless a kept checkpoint of the window names it (when the window
            # cannot be read, none of them goes).
            window = _named_in_window(storage, log_dirs[k], first[k], first[k] + SIDECAR_HORIZON)
            for path, (_, version) in list(in_log.items()):
                if version >= horizon and (window is None or path in window):
                    del in_log[path]
        return {
            f"{sidecar_dir}/{info.name}": info.size
            for in_log in found.values()
            for info, _ in in_log.values()
        }
    candidates = [
        info
        for info in _files(storage, sidecar_dir)
        if info.name not in ("", ".", "..") and old(info)
    ]
    if not candidates:
        return {}
    retained: set[str] | None = set()
    # The checkpoints at or above K: the rest of each topic log is listed (reading them all
    # costs more than that listing).
    for log_dir, scan, kept in zip(log_dirs, scans, keep_from, strict=True):
        named_here = _retained_sidecars(storage, log_dir, scan.whole(), kept)
        retained = None if named_here is None or retained is None else retained | named_here
    if retained is None:
        return {}
    return {
        f"{sidecar_dir}/{info.name}": info.size
        for info in candidates
        if f"{SIDECARS}/{info.name}" not in retained
    }


def _named_in_window(storage: Storage, log_dir: str, first: int, end: int) -> set[str] | None:
    """The sidecar paths the checkpoints of versions ``first`` to ``end - 1`` name, listed from
    ``first`` on (name order is version order); None when one cannot be read."""
    versions: list[int] = []
    for page in storage.list_pages(log_dir, start_after=f"{first - 1:020d}.z"):
        parsed = [p for info in page if (p := parse_log_file_name(info.name)) is not None]
        versions.extend(v for v, is_checkpoint in parsed if is_checkpoint and first <= v < end)
        if any(v >= end for v, _ in parsed):
            break
    tops = _checkpoint_tops(storage, log_dir, versions)
    return None if tops is None else {path for _, named in tops.values() for path in named}


def _first_checkpoint(listing: list[FileInfo]) -> int | None:
    """The lowest checkpoint version in a listing of a log's start (None: none in it)."""
    versions = [
        parsed[0]
        for info in listing
        if (parsed := parse_log_file_name(info.name)) is not None and parsed[1]
    ]
    return min(versions, default=None)


def _sidecars_below(
    storage: Storage, sidecar_dir: str, bounds: dict[int, int]
) -> list[tuple[FileInfo, int, int]]:
    """(file, partition, version in its name) of each sidecar of a partition ``p`` of
    ``bounds`` whose name's version is below ``bounds[p]``. A partition's names sort together,
    by version (5.8): on S3 each partition is listed from its first name until one at or past
    its bound, concurrently; elsewhere the directory is listed once."""
    if not storage.pages_are_requests:
        return [
            (info, *parsed)
            for info in _files(storage, sidecar_dir)
            if (parsed := sidecar_name(info.name)) is not None
            and parsed[1] < bounds.get(parsed[0], -1)
        ]

    def below(partition: int) -> list[tuple[FileInfo, int, int]]:
        found: list[tuple[FileInfo, int, int]] = []
        prefix = f"{partition}-"
        for page in storage.list_pages(sidecar_dir, start_after=prefix):
            for info in page:
                parsed = sidecar_name(info.name)
                if not info.name.startswith(prefix) or (
                    parsed is not None and parsed[1] >= bounds[partition]
                ):
                    return found
                if parsed is not None and parsed[0] == partition:
                    found.append((info, *parsed))
        return found

    with ThreadPoolExecutor(max_workers=_LISTING_THREADS) as pool:
        return [item for part in pool.map(below, sorted(bounds)) for item in part]


def vacuum_incarnation(
    store: Store, item: WorkItem, meta: TopicMetadata, options: dict[str, Any]
) -> PartitionResult:
    """Vacuum a layout-3 topic incarnation as a whole (PROTOCOL.md 22.5): its topic logs, the
    data objects its partitions share, its sidecars and its partitions' ``segments/``.

    A data object goes once no partition has it live and every partition that removed it did
    so at least ``file.delete.delay.ms`` ago; its ``vacuumed`` entries, one per partition that
    recorded it, go into one commit per topic log."""
    storage = store.storage
    orphan_age = int(options["orphan_age_ms"])
    log_retention = int(options["log_retention_ms"])
    check_ages(orphan_age, log_retention)
    incarnation = topic_data_dir(item.topic, item.topic_id)
    data_dir, sidecar_dir = f"{incarnation}/{DATA_PREFIX.rstrip('/')}", f"{incarnation}/{SIDECARS}"
    logs = store.topic_logs(item.topic, meta)
    directories = {p: partition_dir(item.topic, item.topic_id, p) for p in range(meta.partitions)}
    fixed = options.get("now_ms")
    # The probe goes into topic log 0's directory, which exists once the topic has a commit:
    # a probe in an empty ``_data/`` would leave a directory marker behind on some stores.
    clock = StorageClock(
        storage,
        logs[0].directory,
        None if fixed is None else int(fixed),
        dry_run=bool(options.get("dry_run")),
    )
    # List everything first, then read the states: a file committed meanwhile is seen as live.
    scans = [LogScan(storage, t.directory) for t in logs]
    now = clock.scan(scans[0], log_retention)
    for other in scans[1:]:
        other.scan(now, log_retention)
    log_files = [s.files for s in scans]
    data_files = _files(storage, data_dir)
    # One listing per partition: concurrently, as a topic's partitions are all in this task.
    with ThreadPoolExecutor(max_workers=_LISTING_THREADS) as pool:
        listed = pool.map(lambda d: _files(storage, f"{d}/segments"), directories.values())
        segment_files = dict(zip(directories, listed, strict=True))
    readers = [
        TopicLogFiles(
            storage,
            t.directory,
            TopicRemovalState,
            checkpoint_interval=int(meta.effective_config["checkpoint.interval"]),
        )
        for t in logs
    ]
    states = [cast(TopicRemovalState, r.load()) for r in readers]
    result = PartitionResult.starting(item, OPERATION, states[0].partition(item.partition))
    if (
        all(s.version < 0 for s in states)
        and not data_files
        and not any(segment_files.values())
        and not any(log_files)
        and not next(storage.list_pages(sidecar_dir, page_size=1), [])
    ):
        result.reason = "no data"
        return result
    delay = max(int(item.config["file.delete.delay.ms"]), MIN_FILE_DELETE_DELAY_MS)
    intended = {
        segment_location(directory, path) for directory, path in _spark_intents(storage, now)
    }
    doomed: dict[str, int] = {}  # path relative to the store root -> size
    # Topic log -> partition -> removed paths that are due and go (``vacuumed``).
    forget: dict[int, dict[int, set[str]]] = {}
    data_live: set[str] = set()
    data_removals: dict[str, list[tuple[int, int, bool]]] = {}  # path -> (log, partition, due)
    # A file a retained version of the topic's Delta table names stays (PROTOCOL.md 29.5).
    held = referenced_paths(storage, item.topic, item.topic_id, now)
    for k, state in enumerate(states):
        times = scans[k].removal_times(
            {
                state.removal_version(p, path)
                for p, partition_state in state.partitions.items()
                for path in partition_state.removed
            },
            readers[k].checkpoint_interval,
        )
        for p, partition_state in state.partitions.items():
            by_name = {f.name: f for f in segment_files.get(p, [])}
            for seg in partition_state.segments:
                if in_incarnation(seg.path):
                    data_live.add(seg.path)
            for path in partition_state.removed:
                at = times.at(state.removal_version(p, path))
                due = at is not None and now - at >= delay and path not in held.get(p, ())
                if in_incarnation(path):
                    data_removals.setdefault(path, []).append((k, p, due))
                elif due:
                    forget.setdefault(k, {}).setdefault(p, set()).add(path)
                    info = by_name.get(path.removeprefix("segments/"))
                    if info is not None and p in directories:
                        doomed[f"{directories[p]}/{path}"] = info.size
    data_by_name = {f.name: f for f in data_files}
    # Commit files whose carried data a partition still reads, or removed too recently: they
    # outlive the log retention (PROTOCOL.md 22.5).
    carried_held = {f"{incarnation}/{path}" for path in data_live if is_carried_path(path)}
    # Commit files whose data no partition needs any more. At the minimum log retention the
    # data goes with the file, an old version within about two days (a DELETE, free on S3);
    # a longer retention would keep it that long, so it goes now, the file rewritten without
    # it (a PUT each), and the commit stays a log version.
    strip_carried = log_retention > MIN_LOG_RETENTION_MS
    strip: set[str] = set()
    for path, entries in sorted(data_removals.items()):
        # Shared: the object goes only when every partition is done with it.
        if path in data_live or not all(due for _, _, due in entries):
            if is_carried_path(path):
                carried_held.add(f"{incarnation}/{path}")
            continue
        for k, p, _ in entries:
            forget.setdefault(k, {}).setdefault(p, set()).add(path)
        if is_carried_path(path) and strip_carried:
            strip.add(f"{incarnation}/{path}")
        # A commit file is deleted as a log version, below (only once past the log retention).
        info = data_by_name.get(path.removeprefix(DATA_PREFIX))
        if info is not None and path.startswith(DATA_PREFIX):
            doomed[f"{incarnation}/{path}"] = info.size

    def old_enough(info: FileInfo, age: int) -> bool:
        written = _age_reference(info)
        return written is not None and now - written > age

    # Orphans: files no entry of any partition names, live or removed.
    named_data = data_live | set(data_removals)
    for info in data_files:
        full = f"{data_dir}/{info.name}"
        if (
            f"{DATA_PREFIX}{info.name}" not in named_data
            and full not in intended
            and info.name not in ("", ".", "..")
            and old_enough(info, orphan_age)
        ):
            doomed[full] = info.size
    for p, listing in segment_files.items():
        own = states[p % len(states)].partitions.get(p) if states else None
        named = set() if own is None else {s.path for s in own.segments} | set(own.removed)
        for info in listing:
            full = f"{directories[p]}/segments/{info.name}"
            if (
                f"segments/{info.name}" not in named
                and full not in intended
                and info.name not in ("", ".", "..")
                and old_enough(info, orphan_age)
            ):
                doomed[full] = info.size
    # Pending flushes (PROTOCOL.md 30.9): no commit names one; its writer or the committer
    # that took it deletes it within seconds, so one past the orphan age was left by a crash.
    for k in range(len(logs)):
        pending = pending_dir(incarnation, k)
        for info in _files(storage, pending):
            if info.name not in ("", ".", "..") and old_enough(info, orphan_age):
                doomed[f"{pending}/{info.name}"] = info.size
    keep_from: list[int | None] = []
    for k, scan in enumerate(scans):
        for info in scan.temporary():
            if old_enough(info, orphan_age):
                doomed[f"{logs[k].directory}/{info.name}"] = info.size
        kept, old = old_log_files(scan.files, now, log_retention)
        keep_from.append(kept)
        for info in old:
            full = f"{logs[k].directory}/{info.name}"
            if full not in carried_held:
                doomed[full] = info.size
    # Sidecars: those no kept checkpoint names, once older than the log retention (a younger
    # one may belong to a checkpoint being written).
    doomed.update(
        _unnamed_sidecars(
            storage,
            sidecar_dir,
            [t.directory for t in logs],
            scans,
            keep_from,
            meta.partitions,
            lambda info: old_enough(info, log_retention),
        )
    )
    # Refresh: anything a commit made live, or removed anew, since the listing stays.
    for k, reader in enumerate(readers):
        newest = cast(TopicRemovalState, reader.update(states[k]))
        for p, partition_state in newest.partitions.items():
            directory = directories.get(p, partition_dir(item.topic, item.topic_id, p))
            going = forget.get(k, {}).get(p, set())
            for seg in partition_state.segments:
                doomed.pop(segment_location(directory, seg.path), None)
                strip.discard(segment_location(directory, seg.path))
            for path in partition_state.removed:
                if path not in going:
                    doomed.pop(segment_location(directory, path), None)
    strip -= set(doomed)  # deleted whole, as an old version
    result.files = sorted(doomed)
    result.files_deleted = len(doomed)
    result.bytes_deleted = sum(doomed.values())
    if not doomed and not forget:
        result.reason = "nothing to delete"
        return result
    stripped = f", and the data of {len(strip)} commit(s)" if strip else ""
    if options.get("dry_run"):
        result.outcome = "dry-run"
        result.reason = f"would delete {len(doomed)} file(s){stripped}"
        return result
    for k, kept in enumerate(keep_from):
        if kept is not None:
            _point_hint_at(storage, logs[k].directory, kept)
    storage.delete(result.files)
    # Before the removals are forgotten below: a run that stops in between strips them next.
    result.bytes_deleted += _strip_carried_data(storage, sorted(strip))
    result.outcome = "committed"
    result.reason = f"deleted {len(doomed)} file(s){stripped}"
    for k, per_partition in sorted(forget.items()):
        builds = {p: _forget_build(paths) for p, paths in per_partition.items()}
        committed, _ = logs[k].commit(builds, operation="VACUUM")
        if committed is not None:
            result.commits += 1
    return result


def _strip_carried_data(storage: Storage, paths: list[str]) -> int:
    """Replace each commit file by its text alone (PROTOCOL.md 22.5): the data it carried is
    no partition's any more. Returns the bytes freed. Readers see the old file or the new,
    and replay the same actions from either. A chunk at a time (each file up to about
    ``commit.inline.bytes``), its reads and its writes concurrent: a run after a long pause
    may have thousands to do."""
    freed = 0
    with ThreadPoolExecutor(max_workers=_STRIP_THREADS) as pool:
        for first in range(0, len(paths), _STRIP_CHUNK):
            found = storage.read_many(paths[first : first + _STRIP_CHUNK])
            texts = {}
            for path, data in found.items():
                text = without_carried_data(data, path)
                if text is not None:  # None: stripped already (a run that stopped before
                    texts[path] = text  # forgetting the removals)
                    freed += len(data) - len(text)
            for done in pool.map(lambda item: storage.put(*item), texts.items()):
                assert done is None
    return freed


# Commit files read (and rewritten) at once when vacuum removes the data they carried.
_STRIP_CHUNK = 64
_STRIP_THREADS = 16


def _files(storage: Storage, directory: str) -> list[FileInfo]:
    """A directory's entries, without the marker of the directory itself that some object
    stores (SeaweedFS) list under its own name once it is empty: it is no file of ours."""
    own = directory.rsplit("/", 1)[-1]
    return [i for i in storage.list_dir(directory) if not (i.name == own and i.size == 0)]


def _forget_build(paths: set[str]) -> Any:
    def build(state: PartitionState) -> list[Action] | None:
        still = sorted(paths & set(state.removed))
        return [{"vacuumed": {"paths": still}}] if still else None

    return build
