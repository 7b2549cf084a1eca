"""Helpers shared by the Spark tests (tests/test_spark_*.py); no tests of its own.

The Spark tests share one local session (the ``spark`` fixture in conftest.py) and run on the
local disk, with the essential ones repeated on S3 (SeaweedFS).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pyarrow as pa
import pytest
from kstore.spark_ext.stores import forget_stores

from kstore import Store
from kstore.log import Action
from kstore.partition import PartitionState
from kstore.segments import HEADERS_TYPE, RECORD_SCHEMA, TIMESTAMP_TYPE

BASE_MS = 1_700_000_000_000

# Both backends, for the tests that must hold on S3 too.
BACKENDS = ["local_store_url", pytest.param("seaweed_bucket_url", marks=pytest.mark.s3)]


def open_store(target: tuple[str, dict[str, Any]]) -> Store:
    url, options = target
    forget_stores()  # a fresh store per test: no cached state from an earlier test
    return Store(url, options)


def source_options(target: tuple[str, dict[str, Any]], **extra: Any) -> dict[str, str]:
    """Data source options for a store fixture: ``store`` plus ``storageOptions`` as JSON."""
    url, options = target
    out = {"store": url}
    if options:
        out["storageOptions"] = json.dumps(options)
    out.update({k: str(v) for k, v in extra.items()})
    return out


def records(
    values: Sequence[bytes],
    *,
    keys: Sequence[bytes | None] | None = None,
    timestamps_ms: Sequence[int] | None = None,
    headers: Sequence[list[tuple[str, bytes]] | None] | None = None,
) -> pa.Table:
    n = len(values)
    stamps = timestamps_ms if timestamps_ms is not None else [BASE_MS + i for i in range(n)]
    header_rows = headers if headers is not None else [None] * n
    return pa.Table.from_arrays(
        [
            pa.array(keys if keys is not None else [None] * n, pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([t * 1000 for t in stamps], pa.int64()).cast(TIMESTAMP_TYPE),
            pa.array(
                [
                    [{"key": k, "value": v} for k, v in h] if h is not None else None
                    for h in header_rows
                ],
                HEADERS_TYPE,
            ),
        ],
        schema=RECORD_SCHEMA,
    )


def append(
    store: Store,
    topic: str,
    partition: int,
    values: Sequence[bytes],
    **kwargs: Any,
) -> int:
    """Append one segment to a partition; returns its base offset."""
    result = store.partition(topic, partition).append(records(values, **kwargs), durable=False)
    return result.base_offset


def topic_rows(store: Store, topic: str) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(partition, offset, key, value) of every record of a topic, read with the core API."""
    meta = store.topic(topic)
    out = []
    for p in range(meta.partitions):
        part = store.partition(topic, p, meta)
        state = part.state()
        if state.end_offset == state.start_offset:
            continue
        for batch in part.read(state.start_offset, state=state):
            for row in batch.to_pylist():
                out.append((p, row["offset"], row["key"], row["value"]))
    return out


def topic_values(store: Store, topic: str) -> list[bytes]:
    return sorted(v for _, _, _, v in topic_rows(store, topic) if v is not None)


def segment_files(store: Store, topic: str) -> tuple[set[str], set[str]]:
    """(files present in the partitions' segment directories, files the manifests reference)."""
    meta = store.topic(topic)
    present: set[str] = set()
    live: set[str] = set()
    for p in range(meta.partitions):
        part = store.partition(topic, p, meta)
        present |= {
            f"{p}/segments/{info.name}"
            for info in store.storage.list_dir(f"{part.directory}/segments")
            if not info.name.startswith(".")
        }
        live |= {f"{p}/{s.path}" for s in part.state().segments}
    return present, live


def apply_retention(store: Store, topic: str, partition: int, segments: int) -> int:
    """Simulate retention: drop the first ``segments`` segments of a partition (a ``logStart``
    action advancing the log start offset and a ``remove`` of each). Returns the new start."""
    part = store.partition(topic, partition)

    def build(state: PartitionState) -> list[Action]:
        gone = state.segments[:segments]
        now = int(time.time() * 1000)
        actions: list[Action] = [{"logStart": {"offset": gone[-1].last_offset + 1}}]
        actions.extend({"remove": {"path": s.path, "deletionTimestamp": now}} for s in gone)
        return actions

    result = part.commit_actions(build, operation="RETENTION")
    assert result is not None
    return result.state.start_offset


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def arrow_rows(
    df: Any, order: Iterable[str] = ("topic", "partition", "offset")
) -> list[dict[str, Any]]:
    """The DataFrame's rows as dicts (through Arrow, so timestamps stay UTC and exact)."""
    table = df.toArrow()
    keys = [k for k in order if k in table.column_names]
    rows: list[dict[str, Any]] = table.to_pylist()
    return sorted(rows, key=lambda r: tuple(r[k] for k in keys))
