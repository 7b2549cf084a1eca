"""Producer SDK: placement, ordering, acks, retries, idempotence, fencing, limits, bad input."""

from __future__ import annotations

import os
import re
import threading
import time
import zlib
from collections import defaultdict
from typing import Any

import pyarrow as pa
import pytest

import kstore
from kstore.errors import (
    CommitStateUnknownError,
    IllegalStateError,
    InvalidConfigurationError,
    InvalidRecordError,
    InvalidTopicError,
    KafkaTimeoutError,
    LayoutUpgradeRequiredError,
    ProducerFencedError,
    RecordTooLargeError,
    StorageError,
    UnknownTopicOrPartitionError,
)
from kstore.partitioner import murmur2
from kstore.producer import Producer
from kstore.segments import BINARY, HEADERS_TYPE, TIMESTAMP_TYPE
from tests.commit_logs import (
    COMMIT_LOGS,
    backend_params,
    commit_logs_fixture,
    create_topics_with,
    logs_target,
)
from tests.faults import Fault, FaultyStorage
from tests.test_producer_metadata import create_layout2_topic

BACKENDS = ["memory", "local", "seaweed"]
# Layout-3 topics of the tests that ask for it get commit.logs 1, then 3 (tests/commit_logs.py).
commit_logs = commit_logs_fixture()


def faulty_local_store(
    local_store: tuple[str, dict[str, Any]], partitions: int = 1
) -> tuple[FaultyStorage, kstore.Store]:
    """A local store whose storage injects the faults a test adds, with a topic "t"."""
    faulty = FaultyStorage(kstore.Storage(local_store[0]))
    store = kstore.Store.from_storage(faulty)
    store.create_topic("t", partitions=partitions)
    return faulty, store


def is_commit(path: str) -> bool:
    """A commit of a log (not a checkpoint)."""
    return "/_log/" in path and path.endswith(".json") and "checkpoint" not in path


def is_record_write(path: str) -> bool:
    """A file of records: a segment (layout 2) or a data object (layout 3)."""
    return "/segments/" in path or "/_data/" in path


# Partition 0's commits: its own log in layout 2, the topic log (log 0) in layout 3.
PARTITION_0_LOG = re.compile(r"/[0-9a-f]{32}/(0/)?_log/")
# Any topic log's commits (layout 3): log 0 is _log, log k after it _log.k.
TOPIC_LOG = re.compile(r"topics/t/[0-9a-f]{32}/_log(\.[0-9]+)?/")


@pytest.fixture(params=backend_params(BACKENDS))
def store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> kstore.Store:
    """Every backend; its layout-3 topics with commit.logs 1, and 3 too on memory and local
    disk (tests/commit_logs.py)."""
    target = logs_target(request, monkeypatch)
    return kstore.Store(target.url, target.storage_options)


@pytest.fixture(params=backend_params(BACKENDS, all_logs=BACKENDS))
def concurrent_store(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> kstore.Store:
    """As ``store``, with commit.logs 3 on SeaweedFS too: for tests about concurrency."""
    target = logs_target(request, monkeypatch)
    return kstore.Store(target.url, target.storage_options)


def read_all(store: kstore.Store, topic: str) -> dict[int, list[dict[str, Any]]]:
    """Every record of every partition, fresh from storage (a new Store: no shared cache)."""
    fresh = kstore.Store(store.url, store.storage.storage_options, create=False)
    out: dict[int, list[dict[str, Any]]] = {}
    meta = fresh.topic(topic)
    for p in range(meta.partitions):
        part = fresh.partition(topic, p)
        rows: list[dict[str, Any]] = []
        state = part.state()
        if state.end_offset > state.start_offset:
            for batch in part.read(state.start_offset):
                rows.extend(batch.to_pylist())
        out[p] = rows
    return out


def java_partition(key: bytes, n: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % n


def test_keyed_records_keep_order_and_land_where_java_puts_them(store: kstore.Store) -> None:
    store.create_topic("orders", partitions=6)
    keys = [f"user-{i}".encode() for i in range(40)]
    sent: dict[bytes, list[int]] = defaultdict(list)
    futures = []
    with Producer(store, linger_ms=2, batch_size=8_000) as producer:
        for seq in range(1_200):
            key = keys[seq % len(keys)]
            futures.append((key, seq, producer.send("orders", value=b"%d" % seq, key=key)))
            sent[key].append(seq)
    metadata = {seq: f.get(timeout=30) for key, seq, f in futures}
    records = read_all(store, "orders")
    seen: dict[bytes, list[int]] = defaultdict(list)
    for partition, rows in records.items():
        offsets = [r["offset"] for r in rows]
        assert offsets == list(range(len(rows))), "offsets must be dense and increasing"
        for row in rows:
            assert java_partition(row["key"], 6) == partition
            seq = int(row["value"])
            seen[row["key"]].append(seq)
            assert metadata[seq].partition == partition
            assert metadata[seq].offset == row["offset"]
    assert seen == sent  # every record once, in send order per key


def test_crc32_partitioner_matches_librdkafka_consistent(store: kstore.Store) -> None:
    store.create_topic("t", partitions=5)
    with Producer(store, partitioner="crc32") as producer:
        futures = {
            k: producer.send("t", value=b"v", key=k) for k in (b"a", b"bb", b"user-17", b"\x00\xff")
        }
    for key, fut in futures.items():
        assert fut.get(timeout=30).partition == zlib.crc32(key) % 5


def test_headers_timestamps_and_tombstones_round_trip(store: kstore.Store) -> None:
    store.create_topic("t", partitions=1)
    with Producer(store) as producer:
        a = producer.send(
            "t",
            value=b"v1",
            key=b"k",
            headers=[("trace", b"\x01\x02"), ("n", b"")],
            timestamp_ms=1_700_000_000_123,
        )
        b = producer.send("t", value=None, key=b"k", timestamp_ms=1_700_000_000_999)
        c = producer.send("t", value=b"v3")
    assert a.get(timeout=30).timestamp == 1_700_000_000_123
    assert b.get(timeout=30).serialized_value_size == -1
    rows = read_all(store, "t")[0]
    assert rows[0]["headers"] == [
        {"key": "trace", "value": b"\x01\x02"},
        {"key": "n", "value": b""},
    ]
    assert int(rows[0]["timestamp"].timestamp() * 1000) == 1_700_000_000_123
    assert rows[1]["value"] is None
    assert rows[1]["key"] == b"k"
    assert rows[2]["key"] is None
    assert rows[2]["headers"] is None
    assert c.get(timeout=30).offset == 2


def test_batches_queued_behind_a_slow_delivery_are_merged_and_keep_every_outcome(
    local_store: tuple[str, dict[str, Any]],
    commit_logs: int,
) -> None:
    """While one delivery is slow, later batches queue; the sender then delivers them together
    (one segment and one commit per partition). Every record must still get its own partition,
    offset and timestamp, in send order, with headers, tombstones, explicit partitions and
    given timestamps intact, and the merge must not mix in a send_batch() table."""
    faulty, store = faulty_local_store(local_store, 4)
    faulty.add(Fault("put_new", when="delay", delay_s=0.5, times=1))
    sent: list[tuple[Any, dict[str, Any]]] = []
    with Producer(store, batch_size=300, linger_ms=0) as producer:
        for i in range(400):
            record: dict[str, Any] = {"value": b"v%03d" % i, "key": b"k%d" % (i % 7)}
            if i % 50 == 3:
                record["value"] = None  # a tombstone, mid-run
            if i % 40 == 5:
                record["headers"] = [("i", b"%d" % i)]
            if i % 30 == 7:
                record["partition"] = 3
            if i % 45 == 9:
                record["timestamp_ms"] = 1_600_000_000_000 + i
            sent.append((producer.send("t", **record), record))
        table = pa.table({"value": [b"tb0", b"tb1"], "key": [b"x", b"y"]})
        batch_future = producer.send_batch("t", table)
        producer.flush()
        deliveries = producer.metrics()["batch-total"]
    assert deliveries < 40  # about a hundred and fifty batches, delivered together
    rows = {(p, r["offset"]): r for p, rs in read_all(store, "t").items() for r in rs}
    last_offset: dict[int, int] = {}
    for future, record in sent:
        meta = future.get(timeout=30)
        row = rows[(meta.partition, meta.offset)]
        assert row["value"] == record["value"]
        assert row["key"] == record["key"]
        if "partition" in record:
            assert meta.partition == 3
        else:
            assert meta.partition == java_partition(record["key"], 4)
        assert row["headers"] == (
            [{"key": "i", "value": record["headers"][0][1]}] if "headers" in record else None
        )
        if "timestamp_ms" in record:
            assert meta.timestamp == record["timestamp_ms"]
        assert int(row["timestamp"].timestamp() * 1000) == meta.timestamp
        assert meta.offset > last_offset.get(meta.partition, -1)  # send order kept
        last_offset[meta.partition] = meta.offset
    placed = batch_future.get(timeout=30)
    for p, offset, value in zip(
        placed.column("partition").to_pylist(),
        placed.column("offset").to_pylist(),
        [b"tb0", b"tb1"],
        strict=True,
    ):
        assert rows[(p, offset)]["value"] == value
    assert len(rows) == 402


def test_records_sent_while_a_delivery_is_written_go_out_together_when_it_ends(
    local_store: tuple[str, dict[str, Any]], commit_logs: int
) -> None:
    """With linger 0, records sent while a delivery is still being written wait for that
    write to end and then go out together, in one delivery. Cut at once, the first of them
    made a delivery of its own that waited for the same write: a record waited for two writes,
    not one, and the producer made a commit more per write."""
    faulty, store = faulty_local_store(local_store, 2)

    def topic_log_commit(path: str) -> bool:
        return path.endswith(".json") and "checkpoint" not in path and bool(TOPIC_LOG.search(path))

    faulty.add(Fault("put_if_absent", when="delay", delay_s=0.6, times=1, match=topic_log_commit))
    with Producer(store, linger_ms=0) as producer:
        first = producer.send("t", b"first", key=b"k")
        time.sleep(0.2)  # the first delivery's commit is being written (slowly)
        rest = []
        for i in range(20):
            rest.append(producer.send("t", b"r%d" % i, key=b"k%d" % i))
            time.sleep(0.005)
        producer.flush()
        assert producer.metrics()["batch-total"] == 2
    assert faulty.injected["put_if_absent:delay"] == 1
    assert first.get(timeout=30).offset == 0
    placed = [future.get(timeout=30) for future in rest]
    rows = {(p, r["offset"]): r["value"] for p, rs in read_all(store, "t").items() for r in rs}
    assert [rows[(m.partition, m.offset)] for m in placed] == [b"r%d" % i for i in range(20)]
    # Two deliveries: the first one commit, the second one per topic log it touched.
    commits = sum(log.state().version + 1 for log in store.topic_logs("t"))
    assert commits == 1 + len({m.partition % commit_logs for m in placed})


def test_a_layout_2_topic_is_refused_when_the_producer_first_meets_it(
    store: kstore.Store,
) -> None:
    """Producers write layout 3 only: a topic of layout 2 is refused by send(), send_batch()
    and partitions_for() at once, naming the topic and the command that upgrades it, and
    nothing is written. The producer stays usable for other topics."""
    create_layout2_topic(store, "old", partitions=2)
    store.create_topic("new", partitions=2)
    hint = re.escape("`kstore topics upgrade old`")
    with Producer(store, linger_ms=0) as producer:
        with pytest.raises(LayoutUpgradeRequiredError, match=f"'old' has layout 2.*{hint}"):
            producer.send("old", b"v")
        with pytest.raises(LayoutUpgradeRequiredError, match=hint):
            producer.send("old", b"v", key=b"k", headers=[("h", b"1")])
        with pytest.raises(LayoutUpgradeRequiredError, match=hint):
            producer.send_batch("old", pa.table({"value": [b"a", b"b"]}))
        with pytest.raises(LayoutUpgradeRequiredError, match=hint):
            producer.partitions_for("old")
        assert producer.send("new", b"v").get(timeout=30).offset == 0
    assert read_all(store, "old") == {0: [], 1: []}


def test_a_failed_topic_log_of_a_merged_delivery_fails_exactly_its_records(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    """Layout 3: partitions in different topic logs are written and committed apart; a
    failed commit of one log fails exactly the records of its partitions."""
    faulty = FaultyStorage(kstore.Storage(local_store[0]))
    store = kstore.Store.from_storage(faulty)
    store.create_topic("t", partitions=2, config={"commit.logs": 2})
    log_0 = re.compile(r"/[0-9a-f]{32}/_log/")
    faulty.add(
        Fault(
            "put_if_absent",
            when="delay",
            delay_s=0.5,
            times=1,
            match=lambda p: is_commit(p) and bool(log_0.search(p)),
        )
    )
    faulty.add(Fault("put_if_absent", when="before", match=lambda p: "/_log.1/" in p))
    with Producer(store, batch_size=300, linger_ms=0, retries=0) as producer:
        futures = [producer.send("t", b"v%d" % i, partition=i % 2) for i in range(200)]
        producer.flush()
        assert producer.metrics()["batch-total"] < 40
    for i, future in enumerate(futures):
        assert future.is_done()
        if i % 2:
            # The commit of log 1 kept failing: its outcome is unknown.
            assert isinstance(future.exception, CommitStateUnknownError)
        else:
            assert future.get(timeout=1).partition == 0
    assert [r["value"] for r in read_all(store, "t")[0]] == [b"v%d" % i for i in range(0, 200, 2)]
    assert read_all(store, "t")[1] == []


def test_a_delivery_written_behind_a_failed_one_starts_a_new_epoch(
    local_store: tuple[str, dict[str, Any]],
    commit_logs: int,
) -> None:
    """Deliveries overlap: the next one is converted and submitted while the previous one is
    still being written. When that write fails ambiguously (its commit landed, the producer
    was told it failed), the next write on the partition must carry a new epoch: with the old
    one and the same sequence numbers it would be taken for a retry of the landed batch, and
    its records dropped while their futures report success."""
    faulty, store = faulty_local_store(local_store)

    faulty.add(Fault("put_new", when="delay", delay_s=0.5, times=1))
    # The first commit lands but reports an error, and reading it back fails until the log
    # gives up: its outcome stays unknown.
    partition_commit = lambda path: is_commit(path) and bool(PARTITION_0_LOG.search(path))  # noqa: E731
    faulty.add(Fault("put_if_absent", when="after", times=1, match=partition_commit))
    faulty.add(
        Fault(
            "read",
            when="before",
            times=5,
            match=lambda path: partition_commit(path) and "put_if_absent:after" in faulty.injected,
        )
    )
    with Producer(store, linger_ms=0, retries=0) as producer:
        first = [producer.send("t", b"a%d" % i) for i in range(5)]
        time.sleep(0.2)  # the first delivery is being written (slowly)
        second = [producer.send("t", b"b%d" % i) for i in range(5)]
        producer.flush()
        assert producer.metrics()["batch-total"] >= 1
    for future in first:
        assert isinstance(future.exception, CommitStateUnknownError)  # it did land
    offsets = [future.get(timeout=30).offset for future in second]
    values = [r["value"] for r in read_all(store, "t")[0]]
    assert values == [b"a%d" % i for i in range(5)] + [b"b%d" % i for i in range(5)]
    assert offsets == [5, 6, 7, 8, 9]


def test_metadata_read_errors_are_retried_within_max_block_ms(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    faulty, store = faulty_local_store(local_store)
    store.create_topic("down")
    topic_log = lambda name: lambda path: f"topics/{name}/_log/" in path  # noqa: E731
    faulty.add(Fault("read", when="before", times=3, match=topic_log("t")))
    faulty.add(Fault("read", when="before", match=topic_log("down")))
    with Producer(store, retry_backoff_ms=10, max_block_ms=2_000) as producer:
        # Transient: three failed reads, then the send goes through.
        assert producer.send("t", b"v").get(timeout=30).offset == 0
        assert faulty.injected["read:before"] >= 3
        # Persistent: send() gives up after max_block_ms with the storage error.
        started = time.monotonic()
        with pytest.raises(StorageError, match="injected failure before read"):
            producer.send("down", b"v")
        assert 1.0 <= time.monotonic() - started < 10
    faulty.clear()
    assert [r["value"] for r in read_all(store, "t")[0]] == [b"v"]
    assert read_all(store, "down")[0] == []


def test_a_failed_metadata_refresh_keeps_the_cached_metadata(
    local_store: tuple[str, dict[str, Any]],
    commit_logs: int,
) -> None:
    faulty, store = faulty_local_store(local_store, 2)
    with Producer(store, metadata_max_age_ms=0) as producer:
        producer.send("t", b"first", key=b"k").get(timeout=30)
        faulty.add(Fault("read", when="before", match=lambda path: "topics/t/_log/" in path))
        # Every later send and delivery wants fresh metadata and cannot read it.
        futures = [producer.send("t", b"v%d" % i, key=b"k") for i in range(5)]
        producer.flush()
        assert [f.get(timeout=30).offset for f in futures] == [1, 2, 3, 4, 5]
    faulty.clear()
    rows = read_all(store, "t")[java_partition(b"k", 2)]
    assert [r["value"] for r in rows] == [b"first"] + [b"v%d" % i for i in range(5)]


def test_send_batch_truncates_nanosecond_timestamps_to_microseconds(
    memory_store: tuple[str, dict[str, Any]],
) -> None:
    store = kstore.Store(*memory_store)
    store.create_topic("t")
    ns = [1_700_000_000_123_456_789, 1_700_000_000_000_000_001]
    table = pa.table({"value": [b"a", b"b"], "timestamp": pa.array(ns, pa.timestamp("ns"))})
    with Producer(store) as producer:
        producer.send_batch("t", table).get(timeout=30)
    rows = read_all(store, "t")[0]
    stored = pa.array([r["timestamp"] for r in rows]).cast(pa.int64()).to_pylist()
    assert stored == [1_700_000_000_123_456, 1_700_000_000_000_000]
    # Coarser units still refuse what does not fit (a multiplication could overflow).
    big = pa.table({"value": [b"c"], "timestamp": pa.array([2**62], pa.timestamp("s"))})
    with Producer(store) as producer, pytest.raises(InvalidRecordError, match="timestamp"):
        producer.send_batch("t", big)
    assert len(read_all(store, "t")[0]) == 2


def test_serializers(store: kstore.Store) -> None:
    store.create_topic("t")
    with Producer(
        store, key_serializer=str.encode, value_serializer=lambda v: repr(v).encode()
    ) as producer:
        producer.send("t", value={"a": 1}, key="k1").get(timeout=30)
    row = read_all(store, "t")[0][0]
    assert row["key"] == b"k1"
    assert row["value"] == b"{'a': 1}"


@pytest.mark.parametrize("acks", [0, 1, "all"])
def test_acks_levels(
    acks: Any,
    local_store: tuple[str, dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    commit_logs: int,
) -> None:
    store = kstore.Store(local_store[0])
    store.create_topic("t", partitions=2)
    fsyncs = 0
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        nonlocal fsyncs
        fsyncs += 1
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    with Producer(store, acks=acks) as producer:
        futures = [producer.send("t", value=b"%d" % i, key=b"%d" % i) for i in range(50)]
        producer.flush()
    results = [f.get(timeout=30) for f in futures]
    if acks == 0:
        assert all(r.offset == -1 for r in results)  # the producer does not wait to learn it
    else:
        for p in (0, 1):
            assert sorted(r.offset for r in results if r.partition == p) == list(
                range(sum(1 for r in results if r.partition == p))
            )
        rows = {(p, r["offset"]): r["value"] for p, rs in read_all(store, "t").items() for r in rs}
        assert [rows[(r.partition, r.offset)] for r in results] == [b"%d" % i for i in range(50)]
    if acks == "all":
        assert fsyncs > 0  # durable: file and directory fsyncs before acknowledging
    else:
        assert fsyncs == 0
    assert sum(len(rows) for rows in read_all(store, "t").values()) == 50


def test_retries_under_injected_faults_lose_nothing_and_duplicate_nothing(
    store: kstore.Store,
) -> None:
    faulty = FaultyStorage(store.storage, seed=7)
    store = kstore.Store.from_storage(faulty)
    store.create_topic("t", partitions=3)

    faulty.add(Fault("put_if_absent", when="before", probability=0.25, match=is_commit))
    # The ambiguous case: the commit lands but the producer is told it failed.
    faulty.add(Fault("put_if_absent", when="after", probability=0.25, match=is_commit))
    faulty.add(Fault("put_new", when="before", probability=0.1, match=lambda p: "/segments/" in p))
    with Producer(
        store, linger_ms=1, batch_size=2_000, retry_backoff_ms=1, retry_backoff_max_ms=5
    ) as producer:
        futures = [producer.send("t", value=b"%06d" % i, key=b"k%d" % (i % 17)) for i in range(600)]
    metas = [f.get(timeout=60) for f in futures]
    assert faulty.injected.get("put_if_absent:after", 0) > 0
    assert faulty.injected.get("put_if_absent:before", 0) > 0
    faulty.clear()
    rows = [r for rows in read_all(store, "t").values() for r in rows]
    values = sorted(r["value"] for r in rows)
    assert values == [b"%06d" % i for i in range(600)]  # all there, none twice
    by_value = {(r["value"]): r["offset"] for rows in [rows] for r in rows}
    for i, meta in enumerate(metas):
        assert by_value[b"%06d" % i] == meta.offset


def test_undeliverable_records_fail_their_futures(
    local_store: tuple[str, dict[str, Any]], commit_logs: int
) -> None:
    faulty, store = faulty_local_store(local_store)
    faulty.add(Fault("put_new", when="before", match=is_record_write))
    errors: list[BaseException] = []
    with Producer(store, retries=2, retry_backoff_ms=1) as producer:
        fut = producer.send("t", value=b"x").add_errback(errors.append)
        producer.flush()
        with pytest.raises(StorageError):
            fut.get(timeout=30)
        assert fut.failed()
        assert isinstance(fut.exception, StorageError)
        assert len(errors) == 1
        assert producer.metrics()["record-error-total"] == 1
        faulty.clear()
        # The producer recovers: later records are delivered (a new epoch restarts sequences).
        assert producer.send("t", value=b"y").get(timeout=30).offset == 0


def test_callbacks(store: kstore.Store) -> None:
    store.create_topic("t")
    got: list[kstore.records.RecordMetadata] = []
    done = threading.Event()
    with Producer(store) as producer:
        producer.send("t", value=b"x").add_callback(lambda m: (got.append(m), done.set()))
    assert done.wait(30)
    assert got[0].topic == "t"
    assert got[0].offset == 0


def test_zombie_transactional_producer_is_fenced(store: kstore.Store) -> None:
    store.create_topic("t", partitions=2)
    old = Producer(store, transactional_id="payments-1")
    old.begin_transaction()
    old.send("t", value=b"a", partition=0)
    old.commit_transaction()
    old.begin_transaction()
    new = Producer(store, transactional_id="payments-1")  # takes over: the old one is a zombie
    assert new.epoch > old.epoch
    assert new.producer_id == old.producer_id
    zombie = old.send("t", value=b"zombie", partition=1)
    with pytest.raises(ProducerFencedError):
        zombie.get(timeout=30)
    with pytest.raises(ProducerFencedError):
        old.send("t", value=b"again")
    with pytest.raises(ProducerFencedError):
        old.commit_transaction()
    new.begin_transaction()
    new.send("t", value=b"b", partition=0)
    new.commit_transaction()
    new.close()
    old.close()
    values = [r["value"] for rows in read_all(store, "t").values() for r in rows]
    assert sorted(values) == [b"a", b"b"]


def test_backpressure_blocks_then_times_out(local_store: tuple[str, dict[str, Any]]) -> None:
    faulty, store = faulty_local_store(local_store)
    # Every write of records stalls, so the buffer cannot drain: a data object, or a commit
    # that carries its flush's data (PROTOCOL.md 11.8).
    faulty.add(Fault("put_new", when="delay", delay_s=2.0, match=is_record_write))
    faulty.add(Fault("put_if_absent", when="delay", delay_s=2.0, match=is_commit))
    producer = Producer(store, buffer_memory=5_000, batch_size=1_000, max_block_ms=300, linger_ms=0)
    started = time.monotonic()

    def fill() -> None:
        for _ in range(1_000):
            producer.send("t", value=b"x" * 500)

    with pytest.raises(KafkaTimeoutError, match="buffer_memory"):
        fill()
    assert time.monotonic() - started >= 0.3
    faulty.clear()
    producer.close()


def test_oversized_records_are_refused(store: kstore.Store) -> None:
    store.create_topic("small", config={"max.message.bytes": 1_000})
    with Producer(store, max_request_size=10_000) as producer:
        with pytest.raises(RecordTooLargeError, match=r"max\.message\.bytes=1000"):
            producer.send("small", value=b"x" * 2_000)
        with pytest.raises(RecordTooLargeError):
            producer.send_batch(
                "small", pa.table({"value": pa.array([b"x", b"y" * 5_000], pa.binary())})
            )
        producer.send("small", value=b"x" * 100).get(timeout=30)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"value": "text"}, InvalidRecordError, "value must be bytes"),
        ({"value": b"v", "key": 42}, InvalidRecordError, "key must be bytes"),
        ({"value": b"v", "headers": [("h", "str")]}, InvalidRecordError, "headers\\[0\\]"),
        ({"value": b"v", "headers": {"h": b"v"}}, InvalidRecordError, "headers"),
        ({"value": b"v", "timestamp_ms": -5}, InvalidRecordError, "timestamp_ms"),
        ({"value": b"v", "partition": 9}, UnknownTopicOrPartitionError, "partitions 0..1"),
        ({"value": b"v", "partition": "0"}, UnknownTopicOrPartitionError, "partitions"),
    ],
)
def test_wrong_types_are_named(
    memory_store: tuple[str, dict[str, Any]],
    kwargs: dict[str, Any],
    error: type[Exception],
    match: str,
) -> None:
    store = kstore.Store(memory_store[0])
    store.create_topic("t", partitions=2)
    with Producer(store) as producer:
        with pytest.raises(error, match=match):
            producer.send("t", **kwargs)
        assert issubclass(InvalidRecordError, TypeError)
    assert read_all(store, "t") == {0: [], 1: []}  # nothing written


def test_bad_topics_and_configs(memory_store: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(memory_store[0])
    store.create_topic("t")
    with pytest.raises(InvalidConfigurationError, match="linger"):
        Producer(store, lingerms=5)
    with pytest.raises(InvalidConfigurationError, match="acks"):
        Producer(store, acks=2)
    with pytest.raises(InvalidConfigurationError, match="gzip"):
        Producer(store, compression_type="gzip")
    with pytest.raises(InvalidConfigurationError, match="partitioner"):
        Producer(store, partitioner="random")
    with Producer(store) as producer:
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send("missing", value=b"x")
        with pytest.raises(InvalidTopicError):
            producer.send("../etc", value=b"x")


@pytest.mark.parametrize("case", backend_params(["memory", "local", "moto"]))
def test_partitions_written_at_once_default_to_the_cores_unless_writes_wait(
    case: tuple[str, int], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend, logs = case
    url, options = request.getfixturevalue(f"{backend}_store")
    create_topics_with(monkeypatch, logs)
    store = kstore.Store(url, options)
    store.create_topic("t", partitions=8)
    cores = len(os.sched_getaffinity(0))
    expected = 8 if backend == "moto" else min(8, cores)
    with Producer(store, acks="all") as durable:  # fsync waits: writes overlap everywhere
        assert durable.config["max_in_flight_partitions"] == 8
    with Producer(store) as producer:
        assert producer.config["max_in_flight_partitions"] == expected
        assert producer._sender._pool._max_workers == expected
        futures = [producer.send("t", b"v", key=b"%d" % i) for i in range(64)]
        producer.flush()
        assert sorted(f.get(timeout=30).partition for f in futures) == sorted(
            java_partition(b"%d" % i, 8) for i in range(64)
        )
    with Producer(store, max_in_flight_partitions=3) as producer:
        assert producer._sender._pool._max_workers == 3
    for bad in (0, -1, 2.5, "8", True):
        with pytest.raises(InvalidConfigurationError, match="max_in_flight_partitions"):
            Producer(store, max_in_flight_partitions=bad)


def test_send_batch_places_like_send(store: kstore.Store) -> None:
    store.create_topic("t", partitions=4)
    keys = [f"k{i}".encode() for i in range(300)]
    table = pa.table(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array([b"v%d" % i for i in range(300)], pa.binary()),
            "timestamp": pa.array([1_600_000_000_000 + i for i in range(300)], pa.int64()),
            "headers": pa.array(
                [[{"key": "i", "value": b"%d" % i}] for i in range(300)], HEADERS_TYPE
            ),
        }
    )
    with Producer(store) as producer:
        result = producer.send_batch("t", table).get(timeout=30)
        explicit = producer.send_batch(
            "t", pa.table({"value": pa.array([b"p3"], pa.binary())}), partition=3
        ).get(timeout=30)
    assert result.num_rows == 300
    partitions = result.column("partition").to_pylist()
    assert partitions == [java_partition(k, 4) for k in keys]
    assert explicit.column("partition").to_pylist() == [3]
    records = read_all(store, "t")
    for i, (p, offset) in enumerate(
        zip(partitions, result.column("offset").to_pylist(), strict=True)
    ):
        row = records[p][offset]
        assert row["value"] == b"v%d" % i
        assert row["headers"] == [{"key": "i", "value": b"%d" % i}]
        assert int(row["timestamp"].timestamp() * 1000) == 1_600_000_000_000 + i


def test_send_batch_rejects_bad_tables(memory_store: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(memory_store[0])
    store.create_topic("t", partitions=2)
    with Producer(store) as producer:
        with pytest.raises(InvalidRecordError, match="'value' column"):
            producer.send_batch("t", pa.table({"key": pa.array([b"k"])}))
        with pytest.raises(InvalidRecordError, match="must be binary"):
            producer.send_batch("t", pa.table({"value": pa.array(["text"])}))
        with pytest.raises(InvalidRecordError, match="unexpected columns"):
            producer.send_batch("t", pa.table({"value": pa.array([b"v"]), "extra": [1]}))
        with pytest.raises(UnknownTopicOrPartitionError):
            producer.send_batch(
                "t", pa.table({"value": pa.array([b"v"]), "partition": pa.array([5], pa.int32())})
            )
        with pytest.raises(InvalidRecordError):
            producer.send_batch("t", [b"not a table"])


def test_many_threads_share_one_producer(concurrent_store: kstore.Store) -> None:
    store = concurrent_store
    store.create_topic("t", partitions=3)
    per_thread = 400
    with Producer(store, linger_ms=1) as producer:

        def work(tid: int) -> None:
            for i in range(per_thread):
                producer.send("t", value=b"%d:%d" % (tid, i), key=b"thread-%d" % tid)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    order: dict[int, list[int]] = defaultdict(list)
    for rows in read_all(store, "t").values():
        for row in rows:
            tid, i = row["value"].split(b":")
            order[int(tid)].append(int(i))
    assert dict(order.items()) == {t: list(range(per_thread)) for t in range(4)}


def test_producer_after_fork_raises_clearly(local_store: tuple[str, dict[str, Any]]) -> None:
    store = kstore.Store(local_store[0])
    store.create_topic("t")
    producer = Producer(store)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            producer.send("t", value=b"x")
            os.write(write_end, b"no error")
        except IllegalStateError as exc:
            os.write(write_end, str(exc).encode()[:200])
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    message = os.read(read_end, 300).decode()
    os.close(read_end)
    assert "fork" in message
    producer.send("t", value=b"parent ok").get(timeout=30)
    producer.close()


def test_close_flushes_and_refuses_more(store: kstore.Store) -> None:
    store.create_topic("t", partitions=2)
    producer = Producer(store, linger_ms=10_000)
    fut = producer.send("t", value=b"x")
    assert producer.partitions_for("t") == {0, 1}
    producer.close()
    assert fut.get(timeout=1).offset == 0
    producer.close()  # idempotent
    with pytest.raises(IllegalStateError, match="closed"):
        producer.send("t", value=b"y")
    metrics = producer.metrics()
    assert metrics["record-send-total"] == 1
    assert metrics["commit-total"] >= 1


def test_log_append_time_topic(store: kstore.Store) -> None:
    store.create_topic("t", config={"message.timestamp.type": "LogAppendTime"})
    before = int(time.time() * 1000)
    with Producer(store) as producer:
        meta = producer.send("t", value=b"x", timestamp_ms=5).get(timeout=30)
    assert meta.timestamp >= before
    row = read_all(store, "t")[0][0]
    assert int(row["timestamp"].timestamp() * 1000) == meta.timestamp


@pytest.mark.parametrize(
    ("backend", "value_size", "overlapped", "logs"),
    [
        (backend, value_size, overlapped, logs)
        for backend, value_size, overlapped in [
            ("local", 10, False),
            ("memory", 10, False),
            ("local", 1_500, True),
            ("moto", 10, True),
        ]
        for logs in (COMMIT_LOGS if backend != "moto" else COMMIT_LOGS[:1])
    ],
)
def test_a_delivery_overlaps_the_next_only_where_its_writes_wait(
    backend: str,
    value_size: int,
    overlapped: bool,
    logs: int,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two topics' batches taken in one round are two deliveries. On a local disk with a few
    records the first is finished before the second is converted (its commit is CPU work:
    converting beside it only delays the acknowledgement); when the sender takes a full batch
    or more, or the storage is remote, the second is converted while the first is written.
    Either way every record lands."""
    url, options = request.getfixturevalue(f"{backend}_store")
    create_topics_with(monkeypatch, logs)
    store = kstore.Store(url, options)
    for topic in ("a", "b"):
        store.create_topic(topic, partitions=2)
    events: list[tuple[str, str]] = []
    with Producer(store, linger_ms=60_000, batch_size=4096) as producer:
        sender = producer._sender
        start, finish = sender._start, sender._finish

        def traced_start(group: list[Any]) -> Any:
            events.append(("start", group[0].topic))
            return start(group)

        def traced_finish(delivery: Any) -> None:
            events.append(("finish", delivery.batch.topic))
            finish(delivery)

        sender._start, sender._finish = traced_start, traced_finish  # type: ignore[method-assign]
        futures = [
            producer.send(topic, b"v" * value_size, key=b"%d" % i)
            for topic in ("a", "b")
            for i in range(2)  # 2 x 1,500 bytes per topic: under one batch each, over one in all
        ]
        producer.flush()
        assert [f.get(timeout=30).topic for f in futures] == ["a"] * 2 + ["b"] * 2
    if overlapped:
        assert events == [("start", "a"), ("start", "b"), ("finish", "a"), ("finish", "b")]
    else:
        assert events == [("start", "a"), ("finish", "a"), ("start", "b"), ("finish", "b")]
    assert sum(len(rows) for rows in read_all(store, "b").values()) == 2


def _ipc_file(table: pa.Table, codec: str | None) -> bytes:
    """``table`` as pyarrow's own IPC file writer writes it, compressed with ``codec``."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=codec)
    with pa.ipc.RecordBatchFileWriter(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=table.num_rows)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_compression_applies_to_a_partitions_share_of_a_flush_of_4_kib_or_more(
    store: kstore.Store, codec: str
) -> None:
    """compression_type compresses a partition's range of a flush whose buffers hold 4 KiB or
    more; a smaller range is written uncompressed (PROTOCOL.md 11.4): Arrow compresses each
    buffer on its own, which costs more than it saves on a few records. Both read back."""
    from kstore.segments import COMPRESS_MIN_BYTES, read_segment_data

    store.create_topic("t", partitions=2)
    value = bytes(range(256)) * 4
    with Producer(store, compression_type=codec, linger_ms=0) as producer:
        # One flush: each partition's range is a slice of the flush's table.
        batch = {
            "value": [value] * 16 + [b"v"],
            "key": [b"k%d" % i for i in range(17)],
            "partition": pa.array([0] * 16 + [1], pa.int32()),
        }
        producer.send_batch("t", pa.table(batch)).get(timeout=30)
    stored: list[bytes] = []
    for p in (0, 1):
        partition = store.partition("t", p)
        (seg,) = partition.state().segments
        data = read_segment_data(store.storage, partition.directory, seg, f"partition {p}")
        stored.append(bytes(data))
    big, small = (pa.ipc.open_file(pa.py_buffer(data)).read_all() for data in stored)
    assert big.nbytes >= COMPRESS_MIN_BYTES > small.nbytes
    assert stored[0] == _ipc_file(big, codec)
    assert stored[0] != _ipc_file(big, None)
    assert len(stored[0]) < len(_ipc_file(big, None))
    assert stored[1] == _ipc_file(small, None)
    rows = read_all(store, "t")
    assert [r["value"] for r in rows[0]] == [value] * 16
    assert [r["value"] for r in rows[1]] == [b"v"]


def test_a_large_send_batch_comes_back_whole_from_ranges_written_in_place(
    store: kstore.Store,
) -> None:
    """A send_batch() large enough that every partition's range is written by the IPC writer
    straight into the data object (more than FRAMED_MAX_ROWS records and FRAMED_MAX_BYTES),
    beside a partition with a few records (framed and copied in): every record comes back from
    storage, in its partition in send order, with its key, value, timestamp and headers, and
    every range is verified against its checksum on the way."""
    from kstore import segments

    store.create_topic("t", partitions=4)
    n = 6_000
    keys = [b"k%d" % i for i in range(n)]
    values = [b"%d-" % i + b"v" * (37 + i % 50) for i in range(n)]
    headers = [[{"key": "i", "value": b"%d" % i}] if i % 7 == 0 else None for i in range(n)]
    stamps = pa.array([1_700_000_000_000_000 + i for i in range(n)], TIMESTAMP_TYPE)
    # Partition 3 gets the last 5 records alone: a small range among large ones.
    wanted = [i % 3 for i in range(n - 5)] + [3] * 5
    table = pa.table(
        {
            "key": keys,
            "value": values,
            "timestamp": stamps,
            "headers": headers,
            "partition": pa.array(wanted, pa.int32()),
        }
    )
    with Producer(store) as producer:
        producer.send_batch("t", table).get(timeout=60)  # one delivery: one data object
    rows = read_all(store, "t")
    for p in range(4):
        sent = [i for i in range(n) if wanted[i] == p]
        assert [r["key"] for r in rows[p]] == [keys[i] for i in sent]
        assert [r["value"] for r in rows[p]] == [values[i] for i in sent]
        assert [r["offset"] for r in rows[p]] == list(range(len(sent)))
        assert [r["timestamp"].timestamp() * 1_000_000 for r in rows[p]] == [
            1_700_000_000_000_000 + i for i in sent
        ]
        assert [r["headers"] for r in rows[p]] == [
            [{"key": "i", "value": b"%d" % i}] if i % 7 == 0 else None for i in sent
        ]
    (small,) = store.partition("t", 3).state().segments
    assert small.record_count == 5
    logs = store.topic("t").commit_logs
    for p in range(3):
        (seg,) = store.partition("t", p).state().segments
        # One data object per topic log: partition 3's small range is in its log's object.
        assert (seg.path == small.path) == (p % logs == 3 % logs)
        assert seg.record_count > segments.FRAMED_MAX_ROWS
        assert seg.size_bytes > segments.FRAMED_MAX_BYTES


@pytest.mark.parametrize("partitions", [1, 8])
def test_a_segment_holds_its_records_alone_whatever_table_they_came_from(
    store: kstore.Store, partitions: int
) -> None:
    """Every segment is as large as its records written afresh, give or take padding: neither a
    send_batch() of a slice of a large table whose headers pa.nulls made (an IPC message of
    such a slice carries the whole table's buffers: 1.6 MB for 100 records, once) nor send()
    records the sender writes without reordering them (a one-partition topic) carry more."""
    import pyarrow.ipc as ipc

    store.create_topic("t", partitions=partitions)
    n = 200_000
    big = pa.table(
        {
            "key": [b"k%d" % i for i in range(n)],
            "value": [b"v" * 10] * n,
            "headers": pa.nulls(n, HEADERS_TYPE),
        }
    )
    with Producer(store, linger_ms=1000) as producer:
        producer.send_batch("t", big.slice(100_000, 100)).get(timeout=30)
        for i in range(50):
            producer.send("t", b"w" * 10, key=b"s%d" % i)
        producer.flush()
    schema = BINARY.record_schema
    checked = 0
    for p in range(partitions):
        part = store.partition("t", p)
        for seg in part.state().segments:
            batches = list(part.read(seg.base_offset, seg.record_count))
            rows = [
                {k: v for k, v in row.items() if k != "offset"}
                for batch in batches
                for row in batch.to_pylist()
            ]
            assert len(rows) == seg.record_count
            sink = pa.BufferOutputStream()
            with ipc.new_file(sink, schema) as writer:
                writer.write_table(pa.Table.from_pylist(rows, schema=schema))
            assert seg.size_bytes <= sink.getvalue().size + 256, (p, seg.path)
            checked += seg.record_count
    assert checked == 150
