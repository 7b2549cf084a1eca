"""Writes through Spark: ``df.write`` and ``writeStream`` into kstore topics, the Kafka sink's
columns, partitioning, and exactly-once (replayed batches, a stopped query, a killed driver)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kstore.spark_ext.options import parse_write_options
from kstore.spark_ext.pending import FileRef
from kstore.spark_ext.writer import KStoreStreamWriter, delete_uncommitted

from kstore.partitioner import get_partitioner
from tests.commit_logs import COMMIT_LOGS, commit_logs_fixture, create_topics_with
from tests.test_spark_support import (
    append,
    apply_retention,
    open_store,
    records,
    segment_files,
    source_options,
    topic_rows,
    topic_values,
    wait_for,
)

pytestmark = [
    pytest.mark.spark,
    # PySpark 4.3 warns that it does not fully support pandas 3 when a feature imports pandas.
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

# The sink's tests on layout-3 topics run with commit.logs 1 and 3 (tests/commit_logs.py): on
# local disk; on SeaweedFS with 1.
commit_logs = commit_logs_fixture()


def sink(df: Any, target: Any, **options: Any) -> Any:
    return df.write.format("kstore").options(**source_options(target, **options)).mode("append")


@pytest.mark.parametrize(
    ("target", "logs"),
    [
        *(pytest.param("local_store_url", n, id=f"local-logs{n}") for n in COMMIT_LOGS),
        pytest.param("seaweed_bucket_url", 1, id="seaweed-logs1", marks=pytest.mark.s3),
    ],
)
def test_batch_write_like_the_kafka_sink(
    spark: Any,
    target: str,
    logs: int,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    where = request.getfixturevalue(target)
    create_topics_with(monkeypatch, logs)
    store = open_store(where)
    store.create_topic("t", 4)
    df = spark.range(200).selectExpr(
        "CASE WHEN id % 10 = 0 THEN NULL ELSE concat('key-', CAST(id % 17 AS STRING)) END AS key",
        "concat('value-', CAST(id AS STRING)) AS value",
        "CASE WHEN id % 3 = 0 THEN array(named_struct('key', 'n', 'value', CAST(CAST(id AS STRING) AS BINARY))) END AS headers",
        "timestamp_millis(1700000000000 + id) AS timestamp",
        "CASE WHEN id % 50 = 7 THEN 3 END AS partition",
        "id AS ignored_column",
    )
    sink(df.repartition(2), where, topic="t", keepTimestamp="true").save()
    murmur2 = get_partitioner("murmur2")
    meta = store.topic("t")
    seen = {}
    unkeyed_partitions = set()
    for p in range(4):
        part = store.partition("t", p, meta)
        for batch in part.read(0, state=part.state()):
            for row in batch.to_pylist():
                n = int(row["value"].split(b"-")[1])
                seen[n] = row
                if n % 50 == 7:
                    assert p == 3  # the partition column wins
                elif row["key"] is not None:
                    assert p == murmur2.partition(row["key"], 4)  # the producer's placement
                else:
                    unkeyed_partitions.add(p)
                assert row["timestamp"].timestamp() * 1000 == 1700000000000 + n  # kept
                expected_headers = [{"key": "n", "value": str(n).encode()}] if n % 3 == 0 else None
                assert row["headers"] == expected_headers
    assert sorted(seen) == list(range(200))
    # Unkeyed records: one (derived) partition per task and 16 KiB, as a sticky partitioner.
    assert 1 <= len(unkeyed_partitions) <= 2


def test_topic_column_and_topic_option(spark: Any, local_store_url: Any, commit_logs: int) -> None:
    store = open_store(local_store_url)
    store.create_topic("a", 1)
    store.create_topic("b", 2)
    df = spark.range(30).selectExpr(
        "CASE WHEN id % 3 = 0 THEN 'a' ELSE 'b' END AS topic", "CAST(id AS STRING) AS value"
    )
    sink(df, local_store_url).save()
    assert topic_values(store, "a") == sorted(b"%d" % i for i in range(30) if i % 3 == 0)
    assert topic_values(store, "b") == sorted(b"%d" % i for i in range(30) if i % 3)
    # The option overrides the column, as in the Kafka sink.
    sink(df, local_store_url, topic="a").save()
    assert len(topic_values(store, "a")) == 40


def test_write_errors_name_the_problem(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 2, {"max.message.bytes": 200})
    values = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match="needs a 'value' column"):
        sink(spark.range(3), local_store_url, topic="t").save()
    with pytest.raises(Exception, match="column 'value' must be binary or string, got bigint"):
        sink(spark.range(3).selectExpr("id AS value"), local_store_url, topic="t").save()
    with pytest.raises(
        Exception, match="set the option 'topic' or give the input a 'topic' column"
    ):
        sink(values, local_store_url).save()
    with pytest.raises(Exception, match="topic 'nope' does not exist"):
        sink(values, local_store_url, topic="nope").save()
    with pytest.raises(Exception, match="save mode 'overwrite' is not supported"):
        values.write.format("kstore").options(**source_options(local_store_url, topic="t")).mode(
            "overwrite"
        ).save()
    with pytest.raises(Exception, match=r"has partitions 0..1; a record names partition 5"):
        sink(values.selectExpr("value", "5 AS partition"), local_store_url, topic="t").save()
    with pytest.raises(Exception, match=r"larger than topic 't''s max.message.bytes=200"):
        sink(
            spark.range(1).selectExpr("repeat('x', 500) AS value"), local_store_url, topic="t"
        ).save()
    assert topic_rows(store, "t") == []
    present, live = segment_files(store, "t")
    assert present == live == set()  # failed writes leave no files behind


def test_idempotent_batch_write_with_txn_options(
    spark: Any, local_store_url: Any, commit_logs: int
) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 3)
    df = (
        spark.range(60)
        .selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
        .repartition(3)
    )
    for _ in range(2):  # the same job again, e.g. a retried pipeline step
        sink(df, local_store_url, topic="t", txnAppId="nightly-load", txnVersion=7).save()
    assert topic_values(store, "t") == sorted(b"%d" % i for i in range(60))
    sink(df, local_store_url, topic="t", txnAppId="nightly-load", txnVersion=8).save()
    assert len(topic_values(store, "t")) == 120
    present, live = segment_files(store, "t")
    assert present == live  # the repeated job's files were deleted


def test_a_failed_job_leaves_no_records_and_no_files(
    spark: Any, local_store_url: Any, commit_logs: int
) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 2)
    # Task 1 fails on its last record, after task 0 may have finished writing its segments.
    df = spark.range(0, 100, 1, 2).selectExpr(
        "CAST(id AS STRING) AS key",
        "CASE WHEN id = 99 THEN CAST(raise_error('boom') AS STRING) ELSE CAST(id AS STRING) END AS value",
    )
    with pytest.raises(Exception, match="boom"):
        sink(df, local_store_url, topic="t").save()
    assert topic_rows(store, "t") == []
    present, live = segment_files(store, "t")
    assert present == live == set()


def test_cleanup_keeps_a_committed_file_that_retention_removed(
    local_store_url: Any, commit_logs: int
) -> None:
    """The sink's cleanup deletes only files no commit ever added: a file committed and since
    removed (by retention here) stays for vacuum, as a reader may still need it (PROTOCOL.md
    12.6). The sink's commit path, without Spark."""
    store = open_store(local_store_url)
    meta = store.create_topic("t", 1)
    part = store.partition("t", 0)
    append(store, "t", 0, [b"committed"])
    (committed,) = (s.path for s in part.state().segments)
    apply_retention(store, "t", 0, 1)
    assert committed in part.state().removed
    orphan = part.write_segment(records([b"never committed"]), durable=False).path
    delete_uncommitted(store, [FileRef("t", meta.topic_id, 0, p) for p in (committed, orphan)])
    assert store.storage.exists(f"{part.directory}/{committed}")
    assert not store.storage.exists(f"{part.directory}/{orphan}")


# -- exactly-once -----------------------------------------------------------------------------------


def test_a_replayed_micro_batch_commits_only_the_missing_topic_logs(
    local_store_url: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layout 3: a micro-batch commits each topic log's partitions in one commit. The driver
    dies after one of three logs committed; the replay commits the other two, nothing twice."""
    from kstore.topic_log import TopicLog

    store = open_store(local_store_url)
    store.create_topic("t", 3, config={"commit.logs": 3})
    options = parse_write_options(
        source_options(local_store_url, topic="t", txnAppId="query-1"), streaming=True
    )
    writer = KStoreStreamWriter(options, {"key": "key", "value": "value"})
    keys = [b"k%d" % i for i in range(90)]
    batch = pa.RecordBatch.from_pydict({"key": keys, "value": [b"v%d" % i for i in range(90)]})
    first = writer.write(iter([batch]))
    real_commit = TopicLog.commit
    calls: list[int] = []

    def crash_after_one(self: TopicLog, *args: Any, **kwargs: Any) -> Any:
        if calls:
            raise RuntimeError("driver died")
        calls.append(self.index)
        return real_commit(self, *args, **kwargs)

    monkeypatch.setattr(TopicLog, "commit", crash_after_one)
    with pytest.raises(RuntimeError, match="driver died"):
        writer.commit([first], 0)
    monkeypatch.setattr(TopicLog, "commit", real_commit)
    assert 0 < len(topic_rows(store, "t")) < 90
    replay = writer.write(iter([batch]))
    writer.commit([replay], 0)
    assert topic_values(store, "t") == sorted(b"v%d" % i for i in range(90))
    writer.commit([writer.write(iter([batch]))], 0)  # and once more: nothing
    assert len(topic_rows(store, "t")) == 90
    present, live = segment_files(store, "t")
    assert present == live  # no orphan segment files


def test_a_micro_batch_is_one_commit_per_topic_log(local_store_url: Any, commit_logs: int) -> None:
    store = open_store(local_store_url)
    meta = store.create_topic("t", 3)
    options = parse_write_options(
        source_options(local_store_url, topic="t", txnAppId="query-1"), streaming=True
    )
    writer = KStoreStreamWriter(options, {"key": "key", "value": "value"})
    keys = [b"k%d" % i for i in range(90)]
    batch = pa.RecordBatch.from_pydict({"key": keys, "value": [b"v%d" % i for i in range(90)]})
    writer.commit([writer.write(iter([batch]))], 0)
    for index in range(commit_logs):  # with commit.logs 3: one commit in each log
        log_dir = f"topics/t/{meta.topic_id}/_log" + (f".{index}" if index else "")
        commits = [i.name for i in store.storage.list_dir(log_dir) if i.name.endswith(".json")]
        assert commits == ["00000000000000000000.json"]  # the log's partitions, atomically
    assert sorted({row[0] for row in topic_rows(store, "t")}) == [0, 1, 2]


def _copy_query(
    spark: Any,
    target: Any,
    checkpoint: Path,
    *,
    slow: bool,
    available_now: bool,
    limit: int | None = 40,
) -> Any:
    from pyspark.sql.functions import udf

    options = {"subscribe": "in", "startingOffsets": "earliest"}
    if limit is not None:
        options["maxOffsetsPerTrigger"] = str(limit)
    df = (
        spark.readStream.format("kstore")
        .options(**source_options(target, **options))
        .load()
        .selectExpr("key", "value")
    )
    if slow:

        def slowly(value: bytes) -> bytes:
            time.sleep(0.002)  # so that a stop lands inside a micro-batch
            return value

        df = df.withColumn("value", udf(slowly, "binary", useArrow=False)("value"))
    writer = (
        df.writeStream.format("kstore")
        .options(**source_options(target, topic="out"))
        .option("checkpointLocation", str(checkpoint))
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime="10 milliseconds")
    )
    return writer.start()


def test_stopping_a_query_mid_batch_and_restarting_is_exactly_once(
    spark: Any, local_store_url: Any, tmp_path: Path
) -> None:
    """At commit.logs 1 only (about 18 s a run): a micro-batch replayed after a partial commit
    across topic logs is test_a_replayed_micro_batch_commits_only_the_missing_topic_logs's, and a
    copy into commit.logs 3 is test_concurrent_producer_and_streaming_copy's."""
    store = open_store(local_store_url)
    store.create_topic("in", 3)
    store.create_topic("out", 2)
    expected = []
    for p in range(3):
        values = [b"%d-%d" % (p, i) for i in range(120)]
        append(
            store, "in", p, values, keys=[None if i % 4 == 0 else b"k%d" % i for i in range(120)]
        )
        expected += values
    rng = random.Random(5)
    checkpoint = tmp_path / "checkpoint"
    query = _copy_query(spark, local_store_url, checkpoint, slow=True, available_now=False)
    wait_for(lambda q=query: q.lastProgress is not None, timeout=60)
    time.sleep(rng.uniform(0.1, 0.6))  # somewhere inside a micro-batch
    query.stop()
    assert len(topic_rows(store, "out")) < len(expected)
    query = _copy_query(
        spark, local_store_url, checkpoint, slow=False, available_now=True, limit=None
    )
    assert query.awaitTermination(120)
    assert topic_values(store, "out") == sorted(expected)
    present, live = segment_files(store, "out")
    assert present == live


DRIVER = textwrap.dedent(
    """
    import json, os, sys, warnings
    warnings.simplefilter("ignore")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from kstore.spark_ext import register

    url, options, checkpoint = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    store = {"store": url, "storageOptions": json.dumps(options)}
    writer = (
        spark.readStream.format("kstore").options(**store)
        .option("subscribe", "in").option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "60").load()
        .selectExpr("key", "value")
        .writeStream.format("kstore").options(**store).option("topic", "out")
        .option("checkpointLocation", checkpoint)
    )
    query = writer.trigger(processingTime="10 milliseconds").start()
    query.awaitTermination()
    """
)


@pytest.mark.slow
def test_killing_the_driver_mid_batch_and_restarting_is_exactly_once(
    spark: Any, local_store_url: Any, tmp_path: Path
) -> None:
    store = open_store(local_store_url)
    store.create_topic("in", 3)
    store.create_topic("out", 2)
    expected = []
    for p in range(3):
        for seg in range(3):
            values = [b"%d-%d-%d" % (p, seg, i) for i in range(100)]
            append(
                store,
                "in",
                p,
                values,
                keys=[None if i % 5 == 0 else b"k%d" % i for i in range(100)],
            )
            expected += values
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    checkpoint = str(tmp_path / "checkpoint")
    url, options = local_store_url
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}

    def driver() -> subprocess.Popen[str]:
        # A session of its own: the kill takes the JVM and the Python workers with it.
        return subprocess.Popen(
            [sys.executable, str(script), url, json.dumps(options), checkpoint],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            start_new_session=True,
        )

    process = driver()
    try:
        # Kill once the copy is well under way: some micro-batches committed, more to come.
        wait_for(lambda: len(topic_rows(store, "out")) >= 100, timeout=120, interval=0.05)
        time.sleep(random.Random(11).uniform(0.0, 0.3))
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)
        copied = len(topic_rows(store, "out"))
        assert copied < len(expected), "killed too late: the copy had finished"
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    # The restart: the same query from the same checkpoint (in this test's session, to spare
    # a second JVM start), to the end of the input.
    query = _copy_query(
        spark, local_store_url, Path(checkpoint), slow=False, available_now=True, limit=None
    )
    assert query.awaitTermination(240)
    assert query.exception() is None
    assert topic_values(store, "out") == sorted(expected)
    assert len(topic_rows(store, "out")) == len(expected)
    present, live = segment_files(store, "out")
    assert present == live  # the killed attempt's files were cleaned up by the replay


def test_a_streaming_copy_on_s3_is_exactly_once(
    spark: Any, seaweed_bucket_url: Any, tmp_path: Path
) -> None:
    store = open_store(seaweed_bucket_url)
    store.create_topic("in", 2)
    store.create_topic("out", 2)
    expected = []
    for p in range(2):
        values = [b"%d-%d" % (p, i) for i in range(100)]
        append(store, "in", p, values, keys=[b"k%d" % (i % 7) for i in range(100)])
        expected += values
    query = _copy_query(
        spark,
        seaweed_bucket_url,
        tmp_path / "checkpoint",
        slow=False,
        available_now=True,
        limit=100,
    )
    assert query.awaitTermination(180)
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [100, 100]
    assert topic_values(store, "out") == sorted(expected)


def test_concurrent_producer_and_streaming_copy(
    spark: Any, local_store_url: Any, tmp_path: Path, commit_logs: int
) -> None:
    """Records produced while the copy runs all arrive, once."""
    store = open_store(local_store_url)
    store.create_topic("in", 2)
    store.create_topic("out", 2)
    expected: list[bytes] = []
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.is_set() and i < 20:
            values = [b"live-%d-%d" % (i, j) for j in range(15)]
            append(store, "in", i % 2, values)
            expected.extend(values)
            i += 1
            time.sleep(0.05)

    query = _copy_query(
        spark, local_store_url, tmp_path / "checkpoint", slow=False, available_now=False
    )
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        producer.join(60)
        wait_for(lambda: topic_values(store, "out") == sorted(expected), timeout=120)
    finally:
        stop.set()
        query.stop()
    assert len(topic_rows(store, "out")) == 300
