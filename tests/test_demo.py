"""`make demo`'s entry point, at a smaller size, with its results checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from kstore import Producer, Store
from tests.test_examples import load

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


# The first test of its Spark group: its time includes the session's start (37-113 s in
# clean-clone CI runs, a few seconds on a quiet machine).
@pytest.mark.timeout(600)
def test_demo(spark: Any, tmp_path: Path) -> None:
    demo = load("demo")
    # What an earlier run left, which a re-run must start clean of (this replaces a second
    # run, a minute of Spark): a store whose topic exists (creating it again would fail) and
    # holds clicks of its own, and a Delta table of counts.
    stale = Store((tmp_path / "demo" / "store").as_uri())
    stale.create_topic("clicks", 2)
    with Producer(stale, acks="all") as producer:
        for i in range(500):
            producer.send("clicks", key=b"old", value=b"/stale/%d" % i)
    write_deltalake(str(tmp_path / "demo" / "delta"), pa.table({"count": [500]}))
    results = demo.run(tmp_path / "demo", clicks=6_000, spark=spark)
    assert results.delta_total == results.clicks == 6_000  # every click counted exactly once
    assert results.compacted_records == results.profile_keys_live  # one record per live key
    assert results.lag_seen[-1] == 0
    assert max(results.lag_seen) > 0
    assert 0 < results.replayed < results.clicks  # only the last hour replayed
    fresh = Store((tmp_path / "demo" / "store").as_uri(), create=False)
    assert len(fresh.describe_topic("clicks").partitions) == 8  # the stale topic is gone
