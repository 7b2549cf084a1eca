"""The Spark examples: SQL over a topic, a streaming copy, a CDC latest-state table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.test_examples import load

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


def test_spark_sql(spark: Any, tmp_path: Path) -> None:
    rows = load("spark_sql").main(spark, (tmp_path / "store").as_uri())
    assert sum(views for _, views in rows) == 2_000
    assert len(rows) == 7


def test_spark_stream_copy(spark: Any, tmp_path: Path) -> None:
    assert load("spark_stream_copy").main(spark, tmp_path) == 1_500


def test_cdc_latest_state(spark: Any, tmp_path: Path) -> None:
    state = load("cdc_latest_state").main(spark, (tmp_path / "store").as_uri())
    assert len(state) == 90  # 100 customers, 10 deleted
    assert {row["version"] for row in state.values()} == {2}
