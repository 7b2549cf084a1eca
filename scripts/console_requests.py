"""Storage requests of the console's refresh (kstore ui, kstore maintain --metrics-port) on
SeaweedFS, for a store of N topics and G consumer groups: what one refresh sends, by kind, and
what it comes to per hour at a few refresh intervals; then that pages and scrapes loaded by
several clients at once between two refreshes send none. With --maintained, a maintenance pass
runs over every topic first, so that each task has a newest record to read. The figures go in
docs/CONSOLE.md.

    .venv/bin/python scripts/console_requests.py --topics 100 --groups 20 [--maintained]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--groups", type=int, default=20)
    parser.add_argument("--topics-per-group", type=int, default=5)
    parser.add_argument("--refreshes", type=int, default=3, help="refreshes measured (after one)")
    parser.add_argument(
        "--pages", type=int, default=50, help="page loads and scrapes by each client"
    )
    parser.add_argument("--clients", type=int, default=8, help="clients loading pages at once")
    parser.add_argument(
        "--maintained", action="store_true", help="run a maintenance pass over every topic first"
    )
    args = parser.parse_args()

    from kstore.console import build

    from kstore.groups import Group
    from kstore.producer import Producer
    from kstore.records import OffsetAndMetadata, TopicPartition
    from kstore.store import Store
    from tests.servers import SeaweedServer

    with tempfile.TemporaryDirectory(prefix="kstore-console-") as work:
        server = SeaweedServer(Path(work) / "weed")
        server.start()
        try:
            url, options = server.new_store_url("console")
            store = Store(url, options, create=True)
            names = [f"topic-{i:03d}" for i in range(args.topics)]
            producer = Producer(store, acks="all")
            for name in names:
                store.create_topic(name, args.partitions)
                for p in range(args.partitions):
                    producer.send(name, value=b"x" * 100, partition=p)
            producer.flush()
            producer.close()
            for g in range(args.groups):
                read = [
                    names[(g * args.topics_per_group + k) % len(names)]
                    for k in range(args.topics_per_group)
                ]
                Group(store, f"group-{g:02d}").commit_offsets(
                    {
                        TopicPartition(t, p): OffsetAndMetadata(0)
                        for t in read
                        for p in range(args.partitions)
                    },
                    member_id=None,
                    generation=-1,
                )
            if args.maintained:
                from kstore.maintenance import Settings, run_due

                run_due(store, Settings())
            console = build(url, options, port=0, refresh_s=3600)
            snapshots = console.console.snapshots
            snapshots.refresh()  # the first refresh loads every log from its checkpoint

            def measure(with_maintenance: bool) -> dict[str, float]:
                # Read the maintenance state at every refresh, or never (its own pace is a
                # minute: MAINTENANCE_REFRESH_S).
                snapshots.maintenance_refresh_s = 0.0 if with_maintenance else 1e9
                kinds: collections.Counter[str] = collections.Counter()
                with snapshots.store.storage.count_requests() as counts:
                    for _ in range(args.refreshes):
                        snap = snapshots.refresh()
                        assert snap is not None
                        elapsed.append(snap.elapsed_s)
                    kinds.update(counts)
                return {k: v / args.refreshes for k, v in sorted(kinds.items())}

            elapsed: list[float] = []
            with_state = measure(True)
            without_state = measure(False)
            from kstore.console.server import serve_in_thread

            serve_in_thread(console)
            paths = [
                "/",
                "/groups",
                "/maintenance",
                "/metrics",
                f"/topics/{names[0]}",
                "/groups/group-00",
            ]

            def client(first: int) -> None:
                for i in range(args.pages):
                    path = paths[(first + i) % len(paths)]
                    with urllib.request.urlopen(console.url + path) as answer:
                        answer.read()

            with snapshots.store.storage.count_requests() as counts:
                threads = [threading.Thread(target=client, args=(c,)) for c in range(args.clients)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                between = sum(counts.values())
            console.stop()
            per_hour = {}
            for interval in (5, 15, 30, 60):
                refreshes = 3600 // interval
                full = min(refreshes, 60)  # the maintenance state at most once a minute
                rest = refreshes - full
                kinds = set(with_state) | set(without_state)
                counts_hour = {
                    k: full * with_state.get(k, 0) + rest * without_state.get(k, 0) for k in kinds
                }
                lists = counts_hour.get("LIST", 0) + counts_hour.get("PUT", 0)
                gets = sum(counts_hour.values()) - lists
                per_hour[f"{interval}s"] = {
                    "requests": round(sum(counts_hour.values())),
                    "LIST": round(counts_hour.get("LIST", 0)),
                    "dollars_s3_standard": round(gets * 0.0004 / 1000 + lists * 0.005 / 1000, 3),
                }
            result = {
                "topics": args.topics,
                "partitions": args.partitions,
                "groups": args.groups,
                "topics_per_group": args.topics_per_group,
                "requests_per_refresh_with_maintenance_state": with_state,
                "requests_per_refresh_without": without_state,
                "refresh_seconds": [round(e, 3) for e in elapsed],
                "per_hour": per_hour,
                "maintained": args.maintained,
                "clients": args.clients,
                "page_loads_and_scrapes": args.pages * args.clients,
                "requests_by_pages_and_scrapes": between,
            }
            print(json.dumps(result, indent=2))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
