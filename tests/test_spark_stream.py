"""Streaming reads through Spark: ``spark.readStream.format("kstore")``, admission control,
availableNow, checkpoints, new partitions, and data loss."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from kstore import Store
from tests.test_spark_support import (
    BACKENDS,
    BASE_MS,
    append,
    apply_retention,
    open_store,
    source_options,
    topic_values,
    wait_for,
)

pytestmark = [
    pytest.mark.spark,
    # PySpark 4.3 warns that it does not fully support pandas 3 when a feature imports pandas.
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]


def stream(spark: Any, target: Any, **options: Any) -> Any:
    return spark.readStream.format("kstore").options(**source_options(target, **options)).load()


def memory_rows(spark: Any, name: str) -> list[Any]:
    return spark.sql(f"SELECT partition, offset, CAST(value AS STRING) AS v FROM {name}").collect()


def batch_sizes(query: Any) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]


@pytest.mark.parametrize("target", BACKENDS)
def test_a_query_picks_up_records_produced_while_it_runs(
    spark: Any, target: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    where = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("in", 2)
    store.create_topic("out", 2)
    append(store, "in", 0, [b"before-%d" % i for i in range(5)])
    query = (
        stream(spark, where, subscribe="in", startingOffsets="earliest")
        .selectExpr("key", "value")
        .writeStream.format("kstore")
        .options(**source_options(where, topic="out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        expected = [b"before-%d" % i for i in range(5)]
        # Polling the sink, not processAllAvailable: that can return on a trigger that looked
        # for data just before the append.
        wait_for(lambda: topic_values(store, "out") == sorted(expected))
        for round_ in range(3):
            values = [b"round%d-%d" % (round_, i) for i in range(7)]
            append(store, "in", round_ % 2, values)
            expected += values
            want = sorted(expected)
            wait_for(lambda want=want: topic_values(store, "out") == want)
    finally:
        query.stop()
    assert query.exception() is None


def test_available_now_with_limits_runs_several_batches_then_stops(
    spark: Any, local_store_url: Any
) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 3)
    for p in range(3):
        for seg in range(4):
            append(store, "t", p, [b"%d-%d-%d" % (p, seg, i) for i in range(25)])
    name = f"q_{uuid.uuid4().hex[:8]}"
    query = (
        stream(
            spark,
            local_store_url,
            subscribe="t",
            startingOffsets="earliest",
            maxOffsetsPerTrigger=60,
        )
        .writeStream.format("memory")
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    sizes = batch_sizes(query)
    assert sizes == [60, 60, 60, 60, 60]  # 300 offsets, 20 per partition per batch
    rows = memory_rows(spark, name)
    assert sorted((r.partition, r.offset) for r in rows) == [
        (p, o) for p in range(3) for o in range(100)
    ]


def test_max_bytes_per_trigger(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 1)
    for _seg in range(4):
        append(store, "t", 0, [b"x" * 1000 for _ in range(50)])
    segment_bytes = store.partition("t", 0).state().segments[0].size_bytes
    name = f"q_{uuid.uuid4().hex[:8]}"
    query = (
        stream(
            spark,
            local_store_url,
            subscribe="t",
            startingOffsets="earliest",
            maxBytesPerTrigger=str(segment_bytes // 2),
        )
        .writeStream.format("memory")
        .queryName(name)
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert batch_sizes(query) == [25] * 8  # half a segment's bytes per batch
    assert len(memory_rows(spark, name)) == 200


def test_min_offsets_per_trigger_waits_up_to_max_trigger_delay(
    spark: Any, local_store_url: Any
) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 1)
    append(store, "t", 0, [b"a%d" % i for i in range(10)])
    name = f"q_{uuid.uuid4().hex[:8]}"
    query = (
        stream(
            spark,
            local_store_url,
            subscribe="t",
            startingOffsets="earliest",
            minOffsetsPerTrigger=50,
            maxTriggerDelay="6s",
        )
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        # As Kafka's source: the first trigger does not wait.
        wait_for(lambda: len(memory_rows(spark, name)) == 10, timeout=60)
        fired = time.monotonic()
        append(store, "t", 0, [b"b%d" % i for i in range(10)])
        time.sleep(1.5)
        assert len(memory_rows(spark, name)) == 10  # 10 new < 50: the batch waits
        append(store, "t", 0, [b"c%d" % i for i in range(45)])
        wait_for(lambda: len(memory_rows(spark, name)) == 65, timeout=60)
        assert time.monotonic() - fired < 6  # enough records: no waiting for the delay
        fired = time.monotonic()
        append(store, "t", 0, [b"d%d" % i for i in range(5)])
        wait_for(lambda: len(memory_rows(spark, name)) == 70, timeout=60)
        assert time.monotonic() - fired >= 5  # too few records: waited for maxTriggerDelay
    finally:
        query.stop()


def test_restart_from_checkpoint_continues_without_gaps_or_repeats(
    spark: Any, local_store_url: Any, tmp_path: Path
) -> None:
    store = open_store(local_store_url)
    store.create_topic("in", 2)
    store.create_topic("out", 1)
    expected: list[bytes] = []

    def produce(label: str) -> None:
        for p in range(2):
            values = [b"%s-%d-%d" % (label.encode(), p, i) for i in range(40)]
            append(store, "in", p, values)
            expected.extend(values)

    def run() -> list[int]:
        query = (
            stream(
                spark,
                local_store_url,
                subscribe="in",
                startingOffsets="earliest",
                maxOffsetsPerTrigger=30,
            )
            .selectExpr("value")
            .writeStream.format("kstore")
            .options(**source_options(local_store_url, topic="out"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None
        return batch_sizes(query)

    produce("first")
    assert run() == [30, 30, 20]
    assert topic_values(store, "out") == sorted(expected)
    produce("second")
    assert run() == [30, 30, 20]  # only the new records
    assert topic_values(store, "out") == sorted(expected)
    assert run() == []  # nothing new: no batch at all
    assert topic_values(store, "out") == sorted(expected)


def test_new_partitions_are_picked_up(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 1)
    append(store, "t", 0, [b"old"])
    name = f"q_{uuid.uuid4().hex[:8]}"
    query = (
        stream(spark, local_store_url, subscribePattern="t|u", startingOffsets="earliest")
        .selectExpr("topic", "partition", "offset", "value")
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: len(memory_rows(spark, name)) == 1)
        Store(local_store_url[0]).add_partitions("t", 3)
        append(store, "t", 2, [b"new"])
        store.create_topic("u", 1)  # a new topic matching the pattern
        append(store, "u", 0, [b"other"])
        wait_for(lambda: len(memory_rows(spark, name)) == 3, timeout=60)
        rows = spark.sql(
            f"SELECT topic, partition, offset, CAST(value AS STRING) AS v FROM {name}"
        ).collect()
        assert sorted((r.topic, r.partition, r.offset, r.v) for r in rows) == [
            ("t", 0, 0, "old"),
            ("t", 2, 0, "new"),
            ("u", 0, 0, "other"),
        ]
    finally:
        query.stop()


@pytest.mark.parametrize("fail", [True, False])
def test_fail_on_data_loss_when_retention_removed_unread_offsets(
    spark: Any, local_store_url: Any, tmp_path: Path, fail: bool
) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 1)
    store.create_topic("out", 1)
    append(store, "t", 0, [b"a%d" % i for i in range(10)])

    def run() -> Any:
        query = (
            stream(
                spark,
                local_store_url,
                subscribe="t",
                startingOffsets="earliest",
                failOnDataLoss=str(fail).lower(),
            )
            .selectExpr("value")
            .writeStream.format("kstore")
            .options(**source_options(local_store_url, topic="out"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            query.awaitTermination(120)
        except Exception as exc:  # the query's failure
            if "Python worker failed to connect back" in str(exc):
                raise  # Spark's, not the query's: rerun (pyproject.toml)
            return exc
        return None

    assert run() is None
    append(store, "t", 0, [b"b%d" % i for i in range(10)])
    append(store, "t", 0, [b"c%d" % i for i in range(10)])
    # Retention removes a (read) and b (never read) before the query runs again.
    assert apply_retention(store, "t", 0, 2) == 20
    error = run()
    if fail:
        assert error is not None
        assert "offsets 10..19 were to be read, but the log now starts at 20" in str(error)
        assert "failOnDataLoss" in str(error)
        assert topic_values(store, "out") == sorted(b"a%d" % i for i in range(10))
    else:
        assert error is None
        assert topic_values(store, "out") == sorted(
            [b"a%d" % i for i in range(10)] + [b"c%d" % i for i in range(10)]
        )


def test_streaming_starting_positions(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 2)
    for p in range(2):
        append(
            store,
            "t",
            p,
            [b"old-%d-%d" % (p, i) for i in range(10)],
            timestamps_ms=[BASE_MS + i for i in range(10)],
        )

    def available_now(**options: Any) -> list[tuple[int, int]]:
        name = f"q_{uuid.uuid4().hex[:8]}"
        query = (
            stream(spark, local_store_url, subscribe="t", **options)
            .writeStream.format("memory")
            .queryName(name)
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        return sorted((r.partition, r.offset) for r in memory_rows(spark, name))

    assert available_now(startingOffsets='{"t":{"0":5,"1":-2}}') == [
        (0, o) for o in range(5, 10)
    ] + [(1, o) for o in range(10)]
    assert available_now(startingTimestamp=BASE_MS + 8) == [(0, 8), (0, 9), (1, 8), (1, 9)]
    assert available_now(startingOffsets="latest") == []
    # latest: only what is committed after the query started.
    name = f"q_{uuid.uuid4().hex[:8]}"
    query = (
        stream(spark, local_store_url, subscribe="t")
        .writeStream.format("memory")
        .queryName(name)
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: query.lastProgress is not None)
        append(store, "t", 1, [b"new"])
        wait_for(lambda: len(memory_rows(spark, name)) == 1)
        assert [r.v for r in memory_rows(spark, name)] == ["new"]
    finally:
        query.stop()


def test_latest_offset_polls_manifests_by_name(
    local_store_url: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trigger reads, per topic and per partition, the next log version by name: never a
    listing, never a segment file (the reader's driver side, called directly)."""
    from kstore.spark_ext.options import parse_read_options
    from kstore.spark_ext.reader import KStoreStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from kstore.storage import Storage

    store = open_store(local_store_url)
    store.create_topic("t", 3)
    for p in range(3):
        for _ in range(5):
            append(store, "t", p, [b"x"] * 10)
    reader = KStoreStreamReader(
        parse_read_options(
            source_options(local_store_url, subscribe="t", startingOffsets="earliest"),
            streaming=True,
        ),
        ["value"],
    )
    start = reader.initialOffset()
    reads: list[str] = []
    lists: list[str] = []
    real_read, real_list = Storage.read, Storage.list_dir
    monkeypatch.setattr(
        Storage, "read", lambda self, rel: (reads.append(rel), real_read(self, rel))[1]
    )
    monkeypatch.setattr(
        Storage, "list_dir", lambda self, rel: (lists.append(rel), real_list(self, rel))[1]
    )
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"t": {"0": 50, "1": 50, "2": 50}}
    assert lists == []
    assert all("/_log/" in r and r.endswith(".json") for r in reads), reads
    assert len(reads) <= 1 + 3  # the topic log and each partition's log: the next version
    reads.clear()
    append(store, "t", 1, [b"y"] * 5)
    assert reader.latestOffset(end, ReadAllAvailable()) == {"t": {"0": 50, "1": 55, "2": 50}}
    assert lists == []
    assert not any("/segments/" in r for r in reads)


def test_the_group_offsets_hook_sees_every_committed_position_once(local_store_url: Any) -> None:
    from kstore.spark_ext import hooks
    from kstore.spark_ext.options import parse_read_options
    from kstore.spark_ext.reader import KStoreStreamReader
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from kstore.records import TopicPartition

    store = open_store(local_store_url)
    store.create_topic("t", 1)
    append(store, "t", 0, [b"x"] * 30)
    options = parse_read_options(
        source_options(
            local_store_url, subscribe="t", startingOffsets="earliest", maxOffsetsPerTrigger=20
        ),
        streaming=True,
    )
    seen: list[dict[TopicPartition, int]] = []
    hook = lambda event: seen.append(dict(event.offsets))  # noqa: E731
    hooks.add_commit_hook(hook)
    try:
        reader = KStoreStreamReader(options, ["value"])
        reader.prepareForTriggerAvailableNow()
        start = reader.initialOffset()
        limit = reader.getDefaultReadLimit()
        assert limit == ReadMaxRows(20)
        first = reader.latestOffset(start, limit)  # batch 0: [0, 20)
        second = reader.latestOffset(first, limit)  # batch 0 committed; batch 1: [20, 30)
        reader.commit(first)  # Spark's late commit of batch 0: already reported
        assert reader.latestOffset(second, limit) == second  # batch 1 committed; no more data
    finally:
        hooks.remove_commit_hook(hook)
    tp = TopicPartition("t", 0)
    assert seen == [{tp: 0}, {tp: 20}, {tp: 30}]


@pytest.mark.parametrize("target", BACKENDS)
def test_group_id_shows_a_query_lag_and_hands_over_its_position(
    spark: Any, target: Any, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from kstore.groups import describe_group

    target = request.getfixturevalue(target) if isinstance(target, str) else target
    store = open_store(target)
    store.create_topic("clicks", 2)
    for p in range(2):
        append(store, "clicks", p, [b"c-%d-%d" % (p, i) for i in range(50)])
    assert describe_group(store, "stats").state == "Dead"  # never used

    def run(checkpoint: str, starting: str) -> int:
        query = (
            stream(
                spark,
                target,
                subscribe="clicks",
                startingOffsets=starting,
                groupId="stats",
                maxOffsetsPerTrigger=40,
            )
            .writeStream.format("memory")
            .queryName(f"q_{uuid.uuid4().hex[:8]}")
            .option("checkpointLocation", str(tmp_path / checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None
        return sum(batch_sizes(query))

    assert run("first", "earliest") == 100
    described = describe_group(store, "stats")
    assert described.total_lag == 0  # the query's position is the group's: lag visible to tools
    assert [(p.partition, p.current_offset) for p in described.partitions] == [(0, 50), (1, 50)]
    for p in range(2):
        append(store, "clicks", p, [b"later-%d-%d" % (p, i) for i in range(7)])
    assert describe_group(store, "stats").total_lag == 14
    # A rewritten query (new checkpoint) starts where the group left off: only the new records.
    assert run("rewritten", "group") == 14
    assert describe_group(store, "stats").total_lag == 0


def test_group_id_options_are_checked(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("clicks", 1)

    def read(**options: Any) -> Any:
        return (
            spark.read.format("kstore")
            .options(**source_options(local_store_url, subscribe="clicks", **options))
            .load()
            .collect()
        )

    with pytest.raises(Exception, match="groupId"):
        read(startingOffsets="group")
    with pytest.raises(Exception, match="invalid group id"):
        read(groupId="../x")
