"""Publishing a topic as a Delta table (PROTOCOL.md 29): the table's files are the topic's
Parquet segments, named by reference from ``<incarnation>/_delta_log/``; nothing is copied.

A publication reads the table's newest version, then kstore's logs, and commits one Delta
version that turns the table's file set into the one kstore's state implies (adds and removes),
with one ``txn`` per kstore log recording the log version it covers. It is a state sync, not a
replay of events, so running it again after any crash completes what is missing and never adds
a file twice; the ``txn`` versions only ever grow, so a publisher holding an older kstore state
than the table already covers stands down.
"""

from __future__ import annotations

import copy
import json
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kstore.errors import ConcurrentModificationError, InvalidConfigurationError, KStoreError
from kstore.layout import topic_data_dir
from kstore.manifest import PartitionState, Segment
from kstore.storage import Storage
from kstore.store import Store, TopicMetadata
from kstore.topic_log import log_index

from .deltalog import (
    DELTA_LOG,
    DeltaLogError,
    Snapshot,
    commit,
    deleted_file_retention_ms,
    read_snapshot,
)

TABLE_FORMAT = "table.format"
PARTITION_COLUMNS = ["partition", "timestampType"]
_ATTEMPTS = 8
_KAFKA_TYPES = {"partition": "integer", "offset": "long", "timestamp": "timestamp"}
_HEADERS = {
    "type": "array",
    "elementType": {
        "type": "struct",
        "fields": [
            {"name": "key", "type": "string", "nullable": True, "metadata": {}},
            {"name": "value", "type": "binary", "nullable": True, "metadata": {}},
        ],
    },
    "containsNull": True,
}


@dataclass
class PublishReport:
    """What one publication did."""

    topic: str
    table: str  # the table's URL (the topic incarnation's directory), credentials removed
    version: int  # the table's newest Delta version afterwards; -1: no table yet
    committed: bool = False  # this publication wrote a version
    files_added: int = 0
    files_removed: int = 0
    files: int = 0  # files in the table afterwards
    records: int = 0  # records in them
    bytes_covered: int = 0  # bytes of the segment files this version added by reference
    bytes_written: int = 0  # bytes this publication wrote (its Delta commit only)
    covered: dict[int, int] = field(default_factory=dict)  # partition -> end of its prefix
    tail_segments: int = 0  # segments rewritten into Parquet first (tail=True)
    checkpoint: bool = False  # a Delta checkpoint was written at this version
    checkpoint_error: str | None = None  # why the checkpoint due at this version failed
    attempts: int = 0
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["covered"] = {str(p): end for p, end in sorted(self.covered.items())}
        return out


def table_dir(meta: TopicMetadata) -> str:
    """The table's root, relative to the store root: the topic incarnation's directory."""
    return topic_data_dir(meta.name, meta.topic_id)


def table_url(store: Store, meta: TopicMetadata) -> str:
    """The table's URL, as Delta readers open it (credentials removed)."""
    storage = store.storage
    if storage.local_root is not None:
        from pathlib import Path

        return Path(storage.full_path(table_dir(meta))).as_uri()
    return f"{storage.display_url}/{table_dir(meta)}"


def enabled(config: Mapping[str, Any]) -> bool:
    return config.get(TABLE_FORMAT) == "delta"


def publish_table(
    store: Store, topic: str, *, tail: bool = False, now_ms: int | None = None
) -> PublishReport:
    """Publish ``topic``'s Parquet segments as a new version of its Delta table (when its
    file set differs from kstore's state). ``tail``: first rewrite every segment below the last
    stable offset that is not a Parquet file yet (the merger's output, forced), so that the
    table reaches the last stable offset."""
    started = time.monotonic()
    meta = store.topic(topic)
    if not enabled(meta.effective_config):
        raise InvalidConfigurationError(
            f"topic {topic!r} has {TABLE_FORMAT}="
            f"{meta.effective_config.get(TABLE_FORMAT)}; set {TABLE_FORMAT}=delta to publish "
            "it as a table"
        )
    tail_segments = 0
    if tail:
        from .tail import merge_tail

        tail_segments = merge_tail(store, meta, now_ms)
    storage = store.storage
    root = table_dir(meta)
    # A kstore state older than this when the commit is sent is read again: vacuum deletes a
    # file kstore removed file.delete.delay.ms (>= 10 s) after its removal, unless a Delta
    # version names it; a publisher must not name a file it saw live longer ago than that.
    budget_s = int(meta.effective_config["file.delete.delay.ms"]) / 2000
    for attempt in range(1, _ATTEMPTS + 1):
        snapshot = read_snapshot(storage, root)
        read_at = time.monotonic()
        logs = kstore_view(store, meta)
        if any(snapshot.txns.get(app, -1) > version for app, (version, _) in logs.items()):
            continue  # the table covers newer kstore versions than this read: read again
        states = {p: s for _, parts in logs.values() for p, s in parts.items()}
        wanted = desired_files(meta, states)
        report = PublishReport(
            topic, table_url(store, meta), snapshot.version, tail_segments=tail_segments
        )
        report.attempts = attempt
        report.covered = {
            p: (files[-1][1].last_offset + 1 if files else states[p].log_start_offset)
            for p, files in wanted.items()
        }
        actions = _actions(meta, snapshot, wanted, logs, report, now_ms)
        if actions is None:
            report.files = len(snapshot.files)
            report.records = sum(s.record_count for fs in wanted.values() for _, s in fs)
            report.elapsed_s = time.monotonic() - started
            return report
        if time.monotonic() - read_at > budget_s:
            continue
        written = commit(storage, root, snapshot.version + 1, actions)
        if written:
            report.committed = True
            report.version = snapshot.version + 1
            report.bytes_written = written
            _checkpoint_if_due(store, meta, snapshot, report)
            report.files = sum(len(fs) for fs in wanted.values())
            report.records = sum(s.record_count for fs in wanted.values() for _, s in fs)
            report.elapsed_s = time.monotonic() - started
            return report
    raise ConcurrentModificationError(
        f"table of topic {topic!r}: {_ATTEMPTS} publications in a row lost their race or "
        "found kstore's state moving; the next run completes it"
    )


def _checkpoint_if_due(
    store: Store, meta: TopicMetadata, snapshot: Snapshot, report: PublishReport
) -> None:
    """Every ``delta.checkpointInterval`` versions (Delta's default: 100), a Delta checkpoint
    and Delta's expired-log cleanup (``delta.logRetentionDuration``), written by ``deltalake``,
    as a Delta writer does: without them every publication and reader would replay every
    commit. The version is committed either way; a failure (no ``deltalake``, a store it cannot
    open) is reported, and the next due version tries again."""
    try:
        interval = int(snapshot.configuration.get("delta.checkpointInterval", "100"))
    except ValueError:
        interval = 100
    if report.version <= 0 or report.version % max(interval, 1):
        return
    try:
        from . import open_table

        table = open_table(store, meta.name, report.version)
        table.create_checkpoint()
        table.cleanup_metadata()
        report.checkpoint = True
    except Exception as exc:  # deltalake's own errors, or its absence: reported, not fatal
        report.checkpoint_error = f"{type(exc).__name__}: {exc}"


def kstore_view(
    store: Store, meta: TopicMetadata
) -> dict[str, tuple[int, dict[int, PartitionState]]]:
    """Each kstore log of the topic, by its Delta application id: (the log's version, the
    states of its partitions). Layout 3: one per topic log; layout 2: one per partition."""
    logs: dict[str, tuple[int, dict[int, PartitionState]]] = {}
    if meta.layout == 3:
        topic_logs = store.topic_logs(meta.name, meta)
        for topic_log in topic_logs:
            shared = topic_log.state()
            parts = {
                p: shared.partition(p)
                for p in range(meta.partitions)
                if log_index(p, meta.commit_logs) == topic_log.index
            }
            logs[app_id(meta, f"log-{topic_log.index}")] = (shared.version, parts)
        return logs
    for p in range(meta.partitions):
        own = store.partition_state(meta.name, p, meta)  # the manifest only, no data libraries
        logs[app_id(meta, f"partition-{p}")] = (own.version, {p: own})
    return logs


def app_id(meta: TopicMetadata, log: str) -> str:
    """The Delta application id of one kstore log of a topic incarnation."""
    return f"kstore-{meta.topic_id}-{log}"


def is_table_file(seg: Segment) -> bool:
    """A segment a Delta table can name: a whole per-partition Parquet file (every Parquet
    segment is sparse: it has its ``offset`` column). No pyarrow here: ``describe`` and vacuum
    use this module without the data libraries."""
    return seg.format == "parquet" and seg.byte_range is None


def published_segments(state: PartitionState) -> list[Segment]:
    """The segments of a partition that its table holds: the live segments from the log start
    that are Parquet files below the last stable offset, up to the first one that is not (so
    that the table holds every record of the partition below one offset, and the tail is read
    from kstore from there)."""
    out: list[Segment] = []
    lso = state.last_stable_offset
    for seg in state.segments:
        # Below the LSO no transaction is open (a committed one's tag stays on its segment).
        if not is_table_file(seg) or seg.last_offset >= lso:
            break
        out.append(seg)
    return out


def desired_files(
    meta: TopicMetadata, states: Mapping[int, PartitionState]
) -> dict[int, list[tuple[str, Segment]]]:
    """Partition -> (path relative to the table root, segment) of every file the table must
    hold."""
    return {
        p: [(f"{p}/{seg.path}", seg) for seg in published_segments(state)]
        for p, state in sorted(states.items())
    }


def timestamp_type(meta: TopicMetadata) -> int:
    return 1 if meta.effective_config["message.timestamp.type"] == "LogAppendTime" else 0


def _actions(
    meta: TopicMetadata,
    snapshot: Snapshot,
    wanted: dict[int, list[tuple[str, Segment]]],
    logs: dict[str, tuple[int, dict[int, PartitionState]]],
    report: PublishReport,
    now_ms: int | None,
) -> list[dict[str, Any]] | None:
    """The actions of the next version, or None when the table is up to date."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    kind = str(timestamp_type(meta))
    schema = table_schema(meta)
    head: list[dict[str, Any]] = []
    if snapshot.metadata is None:
        head.append({"protocol": table_protocol(schema)})
        head.append(
            {
                "metaData": {
                    "id": str(uuid.uuid4()),
                    "name": meta.name,
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": json.dumps(schema, separators=(",", ":")),
                    "partitionColumns": PARTITION_COLUMNS,
                    "configuration": {},
                    "createdTime": now,
                }
            }
        )
    elif json.loads(snapshot.schema_string or "null") != schema:
        check_evolution(json.loads(snapshot.schema_string or "{}"), schema, meta.name)
        changed = copy.deepcopy(snapshot.metadata)
        changed["schemaString"] = json.dumps(schema, separators=(",", ":"))
        protocol = table_protocol(schema)
        if protocol != {k: v for k, v in (snapshot.protocol or {}).items() if k in protocol}:
            head.append({"protocol": protocol})
        head.append({"metaData": changed})
    adds: list[dict[str, Any]] = []
    keep: set[str] = set()
    for p, files in wanted.items():
        values = {"partition": str(p), "timestampType": kind}
        for path, seg in files:
            keep.add(path)
            present = snapshot.files.get(path)
            if present is not None and present.partition_values == values:
                continue
            adds.append(
                {
                    "add": {
                        "path": path,
                        "partitionValues": values,
                        "size": seg.size_bytes,
                        "modificationTime": seg.created_ms,
                        "dataChange": True,
                        "stats": json.dumps({"numRecords": seg.record_count}),
                    }
                }
            )
            report.bytes_covered += seg.size_bytes
    removes = [
        {
            "remove": {
                "path": f.path,
                "deletionTimestamp": now,
                "dataChange": True,
                "extendedFileMetadata": True,
                "partitionValues": f.partition_values,
                "size": f.size,
            }
        }
        for path, f in sorted(snapshot.files.items())
        if path not in keep
    ]
    if not head and not adds and not removes:
        return None
    report.files_added, report.files_removed = len(adds), len(removes)
    txns = [
        {"txn": {"appId": app, "version": version, "lastUpdated": now}}
        for app, (version, _) in sorted(logs.items())
        if version >= 0 and snapshot.txns.get(app) != version
    ]
    info: dict[str, Any] = {
        "timestamp": now,
        "operation": "KSTORE PUBLISH",
        "operationParameters": {"topic": meta.name},
        "isBlindAppend": False,
        "engineInfo": "kstore",
        "kstore": {
            "topic": meta.name,
            "topicId": meta.topic_id,
            "covered": {str(p): end for p, end in sorted(report.covered.items())},
        },
    }
    if snapshot.version >= 0:
        info["readVersion"] = snapshot.version
    return [{"commitInfo": info}, *head, *txns, *removes, *adds]


# -- schema ---------------------------------------------------------------------------------------


def table_schema(meta: TopicMetadata) -> dict[str, Any]:
    """The table's schema in Delta's JSON form (which is Spark's): Kafka's columns, in the
    Kafka source's order without ``topic``; a typed topic's key type and value struct (every
    field nullable, as its segments store them)."""
    key: Any = "binary"
    value: Any = "binary"
    if meta.schemas:
        entry = meta.schemas[-1]
        key = entry.get("key") or "binary"
        value = _nullable(entry["value"])
    fields = [
        ("key", key),
        ("value", value),
        ("partition", "integer"),
        ("offset", "long"),
        ("timestamp", "timestamp"),
        ("timestampType", "integer"),
        ("headers", _HEADERS),
    ]
    return {
        "type": "struct",
        "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in fields],
    }


def _nullable(declared: Any) -> Any:
    """A Spark JSON type with every field, element and map value nullable (typed segments store
    them so; NOT NULL is checked by kstore's writers)."""
    if isinstance(declared, dict):
        out = {k: _nullable(v) for k, v in declared.items()}
        for flag in ("nullable", "containsNull", "valueContainsNull"):
            if flag in out:
                out[flag] = True
        if "metadata" in out and not isinstance(out["metadata"], dict):
            out["metadata"] = {}
        return out
    if isinstance(declared, list):
        return [_nullable(v) for v in declared]
    return declared


def table_protocol(schema: dict[str, Any]) -> dict[str, Any]:
    """Delta's reader 1 / writer 2, or with the ``timestampNtz`` feature when a typed topic has
    a ``timestamp_ntz`` field (Delta requires it for that type)."""
    if "timestamp_ntz" in json.dumps(schema):
        return {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["timestampNtz"],
            "writerFeatures": ["timestampNtz"],
        }
    return {"minReaderVersion": 1, "minWriterVersion": 2}


def _leaves(schema: Any, prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    if isinstance(schema, dict):
        kind = schema.get("type")
        if kind == "struct":
            for f in schema.get("fields", []):
                out.update(_leaves(f["type"], f"{prefix}.{f['name']}" if prefix else f["name"]))
        elif kind == "array":
            out.update(_leaves(schema.get("elementType"), f"{prefix}[]"))
        elif kind == "map":
            out.update(_leaves(schema.get("keyType"), f"{prefix}{{key}}"))
            out.update(_leaves(schema.get("valueType"), f"{prefix}{{value}}"))
    else:
        out[prefix] = str(schema)
    return out


def check_evolution(old: dict[str, Any], new: dict[str, Any], topic: str) -> None:
    """A typed topic's schema may gain nullable fields (Delta readers read them as null from
    older files); a widened type cannot be expressed without Delta's ``typeWidening`` feature,
    which not every reader has, so publication refuses it."""
    before, after = _leaves(old), _leaves(new)
    for path, kind in before.items():
        if path in after and after[path] != kind:
            raise DeltaLogError(
                f"table of topic {topic!r}: field {path!r} changed type from {kind} to "
                f"{after[path]}; a Delta table cannot widen a column without the typeWidening "
                "feature (see docs/TYPED_TOPICS.md)"
            )


# -- what other parts of kstore call ----------------------------------------------------------


def referenced_paths(
    storage: Storage, topic: str, topic_id: str, now_ms: int
) -> dict[int, set[str]]:
    """Vacuum's hook: partition -> segment paths (relative to the partition directory) that a
    retained version of the topic incarnation's Delta table still names: the files of its
    newest version, and the files it removed less than ``delta.deletedFileRetentionDuration``
    before ``now_ms`` (Delta's own rule for what its VACUUM may delete). Empty when the
    incarnation has no table."""
    root = topic_data_dir(topic, topic_id)
    snapshot = read_snapshot(storage, root)
    if snapshot.version < 0:
        return {}
    retention = deleted_file_retention_ms(snapshot)
    held: dict[int, set[str]] = {}
    kept = [
        *snapshot.files.values(),
        *(
            f
            for f in snapshot.removed.values()
            if f.deletion_ms is None or now_ms - f.deletion_ms < retention
        ),
    ]
    for f in kept:
        head, sep, rest = f.path.partition("/")
        if sep and head.isdigit():
            held.setdefault(int(head), set()).add(rest)
    return held


def publish_after_job(
    store: Store, topics: Iterable[str], progress: Any = None
) -> list[tuple[str, str]]:
    """The maintenance jobs' hook: publish every topic of ``topics`` whose ``table.format``
    is ``delta``. Returns (topic, error) for each publication that failed (the next one
    completes it)."""
    failed: list[tuple[str, str]] = []
    for topic in sorted(set(topics)):
        try:
            if not enabled(store.topic(topic).effective_config):
                continue
            report = publish_table(store, topic)
        except KStoreError as exc:
            failed.append((topic, f"{type(exc).__name__}: {exc}"))
            continue
        if progress is not None:
            what = (
                f"version {report.version}: +{report.files_added} -{report.files_removed} files"
                if report.committed
                else f"up to date at version {report.version}"
            )
            progress(f"[publish] {topic}: {what}")
    return failed


def newest_version(store: Store, meta: TopicMetadata) -> int:
    """The newest version of the topic's table (-1: none), from a listing of its log."""
    from .deltalog import _COMMIT

    versions = [
        int(m.group(1))
        for info in store.storage.list_dir(f"{table_dir(meta)}/{DELTA_LOG}")
        if (m := _COMMIT.match(info.name))
    ]
    return max(versions, default=-1)
