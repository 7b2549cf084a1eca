"""Spark reads and the merge and compaction jobs on layout-3 topics (shared topic logs, ranged
adds into data objects): what Spark reads equals what a consumer reads, before and after the
jobs rewrite the ranges into per-partition segments. Shares the one Spark session of
conftest.py; the jobs run in this process (``spark=None``) where Spark adds nothing to check."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kstore.compaction import merge_segments, run_compaction

from kstore import Store
from kstore.consumer import Consumer
from kstore.producer import Producer
from kstore.records import TopicPartition
from tests.test_spark_support import open_store, source_options, wait_for

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

Row = tuple[int, int, bytes | None, bytes | None]  # partition, offset, key, value


def produce(store: Store, topic: str, flushes: int, per_flush: int, *, tag: str = "") -> None:
    """``flushes`` producer flushes of keyed records: each flush is one data object holding a
    range of every partition it touched."""
    with Producer(store, linger_ms=60_000) as producer:
        for f in range(flushes):
            for i in range(per_flush):
                producer.send(topic, key=b"k%d" % (i % 16), value=b"%s%d-%d" % (tag.encode(), f, i))
            producer.flush()


def consumed(store: Store, topic: str) -> list[Row]:
    """Every record of the topic as a consumer reads it (no Spark)."""
    meta = store.topic(topic)
    tps = [TopicPartition(topic, p) for p in range(meta.partitions)]
    out: list[Row] = []
    with Consumer(store=store, enable_auto_commit=False) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=1000).values():
                out.extend((r.partition, r.offset, r.key, r.value) for r in records)
    return sorted(out)


def spark_rows(spark: Any, where: Any, topic: str) -> list[Row]:
    df = (
        spark.read.format("kstore")
        .options(**source_options(where, subscribe=topic))
        .load()
        .select("partition", "offset", "key", "value")
    )
    return sorted(
        (r["partition"], r["offset"], r["key"], r["value"]) for r in df.toArrow().to_pylist()
    )


def live_ranges(store: Store, topic: str) -> dict[int, int]:
    """Per partition, how many live segments are ranges of data objects."""
    meta = store.topic(topic)
    return {
        p: sum(s.byte_range is not None for s in store.partition_state(topic, p, meta).segments)
        for p in range(meta.partitions)
    }


def test_batch_read_equals_what_a_consumer_reads(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 4)
    assert store.topic("t").layout == 3
    produce(store, "t", flushes=3, per_flush=64)
    assert all(n == 3 for n in live_ranges(store, "t").values())  # one range per flush
    expected = consumed(store, "t")
    assert len(expected) == 192
    assert {p for p, *_ in expected} == {0, 1, 2, 3}
    assert spark_rows(spark, local_store_url, "t") == expected


def test_streaming_read_picks_up_new_flushes(
    spark: Any, local_store_url: Any, tmp_path: Path
) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 4)
    produce(store, "t", flushes=1, per_flush=32, tag="a")
    name = f"q_{uuid.uuid4().hex[:8]}"
    query = (
        spark.readStream.format("kstore")
        .options(**source_options(local_store_url, subscribe="t", startingOffsets="earliest"))
        .load()
        .selectExpr("partition", "offset", "key", "value")
        .writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )

    def seen() -> list[Row]:
        return sorted(
            (r.partition, r.offset, r.key, r.value)
            for r in spark.sql(f"SELECT * FROM {name}").collect()
        )

    try:
        wait_for(lambda: len(seen()) == 32, timeout=180)
        produce(store, "t", flushes=2, per_flush=32, tag="b")
        expected = consumed(store, "t")
        assert len(expected) == 96
        wait_for(lambda: len(seen()) == 96, timeout=180)
        assert seen() == expected
    finally:
        query.stop()
    assert query.exception() is None


def test_merge_then_read_gives_the_same_records_and_no_range_stays_live(
    spark: Any, local_store_url: Any
) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 4)
    produce(store, "t", flushes=4, per_flush=64)
    before = consumed(store, "t")
    summary = merge_segments(None, store, None, verbose=False)
    assert summary.count("error") == 0
    assert summary.count("committed") == 4
    assert live_ranges(store, "t") == dict.fromkeys(range(4), 0)
    meta = store.topic("t")
    merged: dict[int, str] = {}
    for p in range(4):
        (segment,) = store.partition_state("t", p, meta).segments
        assert segment.path.startswith("segments/")
        assert segment.format == "parquet"
        merged[p] = segment.path
    assert consumed(open_store(local_store_url), "t") == before
    # The merge committed to the topic log: no partition log was started beside it.
    assert not any(store.storage.exists(f"topics/t/{meta.topic_id}/{p}/_log") for p in range(4))
    # One more flush: a lone small range beside a big merged file is rewritten too (the
    # tiered rule alone would leave it, the big file dominating its group).
    produce(store, "t", flushes=1, per_flush=16, tag="late")
    again = merge_segments(None, store, None, verbose=False)
    assert again.count("error") == 0
    assert again.count("committed") == 4
    assert live_ranges(store, "t") == dict.fromkeys(range(4), 0)
    for p in range(4):
        first, second = store.partition_state("t", p, meta).segments
        assert first.path == merged[p]  # the big file is not rewritten
        assert second.path.startswith("segments/")
    expected = consumed(store, "t")
    assert set(before) < set(expected)
    assert len(expected) == len(before) + 16
    assert consumed(open_store(local_store_url), "t") == expected  # from storage, not a cache
    assert spark_rows(spark, local_store_url, "t") == expected
    last = merge_segments(None, store, None, verbose=False)
    assert last.count("committed") == 0
    assert last.count("error") == 0


def test_compaction_keeps_the_latest_value_per_key(local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 4, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0})
    produce(store, "t", flushes=4, per_flush=64)
    before = consumed(store, "t")
    latest: dict[tuple[int, bytes | None], Row] = {}
    for row in before:
        latest[(row[0], row[2])] = row  # rows are in offset order within a partition
    objects = {
        info.name for info in store.storage.list_dir(f"topics/t/{store.topic('t').topic_id}/_data")
    }
    summary = run_compaction(None, store, None, verbose=False)
    assert summary.count("error") == 0
    assert summary.count("committed") == 4
    assert consumed(open_store(local_store_url), "t") == sorted(latest.values())
    assert live_ranges(store, "t") == dict.fromkeys(range(4), 0)
    # The data objects are shared by the partitions: only vacuum deletes them.
    assert {
        info.name for info in store.storage.list_dir(f"topics/t/{store.topic('t').topic_id}/_data")
    } == objects


def test_a_trigger_asks_each_topic_log_once(
    local_store_url: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partitions of one topic log share it: a streaming trigger (latestOffset, then
    planning the batch) reads its next version once, not once per partition (the reader's
    driver side, called directly)."""
    from kstore.spark_ext.options import parse_read_options
    from kstore.spark_ext.reader import KStoreStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from kstore.storage import Storage

    store = open_store(local_store_url)
    store.create_topic("t", 4)
    produce(store, "t", flushes=2, per_flush=32)
    reader = KStoreStreamReader(
        parse_read_options(
            source_options(local_store_url, subscribe="t", startingOffsets="earliest"),
            streaming=True,
        ),
        ["value"],
    )
    start = reader.initialOffset()
    reads: list[str] = []
    real_read = Storage.read
    monkeypatch.setattr(
        Storage, "read", lambda self, rel: (reads.append(rel), real_read(self, rel))[1]
    )
    end = reader.latestOffset(start, ReadAllAvailable())
    assert sum(end["t"].values()) == 64
    topic_id = store.topic("t").topic_id
    shared = [r for r in reads if r.startswith(f"topics/t/{topic_id}/_log/")]
    assert len(shared) == 1, reads  # the next version of the one topic log
    reads.clear()
    tasks = reader.partitions(start, end)
    assert len(tasks) == 4
    shared = [r for r in reads if r.startswith(f"topics/t/{topic_id}/_log/")]
    assert len(shared) == 1, reads


@pytest.mark.s3
@pytest.mark.parametrize("inline", [0, None], ids=["objects", "carried"])
def test_a_read_task_on_s3_fetches_each_range_once(
    seaweed_bucket_url: Any, inline: int | None
) -> None:
    """A task (run here, as an executor runs it) reads its partition's ranges of four data
    objects ahead, together, and decodes what it fetched: one GET per object, none twice,
    and none for a segment already decoded in the executor's cache. The same when the
    commits after the first carry their flushes' data (PROTOCOL.md 11.8): one GET per
    commit file."""
    from kstore.spark_ext.options import parse_read_options
    from kstore.spark_ext.reading import ReadContext, ReadTask, read_task
    from kstore.spark_ext.schema import Projection
    from kstore.spark_ext.stores import get_store

    store = open_store(seaweed_bucket_url)
    store.create_topic("t", 4, {} if inline is None else {"commit.inline.bytes": inline})
    produce(store, "t", flushes=4, per_flush=64)
    meta = store.topic("t")
    state = store.partition_state("t", 1, meta)
    assert [s.byte_range is not None for s in state.segments] == [True] * 4
    objects = [s.path.startswith("_data/") for s in state.segments]
    assert objects == ([True] * 4 if inline == 0 else [True, False, False, False])
    options = parse_read_options(source_options(seaweed_bucket_url, subscribe="t"), streaming=True)
    context = ReadContext(
        store=options.store,
        projection=Projection(("partition", "offset", "key", "value")),
        fail_on_data_loss=True,
        cache_bytes=0,
    )
    task = ReadTask(meta, 1, 0, state.end_offset, 0, state.segments)
    executor_store = get_store(options.store, 0)  # the store the task opens
    with executor_store.storage.count_requests() as requests:
        rows = [row for batch in read_task(task, context) for row in batch.to_pylist()]
    assert requests["GET"] == 4
    expected = [row for row in consumed(store, "t") if row[0] == 1]
    assert sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in rows) == expected
    # With a cache holding the second segment decoded, the task fetches the other three once.
    cached = replace(context, cache_bytes=1 << 26)
    caching_store = get_store(options.store, 1 << 26)
    caching_store.partition("t", 1, meta).read_segment(
        state.segments[1], [*context.projection.segment_columns, "offset"]
    )
    with caching_store.storage.count_requests() as requests:
        rows = [row for batch in read_task(task, cached) for row in batch.to_pylist()]
    assert requests["GET"] == 3
    assert sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in rows) == expected
