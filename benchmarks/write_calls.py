"""Does the size of one ``write()`` call matter when writing a large file to local disk?

A layout-3 producer flush is one data object holding every partition it touches, so a large
``send_batch()`` writes files of ten MB and more where layout 2 wrote one file per partition.
This benchmark writes the same bytes to new files the two ways, in turn, in one process:

- ``whole``: one ``os.write`` call per file (the kernel is handed the file at once);
- ``chunked``: calls of at most ``kstore.storage.WRITE_CALL_BYTES`` (1 MiB), as
  ``Storage`` writes every file on local disk.

Each round writes ``--files`` files of ``--mb`` MB each way, the two sides taking turns; the
first rounds warm up (a process that has written little is seldom throttled). The files stay
until the end, as a topic's do (about 2.8 GB with the defaults). The medians of
the time per file, their ratio and each round's times are printed and written to
benchmarks/results/write_calls.json. Nothing is fsynced, as for ``acks=1``.

Run: ``.venv/bin/python benchmarks/write_calls.py [--mb 12.8] [--files 10] [--rounds 8]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import table, write_results
from kstore.storage import WRITE_CALL_BYTES


def write_file(path: str, data: memoryview, call_bytes: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = data
        while view:
            view = view[os.write(fd, view[:call_bytes]) :]
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=12.8, help="size of each file, in MB")
    parser.add_argument("--files", type=int, default=10, help="files per side per round")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--warmup-rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.mb <= 0 or args.files < 1 or args.rounds < 1 or args.warmup_rounds < 0:
        raise SystemExit("need --mb > 0, --files >= 1, --rounds >= 1, --warmup-rounds >= 0")
    size = int(args.mb * 1_000_000)
    data = memoryview(os.urandom(size))
    sides = {"whole": size, "chunked": WRITE_CALL_BYTES}
    load_before = [round(x, 2) for x in os.getloadavg()]
    work = tempfile.mkdtemp(prefix="kstore-bench-write-")
    per_file_ms: dict[str, list[float]] = {side: [] for side in sides}
    count = 0
    try:
        for round_no in range(args.warmup_rounds + args.rounds):
            order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
            for side in order:
                started = time.perf_counter()
                for _ in range(args.files):
                    count += 1
                    write_file(os.path.join(work, str(count)), data, sides[side])
                elapsed = (time.perf_counter() - started) / args.files * 1000
                if round_no >= args.warmup_rounds:
                    per_file_ms[side].append(elapsed)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [
        {
            "side": side,
            "call_bytes": sides[side],
            "median_ms": statistics.median(per_file_ms[side]),
            "min_ms": min(per_file_ms[side]),
            "max_ms": max(per_file_ms[side]),
            "MB_per_s": size / 1e6 / (statistics.median(per_file_ms[side]) / 1000),
        }
        for side in sides
    ]
    ratio = statistics.median(per_file_ms["whole"]) / statistics.median(per_file_ms["chunked"])
    print(table(rows, ["side", "call_bytes", "median_ms", "min_ms", "max_ms", "MB_per_s"]))
    print(f"whole / chunked, median time per file: {ratio:.2f}")
    result: dict[str, Any] = {
        "storage": "local disk",
        "file_bytes": size,
        "files_per_round": args.files,
        "rounds": args.rounds,
        "warmup_rounds": args.warmup_rounds,
        "cases": {row["side"]: row for row in rows},
        "runs_ms": per_file_ms,
        "ratio_whole_over_chunked": ratio,
        "load_before": load_before,
    }
    write_results("write_calls", result)
    return result


if __name__ == "__main__":
    main()
