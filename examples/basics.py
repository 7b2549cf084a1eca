"""Producer and consumer basics: create a topic, send records, read them back.

Run: ``python examples/basics.py [STORE_URL]`` (default: a temporary directory).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from kstore import Store
from kstore.consumer import Consumer
from kstore.producer import Producer


def main(url: str) -> list[tuple[int, int, str]]:
    store = Store(url)
    store.create_topic("greetings", partitions=2)
    with Producer(store, acks="all") as producer:
        for i in range(10):
            future = producer.send("greetings", key=b"k%d" % (i % 3), value=b"hello %d" % i)
        print(
            "last record:", future.get(timeout=10)
        )  # RecordMetadata(topic, partition, offset, ...)
    seen = []
    with Consumer(
        "greetings", store=store, auto_offset_reset="earliest", consumer_timeout_ms=500
    ) as consumer:
        for record in consumer:  # stops after 500 ms without new records
            seen.append((record.partition, record.offset, record.value.decode()))
            print(record.partition, record.offset, record.key, record.value)
    return seen


if __name__ == "__main__":
    main(
        sys.argv[1]
        if len(sys.argv) > 1
        else Path(tempfile.mkdtemp(prefix="kstore-basics-")).as_uri()
    )
