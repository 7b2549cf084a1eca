"""Topics, partitions and the manifest log, against every backend (memory, local, moto,
SeaweedFS): administration, the append/read round trip, offset and time lookups, checkpoints,
sparse and Parquet segments, idempotent producers and transaction identifiers."""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import time
from typing import Any

import pyarrow as pa
import pytest
from kstore.retention import purge_deleted_topics

from kstore import PartitionState, Store
from kstore.config import SPECS
from kstore.errors import (
    DuplicateSequenceError,
    InvalidConfigurationError,
    InvalidPartitionsError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    ProducerFencedError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from kstore.layout import topic_data_dir
from kstore.log import LAST_CHECKPOINT, checkpoint_file, parse_log_file_name, version_file
from kstore.partition import Partition, ProducerBatch, Segment
from kstore.segments import HEADERS_TYPE, TIMESTAMP_TYPE, write_segment
from kstore.storage import Storage
from tests.conftest import StoreTarget

BASE_US = 1_700_000_000_000_000  # a fixed, realistic timestamp (2023-11-14), microseconds


# --- helpers -----------------------------------------------------------------------------------


def open_store(target: StoreTarget) -> Store:
    return Store(target.url, target.storage_options)


def batch(
    values: list[bytes | None],
    *,
    keys: list[bytes | None] | None = None,
    ts_ms: list[int] | None = None,
    headers: list[Any] | None = None,
) -> pa.Table:
    n = len(values)
    columns: dict[str, pa.Array] = {
        "key": pa.array(keys if keys is not None else [None] * n, pa.binary()),
        "value": pa.array(values, pa.binary()),
        "timestamp": pa.array(
            [t * 1000 for t in ts_ms] if ts_ms is not None else [BASE_US + i for i in range(n)],
            TIMESTAMP_TYPE,
        ),
    }
    if headers is not None:
        columns["headers"] = pa.array(headers, HEADERS_TYPE)
    return pa.table(columns)


def read_rows(partition: Partition, from_offset: int = 0, **kwargs: Any) -> list[dict[str, Any]]:
    batches = list(partition.read(from_offset, **kwargs))
    if not batches:
        return []
    rows: list[dict[str, Any]] = pa.Table.from_batches(batches).to_pylist()
    return rows


def offsets_of(rows: list[dict[str, Any]]) -> list[int]:
    return [r["offset"] for r in rows]


def files_under(storage: Storage, rel: str) -> list[str]:
    """Every file below ``rel`` (recursively), relative to it. Directory entries that a
    backend may keep after their files are gone do not count."""
    root = storage.full_path(rel)
    if storage.local_root is not None:
        return sorted(
            os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
        )
    storage.fs.invalidate_cache()
    prefix = root.strip("/") + "/"
    return sorted(p.strip("/")[len(prefix) :] for p in storage.fs.find(root))


def state_summary(state: PartitionState) -> dict[str, Any]:
    """Everything a partition state holds, comparable with ==."""
    return {
        "version": state.version,
        "segments": list(state.segments),
        "end_offset": state.end_offset,
        "start_offset": state.log_start_offset,
        "producers": dict(state.producers),
        "txns": dict(state.txns),
        "removed": dict(state.removed),
        "cleaned": state.cleaned_offset,
        "reader": state.min_reader_version,
        "writer": state.min_writer_version,
    }


def replay_from_zero(partition: Partition) -> PartitionState:
    """The state built by replaying every commit from version 0, ignoring all checkpoints."""
    state = PartitionState()
    while (commit := partition.log.read_commit(state.version + 1)) is not None:
        info, actions = commit
        for name, body in actions:
            state.apply(name, body)
        state.version += 1
        state.last_commit_ms = info["timestamp"]
    return state


# --- administration ----------------------------------------------------------------------------


def test_create_list_and_describe_topics(any_store: StoreTarget) -> None:
    store = open_store(any_store)
    assert store.list_topics() == []
    alpha = store.create_topic(
        "alpha", 3, {"retention.ms": 1000, "cleanup.policy": "compact,delete"}
    )
    beta = store.create_topic("beta.with-dots_and_dashes", 1)
    assert alpha.partitions == 3
    assert alpha.config == {"retention.ms": 1000, "cleanup.policy": "delete,compact"}
    assert alpha.topic_id != beta.topic_id
    assert store.list_topics() == ["alpha", "beta.with-dots_and_dashes"]
    with pytest.raises(TopicAlreadyExistsError):
        store.create_topic("alpha", 5)
    assert store.topic("alpha") == alpha  # the failed create changed nothing

    desc = store.describe_topic("alpha")
    assert [p.partition for p in desc.partitions] == [0, 1, 2]
    for p in desc.partitions:
        assert (p.log_start_offset, p.log_end_offset, p.segments, p.size_bytes, p.records) == (
            0,
            0,
            0,
            0,
            0,
        )
        assert p.oldest_timestamp_ms is None
        assert p.newest_timestamp_ms is None
    entries = {name: (value, is_default) for name, value, is_default in desc.config_entries()}
    assert set(entries) == set(SPECS)
    assert entries["retention.ms"] == (1000, False)
    assert entries["segment.bytes"] == (SPECS["segment.bytes"].default, True)

    part = store.partition("alpha", 1)
    part.append(batch([b"a", b"b", b"c"], ts_ms=[5000, 2000, 9000]))
    part.append(batch([b"d"], ts_ms=[1000]))
    fresh = open_store(any_store)
    desc = fresh.describe_topic("alpha")
    p1 = desc.partitions[1]
    assert (p1.log_start_offset, p1.log_end_offset, p1.segments, p1.records) == (0, 4, 2, 4)
    assert (p1.oldest_timestamp_ms, p1.newest_timestamp_ms) == (1000, 9000)
    segment_dir = f"{part.directory}/segments"
    assert p1.size_bytes == sum(f.size for f in fresh.storage.list_dir(segment_dir)) > 0
    assert desc.partitions[0].log_end_offset == 0
    assert desc.partitions[2].segments == 0


def test_alter_config_sets_and_resets_to_default(any_store: StoreTarget) -> None:
    store = open_store(any_store)
    store.create_topic("t", 1, {"retention.ms": 5000})
    meta = store.alter_topic_config(
        "t", set={"retention.bytes": "1048576", "compression.type": "zstd"}
    )
    assert meta.config == {
        "retention.ms": 5000,
        "retention.bytes": 1_048_576,
        "compression.type": "zstd",
    }
    meta = store.alter_topic_config("t", delete=["retention.ms"])
    assert meta.config == {"retention.bytes": 1_048_576, "compression.type": "zstd"}
    assert meta.effective_config["retention.ms"] == SPECS["retention.ms"].default
    # Set and reset in one commit.
    meta = store.alter_topic_config(
        "t", set={"min.cleanable.dirty.ratio": 0.25}, delete=["compression.type"]
    )
    assert meta.config == {"retention.bytes": 1_048_576, "min.cleanable.dirty.ratio": 0.25}
    # A fresh store reads the same.
    again = open_store(any_store).topic("t")
    assert again.config == meta.config
    assert again.version == meta.version
    # Invalid changes are refused and change nothing.
    for bad_set, bad_delete in (
        ({"retention.ms": -5}, ()),
        ({"no.such.config": 1}, ()),
        ({}, ["no.such"]),
    ):
        with pytest.raises(InvalidConfigurationError):
            store.alter_topic_config("t", set=bad_set, delete=bad_delete)
    assert open_store(any_store).topic("t") == meta
    with pytest.raises(UnknownTopicOrPartitionError):
        store.alter_topic_config("missing", set={"retention.ms": 1})


def test_add_partitions_only_increases(any_store: StoreTarget) -> None:
    store = open_store(any_store)
    store.create_topic("t", 2)
    store.partition("t", 1).append(batch([b"kept"]))
    meta = store.add_partitions("t", 5)
    assert meta.partitions == 5
    fresh = open_store(any_store)
    assert fresh.topic("t").partitions == 5
    fresh.partition("t", 4).append(batch([b"new"]))
    assert [r["value"] for r in read_rows(fresh.partition("t", 4))] == [b"new"]
    assert [r["value"] for r in read_rows(fresh.partition("t", 1))] == [b"kept"]
    for total in (5, 3, 0, -1):
        with pytest.raises(InvalidPartitionsError):
            store.add_partitions("t", total)
    assert open_store(any_store).topic("t") == meta
    with pytest.raises(UnknownTopicOrPartitionError):
        fresh.partition("t", 5)


def test_delete_topic_then_recreate(any_store: StoreTarget) -> None:
    store = open_store(any_store)
    old = store.create_topic("doomed", 2)
    store.create_topic("bystander", 1)
    for p in range(2):
        store.partition("doomed", p).append(batch([b"x", b"y"]))
    store.partition("bystander", 0).append(batch([b"safe"]))
    data_dir = topic_data_dir("doomed", old.topic_id)
    assert files_under(store.storage, data_dir)  # segments and logs exist

    store.delete_topic("doomed")
    for view in (store, open_store(any_store)):
        assert not view.topic_exists("doomed")
        assert view.list_topics() == ["bystander"]
        with pytest.raises(UnknownTopicOrPartitionError):
            view.topic("doomed")
        with pytest.raises(UnknownTopicOrPartitionError):
            view.partition("doomed", 0)
        with pytest.raises(UnknownTopicOrPartitionError):
            view.describe_topic("doomed")
    # Its files stay readable for file.delete.delay.ms, then the purge removes them.
    assert files_under(store.storage, data_dir)
    later = int(time.time() * 1000) + 120_000
    assert purge_deleted_topics(store, later).directories == [data_dir]
    assert files_under(store.storage, data_dir) == []
    with pytest.raises(UnknownTopicOrPartitionError):
        store.delete_topic("doomed")

    new = open_store(any_store).create_topic("doomed", 1)
    assert new.topic_id != old.topic_id
    for view in (store, open_store(any_store)):
        part = view.partition("doomed", 0)
        assert part.state().end_offset == 0
        assert read_rows(part) == []
        assert view.topic("doomed").topic_id == new.topic_id
    assert [r["value"] for r in read_rows(store.partition("bystander", 0))] == [b"safe"]


# --- append and read ---------------------------------------------------------------------------


@pytest.mark.parametrize("compression", ["zstd", "lz4", "uncompressed"])
def test_round_trip_keys_values_tombstones_headers_timestamps(
    any_store: StoreTarget, compression: str
) -> None:
    store = open_store(any_store)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    keys = [b"k1", None, b"", b"k4\x00\xff", b"k1"]
    values = [b"v1", b"no key", b"", None, bytes(range(256)) * 8]  # None: a tombstone
    ts = [
        BASE_US // 1000 + 1,
        BASE_US // 1000 - 86_400_000,
        0,
        BASE_US // 1000 + 7,
        BASE_US // 1000 + 7,
    ]
    headers = [
        [{"key": "trace", "value": b"abc"}, {"key": "trace", "value": None}],
        None,
        [],
        [{"key": "\u00e9t\u00e9", "value": b"\x00"}],
        None,
    ]
    first = part.append(
        batch(values, keys=keys, ts_ms=ts, headers=headers), compression=compression
    )
    second = part.append(batch([b"tail"], keys=[b"k9"], ts_ms=[123]), compression=compression)
    assert (first.base_offset, first.last_offset, first.duplicate) == (0, 4, False)
    assert (second.base_offset, second.last_offset) == (5, 5)
    assert first.version is not None
    assert second.version == first.version + 1

    rows = read_rows(open_store(any_store).partition("t", 0))
    assert offsets_of(rows) == [0, 1, 2, 3, 4, 5]
    assert [r["key"] for r in rows] == [*keys, b"k9"]
    assert [r["value"] for r in rows] == [*values, b"tail"]
    assert [r["headers"] for r in rows] == [*headers, None]
    utc = dt.UTC
    expected_ts = [dt.datetime.fromtimestamp(t / 1000, utc) for t in [*ts, 123]]
    assert [r["timestamp"] for r in rows] == expected_ts
    # The batches have exactly the schema Spark expects.
    for b in open_store(any_store).partition("t", 0).read(0):
        assert b.schema.equals(
            pa.schema(
                [
                    pa.field("key", pa.binary()),
                    pa.field("value", pa.binary()),
                    pa.field("timestamp", TIMESTAMP_TYPE),
                    pa.field("headers", HEADERS_TYPE),
                    pa.field("offset", pa.int64()),
                ]
            )
        )


def test_microsecond_timestamps_survive(any_store: StoreTarget) -> None:
    store = open_store(any_store)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    stamps = pa.array([BASE_US + 1, BASE_US + 999_999], TIMESTAMP_TYPE)
    part.append(pa.table({"value": pa.array([b"a", b"b"]), "timestamp": stamps}))
    rows = pa.Table.from_batches(list(open_store(any_store).partition("t", 0).read(0)))
    assert rows.column("timestamp").cast(pa.int64()).to_pylist() == [BASE_US + 1, BASE_US + 999_999]


def _filled_partition(target: StoreTarget, sizes: list[int]) -> tuple[Partition, list[bytes]]:
    store = open_store(target)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    values: list[bytes] = []
    for n in sizes:
        chunk = [b"r%03d-" % (len(values) + i) + b"x" * 40 for i in range(n)]
        part.append(batch(list(chunk)))
        values.extend(chunk)
    return open_store(target).partition("t", 0), values


def test_read_from_any_offset_with_max_records(any_store: StoreTarget) -> None:
    part, values = _filled_partition(any_store, [3, 1, 4, 2, 5])
    end = len(values)
    assert part.state().end_offset == end == 15
    for start in range(end + 1):
        rows = read_rows(part, start)
        assert offsets_of(rows) == list(range(start, end))
        assert [r["value"] for r in rows] == values[start:]
        for limit in (1, 2, 3, 6, 20):
            rows = read_rows(part, start, max_records=limit)
            assert offsets_of(rows) == list(range(start, min(start + limit, end)))
        rows = read_rows(part, start, end_offset=9)
        assert offsets_of(rows) == list(range(start, max(start, 9)))


def test_read_with_max_bytes_is_a_gapless_prefix(any_store: StoreTarget) -> None:
    part, values = _filled_partition(any_store, [3, 1, 4, 2, 5])
    end = len(values)
    everything = pa.Table.from_batches(list(part.read(0))).nbytes
    for start in range(end):
        previous = 0
        for budget in (1, 50, 120, 200, 400, 700, 1000, everything * 2):
            rows = read_rows(part, start, max_bytes=budget)
            got = offsets_of(rows)
            # At least one record (progress), consecutive from start (no gap), and more
            # budget never yields fewer records.
            assert got == list(range(start, start + len(got))), (start, budget, got)
            assert len(got) >= max(1, previous)
            assert [r["value"] for r in rows] == values[start : start + len(got)]
            previous = len(got)
        assert previous == end - start  # a budget above everything reads everything
        both = read_rows(part, start, max_bytes=everything * 2, max_records=2)
        assert offsets_of(both) == list(range(start, min(start + 2, end)))


def test_offsets_outside_the_live_range_are_refused(any_store: StoreTarget) -> None:
    store = open_store(any_store)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    assert read_rows(part, 0) == []  # empty partition: offset 0 is the end
    with pytest.raises(OffsetOutOfRangeError):
        list(part.read(1))
    part.append(batch([b"a", b"b", b"c"]))
    assert read_rows(part, 3) == []  # the end offset itself: nothing yet, not an error
    for bad in (-1, 4, 1_000_000):
        with pytest.raises(OffsetOutOfRangeError, match=r"\[0, 3\]"):
            list(part.read(bad))


def _linear_first_at_or_after(rows: list[dict[str, Any]], target_ms: int) -> int | None:
    for row in rows:
        ts = row["timestamp"]
        if int(ts.timestamp() * 1000) >= target_ms:
            return int(row["offset"])
    return None


def test_offset_for_timestamp_equals_a_linear_scan(any_store: StoreTarget) -> None:
    store = open_store(any_store)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    assert part.offset_for_timestamp(0) is None  # empty partition
    # Non-monotonic within and across segments (CreateTime is the producer's clock).
    segments = [[50, 10, 30], [5, 20], [100, 60], [40], [40, 41], [7], [120, 1, 119]]
    rng = random.Random(7)
    segments += [[rng.randrange(0, 200) for _ in range(rng.randrange(1, 5))] for _ in range(6)]
    for ts in segments:
        part.append(batch([b"v"] * len(ts), ts_ms=ts))
    fresh = open_store(any_store).partition("t", 0)
    rows = read_rows(fresh)
    for target in range(-5, 205):
        assert fresh.offset_for_timestamp(target) == _linear_first_at_or_after(rows, target), target


# --- checkpoints -------------------------------------------------------------------------------


def _log_names(storage: Storage, partition: Partition) -> list[str]:
    return sorted(info.name for info in storage.list_dir(partition.log.directory))


def test_checkpoints_every_n_commits_and_a_fresh_store_reads_the_same_state(
    any_store: StoreTarget,
) -> None:
    store = open_store(any_store)
    store.create_topic("t", 1, {"checkpoint.interval": 3})
    part = store.partition("t", 0)
    sequences = {"p0": 0, "p1": 0}
    for i in range(11):  # versions 0..10
        producer = None
        if i % 4:
            pid = f"p{i % 2}"
            producer = ProducerBatch(pid, 0, sequences[pid], sequences[pid])
            sequences[pid] += 1
        part.append(
            batch([b"v%d" % i] * (i % 3 + 1), ts_ms=[1000 * i] * (i % 3 + 1)),
            producer=producer,
            txn=("app", i) if i % 5 == 0 else None,
        )
    writer_state = part.state()
    assert writer_state.version == 10
    names = _log_names(store.storage, part)
    checkpoints = sorted(v for n in names if (p := parse_log_file_name(n)) and p[1] for v in [p[0]])
    assert checkpoints == [3, 6, 9]
    assert LAST_CHECKPOINT in names
    hint = json.loads(store.storage.read(f"{part.log.directory}/{LAST_CHECKPOINT}"))
    assert hint == {"version": 9}

    replayed = replay_from_zero(part)
    fresh = open_store(any_store).partition("t", 0).state()
    assert state_summary(fresh) == state_summary(replayed) == state_summary(writer_state)
    assert fresh.txns == {"app": 10}
    assert set(fresh.producers) == {"p0", "p1"}

    # The checkpoint alone carries the state: with commits 0..9 deleted, a fresh store opens
    # from checkpoint 9 plus commit 10 and still sees everything.
    store.storage.delete([f"{part.log.directory}/{version_file(v)}" for v in range(10)])
    from_checkpoint = open_store(any_store).partition("t", 0)
    assert state_summary(from_checkpoint.state()) == state_summary(replayed)
    assert len(read_rows(from_checkpoint)) == replayed.end_offset


MALFORMED_HINTS: dict[str, bytes | None] = {
    "missing": None,
    "empty": b"",
    "garbage": b"garbage",
    "not-utf8": b"\xff\xfe\x00",
    "list": b"[]",
    "no-version": b"{}",
    "string": b'{"version": "6"}',
    "null": b'{"version": null}',
    "ahead": b'{"version": 999}',
    "stale": b'{"version": 3}',
    "negative": b'{"version": -1}',
    "not-a-checkpoint": b'{"version": 5}',
}


def test_opening_works_when_last_checkpoint_is_missing_or_malformed(any_store: StoreTarget) -> None:
    store = open_store(any_store)
    store.create_topic("t", 1, {"checkpoint.interval": 3})
    part = store.partition("t", 0)
    for i in range(8):
        part.append(batch([b"%d" % i]))
    expected = state_summary(part.state())
    path = f"{part.log.directory}/{LAST_CHECKPOINT}"
    for label, hint in MALFORMED_HINTS.items():
        if hint is None:
            store.storage.delete([path])
        else:
            store.storage.put(path, hint)
        before = _log_names(store.storage, part)
        fresh = open_store(any_store).partition("t", 0)
        assert state_summary(fresh.state()) == expected, label
        assert [r["value"] for r in read_rows(fresh)] == [b"%d" % i for i in range(8)], label
        assert _log_names(store.storage, part) == before, label  # opening wrote nothing


# --- sparse and Parquet segments ---------------------------------------------------------------


def _add_sparse(
    part: Partition,
    offsets: list[int],
    values: list[bytes],
    ts_ms: list[int],
    base: int,
    last: int,
    fmt: str,
) -> Segment:
    table = batch(list(values), ts_ms=ts_ms).append_column("offset", pa.array(offsets, pa.int64()))
    written = write_segment(part.storage, part.directory, table, fmt=fmt, compression="zstd")
    assert written.sparse
    assert (written.first_offset, written.last_offset) == (offsets[0], offsets[-1])
    seg = Segment(
        path=written.path,
        base_offset=base,
        last_offset=last,
        record_count=written.record_count,
        min_timestamp_ms=written.min_timestamp_ms,
        max_timestamp_ms=written.max_timestamp_ms,
        size_bytes=written.size_bytes,
        checksum=written.checksum,
        format=written.format,
        sparse=True,
        created_ms=0,
    )
    result = part.commit_actions(lambda state: [seg.to_action()], operation="TEST ADD")
    assert result is not None
    return seg


def test_a_segment_of_several_record_batches_reads_as_one(any_store: StoreTarget) -> None:
    """PROTOCOL 11.3: an Arrow segment may hold several record batches (the producer writes
    one per batch it delivers together); readers read every batch, in order."""
    store = open_store(any_store)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    part.append(batch([b"first"]))
    chunks = [batch([b"a0", b"a1"], ts_ms=[5, 6]), batch([b"b0", b"b1", b"b2"], ts_ms=[7, 8, 9])]
    written = part.write_segment(pa.concat_tables(chunks))
    data = store.storage.read(f"{part.directory}/{written.path}")
    assert pa.ipc.open_file(pa.BufferReader(data)).num_record_batches == 2
    part.commit_segments([written])
    rows = read_rows(open_store(any_store).partition("t", 0))
    assert [r["value"] for r in rows] == [b"first", b"a0", b"a1", b"b0", b"b1", b"b2"]
    assert offsets_of(rows) == [0, 1, 2, 3, 4, 5]
    assert offsets_of(read_rows(part, 3, max_records=2)) == [3, 4]  # across the two batches


def test_sparse_and_parquet_segments_read_like_dense_ones(any_store: StoreTarget) -> None:
    store = open_store(any_store)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    part.append(batch([b"d0", b"d1", b"d2", b"d3", b"d4"], ts_ms=[10, 11, 12, 13, 14]))
    # A sparse Arrow segment covering 5..10 holding 6, 8, 9 (as compaction leaves it) ...
    _add_sparse(part, [6, 8, 9], [b"s6", b"s8", b"s9"], [16, 18, 19], 5, 10, "arrow")
    # ... and a Parquet one covering 11..15 holding 12 and 15.
    pq_seg = _add_sparse(part, [12, 15], [b"p12", b"p15"], [22, 25], 11, 15, "parquet")
    assert pq_seg.format == "parquet"
    assert pq_seg.path.endswith(".parquet")
    tail = part.append(batch([b"d16", b"d17"], ts_ms=[26, 27]))
    assert (tail.base_offset, tail.last_offset) == (16, 17)  # offsets continue after the range

    fresh = open_store(any_store).partition("t", 0)
    expected = {
        0: b"d0",
        1: b"d1",
        2: b"d2",
        3: b"d3",
        4: b"d4",
        6: b"s6",
        8: b"s8",
        9: b"s9",
        12: b"p12",
        15: b"p15",
        16: b"d16",
        17: b"d17",
    }
    rows = read_rows(fresh)
    assert {r["offset"]: r["value"] for r in rows} == expected
    assert offsets_of(rows) == sorted(expected)
    live = sorted(expected)
    for start in range(18 + 1):
        want = [o for o in live if o >= start]
        assert offsets_of(read_rows(fresh, start)) == want, start  # gaps are skipped
        assert offsets_of(read_rows(fresh, start, max_records=2)) == want[:2], start
        for budget in (1, 60, 300):
            got = offsets_of(read_rows(fresh, start, max_bytes=budget))
            assert got == want[: len(got)], (start, budget)
            assert len(got) >= min(1, len(want))
    assert fresh.offset_for_timestamp(17) == 8
    assert fresh.offset_for_timestamp(20) == 12
    assert fresh.offset_for_timestamp(23) == 15
    assert fresh.offset_for_timestamp(28) is None
    state = fresh.state()
    assert state.end_offset == 18
    assert state.record_count == len(expected)


# --- idempotence and transactions --------------------------------------------------------------


def test_committing_a_producer_batch_twice_is_a_duplicate(any_store: StoreTarget) -> None:
    store = open_store(any_store)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    part.append(batch([b"other"]))
    pb = ProducerBatch("producer-1", 0, 0, 2)
    first = part.append(batch([b"a", b"b", b"c"]), producer=pb)
    assert (first.base_offset, first.last_offset, first.duplicate) == (1, 3, False)
    state = part.state()
    log_before = _log_names(store.storage, part)
    # The retry (same batch, e.g. after an ambiguous timeout), from this writer and a fresh one.
    for writer in (part, open_store(any_store).partition("t", 0)):
        again = writer.append(batch([b"a", b"b", b"c"]), producer=pb)
        assert again.duplicate
        assert (again.base_offset, again.last_offset) == (1, 3)
        assert again.version is None
    assert _log_names(store.storage, part) == log_before  # no new commit
    fresh = open_store(any_store).partition("t", 0)
    assert state_summary(fresh.state()) == state_summary(state)
    assert [r["value"] for r in read_rows(fresh)] == [b"other", b"a", b"b", b"c"]
    # The next batch in sequence commits normally.
    nxt = part.append(batch([b"d"]), producer=ProducerBatch("producer-1", 0, 3, 3))
    assert (nxt.base_offset, nxt.duplicate) == (4, False)


def test_fencing_and_sequence_errors_change_nothing(any_store: StoreTarget) -> None:
    store = open_store(any_store)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    part.append(batch([b"a"]), producer=ProducerBatch("p", 1, 0, 0))
    part.append(batch([b"b"]), producer=ProducerBatch("p", 1, 1, 1))
    state = state_summary(part.state())
    log_before = _log_names(store.storage, part)
    cases: list[tuple[ProducerBatch, type[Exception]]] = [
        (ProducerBatch("p", 0, 2, 2), ProducerFencedError),  # a zombie: older epoch
        (ProducerBatch("p", 1, 5, 5), OutOfOrderSequenceError),  # a gap in the sequence
        (ProducerBatch("p", 1, 0, 0), DuplicateSequenceError),  # older than the last batch
        (ProducerBatch("p", 1, 1, 2), DuplicateSequenceError),  # overlaps the last batch
    ]
    for pb, error in cases:
        with pytest.raises(error):
            part.append(batch([b"bad"]), producer=pb)
        with pytest.raises(error):
            open_store(any_store).partition("t", 0).append(batch([b"bad"]), producer=pb)
    assert _log_names(store.storage, part) == log_before
    fresh = open_store(any_store).partition("t", 0)
    assert state_summary(fresh.state()) == state
    assert [r["value"] for r in read_rows(fresh)] == [b"a", b"b"]
    # A new epoch starts over; after it, the old epoch is fenced.
    part.append(batch([b"c"]), producer=ProducerBatch("p", 2, 0, 0))
    with pytest.raises(ProducerFencedError):
        part.append(batch([b"bad"]), producer=ProducerBatch("p", 1, 2, 2))
    # Other producers are independent.
    part.append(batch([b"q"]), producer=ProducerBatch("q", 0, 0, 0))
    assert [r["value"] for r in read_rows(open_store(any_store).partition("t", 0))] == [
        b"a",
        b"b",
        b"c",
        b"q",
    ]


def test_transaction_identifier_commits_once(any_store: StoreTarget) -> None:
    store = open_store(any_store)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    first = part.append(batch([b"batch-5"]), txn=("query-1", 5))
    assert not first.duplicate
    log_before = _log_names(store.storage, part)
    for version in (5, 4, 0):  # a replay of the same micro-batch, or an older one
        again = (
            open_store(any_store)
            .partition("t", 0)
            .append(batch([b"replayed"]), txn=("query-1", version))
        )
        assert again.duplicate
        assert again.version is None
    assert _log_names(store.storage, part) == log_before
    part.append(batch([b"batch-6"]), txn=("query-1", 6))
    part.append(batch([b"other-app"]), txn=("query-2", 0))  # app ids are independent
    fresh = open_store(any_store).partition("t", 0)
    assert fresh.state().txns == {"query-1": 6, "query-2": 0}
    assert [r["value"] for r in read_rows(fresh)] == [b"batch-5", b"batch-6", b"other-app"]


def test_log_files_are_numbered_and_hold_commit_info(any_store: StoreTarget) -> None:
    store = open_store(any_store)
    store.create_topic("t", 1, {"checkpoint.interval": 2})
    part = store.partition("t", 0)
    for i in range(3):
        part.append(batch([b"%d" % i]))
    names = _log_names(store.storage, part)
    assert [version_file(v) for v in range(3)] == [
        n for n in names if n.endswith(".json") and "checkpoint" not in n
    ]
    assert checkpoint_file(2) in names
    info, actions = part.log.read_commit(1) or ({}, [])
    assert info["operation"] == "APPEND"
    assert info["topic"] == "t"
    assert info["partition"] == 0
    assert [name for name, _ in actions] == ["add"]
    assert part.log.read_commit(3) is None
