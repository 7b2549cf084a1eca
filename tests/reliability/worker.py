"""The client loops of a torture run: producers, transactional producers and group members.

Each loop records what it does in a history (``tests.reliability.history``). They run as
threads of the driver or as processes of their own, which the driver kills with SIGKILL (and
which the fault-injecting filesystem may crash with ``os._exit``)::

    python -m tests.reliability.worker ROLE CONFIG_JSON

ROLE is ``producer``, ``txn`` or ``consumer``; CONFIG_JSON holds ``url``, ``options`` (storage
options, possibly of ``faultfs``), ``name``, ``history`` (the JSON-lines file), ``seed`` and,
for ``txn``, ``tid`` (the transactional id). A process runs until it is killed.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from kstore.consumer import Consumer
from kstore.errors import CommitFailedError, KStoreError
from kstore.producer import Producer
from kstore.store import Store
from tests.reliability import faultfs
from tests.reliability.history import Recorder

# The topics of a run: (name, partitions, config).
TOPICS: list[tuple[str, int, dict[str, Any]]] = [
    (
        "events",
        3,
        {
            "cleanup.policy": "delete",
            "retention.bytes": 150_000,
            "segment.bytes": 65_536,
            "segment.ms": 500,
            "file.delete.delay.ms": 3_000,
        },
    ),
    (
        "state",
        2,
        {
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": 0.01,
            "segment.bytes": 65_536,
            "segment.ms": 500,
            "file.delete.delay.ms": 3_000,
        },
    ),
]
COPY_TOPIC = ("copy", 2, {"file.delete.delay.ms": 3_000})
GROUP = "torture"
STATE_KEYS = 40

Stop = Callable[[], bool]


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def produce_loop(store: Store, name: str, record: Recorder, rng: random.Random, stop: Stop) -> int:
    """Idempotent producing in small batches until ``stop()``; a producer that fails fatally
    is replaced by a new instance (a new name). Returns the records sent."""
    sent = 0
    instance = 0
    while not stop():
        pname = f"{name}.{instance}"
        instance += 1
        try:
            producer = Producer(
                store,
                enable_idempotence=True,
                acks="all",
                linger_ms=rng.choice([0, 2, 10]),
                delivery_timeout_ms=60_000,
            )
        except KStoreError as exc:
            record("error", who=pname, error=_error(exc))
            time.sleep(0.2)
            continue
        seq = 0
        healthy = True
        while healthy and not stop():
            futures = []
            for _ in range(rng.randint(1, 25)):
                if rng.random() < 0.7:
                    topic = "events"
                    key = f"e{rng.randrange(500)}" if rng.random() < 0.5 else None
                else:
                    topic, key = "state", f"k{rng.randrange(STATE_KEYS)}"
                vid = f"{pname}:{seq}"
                record("send", producer=pname, seq=seq, topic=topic, key=key, value=vid, txn=None)
                try:
                    future = producer.send(
                        topic, key=None if key is None else key.encode(), value=vid.encode()
                    )
                except KStoreError as exc:
                    record("nack", producer=pname, seq=seq, value=vid, error=_error(exc))
                    healthy = False
                    break
                futures.append((seq, vid, topic, future))
                seq += 1
                sent += 1
            for s, vid, topic, future in futures:
                try:
                    md = future.get(timeout=120)
                except Exception as exc:
                    record("nack", producer=pname, seq=s, value=vid, error=_error(exc))
                    continue
                record(
                    "ack",
                    producer=pname,
                    seq=s,
                    topic=topic,
                    partition=md.partition,
                    offset=md.offset,
                    value=vid,
                )
            time.sleep(rng.uniform(0, 0.03))
        try:
            producer.close(timeout=5)
        except Exception as exc:
            record("error", who=pname, error=_error(exc))
    return sent


def txn_loop(
    store: Store, name: str, tid: str, record: Recorder, rng: random.Random, stop: Stop
) -> int:
    """Transactions of 1-10 records to ``events``, 80% committed, 20% aborted; a failure
    leaves the outcome unknown and a new instance (which finishes the transaction) takes
    over. Returns the transactions ended."""
    ended = 0
    instance = 0
    while not stop():
        pname = f"{name}.{instance}"
        instance += 1
        try:
            producer = Producer(
                store, transactional_id=tid, linger_ms=1, delivery_timeout_ms=60_000
            )
        except KStoreError as exc:
            record("error", who=pname, error=_error(exc))
            time.sleep(0.3)
            continue
        seq = 0
        n = 0
        healthy = True
        while healthy and not stop():
            txn = f"{pname}#{n}"
            n += 1
            try:
                producer.begin_transaction()
                futures = []
                for _ in range(rng.randint(1, 10)):
                    vid = f"{pname}:{seq}"
                    key = f"x{rng.randrange(100)}"
                    record(
                        "send", producer=pname, seq=seq, topic="events", key=key, value=vid, txn=txn
                    )
                    futures.append(
                        (seq, vid, producer.send("events", key=key.encode(), value=vid.encode()))
                    )
                    seq += 1
                producer.flush()
                for s, vid, future in futures:
                    md = future.get(timeout=120)
                    record(
                        "ack",
                        producer=pname,
                        seq=s,
                        topic="events",
                        partition=md.partition,
                        offset=md.offset,
                        value=vid,
                    )
                if rng.random() < 0.8:
                    record("txn", producer=pname, txn=txn, outcome="committing")
                    producer.commit_transaction()
                    record("txn", producer=pname, txn=txn, outcome="commit")
                else:
                    producer.abort_transaction()
                    record("txn", producer=pname, txn=txn, outcome="abort")
                ended += 1
            except Exception as exc:
                record("error", who=pname, txn=txn, error=_error(exc))
                healthy = False
            time.sleep(rng.uniform(0, 0.05))
        try:
            producer.close(timeout=5)
        except Exception as exc:
            record("error", who=pname, error=_error(exc))
    return ended


def consume_loop(store: Store, name: str, record: Recorder, stop: Stop) -> int:
    """A read_committed group member of ``GROUP`` that commits after every poll."""
    consumer = Consumer(
        "events",
        "state",
        store=store,
        group_id=GROUP,
        client_id=name,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        session_timeout_ms=3_000,
        heartbeat_interval_ms=300,
        max_poll_records=300,
    )
    reads = 0
    while not stop():
        try:
            polled = consumer.poll(timeout_ms=200)
        except KStoreError as exc:
            record("error", who=name, error=_error(exc))
            time.sleep(0.1)
            continue
        generation = consumer.generation
        for tp, records in polled.items():
            for r in records:
                record(
                    "read",
                    reader=name,
                    **{"pass": f"{name}:g{generation}"},
                    iso="rc",
                    final=False,
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=r.offset,
                    value=None if r.value is None else r.value.decode(),
                )
                reads += 1
        if polled:
            try:
                consumer.commit()
                record("offset_commit", who=name, generation=generation, outcome="ok")
            except CommitFailedError as exc:
                record("offset_commit", who=name, generation=generation, outcome=_error(exc))
            except KStoreError as exc:
                record("error", who=name, error=_error(exc))
    try:
        consumer.close()
    except Exception as exc:
        record("error", who=name, error=_error(exc))
    return reads


def main() -> None:
    role, config = sys.argv[1], json.loads(sys.argv[2])
    faultfs.register()
    logging.getLogger("kstore").setLevel(logging.ERROR)
    record = Recorder(config["history"])
    rng = random.Random(config["seed"])
    store = Store(config["url"], config["options"], create=False)
    never = threading.Event().is_set
    if role == "producer":
        produce_loop(store, config["name"], record, rng, never)
    elif role == "txn":
        txn_loop(store, config["name"], config["tid"], record, rng, never)
    elif role == "consumer":
        consume_loop(store, config["name"], record, never)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
