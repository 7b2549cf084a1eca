"""The Spark examples (examples/spark_*.py) run, and deliver exactly once across a crash."""

from __future__ import annotations

import importlib.util
import sys
from decimal import Decimal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.test_spark_support import append, open_store

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def events(local_store_url: Any) -> tuple[str, list[bytes]]:
    store = open_store(local_store_url)
    store.create_topic("events", 2)
    values = []
    for p in range(2):
        batch = [b"e-%d-%d" % (p, i) for i in range(150)]
        append(store, "events", p, batch, keys=[b"k%d" % (i % 5) for i in range(150)])
        values += batch
    return local_store_url[0], values


class SimulatedCrashError(Exception):
    """Stands for a driver failure between the sink's commit and Spark's commit log."""


def crash_after(write: Any, batch_to_fail: int) -> Any:
    def wrapped(batch: Any, batch_id: int) -> None:
        write(batch, batch_id)
        if batch_id == batch_to_fail:
            raise SimulatedCrashError(f"crash after writing batch {batch_id}")

    return wrapped


def test_delta_example_is_exactly_once_across_a_crash(
    spark: Any, events: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from deltalake import DeltaTable

    example = load_example("spark_to_delta")
    url, values = events
    table, checkpoint = str(tmp_path / "delta"), str(tmp_path / "checkpoint")
    real = example.delta_batch_writer
    monkeypatch.setattr(example, "delta_batch_writer", lambda t, a: crash_after(real(t, a), 1))
    with pytest.raises(Exception, match="crash after writing batch 1"):
        example.run(
            spark,
            store=url,
            topic="events",
            table=table,
            checkpoint=checkpoint,
            max_offsets_per_trigger=100,
        )
    assert DeltaTable(table).transaction_version("kstore-to-delta") == 1
    monkeypatch.setattr(example, "delta_batch_writer", real)
    # The restart replays batch 1 (already in the table: skipped), then batch 2.
    example.run(
        spark,
        store=url,
        topic="events",
        table=table,
        checkpoint=checkpoint,
        max_offsets_per_trigger=100,
    )
    rows = example.read_back(spark, table).collect()
    assert sorted(r.value.encode() for r in rows) == sorted(values)
    assert len({(r.partition, r.offset) for r in rows}) == len(values)
    assert DeltaTable(table).transaction_version("kstore-to-delta") == 2


def test_parquet_example_is_exactly_once_across_a_crash(
    spark: Any, events: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = load_example("spark_to_parquet")
    url, values = events
    output, checkpoint = str(tmp_path / "parquet"), str(tmp_path / "checkpoint")
    real = example.parquet_batch_writer
    monkeypatch.setattr(example, "parquet_batch_writer", lambda o: crash_after(real(o), 0))
    with pytest.raises(Exception, match="crash after writing batch 0"):
        example.run(
            spark,
            store=url,
            topic="events",
            output=output,
            checkpoint=checkpoint,
            max_offsets_per_trigger=200,
        )
    monkeypatch.setattr(example, "parquet_batch_writer", real)
    example.run(
        spark,
        store=url,
        topic="events",
        output=output,
        checkpoint=checkpoint,
        max_offsets_per_trigger=200,
    )
    rows = spark.read.parquet(output).collect()
    assert sorted(r.value.encode() for r in rows) == sorted(values)
    assert sorted(r.batch for r in rows) == [0] * 200 + [1] * 100


@pytest.mark.parametrize("name", ["spark_to_delta", "spark_to_parquet"])
def test_examples_run_as_documented(
    spark: Any, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert load_example(name).main([], spark=spark) == 0
    assert "1500 records in" in capsys.readouterr().out


def test_typed_orders(spark: Any, tmp_path: Path) -> None:
    result = load_example("typed_orders").main(tmp_path.as_uri(), spark)
    assert "field 'id'" in result["refused"]
    values = result["values"]
    assert len(values) == 31
    assert sorted(v["id"] for v in values) == list(range(31))
    old = next(v for v in values if v["id"] == 0)
    assert old["channel"] is None
    assert str(old["amount"]) == "0.99"
    new = next(v for v in values if v["id"] == 30)
    assert new["channel"] == "web"
    assert result["totals"] == {
        f"c{k}": sum((Decimal(i) + Decimal("0.99") for i in range(30) if i % 4 == k), Decimal(0))
        for k in range(4)
    }
