"""The maintenance service's Spark form: the driver plans, executors run the due tasks (one
Spark task per topic) through the same run_item as the process form."""

from __future__ import annotations

from typing import Any

import pytest
from kstore.maintenance import run_due
from kstore.maintenance.main import main

from kstore import Store
from tests.test_jobs_support import Target, append, now_ms, rows

pytestmark = pytest.mark.spark

HOUR = 3_600_000


def test_the_service_on_spark(
    spark: Any, local_store: Target, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Store(*local_store)
    now = now_ms()
    store.create_topic("logs", 2, {"retention.ms": HOUR})
    store.create_topic("state", 1, {"cleanup.policy": "compact"})
    for p in range(2):
        append(store.partition("logs", p), [b"a"], [b"1"], now - 2 * HOUR)
        append(store.partition("logs", p), [b"b"], [b"2"], now)
    append(store.partition("state", 0), [b"k", b"k"], [b"1", b"2"], now - HOUR)

    runs = run_due(store, spark=spark)
    done = {(r.topic, r.task): r for r in runs}
    assert set(done) == {(t, task) for t in ("logs", "state") for task in ("vacuum",)} | {
        ("logs", "retention"),
        ("state", "compaction"),
        *((None, task) for task in ("abort-transactions", "purge-deleted-topics", "prune-logs")),
    }
    assert done[("logs", "retention")].outcome == "ok"
    assert done[("logs", "retention")].records == 2
    assert done[("state", "compaction")].records == 1
    for p in range(2):
        assert rows(store.partition("logs", p)) == [(1, b"b", b"2")]
    assert rows(store.partition("state", 0)) == [(1, b"k", b"2")]

    # The spark-submit entry point, with --spark, on the same session: nothing is due now.
    assert main(["--store", local_store[0], "--once", "--spark"]) == 0
    assert "[maintain]" not in capsys.readouterr().out
