"""A store with something to show, for the console's tests (tests/test_console*.py): topics
with records (JSON, binary and typed values, keys and headers), a consumer group with
committed offsets and lag, an open transaction, and a maintenance run that removed records."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kstore.maintenance import Settings, run_due

from kstore.groups import Group
from kstore.producer import Producer
from kstore.records import OffsetAndMetadata, TopicPartition
from kstore.store import Store

# Record i of partition p of "orders" has this timestamp: one second apart, in offset order,
# so a lag in seconds interpolated over a segment is exact; ten minutes ago, so that a page
# shows a lag people recognise (and within every retention).
T0_MS = (int(time.time()) - 600) * 1000
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
    producer.flush()
    producer.close()
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
