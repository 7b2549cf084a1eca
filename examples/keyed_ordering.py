"""Records of one key keep their order: they all go to the same partition (murmur2 of the
key, as Kafka's Java client places them), and a partition is read in offset order.

Run: ``python examples/keyed_ordering.py [STORE_URL]``.
"""

from __future__ import annotations

import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from kstore import Store
from kstore.consumer import Consumer
from kstore.partitioner import murmur2_partition
from kstore.producer import Producer


def main(url: str) -> dict[bytes, list[int]]:
    store = Store(url)
    store.create_topic("account-events", partitions=6)
    with Producer(store, linger_ms=1) as producer:
        for seq in range(600):
            account = b"account-%d" % (seq % 20)
            producer.send("account-events", key=account, value=b"%d" % seq)
    by_key: dict[bytes, list[int]] = defaultdict(list)
    partition_of: dict[bytes, set[int]] = defaultdict(set)
    with Consumer(
        "account-events", store=store, auto_offset_reset="earliest", consumer_timeout_ms=500
    ) as consumer:
        for record in consumer:
            by_key[record.key].append(int(record.value))
            partition_of[record.key].add(record.partition)
    for key, partitions in sorted(partition_of.items()):
        assert partitions == {murmur2_partition(key, 6)}  # one partition per key: Kafka's
        assert by_key[key] == sorted(by_key[key])  # ... so its records stay in send order
    print(f"{len(by_key)} keys, each in one partition, every key's events in send order")
    return dict(by_key)


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="kstore-keys-")).as_uri()
    )
