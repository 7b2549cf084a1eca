"""Verify a topic: read every log file and every live segment, and check that they agree.

This is a library module (no typer): ``verify_topic(store, name)`` returns a
:class:`TopicReport` whose ``problems`` are violations of docs/PROTOCOL.md and whose
``warnings`` are legal but noteworthy states (orphan files a crashed writer left behind,
leftovers of a deleted incarnation). ``kstore verify`` prints them and exits 1 on a problem.

What is checked, per topic:

- the topic log: every commit and checkpoint file decodes (framing, JSON, action count), the
  versions have no gaps, and the topic's metadata loads;
- per partition log: the same for every file, then a replay of every commit from version 0
  (or from the oldest checkpoint when the early commits were cleaned up) that must agree with
  every checkpoint and with the state a reader loads (newest checkpoint plus the commits after
  it);
- the manifest: live segments sorted, their offset ranges inside ``[0, endOffset)`` and not
  overlapping, the log start offset not past the end offset;
- per live segment: the file exists with the size the manifest records; its CRC-32C checksum,
  format, schema and record count match (``Partition.read_segment``); its timestamps are not
  null and their range equals the manifest's; a sparse segment's offsets are non-null,
  strictly increasing and inside the manifest's range (dense segments' offsets follow from
  ``baseOffset`` and are dense by construction);
- files in ``segments/`` that no live segment or pending deletion references (warnings).

A topic of layout 3 (PROTOCOL.md 26) keeps no log per partition: each of its topic logs is
checked as above (every commit from version 0, every checkpoint read with its sidecars), and
each partition's state in it as a partition log's would be. A live segment that is a range of
a shared data object is checked against the object (it exists and holds the range; the range's
bytes, read alone, match the checksum); data objects and sidecars that nothing names are
reported as orphans (warnings).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kstore.log import LogState
    from kstore.partition import Partition, PartitionState
    from kstore.storage import FileInfo, Storage
    from kstore.store import Store, TopicMetadata

ERROR = "error"
WARNING = "warning"


@dataclass(frozen=True)
class Finding:
    severity: str  # ERROR or WARNING
    topic: str
    partition: int | None  # None: the topic as a whole
    path: str | None  # the file at fault, relative to the store root
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "topic": self.topic,
            "partition": self.partition,
            "path": self.path,
            "message": self.message,
        }


@dataclass
class TopicReport:
    topic: str
    partitions: int = 0
    segments: int = 0
    records: int = 0
    bytes: int = 0
    log_files: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "ok": self.ok,
            "partitions": self.partitions,
            "segments": self.segments,
            "records": self.records,
            "bytes": self.bytes,
            "log_files": self.log_files,
            "problems": [f.to_json() for f in self.problems],
            "warnings": [f.to_json() for f in self.warnings],
        }


Progress = Callable[[int], None]  # called with the number of bytes of each segment read


class _Collector:
    def __init__(self, report: TopicReport, partition: int | None) -> None:
        self.report = report
        self.partition = partition

    def error(self, message: str, path: str | None = None) -> None:
        self.report.findings.append(
            Finding(ERROR, self.report.topic, self.partition, path, message)
        )

    def warning(self, message: str, path: str | None = None) -> None:
        self.report.findings.append(
            Finding(WARNING, self.report.topic, self.partition, path, message)
        )


def verify_topic(
    store: Store, topic: str, *, progress: Progress | None = None, read_data: bool = True
) -> TopicReport:
    """Check one topic (see the module docstring). Never raises for what it finds: every
    problem is a finding, so one bad file does not hide the others. ``read_data=False`` skips
    reading segment data (the logs and the listing are still checked)."""
    from kstore.errors import KStoreError
    from kstore.layout import topic_dir, topic_log_dir
    from kstore.names import validate_topic_name
    from kstore.store import TopicState

    report = TopicReport(topic)
    out = _Collector(report, None)
    try:
        validate_topic_name(topic)
    except KStoreError as exc:
        out.error(str(exc))
        return report
    _check_log_files(store.storage, topic_log_dir(topic), TopicState, out, report)
    try:
        meta = store.topic(topic)
    except KStoreError as exc:
        out.error(f"the topic cannot be loaded: {exc}", topic_log_dir(topic))
        return report
    report.partitions = meta.partitions
    _check_topic_dirs(store.storage, topic_dir(topic), meta, out)
    if meta.layout == 3:
        _verify_layout3(store, meta, report, progress=progress, read_data=read_data)
        return report
    for number in range(meta.partitions):
        _verify_partition(store, meta, number, report, progress=progress, read_data=read_data)
    return report


def verify_store(
    store: Store,
    topics: list[str] | None = None,
    *,
    progress: Progress | None = None,
    read_data: bool = True,
) -> list[TopicReport]:
    """Check the named topics (default: every topic of the store)."""
    names = topics if topics is not None else store.list_topics()
    return [verify_topic(store, name, progress=progress, read_data=read_data) for name in names]


def planned_bytes(store: Store, topics: list[str]) -> int:
    """Bytes of live segments that verification will read (for a progress bar); problems are
    left for the verification itself to report."""
    from kstore.errors import KStoreError

    total = 0
    for name in topics:
        try:
            meta = store.topic(name)
            for number in range(meta.partitions):
                total += store.partition(name, number, meta).state().size_bytes
        except KStoreError:
            continue
    return total


# -- logs -------------------------------------------------------------------------------------------


def _check_topic_dirs(
    storage: Storage, directory: str, meta: TopicMetadata, out: _Collector
) -> None:
    import re

    for info in storage.list_dir(directory):
        if info.name in ("_log", meta.topic_id) or info.name.startswith("."):
            continue
        if re.fullmatch(r"[0-9a-f]{32}", info.name):
            out.warning(
                "data of a deleted incarnation of the topic is still on storage",
                f"{directory}/{info.name}",
            )
    for info in storage.list_dir(f"{directory}/{meta.topic_id}"):
        if info.name.isdigit() and int(info.name) >= meta.partitions:
            out.warning(
                f"partition directory {info.name} is beyond the topic's {meta.partitions} "
                "partitions",
                f"{directory}/{meta.topic_id}/{info.name}",
            )


def _check_log_files(
    storage: Storage,
    directory: str,
    factory: Callable[[], LogState],
    out: _Collector,
    report: TopicReport,
    read_checkpoint: Callable[[int], LogState | None] | None = None,
) -> dict[int, Any] | None:
    """Decode every file of a log and replay its commits in order. Returns the replayed state
    summaries by version (for comparison with what readers load), or None when the replay
    could not run to the newest version. ``read_checkpoint`` loads a checkpoint whose state is
    not all in its own file (a topic log's sidecars); None when the file is absent."""
    from kstore.errors import CorruptLogError, KStoreError
    from kstore.log import (
        LAST_CHECKPOINT,
        checkpoint_file,
        decode_commit,
        parse_log_file_name,
        version_file,
    )

    versions: list[int] = []
    checkpoints: list[int] = []
    for info in storage.list_dir(directory):
        parsed = parse_log_file_name(info.name)
        if parsed is not None:
            (checkpoints if parsed[1] else versions).append(parsed[0])
        elif info.name == LAST_CHECKPOINT:
            hint = storage.read_if_exists(f"{directory}/{LAST_CHECKPOINT}")
            try:
                version = json.loads(hint or b"")["version"]
                if not isinstance(version, int):
                    raise TypeError(version)
            except (ValueError, KeyError, TypeError):
                out.warning(
                    "the _last_checkpoint hint is malformed (readers ignore it)",
                    f"{directory}/{LAST_CHECKPOINT}",
                )
    versions.sort()
    checkpoints.sort()
    report.log_files += len(versions) + len(checkpoints)
    if not versions and not checkpoints:
        return {}
    present = set(versions)
    newest = max(versions or checkpoints)
    oldest = min(versions) if versions else newest + 1
    gaps = [v for v in range(oldest, newest + 1) if v not in present]
    if gaps:
        shown = ", ".join(map(str, gaps[:5])) + (" ..." if len(gaps) > 5 else "")
        out.error(f"commit versions {shown} are missing between {oldest} and {newest}", directory)

    # Where a full replay can start: version 0, or else the oldest checkpoint from which every
    # later commit is present.
    start_state: LogState | None = None
    if 0 in present:
        start_state = factory()
    checkpoint_states: dict[int, LogState] = {}
    for version in checkpoints:
        path = f"{directory}/{checkpoint_file(version)}"
        try:
            if read_checkpoint is not None:
                loaded = read_checkpoint(version)
                if loaded is None:
                    continue  # deleted since the listing (log cleanup): not a problem
                checkpoint_states[version] = loaded
                continue
            data = storage.read(path)
            header, actions = decode_commit(data, path)
            if header.get("checkpointVersion") != version:
                raise CorruptLogError(
                    f"{path}: header names version {header.get('checkpointVersion')!r}"
                )
            state = factory()
            for name, body in actions:
                state.apply(name, body)
            state.version = version
            checkpoint_states[version] = state
        except FileNotFoundError:
            continue  # deleted since the listing (log cleanup): not a problem
        except (KStoreError, KeyError, TypeError, ValueError) as exc:
            out.error(f"checkpoint {version} is corrupt: {_short(exc)}", path)
    if start_state is None:
        usable = [
            v
            for v in sorted(checkpoint_states)
            if all(x in present for x in range(v + 1, newest + 1))
        ]
        if not usable:
            if versions and min(versions) > 0:
                out.error(
                    f"versions before {min(versions)} are gone and no checkpoint covers them",
                    directory,
                )
            return None
        start_state = checkpoint_states[usable[0]]

    # Summaries are kept only where something is compared (checkpoints, the newest version):
    # a summary per version would cost time and memory quadratic in the log's length.
    replayed: dict[int, Any] = {}
    state = start_state.copy()
    if state.version == newest:
        replayed[newest] = _summary(state)
    for version in range(state.version + 1, newest + 1):
        path = f"{directory}/{version_file(version)}"
        if version not in present:
            return None
        try:
            data = storage.read(path)
            _, actions = decode_commit(data, path)
            for name, body in actions:  # applied in place: a failed replay is abandoned
                state.apply(name, body)
            state.version = version
        except FileNotFoundError:
            out.error(f"commit {version} disappeared while being verified", path)
            return None
        except (KStoreError, KeyError, TypeError, ValueError) as exc:
            out.error(f"commit {version} is corrupt or does not apply: {_short(exc)}", path)
            return None
        checkpoint = checkpoint_states.get(version)
        if checkpoint is not None or version == newest:
            replayed[version] = _summary(state)
        if checkpoint is not None:
            diff = _difference(replayed[version], _summary(checkpoint))
            if diff:
                out.error(
                    f"checkpoint {version} disagrees with the replay of the commits: {diff}",
                    f"{directory}/{checkpoint_file(version)}",
                )
    return replayed


def _summary(state: LogState) -> dict[str, Any]:
    """The parts of a state that readers act on, in a comparable form."""
    from kstore.partition import PartitionState
    from kstore.topic_log import TopicLogState

    if isinstance(state, TopicLogState):
        empty = _summary(PartitionState())
        every = {p: _summary(state.partition(p)) for p in sorted(state.partitions)}
        return {"partitions": {p: s for p, s in every.items() if s != empty}}
    if not isinstance(state, PartitionState):
        body = getattr(state, "metadata", None)
        return {"metadata": body, "deleted": getattr(state, "deleted", None)}
    return {
        "segments": [
            (
                s.path,
                s.base_offset,
                s.last_offset,
                s.record_count,
                s.min_timestamp_ms,
                s.max_timestamp_ms,
                s.size_bytes,
                s.checksum,
                s.format,
                s.sparse,
            )
            for s in state.segments
        ],
        "endOffset": state.end_offset,
        "logStartOffset": state.log_start_offset,
        "cleanedOffset": state.cleaned_offset,
        "producers": {
            pid: (p.epoch, p.first_sequence, p.last_sequence, p.base_offset, p.last_offset)
            for pid, p in state.producers.items()
        },
        "txns": dict(state.txns),
        "removed": dict(state.removed),
        "openTransactions": dict(state.open_transactions),
    }


def _difference(a: dict[str, Any], b: dict[str, Any]) -> str:
    if "partitions" in a or "partitions" in b:  # a topic log: say which partitions differ
        mine, theirs = a.get("partitions", {}), b.get("partitions", {})
        return "; ".join(
            f"partition {p}: {_difference(mine.get(p, {}), theirs.get(p, {})) or 'differs'}"
            for p in sorted(set(mine) | set(theirs))
            if mine.get(p) != theirs.get(p)
        )
    fields = [key for key in {**a, **b} if a.get(key) != b.get(key)]
    return ", ".join(f"{key} differs" for key in fields)


def _short(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


# -- partitions -------------------------------------------------------------------------------------


def _verify_partition(
    store: Store,
    meta: TopicMetadata,
    number: int,
    report: TopicReport,
    *,
    progress: Progress | None,
    read_data: bool,
) -> None:
    from kstore.errors import KStoreError
    from kstore.partition import PartitionState

    out = _Collector(report, number)
    partition = store.partition(meta.name, number, meta)
    log_dir = f"{partition.directory}/_log"
    try:
        replayed = _check_log_files(store.storage, log_dir, PartitionState, out, report)
    except KStoreError as exc:  # the storage failed while listing or reading
        out.error(f"the partition log cannot be read: {_short(exc)}", log_dir)
        return
    try:
        state = partition.state()
    except KStoreError as exc:
        out.error(f"the partition log cannot be loaded: {_short(exc)}", log_dir)
        return
    if replayed and state.version in replayed:
        diff = _difference(replayed[state.version], _summary(state))
        if diff:
            out.error(
                f"the state readers load (newest checkpoint plus later commits) disagrees "
                f"with the replay of every commit: {diff}",
                log_dir,
            )
    _check_manifest(state, partition, out)
    missing = _check_files(store, partition, state, out)
    for seg in state.segments:
        report.segments += 1
        report.records += seg.record_count
        report.bytes += seg.size_bytes
        if read_data:
            if seg.path not in missing:  # reported once, as missing
                _check_segment(partition, seg, out)
            if progress is not None:  # the bytes were planned: the bar still completes
                progress(seg.size_bytes)


def _verify_layout3(
    store: Store,
    meta: TopicMetadata,
    report: TopicReport,
    *,
    progress: Progress | None,
    read_data: bool,
) -> None:
    """A layout-3 topic: its topic logs (with their checkpoints' sidecars), each partition's
    state in them, the shared data objects and the sidecars (see the module docstring)."""
    from kstore.errors import KStoreError
    from kstore.layout import topic_data_dir
    from kstore.log import decode_commit, parse_log_file_name
    from kstore.manifest import DATA_PREFIX, PartitionState
    from kstore.topic_log import SIDECARS, TopicLogFiles, TopicLogState

    storage = store.storage
    topic_out = _Collector(report, None)
    incarnation = topic_data_dir(meta.name, meta.topic_id)
    replays: dict[int, dict[int, Any] | None] = {}  # topic log index -> its replay
    named_sidecars: set[str] = set()
    log_files: dict[str, FileInfo] = {}  # commit files by manifest path (_log/<version>.json)
    logs = store.topic_logs(meta.name, meta)
    for topic_log in logs:
        directory = topic_log.directory
        files = TopicLogFiles(storage, directory, TopicLogState)
        try:
            replays[topic_log.index] = _check_log_files(
                storage, directory, TopicLogState, topic_out, report, files._read_checkpoint
            )
            for info in storage.list_dir(directory):
                parsed = parse_log_file_name(info.name)
                if parsed is not None and not parsed[1]:  # a commit may carry ranges (11.8)
                    log_files[f"{directory.rsplit('/', 1)[-1]}/{info.name}"] = info
                if parsed is None or not parsed[1]:
                    continue
                path = f"{directory}/{info.name}"
                data = storage.read_if_exists(path)
                if data is None:
                    continue
                try:
                    for name, body in decode_commit(data, path)[1]:
                        if name == "sidecar":
                            named_sidecars.add(str(body["path"]))
                except (KStoreError, KeyError, TypeError, ValueError):
                    continue  # reported as a corrupt checkpoint by the replay above
        except KStoreError as exc:  # the storage failed while listing or reading
            topic_out.error(f"the topic log cannot be read: {_short(exc)}", directory)
            replays[topic_log.index] = None
    try:
        objects = {
            f"{DATA_PREFIX}{info.name}": info for info in _entries(storage, f"{incarnation}/_data")
        }
        sidecars = _entries(storage, f"{incarnation}/{SIDECARS}")
    except KStoreError as exc:
        topic_out.error(f"the topic's data objects cannot be listed: {_short(exc)}", incarnation)
        return
    named_objects: set[str] = set()
    ranged_files = {**objects, **log_files}  # what a range may name: data objects, commits
    empty = _summary(PartitionState())
    for number in range(meta.partitions):
        out = _Collector(report, number)
        partition = store.partition(meta.name, number, meta)
        where = partition.log.directory
        try:
            state = partition.state()
        except KStoreError as exc:
            out.error(f"the topic log cannot be loaded: {_short(exc)}", where)
            continue
        replayed = replays.get(number % len(logs)) if logs else None
        if replayed and state.version in replayed:
            expected = replayed[state.version]["partitions"].get(number, empty)
            diff = _difference(expected, _summary(state))
            if diff:
                out.error(
                    f"the state readers load (newest checkpoint plus later commits) disagrees "
                    f"with the replay of every commit: {diff}",
                    where,
                )
        named_objects.update(
            p
            for p in [*(s.path for s in state.segments), *state.removed]
            if p.startswith(DATA_PREFIX)
        )
        _check_manifest(state, partition, out)
        missing = _check_files(store, partition, state, out, ranged_files)
        for seg in state.segments:
            report.segments += 1
            report.records += seg.record_count
            report.bytes += seg.size_bytes
            if read_data:
                if seg.path not in missing:  # reported once, as missing
                    _check_segment(partition, seg, out)
                if progress is not None:  # the bytes were planned: the bar still completes
                    progress(seg.size_bytes)
    for name in sorted(objects):
        if name not in named_objects:
            topic_out.warning(
                "data object no partition names, live or removed (a flush that never "
                "committed, a duplicate batch, or one still committing)",
                f"{incarnation}/{name}",
            )

    for info in sorted(sidecars, key=lambda i: i.name):
        if f"{SIDECARS}/{info.name}" not in named_sidecars:
            topic_out.warning(
                "sidecar no checkpoint names (a checkpoint that lost its race, or one whose "
                "checkpoint was cleaned up)",
                f"{incarnation}/{SIDECARS}/{info.name}",
            )


def _entries(storage: Storage, directory: str) -> list[FileInfo]:
    """A directory's entries, without the marker of the directory itself that some object
    stores (SeaweedFS) list under its own name once it has been emptied."""
    own = directory.rsplit("/", 1)[-1]
    return [i for i in storage.list_dir(directory) if not (i.name == own and i.size == 0)]


def _check_manifest(state: PartitionState, partition: Partition, out: _Collector) -> None:
    from kstore.manifest import segment_location

    where = partition.log.directory  # the partition log, or the topic log (layout 3)
    if state.log_start_offset > state.end_offset:
        out.error(
            f"log start offset {state.log_start_offset} is past the end offset {state.end_offset}",
            where,
        )
    previous = None
    for seg in state.segments:
        path = segment_location(partition.directory, seg.path)
        if seg.last_offset >= state.end_offset:
            out.error(
                f"segment covers offsets {seg.base_offset}..{seg.last_offset}, beyond the end "
                f"offset {state.end_offset}",
                path,
            )
        if previous is not None:
            if seg.base_offset < previous.base_offset:
                out.error("segments are not in offset order", path)
            elif seg.base_offset <= previous.last_offset:
                out.error(
                    f"offsets {seg.base_offset}..{seg.last_offset} overlap the segment "
                    f"{previous.path} ({previous.base_offset}..{previous.last_offset})",
                    path,
                )
        if seg.record_count == 0:
            out.warning("segment holds no records (writers must not write empty segments)", path)
        if seg.min_timestamp_ms > seg.max_timestamp_ms:
            out.error(
                f"minTimestamp {seg.min_timestamp_ms} is after maxTimestamp {seg.max_timestamp_ms}",
                path,
            )
        previous = seg


def _check_files(
    store: Store,
    partition: Partition,
    state: PartitionState,
    out: _Collector,
    objects: dict[str, FileInfo] | None = None,
) -> set[str]:
    """Live segments against the storage listing, and files in ``segments/`` that nothing
    names. ``objects``: what layout 3's ranges name, by manifest path: the data objects
    (``_data/`` listed once per topic) and the commit files (which may carry data).
    Returns the manifest paths of live segments found missing (not worth reading)."""
    from kstore.errors import KStoreError
    from kstore.manifest import DATA_PREFIX, segment_location

    directory = f"{partition.directory}/segments"
    try:
        listing = {info.name: info for info in _entries(store.storage, directory)}
    except KStoreError as exc:
        out.error(f"the segment directory cannot be listed: {_short(exc)}", directory)
        return set()
    live = {seg.path: seg for seg in state.segments}
    missing: set[str] = set()
    for seg in state.segments:
        path = segment_location(partition.directory, seg.path)
        if seg.byte_range is not None:
            start, length = seg.byte_range
            found = (objects or {}).get(seg.path)
            what = "data object" if seg.path.startswith(DATA_PREFIX) else "commit file"
            if found is None:
                missing.add(seg.path)
                out.error(
                    f"{what} is missing from storage (range {start}+{length} of this partition)",
                    path,
                )
            elif found.size < start + length:
                out.error(
                    f"{what} is {found.size} bytes, the range {start}+{length} ends at "
                    f"{start + length}",
                    path,
                )
            continue
        name = seg.path.removeprefix("segments/")
        info = listing.get(name)
        if info is None:
            missing.add(seg.path)
            out.error("segment file is missing from storage", path)
        elif info.size != seg.size_bytes:
            out.error(f"file is {info.size} bytes, the manifest says {seg.size_bytes}", path)
    for name in sorted(listing):
        rel = f"segments/{name}"
        if rel in live or rel in state.removed:
            continue
        if name.startswith(".tmp-"):
            out.warning("temporary file left by an interrupted write", f"{directory}/{name}")
        else:
            out.warning(
                "segment file not referenced by the manifest (an append that never committed, "
                "or one still committing)",
                f"{directory}/{name}",
            )
    return missing


def _check_segment(partition: Partition, seg: Any, out: _Collector) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from kstore.errors import CorruptLogError, CorruptRecordError, KStoreError
    from kstore.manifest import segment_location

    path = segment_location(partition.directory, seg.path)
    # A range of a data object: say which one (the object's other ranges are other partitions').
    where = "" if seg.byte_range is None else f"range {seg.byte_range[0]}+{seg.byte_range[1]}: "
    try:
        table = partition.read_segment(seg)
    except (CorruptRecordError, CorruptLogError) as exc:
        message = _short(exc)
        # The reader's message names the file already; keep what follows it.
        kept = message.split("): ", 1)[-1] if "): " in message else message
        # ... and may name the range already (a range cut short): say it once.
        if where and kept.startswith(where.removesuffix(": ") + " "):
            where = ""
        out.error(where + kept, path)
        return
    except KStoreError as exc:
        out.error(f"{where}segment cannot be read: {_short(exc)}", path)
        return
    stamps = table.column("timestamp")
    if stamps.null_count:
        out.error(f"{stamps.null_count} record(s) have no timestamp", path)
    elif table.num_rows:
        bounds = pc.min_max(stamps.cast(pa.int64()))
        low, high = int(bounds["min"].as_py()) // 1000, int(bounds["max"].as_py()) // 1000
        if (low, high) != (seg.min_timestamp_ms, seg.max_timestamp_ms):
            out.error(
                f"timestamps span {low}..{high} ms, the manifest says "
                f"{seg.min_timestamp_ms}..{seg.max_timestamp_ms}",
                path,
            )
    if not seg.sparse or not table.num_rows:
        return
    offsets = table.column("offset")
    if offsets.null_count:
        out.error(f"{offsets.null_count} record(s) have no offset", path)
        return
    values = offsets.to_numpy()
    if len(values) > 1 and not bool(np.all(np.diff(values) > 0)):
        out.error("offsets are not strictly increasing", path)
    if int(values.min()) < seg.base_offset or int(values.max()) > seg.last_offset:
        out.error(
            f"offsets {int(values.min())}..{int(values.max())} fall outside the manifest's range "
            f"{seg.base_offset}..{seg.last_offset}",
            path,
        )
