"""The Delta log of a topic's table: reading a snapshot and committing a version.

The commit files are written here, through kstore's :class:`~kstore.storage.Storage`, rather
than with ``deltalake``'s ``create_write_transaction`` (which can add and remove given files):
a Delta commit is a put-if-absent of ``_delta_log/<version>.json`` (Delta's PROTOCOL.md,
"Commit Atomicity"), and Storage's put-if-absent is the one kstore's own logs use on every
backend it writes to (local ``link``, S3 ``If-None-Match``, ``memory://``, wrapped
filesystems), with its deadlines and request counting. delta-rs would need its own credentials
and, on S3, a locking provider or conditional-put settings, and it rebases a losing commit onto
the winner by itself, where the publisher must re-read kstore's state instead. ``deltalake``
serves readers, and writes the periodic checkpoints (``publish.py``).

Reading understands what a Delta writer may leave: JSON commits and classic checkpoints
(``<v>.checkpoint.parquet`` or multi-part ``<v>.checkpoint.<i>.<n>.parquet``, as
``DeltaTable.create_checkpoint`` writes them), read with pyarrow.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from kstore.errors import CorruptLogError, KStoreError
from kstore.log import compact_json
from kstore.names import DELTA_LOG_DIR
from kstore.storage import Storage

DELTA_LOG = DELTA_LOG_DIR
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d+)\.(\d+))?\.parquet$")
# Delta's default for delta.deletedFileRetentionDuration (and its VACUUM's threshold).
DEFAULT_DELETED_FILE_RETENTION_MS = 7 * 24 * 3600 * 1000
_UNITS_MS = {
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 7 * 86_400_000,
}


class DeltaLogError(KStoreError):
    """The table's Delta log cannot be read or does not look like one kstore can extend."""


@dataclass
class DeltaFile:
    """A file of the table: an ``add`` (live) or a ``remove`` (a tombstone)."""

    path: str  # relative to the table root, as the log records it (URL-decoded)
    partition_values: dict[str, str | None]
    size: int
    deletion_ms: int | None = None  # removes only: deletionTimestamp


@dataclass
class Snapshot:
    """The table as of ``version`` (-1: no table yet)."""

    version: int = -1
    files: dict[str, DeltaFile] = field(default_factory=dict)
    removed: dict[str, DeltaFile] = field(default_factory=dict)
    txns: dict[str, int] = field(default_factory=dict)
    metadata: dict[str, Any] | None = None
    protocol: dict[str, Any] | None = None

    @property
    def schema_string(self) -> str | None:
        return None if self.metadata is None else self.metadata.get("schemaString")

    @property
    def configuration(self) -> dict[str, str]:
        conf = (self.metadata or {}).get("configuration") or {}
        return {str(k): str(v) for k, v in conf.items() if v is not None}

    def apply(self, name: str, body: dict[str, Any]) -> None:
        if name == "add":
            path = _decode_path(body)
            self.files[path] = DeltaFile(
                path, dict(body.get("partitionValues") or {}), int(body.get("size") or 0)
            )
            self.removed.pop(path, None)
        elif name == "remove":
            path = _decode_path(body)
            self.files.pop(path, None)
            stamp = body.get("deletionTimestamp")
            self.removed[path] = DeltaFile(
                path,
                dict(body.get("partitionValues") or {}),
                int(body.get("size") or 0),
                int(stamp) if isinstance(stamp, int) else 0,
            )
        elif name == "txn":
            self.txns[str(body["appId"])] = int(body["version"])
        elif name == "metaData":
            self.metadata = body
        elif name == "protocol":
            self.protocol = body


def _decode_path(body: dict[str, Any]) -> str:
    from urllib.parse import unquote

    path = body.get("path")
    if not isinstance(path, str) or not path:
        raise DeltaLogError(f"a file action without a path: {body!r}")
    return unquote(path)


def deleted_file_retention_ms(snapshot: Snapshot) -> int:
    """``delta.deletedFileRetentionDuration`` of the table, in ms (Delta's default: 1 week)."""
    text = snapshot.configuration.get("delta.deletedFileRetentionDuration")
    if text is None:
        return DEFAULT_DELETED_FILE_RETENTION_MS
    return parse_interval_ms(text, "delta.deletedFileRetentionDuration")


def parse_interval_ms(text: str, name: str) -> int:
    """A Delta interval (``interval 7 days``, ``1 week``, ``36 hours``) in ms."""
    words = text.strip().lower().split()
    if words and words[0] == "interval":
        words = words[1:]
    if len(words) == 2 and words[0].isdigit():
        unit = words[1].rstrip("s")
        if unit in _UNITS_MS:
            return int(words[0]) * _UNITS_MS[unit]
    raise DeltaLogError(f"table property {name}: cannot read the interval {text!r}")


def read_snapshot(storage: Storage, table_dir: str) -> Snapshot:
    """The newest version of the table rooted at ``table_dir`` (relative to the store root):
    the newest checkpoint, if any, then every later commit in order."""
    log_dir = f"{table_dir}/{DELTA_LOG}"
    commits: dict[int, str] = {}
    checkpoints: dict[int, dict[int, list[str]]] = {}  # version -> parts -> names
    for info in storage.list_dir(log_dir):
        if match := _COMMIT.match(info.name):
            commits[int(match.group(1))] = info.name
        elif match := _CHECKPOINT.match(info.name):
            parts = int(match.group(3) or 1)
            checkpoints.setdefault(int(match.group(1)), {}).setdefault(parts, []).append(info.name)
    snapshot = Snapshot()
    complete = sorted(
        (v for v, by_parts in checkpoints.items() if any(len(n) == p for p, n in by_parts.items())),
        reverse=True,
    )
    start = 0
    if complete:
        base = complete[0]
        names = next(n for p, n in checkpoints[base].items() if len(n) == p)
        _read_checkpoint(storage, log_dir, sorted(names), snapshot)
        snapshot.version = base
        start = base + 1
    if not commits and snapshot.version < 0:
        return snapshot
    newest = max(commits, default=snapshot.version)
    wanted = list(range(start, newest + 1))
    missing = [v for v in wanted if v not in commits]
    if missing:
        raise DeltaLogError(
            f"{storage.display_url}/{log_dir}: commit {missing[0]} is missing and no checkpoint "
            "covers it"
        )
    data = storage.read_many([f"{log_dir}/{commits[v]}" for v in wanted])
    for v in wanted:
        path = f"{log_dir}/{commits[v]}"
        raw = data.get(path)
        if raw is None:
            raise DeltaLogError(f"{storage.display_url}/{path} vanished while read")
        for name, body in decode_commit(raw, path):
            snapshot.apply(name, body)
        snapshot.version = v
    return snapshot


def decode_commit(raw: bytes, where: str) -> list[tuple[str, dict[str, Any]]]:
    """The actions of a Delta commit file (newline-delimited JSON, one action per line)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError as exc:
            raise DeltaLogError(f"{where} line {number}: not JSON ({exc})") from None
        if not isinstance(action, dict) or len(action) != 1:
            raise DeltaLogError(f"{where} line {number}: not one action")
        ((name, body),) = action.items()
        if isinstance(body, dict):
            out.append((str(name), body))
    return out


def _read_checkpoint(storage: Storage, log_dir: str, names: list[str], snapshot: Snapshot) -> None:
    import io

    import pyarrow.parquet as pq

    paths = [f"{log_dir}/{n}" for n in names]
    data = storage.read_many(paths)
    for path in paths:
        raw = data.get(path)
        if raw is None:
            raise DeltaLogError(f"{storage.display_url}/{path} vanished while read")
        table = pq.read_table(io.BytesIO(raw))
        for name in ("protocol", "metaData", "txn", "add", "remove"):
            if name not in table.column_names:
                continue
            for body in table.column(name).to_pylist():
                if body is None:
                    continue
                if "partitionValues" in body and isinstance(body["partitionValues"], list):
                    body["partitionValues"] = dict(body["partitionValues"])  # a map, as pairs
                if name == "metaData":
                    # Maps come back as lists of pairs; a later metaData is written from this.
                    if isinstance(body.get("configuration"), list):
                        body["configuration"] = dict(body["configuration"])
                    fmt = body.get("format") or {}
                    if isinstance(fmt.get("options"), list):
                        fmt["options"] = dict(fmt["options"])
                    body = {k: v for k, v in body.items() if v is not None}
                snapshot.apply(name, body)


def commit(storage: Storage, table_dir: str, version: int, actions: list[dict[str, Any]]) -> int:
    """Write ``version`` of the table with ``actions`` (commitInfo first) by put-if-absent.

    The bytes written when this call's commit is the one there; 0 when another writer took
    the version. An answer lost on the way (the write may have landed) is settled by reading the
    file back: each commit carries a unique ``txnId`` in its ``commitInfo``."""
    token = uuid.uuid4().hex
    info = actions[0].get("commitInfo")
    if not isinstance(info, dict):
        raise ValueError("a commit starts with its commitInfo")
    info["txnId"] = token
    body = "\n".join(map(compact_json, actions)) + "\n"
    path = f"{table_dir}/{DELTA_LOG}/{version:020d}.json"
    data = body.encode()
    try:
        storage.put_if_absent(path, data)
    except FileExistsError:
        return len(data) if _ours(storage, path, token) else 0
    except KStoreError:
        # The outcome is unknown: the file decides (absent: this attempt failed, and the
        # caller retries after a fresh read, as after a lost race).
        return len(data) if _ours(storage, path, token) else 0
    return len(data)


def _ours(storage: Storage, path: str, token: str) -> bool:
    raw = storage.read_if_exists(path)
    if raw is None:
        return False
    try:
        for name, body in decode_commit(raw, path):
            if name == "commitInfo":
                return bool(body.get("txnId") == token)
    except DeltaLogError:
        raise CorruptLogError(f"{storage.display_url}/{path} is not a Delta commit") from None
    return False
