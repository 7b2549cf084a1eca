"""Publishing a topic as a Delta table (kstore.lakehouse): bytes, requests and time per
publication on SeaweedFS (or the local disk), against the bytes of the segments it covers.

Each round appends ``--segments`` producer segments of ``--records`` records (``--value-bytes``
each) to every partition of a topic, merges them (``merge_segments``, with publication off so
that it can be measured alone), then times one ``publish_table`` and counts its S3 requests
(``Storage.count_requests``) and the bytes it wrote (its Delta commit: the only file it
writes). Every round adds the newly merged files and removes those the merge replaced. The last
round runs retention (a delete topic) or compaction (a compacted topic) first, so that their
removes are measured too, and checks that ``deltalake`` reads exactly the rows kstore's
consumer reads from the log start.

Run: ``.venv/bin/python benchmarks/delta_publish.py [--backend seaweedfs|local]
[--partitions 8] [--rounds 10] [--segments 4] [--records 2000] [--value-bytes 100]``
Results print as a table and go to benchmarks/results/delta_publish.json.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from kstore.compaction import merge_segments, run_compaction
from kstore.lakehouse import open_table, publish_table
from kstore.retention import run_retention

from benchmarks.common import table, write_results
from kstore import Store
from kstore.consumer import Consumer
from kstore.records import TopicPartition
from kstore.segments import TIMESTAMP_TYPE


def _segment(records: int, value_bytes: int, ts_ms: int, keys: int, rng: Any) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([b"key-%d" % k for k in rng.integers(0, keys, records)], pa.binary()),
            "value": pa.array([rng.bytes(value_bytes) for _ in range(records)], pa.binary()),
            "timestamp": pa.array([ts_ms * 1000] * records, pa.int64()).cast(TIMESTAMP_TYPE),
        }
    )


def _consumer_rows(store: Store, topic: str, partitions: int) -> int:
    consumer = Consumer(store=store, auto_offset_reset="earliest")
    consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
    total, idle = 0, 0
    while idle < 2:
        batch = consumer.poll(timeout_ms=200, max_records=100_000)
        got = sum(len(v) for v in batch.values())
        total += got
        idle = 0 if got else idle + 1
    consumer.close()
    return total


def run_topic(store: Store, policy: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    topic = f"bench-{policy}"
    config: dict[str, Any] = {"table.format": "none", "cleanup.policy": policy}
    if policy == "delete":
        config["retention.bytes"] = 1_000_000  # per partition: retention removes files
    else:
        config.update({"min.cleanable.dirty.ratio": 0.0, "delete.retention.ms": 0})
    store.create_topic(topic, args.partitions, config)
    rng = np.random.default_rng(7)
    rows: list[dict[str, Any]] = []
    for round_no in range(args.rounds):
        ts = int(time.time() * 1000) - 1000
        for p in range(args.partitions):
            part = store.partition(topic, p)
            for _ in range(args.segments):
                part.append(_segment(args.records, args.value_bytes, ts, 5000, rng), durable=False)
        # Publication off while the jobs run (they would publish themselves): measured alone.
        store.alter_topic_config(topic, {"table.format": "none"})
        merge_segments(None, store, topics=[topic], verbose=False)
        step = "merge"
        if round_no == args.rounds - 1:
            if policy == "delete":
                run_retention(None, store, topics=[topic], verbose=False)
                step = "merge+retention"
            else:
                run_compaction(None, store, topics=[topic], verbose=False)
                step = "merge+compaction"
        store.alter_topic_config(topic, {"table.format": "delta"})
        counts: dict[str, int] = {}
        started = time.perf_counter()
        if store.storage.counts_requests:
            with store.storage.count_requests() as counted:
                report = publish_table(store, topic)
            counts = dict(counted)
        else:
            report = publish_table(store, topic)
        elapsed = time.perf_counter() - started
        rows.append(
            {
                "topic": policy,
                "round": round_no,
                "after": step,
                "version": report.version,
                "added": report.files_added,
                "removed": report.files_removed,
                "covered_MB": report.bytes_covered / 1e6,
                "written_B": report.bytes_written,
                "ratio": report.bytes_written / max(report.bytes_covered, 1),
                "ms": elapsed * 1000,
                "GET": counts.get("GET", 0),
                "PUT": counts.get("PUT", 0),
                "LIST": counts.get("LIST", 0),
                "requests": sum(counts.values()),
            }
        )
        print(rows[-1], flush=True)
    delta = open_table(store, topic).to_pyarrow_table().num_rows
    consumed = _consumer_rows(store, topic, args.partitions)
    rows[-1]["delta_rows"] = delta
    rows[-1]["consumer_rows"] = consumed
    if delta != consumed:
        raise SystemExit(f"{topic}: deltalake reads {delta} rows, kstore's consumer {consumed}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["seaweedfs", "local"], default="seaweedfs")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--segments", type=int, default=4)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--value-bytes", type=int, default=100)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kstore-bench-delta-"))
    server: Any = None
    if args.backend == "seaweedfs":
        from tests.servers import SeaweedServer

        server = SeaweedServer(work / "seaweed")
        server.start()
        url, options = server.new_store_url("delta")
    else:
        url, options = str(work / "store"), {}
    try:
        store = Store(url, options)
        rows = run_topic(store, "delete", args) + run_topic(store, "compact", args)
    finally:
        if server is not None:
            server.kill()
    columns = [
        "topic",
        "round",
        "after",
        "version",
        "added",
        "removed",
        "covered_MB",
        "written_B",
        "ratio",
        "ms",
        "GET",
        "PUT",
        "LIST",
        "requests",
    ]
    print(table(rows, columns))
    steady = [r for r in rows if r["round"] > 0]
    summary = {
        "median_ms": statistics.median(r["ms"] for r in steady),
        "median_requests": statistics.median(r["requests"] for r in steady),
        "median_written_B": statistics.median(r["written_B"] for r in steady),
        "median_ratio": statistics.median(r["ratio"] for r in steady if r["covered_MB"]),
        "rows_equal": {
            r["topic"]: (r["delta_rows"], r["consumer_rows"]) for r in rows if "delta_rows" in r
        },
    }
    print(summary)
    write_results(
        "delta_publish", {"backend": args.backend, "args": vars(args), "rows": rows, **summary}
    )


if __name__ == "__main__":
    main()
