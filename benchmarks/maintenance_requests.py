"""S3 requests of the maintenance service (``kstore maintain``) on an idle store.

A store on moto (S3 in this process) with ``--topics`` topics of ``--partitions`` partitions,
one record each, default configs. One maintainer (one long-lived Store, as ``kstore maintain``
keeps) makes a first pass, which vacuums every topic (vacuum had never run); then idle passes,
where only the store-wide tasks of every interval are due; then a pass where each topic's vacuum is due again (as an hour later).
All on the wall clock, as a maintainer runs. Every request is counted
(``Storage.count_requests``). Requests per hour at the default intervals = (passes per hour - 1)
x an idle pass + one vacuum pass::

    .venv/bin/python -m benchmarks.maintenance_requests --topics 100 [--layout 2]

(as a module: this folder's requests.py would otherwise shadow the library moto imports)
"""

from __future__ import annotations

import argparse
import collections
import time

from kstore.maintenance import Settings, run_due

from kstore import Store
from kstore.producer import Producer
from tests.servers import MotoServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--layout", type=int, default=3, choices=[2, 3])
    parser.add_argument("--idle-passes", type=int, default=3)
    args = parser.parse_args()

    server = MotoServer()
    server.start()
    try:
        url, options = server.new_store_url()
        setup = Store(url, options)
        producer = Producer(setup)
        for i in range(args.topics):
            name = f"t{i:04d}"
            setup.create_topic(name, args.partitions, layout=args.layout)
            producer.send(name, b"v", key=b"k")
        producer.close()

        settings = Settings()
        store = Store(url, options, create=False, segment_cache_bytes=0)

        # On the wall clock: vacuum then writes its clock probes on S3, as it does in service.
        def measured(pass_settings: Settings) -> tuple[collections.Counter[str], int, float]:
            began = time.monotonic()
            with store.storage.count_requests() as counts:
                runs = run_due(store, pass_settings)
            return counts, len(runs), time.monotonic() - began

        first, first_runs, first_s = measured(settings)
        # Passes one interval apart: the store-wide tasks of every interval (transaction
        # timeouts, deleted topics) are due again, made due at once here.
        idle = [measured(Settings(interval_ms=1)) for _ in range(args.idle_passes)]
        # An hour later every topic's vacuum and the log pruning are due again too.
        hourly, hourly_runs, hourly_s = measured(Settings(interval_ms=1, vacuum_interval_ms=1))

        def show(label: str, counts: collections.Counter[str], runs: int, seconds: float) -> None:
            kinds = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            print(
                f"{label}: {sum(counts.values())} requests ({kinds}); {runs} task runs; {seconds:.1f} s"
            )

        print(
            f"{args.topics} topics x {args.partitions} partition(s), layout {args.layout}, "
            f"interval {settings.interval_ms // 1000} s, vacuum every "
            f"{settings.vacuum_interval_ms // 60_000} min"
        )
        show("first pass (vacuums every topic)", first, first_runs, first_s)
        for i, (counts, runs, seconds) in enumerate(idle, start=1):
            show(f"idle pass {i}", counts, runs, seconds)
        show("pass with vacuum due", hourly, hourly_runs, hourly_s)
        passes = 3_600_000 // settings.interval_ms
        idle_total = min(sum(c.values()) for c, _, _ in idle)
        per_hour = (passes - 1) * idle_total + sum(hourly.values())
        print(
            f"per hour: {passes - 1} idle passes x {idle_total} + {sum(hourly.values())} "
            f"= {per_hour} requests"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
