"""Requests and end-to-end latency on SeaweedFS as the partition count grows.

One producer process sends keyed 100-byte records at a fixed rate (linger 0, acks=1) to a topic
of 1, 8 or 64 partitions; one consumer in this process tails every partition and measures
send-to-receive time from the timestamp in each value. Each side counts the S3 requests it sends
(PUT, GET, HEAD, LIST, DELETE; ``Storage.count_requests``, every HTTP attempt). Then the producer
stops and the consumer polls an idle topic for ``--idle-seconds``: its requests per poll.

The same record rate at every partition count, so what grows is what the format costs per
partition. The cases take turns over ``--rounds`` rounds and report medians (and ranges).

    .venv/bin/python benchmarks/requests.py --rate 500 --seconds 10 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import percentile, table, write_results
from kstore import Store
from kstore.consumer import Consumer

PRODUCER_SCRIPT = r"""
import json, struct, sys, time
from kstore import Store
from kstore.producer import Producer
url, options, rate, seconds = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
store = Store(url, options, create=False)
with Producer(store, acks=1, linger_ms=0) as producer:
    producer.partitions_for("req")
    print("ready", flush=True)
    sys.stdin.readline()
    with store.storage.count_requests() as counts:
        interval = 1.0 / rate
        start = time.perf_counter()
        i = 0
        while time.perf_counter() - start < seconds:
            due = start + i * interval
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            producer.send("req", struct.pack(">d", time.time()) + b"x" * 92, b"k%d" % i)
            i += 1
        producer.flush()
        elapsed = time.perf_counter() - start
    print(json.dumps({"sent": i, "elapsed": elapsed, "requests": dict(counts)}), flush=True)
"""

RECORD_BYTES = 100 + 8  # value and a key of about 8 bytes


def run_case(url: str, options: dict[str, Any], partitions: int, args: Any) -> dict[str, Any]:
    store = Store(url, options)
    store.create_topic("req", partitions=partitions)
    consumer = Consumer("req", store=store, auto_offset_reset="latest", fetch_max_wait_ms=5)
    consumer.poll(timeout_ms=0)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            PRODUCER_SCRIPT,
            url,
            json.dumps(options),
            str(args.rate),
            str(args.seconds),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdin is not None
    proc.stdout.readline()
    samples: list[float] = []
    with store.storage.count_requests() as consumed:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        started = time.perf_counter()
        deadline = time.time() + args.seconds + 30
        expected = int(args.rate * args.seconds * 0.98)
        while time.time() < deadline and len(samples) < expected:
            for records in consumer.poll(timeout_ms=50).values():
                now = time.time()
                samples.extend((now - struct.unpack(">d", r.value[:8])[0]) * 1000 for r in records)
        consume_elapsed = time.perf_counter() - started
        consume_requests = dict(consumed)
    produced = json.loads(proc.stdout.readline())
    proc.wait()
    with store.storage.count_requests() as idle:
        polls = 0
        idle_end = time.perf_counter() + args.idle_seconds
        while time.perf_counter() < idle_end:
            consumer.poll(timeout_ms=0)
            polls += 1
            time.sleep(0.1)
        idle_requests = dict(idle)
    consumer.close()
    warm = samples[len(samples) // 10 :]
    mb = produced["sent"] * RECORD_BYTES / 1e6
    produce_total = sum(produced["requests"].values())
    consume_total = sum(consume_requests.values())
    return {
        "partitions": partitions,
        "sent": produced["sent"],
        "received": len(samples),
        "p50_ms": percentile(warm, 50),
        "p99_ms": percentile(warm, 99),
        "produce_requests": produced["requests"],
        "produce_requests_per_s": produce_total / produced["elapsed"],
        "produce_requests_per_mb": produce_total / mb,
        "consume_requests": consume_requests,
        "consume_requests_per_s": consume_total / consume_elapsed,
        "consume_requests_per_mb": consume_total / mb,
        "idle_requests_per_poll": sum(idle_requests.values()) / max(polls, 1),
        "idle_requests": idle_requests,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=500.0, help="records per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle-seconds", type=float, default=3.0)
    parser.add_argument("--partitions", default="1,8,64")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from tests.servers import SeaweedServer

    counts = [int(x) for x in args.partitions.split(",")]
    runs: dict[int, list[dict[str, Any]]] = {p: [] for p in counts}
    work = Path(tempfile.mkdtemp(prefix="kstore-bench-req-"))
    server = SeaweedServer(work / "seaweed")
    server.start()
    try:
        for _ in range(args.rounds):
            for partitions in counts:  # the cases take turns, round after round
                url, options = server.new_store_url(f"req-{partitions}")
                result = run_case(url, options, partitions, args)
                runs[partitions].append(result)
                print(json.dumps({k: v for k, v in result.items() if "requests" not in k}))
    finally:
        server.kill()

    def med(p: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[p])

    rows = []
    for p in counts:
        rows.append(
            {
                "partitions": p,
                "p50 ms": med(p, "p50_ms"),
                "p99 ms": med(p, "p99_ms"),
                "produce req/s": med(p, "produce_requests_per_s"),
                "produce req/MB": med(p, "produce_requests_per_mb"),
                "consume req/s": med(p, "consume_requests_per_s"),
                "consume req/MB": med(p, "consume_requests_per_mb"),
                "idle req/poll": med(p, "idle_requests_per_poll"),
            }
        )
    first = rows[0]
    for row in rows:
        total = row["produce req/s"] + row["consume req/s"]
        row["total vs first"] = total / (first["produce req/s"] + first["consume req/s"])
    print(table(rows, list(rows[0])))
    print(f"\nwrote {write_results('requests', {'rows': rows, 'runs': runs, 'args': vars(args)})}")


if __name__ == "__main__":
    main()
