"""Option parsing, filter classification and planning arithmetic of the kstore data source,
without a Spark session (fast). The end-to-end behaviour of each option is in
test_spark_read.py and test_spark_stream.py."""

from __future__ import annotations

import datetime as dt

import pytest
from kstore.spark_ext.filters import push
from kstore.spark_ext.options import (
    DEFAULT_MAX_TRIGGER_DELAY_MS,
    InvalidOptionError,
    parse_bytes,
    parse_duration_ms,
    parse_read_options,
    parse_write_options,
)
from kstore.spark_ext.reading import (
    _split,
    byte_limit,
    from_json_offsets,
    rate_limit,
    to_json_offsets,
)
from kstore.spark_ext.schema import output_columns, spark_schema
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    Not,
    StringStartsWith,
)
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from kstore.partition import PartitionState, Segment
from kstore.records import TopicPartition

BASE = {"store": "file:///tmp/ks", "subscribe": "t"}


def read(streaming: bool = False, **options: str) -> object:
    return parse_read_options({**BASE, **options}, streaming=streaming)


def test_defaults_follow_the_kafka_source() -> None:
    batch = parse_read_options(BASE, streaming=False)
    stream = parse_read_options(BASE, streaming=True)
    assert batch.starting.kind == "earliest"
    assert batch.ending.kind == "latest"
    assert stream.starting.kind == "latest"
    assert batch.fail_on_data_loss is True
    assert batch.include_headers is False
    assert batch.read_committed is True
    assert stream.max_trigger_delay_ms == DEFAULT_MAX_TRIGGER_DELAY_MS
    assert batch.max_offsets_per_trigger is None
    assert batch.min_partitions is None


def test_option_names_are_case_insensitive() -> None:
    opts = parse_read_options(
        {
            "STORE": "file:///x",
            "SubScribe": "a,b",
            "STARTINGOFFSETS": "earliest",
            "includeheaders": "TRUE",
        },
        streaming=True,
    )
    assert opts.subscription.topics == ("a", "b")
    assert opts.starting.kind == "earliest"
    assert opts.include_headers


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t", "assign": '{"t":[0]}'}, "exactly one of"),
        ({"subscribe": None}, "exactly one of"),
        ({"subscribePattern": "t", "subscribe": "u"}, "exactly one of"),
        ({"subscribe": " , "}, "names no topic"),
        ({"subscribe": "bad topic"}, "'subscribe'.*illegal characters"),
        ({"subscribe": None, "subscribePattern": "(unclosed"}, "invalid regular expression"),
        ({"subscribe": None, "assign": "{not json"}, "'assign': malformed JSON"),
        ({"subscribe": None, "assign": '{"t":[-1]}'}, "not a non-negative integer"),
        ({"subscribe": None, "assign": '{"t":[]}'}, "non-empty list"),
        ({"startingOffsets": "oldest"}, "'startingOffsets': expected earliest, latest or a JSON"),
        ({"startingOffsets": "latest"}, "not allowed for batch"),
        ({"startingOffsets": '{"t":{"0":-1}}'}, r"offset -1 \(latest\) is not allowed"),
        ({"startingOffsets": '{"t":{"x":1}}'}, "partition 'x'"),
        ({"startingOffsets": '{"t":{"0":"5"}}'}, "is not an integer"),
        ({"startingOffsets": '{"t":{"0":5'}, "'startingOffsets': malformed JSON"),
        ({"startingOffsets": "group"}, "needs the option groupId"),
        ({"endingOffsets": "earliest"}, "'endingOffsets'.*not allowed"),
        ({"endingOffsets": '{"t":{"0":-2}}'}, r"-2 \(earliest\) is not allowed"),
        ({"startingTimestamp": "yesterday"}, "'startingTimestamp': expected an integer"),
        ({"startingOffsetsByTimestamp": '{"t":{"0":-5}}'}, "not a non-negative integer"),
        ({"startingOffsetsByTimestampStrategy": "skip"}, "expected error or latest"),
        ({"maxOffsetsPerTrigger": "0"}, "out of range"),
        ({"maxOffsetsPerTrigger": "ten"}, "'maxOffsetsPerTrigger': expected an integer"),
        (
            {"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"},
            "exceeds maxOffsetsPerTrigger",
        ),
        ({"maxTriggerDelay": "5m"}, "only has a meaning together with 'minOffsetsPerTrigger'"),
        ({"minOffsetsPerTrigger": "5", "maxTriggerDelay": "5 fortnights"}, "expected a duration"),
        ({"maxBytesPerTrigger": "lots"}, "expected a size"),
        ({"minPartitions": "0"}, "out of range"),
        ({"failOnDataLoss": "maybe"}, "'failOnDataLoss': expected true or false"),
        ({"includeHeaders": "1"}, "'includeHeaders': expected true or false"),
        ({"isolationLevel": "dirty"}, "expected read_committed or read_uncommitted"),
        ({"groupId": "../g"}, "invalid group id"),
        ({"subscibe": "t"}, "unknown kstore option 'subscibe'; did you mean 'subscribe'"),
        ({"kafka.auto.offset.reset": "earliest"}, "use option 'startingOffsets'"),
        ({"store": ""}, "'store' is required"),
        ({"storageOptions": "[1]"}, "expected a JSON object"),
    ],
)
def test_bad_read_options_are_named(options: dict[str, str | None], message: str) -> None:
    merged = {**BASE, **options}
    given = {k: v for k, v in merged.items() if v is not None}
    with pytest.raises(InvalidOptionError, match=message):
        parse_read_options(given, streaming=False)


@pytest.mark.parametrize("name", ["endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"])
def test_ending_options_are_refused_for_streaming(name: str) -> None:
    value = {"endingOffsets": "latest", "endingTimestamp": "5"}.get(name, '{"t":{"0":5}}')
    with pytest.raises(InvalidOptionError, match=f"'{name}': is for batch queries only"):
        parse_read_options({**BASE, name: value}, streaming=True)


def test_starting_precedence_is_kafkas() -> None:
    # startingTimestamp wins over startingOffsetsByTimestamp, which wins over startingOffsets.
    opts = parse_read_options(
        {
            **BASE,
            "startingOffsets": "earliest",
            "startingOffsetsByTimestamp": '{"t":{"0":5}}',
            "startingTimestamp": "7",
        },
        streaming=True,
    )
    assert opts.starting.kind == "timestamp"
    assert opts.starting.timestamp_ms == 7
    opts = parse_read_options(
        {**BASE, "startingOffsets": "earliest", "startingOffsetsByTimestamp": '{"t":{"0":5}}'},
        streaming=True,
    )
    assert opts.starting.kind == "timestamps"
    assert opts.starting.timestamps == {("t", 0): 5}


def test_json_offsets_and_assign() -> None:
    opts = parse_read_options(
        {
            "store": "memory://x",
            "assign": '{"a":[0,2],"b":[1]}',
            "startingOffsets": '{"a":{"0":-2,"2":7},"b":{"1":-1}}',
        },
        streaming=True,
    )
    assert opts.subscription.assigned == (("a", 0), ("a", 2), ("b", 1))
    assert opts.starting.offsets == {("a", 0): -2, ("a", 2): 7, ("b", 1): -1}


def test_storage_options_from_json_and_prefixed_options() -> None:
    opts = parse_read_options(
        {
            **BASE,
            "storageOptions": '{"anon": false, "client_kwargs": {"region_name": "x"}}',
            "storage.key": "123",
            "storage.use_ssl": "false",
            "storage.config_kwargs": '{"a": 1}',
        },
        streaming=False,
    )
    assert opts.store.storage_options == {
        "anon": False,
        "client_kwargs": {"region_name": "x"},
        "key": "123",
        "use_ssl": False,
        "config_kwargs": {"a": 1},
    }


def test_spark_added_options_are_accepted() -> None:
    opts = parse_write_options(
        {**BASE, "topic": "t", "checkpointLocation": "/tmp/c", "path": "x", "__internal": "1"},
        streaming=True,
    )
    assert opts.checkpoint_location == "/tmp/c"


def test_durations_and_sizes() -> None:
    assert parse_duration_ms("d", "15m") == 900_000
    assert parse_duration_ms("d", "30s") == 30_000
    assert parse_duration_ms("d", "250ms") == 250
    assert parse_duration_ms("d", "100") == 100
    assert parse_duration_ms("d", "1h") == 3_600_000
    assert parse_bytes("b", "512k") == 512 * 1024
    assert parse_bytes("b", "64m") == 64 << 20
    assert parse_bytes("b", "1g") == 1 << 30
    assert parse_bytes("b", "1000") == 1000
    with pytest.raises(InvalidOptionError, match="must be positive"):
        parse_bytes("maxBytesPerTrigger", "0")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"partitioner": "random"}, "unknown partitioner 'random'"),
        ({"txnAppId": "a"}, "'txnVersion' is missing"),
        ({"txnVersion": "3"}, "'txnAppId' is missing"),
        ({"txnAppId": " ", "txnVersion": "1"}, "must not be empty"),
        ({"compression": "gzip"}, "expected none, zstd or lz4"),
        ({"acks": "0"}, "expected all or 1"),
        ({"segmentBytes": "-1"}, "expected a size"),
        ({"topic": "a b"}, "'topic'.*illegal characters"),
    ],
)
def test_bad_write_options_are_named(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidOptionError, match=message):
        parse_write_options({"store": "file:///x", **options}, streaming=False)


def test_txn_version_is_for_batch_writes_only() -> None:
    with pytest.raises(InvalidOptionError, match="'txnVersion': is for batch writes"):
        parse_write_options(
            {"store": "file:///x", "txnAppId": "a", "txnVersion": "1"}, streaming=True
        )


def test_schema_is_the_kafka_sources() -> None:
    assert spark_schema(False).simpleString() == (
        "struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
        "timestamp:timestamp,timestampType:int>"
    )
    assert spark_schema(True).fieldNames()[-1] == "headers"


def test_a_user_schema_prunes_columns() -> None:
    schema = StructType([StructField("offset", LongType()), StructField("value", BinaryType())])
    assert output_columns(schema, False) == ["offset", "value"]
    with pytest.raises(InvalidOptionError, match="'nope' is not a Kafka source column"):
        output_columns(StructType([StructField("nope", LongType())]), False)
    with pytest.raises(InvalidOptionError, match="'offset' must have type bigint"):
        output_columns(StructType([StructField("offset", BinaryType())]), False)
    with pytest.raises(InvalidOptionError, match="needs the option includeHeaders"):
        output_columns(spark_schema(True), False)


def test_filters_kstore_takes_over_and_the_ones_it_leaves_to_spark() -> None:
    when = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
    taken = [
        EqualTo(("partition",), 1),
        GreaterThanOrEqual(("offset",), 10),
        LessThan(("offset",), 20),
        GreaterThan(("timestamp",), when),
        In(("topic",), ("a", "b")),
        StringStartsWith(("topic",), "a"),
        IsNotNull(("offset",)),
    ]
    kept = [
        EqualTo(("key",), b"k"),  # key/value/headers: Spark's
        Not(EqualTo(("partition",), 1)),
        EqualTo(("offset",), 1.5),  # an unexpected literal type
        GreaterThan(("timestamp",), dt.datetime(2024, 1, 1)),  # naive: ambiguous
    ]
    pushdown, remaining = push(taken + kept)
    assert remaining == kept
    assert len(pushdown.conditions) == len(taken)
    assert pushdown.bounds("offset") == (10, 19)
    micros = (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)
    assert pushdown.bounds("timestamp") == (micros + 1, None)
    assert pushdown.accepts_task("a", 1, 0)
    assert not pushdown.accepts_task("b", 1, 0)  # b does not start with "a"
    assert not pushdown.accepts_task("a", 2, 0)


def test_offsets_json_round_trip_is_canonical() -> None:
    offsets = {TopicPartition("b", 1): 5, TopicPartition("a", 10): 1, TopicPartition("a", 2): 3}
    data = to_json_offsets(offsets)
    assert list(data) == ["a", "b"]
    assert list(data["a"]) == ["2", "10"]
    assert from_json_offsets(data) == offsets


def test_rate_limit_prorates_like_kafka() -> None:
    a, b, c = (TopicPartition("t", i) for i in range(3))
    begin = {a: 0, b: 100, c: 50}
    until = {a: 300, b: 200, c: 50}
    limited = rate_limit(100, begin, until)
    assert limited == {a: 75, b: 125, c: 50}  # 300:100 backlog shares of 100
    assert rate_limit(1000, begin, until) == until
    # A tiny share still advances by one offset, as Kafka's ceil for prorates below 1.
    assert rate_limit(1, {a: 0, b: 0}, {a: 10, b: 10}) == {a: 1, b: 1}


def _segment(base: int, last: int, size: int) -> Segment:
    return Segment(
        f"segments/{base}.arrow",
        base,
        last,
        last - base + 1,
        0,
        0,
        size,
        "crc32c:0",
        "arrow",
        False,
        0,
    )


def test_byte_limit_uses_manifest_sizes() -> None:
    tp = TopicPartition("t", 0)
    state = PartitionState()
    state.segments = [_segment(0, 99, 10_000), _segment(100, 199, 10_000)]  # 100 bytes/offset
    state.end_offset = 200
    assert byte_limit(5_000, {tp: 0}, {tp: 200}, {tp: state}) == {tp: 50}
    assert byte_limit(50_000, {tp: 0}, {tp: 200}, {tp: state}) == {tp: 200}
    assert byte_limit(1, {tp: 0}, {tp: 200}, {tp: state}) == {tp: 1}  # always progress


def test_min_partitions_splits_inside_segments_and_prefers_near_boundaries() -> None:
    segs = [_segment(i * 100, i * 100 + 99, 1) for i in range(4)]
    assert _split(segs, 0, 400, 2) == [(0, 200), (200, 400)]
    assert _split(segs, 0, 400, 4) == [(0, 100), (100, 200), (200, 300), (300, 400)]
    # As Kafka's source: as many pieces as asked, of similar sizes, inside segments too.
    assert _split(segs, 50, 350, 10) == [(50 + 30 * i, 80 + 30 * i) for i in range(10)]
    assert _split(segs[:1], 0, 100, 5) == [(0, 20), (20, 40), (40, 60), (60, 80), (80, 100)]
    assert _split(segs, 0, 400, 3) == [(0, 133), (133, 267), (267, 400)]
    # A cut within a tenth of a piece of a segment boundary moves to it.
    assert _split(segs, 0, 390, 2) == [(0, 200), (200, 390)]
    assert _split(segs[:1], 0, 3, 5) == [(0, 1), (1, 2), (2, 3)]  # at most one per offset


def test_streaming_tasks_carry_their_segments_and_honour_min_partitions() -> None:
    from kstore.spark_ext.reading import Range, plan_tasks

    from kstore.store import TopicMetadata

    tp = TopicPartition("t", 0)
    state = PartitionState()
    state.segments = [_segment(i * 100, i * 100 + 99, 1) for i in range(4)]
    state.end_offset = 400
    meta = TopicMetadata("t", "0" * 32, 1, {}, 0, 0)
    tasks = plan_tasks(
        [Range(tp, 150, 400)], {tp: state}, {"t": meta}, min_partitions=2, snapshot=True
    )
    assert [(t.start, t.end) for t in tasks] == [(150, 275), (275, 400)]
    # The segment cut in two goes with both tasks.
    assert [[s.base_offset for s in t.segments or ()] for t in tasks] == [[100, 200], [200, 300]]
    # Batch tasks read the manifest when they run; the last one of a range is open-ended.
    batch = plan_tasks(
        [Range(tp, 0, 400)],
        {tp: state},
        {"t": meta},
        min_partitions=2,
        snapshot=False,
        open_end=True,
    )
    assert [(t.start, t.end, t.open_end, t.segments) for t in batch] == [
        (0, 200, False, None),
        (200, 400, True, None),
    ]
