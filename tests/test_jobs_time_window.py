"""Merging and compaction never make retention late: a rewritten segment covers at most the
time window (``segment.ms``, at most a tenth of ``retention.ms``), so retention removes the
same records whatever order the jobs run in (PROTOCOL.md 22.4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kstore.compaction import merge_segments, plan_merge, run_compaction
from kstore.compaction.cleaner import time_window_ms
from kstore.retention import run_retention

from kstore import Store
from kstore.config import effective
from tests.test_jobs_support import Target, append, open_store, rows

DAY = 86_400_000
NOW = 1_800_000_000_000  # the jobs' fixed clock
RETENTION = 7 * DAY
# Segments of records of these ages (ms before NOW): three past retention.ms, three within it,
# none near the deadline, so that the window (16.8 hours here) cannot change the outcome.
AGES = [10 * DAY, 10 * DAY, 9 * DAY, 8 * DAY, 3600_000, 600_000, 0]
PER_SEGMENT = 20
CONFIG = {
    "cleanup.policy": "compact,delete",
    "retention.ms": RETENTION,
    "min.cleanable.dirty.ratio": 0.0,
}

Job = Callable[[Any, Target], Any]


def _merge(spark: Any, where: Target) -> Any:
    return merge_segments(spark, *where, verbose=False, now_ms=NOW)


def _compact(spark: Any, where: Target) -> Any:
    return run_compaction(spark, *where, verbose=False, now_ms=NOW)


def _retain(spark: Any, where: Target) -> Any:
    return run_retention(spark, *where, verbose=False, now_ms=NOW)


ORDERS: dict[str, list[Job]] = {
    "merge-retain": [_merge, _retain],
    "retain-merge": [_retain, _merge, _retain],
    "compact-retain": [_compact, _retain],
    "retain-compact": [_retain, _compact, _retain],
    "compact-merge-retain": [_compact, _merge, _retain],
    "merge-compact-retain": [_merge, _compact, _retain],
}


def fill(store: Store) -> int:
    """The topic with one segment per age (unique keys: compaction drops nothing); returns the
    first offset retention must keep."""
    store.create_topic("events", 1, CONFIG)
    part = store.partition("events", 0)
    keep_from = 0
    for n, age in enumerate(AGES):
        keys = [b"k-%d-%d" % (n, i) for i in range(PER_SEGMENT)]
        base = append(part, keys, [b"v"] * PER_SEGMENT, NOW - age)
        if age > RETENTION:
            keep_from = base + PER_SEGMENT
    return keep_from


def survivors(store: Store) -> list[int]:
    return [offset for offset, _, _ in rows(store.partition("events", 0))]


@pytest.mark.parametrize("order", list(ORDERS))
def test_retention_keeps_the_same_records_whatever_order_the_jobs_run_in(
    order: str, local_store: Target
) -> None:
    store = open_store(local_store)
    keep_from = fill(store)
    for job in ORDERS[order]:
        summary = job(None, local_store)
        assert not summary.errors, summary.errors
    fresh = open_store(local_store)
    # Exactly the records younger than retention.ms remain, in every order: merging did not
    # fold expired segments into one with recent records (which left all 140 records).
    assert survivors(fresh) == list(range(keep_from, len(AGES) * PER_SEGMENT))
    assert fresh.partition("events", 0).state().log_start_offset == keep_from


def test_merged_segments_stay_within_the_window_and_still_merge_within_it(
    memory_store: Target,
) -> None:
    store = open_store(memory_store)
    fill(store)
    state = store.partition("events", 0).state()
    config = effective(CONFIG)
    window = time_window_ms(config)
    assert window == RETENTION // 10
    groups = plan_merge(state, config)
    # The two 10-day-old segments merge; the three recent ones (within an hour) merge; nothing
    # else does.
    assert [len(g) for g in groups] == [2, 3]
    for group in groups:
        span = max(s.max_timestamp_ms for s in group) - min(s.min_timestamp_ms for s in group)
        assert span <= window


def test_the_window_is_segment_ms_without_time_retention() -> None:
    assert time_window_ms(effective({"cleanup.policy": "compact", "segment.ms": 5000})) == 5000
    assert time_window_ms(effective({"retention.ms": -1, "segment.ms": 7})) == 7
    assert time_window_ms(effective({"retention.ms": 60_000})) == 6000
    assert time_window_ms(effective({"retention.ms": 60_000, "segment.ms": 100})) == 100


@pytest.mark.spark
def test_retention_after_merge_on_spark(spark: Any, local_store: Target) -> None:
    store = open_store(local_store)
    keep_from = fill(store)
    for job in ORDERS["compact-merge-retain"]:
        summary = job(spark, local_store)
        assert not summary.errors, summary.errors
    assert survivors(open_store(local_store)) == list(range(keep_from, len(AGES) * PER_SEGMENT))
