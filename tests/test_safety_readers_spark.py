"""A real Spark streaming query whose planned tasks run after a merge and vacuum (issue 45,
defect 3; PROTOCOL.md 24 item 8).

Spark plans a micro-batch's tasks (each carrying the segments of its offset range, planned on
the driver) before it hands the batch to a ``foreachBatch`` function; the function here first
lets a merge job and a vacuum past ``file.delete.delay.ms`` delete every data object those
tasks name, then runs them. Every record must come back, with ``failOnDataLoss`` true (it
raised DataLossError for records that were all there) and false (it read none of them).
The non-Spark cases are in tests/test_safety_readers.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.test_safety_readers import live_rows, make_topic, merge_and_vacuum
from tests.test_spark_support import open_store, source_options

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


# failOnDataLoss=false: the case that read 0 of 200 records and raised nothing (issue 45). The
# other setting is the same read path; tests/test_safety_readers.py runs both without Spark.
@pytest.mark.parametrize("fail", [False], ids=["noFailOnDataLoss"])
def test_a_micro_batch_run_after_a_merge_and_vacuum_reads_every_record(
    spark: Any, local_store_url: Any, tmp_path: Path, fail: bool
) -> None:
    store = open_store(local_store_url)
    expected = make_topic(store, 3)
    batches: list[tuple[int, list[str], list[tuple[int, int, bytes]]]] = []

    def run(df: Any, batch_id: int) -> None:
        # The batch's tasks are planned; they run at collect(), after the merge and vacuum.
        deleted = merge_and_vacuum(local_store_url) if not batches else []
        rows = [(r.partition, r.offset, bytes(r.value)) for r in df.collect()]
        batches.append((batch_id, deleted, rows))

    query = (
        spark.readStream.format("kstore")
        .options(
            **source_options(
                local_store_url,
                subscribe="t",
                startingOffsets="earliest",
                failOnDataLoss=str(fail).lower(),
            )
        )
        .load()
        .select("partition", "offset", "value")
        .writeStream.foreachBatch(run)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120)
    finally:
        query.stop()
    assert query.exception() is None
    assert batches
    assert any(f.endswith(".kdat") for f in batches[0][1])  # the planned data objects deleted
    got = sorted(row for _, _, rows in batches for row in rows)
    assert got == sorted((p, o, v) for p, rows in expected.items() for o, v in rows)
    assert live_rows(store) == expected
