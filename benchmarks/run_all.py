"""Run every benchmark (``make bench``) and print one summary table: ratios to
baselines measured in the same run, and published figures (Kafka's) as references only.

Each benchmark runs in its own process, with its baseline in the same run, and writes its JSON
to benchmarks/results/; this script then reads those files and prints the summary (also written
to benchmarks/results/summary.json). ``--quick`` uses smaller sizes for a fast check.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"

FULL: list[list[str]] = [
    ["partitioner.py"],
    ["open_partition.py"],
    ["state_copy.py"],
    ["produce.py", "--records", "1000000"],
    ["ack_latency.py", "--rounds", "3"],
    ["consume.py", "--records", "10000000"],
    ["spark_read.py"],
    ["typed_topics.py"],
    ["compaction.py", "--spark"],
    ["retention.py"],
]
QUICK: list[list[str]] = [
    ["partitioner.py"],
    ["open_partition.py", "--large", "2000", "--repeat", "3"],
    ["state_copy.py", "--commits", "500", "--rounds", "3"],
    ["produce.py", "--records", "200000", "--latency-samples", "100", "--repeat", "1"],
    ["ack_latency.py", "--rounds", "1", "--seconds", "3"],
    ["consume.py", "--records", "1000000", "--latency-seconds", "4"],
    ["spark_read.py", "--records", "500000"],
    ["typed_topics.py", "--records", "300000", "--repeat", "3"],
    ["compaction.py", "--records", "1000000", "--keys", "100000"],
    ["retention.py", "--topics", "2", "--partitions", "100"],
]


def load(name: str) -> dict[str, Any]:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _get(data: Any, *keys: Any) -> Any:
    for key in keys:
        if isinstance(data, dict):
            data = data.get(key)
        elif isinstance(data, list) and isinstance(key, int) and -len(data) <= key < len(data):
            data = data[key]
        else:
            return None
    return data


# Published figures from other systems are references: printed beside a measure, never divided
# into it. A ratio is only ever taken against a baseline measured in the same run.
KAFKA_PRODUCER_2014 = "Kafka 2014: 821,557/s"
KAFKA_CONSUMER_2014 = "Kafka 2014: 940,521/s"
KAFKA_LATENCY_2014 = "Kafka 2014: p50 2 ms, p99 3 ms"


def _row(
    measure: str,
    value: str,
    *,
    baseline: str = "",
    ratio: float | None = None,
    reference: str = "",
    target: str = "",
) -> dict[str, Any]:
    return {
        "measure": measure,
        "value": value,
        "baseline": baseline,
        "ratio": "" if ratio is None else ratio,
        "reference": reference,
        "target": target,
    }


def summary() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    produce, consume = load("produce"), load("consume")
    if produce:
        for acks in ("1", "all", "0"):
            rate = produce.get(f"send_acks_{acks}")
            if rate:
                rows.append(
                    _row(
                        f"send() acks={acks}",
                        f"{rate:,.0f} records/s",
                        reference=KAFKA_PRODUCER_2014,
                        target=">= 1,000,000/s",
                    )
                )
        if produce.get("send_batch"):
            rows.append(
                _row(
                    "send_batch()",
                    f"{produce['send_batch']:,.0f} records/s",
                    baseline="pyarrow IPC writer",
                    ratio=produce["send_batch"] / produce["ipc_floor"],
                    target="ratio >= 0.5",
                )
            )
        small = produce.get("small_appends") or {}
        if small:
            rows.append(
                _row(
                    "1,000-record commits",
                    f"{small['kstore_commits_per_s']:,.0f} commits/s",
                    baseline="deltalake appends",
                    ratio=small["kstore_commits_per_s"] / small["delta_commits_per_s"],
                    target="report",
                )
            )
    if consume:
        rows.append(
            _row(
                "poll_batches()",
                f"{consume['poll_batches']:,.0f} records/s",
                baseline="pyarrow IPC reader",
                ratio=consume["poll_batches"] / consume["pyarrow_floor"],
                target=">= 3,000,000/s",
            )
        )
        rows.append(
            _row(
                "poll()",
                f"{consume['poll']:,.0f} records/s",
                reference=KAFKA_CONSUMER_2014,
                target=">= 940,521/s",
            )
        )
        local = consume.get("latency_local") or {}
        if local:
            rows.append(
                _row(
                    "end-to-end p50/p99 (local)",
                    f"{local['p50_ms']:.2f} / {local['p99_ms']:.2f} ms",
                    reference=KAFKA_LATENCY_2014,
                    target="p50 <= 5 ms",
                )
            )
    spark = load("spark_read")
    if spark.get("parquet_median_s"):
        rows.append(
            _row(
                "spark.read of a topic",
                f"{spark['kstore_median_s']:.2f} s",
                baseline="spark.read.parquet",
                ratio=spark["parquet_median_s"] / spark["kstore_median_s"],
                target="ratio >= 0.7",
            )
        )
    typed = load("typed_topics")
    if typed.get("typed_median_s"):
        rows.append(
            _row(
                "Spark sum over 2 of 20 typed fields",
                f"{typed['typed_median_s']:.2f} s",
                baseline="JSON values + from_json",
                ratio=typed["ratio_json_over_typed"],
                target="ratio > 1",
            )
        )
    compaction = load("compaction")
    rows_c = compaction.get("results") or []
    kstore_c = next((r for r in rows_c if r.get("name") == "kstore"), None)
    duck = next((r for r in rows_c if r.get("name") == "duckdb-qualify"), None)
    if kstore_c and duck and kstore_c.get("median_s") and duck.get("median_s"):
        rows.append(
            _row(
                "compaction",
                f"{kstore_c['median_s']:.2f} s",
                baseline="DuckDB dedup",
                ratio=duck["median_s"] / kstore_c["median_s"],
                target="ratio >= 0.33 (within 3x)",
            )
        )
    opened = load("open_partition")
    if opened.get("ratio_large_history_over_small"):
        rows.append(
            _row(
                "open after 10,000 commits",
                "see open_partition.json",
                baseline="open after 100 commits",
                ratio=1 / opened["ratio_large_history_over_small"],
                target="ratio ~1",
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--summary-only", action="store_true", help="only print the summary of existing results"
    )
    args = parser.parse_args()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    failed = []
    if not args.summary_only:
        for command in QUICK if args.quick else FULL:
            started = time.perf_counter()
            print(f"== {' '.join(command)}", flush=True)
            done = subprocess.run(
                [sys.executable, str(HERE / command[0]), *command[1:]], env=env, cwd=HERE.parent
            )
            print(f"   {time.perf_counter() - started:.0f} s, exit {done.returncode}", flush=True)
            if done.returncode:
                failed.append(command[0])
    rows = summary()
    sys.path.insert(0, str(HERE.parent))
    from benchmarks.common import table, write_results

    print()
    print(table(rows, ["measure", "value", "baseline", "ratio", "reference", "target"]))
    write_results("summary", {"rows": rows, "failed": failed})
    if failed:
        sys.exit(f"benchmarks failed: {', '.join(failed)}")


if __name__ == "__main__":
    main()
