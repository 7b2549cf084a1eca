"""Issue 45, the producer's side of layout 3 with ``commit.logs`` > 1: what a producer
acknowledges is where its records are (defect 1), a transaction's markers go to each
partition's own topic log, and a partition refused inside a shared topic-log commit fails
alone (the escaped bugs). Every test sends through the public producer API and checks what a
consumer reads back."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from kstore import Consumer, Producer, ProducerFencedError, Store
from kstore.errors import KStoreError
from kstore.log import decode_commit
from kstore.topic_log import TopicLog
from tests.conftest import StoreTarget


@pytest.fixture(params=["memory", "local"])
def fast_store(request: pytest.FixtureRequest) -> StoreTarget:
    fixture = {"memory": "memory_store_url", "local": "local_store_url"}[request.param]
    url, options = request.getfixturevalue(fixture)
    return StoreTarget(request.param, url, options)


def _read_all(
    target: StoreTarget, topic: str, *, isolation: str = "read_uncommitted"
) -> dict[tuple[int, int], tuple[bytes | None, bytes | None]]:
    """Every record of the topic, (partition, offset) -> (key, value), read until three polls
    in a row find nothing."""
    got: dict[tuple[int, int], tuple[bytes | None, bytes | None]] = {}
    with Consumer(
        topic,
        store=Store(target.url, target.storage_options),
        auto_offset_reset="earliest",
        isolation_level=isolation,
    ) as consumer:
        idle = 0
        while idle < 3:
            polled = consumer.poll(timeout_ms=30)
            idle = 0 if polled else idle + 1
            for records in polled.values():
                for r in records:
                    assert (r.partition, r.offset) not in got
                    got[(r.partition, r.offset)] = (r.key, r.value)
    return got


@pytest.fixture(params=["memory", "local", pytest.param("seaweed", marks=pytest.mark.s3)])
def any_fast_or_seaweed(request: pytest.FixtureRequest) -> StoreTarget:
    """The issue's reproductions run on local disk and SeaweedFS (and memory)."""
    fixture = {
        "memory": "memory_store_url",
        "local": "local_store_url",
        "seaweed": "seaweed_bucket_url",
    }[request.param]
    url, options = request.getfixturevalue(fixture)
    return StoreTarget(request.param, url, options)


def test_the_issues_reproduction_acknowledges_each_partitions_own_offset(
    any_fast_or_seaweed: StoreTarget,
) -> None:
    """3 partitions in 2 topic logs, 5 records already in partition 1, then one delivery of one
    record to each partition: the futures said {0: 0, 1: 0, 2: 5}, the log held {0: 0, 1: 5,
    2: 0} (the writes, grouped by topic log as 0, 2, 1, were paired with the jobs by
    position)."""
    fast_store = any_fast_or_seaweed
    store = Store(fast_store.url, fast_store.storage_options)
    store.create_topic("t", 3, config={"commit.logs": 2})
    with Producer(store, linger_ms=60_000) as producer:
        for i in range(5):
            producer.send("t", value=b"before-%d" % i, partition=1)
        producer.flush()
        futures = {p: producer.send("t", value=b"one-%d" % p, partition=p) for p in range(3)}
        producer.flush()
        acknowledged = {p: f.get(timeout=30).offset for p, f in futures.items()}
    assert acknowledged == {0: 0, 1: 5, 2: 0}
    got = _read_all(fast_store, "t")
    for p, offset in acknowledged.items():
        assert got[(p, offset)] == (None, b"one-%d" % p)


@pytest.mark.parametrize("commit_logs", [2, 3])
def test_every_acknowledged_offset_holds_the_record_sent(
    fast_store: StoreTarget, commit_logs: int
) -> None:
    """More partitions than topic logs, some partitions already holding records (so that
    their offsets differ), deliveries that each span every topic log: each future's (partition,
    offset) is where a consumer finds that record's key and value, for send() and for
    send_batch()."""
    store = Store(fast_store.url, fast_store.storage_options)
    partitions = 7
    store.create_topic("t", partitions, config={"commit.logs": commit_logs})
    sent: dict[Any, tuple[bytes, bytes]] = {}
    with Producer(store, linger_ms=60_000) as producer:
        # Earlier records, a different number in each of some partitions (in every log).
        for p, count in ((1, 5), (2, 3), (4, 9), (5, 1)):
            for i in range(count):
                key, value = b"pre-k%d-%d" % (p, i), b"pre-v%d-%d" % (p, i)
                sent[producer.send("t", value=value, key=key, partition=p)] = (key, value)
        producer.flush()
        for round_ in range(3):
            # One delivery: records to every partition, interleaved, several to some.
            for i in range(4 * partitions):
                p = (i * 3 + round_) % partitions
                key, value = b"k%d-%d" % (round_, i), b"v%d-%d" % (round_, i)
                sent[producer.send("t", value=value, key=key, partition=p)] = (key, value)
            producer.flush()
        # send_batch(): placed by key, one delivery over every log.
        keys = [b"batch-k%d" % i for i in range(50)]
        values = [b"batch-v%d" % i for i in range(50)]
        batch = producer.send_batch("t", pa.table({"key": keys, "value": values}))
        producer.flush()
        acknowledged = {f.get(timeout=30): kv for f, kv in sent.items()}
        placed = batch.get(timeout=30).to_pylist()
    got = _read_all(fast_store, "t")
    assert len(got) == len(sent) + 50
    for metadata, (key, value) in acknowledged.items():
        assert got[(metadata.partition, metadata.offset)] == (key, value), metadata
    assert len({(r["partition"], r["offset"]) for r in placed}) == 50
    for row, key, value in zip(placed, keys, values, strict=True):
        assert got[(row["partition"], row["offset"])] == (key, value), row
    # And the deliveries did span several logs at once (else the pairing could not go wrong).
    assert len({m.partition % commit_logs for m in acknowledged}) == commit_logs


def _markers_by_log(store: Store, topic: str, commit_logs: int) -> dict[int, set[int]]:
    """Topic log index -> the partitions its commits hold transaction markers for."""
    meta = store.topic(topic)
    incarnation = f"topics/{topic}/{meta.topic_id}"
    out: dict[int, set[int]] = {}
    for index in range(commit_logs):
        log_dir = f"{incarnation}/_log" if index == 0 else f"{incarnation}/_log.{index}"
        for info in store.storage.list_dir(log_dir):
            name = info.name
            if not name.endswith(".json") or "checkpoint" in name:
                continue
            for action, body in decode_commit(store.storage.read(f"{log_dir}/{name}"), name)[1]:
                if action == "txnMarker":
                    out.setdefault(index, set()).add(body["partition"])
    return out


@pytest.mark.parametrize("commit_logs", [2, 3])
def test_a_transactions_markers_go_to_each_partitions_own_topic_log(
    fast_store: StoreTarget, commit_logs: int
) -> None:
    """A committed transaction over 4 partitions in 2 (or 3) topic logs: every partition's
    last stable offset reaches its end and a read_committed consumer reads every record of the
    transaction; an aborted one after it leaves nothing behind and holds no partition back.
    (With every marker in the first partition's log, partitions 1 and 3 kept their last
    stable offset where the transaction began, and read_committed readers stalled there.)"""
    store = Store(fast_store.url, fast_store.storage_options)
    store.create_topic("t", 4, config={"commit.logs": commit_logs})
    with Producer(store) as plain:  # offsets differ between partitions
        for p, count in ((1, 2), (3, 4)):
            for i in range(count):
                plain.send("t", value=b"plain-%d-%d" % (p, i), partition=p)
    producer = Producer(store, transactional_id="tx", linger_ms=60_000)
    try:
        producer.begin_transaction()
        futures = {
            (p, i): producer.send("t", value=b"txn-%d-%d" % (p, i), key=b"k%d" % i, partition=p)
            for p in range(4)
            for i in range(3)
        }
        producer.flush()
        for p in range(4):
            state = store.partition("t", p).state()
            assert state.last_stable_offset < state.end_offset  # open: held back
        producer.commit_transaction()
        for p in range(4):
            state = Store(fast_store.url, fast_store.storage_options).partition("t", p).state()
            assert state.last_stable_offset == state.end_offset, p
            assert state.open_transactions == {}, p
        assert _markers_by_log(store, "t", commit_logs) == {
            index: {p for p in range(4) if p % commit_logs == index} for index in range(commit_logs)
        }
        committed = _read_all(fast_store, "t", isolation="read_committed")
        for (p, i), future in futures.items():
            metadata = future.get(timeout=30)
            assert metadata.partition == p
            assert committed[(p, metadata.offset)] == (b"k%d" % i, b"txn-%d-%d" % (p, i))
        assert len(committed) == 6 + 12
        ends = {p: store.partition("t", p).state().end_offset for p in range(4)}

        producer.begin_transaction()
        for p in range(4):
            producer.send("t", value=b"aborted-%d" % p, partition=p)
        producer.abort_transaction()
    finally:
        producer.close()
    fresh = Store(fast_store.url, fast_store.storage_options)
    for p in range(4):
        state = fresh.partition("t", p).state()
        assert state.last_stable_offset == state.end_offset == ends[p] + 1, p
        assert not [s for s in state.segments if s.base_offset >= ends[p]], p  # removed
    for isolation in ("read_committed", "read_uncommitted"):
        assert _read_all(fast_store, "t", isolation=isolation) == committed


def test_a_refusal_inside_a_shared_commit_leaves_the_partitions_after_it_in(
    local_store_url: tuple[str, dict[str, Any]],
) -> None:
    """TopicLog.commit with isolate: outcomes {0: ok, 1: fenced, 2: ok} commit partitions 0
    and 2 (the partition after the refused one too) and return 1's error."""
    store = Store(*local_store_url)
    store.create_topic("t", 3)
    shared = store.topic_log("t", store.topic("t"), 0)

    def ok(offset: int) -> Any:
        return lambda state: [{"logStart": {"offset": offset}}]

    def fenced(state: Any) -> Any:
        raise ProducerFencedError("partition 1 fenced")

    result, refused = shared.commit({0: ok(0), 1: fenced, 2: ok(0)}, operation="TEST", isolate=True)
    assert result is not None
    assert list(refused) == [1]
    assert isinstance(refused[1], ProducerFencedError)
    committed = [a["logStart"]["partition"] for a in result.actions if "logStart" in a]
    assert committed == [0, 2]


@pytest.mark.parametrize("commit_logs", [1, 3])
def test_a_partition_fenced_alone_fails_alone_in_its_topic_logs_commit(
    fast_store: StoreTarget, commit_logs: int
) -> None:
    """A marker of a newer epoch of the producer's id on one partition (what a successor's
    recovery writes there) fences that partition only. The producer's next delivery to three
    partitions of one topic log, the fenced one in the middle: the other two land in the one
    commit and are acknowledged with their offsets (a consumer finds them there), the fenced
    one fails with ProducerFencedError. (A refusal that took the partitions after it out of
    the commit failed the whole log's records with an AssertionError.)"""
    store = Store(fast_store.url, fast_store.storage_options)
    partitions = 3 * commit_logs
    store.create_topic("t", partitions, config={"commit.logs": commit_logs})
    first, fenced, last = 0, commit_logs, 2 * commit_logs  # one topic log: log 0
    producer = Producer(store, linger_ms=60_000)
    try:
        for p in (first, fenced, last):
            for i in range(p + 1):  # offsets differ between the partitions
                producer.send("t", value=b"pre-%d-%d" % (p, i), partition=p)
        producer.flush()
        store.partition("t", fenced).end_transaction(
            producer.producer_id, producer.epoch + 1, 0, commit=False
        )
        futures = {
            p: [producer.send("t", value=b"v-%d-%d" % (p, i), partition=p) for i in range(2)]
            for p in (first, fenced, last)
        }
        producer.flush()
        for future in futures[fenced]:
            with pytest.raises(ProducerFencedError):
                future.get(timeout=30)
        acknowledged = {
            (p, i): futures[p][i].get(timeout=30).offset for p in (first, last) for i in range(2)
        }
    finally:
        producer.close()
    assert acknowledged == {(first, 0): 1, (first, 1): 2, (last, 0): last + 1, (last, 1): last + 2}
    got = _read_all(fast_store, "t")
    for (p, i), offset in acknowledged.items():
        assert got[(p, offset)] == (None, b"v-%d-%d" % (p, i))
    assert not [v for _, v in got.values() if v is not None and v.startswith(b"v-%d-" % fenced)]


def test_a_partition_a_commit_leaves_out_fails_alone(
    local_store_url: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Should a topic log's commit ever leave a partition out without refusing it, the
    producer fails that partition's records alone with an error that says so; the partitions
    that landed are acknowledged (no AssertionError failing the whole log's records)."""
    store = Store(*local_store_url)
    store.create_topic("t", 3)
    commit = TopicLog.commit

    def leaving_out_the_last(self: TopicLog, builds: Any, **kwargs: Any) -> Any:
        if kwargs.get("operation") == "APPEND" and len(builds) > 1:
            builds = {p: b for p, b in builds.items() if p != max(builds)}
        return commit(self, builds, **kwargs)

    monkeypatch.setattr(TopicLog, "commit", leaving_out_the_last)
    with Producer(store, linger_ms=60_000) as producer:
        futures = {p: producer.send("t", value=b"v%d" % p, partition=p) for p in range(3)}
        producer.flush()
        assert {p: futures[p].get(timeout=30).offset for p in (0, 1)} == {0: 0, 1: 0}
        with pytest.raises(KStoreError, match=r"t-2: the commit of topic log 0 .* not written"):
            futures[2].get(timeout=30)
    monkeypatch.undo()
    assert _read_all(StoreTarget("local", *local_store_url), "t") == {
        (0, 0): (None, b"v0"),
        (1, 0): (None, b"v1"),
    }
