"""A topic as a Delta table (PROTOCOL.md 29): its merged and compacted Parquet segments,
published by reference in ``<topic incarnation>/_delta_log/``, zero-copy and exactly-once.

Python::

    from kstore.lakehouse import publish_table, open_table
    report = publish_table(store, "orders")            # or tail=True: merge the tail first
    table = open_table(store, "orders")                # a deltalake.DeltaTable
    table.to_pyarrow_table()

Topics with ``table.format=delta`` are published by the merge, compaction and retention jobs
after their commits; ``kstore topics publish TOPIC [--tail]`` does it on demand. A commit
needs kstore's core only; ``deltalake`` is imported lazily, by :func:`open_table` (readers, and
the Delta checkpoint due every ``delta.checkpointInterval`` versions).
"""

from __future__ import annotations

from typing import Any

from kstore.storage import Storage
from kstore.store import Store

from .deltalog import DELTA_LOG, DeltaLogError, Snapshot, read_snapshot
from .publish import (
    PARTITION_COLUMNS,
    TABLE_FORMAT,
    PublishReport,
    enabled,
    newest_version,
    publish_after_job,
    publish_table,
    published_segments,
    referenced_paths,
    table_dir,
    table_schema,
    table_url,
)

__all__ = [
    "DELTA_LOG",
    "PARTITION_COLUMNS",
    "TABLE_FORMAT",
    "DeltaLogError",
    "PublishReport",
    "Snapshot",
    "delta_storage_options",
    "enabled",
    "newest_version",
    "open_table",
    "publish_after_job",
    "publish_table",
    "published_segments",
    "read_snapshot",
    "referenced_paths",
    "table_dir",
    "table_schema",
    "table_url",
]


def delta_storage_options(storage: Storage) -> dict[str, str]:
    """The storage options a Delta reader (delta-rs, Polars, DuckDB's delta extension) needs
    for this store, from kstore's s3fs options: credentials, endpoint and region."""
    return storage.object_store_options()


def open_table(store: Store, topic: str, version: int | None = None) -> Any:
    """The topic's table as a ``deltalake.DeltaTable`` (``version``: time travel)."""
    from deltalake import DeltaTable

    meta = store.topic(topic)
    storage = store.storage
    uri = storage.object_store_url(table_dir(meta)) or table_url(store, meta)
    return DeltaTable(uri, version=version, storage_options=delta_storage_options(storage) or None)
