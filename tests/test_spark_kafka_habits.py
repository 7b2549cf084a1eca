"""What a job ported from Spark's Kafka connector brings along: the guide's examples with
``format("kafka")`` swapped for ``format("kstore")`` and the bootstrap option for the store,
the ``kafka.*`` options, Kafka's sink habits (time of writing, null keys spread), minPartitions
inside a segment, and the source's lag metrics. Option and sink behaviour is checked without
Spark (cheap); the guide's examples run through the shared Spark session.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kstore.spark_ext import offsets_behind_latest
from kstore.spark_ext.options import InvalidOptionError, parse_read_options, parse_write_options
from kstore.spark_ext.writer import STICKY_BATCH_BYTES, TaskSink, check_input_schema
from pyspark.sql.types import BinaryType, StringType, StructField, StructType, TimestampType

from kstore import Store
from kstore.errors import InvalidRecordError
from tests.test_spark_support import append, open_store, source_options, topic_rows

pytestmark = [
    # PySpark 4.3 warns that it does not fully support pandas 3 when a feature imports pandas.
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

MEMORY = "memory://kstore-kafka-habits/s"
GUIDE_READ = {"kafka.bootstrap.servers": "host1:port1,host2:port2", "subscribe": "topic1"}


# -- kafka.* and the other Kafka connector options (no Spark) -------------------------------------


def test_kafka_group_id_maps_to_group_id_and_client_settings_are_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="kstore.spark_ext.options"):
        options = parse_read_options(
            {
                "store": MEMORY,
                **GUIDE_READ,
                "kafka.group.id": "copy-job",
                "groupIdPrefix": "spark-kafka",
                "kafka.security.protocol": "SASL_SSL",
                "kafka.sasl.jaas.config": "secret-text",
                "kafka.max.poll.records": "500",
                "kafkaConsumer.pollTimeoutMs": "1000",
                "kafka.isolation.level": "read_uncommitted",
            },
            streaming=True,
        )
    assert options.group_id == "copy-job"
    assert options.read_committed is False
    noted = caplog.text
    for name in ("groupIdPrefix", "kafka.security.protocol", "kafka.max.poll.records"):
        assert f"ignoring option '{name}'" in noted
    assert "secret-text" not in noted  # a note names the option, never its value


def test_kafka_producer_settings_map_to_the_sink_options() -> None:
    options = parse_write_options(
        {
            "store": MEMORY,
            "kafka.bootstrap.servers": "host1:port1",
            "topic": "t",
            "kafka.acks": "1",
            "kafka.compression.type": "zstd",
            "kafka.linger.ms": "5",
            "kafka.batch.size": "65536",
        },
        streaming=False,
    )
    assert (options.durable, options.compression, options.topic) == (False, "zstd", "t")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"kafka.auto.offset.reset": "earliest"}, "use option 'startingOffsets'"),
        ({"kafka.enable.auto.commit": "true"}, "use option 'groupId'"),
        ({"kafka.value.deserializer": "x"}, "cast or parse the 'value' column"),
        ({"kafka.partitioner.class": "x"}, "use option 'partitioner' (murmur2, crc32"),
        ({"kafka.transactional.id": "x"}, "'txnAppId' and 'txnVersion'"),
        ({"kafka.group.id": "a", "groupId": "b"}, "'groupId' (or 'kafka.group.id') is given twice"),
    ],
)
def test_kafka_options_that_would_change_semantics_are_refused(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidOptionError) as info:
        parse_read_options({"store": MEMORY, **GUIDE_READ, **options}, streaming=True)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_bootstrap_servers_without_a_store_names_the_store_option() -> None:
    with pytest.raises(
        InvalidOptionError, match=r"'kafka\.bootstrap\.servers' cannot stand for it"
    ):
        parse_read_options(GUIDE_READ, streaming=False)


# -- the sink: time of writing, null keys spread (no Spark) ---------------------------------------

SINK_INPUT = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", StringType()),
        StructField("timestamp", TimestampType()),
    ]
)


def _sink(topic: str, partitions: int, **extra: str) -> TaskSink:
    store = Store(MEMORY)
    if not store.topic_exists(topic):
        store.create_topic(topic, partitions)
    options = parse_write_options({"store": MEMORY, "topic": topic, **extra}, streaming=False)
    columns = check_input_schema(SINK_INPUT, options)
    return TaskSink(options, store, columns, seed="job/0/0", task=0)


def _batch(rows: int, *, value_bytes: int = 100, stamp_us: int = 1_000_000) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.nulls(rows, pa.binary()),
            pa.array(["v" * value_bytes] * rows),
            pa.array([stamp_us] * rows, pa.timestamp("us", "UTC")),
        ],
        names=["key", "value", "timestamp"],
    )


def _rows_per_partition(sink: TaskSink, topic: str, n: int) -> list[int]:
    return [sum(t.num_rows for t in sink.buffers.get((topic, p), [])) for p in range(n)]


def test_null_key_records_of_one_task_are_spread_over_every_partition() -> None:
    sink = _sink("spread", 4)
    # The case: 1,000 unkeyed records from one task, in Arrow batches of 100.
    for _ in range(10):
        sink.add(_batch(100))
    counts = _rows_per_partition(sink, "spread", 4)
    assert sum(counts) == 1000
    assert min(counts) > 0, counts  # every partition gets some (was all in one)
    # 16 KiB runs of 100-byte records, round robin: no partition gets more than its share
    # plus one run.
    per_run = -(-STICKY_BATCH_BYTES // 100)
    assert max(counts) - min(counts) <= per_run


def test_null_key_placement_does_not_depend_on_arrow_batch_sizes() -> None:
    """A replayed micro-batch may come in other Arrow batches; it must place records alike."""
    one = _sink("replay", 3)
    one.add(_batch(900))
    other = _sink("replay", 3)
    for _ in range(9):
        other.add(_batch(100))
    assert _rows_per_partition(one, "replay", 3) == _rows_per_partition(other, "replay", 3)


def test_the_sink_stamps_the_time_of_writing_unless_keep_timestamp() -> None:
    old_us = 1_000_000  # 1970: a copy keeping it would expire at once under retention
    before = int(time.time() * 1_000_000)
    sink = _sink("stamped", 1)
    sink.add(_batch(3, stamp_us=old_us))
    stamps = [s.value for t in sink.buffers[("stamped", 0)] for s in t.column("timestamp")]
    assert all(s >= before for s in stamps), stamps
    kept = _sink("stamped", 1, keepTimestamp="true")
    kept.add(_batch(3, stamp_us=old_us))
    stamps = [s.value for t in kept.buffers[("stamped", 0)] for s in t.column("timestamp")]
    assert stamps == [old_us] * 3


def test_keep_timestamp_still_checks_the_column_type() -> None:
    schema = StructType(
        [StructField("value", StringType()), StructField("timestamp", StringType())]
    )
    ignored = parse_write_options({"store": MEMORY, "topic": "t"}, streaming=False)
    assert "timestamp" not in check_input_schema(schema, ignored)  # ignored like Kafka's sink
    kept = parse_write_options(
        {"store": MEMORY, "topic": "t", "keepTimestamp": "true"}, streaming=False
    )
    with pytest.raises(InvalidRecordError, match="'timestamp' must be"):
        check_input_schema(schema, kept)


# -- lag metrics from the progress (no Spark) -----------------------------------------------------


def test_offsets_behind_latest_from_a_progress_entry() -> None:
    source = {
        "endOffset": {"t": {"0": 10, "1": 40}},
        "latestOffset": '{"t":{"0":30,"1":40}}',  # a JSON string, as in progress.json
        "metrics": {},
    }
    assert offsets_behind_latest(source) == {
        "avgOffsetsBehindLatest": "10.0",
        "maxOffsetsBehindLatest": "20",
        "minOffsetsBehindLatest": "0",
    }
    assert offsets_behind_latest({"endOffset": None, "latestOffset": None}) == {}
    with pytest.raises(InvalidOptionError, match="'latestOffset' is not a JSON object"):
        offsets_behind_latest({"latestOffset": "[1]"})


# -- the guide's examples through Spark -----------------------------------------------------------


@pytest.mark.spark
def test_guide_batch_write_and_read_with_kafka_options(spark: Any, local_store_url: Any) -> None:
    url, _ = local_store_url
    store = open_store(local_store_url)
    store.create_topic("topic1", 2)
    df = spark.range(20).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    # The guide's write, with .mode("append") (PySpark refuses the default mode first).
    (
        df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)")
        .write.format("kstore")
        .option("store", url)
        .option("kafka.bootstrap.servers", "host1:port1,host2:port2")
        .option("topic", "topic1")
        .mode("append")
        .save()
    )
    read = (
        spark.read.format("kstore")
        .option("store", url)
        .option("kafka.bootstrap.servers", "host1:port1,host2:port2")
        .option("subscribe", "topic1")
        .option("kafka.group.id", "guide")
        .option("kafka.security.protocol", "SSL")
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
        .selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)")
    )
    assert sorted(int(r.value) for r in read.collect()) == list(range(20))
    # The guide's form without .mode(): refused by PySpark before the source is asked.
    with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        df.write.format("kstore").option("store", url).option("topic", "topic1").save()


@pytest.mark.spark
def test_a_select_star_copy_is_stamped_with_the_time_of_writing(
    spark: Any, local_store_url: Any
) -> None:
    store = open_store(local_store_url)
    store.create_topic("src", 1)
    store.create_topic("dst", 1)
    append(store, "src", 0, [b"a", b"b"], timestamps_ms=[1_000, 2_000])
    before_ms = int(time.time() * 1000)
    opts = source_options(local_store_url)
    copy = spark.read.format("kstore").options(**opts, subscribe="src").load()
    copy.write.format("kstore").options(**opts, topic="dst").mode("append").save()
    meta = store.topic("dst")
    part = store.partition("dst", 0, meta)
    stamps = [
        row["timestamp"].timestamp() * 1000
        for batch in part.read(0, state=part.state())
        for row in batch.to_pylist()
    ]
    assert len(stamps) == 2
    assert all(s >= before_ms for s in stamps), stamps


@pytest.mark.spark
def test_min_partitions_splits_one_large_segment(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("big", 1)
    append(store, "big", 0, [b"%d" % i for i in range(400)])  # one segment
    df = (
        spark.read.format("kstore")
        .options(**source_options(local_store_url, subscribe="big", minPartitions=4))
        .load()
    )
    assert df.rdd.getNumPartitions() == 4
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(400))


@pytest.mark.spark
def test_a_stream_to_a_missing_topic_fails_at_its_first_micro_batch(
    spark: Any, local_store_url: Any, tmp_path: Path
) -> None:
    """PySpark 4.3 makes a Python sink's table from the query's schema without asking the
    source, and its stream writer at the first micro-batch: that is where a missing topic can
    fail (Kafka's fails at start()). The error names the topic and the way to create it."""
    store = open_store(local_store_url)
    store.create_topic("in", 1)
    append(store, "in", 0, [b"x"])
    query = (
        spark.readStream.format("kstore")
        .options(**source_options(local_store_url, subscribe="in", startingOffsets="earliest"))
        .load()
        .selectExpr("value")
        .writeStream.format("kstore")
        .options(**source_options(local_store_url, topic="nope"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )
    try:
        with pytest.raises(Exception, match="topic 'nope' does not exist") as info:
            query.awaitTermination(600)
    finally:
        query.stop()
    assert "create it first (kstore topics create)" in str(info.value)


@pytest.mark.spark
def test_short_errors_put_the_message_on_one_line(spark: Any, local_store_url: Any) -> None:
    from kstore.spark_ext import HIDE_TRACEBACK_CONF, register

    open_store(local_store_url).create_topic("t", 1)
    opts = source_options(local_store_url, subscribe="t", startingOffsets="nonsense")
    with pytest.raises(Exception, match="Traceback") as info:
        spark.read.format("kstore").options(**opts).load().collect()
    assert "expected earliest, latest or a JSON object" in str(info.value)
    register(spark, short_errors=True)
    try:
        with pytest.raises(Exception) as info:
            spark.read.format("kstore").options(**opts).load().collect()
    finally:
        spark.conf.unset(HIDE_TRACEBACK_CONF)
    message = str(info.value)
    assert "Traceback" not in message
    assert (
        "InvalidOptionError: kstore option 'startingOffsets': expected earliest, latest or a "
        "JSON object, got 'nonsense'"
    ) in message


def test_max_records_per_partition_splits_ranges_as_kafka_does() -> None:
    from kstore.spark_ext.reading import Range, plan_tasks

    from kstore.partition import PartitionState
    from kstore.records import TopicPartition
    from kstore.store import TopicMetadata

    store = Store(MEMORY)
    if not store.topic_exists("ranges"):
        store.create_topic("ranges", 1)
    append(store, "ranges", 0, [b"%d" % i for i in range(250)])  # one segment
    state: PartitionState = store.partition("ranges", 0).state()
    tp = TopicPartition("ranges", 0)
    meta: TopicMetadata = store.topic("ranges")
    options = parse_read_options(
        {"store": MEMORY, "subscribe": "ranges", "maxRecordsPerPartition": "100"}, streaming=False
    )
    tasks = plan_tasks(
        [Range(tp, 0, 250)],
        {tp: state},
        {"ranges": meta},
        min_partitions=options.min_partitions,
        max_records_per_partition=options.max_records_per_partition,
        snapshot=True,
    )
    assert [(t.start, t.end) for t in tasks] == [(0, 83), (83, 167), (167, 250)]


@pytest.mark.spark
def test_guide_batch_examples(spark: Any, local_store_url: Any) -> None:
    """The guide's batch queries, `format` and the bootstrap option swapped; the writes add
    .mode("append"), which PySpark requires of a Python source."""
    url, _ = local_store_url
    store = open_store(local_store_url)
    store.create_topic("topic1", 2)
    store.create_topic("topic2", 1)
    for p in (0, 1):
        append(store, "topic1", p, [b"t1-%d-%d" % (p, i) for i in range(60)])
    append(store, "topic2", 0, [b"t2-%d" % i for i in range(10)])

    # Subscribe to 1 topic defaults to the earliest and latest offsets
    df = spark.read.format("kstore").option("store", url).option("subscribe", "topic1").load()
    rows = df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)").collect()
    assert len(rows) == 120

    # Subscribe to multiple topics, specifying explicit Kafka offsets
    df = (
        spark.read.format("kstore")
        .option("store", url)
        .option("subscribe", "topic1,topic2")
        .option("startingOffsets", """{"topic1":{"0":23,"1":-2},"topic2":{"0":-2}}""")
        .option("endingOffsets", """{"topic1":{"0":50,"1":-1},"topic2":{"0":-1}}""")
        .load()
    )
    counts = {
        (r.topic, r.partition): r["count"]
        for r in df.groupBy("topic", "partition").count().collect()
    }
    assert counts == {("topic1", 0): 27, ("topic1", 1): 60, ("topic2", 0): 10}

    # Subscribe to a pattern, at the earliest and latest offsets
    df = (
        spark.read.format("kstore")
        .option("store", url)
        .option("subscribePattern", "topic.*")
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    assert df.count() == 130

    # Write key-value data from a DataFrame to a specific topic given in an option
    store.create_topic("out", 1)
    source = spark.createDataFrame(
        [("k1", "v1", "out"), ("k2", "v2", "out")], "key string, value string, topic string"
    )
    (
        source.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)")
        .write.format("kstore")
        .option("store", url)
        .option("topic", "out")
        .mode("append")
        .save()
    )
    # Write key-value data from a DataFrame to Kafka using a topic specified in the data
    (
        source.selectExpr("topic", "CAST(key AS STRING)", "CAST(value AS STRING)")
        .write.format("kstore")
        .option("store", url)
        .mode("append")
        .save()
    )
    values = sorted(v for _, _, _, v in topic_rows(store, "out") if v is not None)
    assert values == [b"v1", b"v1", b"v2", b"v2"]


@pytest.mark.spark
def test_guide_streaming_examples(spark: Any, local_store_url: Any, tmp_path: Path) -> None:
    """The guide's streaming read and both streaming writes (topic option, topic column),
    `format` and the bootstrap option swapped, plus a checkpoint location each."""
    url, _ = local_store_url
    store = open_store(local_store_url)
    for name in ("topic1", "topic2", "topic3"):
        store.create_topic(name, 1)
    append(store, "topic1", 0, [b"a", b"b", b"c"], keys=[b"1", b"2", b"3"])

    # Subscribe to 1 topic (from the earliest offset here: the records are already there)
    df = (
        spark.readStream.format("kstore")
        .option("store", url)
        .option("subscribe", "topic1")
        .option("startingOffsets", "earliest")
        .load()
    )
    # Write key-value data from a DataFrame to a specific topic given in an option
    ds = (
        df.selectExpr("CAST(key AS STRING)", "CAST(value AS STRING)")
        .writeStream.format("kstore")
        .option("store", url)
        .option("topic", "topic2")
        .option("checkpointLocation", str(tmp_path / "c1"))
        .start()
    )
    # Write key-value data from a DataFrame to Kafka using a topic specified in the data
    ds2 = (
        df.selectExpr("'topic3' AS topic", "CAST(key AS STRING)", "CAST(value AS STRING)")
        .writeStream.format("kstore")
        .option("store", url)
        .option("checkpointLocation", str(tmp_path / "c2"))
        .start()
    )
    try:
        ds.processAllAvailable()
        ds2.processAllAvailable()
        progress = ds.lastProgress
    finally:
        ds.stop()
        ds2.stop()
    for name in ("topic2", "topic3"):
        rows = sorted((k, v) for _, _, k, v in topic_rows(store, name))
        assert rows == [(b"1", b"a"), (b"2", b"b"), (b"3", b"c")]
    source = progress["sources"][0]
    assert source["metrics"] == {}  # PySpark 4.3: a Python source reports none
    assert offsets_behind_latest(source)["maxOffsetsBehindLatest"] == "0"
