"""Producer throughput and latency, each beside its baseline in the same run.

1. keyed ``send()`` of 100-byte values with 8-byte keys into 8 partitions on local disk, at
   acks=1, acks=all and acks=0, each run several times in turn (Kafka's classic single producer,
   821,557 records/s, is printed as a reference: a published figure, not a baseline);
2. ``send_batch()`` of the same records, against pyarrow's IPC writer alone writing the same
   records partitioned the same way (the floor), the two in turn ``--repeat`` times;
3. small appends of 1,000 records: a kstore commit per batch against ``deltalake.write_deltalake``
   of the same batch (the peer a Spark user would otherwise pick): commits/s and records/s;
4. produce latency (send, then wait for the acknowledgement; linger 0): p50 and p99 on local
   disk and on SeaweedFS (started here on loopback);
5. 4 producer processes appending to one partition: throughput, and a check that every
   acknowledged record is there exactly once.

Each ``send()`` case runs ``--repeat`` times (the three acks levels in turn) and reports the
median and the range.

Run: ``.venv/bin/python benchmarks/produce.py [--records 1000000] [--repeat 5]``; writes
benchmarks/results/produce.json.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import percentile, table, timed, write_results
from kstore import Store
from kstore.partitioner import partition_keys_murmur2
from kstore.producer import Producer
from kstore.segments import HEADERS_TYPE, RECORD_SCHEMA, TIMESTAMP_TYPE

VALUE = b"v" * 100


def keys_for(n: int) -> list[bytes]:
    return [b"%08d" % (i % 100_000) for i in range(n)]


def warm_up(root: str, n: int) -> None:
    """Send records once before measuring, as any benchmark of a long-running producer does:
    the first pass pays for imports, the allocator's first pages and the caches."""
    store = Store(root)
    store.create_topic("warm", partitions=8)
    with Producer(store, acks=1) as producer:
        for key in keys_for(n):
            producer.send("warm", VALUE, key)


def bench_send(root: str, n: int, acks: Any) -> float:
    store = Store(root)
    store.create_topic("t", partitions=8)
    keys = keys_for(n)
    with Producer(store, acks=acks, linger_ms=5) as producer:
        send = producer.send
        started = time.perf_counter()
        for key in keys:
            send("t", VALUE, key)
        producer.flush()
        elapsed = time.perf_counter() - started
    total = sum(d.records for d in store.describe_topic("t").partitions)
    assert total == n, f"lost records: {total} != {n}"
    return n / elapsed


def records_table(n: int) -> pa.Table:
    keys = pa.array(keys_for(n), pa.binary())
    now = int(time.time() * 1_000_000)
    return pa.Table.from_arrays(
        [
            keys,
            pa.array([VALUE] * n, pa.binary()),
            pa.array(np.full(n, now), TIMESTAMP_TYPE),
            pa.nulls(n, HEADERS_TYPE),
        ],
        schema=RECORD_SCHEMA,
    )


def bench_send_batch(root: str, data: pa.Table, chunk: int) -> float:
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
    return data.num_rows / elapsed


def bench_ipc_floor(root: str, data: pa.Table, chunk: int) -> float:
    """pyarrow alone: hash the keys the same way, split by partition, write an IPC file per
    partition and chunk (what a segment is), no manifest."""
    os.makedirs(root, exist_ok=True)
    started = time.perf_counter()
    for c, i in enumerate(range(0, data.num_rows, chunk)):
        piece = data.slice(i, chunk)
        parts = np.asarray(partition_keys_murmur2(piece.column("key"), 8))
        order = np.argsort(parts, kind="stable")
        sorted_piece = piece.take(pa.array(order))
        counts = np.bincount(parts, minlength=8)
        start = 0
        for p, count in enumerate(counts):
            if not count:
                continue
            with ipc.new_file(os.path.join(root, f"{c}-{p}.arrow"), RECORD_SCHEMA) as writer:
                writer.write_table(sorted_piece.slice(start, int(count)))
            start += int(count)
    return data.num_rows / (time.perf_counter() - started)


def bench_small_appends(root: str, batches: int, size: int) -> dict[str, float]:
    import deltalake

    data = records_table(size)
    store = Store(os.path.join(root, "ks"))
    store.create_topic("t", partitions=1)
    partition = store.partition("t", 0)
    ks_time, _ = timed(lambda: [partition.append(data, durable=False) for _ in range(batches)])
    delta_path = os.path.join(root, "delta")
    plain = data.drop_columns(["headers"])
    dl_time, _ = timed(
        lambda: [
            deltalake.write_deltalake(delta_path, plain, mode="append") for _ in range(batches)
        ]
    )
    return {
        "kstore_commits_per_s": batches / ks_time,
        "kstore_records_per_s": batches * size / ks_time,
        "delta_commits_per_s": batches / dl_time,
        "delta_records_per_s": batches * size / dl_time,
    }


def bench_latency(url: str, options: dict[str, Any], n: int) -> dict[str, float]:
    store = Store(url, options)
    store.create_topic("lat", partitions=1)
    samples = []
    with Producer(store, acks=1, linger_ms=0) as producer:
        producer.send("lat", VALUE, b"warmup").get()
        for i in range(n):
            started = time.perf_counter()
            producer.send("lat", VALUE, b"%08d" % i).get()
            samples.append((time.perf_counter() - started) * 1000)
    return {"p50_ms": percentile(samples, 50), "p99_ms": percentile(samples, 99), "samples": n}


def _worker(root: str, wid: int, n: int, ready: Any, go: Any, queue: Any) -> None:
    with Producer(Store(root, create=False), acks=1, linger_ms=5) as producer:
        producer.partitions_for("one")
        ready.put(wid)
        go.wait()  # start together, after every process has imported and opened the store
        futures = [producer.send("one", b"%d:%d" % (wid, i) + VALUE[:90], b"k") for i in range(n)]
        producer.flush()
        queue.put((sum(1 for f in futures if f.succeeded()), time.time()))


def bench_processes(root: str, procs: int, per_proc: int) -> dict[str, Any]:
    store = Store(root)
    store.create_topic("one", partitions=1)
    ctx = multiprocessing.get_context("spawn")
    ready, done, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    workers = [
        ctx.Process(target=_worker, args=(root, w, per_proc, ready, go, done)) for w in range(procs)
    ]
    for w in workers:
        w.start()
    for _ in workers:
        ready.get()
    started = time.time()
    go.set()
    results = [done.get() for _ in workers]
    for w in workers:
        w.join()
    acked = sum(r[0] for r in results)
    elapsed = max(r[1] for r in results) - started
    partition = Store(root, create=False).partition("one", 0)
    values = [v for b in partition.read(0) for v in b.column("value").to_pylist()]
    offsets = [o for b in partition.read(0) for o in b.column("offset").to_pylist()]
    ok = len(values) == len(set(values)) == acked == procs * per_proc and offsets == list(
        range(len(offsets))
    )
    return {
        "records_per_s": acked / elapsed,
        "acknowledged": acked,
        "read_back": len(values),
        "duplicates": len(values) - len(set(values)),
        "nothing_lost": ok,
        "commits": partition.state().version + 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--latency-samples", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5, help="runs of each send() case")
    parser.add_argument("--send-only", action="store_true", help="only the send() cases")
    args = parser.parse_args()
    n = args.records
    work = tempfile.mkdtemp(prefix="kstore-bench-")
    results: dict[str, Any] = {"records": n}
    rows = []
    try:
        warm_up(os.path.join(work, "warm"), min(n, 500_000))
        # The acks levels take turns, run after run, so that a slow spell of this shared
        # machine falls on all of them alike; each reports its median and its range.
        runs: dict[Any, list[float]] = {acks: [] for acks in (1, "all", 0)}
        for attempt in range(args.repeat):
            for acks, rates in runs.items():
                directory = os.path.join(work, f"send-{acks}-{attempt}")
                rates.append(bench_send(directory, n, acks))
                shutil.rmtree(directory, ignore_errors=True)  # keep the page cache small
        for acks, rates in runs.items():
            rate = statistics.median(rates)
            results[f"send_acks_{acks}"] = rate
            results[f"send_acks_{acks}_runs"] = rates
            rows.append(
                {
                    "case": f"send() acks={acks}",
                    "records/s": rate,
                    "baseline": f"runs {min(rates):,.0f}-{max(rates):,.0f}",
                    # A published figure, not measured here: printed beside, never divided into.
                    "reference": "Kafka 2014: 821,557/s",
                }
            )
        if args.send_only:
            print(table(rows, ["case", "records/s", "baseline", "ratio", "reference"]))
            return
        data = records_table(n)
        chunk = 100_000
        batch_runs: dict[str, list[float]] = {"floor": [], "kstore": []}
        for attempt in range(args.repeat):  # the two in turn: a slow spell falls on both
            for side, rates in batch_runs.items():
                directory = os.path.join(work, f"batch-{side}-{attempt}")
                if side == "floor":
                    rates.append(bench_ipc_floor(directory, data, chunk))
                else:
                    rates.append(bench_send_batch(directory, data, chunk))
                shutil.rmtree(directory, ignore_errors=True)
        floor, batch_rate = (statistics.median(r) for r in batch_runs.values())
        results.update(
            send_batch=batch_rate,
            send_batch_runs=batch_runs["kstore"],
            ipc_floor=floor,
            ipc_floor_runs=batch_runs["floor"],
        )
        rows.append(
            {
                "case": "send_batch()",
                "records/s": batch_rate,
                "baseline": f"pyarrow IPC {floor:,.0f}/s; runs "
                f"{min(batch_runs['kstore']):,.0f}-{max(batch_runs['kstore']):,.0f}",
                "ratio": batch_rate / floor,
            }
        )
        small = bench_small_appends(os.path.join(work, "small"), 200, 1_000)
        results["small_appends"] = small
        rows.append(
            {
                "case": "1,000-record commits",
                "records/s": small["kstore_records_per_s"],
                "baseline": f"deltalake {small['delta_records_per_s']:,.0f}/s",
                "ratio": small["kstore_records_per_s"] / small["delta_records_per_s"],
            }
        )
        local = bench_latency(Path(work, "lat").as_uri(), {}, args.latency_samples)
        results["latency_local"] = local
        from tests.servers import SeaweedServer

        server = SeaweedServer(Path(work, "seaweed"))
        server.start()
        try:
            url, options = server.new_store_url()
            remote = bench_latency(url, options, args.latency_samples // 2)
        finally:
            server.kill()
        results["latency_seaweedfs"] = remote
        rows.append(
            {
                "case": "latency local p50/p99 ms",
                "records/s": "",
                "baseline": f"{local['p50_ms']:.2f} / {local['p99_ms']:.2f}",
                "ratio": "",
            }
        )
        rows.append(
            {
                "case": "latency SeaweedFS p50/p99 ms",
                "records/s": "",
                "baseline": f"{remote['p50_ms']:.2f} / {remote['p99_ms']:.2f}",
                "ratio": "",
            }
        )
        multi = bench_processes(os.path.join(work, "procs"), 4, max(50_000, n // 4))
        results["four_processes_one_partition"] = multi
        rows.append(
            {
                "case": "4 processes, 1 partition",
                "records/s": multi["records_per_s"],
                "baseline": f"nothing lost: {multi['nothing_lost']}",
                "ratio": "",
            }
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(table(rows, ["case", "records/s", "baseline", "ratio", "reference"]))
    print(f"\nwrote {write_results('produce', results)}")


if __name__ == "__main__":
    main()
