"""How late the maintenance service is: retention's lag behind its deadline, and the time an
abandoned transaction holds ``read_committed`` readers back.

Retention (``--mode lag``): a producer at a steady rate (one batch a second) into a topic with
``retention.ms`` (default 60 s), and ``kstore maintain --interval 10s`` in a process of its own.
Every second, once the first records are past the deadline (now - ``retention.ms``), a sample
of the partition's first segment: **segment lag** = deadline - that segment's newest
timestamp (how long a segment retention may remove has stayed; retention removes whole
segments, as Kafka's does), and **record lag** = deadline - its oldest timestamp (the oldest
record still present; the segment lag plus up to one segment's time span). The issue's bound on
the segment lag is the interval plus one retention run's duration (read from the service's
log).

Transactions (``--mode txn``): a transactional producer process (``transaction.timeout.ms``
``--txn-timeout-s``, default 10) appends a record and is SIGKILLed with the transaction open;
another producer appends one record after it; a ``read_committed`` reader waits at the open
transaction. Measured: the time from the kill to the reader returning the record after it, with
``kstore maintain --interval 2s`` running (bound: timeout + interval + a job's duration).

    .venv/bin/python -m benchmarks.maintenance_lag --backend local --minutes 10
    .venv/bin/python -m benchmarks.maintenance_lag --backend seaweed --mode txn

(``--backend seaweed`` starts a SeaweedFS server of its own, tests/servers.py.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, write_results
from kstore import Store
from kstore.consumer import Consumer
from kstore.producer import Producer
from kstore.records import TopicPartition

TXN_SCRIPT = """
import json, sys, time
from kstore import Store
from kstore.producer import Producer
store = Store(sys.argv[1], json.loads(sys.argv[2]), create=False)
producer = Producer(store, transactional_id=sys.argv[3], transaction_timeout_ms=int(sys.argv[4]))
producer.begin_transaction()
producer.send("txn", value=b"open").get(timeout=60)
print("open", flush=True)
time.sleep(3600)
"""


def _flat(options: dict[str, Any], prefix: str = "") -> list[str]:
    """Storage options as ``kstore -O`` arguments (dotted keys nest)."""
    out: list[str] = []
    for key, value in options.items():
        if isinstance(value, dict):
            out += _flat(value, f"{prefix}{key}.")
        else:
            out += ["-O", f"{prefix}{key}={value}"]
    return out


def start_service(
    url: str, options: dict[str, Any], interval: str, log: Path
) -> subprocess.Popen[bytes]:
    """``kstore maintain`` over the whole store (its store-wide tasks, such as aborting
    transactions past their timeout, run only without ``--topic``)."""
    kstore = str(Path(sys.executable).with_name("kstore"))
    with log.open("wb") as out:
        return subprocess.Popen(
            [kstore, "maintain", "-s", url, *_flat(options), "--interval", interval],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=str(REPO),
        )


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def job_seconds(log: Path, task: str) -> list[float]:
    """The durations of the service's runs of ``task`` that removed something or found
    nothing (its log lines end "in N.NN s")."""
    pattern = re.compile(rf"^\[maintain\] {re.escape(task)} \S+: (ok|nothing).* in ([0-9.]+) s")
    return [
        float(m.group(2)) for line in log.read_text().splitlines() if (m := pattern.match(line))
    ]


def lag_run(
    url: str, options: dict[str, Any], args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    setup = Store(url, options)
    setup.create_topic("lag", 1, config={"retention.ms": args.retention_ms})
    log = work / "service-lag.log"
    service = start_service(url, options, f"{args.interval_s}s", log)
    stop_producing = threading.Event()
    sent = [0]

    def produce() -> None:
        producer = Producer(Store(url, options, create=False), linger_ms=50)
        next_at = time.monotonic()
        while not stop_producing.is_set():
            for _ in range(args.rate):
                producer.send("lag", value=b"x" * 100)
            producer.flush()
            sent[0] += args.rate
            next_at += 1.0
            time.sleep(max(0.0, next_at - time.monotonic()))
        producer.close()

    thread = threading.Thread(target=produce, daemon=True)
    began = time.time()
    thread.start()
    sampler = Store(url, options, create=False, segment_cache_bytes=0)
    segment_lags: list[float] = []
    record_lags: list[float] = []
    try:
        ends = began + args.retention_ms / 1000 + args.minutes * 60
        while time.time() < ends:
            time.sleep(1.0)
            # The deadline as the read begins: what the read finds was there at that moment
            # or later (a read takes a second or more on a loaded S3), so the lag is not
            # overstated by the read's own time.
            deadline_ms = time.time() * 1000 - args.retention_ms
            state = sampler.partition("lag", 0).state()
            if time.time() < began + args.retention_ms / 1000 or not state.segments:
                continue  # nothing can be past retention yet
            first = state.segments[0]
            segment_lags.append(max(0.0, (deadline_ms - first.max_timestamp_ms) / 1000))
            record_lags.append(max(0.0, (deadline_ms - first.min_timestamp_ms) / 1000))
    finally:
        stop_producing.set()
        thread.join(60)
        stop(service)
    jobs = job_seconds(log, "retention")
    final = sampler.partition("lag", 0).state()
    bound = args.interval_s + (max(jobs) if jobs else 0.0)
    return {
        "mode": "lag",
        "measured_s": args.minutes * 60,
        "retention_ms": args.retention_ms,
        "interval_s": args.interval_s,
        "rate": args.rate,
        "records_sent": sent[0],
        "samples": len(segment_lags),
        "segment_lag_max_s": round(max(segment_lags, default=0.0), 2),
        "segment_lag_median_s": round(statistics.median(segment_lags) if segment_lags else 0.0, 2),
        "record_lag_max_s": round(max(record_lags, default=0.0), 2),
        "record_lag_median_s": round(statistics.median(record_lags) if record_lags else 0.0, 2),
        "retention_runs": len(jobs),
        "retention_job_max_s": round(max(jobs, default=0.0), 2),
        "bound_s": round(bound, 2),
        "within_bound": max(segment_lags, default=0.0) <= bound,
        "final_log_start": final.log_start_offset,
        "final_segments": len(final.segments),
    }


def txn_run(
    url: str, options: dict[str, Any], args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    store = Store(url, options)
    store.create_topic("txn", 1)
    log = work / "service-txn.log"
    service = start_service(url, options, f"{args.txn_interval_s}s", log)
    tp = TopicPartition("txn", 0)
    waits: list[float] = []
    try:
        for i in range(args.repeats):
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    TXN_SCRIPT,
                    url,
                    json.dumps(options),
                    f"bench-{i}",
                    str(int(args.txn_timeout_s * 1000)),
                ],
                stdout=subprocess.PIPE,
                cwd=str(REPO),
                env={**os.environ, "PYTHONPATH": str(REPO)},
            )
            assert child.stdout is not None
            if child.stdout.readline().strip() != b"open":
                raise RuntimeError("the transactional producer did not open its transaction")
            opened = time.monotonic()
            after = Producer(store).send("txn", value=b"after").get(timeout=60)
            child.kill()
            child.wait()
            killed = time.monotonic()
            reader = Consumer(store=store, isolation_level="read_committed")
            reader.assign([tp])
            reader.seek(tp, after.offset)
            got = False
            while not got and time.monotonic() - killed < args.txn_timeout_s * 6 + 120:
                got = any(
                    r.offset == after.offset
                    for rs in reader.poll(timeout_ms=200).values()
                    for r in rs
                )
            reader.close()
            if not got:
                raise RuntimeError(f"repeat {i}: the reader did not advance")
            waits.append(time.monotonic() - killed)
            print(
                f"repeat {i}: reader advanced {waits[-1]:.1f} s after the kill "
                f"({time.monotonic() - opened:.1f} s after the transaction's append)",
                flush=True,
            )
    finally:
        stop(service)
    aborts = job_seconds(log, "abort-transactions")
    return {
        "mode": "txn",
        "txn_timeout_s": args.txn_timeout_s,
        "interval_s": args.txn_interval_s,
        "repeats": args.repeats,
        "kill_to_read_s": [round(w, 1) for w in waits],
        "max_s": round(max(waits), 1),
        "bound_s": round(args.txn_timeout_s + args.txn_interval_s + max(aborts, default=0.0), 1),
        "abort_job_max_s": round(max(aborts, default=0.0), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["local", "seaweed"], default="local")
    parser.add_argument("--mode", choices=["lag", "txn", "both"], default="both")
    parser.add_argument(
        "--minutes", type=float, default=10.0, help="measured, after the first retention.ms"
    )
    parser.add_argument("--retention-ms", type=int, default=60_000)
    parser.add_argument("--interval-s", type=int, default=10)
    parser.add_argument("--rate", type=int, default=50, help="records a second")
    parser.add_argument("--txn-timeout-s", type=float, default=10.0)
    parser.add_argument("--txn-interval-s", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="kstore-maintenance-lag-"))
    server = None
    if args.backend == "seaweed":
        from tests.servers import SeaweedServer

        server = SeaweedServer(work / "seaweed")
        server.start()
    try:
        results: list[dict[str, Any]] = []
        for mode in ("lag", "txn") if args.mode == "both" else (args.mode,):
            if server is not None:
                url, options = server.new_store_url()
            else:
                url, options = (work / f"store-{mode}").as_uri(), {}
            run = lag_run if mode == "lag" else txn_run
            result = {"backend": args.backend, **run(url, options, args, work)}
            print(result, flush=True)
            results.append(result)
        path = write_results(f"maintenance_lag_{args.backend}_{args.mode}", {"results": results})
        print(f"results: {path}")
    finally:
        if server is not None:
            server.close()


if __name__ == "__main__":
    main()
