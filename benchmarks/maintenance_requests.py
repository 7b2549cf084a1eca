"""S3 requests of the maintenance service (``kstore maintain``) on an idle store.

A store on moto (S3 in this process) with ``--topics`` topics of ``--partitions`` partitions,
one record each, default configs. One maintainer (one long-lived Store, as ``kstore maintain``
keeps) makes a first pass, which vacuums every topic (vacuum had never run); then idle passes,
where only the store-wide tasks of every interval are due; then a pass where each topic's vacuum is due again (as an hour later).
All on the wall clock, as a maintainer runs. Every request is counted
(``Storage.count_requests``). Requests per hour at the default intervals = (passes per hour - 1)
x an idle pass + one vacuum pass::

    .venv/bin/python -m benchmarks.maintenance_requests --topics 100

(as a module: this folder's requests.py would otherwise shadow the library moto imports)

With ``--vacuum-lengths``, instead: vacuum's requests per run against the length of a topic's
log, for the listing of the log's start (PROTOCOL.md 22.5) and for the whole listing vacuum
made before, run on the same fixture one after the other. Each fixture is one topic of one
partition whose log holds ``--old`` versions older than the log retention (what a run
deletes, as an hourly run finds after an hour of commits) then N retained versions, with a
checkpoint every 100 versions; vacuum runs as a dry run (which lists what a run lists, and
deletes nothing, so both approaches see the same files) with its clock set a log retention
after the boundary::

    .venv/bin/python -m benchmarks.maintenance_requests --vacuum-lengths 1000,4000,16000 --old 1000

(With ``--young-sidecars`` the sidecars are rewritten after
building, so that the sidecar step does not run: no sidecar is older than the log retention.
In a topic log of writer version 5 that step lists the log only for the 10,000 versions past
the oldest kept checkpoint; below it, the whole log.)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kstore.maintenance import Settings, run_due
from kstore.retention import vacuum

from kstore import Store
from kstore.layout import topic_data_dir
from kstore.log import encode_commit, version_file
from kstore.producer import Producer
from kstore.storage import Storage
from kstore.topic_log import SIDECARS
from tests.servers import MotoServer

# The module (the package's ``vacuum`` attribute is the job function).
vacuum_module = importlib.import_module("kstore.retention.vacuum")
RETENTION_MS = 30 * 24 * 3_600_000
CHECKPOINT_EVERY = 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--idle-passes", type=int, default=3)
    parser.add_argument(
        "--vacuum-lengths",
        default="",
        help="comma-separated retained log lengths: compare vacuum's listings instead",
    )
    parser.add_argument("--old", type=int, default=1000, help="versions a run may delete")
    parser.add_argument(
        "--young-sidecars",
        action="store_true",
        help="rewrite the checkpoint sidecars after building, so that none is older "
        "than the log retention (a run that finds one lists the rest of the log for the "
        "sidecar step, 22.5 step 2.4)",
    )
    args = parser.parse_args()
    if args.vacuum_lengths:
        lengths = [int(n) for n in args.vacuum_lengths.split(",")]
        vacuum_lengths(lengths, args.old, young_sidecars=args.young_sidecars)
        return

    server = MotoServer()
    server.start()
    try:
        url, options = server.new_store_url()
        setup = Store(url, options)
        producer = Producer(setup)
        for i in range(args.topics):
            name = f"t{i:04d}"
            setup.create_topic(name, args.partitions)
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
            f"{args.topics} topics x {args.partitions} partition(s), "
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


def _pad(storage: Storage, log: Any, count: int) -> int:
    """``count`` commits that change nothing, a checkpoint every CHECKPOINT_EVERY versions and
    at the last; returns the last version."""
    state = log.load()
    first = state.version + 1
    body = encode_commit([], {"timestamp": int(time.time() * 1000), "operation": "PAD"})
    paths = [f"{log.directory}/{version_file(v)}" for v in range(first, first + count)]
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda p: storage.put_if_absent(p, body, durable=False), paths))
    last = first + count - 1
    for v in range(first, last + 1):
        if v % CHECKPOINT_EVERY == 0 or v == last:
            copy = state.copy()
            copy.stamp(v)
            log.write_checkpoint(copy)
    return last


@contextlib.contextmanager
def _whole_listing() -> Iterator[None]:
    """Vacuum as it was: each log directory listed whole (``list_dir``), once per run."""
    scan = vacuum_module.LogScan.scan

    def whole(self: Any, now: int | None, log_retention_ms: int, probe: str | None = None) -> Any:
        listing = self.storage.list_dir(self.directory)
        for info in listing:
            if probe is not None and info.name == probe and info.mtime_ms is not None:
                now = info.mtime_ms
        if probe is not None:
            self.storage.delete([f"{self.directory}/{probe}"])
        self.files = sorted((i for i in listing if i.name != probe), key=lambda i: i.name)
        self.complete = True
        return now

    vacuum_module.LogScan.scan = whole
    try:
        yield
    finally:
        vacuum_module.LogScan.scan = scan


def vacuum_lengths(lengths: list[int], old: int, *, young_sidecars: bool = False) -> None:
    server = MotoServer()
    server.start()
    rows = []
    try:
        for retained in lengths:
            url, options = server.new_store_url()
            store = Store(url, options)
            store.create_topic("t", 1, {"checkpoint.interval": 100_000})
            with Producer(store) as producer:
                producer.send("t", b"v", key=b"k", partition=0)
            fresh = Store(url, options)
            log = fresh.topic_logs("t", fresh.topic("t"))[0].log
            began = time.monotonic()
            _pad(store.storage, log, old)
            time.sleep(1.2)  # S3 records times to the second
            boundary = int(time.time() * 1000)
            time.sleep(1.2)
            _pad(store.storage, log, retained)
            if young_sidecars:
                meta = store.topic("t")
                sidecars = f"{topic_data_dir('t', meta.topic_id)}/{SIDECARS}"
                for info in store.storage.list_dir(sidecars):
                    path = f"{sidecars}/{info.name}"
                    store.storage.put(path, store.storage.read(path))
            built = time.monotonic() - began
            files = len(store.storage.list_dir(log.directory))
            result: dict[str, Any] = {"retained": retained, "files": files}
            log_prefix = f"{store.storage.root.split('/', 1)[1]}/{log.directory}/"
            for label, mode in (("start", contextlib.nullcontext()), ("whole", _whole_listing())):
                # A fresh Store each time: both runs start with nothing cached.
                measured = Store(url, options, create=False)
                log_lists = [0]

                def on_call(
                    params: Any = None,
                    _lists: list[int] = log_lists,
                    _prefix: str = log_prefix,
                    **_: Any,
                ) -> None:
                    query = (params or {}).get("query_string") or {}
                    if isinstance(query, dict) and query.get("prefix") == _prefix:
                        _lists[0] += 1

                events = measured.storage.s3_client().meta.events
                events.register("before-call.s3.ListObjectsV2", on_call)
                try:
                    with mode, measured.storage.count_requests() as counts:
                        summary = vacuum(
                            None,
                            measured,
                            verbose=False,
                            dry_run=True,
                            now_ms=boundary + RETENTION_MS,
                        )
                finally:
                    events.unregister("before-call.s3.ListObjectsV2", on_call)
                result[label] = dict(counts)
                result[f"{label}_log"] = log_lists[0]
                result[f"{label}_files"] = len(summary.files)
            assert result["start_files"] == result["whole_files"], result
            rows.append(result)
            print(
                f"log of {files} files ({old} + checkpoints to delete, {retained} retained; "
                f"built in {built:.0f} s): would delete {result['start_files']}; "
                f"LIST of the log {result['start_log']} (start) vs {result['whole_log']} (whole); "
                f"LIST in all {result['start'].get('LIST', 0)} vs "
                f"{result['whole'].get('LIST', 0)}; all requests "
                f"{sum(result['start'].values())} vs {sum(result['whole'].values())}",
                flush=True,
            )
    finally:
        server.stop()
    young = ", sidecars rewritten young" if young_sidecars else ""
    print(f"layout 3{young}, moto, dry runs, page 1,000 names (one LIST each):")
    print(
        "| log files | would delete | LIST of the log: start / whole | "
        "LIST in all: start / whole | all requests: start / whole |"
    )
    print("|---:|---:|---|---|---|")
    for r in rows:
        print(
            f"| {r['files']:,} | {r['start_files']:,} | {r['start_log']} / {r['whole_log']} | "
            f"{r['start'].get('LIST', 0)} / {r['whole'].get('LIST', 0)} | "
            f"{sum(r['start'].values())} / {sum(r['whole'].values())} |"
        )


if __name__ == "__main__":
    main()
