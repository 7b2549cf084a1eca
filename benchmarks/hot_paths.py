"""The hot paths of two source trees, one against the other, in turn: ``send()``,
``send_batch()``, ``poll()``, ``poll_batches()`` and the acknowledgement latency of a steady
producer at 1 and 64 partitions.

Each case is the one of the benchmark that owns it, at a size of a few seconds: ``send()`` and
``send_batch()`` as in produce.py (keyed 100-byte values, 8 partitions, acks=1, batches of
100,000), ``poll()`` and ``poll_batches()`` as in consume.py (8 partitions, its consumer
settings), the latency as in ack_latency.py (linger 0, acks=1, ``--rate`` records/s, the time
from ``send()`` to its callback, p50 and p99).

With ``--old PYTHON --new PYTHON`` the script runs itself once per round with each interpreter
(each a tree's venv, which imports that tree's kstore), the two alternating and the first of a
round swapping every round, so that a slow spell of a shared machine falls on both alike. It
reports each figure's median and range over the rounds and the ratio new/old taken round by
round (the two sides ran back to back), with the load average before and after.

This file imports nothing of the tree it lives in, only kstore, so that both sides run the same
benchmark code against their own kstore.

Run: ``.venv/bin/python benchmarks/hot_paths.py --old ../base/.venv/bin/python --new
.venv/bin/python --rounds 5 --out benchmarks/results/hot_paths.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

VALUE = b"v" * 100
# Higher is better for the rates, lower for the latencies.
RATES = ("send", "send_batch", "poll", "poll_batches")
LATENCIES = ("latency_p50_1", "latency_p50_64", "latency_p99_1", "latency_p99_64")


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def keys_for(n: int) -> list[bytes]:
    return [b"%08d" % (i % 100_000) for i in range(n)]


def records_table(n: int) -> Any:
    import numpy as np
    import pyarrow as pa

    from kstore.segments import HEADERS_TYPE, RECORD_SCHEMA, TIMESTAMP_TYPE

    return pa.Table.from_arrays(
        [
            pa.array(keys_for(n), pa.binary()),
            pa.array([VALUE] * n, pa.binary()),
            pa.array(np.full(n, int(time.time() * 1_000_000)), TIMESTAMP_TYPE),
            pa.nulls(n, HEADERS_TYPE),
        ],
        schema=RECORD_SCHEMA,
    )


def bench_send(root: str, n: int) -> float:
    """produce.py's ``bench_send`` at acks=1."""
    from kstore import Producer, Store

    store = Store(root)
    store.create_topic("t", partitions=8)
    keys = keys_for(n)
    with Producer(store, acks=1, linger_ms=5) as producer:
        send = producer.send
        started = time.perf_counter()
        for key in keys:
            send("t", VALUE, key)
        producer.flush()
        elapsed = time.perf_counter() - started
    assert sum(d.records for d in store.describe_topic("t").partitions) == n
    return n / elapsed


def bench_send_batch(root: str, data: Any, chunk: int = 100_000) -> float:
    """produce.py's ``bench_send_batch``."""
    from kstore import Producer, Store

    store = Store(root)
    store.create_topic("t", partitions=8)
    with Producer(store, acks=1) as producer:
        started = time.perf_counter()
        futures = [
            producer.send_batch("t", data.slice(i, chunk)) for i in range(0, data.num_rows, chunk)
        ]
        for f in futures:
            f.get()
        elapsed = time.perf_counter() - started
    return float(data.num_rows / elapsed)


def fill(root: str, data: Any) -> str:
    """consume.py's ``fill``: the records in batches of 500,000, 8 partitions."""
    from kstore import Producer, Store

    store = Store(root)
    store.create_topic("t", partitions=8)
    with Producer(store, acks=1) as producer:
        for start in range(0, data.num_rows, 500_000):
            producer.send_batch("t", data.slice(start, 500_000))
    return store.url


def consume(url: str, n: int, batches: bool) -> float:
    """consume.py's ``consume_batches`` (``batches``) or ``consume_records``."""
    from kstore import Store
    from kstore.consumer import Consumer

    consumer = Consumer(
        "t",
        store=Store(url),
        auto_offset_reset="earliest",
        max_poll_records=500_000 if batches else 50_000,
        fetch_max_bytes=1 << 30,
        max_partition_fetch_bytes=(256 if batches else 64) << 20,
    )
    got = 0
    checksum = 0
    started = time.perf_counter()
    while got < n:
        if batches:
            for pieces in consumer.poll_batches(timeout_ms=1_000).values():
                got += sum(b.num_rows for b in pieces)
        else:
            for records in consumer.poll(timeout_ms=1_000).values():
                got += len(records)
                checksum += records[-1].offset  # touch the records as an application would
    elapsed = time.perf_counter() - started
    consumer.close()
    return n / elapsed


def ack_latency(root: str, partitions: int, rate: float, seconds: float) -> tuple[float, float]:
    """ack_latency.py's ``run_case`` with the sender as it is: p50 and p99 in ms."""
    from kstore import Producer, Store

    store = Store(root)
    store.create_topic("t", partitions=partitions)
    latencies: list[float] = []

    def acknowledged(sent_at: float, _metadata: Any) -> None:
        latencies.append((time.perf_counter() - sent_at) * 1000)

    with Producer(store, acks=1, linger_ms=0) as producer:
        for i in range(500):  # warm: imports, caches, the first checkpoint's chains
            producer.send("t", VALUE, b"%08d" % i)
        producer.flush()
        interval, start, i = 1.0 / rate, time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            due = start + i * interval
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            sent_at = time.perf_counter()
            producer.send("t", VALUE, b"%08d" % i).add_callback(acknowledged, sent_at)
            i += 1
        producer.flush()
    return percentile(latencies, 50), percentile(latencies, 99)


def measure_once(args: argparse.Namespace) -> dict[str, Any]:
    """One round of every case in this interpreter, against the kstore it imports."""
    import kstore

    work = tempfile.mkdtemp(prefix="kstore-hot-")
    out: dict[str, Any] = {"kstore": os.path.dirname(kstore.__file__)}
    try:
        if args.throughput:
            throughput(args, work, out)
        for partitions in (1, 64):
            p50, p99 = ack_latency(
                os.path.join(work, f"lat{partitions}"), partitions, args.rate, args.seconds
            )
            out[f"latency_p50_{partitions}"], out[f"latency_p99_{partitions}"] = p50, p99
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def throughput(args: argparse.Namespace, work: str, out: dict[str, Any]) -> None:
    """The four throughput cases into ``out``."""
    bench_send(os.path.join(work, "warm"), min(args.send_records, 200_000))
    out["send"] = bench_send(os.path.join(work, "send"), args.send_records)
    data = records_table(args.batch_records)
    out["send_batch"] = bench_send_batch(os.path.join(work, "batch"), data)
    url = fill(os.path.join(work, "read"), data)
    del data
    # The shortest case (under a second): the median of three reads, with their minor page
    # faults (a read into fresh pages runs at about half the speed of one into reused
    # memory: consume.py).
    reads, faults = [], []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        reads.append(consume(url, args.batch_records, batches=True))
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    out["poll_batches"] = statistics.median(reads)
    out["poll_batches_reads"], out["poll_batches_faults"] = reads, faults
    out["poll"] = consume(url, args.batch_records, batches=False)


def git_head(tree: Path) -> str:
    result = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    )
    return result.stdout.strip()


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def compare(args: argparse.Namespace) -> None:
    sizes = [
        f"--send-records={args.send_records}",
        f"--batch-records={args.batch_records}",
        f"--rate={args.rate}",
        f"--seconds={args.seconds}",
        *([] if args.throughput else ["--latency-only"]),
    ]
    sides = {"old": args.old, "new": args.new}
    # The venv python is a symlink: its tree is three levels up from the link, not its target.
    trees = {side: Path(os.path.abspath(py)).parent.parent.parent for side, py in sides.items()}
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    loads = []
    for rnd in range(args.rounds):
        order = ["old", "new"] if rnd % 2 == 0 else ["new", "old"]
        for side in order:
            loads.append(os.getloadavg()[0])
            proc = subprocess.run(
                [sides[side], os.path.abspath(__file__), "--once", *sizes],
                cwd=trees[side],
                capture_output=True,
                text=True,
                check=True,
            )
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            assert Path(result["kstore"]).parent == trees[side], result["kstore"]
            runs[side].append({"round": rnd, "load1": loads[-1], **result})
            print(side, rnd, {k: round(v, 2) for k, v in result.items() if isinstance(v, float)})
    loads.append(os.getloadavg()[0])
    summary: dict[str, Any] = {}
    for case in (*RATES, *LATENCIES) if args.throughput else LATENCIES:
        old = [r[case] for r in runs["old"]]
        new = [r[case] for r in runs["new"]]
        ratios = [b / a for a, b in zip(old, new, strict=True)]
        summary[case] = {
            "old": spread(old),
            "new": spread(new),
            "ratio_new_over_old": {**spread(ratios), "by_round": ratios},
        }
    payload = {
        "benchmark": "hot_paths",
        "command": " ".join([sys.executable, *sys.argv]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{os.uname().machine}, {os.cpu_count()} cores, shared",
        "trees": {side: {"path": str(t), "commit": git_head(t)} for side, t in trees.items()},
        "sizes": sizes,
        "rounds": args.rounds,
        "load1_during": spread(loads),
        "note": "rates in records/s (higher is better); latencies in ms (lower is better)",
        "summary": summary,
        "runs": runs,
    }
    print(
        f"{'case':<16}{'old median (range)':>34}{'new median (range)':>34}{'new/old (range)':>24}"
    )
    for case, row in summary.items():
        o, n, r = row["old"], row["new"], row["ratio_new_over_old"]
        print(
            f"{case:<16}{o['median']:>12,.2f} ({o['min']:,.2f}-{o['max']:,.2f})"
            f"{n['median']:>12,.2f} ({n['min']:,.2f}-{n['max']:,.2f})"
            f"{r['median']:>10.3f} ({r['min']:.3f}-{r['max']:.3f})"
        )
    print(f"load average (1 min) during: {payload['load1_during']}")
    if args.out:
        Path(args.out).write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", help="the old tree's venv python")
    parser.add_argument("--new", help="the new tree's venv python")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", help="where to write the JSON figures")
    parser.add_argument("--send-records", type=int, default=1_500_000)
    parser.add_argument("--batch-records", type=int, default=3_000_000)
    parser.add_argument("--rate", type=float, default=5000.0, help="latency: records per second")
    parser.add_argument("--seconds", type=float, default=4.0, help="latency: per case")
    parser.add_argument("--once", action="store_true", help="one round here, JSON on stdout")
    parser.add_argument(
        "--latency-only", dest="throughput", action="store_false", help="only the latencies"
    )
    args = parser.parse_args()
    if args.once:
        print(json.dumps(measure_once(args)))
    elif args.old and args.new:
        compare(args)
    else:
        parser.error("give --old and --new, or --once")


if __name__ == "__main__":
    main()
