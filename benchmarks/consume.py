"""Consumer throughput and end-to-end latency, beside their baselines in the same run.

1. ``poll()`` (Python records) and ``poll_batches()`` (Arrow) over N records (10M by default)
   in 8 partitions on local disk, against pyarrow reading the same segments directly (the
   floor: no manifest, no checksums, no positions), each read ``--repeat`` times; each
   ``poll_batches()`` run's minor page faults are recorded (a read into fresh pages runs at
   about half the speed of one into reused memory). Kafka's single consumer, 940,521/s, is
   printed as a reference: a published figure, not a baseline.
2. End-to-end latency: a producer process sends 5,000 records/s (linger 0); this process
   polls and measures send-to-receive time from the timestamp in each value; p50 and p99 on
   local disk and on SeaweedFS (started here on loopback).

Run: ``.venv/bin/python benchmarks/consume.py [--records 10000000]``; writes
benchmarks/results/consume.json.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import percentile, table, write_results
from kstore import Store
from kstore.consumer import Consumer
from kstore.manifest import segment_location
from kstore.producer import Producer
from kstore.segments import HEADERS_TYPE, RECORD_SCHEMA, TIMESTAMP_TYPE

VALUE = b"v" * 100


def fill(root: str, n: int) -> Store:
    store = Store(root)
    store.create_topic("t", partitions=8)
    chunk = 500_000
    with Producer(store, acks=1) as producer:
        for start in range(0, n, chunk):
            size = min(chunk, n - start)
            keys = pa.array(
                [b"%08d" % (i % 1_000_000) for i in range(start, start + size)], pa.binary()
            )
            data = pa.Table.from_arrays(
                [
                    keys,
                    pa.array([VALUE] * size, pa.binary()),
                    pa.array(np.full(size, int(time.time() * 1e6)), TIMESTAMP_TYPE),
                    pa.nulls(size, HEADERS_TYPE),
                ],
                schema=RECORD_SCHEMA,
            )
            producer.send_batch("t", data)
    return store


def consume_batches(store: Store, n: int) -> float:
    consumer = Consumer(
        "t",
        store=store,
        auto_offset_reset="earliest",
        max_poll_records=500_000,
        fetch_max_bytes=1 << 30,
        max_partition_fetch_bytes=256 << 20,
    )
    got = 0
    started = time.perf_counter()
    while got < n:
        for batches in consumer.poll_batches(timeout_ms=1_000).values():
            got += sum(b.num_rows for b in batches)
    elapsed = time.perf_counter() - started
    consumer.close()
    return n / elapsed


def consume_records(store: Store, n: int) -> float:
    consumer = Consumer(
        "t",
        store=store,
        auto_offset_reset="earliest",
        max_poll_records=50_000,
        fetch_max_bytes=1 << 30,
        max_partition_fetch_bytes=64 << 20,
    )
    got = 0
    checksum = 0
    started = time.perf_counter()
    while got < n:
        for records in consumer.poll(timeout_ms=1_000).values():
            got += len(records)
            checksum += records[-1].offset  # touch the records as an application would
    elapsed = time.perf_counter() - started
    consumer.close()
    return n / elapsed


def pyarrow_floor(store: Store) -> float:
    """Read every segment of the topic with pyarrow alone: the segment's bytes (its file, or
    its range of a data object), then the IPC reader over them (what kstore does,
    less the manifest, checksum and positions)."""
    meta = store.topic("t")
    pieces: list[tuple[str, tuple[int, int] | None]] = []
    for p in range(meta.partitions):
        partition = store.partition("t", p)
        for seg in partition.state().segments:
            location = segment_location(partition.directory, seg.path)
            pieces.append((os.path.join(store.storage.root, location), seg.byte_range))
    rows = 0
    started = time.perf_counter()
    for path, byte_range in pieces:
        with open(path, "rb") as f:
            if byte_range is None:
                data = f.read()
            else:
                f.seek(byte_range[0])
                data = f.read(byte_range[1])
        rows += ipc.open_file(pa.py_buffer(data)).read_all().num_rows
    return rows / (time.perf_counter() - started)


PRODUCER_SCRIPT = r"""
import struct, sys, time, json
from kstore import Store
from kstore.producer import Producer
url, options, rate, seconds = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
store = Store(url, options, create=False)
with Producer(store, acks=1, linger_ms=0) as producer:
    producer.partitions_for("lat")
    print("ready", flush=True)
    sys.stdin.readline()
    interval = 1.0 / rate
    start = time.perf_counter()
    i = 0
    while time.perf_counter() - start < seconds:
        due = start + i * interval
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        producer.send("lat", struct.pack(">d", time.time()) + b"x" * 92, b"%d" % (i % 64))
        i += 1
"""


def latency(url: str, options: dict[str, Any], rate: float, seconds: float) -> dict[str, float]:
    import json

    store = Store(url, options)
    store.create_topic("lat", partitions=1)
    consumer = Consumer("lat", store=store, auto_offset_reset="latest", fetch_max_wait_ms=5)
    consumer.poll(timeout_ms=0)
    proc = subprocess.Popen(
        [sys.executable, "-c", PRODUCER_SCRIPT, url, json.dumps(options), str(rate), str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdin is not None
    proc.stdout.readline()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    samples: list[float] = []
    deadline = time.time() + seconds + 10
    expected = int(rate * seconds * 0.95)
    while time.time() < deadline and (proc.poll() is None or len(samples) < expected):
        for records in consumer.poll(timeout_ms=50).values():
            now = time.time()
            samples.extend((now - struct.unpack(">d", r.value[:8])[0]) * 1000 for r in records)
        if proc.poll() is not None and not consumer.poll(timeout_ms=200):
            break
    proc.wait()
    consumer.close()
    warm = samples[len(samples) // 10 :]  # skip the first tenth: process start-up effects
    return {
        "p50_ms": percentile(warm, 50),
        "p99_ms": percentile(warm, 99),
        "received": len(samples),
        "rate": rate,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=1, help="reads of each kind, in turn")
    args = parser.parse_args()
    n = args.records
    work = tempfile.mkdtemp(prefix="kstore-bench-")
    results: dict[str, Any] = {"records": n}
    rows = []
    try:
        store = fill(os.path.join(work, "store"), n)
        runs: dict[str, list[float]] = {"floor": [], "batches": [], "faults": [], "records": []}
        for _ in range(args.repeat):  # each kind in turn: a slow spell falls on all
            runs["floor"].append(pyarrow_floor(store))
            # Minor page faults of the read: a read whose buffers come from fresh pages (the
            # allocator gave memory back in between) runs at about half the speed of one that
            # reuses them. Kept to tell the two apart.
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            runs["batches"].append(consume_batches(Store(store.url), n))
            runs["faults"].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
            runs["records"].append(consume_records(Store(store.url), n))
        med = {name: statistics.median(values) for name, values in runs.items()}
        floor, batches, records = med["floor"], med["batches"], med["records"]
        results.update(pyarrow_floor=floor, poll_batches=batches, poll=records, runs=runs)

        def spread(name: str) -> str:
            values = runs[name]
            return f"runs {min(values):,.0f}-{max(values):,.0f}; " if len(values) > 1 else ""

        rows.append(
            {
                "case": "poll_batches()",
                "records/s": batches,
                "baseline": f"{spread('batches')}pyarrow {floor:,.0f}/s",
                "ratio": batches / floor,
            }
        )
        rows.append(
            {
                "case": "poll()",
                "records/s": records,
                "baseline": f"{spread('records')}pyarrow {floor:,.0f}/s",
                "ratio": records / floor,
                # A published figure, not measured here: printed beside, never divided into.
                "reference": "Kafka 2014: 940,521/s",
            }
        )
        shutil.rmtree(os.path.join(work, "store"), ignore_errors=True)
        local = latency(Path(work, "lat").as_uri(), {}, 5_000, args.latency_seconds)
        results["latency_local"] = local
        rows.append(
            {
                "case": "end-to-end latency, local",
                "records/s": local["rate"],
                "baseline": f"p50 {local['p50_ms']:.2f} ms, p99 {local['p99_ms']:.2f} ms",
                "ratio": "",
            }
        )
        from tests.servers import SeaweedServer

        server = SeaweedServer(Path(work, "seaweed"))
        server.start()
        try:
            url, options = server.new_store_url()
            remote = latency(url, options, 500, args.latency_seconds)
        finally:
            server.kill()
        results["latency_seaweedfs"] = remote
        rows.append(
            {
                "case": "end-to-end latency, SeaweedFS",
                "records/s": remote["rate"],
                "baseline": f"p50 {remote['p50_ms']:.2f} ms, p99 {remote['p99_ms']:.2f} ms",
                "ratio": "",
            }
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows, ["case", "records/s", "baseline", "ratio", "reference"]))
    print(f"\nwrote {write_results('consume', results)}")


if __name__ == "__main__":
    main()
