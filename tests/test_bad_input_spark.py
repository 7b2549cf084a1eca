"""Bad options to the Spark data source `kstore` (invariant 8): read and write, batch and
stream. Option parsing is checked directly (no Spark action: cheap), then a few cases through
a real Spark session prove that the error reaches the user with the option named and that
nothing is written to the store.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kstore.spark_ext.options import InvalidOptionError, parse_read_options, parse_write_options

from kstore import Producer, Store
from tests.badinput import local_snapshot

BASE = {"store": "memory://kstore-options/s"}

WRITE_CASES: list[tuple[dict[str, str], bool, str]] = [
    ({"topic": "../x"}, False, "'topic': invalid topic name '../x'"),
    ({"topic": "t\u202e"}, False, "illegal characters ('\\u202e')"),
    ({"topic": "a\uff0eb"}, False, "illegal characters ('\\uff0e')"),
    ({"topic": "x" * 250}, True, "is 250 characters long"),
    ({"topic": ""}, False, "must not be empty"),
    ({"partitioner": "random"}, False, "unknown partitioner 'random'"),
    ({"txnAppId": " ", "txnVersion": "1"}, False, "'txnAppId': must not be empty"),
    ({"txnAppId": "a"}, False, "'txnVersion' is missing"),
    ({"txnVersion": "1"}, False, "'txnAppId' is missing"),
    ({"txnAppId": "a", "txnVersion": "-1"}, False, "'txnVersion': -1 is out of range"),
    ({"txnAppId": "a", "txnVersion": "one"}, False, "'txnVersion': expected an integer"),
    ({"txnAppId": "a", "txnVersion": "1"}, True, "'txnVersion': is for batch writes"),
    ({"segmentBytes": "0"}, False, "'segmentBytes': must be positive"),
    ({"segmentBytes": "-5"}, True, "'segmentBytes': expected a size"),
    ({"segmentBytes": "lots"}, False, "'segmentBytes': expected a size"),
    ({"compression": "gzip"}, False, "'compression': expected none, zstd or lz4"),
    ({"acks": "0"}, True, "'acks': expected all or 1"),
    ({"topik": "t"}, False, "unknown kstore option 'topik'; did you mean 'topic'"),
    ({"kafka.key.serializer": "x"}, True, "'kafka.key.serializer' is not supported"),
    ({"storageOptions": "{bad"}, False, "'storageOptions': malformed JSON"),
    ({"storageOptions": "[1]"}, True, "'storageOptions': expected a JSON object"),
    ({"store": ""}, False, "'store' is required"),
]


@pytest.mark.parametrize(
    ("options", "streaming", "fragment"),
    WRITE_CASES,
    ids=[f"{i}-{'stream' if s else 'batch'}" for i, (_, s, _) in enumerate(WRITE_CASES)],
)
def test_bad_write_options_are_named(
    options: dict[str, str], streaming: bool, fragment: str
) -> None:
    with pytest.raises(InvalidOptionError) as info:
        parse_write_options({**BASE, **options}, streaming=streaming)
    assert fragment in str(info.value)


READ_CASES: list[tuple[dict[str, str], bool, str]] = [
    ({}, False, "give exactly one of the options"),
    ({"subscribe": "t", "assign": '{"t":[0]}'}, True, "(given: subscribe, assign)"),
    ({"subscribe": "t", "subscribePattern": "t"}, False, "(given: subscribe, subscribePattern)"),
    ({"subscribe": "../x"}, True, "'subscribe': invalid topic name '../x'"),
    ({"subscribe": "a\x00b"}, False, "'subscribe': invalid topic name"),
    ({"subscribe": "caf\u00e9"}, False, "illegal characters ('\\xe9')"),
    ({"assign": '{"../x":[0]}'}, True, "'assign': invalid topic name '../x'"),
    ({"assign": '{"t":[true]}'}, False, "partition True is not a non-negative integer"),
    ({"assign": "[1]"}, False, "'assign': expected a JSON object"),
    ({"subscribePattern": "("}, True, "invalid regular expression"),
    ({"subscribe": "t", "startingOffsets": '{"../x":{"0":1}}'}, False, "invalid topic name"),
    ({"subscribe": "t", "startingTimestamp": "-1"}, False, "-1 is out of range"),
    ({"subscribe": "t", "endingTimestamp": "abc"}, False, "'endingTimestamp': expected an integer"),
    ({"subscribe": "t", "endingOffsets": "latest"}, True, "is for batch queries only"),
    ({"subscribe": "t", "endingTimestamp": "5"}, True, "is for batch queries only"),
    ({"subscribe": "t", "maxOffsetsPerTrigger": "0"}, True, "0 is out of range"),
    ({"subscribe": "t", "maxOffsetsPerTrigger": "1" + "0" * 20}, True, "out of range"),
    ({"subscribe": "t", "maxBytesPerTrigger": "-1"}, True, "expected a size"),
    (
        {"subscribe": "t", "minOffsetsPerTrigger": "9", "maxOffsetsPerTrigger": "5"},
        True,
        "exceeds maxOffsetsPerTrigger",
    ),
    ({"subscribe": "t", "maxTriggerDelay": "5m"}, True, "together with 'minOffsetsPerTrigger'"),
    ({"subscribe": "t", "minPartitions": "100001"}, False, "exceeds the limit 100000"),
    ({"subscribe": "t", "minPartitions": "0"}, True, "0 is out of range"),
    ({"subscribe": "t", "failOnDataLoss": "sometimes"}, True, "expected true or false"),
    ({"subscribe": "t", "isolationLevel": "serializable"}, True, "read_committed"),
    ({"subscribe": "t", "groupId": "g\u202e"}, True, "'groupId': invalid group id"),
    ({"subscribe": "t", "startingOffsets": "group"}, True, "needs the option groupId"),
    ({"subscribe": "t", "kafka.value.deserializer": "x"}, True, "cast or parse the 'value'"),
    ({"subscribe": "t", "subscrib": "u"}, False, "did you mean 'subscribe'"),
]


@pytest.mark.parametrize(
    ("options", "streaming", "fragment"),
    READ_CASES,
    ids=[f"{i}-{'stream' if s else 'batch'}" for i, (_, s, _) in enumerate(READ_CASES)],
)
def test_bad_read_options_are_named(
    options: dict[str, str], streaming: bool, fragment: str
) -> None:
    with pytest.raises(InvalidOptionError) as info:
        parse_read_options({**BASE, **options}, streaming=streaming)
    assert fragment in str(info.value)


def test_segment_bytes_has_an_upper_bound() -> None:
    with pytest.raises(InvalidOptionError, match="segmentBytes"):
        parse_write_options({**BASE, "segmentBytes": "1" + "0" * 23}, streaming=False)


# --- through Spark -----------------------------------------------------------------------------


@pytest.fixture
def local_topic(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    store = Store(str(root))
    store.create_topic("t", 2)
    with Producer(store) as p:
        for i in range(4):
            p.send("t", b"v%d" % i, partition=i % 2)
    return root


def _store_files(root: Path) -> dict[str, bytes]:
    """The store's files, without the Spark sink's private area (spark/pending/, PROTOCOL.md
    4.3): a failed job leaves its abort marker there, which no reader looks at."""
    return {k: v for k, v in local_snapshot(str(root)).items() if not k.startswith("spark/")}


def _message(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _run_stream(start: Any) -> None:
    """Start a streaming query and wait for it: its errors surface from awaitTermination."""
    query = start()
    try:
        query.awaitTermination(60)
    finally:
        query.stop()


@pytest.mark.spark
@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
def test_bad_read_options_fail_the_query_with_the_option_named(
    spark: Any, local_topic: Path
) -> None:
    before = _store_files(local_topic)
    store = str(local_topic)
    cases = [
        ({"subscribe": "../x"}, "invalid topic name '../x'"),
        ({"subscribe": "t", "startingOffsets": "oldest"}, "'startingOffsets'"),
        ({"subscribe": "nope"}, "nope"),
    ]
    for options, fragment in cases:
        with pytest.raises(Exception) as info:
            spark.read.format("kstore").option("store", store).options(**options).load().count()
        assert fragment in _message(info.value)
    with pytest.raises(Exception) as info:
        _run_stream(
            lambda: (
                spark.readStream.format("kstore")
                .option("store", store)
                .option("subscribe", "t")
                .option("endingOffsets", "latest")
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", str(local_topic.parent / "read-checkpoint"))
                .start()
            )
        )
    assert "'endingOffsets': is for batch queries only" in _message(info.value)
    assert _store_files(local_topic) == before


@pytest.mark.spark
@pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning")
def test_bad_write_options_fail_the_write_and_write_nothing(
    spark: Any, local_topic: Path, tmp_path: Path
) -> None:
    before = _store_files(local_topic)
    store = str(local_topic)
    values = spark.range(2).selectExpr("CAST(id AS STRING) AS value")
    cases = [
        ({"topic": "t\u202e"}, "illegal characters ('\\u202e')"),
        ({"topic": "t", "txnAppId": "a"}, "'txnVersion' is missing"),
        ({"topic": "t", "compression": "gzip"}, "'compression'"),
        ({"topic": "t", "segmentBytes": "0"}, "'segmentBytes': must be positive"),
    ]
    for options, fragment in cases:
        with pytest.raises(Exception) as info:
            values.write.format("kstore").option("store", store).options(**options).mode(
                "append"
            ).save()
        assert fragment in _message(info.value)
    with pytest.raises(Exception) as info:
        values.selectExpr("value", "-1 AS partition").write.format("kstore").option(
            "store", store
        ).option("topic", "t").mode("append").save()
    assert "-1" in _message(info.value)
    stream = spark.readStream.format("rate").load().selectExpr("CAST(value AS STRING) AS value")
    with pytest.raises(Exception) as info:
        _run_stream(
            lambda: (
                stream.writeStream.format("kstore")
                .option("store", store)
                .option("topic", "t")
                .option("txnAppId", "a")
                .option("txnVersion", "1")
                .option("checkpointLocation", str(tmp_path / "checkpoint"))
                .start()
            )
        )
    assert "'txnVersion': is for batch writes" in _message(info.value)
    assert _store_files(local_topic) == before
