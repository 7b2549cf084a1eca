"""This version writes layout 3 only: a layout-2 topic (tests/layout2.py, as an older version
wrote it) is read, but every writer refuses it and names ``kstore topics upgrade``; creating
one is refused the same way."""

from __future__ import annotations

from typing import Any

import pytest
from kstore.compaction import merge_segments, run_compaction
from kstore.retention import run_retention, vacuum

from kstore import Store
from kstore.errors import InvalidConfigurationError, LayoutUpgradeRequiredError
from kstore.upgrade import upgrade_topic
from tests import layout2
from tests.test_jobs_support import Target, open_store, rows

UPGRADE = "`kstore topics upgrade old`"
HOUR = 3_600_000


def files(store: Store) -> dict[str, bytes]:
    fs = store.storage.fs
    return {path: bytes(fs.cat_file(path)) for path in fs.find(store.storage.full_path(""))}


def old_topic(store: Store) -> None:
    """Topic "old": two partitions of layout 2, every job due (compaction, retention)."""
    config = {
        "cleanup.policy": "compact,delete",
        "min.cleanable.dirty.ratio": 0.0,
        "retention.ms": HOUR,
    }
    layout2.create_topic(store, "old", 2, config)
    for p in range(2):
        for n in range(2):
            layout2.append(store, "old", p, layout2.records([b"v%d" % n], [b"k"]))


def test_create_topic_refuses_layout_2_and_names_the_upgrade(memory_store: Target) -> None:
    store = open_store(memory_store)
    with pytest.raises(InvalidConfigurationError, match="kstore topics upgrade"):
        store.create_topic("old", 1, layout=2)
    assert not store.topic_exists("old")
    with pytest.raises(InvalidConfigurationError, match="layout must be 3"):
        store.create_topic("old", 1, layout=4)
    assert store.create_topic("new", 1).layout == 3


@pytest.mark.parametrize(
    "job",
    [
        lambda where, now: run_compaction(None, *where, verbose=False, now_ms=now),
        lambda where, now: merge_segments(None, *where, verbose=False),
        lambda where, now: run_retention(None, *where, verbose=False, now_ms=now),
        lambda where, now: vacuum(None, *where, verbose=False, now_ms=now),
    ],
    ids=["compaction", "merge", "retention", "vacuum"],
)
def test_the_jobs_refuse_a_layout_2_topic_and_name_the_upgrade(
    local_store: Target, job: Any
) -> None:
    store = open_store(local_store)
    old_topic(store)
    before = files(store)
    summary = job(local_store, layout2.BASE_US // 1000 + 2 * HOUR)
    assert len(summary.errors) == 2  # one row per partition, nothing changed
    for row in summary.errors:
        assert "LayoutUpgradeRequiredError" in row.reason
        assert UPGRADE in row.reason
    assert files(store) == before


def test_delete_records_and_appends_refuse_a_layout_2_topic(memory_store: Target) -> None:
    store = open_store(memory_store)
    old_topic(store)
    part = store.partition("old", 0)
    with pytest.raises(LayoutUpgradeRequiredError, match=UPGRADE):
        part.delete_records(1)
    with pytest.raises(LayoutUpgradeRequiredError, match=UPGRADE):
        part.append(layout2.records([b"late"]))
    assert [v for _, _, v in rows(part)] == [b"v0", b"v1"]  # read as before
    upgrade_topic(store, "old")
    upgraded = Store(*memory_store).partition("old", 0)
    assert upgraded.delete_records(1) == 1  # in layout 3 it is a writer's topic again
    assert [v for _, _, v in rows(upgraded)] == [b"v1"]


def test_an_expired_transaction_over_a_layout_2_topic_is_reported_not_fenced(
    memory_store: Target,
) -> None:
    from kstore.retention import abort_expired_transactions

    store = open_store(memory_store)
    old_topic(store)
    layout2.Transactional(store, "tx").send("old", 1, layout2.records([b"open"]))
    before = files(store)
    later = layout2.BASE_US // 1000 + 10 * 365 * 24 * HOUR  # long past its timeout
    report = abort_expired_transactions(store, now_ms=later)
    (error,) = report.errors
    assert UPGRADE in error
    assert files(store) == before  # not even the fence
    upgrade_topic(store, "old")
    (item,) = abort_expired_transactions(Store(*memory_store), now_ms=later).expired
    assert item.outcome == "aborted"
