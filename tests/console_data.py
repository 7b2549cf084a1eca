"""A store with something to show, for the console's tests (tests/test_console*.py): topics
with records (JSON, binary and typed values, keys and headers), a consumer group with
committed offsets and lag, a Delta topic with a published table version, an open transaction,
a group with a live member, and a maintenance run that removed records."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kstore.lakehouse import publish_table
from kstore.maintenance import Settings, run_due

from kstore.consumer import Consumer
from kstore.groups import Group
from kstore.producer import Producer
from kstore.records import OffsetAndMetadata, TopicPartition
from kstore.store import Store

# Record i of partition p of "orders" has this timestamp: one second apart, in offset order,
# so a lag in seconds interpolated over a segment is exact; ten minutes ago, so that a page
# shows a lag people recognise (and within every retention).
T0_MS = (int(time.time()) - 600) * 1000
LAKE_RECORDS = 3
EXPIRED = 4  # records of "expiring", older than its retention: the maintenance run removes them


@dataclass(frozen=True)
class Filled:
    store: Store
    now_ms: int  # the reference time of the lag in seconds
    committed: dict[TopicPartition, int]


def order_timestamp(partition: int, offset: int) -> int:
    return T0_MS + partition * 100_000 + offset * 1000


def fill(url: str, options: dict[str, Any]) -> Filled:
    store = Store(url, options, create=True)
    store.create_topic("orders", 3)
    store.create_topic("events", 1)
    store.create_topic("payments", 1, value_schema="user STRING, amount DOUBLE")
    store.create_topic("expiring", 1, {"retention.ms": 60_000})
    store.create_topic("lake", 1, {"table.format": "delta"})
    producer = Producer(store, acks="all")
    for p in range(3):
        for offset in range(10):
            producer.send(
                "orders",
                key=f"k{p}-{offset}".encode(),
                value=f'{{"n": {offset}, "p": {p}}}'.encode(),
                partition=p,
                headers=[("source", b"test"), ("trace", bytes([0xFF, offset]))],
                timestamp_ms=order_timestamp(p, offset),
            )
    producer.send("events", value=bytes([0x00, 0xFE, 0xFF, 0x10]), key=None)
    producer.send("events", value=b"plain text", key=b"\xff\x00")
    for i in range(5):
        producer.send("payments", value={"user": f"u{i}", "amount": i * 1.5}, key=f"p{i}".encode())
    old = int(time.time() * 1000) - 3_600_000
    for i in range(EXPIRED):
        producer.send("expiring", value=f"old {i}".encode(), timestamp_ms=old + i)
    for i in range(LAKE_RECORDS):
        producer.send("lake", value=f"row {i}".encode())
    producer.flush()
    producer.close()
    publish_table(store, "lake", tail=True)  # the Delta table's version 0
    committed = {TopicPartition("orders", 0): 4, TopicPartition("orders", 1): 10}
    Group(store, "billing").commit_offsets(
        {tp: OffsetAndMetadata(o) for tp, o in committed.items()}, member_id=None, generation=-1
    )
    # Retention removes "expiring"'s records; the other tasks find nothing to do.
    run_due(store, Settings(interval_ms=60_000), topics=["expiring"])
    return Filled(store, order_timestamp(0, 9) + 30_000, committed)


def open_transaction(store: Store) -> Producer:
    """A transactional producer with records sent and flushed but not committed (the caller
    aborts it)."""
    producer = Producer(store, transactional_id="console-test-txn", acks="all")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("events", value=b"in a transaction")
    producer.flush()
    return producer


def join_member(store: Store, group: str = "readers") -> Consumer:
    """A consumer of "events" in ``group``, a live member once this returns (its heartbeat
    thread keeps it so until closed), its position committed: the caller closes it."""
    consumer = Consumer(
        "events",
        store=store,
        group_id=group,
        client_id="console-test-reader",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    began = time.monotonic()
    while not consumer.assignment():
        consumer.poll(timeout_ms=200)
        if time.monotonic() - began > 60:
            consumer.close()
            raise AssertionError("the consumer was not assigned a partition in 60 s")
    consumer.poll(timeout_ms=200)
    consumer.commit()
    return consumer
