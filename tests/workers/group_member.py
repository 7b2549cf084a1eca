"""A consumer-group member in its own process, for tests that kill it with SIGKILL.

Usage: python -m tests.workers.group_member STORE_URL OPTIONS_JSON TOPIC GROUP
Prints one JSON line per change of assignment: {"generation": g, "partitions": [...]}.
"""

from __future__ import annotations

import json
import sys

from kstore.consumer import Consumer


def main() -> None:
    url, options, topic, group = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
    consumer = Consumer(
        topic,
        store=url,
        group_id=group,
        storage_options=options,
        session_timeout_ms=2_500,
        heartbeat_interval_ms=200,
        auto_offset_reset="earliest",
    )
    last = None
    while True:
        consumer.poll(timeout_ms=50)
        now = (consumer.generation, sorted(tp.partition for tp in consumer.assignment()))
        if now != last:
            print(json.dumps({"generation": now[0], "partitions": now[1]}), flush=True)
            last = now


if __name__ == "__main__":
    main()
