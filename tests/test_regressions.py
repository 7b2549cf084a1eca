"""Regression tests for defects found in review; each names what was wrong."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

import kstore
from kstore.consumer import Consumer
from kstore.errors import ConcurrentModificationError, IllegalStateError, InvalidConfigurationError
from kstore.groups import Group, GroupState
from kstore.layout import topic_log_dir
from kstore.log import version_file
from kstore.producer import Producer
from kstore.records import OffsetAndMetadata, TopicPartition
from tests.faults import Fault, FaultyStorage


@pytest.fixture
def store(local_store: tuple[str, dict[str, Any]]) -> kstore.Store:
    return kstore.Store(local_store[0])


def test_an_append_after_its_abort_marker_cannot_reopen_the_transaction(
    store: kstore.Store,
) -> None:
    store.create_topic("t")
    part = store.partition("t", 0)
    table = pa.table({"value": pa.array([b"late"], pa.binary())})
    part.commit_segments([part.write_segment(table)], transaction="p1:0")
    assert part.end_transaction("p1", 0, 0, commit=False)
    before = part.state()
    with pytest.raises(ConcurrentModificationError, match="already ended"):
        part.commit_segments([part.write_segment(table)], transaction="p1:0")
    after = part.state()
    assert after.version == before.version
    assert after.open_transactions == {}
    assert after.last_stable_offset == after.end_offset
    # ... and it survives a checkpoint (of the topic log the partition shares, layout 3).
    assert part.topic_log is not None
    part.log.write_checkpoint(part.topic_log.state())
    reopened = kstore.Store(store.url).partition("t", 0).log._load_checkpoint()[0].partition(0)
    assert reopened.ended_transactions == {"p1": 0}


def test_an_uncertain_decision_is_never_aborted(local_store: tuple[str, dict[str, Any]]) -> None:
    faulty = FaultyStorage(kstore.Storage(local_store[0]))
    store = kstore.Store.from_storage(faulty)
    store.create_topic("in")
    store.create_topic("out")
    producer = Producer(store, transactional_id="tx")
    producer.begin_transaction()
    producer.send("out", value=b"x")
    producer.send_offsets_to_transaction({TopicPartition("in", 0): 0}, "g")
    # The group-log commit (the decision) lands, but the producer is told it failed, and the
    # storage then keeps failing when the producer reads it back.
    target = "groups/g/_log/00000000000000000000.json"
    landed = {"yes": False}

    def decision(path: str) -> bool:
        landed["yes"] = landed["yes"] or path == target
        return path == target

    faulty.add(Fault("put_if_absent", when="after", times=1, match=decision))
    faulty.add(Fault("read", when="before", match=lambda path: landed["yes"] and path == target))
    with pytest.raises(kstore.KStoreError):
        producer.commit_transaction()
    assert landed["yes"]
    with pytest.raises(IllegalStateError, match="unknown"):
        producer.abort_transaction()
    faulty.clear()
    producer.commit_transaction()  # idempotent for this version: completes the commit
    with Consumer(
        "out",
        store=store,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        consumer_timeout_ms=300,
    ) as consumer:
        assert [r.value for r in consumer] == [b"x"]
    producer.close()


def test_group_checkpoint_keeps_fences_after_a_delete() -> None:
    state = GroupState()
    for name, body in [
        (
            "offsets",
            {
                "memberId": "admin",
                "generation": -1,
                "time": 1,
                "offsets": [],
                "transaction": {"id": "app", "version": 4, "epoch": 2},
            },
        ),
        ("deleteGroup", {"time": 2}),
        ("txnFence", {"id": "app", "epoch": 3}),
    ]:
        state.apply(name, body)
    assert state.deleted
    assert state.transactions == {"app": 4}
    assert state.transaction_epochs == {"app": 3}
    replayed = GroupState()
    for action in state.checkpoint_actions():
        ((name, body),) = action.items()
        replayed.apply(name, body)
    assert replayed.deleted
    assert replayed.transactions == {"app": 4}
    assert replayed.transaction_epochs == {"app": 3}


def test_replaced_static_member_lease_is_dropped(store: kstore.Store) -> None:
    store.create_topic("t")
    first = Consumer(
        "t",
        store=store,
        group_id="g",
        group_instance_id="w1",
        session_timeout_ms=5_000,
        heartbeat_interval_ms=500,
    )
    first.close()
    second = Consumer(
        "t",
        store=store,
        group_id="g",
        group_instance_id="w1",
        session_timeout_ms=5_000,
        heartbeat_interval_ms=500,
    )
    try:
        assert set(Group(store, "g").leases()) == {second.member_id}
    finally:
        second.close()


def test_transactional_producers_are_durable() -> None:
    store = kstore.Store("memory://regress-acks")
    with pytest.raises(InvalidConfigurationError, match="acks='all'"):
        Producer(store, transactional_id="tx", acks=1)
    producer = Producer(store, transactional_id="tx")
    assert producer.config["acks"] == "all"
    producer.close()


def test_a_topic_readable_despite_a_bad_stored_value_is_alterable(store: kstore.Store) -> None:
    store.create_topic("t", config={"retention.ms": 1000})
    # A value this version cannot parse (written by hand here; a newer writer in practice),
    # and a key it does not know.
    path = f"{topic_log_dir('t')}/{version_file(1)}"
    meta = {**store._topic_state("t").metadata, "config": {"retention.ms": "soon", "future.key": 1}}  # type: ignore[dict-item]
    body = [
        {"commitInfo": {"timestamp": 0, "operation": "ALTER", "commitId": "x", "actions": 1}},
        {"metaData": meta},
    ]
    store.storage.put_if_absent(path, ("\n".join(json.dumps(b) for b in body) + "\n").encode())
    fresh = kstore.Store(store.url)
    assert fresh.topic("t").effective_config["retention.ms"] == 604_800_000  # the default
    altered = fresh.alter_topic_config("t", set={"retention.bytes": 10})
    assert altered.config == {"future.key": 1, "retention.bytes": 10}


def test_commit_offsets_survive_alter(store: kstore.Store) -> None:
    # Offsets given as plain ints are accepted by Consumer.commit (kafka-python allows both).
    store.create_topic("t")
    with Consumer(store=store, group_id="g") as consumer:
        consumer.assign([TopicPartition("t", 0)])
        consumer.commit({TopicPartition("t", 0): 0})
        assert consumer.committed(TopicPartition("t", 0), metadata=True) == OffsetAndMetadata(0, "")


def test_idle_producer_entries_expire_from_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    from kstore.partition import PRODUCER_EXPIRATION_MS, PartitionState

    # An old entry goes only once more producers than this wrote after it (8.9).
    monkeypatch.setattr("kstore.manifest.RECENT_PRODUCERS", 2)
    state = PartitionState()
    now = 10 * PRODUCER_EXPIRATION_MS
    # Two active producers: the cut-off is capped by the lower median of the entries' times
    # (PROTOCOL.md 8.9), so an idle entry expires once most entries are newer.
    entries = (("idle", now - PRODUCER_EXPIRATION_MS - 2), ("active", now - 1), ("busy", now))
    for offset, (pid, when) in enumerate(entries):
        state.apply(
            "producer",
            {
                "id": pid,
                "epoch": 0,
                "firstSequence": 0,
                "lastSequence": 0,
                "baseOffset": offset,
                "lastOffset": offset,
                "timestamp": when,
            },
        )
    state.last_commit_ms = now
    kept = [a["producer"]["id"] for a in state.checkpoint_actions() if "producer" in a]
    assert kept == ["active", "busy"]


def test_urls_keep_their_scheme_and_hide_credentials() -> None:
    from kstore.errors import InvalidStoreError
    from kstore.storage import Storage

    with pytest.raises(InvalidStoreError, match="names no bucket"):
        Storage("s3://")
    storage = Storage("s3://AKIDEXAMPLE:s3cr3t@bucket/prefix/", {})
    assert storage.url == "s3://AKIDEXAMPLE:s3cr3t@bucket/prefix"
    assert "s3cr3t" not in storage.display_url
    assert "s3cr3t" not in repr(storage)


def test_a_torn_copy_of_the_writers_own_commit_is_not_acknowledged(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    """Found by the fault-injection suite: a commit whose write was torn (first line intact,
    so the commit id matched) and reported failed was read back, taken as landed and
    acknowledged, although every reader refuses the version as corrupt. The writer now compares
    the whole file with what it sent."""
    from kstore.errors import CorruptLogError
    from tests.reliability import faultfs

    base = local_store[0]
    kstore.Store(base).create_topic("t", 1)
    Producer(kstore.Store(base), acks="all").send("t", value=b"a").get(timeout=30)
    url, options = faultfs.wrap_url(
        base, faults=[{"op": "create", "kind": "truncate", "path": r"/_log/0+1\.json$"}]
    )
    producer = Producer(kstore.Store(url, options, create=False), acks="all", retries=0)
    future = producer.send("t", value=b"b")
    with pytest.raises(CorruptLogError, match=r"0+1\.json.*damaged copy of this commit"):
        future.get(timeout=30)
    producer.close()
    with pytest.raises(CorruptLogError, match=r"0+1\.json"):
        kstore.Store(base, create=False).partition("t", 0).state()
