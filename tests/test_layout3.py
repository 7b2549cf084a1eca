"""Layout 3 (PROTOCOL.md 26): topic logs shared by partitions, data objects, sidecar checkpoints."""

from __future__ import annotations

import gzip
import json
import threading
from typing import Any

import pytest

from kstore import (
    Consumer,
    CorruptLogError,
    InvalidConfigurationError,
    Producer,
    ProducerFencedError,
    Store,
)
from kstore.errors import StorageError
from kstore.log import decode_commit, version_file
from kstore.topic_log import TOPIC_LOG_VERSION, TopicLog, TopicLogState
from tests import layout2
from tests.commit_logs import (
    ALL_BACKENDS,
    S3_MARKS,
    LogsTarget,
    backend_params,
    commit_logs_fixture,
    logs_target,
)
from tests.conftest import StoreTarget


@pytest.fixture(params=backend_params(ALL_BACKENDS, marks=S3_MARKS))
def layout3_store(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> LogsTarget:
    """Every backend; on the fast ones with commit.logs 1 and 3 (tests/commit_logs.py)."""
    return logs_target(request, monkeypatch)


commit_logs = commit_logs_fixture()


def _log_dir(incarnation: str, index: int) -> str:
    return f"{incarnation}/_log" if index == 0 else f"{incarnation}/_log.{index}"


def _store(target: StoreTarget) -> Store:
    return Store(target.url, target.storage_options)


def _files(store: Store, directory: str) -> list[str]:
    return sorted(info.name for info in store.storage.list_dir(directory))


def _incarnation(store: Store, topic: str) -> str:
    meta = store.topic(topic)
    return f"topics/{topic}/{meta.topic_id}"


def _commits(store: Store, log_dir: str) -> list[list[tuple[str, dict[str, Any]]]]:
    out = []
    for name in _files(store, log_dir):
        if name.endswith(".json") and "checkpoint" not in name:
            out.append(decode_commit(store.storage.read(f"{log_dir}/{name}"), name)[1])
    return out


def _consume_all(url: str, options: dict[str, Any], topic: str, expected: int) -> list[Any]:
    consumer = Consumer(store=Store(url, options), auto_offset_reset="earliest")
    consumer.subscribe([topic])
    records: list[Any] = []
    for _ in range(50):
        for batch in consumer.poll(200).values():
            records.extend(batch)
        if len(records) >= expected:
            break
    consumer.close()
    return records


def test_one_flush_to_many_partitions_is_one_object_and_one_commit(
    layout3_store: LogsTarget,
) -> None:
    """One object and one commit per topic log (with commit.logs 3: three of each, each
    holding its partitions p mod 3), and every record where its future says."""
    store = _store(layout3_store)
    logs = layout3_store.commit_logs
    store.create_topic("t", 8)
    incarnation = _incarnation(store, "t")
    with Producer(store, linger_ms=10_000) as producer:
        futures = [
            producer.send("t", key=f"k{i}".encode(), value=f"v{i}".encode()) for i in range(400)
        ]
        producer.flush()
        metas = [f.get() for f in futures]
    assert {m.partition for m in metas} == set(range(8))
    assert len(_files(store, f"{incarnation}/_data")) == logs
    for index in range(logs):
        commits = _commits(store, _log_dir(incarnation, index))
        appends = [c for c in commits if any(name == "add" for name, _ in c)]
        assert len(appends) == 1
        assert sorted(body["partition"] for name, body in appends[0] if name == "add") == list(
            range(index, 8, logs)
        )
    # No partition keeps a log of its own in layout 3.
    logs_dirs = {_log_dir(incarnation, k).rsplit("/", 1)[1] for k in range(logs)}
    assert not [n for n in _files(store, incarnation) if n not in {"_data", *logs_dirs}]
    records = _consume_all(layout3_store.url, layout3_store.storage_options, "t", 400)
    got = {(r.partition, r.offset): (r.key, r.value) for r in records}
    assert got == {
        (m.partition, m.offset): (f"k{i}".encode(), f"v{i}".encode()) for i, m in enumerate(metas)
    }
    # Offsets are dense per partition from 0.
    for p in range(8):
        offsets = sorted(o for q, o in got if q == p)
        assert offsets == list(range(len(offsets)))


def test_commit_logs_split_partitions_over_logs(local_store: tuple[str, dict[str, Any]]) -> None:
    store = Store(*local_store)
    store.create_topic("t", 4, config={"commit.logs": 2})
    incarnation = _incarnation(store, "t")
    with Producer(store, linger_ms=10_000) as producer:
        for p in range(4):
            producer.send("t", value=b"x", partition=p)
        producer.flush()
    data = _files(store, f"{incarnation}/_data")
    assert len(data) == 2  # one object per topic log
    for index, log_dir in ((0, "_log"), (1, "_log.1")):
        adds = [b for c in _commits(store, f"{incarnation}/{log_dir}") for n, b in c if n == "add"]
        assert sorted(b["partition"] for b in adds) == [index, index + 2]
    with pytest.raises(InvalidConfigurationError, match=r"commit\.logs"):
        store.alter_topic_config("t", {"commit.logs": 3})
    with pytest.raises(InvalidConfigurationError, match="kstore topics upgrade"):
        store.create_topic("old", 2, config={"commit.logs": 2}, layout=2)


def test_transaction_markers_of_one_log_land_in_one_commit(layout3_store: LogsTarget) -> None:
    """The markers of the partitions of one topic log: one commit of that log (with
    commit.logs 3: one commit in each of the three logs, of its two partitions)."""
    store = _store(layout3_store)
    logs = layout3_store.commit_logs
    store.create_topic("t", 6)
    producer = Producer(store, transactional_id="tx")
    producer.init_transactions()
    producer.begin_transaction()
    for p in range(6):
        producer.send("t", value=b"in-txn", partition=p)
    producer.commit_transaction()
    producer.close()
    for index in range(logs):
        commits = _commits(store, _log_dir(_incarnation(store, "t"), index))
        with_markers = [c for c in commits if any(n == "txnMarker" for n, _ in c)]
        assert len(with_markers) == 1
        assert sorted(b["partition"] for n, b in with_markers[0] if n == "txnMarker") == list(
            range(index, 6, logs)
        )
    for p in range(6):
        state = store.partition("t", p).state()
        assert state.last_stable_offset == state.end_offset == 1


def test_a_refused_partition_fails_alone_in_a_shared_commit(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    store = Store(*local_store)
    store.create_topic("t", 2)
    shared = store.topic_log("t", store.topic("t"), 0)

    def ok(state: Any) -> list[dict[str, Any]]:
        return [{"logStart": {"offset": 0}}]

    def fenced(state: Any) -> list[dict[str, Any]]:
        raise ProducerFencedError("fenced")

    result, refused = shared.commit({0: ok, 1: fenced}, operation="TEST", isolate=True)
    assert result is not None
    assert set(refused) == {1}
    assert isinstance(refused[1], ProducerFencedError)
    with pytest.raises(ProducerFencedError):
        shared.commit({0: ok, 1: fenced}, operation="TEST")
    assert shared.state().version == result.version  # the refused commit wrote nothing


def test_checkpoint_sidecars_are_reused_while_a_partition_is_unchanged(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    store = Store(*local_store)
    store.create_topic("t", 3, config={"checkpoint.interval": 4})
    incarnation = _incarnation(store, "t")
    with Producer(store, linger_ms=0) as producer:
        for i in range(5):  # versions 0-4: every partition changes
            for p in range(3):
                producer.send("t", value=b"a%d" % i, partition=p)
            producer.flush()
        for i in range(4):  # versions 5-8: only partition 0
            producer.send("t", value=b"b%d" % i, partition=0)
            producer.flush()

    def sidecars(version: int) -> dict[int, str]:
        top = store.storage.read(f"{incarnation}/_log/{version:020d}.checkpoint.json")
        _, actions = decode_commit(top, "checkpoint")
        return {b["partition"]: b["path"] for n, b in actions if n == "sidecar"}

    first, second = sidecars(4), sidecars(8)
    assert set(first) == set(second) == {0, 1, 2}
    assert second[1] == first[1]  # unchanged: by reference
    assert second[2] == first[2]
    assert second[0] != first[0]
    # A reader that loads the checkpoint sees exactly the state a replay from version 0 builds.
    shared = Store(*local_store).topic_log("t", store.topic("t"), 0)
    loaded = shared.log.load()
    replayed = shared.log.load_version(8)
    assert loaded.version == 8
    for p in range(3):
        assert (
            loaded.partition(p).checkpoint_actions() == replayed.partition(p).checkpoint_actions()
        )


def test_a_missing_sidecar_or_a_bad_range_is_a_corrupt_log(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    store = Store(*local_store)
    store.create_topic("t", 2, config={"checkpoint.interval": 1})
    incarnation = _incarnation(store, "t")
    with Producer(store, linger_ms=0) as producer:
        for p in (0, 1):
            producer.send("t", value=b"x", partition=p)
            producer.flush()
    top = store.storage.read(f"{incarnation}/_log/{1:020d}.checkpoint.json")
    path = next(
        b["path"] for n, b in decode_commit(top, "c")[1] if n == "sidecar" and b["partition"] == 1
    )
    store.storage.delete([f"{incarnation}/{path}"])
    with pytest.raises(CorruptLogError, match="sidecar"):
        Store(*local_store).partition("t", 1).state()
    state = TopicLogState()
    for bad in ([-1, 5], [0, 0], "0-5", [0]):
        with pytest.raises(CorruptLogError, match="range"):
            state.apply(
                "add",
                {
                    "partition": 0,
                    "path": "_data/x.kdat",
                    "baseOffset": 0,
                    "lastOffset": 0,
                    "records": 1,
                    "minTimestamp": 0,
                    "maxTimestamp": 0,
                    "size": 5,
                    "checksum": "crc32c:0",
                    "format": "arrow",
                    "range": bad,
                },
            )
    with pytest.raises(CorruptLogError, match="illegal segment path"):
        state.apply(
            "add",
            {
                "partition": 0,
                "path": "_data/../../x.kdat",
                "baseOffset": 0,
                "lastOffset": 0,
                "records": 1,
                "minTimestamp": 0,
                "maxTimestamp": 0,
                "size": 5,
                "checksum": "crc32c:0",
                "format": "arrow",
                "range": [0, 5],
            },
        )


def test_a_layout_2_topic_is_read_from_its_partition_logs(any_store: StoreTarget) -> None:
    store = _store(any_store)
    meta = layout2.create_topic(store, "old", 2)
    assert meta.layout == 2
    for i in range(10):
        layout2.append(store, "old", i % 2, layout2.records([b"v"], [b"%d" % i]))
    incarnation = _incarnation(store, "old")
    assert "_log" not in _files(store, incarnation)
    assert any(_files(store, f"{incarnation}/{p}/_log") for p in (0, 1))
    assert len(_consume_all(any_store.url, any_store.storage_options, "old", 10)) == 10


def test_a_layout_3_topic_is_refused_by_older_readers(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    store = Store(*local_store)
    store.create_topic("t", 1)
    first = store.storage.read(f"topics/t/_log/{version_file(0)}")
    protocol = [json.loads(line) for line in first.decode().splitlines() if '"protocol"' in line]
    assert protocol
    # Version 5: layout 3 with incremental checkpoints and commits that carry data
    # (PROTOCOL.md 3.2, 11.8).
    assert protocol[-1]["protocol"]["minReaderVersion"] == TOPIC_LOG_VERSION


@pytest.mark.s3
def test_an_idle_consumer_asks_once_per_topic_per_poll(
    seaweed_store: tuple[str, dict[str, Any]],
) -> None:
    url, options = seaweed_store
    store = Store(url, options)
    requests: dict[int, int] = {}
    for partitions in (1, 16):
        topic = f"idle{partitions}"
        store.create_topic(topic, partitions)
        with Producer(store) as producer:
            for p in range(partitions):
                producer.send(topic, value=b"x", partition=p)
        consumer = Consumer(store=Store(url, options), auto_offset_reset="earliest")
        consumer.assign([_tp(topic, p) for p in range(partitions)])
        seen = 0
        while seen < partitions:
            seen += sum(len(b) for b in consumer.poll(500).values())
        consumer.poll(0)  # settle: positions known, metadata cached
        with consumer.store.storage.count_requests() as counts:
            for _ in range(5):
                consumer.poll(0)
        requests[partitions] = sum(counts.values())
        consumer.close()
    # One GET of the next topic log version per poll, whatever the partition count (plus at
    # most one metadata re-read in the second these polls take).
    assert requests[1] <= 6, requests
    assert requests[16] <= 6, requests


def _tp(topic: str, partition: int) -> Any:
    from kstore import TopicPartition

    return TopicPartition(topic, partition)


def test_a_sidecar_whose_size_differs_or_an_unnamed_partition_action_is_corrupt(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    store = Store(*local_store)
    store.create_topic("t", 1, config={"checkpoint.interval": 1})
    incarnation = _incarnation(store, "t")
    with Producer(store, linger_ms=0) as producer:
        producer.send("t", value=b"x").get(timeout=30)
        producer.send("t", value=b"y").get(timeout=30)
    top = store.storage.read(f"{incarnation}/_log/{1:020d}.checkpoint.json")
    path = next(b["path"] for n, b in decode_commit(top, "c")[1] if n == "sidecar")
    content = store.storage.read(f"{incarnation}/{path}")
    assert gzip.decompress(content).startswith(b'{"sidecar":{"partition":0,"version":1,')
    store.storage.put(f"{incarnation}/{path}", content + b"\n")
    with pytest.raises(CorruptLogError, match="bytes, the checkpoint records"):
        Store(*local_store).partition("t", 0).state()
    with pytest.raises(CorruptLogError, match="must name its partition"):
        TopicLogState().apply("logStart", {"offset": 3})


def test_sidecars_of_a_checkpoint_seen_long_ago_are_written_again(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    store = Store(*local_store)
    store.create_topic("t", 2, config={"checkpoint.interval": 1000})
    with Producer(store, linger_ms=0) as producer:
        for p in (0, 1):
            producer.send("t", value=b"x", partition=p)
    shared = store.topic_log("t", store.topic("t"), 0)
    state = shared.state()
    shared.log.write_checkpoint(state)
    first = dict(state.sidecars)
    state.stamp(state.version)  # nothing changed
    shared.log.write_checkpoint(state)
    assert state.sidecars == first  # reused while fresh
    state.sidecars_seen -= 25 * 3600  # as if read a day ago: vacuum may have taken them
    shared.log.write_checkpoint(state)
    assert state.sidecars.keys() == first.keys()
    assert all(state.sidecars[p][0]["path"] != first[p][0]["path"] for p in first)


@pytest.mark.parametrize("inline", [0, None], ids=["objects", "carried"])
def test_writers_sharing_a_topic_log_look_before_they_write(
    seaweed_store: tuple[str, dict[str, Any]], inline: int | None, commit_logs: int
) -> None:
    """Two producer processes alternating on one topic log: after the first lost race, each
    looks for the other's newer version (a GET) before writing, instead of sending a commit
    that is refused (a PUT, which costs as much as twelve GETs). A lost race's winner is read
    once. With flushes written as data objects, and carried by their commits (the default,
    PROTOCOL.md 11.8); with commit.logs 3, each flush writes to three topic logs (partitions
    0 and 3 share log 0), each log as one does alone."""
    url, options = seaweed_store
    logs = min(commit_logs, 4)
    config = {} if inline is None else {"commit.inline.bytes": inline}
    Store(url, options).create_topic("shared", 4, config)
    # Racing writers (shared commits off): how they learn of each other. Writers that share
    # commits are tested in test_commit_share.py.
    first, second = (
        Producer(Store(url, options), linger_ms=0, shared_commits=False) for _ in range(2)
    )
    rounds = 12
    try:
        for producer in (first, second):
            producer.partitions_for("shared")  # both load the topic log before either writes
        with Store(url, options).storage.count_requests() as counts:
            for r in range(rounds):
                for number, producer in enumerate((first, second)):
                    for p in range(4):
                        producer.send("shared", value=b"%d-%d-%d" % (number, r, p), partition=p)
                    producer.flush()
        flushes = 2 * rounds
        # Each flush, in each topic log: one commit, and one data object unless the commit
        # carries the data; the first commit of a topic log (version 0) never does, so it has
        # one. Refused commits: one or two early flushes (each producer finds out it shares the
        # log).
        written = logs * (2 * flushes if inline == 0 else flushes + 1)
        refused = counts["PUT"] - written
        assert 0 <= refused <= 3 * logs, dict(counts)
        # Each flush after that: a GET that finds the other's commit and one that finds none.
        assert counts["GET"] <= logs * (2 * flushes + 2), dict(counts)
    finally:
        first.close()
        second.close()
    records = _consume_all(url, options, "shared", 4 * flushes)
    by_partition: dict[int, list[bytes]] = {}
    for record in records:
        by_partition.setdefault(record.partition, []).append(record.value)
    for p in range(4):
        assert by_partition[p] == [b"%d-%d-%d" % (n, r, p) for r in range(rounds) for n in range(2)]
        assert [r.offset for r in records if r.partition == p] == list(range(2 * rounds))


def test_a_topics_effective_config_is_worked_out_once_and_handed_out_as_a_copy(
    tmp_path: Any,
) -> None:
    """The metadata keeps its effective configuration (a producer asks for the commit logs of
    every partition of every flush); what callers get is theirs to change."""
    store = Store(str(tmp_path / "store"))
    store.create_topic("t", partitions=4, config={"commit.logs": 2, "retention.ms": 1000})
    meta = store.topic("t")
    effective = meta.effective_config
    assert (meta.commit_logs, effective["retention.ms"]) == (2, 1000)
    effective["commit.logs"] = 3
    effective["retention.ms"] = 5
    assert meta.commit_logs == 2
    assert meta.effective_config["retention.ms"] == 1000
    store.alter_topic_config("t", {"retention.ms": 2000})
    assert store.topic("t").effective_config["retention.ms"] == 2000


def test_the_sender_writes_a_small_delivery_itself_on_local_storage_and_hands_others_to_the_pool(
    layout3_store: LogsTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delivery to one topic log that the sender would not overlap with the next is written
    by the sender thread itself where the storage is local (no handoff to a pool thread and
    back per flush); on an object store, for a delivery of a full batch, and for one to
    several topic logs (commit.logs 3), pool threads write it. Offsets follow send order across
    the two and are the ones acknowledged, and a write that fails on the sender thread fails
    its records, not the thread."""
    any_store = layout3_store
    store = _store(any_store)
    store.create_topic("t", 4)
    threads: list[str] = []
    commit = TopicLog.commit

    def recording(self: TopicLog, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return commit(self, *args, **kwargs)

    shared_commit = TopicLog.commit_state_build

    def recording_shared(self: TopicLog, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return shared_commit(self, *args, **kwargs)

    monkeypatch.setattr(TopicLog, "commit", recording)
    monkeypatch.setattr(TopicLog, "commit_state_build", recording_shared)
    inline = any_store.name in ("memory", "local") and any_store.commit_logs == 1
    sent: dict[int, list[bytes]] = {}
    acknowledged: dict[tuple[int, int], bytes] = {}

    def sent_as(future: Any, value: bytes) -> None:
        metadata = future.get(timeout=30)
        sent.setdefault(metadata.partition, []).append(value)
        acknowledged[(metadata.partition, metadata.offset)] = value

    with Producer(store, linger_ms=60_000, batch_size=4096, client_id="handoff") as producer:
        small = [producer.send("t", b"small-%d" % i, key=b"k%d" % i) for i in range(8)]
        producer.flush()
        for i, future in enumerate(small):
            sent_as(future, b"small-%d" % i)
        assert threads
        assert all(n.startswith("kstore-sender-handoff") == inline for n in threads)
        threads.clear()
        # Full batches (over batch_size): written on the pool, as on an object store.
        big = [producer.send("t", b"big-%03d" % i + b"x" * 92, key=b"k%d" % i) for i in range(120)]
        tail = [producer.send("t", b"tail-%d" % i, key=b"k%d" % i) for i in range(8)]
        producer.flush()
        for i, future in enumerate(big):
            sent_as(future, b"big-%03d" % i + b"x" * 92)
        for i, future in enumerate(tail):
            sent_as(future, b"tail-%d" % i)
        assert any(n.startswith("kstore-handoff") for n in threads)
    records = _consume_all(store.storage.url, store.storage.storage_options, "t", 136)
    got: dict[int, list[bytes]] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        assert record.offset == len(got.setdefault(record.partition, []))  # dense, from 0
        got[record.partition].append(record.value)
    assert got == sent  # each partition in send order
    assert {(r.partition, r.offset): r.value for r in records} == acknowledged

    # The storage refuses the next commit once: the sender's own write of the delivery fails.
    failures = iter([StorageError("injected write failure")])
    failed_on: list[str] = []

    def failing_once(self: TopicLog, *args: Any, **kwargs: Any) -> Any:
        failure = next(failures, None)
        if failure is not None:
            failed_on.append(threading.current_thread().name)
            raise failure
        return commit(self, *args, **kwargs)

    def failing_once_shared(self: TopicLog, *args: Any, **kwargs: Any) -> Any:
        failure = next(failures, None)
        if failure is not None:
            failed_on.append(threading.current_thread().name)
            raise failure
        return shared_commit(self, *args, **kwargs)

    monkeypatch.setattr(TopicLog, "commit", failing_once)
    monkeypatch.setattr(TopicLog, "commit_state_build", failing_once_shared)
    with Producer(store, linger_ms=0, retries=0, client_id="failing") as producer:
        with pytest.raises(StorageError, match="injected"):
            producer.send("t", b"lost", key=b"k1").get(timeout=30)
        assert producer._sender.is_alive()
        assert producer.send("t", b"kept", key=b"k1").get(timeout=30).offset >= 0
    # A delivery of one record goes to one topic log: on local storage, the sender's own.
    local = any_store.name in ("memory", "local")
    assert [n.startswith("kstore-sender-failing") for n in failed_on] == [local]
