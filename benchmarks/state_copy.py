"""What does a commit cost a reader or writer, as a function of the partition's state size?

Every reader and writer of a topic log copies the state of each partition a commit changes
before it applies the commit's actions to it (states handed out are never changed). This
benchmark times that step, a copy and one appended segment, for:

- ``small`` (the baseline): a partition with 100 live segments and no removed files;
- ``large``: 7,000 live segments and 36,000 removed files awaiting vacuum, the steady state
  of a partition in docs/OPERATIONS.md's cost example (merges every 10 minutes over 7 days of
  retention, hourly vacuum).

The cases take turns over several rounds; the medians of the rounds and their ratio
(large / small) are printed and written to benchmarks/results/state_copy.json. A ratio near
1 means a commit's cost does not grow with the state.

Run: ``.venv/bin/python benchmarks/state_copy.py [--commits 2000] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import median, write_results
from kstore.manifest import PartitionState

CASES = {"small": (100, 0), "large": (7_000, 36_000)}


def _add(n: int) -> dict[str, Any]:
    return {
        "path": f"segments/{n:020d}.arrow",
        "baseOffset": n * 10,
        "lastOffset": n * 10 + 9,
        "records": 10,
        "size": 4_096,
        "minTimestamp": 1,
        "maxTimestamp": 2,
        "checksum": "0" * 16,
        "format": "arrow",
    }


def build(segments: int, removed: int) -> PartitionState:
    state = PartitionState()
    for n in range(segments):
        state.apply("add", _add(n))
    for n in range(removed):
        state.apply("tombstone", {"path": f"segments/r{n:020d}.arrow", "deletionTimestamp": 1})
    return state


def per_commit_us(state: PartitionState, commits: int) -> float:
    """Microseconds per commit: copy the state, append one segment (as replay does)."""
    next_n = len(state.segments)
    started = time.perf_counter()
    for _ in range(commits):
        state = state.copy()
        state.apply("add", _add(next_n))
        next_n += 1
    return (time.perf_counter() - started) / commits * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--commits", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.commits < 1 or args.rounds < 1:
        raise SystemExit("--commits and --rounds must be at least 1")
    states = {name: build(*size) for name, size in CASES.items()}
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for round_no in range(args.rounds):
        order = list(CASES) if round_no % 2 == 0 else list(CASES)[::-1]
        for name in order:
            times[name].append(per_commit_us(states[name], args.commits))
    medians = {name: median(values) for name, values in times.items()}
    ratio = medians["large"] / medians["small"]
    for name, (segments, removed) in CASES.items():
        values = times[name]
        print(
            f"{name:6} {segments:>6,} live segments, {removed:>6,} removed: "
            f"{medians[name]:8.1f} us per commit ({min(values):.1f}-{max(values):.1f})"
        )
    print(f"large / small: {ratio:.2f}")
    path = write_results(
        "state_copy",
        {
            "cases": {
                name: {"live_segments": s, "removed": r, "us_per_commit": times[name]}
                for name, (s, r) in CASES.items()
            },
            "median_us_per_commit": medians,
            "ratio_large_to_small": ratio,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
