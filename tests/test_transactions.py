"""Transactions and exactly-once consume-transform-produce, including crashes (kill -9)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

import kstore
from kstore import transaction_manager
from kstore.consumer import Consumer
from kstore.errors import IllegalStateError, ProducerFencedError
from kstore.groups import Group
from kstore.producer import Producer
from kstore.records import TopicPartition
from tests.commit_logs import backend_params, create_topics_with, logs_target

BACKENDS = ["memory", "local", "seaweed"]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = {"session_timeout_ms": 2_500, "heartbeat_interval_ms": 200}


@pytest.fixture(params=backend_params(BACKENDS))
def target(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, str, dict[str, Any]]:
    """Every backend; its layout-3 topics with commit.logs 1, and 3 too on memory and local
    disk (tests/commit_logs.py)."""
    chosen = logs_target(request, monkeypatch)
    return chosen.name, chosen.url, chosen.storage_options


@pytest.fixture
def store(target: tuple[str, str, dict[str, Any]]) -> kstore.Store:
    return kstore.Store(target[1], target[2])


def read(store: kstore.Store, topic: str, isolation: str) -> list[Any]:
    out: list[Any] = []
    with Consumer(
        topic, store=store, auto_offset_reset="earliest", isolation_level=isolation
    ) as consumer:
        idle = 0
        while idle < 3:
            got = consumer.poll(timeout_ms=30)
            idle = 0 if got else idle + 1
            out.extend(r for rs in got.values() for r in rs)
    return out


def test_records_are_visible_to_read_committed_only_after_commit(store: kstore.Store) -> None:
    store.create_topic("out", partitions=2)
    producer = Producer(store, transactional_id="tx")
    with Producer(store) as plain:  # a non-transactional record before the transaction
        plain.send("out", value=b"before", partition=0).get(timeout=30)
    producer.begin_transaction()
    for i in range(10):
        producer.send("out", value=b"%d" % i, key=b"k%d" % i)
    producer.flush()
    assert [r.value for r in read(store, "out", "read_committed")] == [b"before"]
    assert len(read(store, "out", "read_uncommitted")) == 11
    part = store.partition("out", 0).state()
    assert part.last_stable_offset == 1 < part.end_offset
    producer.commit_transaction()
    assert sorted(r.value for r in read(store, "out", "read_committed")) == sorted(
        [b"before"] + [b"%d" % i for i in range(10)]
    )
    assert (
        store.partition("out", 0).state().last_stable_offset
        == store.partition("out", 0).state().end_offset
    )
    producer.close()


def test_the_oldest_open_transaction_holds_the_last_stable_offset(store: kstore.Store) -> None:
    store.create_topic("out")
    tp = TopicPartition("out", 0)
    older = Producer(store, transactional_id="older")
    newer = Producer(store, transactional_id="newer")
    with Producer(store) as plain:
        assert plain.send("out", value=b"before").get(timeout=30).offset == 0
    older.begin_transaction()
    newer.begin_transaction()
    assert older.send("out", value=b"older-1").get(timeout=30).offset == 1
    assert newer.send("out", value=b"newer-1").get(timeout=30).offset == 2
    assert older.send("out", value=b"older-2").get(timeout=30).offset == 3

    def reader_stops_at(lso: int, values: list[bytes]) -> None:
        state = store.partition("out", 0).state()
        assert state.last_stable_offset == lso
        with Consumer(
            "out", store=store, auto_offset_reset="earliest", isolation_level="read_committed"
        ) as consumer:
            got: list[bytes] = []
            idle = 0
            while idle < 3:
                polled = consumer.poll(timeout_ms=30)
                idle = 0 if polled else idle + 1
                got.extend(r.value for rs in polled.values() for r in rs)
            assert got == values
            assert consumer.position(tp) == lso

    # Two open transactions: the older one's first offset is the LSO, not the newer one's.
    reader_stops_at(1, [b"before"])
    older.commit_transaction()
    # The newer is still open: the LSO moves to its first offset, and older-2 (committed, but
    # after it) stays out of sight.
    reader_stops_at(2, [b"before", b"older-1"])
    newer.commit_transaction()
    reader_stops_at(4, [b"before", b"older-1", b"newer-1", b"older-2"])
    older.close()
    newer.close()


def test_abort_discards_records(store: kstore.Store) -> None:
    store.create_topic("out")
    with Producer(store, transactional_id="tx") as producer:
        producer.begin_transaction()
        producer.send("out", value=b"discard me")
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send("out", value=b"keep me")
        producer.commit_transaction()
        with pytest.raises(IllegalStateError, match="begin_transaction"):
            producer.send("out", value=b"outside")
    for isolation in ("read_committed", "read_uncommitted"):
        assert [r.value for r in read(store, "out", isolation)] == [b"keep me"]
    state = store.partition("out", 0).state()
    assert state.end_offset == 2
    assert [s.base_offset for s in state.segments] == [1]


def test_consume_transform_produce_exactly_once(store: kstore.Store) -> None:
    store.create_topic("in", partitions=3)
    store.create_topic("out", partitions=3)
    with Producer(store) as producer:
        for i in range(300):
            producer.send("in", value=b"v%d" % i, key=b"k%d" % (i % 11))
    consumer = Consumer(
        "in",
        store=store,
        group_id="eos",
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_poll_records=50,
        **FAST,
    )
    producer = Producer(store, transactional_id="app")
    idle = 0
    while idle < 3:
        polled = consumer.poll(timeout_ms=50)
        if not polled:
            idle += 1
            continue
        idle = 0
        producer.begin_transaction()
        for records in polled.values():
            for r in records:
                producer.send("out", value=r.value.upper(), key=r.key)
        producer.send_offsets_to_transaction(
            {tp: consumer.position(tp) for tp in polled}, consumer.group_metadata()
        )
        producer.commit_transaction()
    consumer.close()
    producer.close()
    out = Counter(r.value for r in read(store, "out", "read_committed"))
    assert out == Counter(b"V%d" % i for i in range(300))
    offsets = Group(store, "eos").state().offsets
    assert sum(o.offset for o in offsets.values()) == 300


def test_new_instance_aborts_an_unfinished_transaction(store: kstore.Store) -> None:
    store.create_topic("out")
    dead = Producer(store, transactional_id="tx")
    dead.begin_transaction()
    dead.send("out", value=b"half done")
    dead.flush()  # written, never decided: then the process "dies"
    successor = Producer(store, transactional_id="tx")
    for isolation in ("read_committed", "read_uncommitted"):
        assert read(store, "out", isolation) == []
    state = store.partition("out", 0).state()
    assert state.open_transactions == {}
    assert state.last_stable_offset == state.end_offset
    successor.begin_transaction()
    successor.send("out", value=b"next")
    successor.commit_transaction()
    assert [r.value for r in read(store, "out", "read_committed")] == [b"next"]
    with pytest.raises(ProducerFencedError):
        dead.commit_transaction()
    successor.close()
    dead.close()


def test_new_instance_rolls_a_decided_transaction_forward(store: kstore.Store) -> None:
    store.create_topic("in")
    store.create_topic("out")
    with Producer(store) as plain:
        plain.send("in", value=b"x").get(timeout=30)
    dead = Producer(store, transactional_id="tx")
    dead.begin_transaction()
    dead.send("out", value=b"decided")
    dead.send_offsets_to_transaction({TopicPartition("in", 0): 1}, "eos-group")

    def crash(*args: Any, **kwargs: Any) -> None:
        raise SystemExit("crash after the decision, before the markers")

    # The transaction's end starts with its markers: the process dies before them.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transaction_manager, "end_transaction", crash)
        with pytest.raises(SystemExit):
            dead.commit_transaction()
    assert read(store, "out", "read_committed") == []  # decided, not yet marked
    successor = Producer(store, transactional_id="tx")
    assert [r.value for r in read(store, "out", "read_committed")] == [b"decided"]
    assert Group(store, "eos-group").committed(TopicPartition("in", 0)).offset == 1  # type: ignore[union-attr]
    successor.close()


def test_zombie_cannot_decide_after_fencing(store: kstore.Store) -> None:
    store.create_topic("in")
    store.create_topic("out")
    zombie = Producer(store, transactional_id="tx")
    zombie.begin_transaction()
    zombie.send("out", value=b"zombie")
    zombie.send_offsets_to_transaction({TopicPartition("in", 0): 0}, "g")
    zombie.flush()
    Producer(store, transactional_id="tx").close()  # the successor fences and aborts
    with pytest.raises(ProducerFencedError):
        zombie.commit_transaction()
    group = Group(store, "g")
    with pytest.raises(ProducerFencedError):  # even straight to the group log
        group.commit_offsets(
            {TopicPartition("in", 0): kstore.records.OffsetAndMetadata(0)},
            member_id=None,
            generation=-1,
            transaction=("tx", 0, zombie.epoch),
        )
    assert read(store, "out", "read_uncommitted") == []


# A memory store cannot outlive a process. commit.logs 3 (each topic's two partitions in a log
# of their own) on local disk, crashed after the decision: the successor rolls the transaction
# forward with markers in both logs. (Its abort after a crash before the decision writes them
# by the same end_transaction; each run takes about 11 s.)
@pytest.mark.parametrize(
    ("backend", "logs", "crash_point"),
    [
        pytest.param(backend, logs, point, id=f"{backend}-logs{logs}-{point}")
        for backend in ("local", "seaweed")
        for point in ("after_send", "after_decision")
        for logs in (1, 3)
        if logs == 1 or (backend, point) == ("local", "after_decision")
    ],
)
def test_exactly_once_survives_kill_9(
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    logs: int,
    crash_point: str,
) -> None:
    url, options = request.getfixturevalue(f"{backend}_store")
    create_topics_with(monkeypatch, logs)  # the topics the worker processes then write
    store = kstore.Store(url, options)
    store.create_topic("in", partitions=2)
    store.create_topic("out", partitions=2)
    with Producer(store) as producer:
        for i in range(400):
            producer.send("in", value=b"r%d" % i, key=b"k%d" % (i % 13))

    def run(point: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.workers.eos_worker",
                url,
                json.dumps(options),
                point,
                "2",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
        )

    crashed = run(crash_point)
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    finished = run("none")
    assert finished.returncode == 0, finished.stderr[-2000:]
    assert json.loads(finished.stdout.strip().splitlines()[-1])["transactions"] > 0
    out = Counter(r.value for r in read(store, "out", "read_committed"))
    assert out == Counter(b"R%d" % i for i in range(400))  # every input exactly once
