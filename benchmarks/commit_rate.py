"""Commits per second one log sustains on SeaweedFS, with 1, 2 and 4 writer processes.

A commit is a put-if-absent of the next numbered file (PROTOCOL 12.1); a writer that loses a
race moves to the next number. This is the ceiling of any design in which writers share one
commit log, so it is measured before choosing how many logs a topic's partitions share
(format version 3). Each writer process commits as fast as it can for ``--seconds``; the
result is total commits per second, conflicts, and each commit's latency.

    .venv/bin/python benchmarks/commit_rate.py --seconds 10
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import median, percentile, table, write_results
from kstore.storage import Storage


def _writer(url: str, options: dict[str, Any], seconds: float, out: Any) -> None:
    storage = Storage(url, options)
    version, commits, conflicts, latencies = 0, 0, 0, []
    deadline = time.monotonic() + seconds
    body = b'{"commitInfo":{}}\n' + b"x" * 200
    while time.monotonic() < deadline:
        started = time.perf_counter()
        try:
            storage.put_if_absent(f"_log/{version:020d}.json", body)
            commits += 1
            latencies.append(time.perf_counter() - started)
        except FileExistsError:
            conflicts += 1
        version += 1
    out.put((commits, conflicts, latencies))


def measure(url: str, options: dict[str, Any], writers: int, seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(f"{url}/w{writers}", options, seconds, out))
        for _ in range(writers)
    ]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    commits = sum(r[0] for r in results)
    latencies = [x for r in results for x in r[2]]
    return {
        "writers": writers,
        "commits_per_s": round(commits / seconds, 1),
        "conflicts": sum(r[1] for r in results),
        "p50_ms": round(median(latencies) * 1000, 2) if latencies else None,
        "p99_ms": round(percentile(latencies, 99) * 1000, 2) if latencies else None,
        "max_ms": round(max(latencies) * 1000, 1) if latencies else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--writers", default="1,2,4")
    args = parser.parse_args()
    from tests.servers import SeaweedServer

    server = SeaweedServer()
    server.start()
    try:
        rows = []
        for n in (int(x) for x in args.writers.split(",")):
            url, options = server.new_store_url("commit-rate")
            rows.append(measure(url, options, n, args.seconds))
            print(rows[-1], flush=True)
    finally:
        server.kill()
    columns = ["writers", "commits_per_s", "conflicts", "p50_ms", "p99_ms", "max_ms"]
    print(table(rows, columns))
    write_results("commit_rate", {"rows": rows, "seconds": args.seconds})


if __name__ == "__main__":
    main()
