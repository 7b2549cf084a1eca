"""At most once, at least once, exactly once: the same pipeline three ways.

Each function reads topic ``orders`` as consumer group ``<mode>`` and writes one output record
per input record to ``shipments-<mode>``. Where the offsets are committed decides what a
crash can do:

- at most once: commit the offsets *before* processing. A crash after the commit and before
  the output is written loses those records; none is ever processed twice.
- at least once: commit *after* processing. A crash between writing the output and the commit
  processes those records again on restart: nothing is lost, something may be duplicated.
- exactly once: write the output and the offsets in one transaction (a transactional
  producer, ``send_offsets_to_transaction``), and read with ``isolation_level="read_committed"``.
  A crash at any point either leaves neither the output nor the offsets visible, or both; a
  restarted instance with the same ``transactional_id`` finishes or aborts what the crashed
  one left.

Run: ``python examples/delivery_semantics.py [STORE_URL]`` (default: a temporary directory).
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

from kstore import Store
from kstore.consumer import Consumer
from kstore.errors import CommitFailedError
from kstore.producer import Producer

IDLE_POLLS = 5


class SimulatedCrashError(Exception):
    """Stands for the process dying at the worst moment of each mode."""


def consumer_for(store: Store, group: str, **extra: object) -> Consumer:
    return Consumer(
        "orders",
        store=store,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=50,
        **extra,
    )


def at_most_once(store: Store, crash_at: int | None = None) -> None:
    consumer, producer = consumer_for(store, "at-most-once"), Producer(store)
    try:
        idle, batch = 0, 0
        while idle < IDLE_POLLS:
            polled = consumer.poll(timeout_ms=100)
            idle = 0 if polled else idle + 1
            consumer.commit()  # first: these records will never be read again
            if polled and batch == crash_at:
                raise SimulatedCrashError("after the commit, before the output")
            for records in polled.values():
                for r in records:
                    producer.send("shipments-at-most-once", key=r.key, value=b"shipped " + r.value)
            producer.flush()
            batch += 1
    finally:
        consumer.close(autocommit=False)
        producer.close()


def at_least_once(store: Store, crash_at: int | None = None) -> None:
    consumer, producer = consumer_for(store, "at-least-once"), Producer(store, acks="all")
    try:
        idle, batch = 0, 0
        while idle < IDLE_POLLS:
            polled = consumer.poll(timeout_ms=100)
            idle = 0 if polled else idle + 1
            for records in polled.values():
                for r in records:
                    producer.send("shipments-at-least-once", key=r.key, value=b"shipped " + r.value)
            producer.flush()  # durable output first ...
            if polled and batch == crash_at:
                raise SimulatedCrashError("after the output, before the commit")
            consumer.commit()  # ... then the offsets: a crash in between repeats, never loses
            batch += 1
    finally:
        consumer.close(autocommit=False)
        producer.close()


def exactly_once(store: Store, crash_at: int | None = None) -> None:
    consumer = consumer_for(store, "exactly-once", isolation_level="read_committed")
    # A restarted instance with the same transactional id finishes what a crashed one left.
    producer = Producer(store, transactional_id="shipments-exactly-once")
    crashed = False
    try:
        idle, batch = 0, 0
        while idle < IDLE_POLLS:
            polled = consumer.poll(timeout_ms=100)
            if not polled:
                idle += 1
                continue
            idle = 0
            producer.begin_transaction()
            for records in polled.values():
                for r in records:
                    producer.send("shipments-exactly-once", key=r.key, value=b"shipped " + r.value)
            producer.flush()
            if batch == crash_at:
                crashed = True
                raise SimulatedCrashError("after the output, before the commit")
            positions = {tp: consumer.position(tp) for tp in polled}
            producer.send_offsets_to_transaction(positions, consumer.group_metadata())
            try:
                producer.commit_transaction()  # output and offsets become visible together
            except CommitFailedError:
                # A rebalance moved a partition away meanwhile: discard, rewind, go again.
                producer.abort_transaction()
                for tp in polled:
                    committed = consumer.committed(tp)
                    consumer.seek(tp, committed if isinstance(committed, int) else 0)
            batch += 1
    finally:
        consumer.close(autocommit=False)
        if not crashed:  # a crashed process closes nothing: its transaction stays open
            producer.close()


def count(store: Store, topic: str) -> Counter[bytes]:
    with Consumer(
        topic,
        store=store,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        consumer_timeout_ms=500,
    ) as consumer:
        return Counter(r.value for r in consumer)


def main(url: str) -> dict[str, Counter[bytes]]:
    store = Store(url)
    store.create_topic("orders", partitions=3)
    for mode in ("at-most-once", "at-least-once", "exactly-once"):
        store.create_topic(f"shipments-{mode}", partitions=3)
    with Producer(store) as producer:
        for i in range(300):
            producer.send("orders", key=b"customer-%d" % (i % 7), value=b"order-%d" % i)
    results = {}
    for mode, run in (
        ("at-most-once", at_most_once),
        ("at-least-once", at_least_once),
        ("exactly-once", exactly_once),
    ):
        try:
            run(store, crash_at=1)  # dies once, at the worst moment for its mode ...
        except SimulatedCrashError as crash:
            print(f"{mode:14s} crashed {crash}")
        run(store)  # ... and is restarted
        shipped = count(store, f"shipments-{mode}")
        results[mode] = shipped
        orders = {b"shipped order-%d" % i for i in range(300)}
        print(
            f"{mode:14s} {len(orders - set(shipped))} orders lost, "
            f"{sum(c - 1 for c in shipped.values())} shipped twice"
        )
    return results


if __name__ == "__main__":
    main(
        sys.argv[1]
        if len(sys.argv) > 1
        else Path(tempfile.mkdtemp(prefix="kstore-semantics-")).as_uri()
    )
