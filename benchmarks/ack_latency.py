"""A producer's acknowledgement latency at a steady rate, by partition count, on the local disk:
the sender's delivery policy against the overlap-always policy it replaced, in the same run.

One producer (keyed 100-byte records, linger 0, acks=1) sends ``--rate`` records/s for
``--seconds`` to a topic of 1, 8 or 64 partitions; each record's time from ``send()`` to its
callback is kept. Two sides alternate, case by case, over ``--rounds`` rounds: **current**, the
sender as it is (a small delivery on a local disk finished before the next group is converted,
``Sender._overlaps``), and **overlap**, the next group always converted while the previous
delivery is written (the policy before). Medians over the rounds with their ranges, and the
ratio current/overlap taken round by round (the two sides ran back to back), its median and
range.

Run: ``.venv/bin/python benchmarks/ack_latency.py --rounds 3``; writes
benchmarks/results/ack_latency.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import percentile, table, write_results
from kstore import Store
from kstore.producer import Producer
from kstore.sender import Sender

VALUE = b"v" * 100


def _always_overlaps(_sender: Sender, _work: list[Any]) -> bool:
    return True


@contextlib.contextmanager
def policy(side: str) -> Iterator[None]:
    if side == "overlap":
        with mock.patch.object(Sender, "_overlaps", _always_overlaps):
            yield
    else:
        yield


def run_case(partitions: int, rate: float, seconds: float, side: str) -> dict[str, float]:
    root = tempfile.mkdtemp(prefix="kstore-acks-")
    try:
        store = Store(root)
        store.create_topic("t", partitions=partitions)
        latencies: list[float] = []

        def acknowledged(sent_at: float, _metadata: Any) -> None:
            latencies.append((time.perf_counter() - sent_at) * 1000)

        with policy(side), Producer(store, acks=1, linger_ms=0) as producer:
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
        return {
            "p50_ms": percentile(latencies, 50),
            "p99_ms": percentile(latencies, 99),
            "records": len(latencies),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=5000.0, help="records per second")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--partitions", default="1,8,64")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    counts = [int(p) for p in args.partitions.split(",")]
    runs: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    for rnd in range(args.rounds):
        sides = ["overlap", "current"] if rnd % 2 == 0 else ["current", "overlap"]
        for partitions in counts:
            for side in sides:
                result = run_case(partitions, args.rate, args.seconds, side)
                runs.append({"round": rnd, "partitions": partitions, "side": side, **result})
                print(runs[-1], flush=True)
    by_case = {(r["round"], r["partitions"], r["side"]): r for r in runs}
    rows = []
    for partitions in counts:
        row: dict[str, Any] = {"partitions": partitions}
        for side in ("current", "overlap"):
            cases = [by_case[(rnd, partitions, side)] for rnd in range(args.rounds)]
            p50s = [c["p50_ms"] for c in cases]
            row[f"{side} p50 ms"] = (
                f"{statistics.median(p50s):.2f} ({min(p50s):.2f}-{max(p50s):.2f})"
            )
            row[f"{side} p99 ms"] = f"{statistics.median(c['p99_ms'] for c in cases):.1f}"
        pairs = [
            by_case[(rnd, partitions, "current")]["p50_ms"]
            / by_case[(rnd, partitions, "overlap")]["p50_ms"]
            for rnd in range(args.rounds)
        ]
        # Pair by pair (the two sides of a round ran back to back), then the median.
        row["ratio p50"] = f"{statistics.median(pairs):.3f} ({min(pairs):.3f}-{max(pairs):.3f})"
        rows.append(row)
    columns = list(rows[0])
    print(table(rows, columns))
    path = write_results(
        "ack_latency",
        {
            "rate": args.rate,
            "seconds": args.seconds,
            "rounds": args.rounds,
            "load_before": load_before,
            "load_after": os.getloadavg(),
            "summary": rows,
            "runs": runs,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
