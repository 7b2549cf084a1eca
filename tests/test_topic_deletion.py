"""Delayed topic deletion (PROTOCOL.md 17.3): a deleted topic is invisible at once, its files
stay readable for ``file.delete.delay.ms``, writers holding the old state are refused, and
``purge_deleted_topics`` (and vacuum) remove the files after the delay."""

from __future__ import annotations

import time
from typing import Any

import pytest
from kstore.retention import purge_deleted_topics, vacuum

from kstore import Store
from kstore.consumer import Consumer
from kstore.errors import TopicDeletedError, UnknownTopicOrPartitionError
from kstore.layout import topic_data_dir, topic_log_dir
from kstore.log import READER_VERSION, checkpoint_file
from kstore.producer import Producer
from kstore.records import TopicPartition
from kstore.store import DELETED_WRITER_VERSION
from tests import layout2
from tests.test_jobs_support import Target, append, now_ms, open_store, rows

DELAY = 10_000  # the smallest file.delete.delay.ms
FAST = ["memory_store", "local_store"]
# Deleting a topic is open to layout-2 topics too (it only seals their logs); layout 2 is
# made by tests/layout2.py, since kstore no longer writes it.
LAYOUTS = [2, 3]


def make_topic(store: Store, layout: int, partitions: int = 2) -> str:
    config = {"file.delete.delay.ms": DELAY}
    if layout == 2:
        layout2.create_topic(store, "t", partitions, config)
    else:
        store.create_topic("t", partitions, config)
    for p in range(partitions):
        for n in range(3):
            if layout == 2:
                value = b"old-%d-%d" % (p, n)
                layout2.append(store, "t", p, layout2.records([value], [b"k"]))
            else:
                append(store.partition("t", p), [b"k"], [b"old-%d-%d" % (p, n)], now_ms())
    return store.topic("t").topic_id


def data_exists(store: Store, topic_id: str) -> bool:
    return bool(store.storage.list_dir(topic_data_dir("t", topic_id)))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("target", FAST)
def test_a_reader_in_the_middle_of_a_read_finishes_after_the_delete(
    target: str, layout: int, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    make_topic(store, layout)
    consumer = Consumer(store=open_store(where), auto_offset_reset="earliest", max_poll_records=2)
    tp = TopicPartition("t", 0)
    consumer.assign([tp])
    first = [r.value for r in consumer.poll(timeout_ms=1000).get(tp, [])]
    assert first == [b"old-0-0", b"old-0-1"]
    part = store.partition("t", 1)
    state = part.state()
    store.delete_topic("t")
    assert not store.topic_exists("t")
    # The partition read with the state held before the delete, and the consumer's next poll,
    # still find every file.
    values = [v for b in part.read(0, state=state) for v in b.column("value").to_pylist()]
    assert values == [b"old-1-0", b"old-1-1", b"old-1-2"]
    rest = [r.value for r in consumer.poll(timeout_ms=1000).get(tp, [])]
    assert rest == [b"old-0-2"]
    consumer.close()


@pytest.mark.parametrize("target", FAST)
def test_a_writer_holding_the_old_state_is_refused_and_nothing_is_lost_silently(
    target: str, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    writer_store = open_store(where)
    make_topic(writer_store, 3)
    held = writer_store.partition("t", 0)
    held.state()
    producer = Producer(open_store(where), linger_ms=0)
    producer.send("t", value=b"before", partition=1).get(timeout=10)

    open_store(where).delete_topic("t")
    with pytest.raises(TopicDeletedError, match="was deleted"):
        append(held, [b"k"], [b"late"], now_ms())
    future = producer.send("t", value=b"late", partition=1)
    producer.flush()
    # Refused (TopicDeletedError on the commit, or the topic found gone), never acknowledged.
    with pytest.raises(UnknownTopicOrPartitionError):
        future.get(timeout=10)
    producer.close()

    # A topic of the same name is a new incarnation: it starts empty and takes writes.
    fresh = open_store(where)
    fresh.create_topic("t", 1)
    append(fresh.partition("t", 0), [b"k"], [b"new"], now_ms())
    assert rows(open_store(where).partition("t", 0)) == [(0, b"k", b"new")]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_deleted_incarnation_is_sealed_for_writers_of_any_version(
    layout: int, memory_store: Target
) -> None:
    store = open_store(memory_store)
    topic_id = make_topic(store, layout)
    meta = store.topic("t")
    store.delete_topic("t")
    reader = open_store(memory_store)
    if layout == 3:
        logs = [log.log.load() for log in reader.topic_logs("t", meta)]
    else:
        logs = [reader.partition_state("t", p, meta) for p in range(2)]
    for state in logs:
        assert state.topic_deleted is not None
        assert state.topic_deleted["id"] == topic_id
        assert state.min_writer_version == DELETED_WRITER_VERSION
        assert state.min_reader_version <= READER_VERSION  # still readable


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("target", FAST)
def test_purge_keeps_files_before_the_delay_and_removes_them_after(
    target: str, layout: int, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    old_id = make_topic(store, layout)
    store.delete_topic("t")
    new_id = store.create_topic("t", 1).topic_id  # layout 3, whatever the old one's
    append(store.partition("t", 0), [b"k"], [b"new"], now_ms())

    early = purge_deleted_topics(store)
    assert early.removed == []
    assert [d.topic_id for d in early.waiting] == [old_id]
    assert data_exists(store, old_id)
    assert vacuum(None, store, verbose=False).extra_files == []
    assert data_exists(store, old_id)

    later = now_ms() + DELAY + 5_000
    dry = purge_deleted_topics(store, later, dry_run=True)
    assert dry.directories == [topic_data_dir("t", old_id)]
    assert data_exists(store, old_id)
    done = purge_deleted_topics(store, later)
    assert done.directories == [topic_data_dir("t", old_id)]
    assert not data_exists(store, old_id)
    # The new incarnation is untouched; a second purge has nothing to do.
    assert rows(store.partition("t", 0)) == [(0, b"k", b"new")]
    assert data_exists(store, new_id)
    assert purge_deleted_topics(store, later).removed == []


def test_vacuum_removes_a_deleted_topic_after_its_delay(local_store: Target) -> None:
    store = open_store(local_store)
    old_id = make_topic(store, 3)
    store.delete_topic("t")
    summary = vacuum(None, store, verbose=False, now_ms=now_ms() + DELAY + 5_000)
    assert topic_data_dir("t", old_id) in summary.extra_files
    assert not data_exists(store, old_id)


def test_an_interrupted_deletion_is_finished_by_deleting_again(memory_store: Target) -> None:
    store = open_store(memory_store)
    make_topic(store, 3)
    meta = store.topic("t")
    store._seal_deleted(meta, int(time.time() * 1000))  # as if the deleter stopped here
    assert store.topic_exists("t")  # still visible, but its writers are refused
    with pytest.raises(TopicDeletedError):
        append(store.partition("t", 0), [b"k"], [b"v"], now_ms())
    assert [v for _, _, v in rows(store.partition("t", 0))] == [b"old-0-0", b"old-0-1", b"old-0-2"]
    store.delete_topic("t")
    assert not store.topic_exists("t")


@pytest.mark.s3
def test_delayed_deletion_on_s3(moto_store: Target) -> None:
    store = open_store(moto_store)
    old_id = make_topic(store, 3)
    held = store.partition("t", 0)
    state = held.state()
    open_store(moto_store).delete_topic("t")
    with pytest.raises(TopicDeletedError):
        append(held, [b"k"], [b"late"], now_ms())
    assert len(list(held.read(0, state=state))) >= 1
    assert purge_deleted_topics(store).removed == []
    assert data_exists(store, old_id)
    assert purge_deleted_topics(store, now_ms() + DELAY + 60_000).directories == [
        topic_data_dir("t", old_id)
    ]
    assert not data_exists(store, old_id)


def test_the_delete_command_says_how_long_the_files_stay(local_store: Target) -> None:
    from tests.test_cli import Cli

    make_topic(open_store(local_store), 3)
    result = Cli("local", *local_store).run("topics", "delete", "t", "--yes")
    assert "files stay readable for 10000 ms (file.delete.delay.ms)" in result.stderr
    assert "kstore vacuum" in result.stderr


def test_deleted_incarnations_are_remembered_across_topic_log_checkpoints(
    memory_store: Target,
) -> None:
    store = open_store(memory_store)
    ids = []
    for _ in range(11):  # 22 commits: the topic metadata log is checkpointed at version 20
        # The seal alone creates the incarnation's partition log, hence its directory.
        ids.append(store.create_topic("t", 1, {"file.delete.delay.ms": DELAY}).topic_id)
        store.delete_topic("t")
    current = store.create_topic("t", 1).topic_id
    assert store.storage.exists(f"{topic_log_dir('t')}/{checkpoint_file(20)}")
    fresh = open_store(memory_store)
    assert fresh.topic("t").topic_id == current
    done = purge_deleted_topics(fresh, now_ms() + DELAY + 5_000)
    assert sorted(d.topic_id for d in done.removed) == sorted(ids)
    assert all(not data_exists(fresh, i) for i in ids)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_partitions_added_while_deleting_are_sealed_too(
    layout: int, memory_store: Target, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(memory_store)
    if layout == 3:
        store.create_topic("t", 2, {"file.delete.delay.ms": DELAY, "commit.logs": 4})
    else:
        layout2.create_topic(store, "t", 2, {"file.delete.delay.ms": DELAY})
    seal = store._seal_deleted
    grown: list[Any] = []

    def seal_then_grow(meta: Any, deleted_ms: int) -> None:
        seal(meta, deleted_ms)
        if not grown:  # another client adds a partition between the seals and the delete
            grown.append(open_store(memory_store).add_partitions("t", 3))

    monkeypatch.setattr(store, "_seal_deleted", seal_then_grow)
    store.delete_topic("t")
    assert not store.topic_exists("t")
    meta = grown[0]
    if layout == 3:
        states = [log.log.load() for log in open_store(memory_store).topic_logs("t", meta)]
    else:
        states = [open_store(memory_store).partition_state("t", p, meta) for p in range(3)]
    assert len(states) == 3
    assert all(state.topic_deleted is not None for state in states)


def test_a_transaction_over_a_deleted_topic_still_finishes(local_store: Target) -> None:
    """The markers of a deleted topic's partitions are skipped, even where its deletion was
    interrupted after the seals (the topic still listed): the transaction's other topics
    commit."""
    store = open_store(local_store)
    make_topic(store, 3)
    store.create_topic("u", 1)
    producer = Producer(store, transactional_id="tx", linger_ms=0)
    producer.begin_transaction()
    producer.send("t", value=b"gone", partition=0)
    producer.send("u", value=b"kept", partition=0)
    producer.flush()
    # A deletion that stopped after sealing t's logs: t is still listed, its logs refuse writes.
    deleter = open_store(local_store)
    deleter._seal_deleted(deleter.topic("t"), now_ms())
    producer.commit_transaction()
    producer.close()
    with Consumer(
        "u",
        store=open_store(local_store),
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    ) as consumer:
        got = consumer.poll(timeout_ms=2_000)
    assert [r.value for rs in got.values() for r in rs] == [b"kept"]
