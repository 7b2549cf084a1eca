"""A consumer group with three members sharing six partitions: each gets two, every record is
read by exactly one member, and when a member leaves its partitions move to the others.

Run: ``python examples/consumer_group.py [STORE_URL]``.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from kstore import Store
from kstore.consumer import Consumer
from kstore.groups import describe_group
from kstore.producer import Producer


def main(url: str) -> dict[str, int]:
    store = Store(url)
    store.create_topic("jobs", partitions=6)
    with Producer(store) as producer:
        for i in range(600):
            producer.send("jobs", key=b"job-%d" % i, value=b"payload %d" % i)
    members = [
        Consumer(
            "jobs",
            store=store,
            group_id="workers",
            auto_offset_reset="earliest",
            session_timeout_ms=3_000,
            heartbeat_interval_ms=300,
            client_id=f"worker-{n}",
        )
        for n in range(3)
    ]
    read: dict[str, int] = {m.client_id: 0 for m in members}
    seen: set[tuple[int, int]] = set()
    deadline = time.monotonic() + 30
    while len(seen) < 600 and time.monotonic() < deadline:
        for member in members:
            for records in member.poll(timeout_ms=20).values():
                read[member.client_id] += len(records)
                seen.update((r.partition, r.offset) for r in records)
    for member in members:
        print(
            member.client_id, "owns partitions", sorted(tp.partition for tp in member.assignment())
        )
        member.commit()
    group = describe_group(store, "workers")
    print(
        f"group {group.group_id}: {group.state}, generation {group.generation}, lag {group.total_lag}"
    )
    members[2].close()  # leaves the group: its partitions are handed over
    for _ in range(50):
        for member in members[:2]:
            member.poll(timeout_ms=10)
        if sum(len(m.assignment()) for m in members[:2]) == 6:
            break
    print(
        "after worker-2 left:",
        {m.client_id: sorted(tp.partition for tp in m.assignment()) for m in members[:2]},
    )
    for member in members[:2]:
        member.close()
    assert len(seen) == 600  # every record read once by the group
    return read


if __name__ == "__main__":
    main(
        sys.argv[1]
        if len(sys.argv) > 1
        else Path(tempfile.mkdtemp(prefix="kstore-group-")).as_uri()
    )
