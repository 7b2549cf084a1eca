"""Batch reads through Spark: ``spark.read.format("kstore")`` and SQL, every read option."""

from __future__ import annotations

import datetime as dt
import json
import os
from typing import Any

import pytest
from kstore.spark_ext import register

from kstore import Store
from kstore.producer import Producer
from tests.test_spark_support import (
    BACKENDS,
    BASE_MS,
    append,
    apply_retention,
    arrow_rows,
    open_store,
    records,
    source_options,
)

pytestmark = [
    pytest.mark.spark,
    # PySpark 4.3 warns that it does not fully support pandas 3 when a feature imports pandas.
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

UTC = dt.UTC


def load(spark: Any, target: tuple[str, dict[str, Any]], **options: Any) -> Any:
    return spark.read.format("kstore").options(**source_options(target, **options)).load()


def ts(ms: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ms / 1000, UTC)


@pytest.mark.parametrize("target", BACKENDS)
def test_batch_read_equals_what_the_producer_wrote(
    spark: Any, target: str, request: pytest.FixtureRequest
) -> None:
    where = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("events", 3)
    sent = []
    with Producer(store, linger_ms=2) as producer:
        futures = []
        for i in range(300):
            key = None if i % 7 == 0 else b"user-%d" % (i % 13)
            headers = [("h", b"%d" % i), ("e", b"")] if i % 5 == 0 else None
            stamp = BASE_MS + i * 10
            futures.append(
                producer.send(
                    "events", value=b"value-%d" % i, key=key, headers=headers, timestamp_ms=stamp
                )
            )
            sent.append((key, b"value-%d" % i, headers, stamp))
        metas = [f.get(timeout=60) for f in futures]
    expected = sorted(
        (
            {
                "key": key,
                "value": value,
                "topic": "events",
                "partition": m.partition,
                "offset": m.offset,
                "timestamp": ts(stamp),
                "timestampType": 0,
                "headers": [{"key": k, "value": v} for k, v in headers] if headers else None,
            }
            for (key, value, headers, stamp), m in zip(sent, metas, strict=True)
        ),
        key=lambda r: (r["partition"], r["offset"]),
    )
    df = load(spark, where, subscribe="events", includeHeaders="true")
    assert df.columns == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    assert arrow_rows(df) == expected
    # Without includeHeaders there is no headers column (as the Kafka source).
    assert "headers" not in load(spark, where, subscribe="events").columns


def test_offsets_options_and_sentinels(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 2)
    for p in range(2):
        for seg in range(3):
            append(store, "t", p, [b"p%d-%d-%d" % (p, seg, i) for i in range(10)])

    def offsets(**options: Any) -> list[tuple[int, int]]:
        rows = load(spark, local_store_url, **options).select("partition", "offset").collect()
        return sorted((r.partition, r.offset) for r in rows)

    everything = [(p, o) for p in range(2) for o in range(30)]
    assert offsets(subscribe="t") == everything
    assert offsets(subscribe="t", startingOffsets="earliest", endingOffsets="latest") == everything
    assert offsets(
        subscribe="t", startingOffsets='{"t":{"0":5,"1":-2}}', endingOffsets='{"t":{"0":12,"1":-1}}'
    ) == [(0, o) for o in range(5, 12)] + [(1, o) for o in range(30)]
    assert offsets(assign='{"t":[1]}', startingOffsets='{"t":{"1":28}}') == [(1, 28), (1, 29)]
    with pytest.raises(Exception, match="must cover exactly the partitions"):
        offsets(subscribe="t", startingOffsets='{"t":{"0":5}}')
    with pytest.raises(Exception, match="beyond the log end offset 30"):
        offsets(subscribe="t", endingOffsets='{"t":{"0":31,"1":-1}}')
    with pytest.raises(Exception, match="is after the ending offset"):
        offsets(
            subscribe="t",
            startingOffsets='{"t":{"0":20,"1":0}}',
            endingOffsets='{"t":{"0":10,"1":-1}}',
        )


def test_subscribe_pattern_and_assign(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    for name in ("orders-eu", "orders-us", "payments"):
        store.create_topic(name, 2)
        for p in range(2):
            append(store, name, p, [b"%s-%d" % (name.encode(), p)])

    def topics(**options: Any) -> list[tuple[str, int]]:
        return sorted(
            (r.topic, r.partition) for r in load(spark, local_store_url, **options).collect()
        )

    assert topics(subscribePattern="orders-.*") == [
        ("orders-eu", 0),
        ("orders-eu", 1),
        ("orders-us", 0),
        ("orders-us", 1),
    ]
    assert topics(subscribePattern="orders") == []  # a full match, as Java's Pattern.matches
    assert topics(subscribe="payments,orders-us") == [
        ("orders-us", 0),
        ("orders-us", 1),
        ("payments", 0),
        ("payments", 1),
    ]
    assert topics(assign='{"payments":[1],"orders-eu":[0]}') == [("orders-eu", 0), ("payments", 1)]
    with pytest.raises(Exception, match=r"topic 'nope' .* does not exist"):
        topics(subscribe="nope")
    with pytest.raises(Exception, match=r"has partitions 0..1"):
        topics(assign='{"payments":[2]}')


def test_timestamp_options(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 2)
    # Partition 0: timestamps BASE+0..99 in two segments; partition 1: BASE+1000..1099.
    for p, base in ((0, BASE_MS), (1, BASE_MS + 1000)):
        for half in range(2):
            stamps = [base + half * 50 + i for i in range(50)]
            append(store, "t", p, [b"%d" % s for s in stamps], timestamps_ms=stamps)

    def offsets(**options: Any) -> list[tuple[int, int]]:
        rows = (
            load(spark, local_store_url, subscribe="t", **options)
            .select("partition", "offset")
            .collect()
        )
        return sorted((r.partition, r.offset) for r in rows)

    # startingTimestamp: first offset at or after it, per partition.
    assert offsets(startingTimestamp=BASE_MS + 40) == [(0, o) for o in range(40, 100)] + [
        (1, o) for o in range(100)
    ]
    assert offsets(
        startingOffsetsByTimestamp=json.dumps({"t": {"0": BASE_MS + 60, "1": BASE_MS + 1095}})
    ) == [(0, o) for o in range(60, 100)] + [(1, o) for o in range(95, 100)]
    # endingTimestamp: up to (not including) the first offset at or after it.
    assert offsets(endingTimestamp=BASE_MS + 3) == [(0, 0), (0, 1), (0, 2)]
    assert offsets(
        endingOffsetsByTimestamp=json.dumps({"t": {"0": BASE_MS + 2, "1": BASE_MS + 1001}})
    ) == [(0, 0), (0, 1), (1, 0)]
    # No record that new: an error by default, the end with the "latest" strategy.
    with pytest.raises(Exception, match="t-0 has no record at or after timestamp"):
        offsets(startingTimestamp=BASE_MS + 1090)
    assert offsets(
        startingTimestamp=BASE_MS + 1090, startingOffsetsByTimestampStrategy="latest"
    ) == [(1, o) for o in range(90, 100)]


def test_min_partitions_splits_at_segment_boundaries(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 1)
    for seg in range(6):
        append(store, "t", 0, [b"%d-%d" % (seg, i) for i in range(20)])
    assert load(spark, local_store_url, subscribe="t").rdd.getNumPartitions() == 1
    df = load(spark, local_store_url, subscribe="t", minPartitions=3)
    assert df.rdd.getNumPartitions() == 3
    assert sorted(r.offset for r in df.select("offset").collect()) == list(range(120))


def test_fail_on_data_loss_for_batch_reads(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 1)
    for seg in range(3):
        append(store, "t", 0, [b"%d-%d" % (seg, i) for i in range(10)])
    assert apply_retention(store, "t", 0, 1) == 10
    # earliest means the log start offset: no loss.
    assert load(spark, local_store_url, subscribe="t").count() == 20
    with pytest.raises(Exception, match=r"the log now starts at 10.*failOnDataLoss"):
        load(spark, local_store_url, subscribe="t", startingOffsets='{"t":{"0":0}}').collect()
    rows = load(
        spark,
        local_store_url,
        subscribe="t",
        startingOffsets='{"t":{"0":0}}',
        failOnDataLoss="false",
    )
    assert sorted(r.offset for r in rows.select("offset").collect()) == list(range(10, 30))


def test_isolation_level_stops_at_the_last_stable_offset(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 1)
    append(store, "t", 0, [b"a", b"b"])
    part = store.partition("t", 0)
    open_file = part.write_segment(records([b"pending"]), durable=False)
    part.commit_segments([open_file], transaction="producer-1:0", durable=False)
    append(store, "t", 0, [b"c"])
    committed = load(spark, local_store_url, subscribe="t")
    assert sorted(r.value for r in committed.collect()) == [b"a", b"b"]
    everything = load(spark, local_store_url, subscribe="t", isolationLevel="read_uncommitted")
    assert sorted(r.value for r in everything.collect()) == [b"a", b"b", b"c", b"pending"]
    part.end_transaction("producer-1", 0, 0, commit=False)  # aborted: its records are removed
    assert sorted(r.value for r in load(spark, local_store_url, subscribe="t").collect()) == [
        b"a",
        b"b",
        b"c",
    ]


def test_a_user_schema_prunes_columns(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 1)
    append(store, "t", 0, [b"x", b"y"], keys=[b"k1", b"k2"])
    df = (
        spark.read.format("kstore")
        .schema("offset bigint, value binary")
        .options(**source_options(local_store_url, subscribe="t"))
        .load()
    )
    assert df.columns == ["offset", "value"]
    assert [(r.offset, r.value) for r in df.orderBy("offset").collect()] == [(0, b"x"), (1, b"y")]
    bad = (
        spark.read.format("kstore")
        .schema("offset string")
        .options(**source_options(local_store_url, subscribe="t"))
    )
    with pytest.raises(Exception, match="'offset' must have type bigint"):
        bad.load().collect()


def test_clear_errors_for_bad_options(spark: Any, local_store_url: Any, tmp_path: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 1)
    with pytest.raises(
        Exception, match=r"exactly one of the options 'subscribe'.*given: subscribe, assign"
    ):
        load(spark, local_store_url, subscribe="t", assign='{"t":[0]}').collect()
    with pytest.raises(Exception, match="'startingOffsets': malformed JSON"):
        load(spark, local_store_url, subscribe="t", startingOffsets='{"t":').collect()
    with pytest.raises(
        Exception,
        match="unknown kstore option 'maxofsetspertrigger'; did you mean 'maxOffsetsPerTrigger'",
    ):
        load(spark, local_store_url, subscribe="t", maxOfsetsPerTrigger="5").collect()
    with pytest.raises(Exception, match="no kstore store at"):
        spark.read.format("kstore").option("store", (tmp_path / "nothing").as_uri()).option(
            "subscribe", "t"
        ).load().collect()


def test_sql_view_and_table(spark: Any, local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 2)
    append(store, "t", 0, [b"a", b"b"], keys=[b"k", b"k"])
    append(store, "t", 1, [b"c"])
    url = local_store_url[0]
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW t_view USING kstore OPTIONS (store '{url}', subscribe 't')"
    )
    rows = spark.sql(
        "SELECT partition, offset, CAST(value AS STRING) AS v FROM t_view ORDER BY partition, offset"
    ).collect()
    assert [(r.partition, r.offset, r.v) for r in rows] == [(0, 0, "a"), (0, 1, "b"), (1, 0, "c")]
    # SQL writes: INSERT INTO a temporary view over the sink's options (columns not given
    # are NULL: the partitioner places the record, the sink ignores offset and timestampType).
    spark.sql(
        f"CREATE OR REPLACE TEMPORARY VIEW t_sink USING kstore OPTIONS (store '{url}', topic 't')"
    )
    spark.sql("INSERT INTO t_sink (key, value) SELECT CAST('k2' AS BINARY), CAST('d' AS BINARY)")
    values = sorted(
        r.v for r in spark.sql("SELECT CAST(value AS STRING) AS v FROM t_view").collect()
    )
    assert values == ["a", "b", "c", "d"]
    # SQL writes with the options in the statement.
    spark.sql(
        f"INSERT INTO t_sink WITH ('store' = '{url}', 'topic' = 't') (value) SELECT CAST('e' AS BINARY)"
    )
    assert spark.sql("SELECT count(*) AS n FROM t_view").collect()[0].n == 5
    # A catalog table gets none of its options from Spark 4.3: a clear error says what to do.
    spark.sql("DROP TABLE IF EXISTS t_table")
    spark.sql(f"CREATE TABLE t_table USING kstore OPTIONS (store '{url}', subscribe 't')")
    try:
        with pytest.raises(Exception, match="use a temporary view"):
            spark.sql("SELECT count(*) FROM t_table").collect()
    finally:
        spark.sql("DROP TABLE IF EXISTS t_table")


def test_a_dataframe_reused_after_a_filtered_query_is_still_complete(
    spark: Any, local_store_url: Any
) -> None:
    # The reason filter pushdown is off by default (see kstore.spark_ext.register).
    store = open_store(local_store_url)
    store.create_topic("t", 2)
    for p in range(2):
        append(store, "t", p, [b"%d" % i for i in range(10)])
    df = load(spark, local_store_url, subscribe="t")
    assert df.filter("partition = 1 AND offset < 3").count() == 3
    assert df.count() == 20


class TestFilterPushdown:
    """With ``register(spark, filter_pushdown=True)``: filters on topic, partition, offset and
    timestamp are taken over by kstore and applied exactly (Spark does not check them again)."""

    @pytest.fixture(autouse=True)
    def pushdown(self, spark: Any) -> Any:
        register(spark, filter_pushdown=True)
        yield
        register(spark)
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "false")

    @pytest.fixture
    def topic(self, local_store_url: Any) -> Store:
        store = open_store(local_store_url)
        store.create_topic("a", 2)
        store.create_topic("b", 1)
        for name, parts in (("a", 2), ("b", 1)):
            for p in range(parts):
                for seg in range(4):
                    stamps = [BASE_MS + seg * 1000 + i * 10 for i in range(25)]
                    append(
                        store,
                        name,
                        p,
                        [b"%s%d-%d" % (name.encode(), p, s) for s in stamps],
                        timestamps_ms=stamps,
                    )
        return store

    def all_rows(self, spark: Any, target: Any) -> list[dict[str, Any]]:
        return arrow_rows(load(spark, target, subscribePattern="a|b"))

    @pytest.mark.parametrize(
        "condition",
        [
            "partition = 1",
            "offset >= 30 AND offset < 60",
            "offset > 98",
            "offset IN (0, 26, 77, 1000)",
            "offset = 5 OR offset = 7",  # an OR stays with Spark
            "topic = 'b'",
            "topic IN ('a') AND partition IN (0)",
            "topic LIKE 'b%'",
            "timestamp >= TIMESTAMP '2023-11-14 22:13:22' AND timestamp < TIMESTAMP '2023-11-14 22:13:23.1'",
            "timestamp > TIMESTAMP '2023-11-14 22:13:23.230'",
            "timestampType = 0 AND partition = 0 AND offset <= 3",
            "timestampType = 1",
            "offset IS NULL",
            "NOT (partition = 0)",
            "value = X'61302D31373030303030303030303030'",
        ],
    )
    def test_results_equal_spark_filtering(
        self, spark: Any, local_store_url: Any, topic: Store, condition: str
    ) -> None:
        expected_df = spark.createDataFrame(
            self.all_rows(spark, local_store_url),
            load(spark, local_store_url, subscribe="a").schema,
        )
        expected = arrow_rows(expected_df.filter(condition))
        got = arrow_rows(load(spark, local_store_url, subscribePattern="a|b").filter(condition))
        assert got == expected

    def test_pruned_segments_are_never_opened(
        self, spark: Any, local_store_url: Any, topic: Store
    ) -> None:
        # Delete the first segment file of a-0: a read that needs it fails, a pruned one cannot.
        part = topic.partition("a", 0)
        first = part.state().segments[0]
        os.unlink(
            os.path.join(topic.storage.root, *part.directory.split("/"), *first.path.split("/"))
        )
        df = load(spark, local_store_url, subscribe="a")
        assert df.filter("partition = 0 AND offset >= 25").count() == 75
        assert df.filter("partition = 1").count() == 100
        later = load(spark, local_store_url, subscribe="a")
        assert later.filter("timestamp >= TIMESTAMP '2023-11-14 22:13:21'").count() == 150
        with pytest.raises(Exception, match="segment file is missing"):
            load(spark, local_store_url, subscribe="a").filter("partition = 0").count()

    def test_explain_shows_what_was_pushed(
        self, spark: Any, local_store_url: Any, topic: Store
    ) -> None:
        df = load(spark, local_store_url, subscribe="a").filter(
            "partition = 1 AND value IS NOT NULL"
        )
        plan = df._jdf.queryExecution().executedPlan().toString()
        assert "PushedFilters" not in plan or "partition" in plan
        assert df.count() == 100
