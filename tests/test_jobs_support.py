"""Helpers shared by the maintenance-job tests (tests/test_jobs_*.py); no tests of its own."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest

from kstore import Store
from kstore.partition import Partition
from kstore.segments import TIMESTAMP_TYPE

# Local disk always; the essential tests again on S3 (SeaweedFS, a real object store).
BACKENDS = ["local_store", pytest.param("seaweed_store", marks=pytest.mark.s3)]

Target = tuple[str, dict[str, Any]]
Row = tuple[int, bytes | None, bytes | None]  # offset, key, value


def now_ms() -> int:
    return int(time.time() * 1000)


def open_store(target: Target) -> Store:
    url, options = target
    return Store(url, options)


def table(
    keys: Sequence[bytes | None], values: Sequence[bytes | None], ts_ms: int | Sequence[int]
) -> pa.Table:
    stamps = [ts_ms] * len(keys) if isinstance(ts_ms, int) else list(ts_ms)
    return pa.table(
        {
            "key": pa.array(list(keys), pa.binary()),
            "value": pa.array(list(values), pa.binary()),
            "timestamp": pa.array([t * 1000 for t in stamps], pa.int64()).cast(TIMESTAMP_TYPE),
        }
    )


def append(
    part: Partition,
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    ts_ms: int | Sequence[int],
) -> int:
    """Append one segment; returns its base offset."""
    return part.append(table(keys, values, ts_ms), durable=False).base_offset


def rows(part: Partition, start: int | None = None) -> list[Row]:
    """Every live record (offset, key, value), read through Partition.read (verified)."""
    state = part.state()
    out: list[Row] = []
    for batch in part.read(state.start_offset if start is None else start, state=state):
        for o, k, v in zip(
            batch.column("offset").to_pylist(),
            batch.column("key").to_pylist(),
            batch.column("value").to_pylist(),
            strict=True,
        ):
            out.append((o, k, v))
    return out


def latest_per_key(records: Sequence[Row]) -> list[Row]:
    """Kafka's compaction of ``records`` (all below the cleaned point): the highest offset of
    each key, every null-key record; in offset order."""
    latest: dict[bytes, Row] = {}
    kept: list[Row] = []
    for row in records:
        if row[1] is None:
            kept.append(row)
        else:
            latest[row[1]] = row
    return sorted([*kept, *latest.values()])


def segment_files(store: Store, part: Partition) -> set[str]:
    """Names in the partition's segments/ directory (what storage holds, live or not)."""
    return {info.name for info in store.storage.list_dir(f"{part.directory}/segments")}
