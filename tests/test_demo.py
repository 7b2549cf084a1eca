"""`make demo`'s entry point, at a smaller size, with its results checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.test_examples import load

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


# The first test of its Spark group: its 300 s include the session's start, which took 113 s
# in a clean-clone CI run beside the torture group's clients.
@pytest.mark.timeout(600)
def test_demo(spark: Any, tmp_path: Path) -> None:
    demo = load("demo")
    results = demo.run(tmp_path / "demo", clicks=6_000, spark=spark)
    assert results.delta_total == results.clicks == 6_000  # every click counted exactly once
    assert results.compacted_records == results.profile_keys_live  # one record per live key
    assert results.lag_seen[-1] == 0
    assert max(results.lag_seen) > 0
    assert 0 < results.replayed < results.clicks  # only the last hour replayed
    again = demo.run(tmp_path / "demo", clicks=1_000, spark=spark)  # re-running starts clean
    assert again.delta_total == 1_000
