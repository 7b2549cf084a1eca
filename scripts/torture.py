#!/usr/bin/env python3
"""The long torture run (not run in CI; docs/RELIABILITY.md).

    .venv/bin/python scripts/torture.py --duration 600 --backend local
    .venv/bin/python scripts/torture.py --duration 600 --seed 12345 --backend seaweed

Runs tests/reliability/torture.py for ``--duration`` seconds with a fresh random seed (printed
first) unless ``--seed`` is given, then checks the whole history. Prints the figures and every
anomaly with its evidence; exits 1 when there is any. ``--backend seaweed`` starts a SeaweedFS
server of its own (on free loopback ports) and stops and restarts it ``--storage-restarts``
times mid-run.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.reliability.torture import Torture, TortureConfig  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    parser.add_argument("--backend", choices=["local", "seaweed"], default="local")
    parser.add_argument("--workdir", default=None, help="history and store (default: a temp dir)")
    parser.add_argument("--fault-rate", type=float, default=0.02)
    parser.add_argument("--thread-producers", type=int, default=2)
    parser.add_argument("--process-producers", type=int, default=2)
    parser.add_argument("--txn-producers", type=int, default=1)
    parser.add_argument("--consumers", type=int, default=3)
    parser.add_argument("--no-spark", action="store_true", help="no Spark streaming copy")
    parser.add_argument("--storage-restarts", type=int, default=3, help="seaweed only")
    parser.add_argument(
        "--skew", type=float, default=0.0, help="clock skew of worker processes, up to S s"
    )
    parser.add_argument(
        "--long-pause", type=float, default=0.0, help="SIGSTOP clients and jobs S s (0: never)"
    )
    parser.add_argument(
        "--machine-crash", action="store_true", help="local only: crash the machine at the end"
    )
    parser.add_argument(
        "--time-jumps",
        type=int,
        default=0,
        help="jumps of every clock by --jump-hours, clients stopped across them (0: none)",
    )
    parser.add_argument("--jump-hours", type=float, default=72.0, help="default 72")
    args = parser.parse_args(argv)

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="kstore-torture-"))
    workdir.mkdir(parents=True, exist_ok=True)
    server = None
    if args.backend == "seaweed":
        from tests.servers import SeaweedServer

        server = SeaweedServer(workdir / "seaweed")
        server.start()
        url, options = server.new_store_url()
    else:
        url, options = (workdir / "store").as_uri(), {}
    config = TortureConfig(
        url=url,
        storage_options=options,
        workdir=str(workdir / "work"),
        duration_s=args.duration,
        seed=args.seed,
        backend=args.backend,
        thread_producers=args.thread_producers,
        process_producers=args.process_producers,
        txn_producers=args.txn_producers,
        consumers=args.consumers,
        fault_rate=args.fault_rate,
        spark=not args.no_spark,
        restart_storage=server.restart if server is not None else None,
        storage_restarts=args.storage_restarts,
        skew_s=args.skew,
        long_pause_s=args.long_pause,
        machine_crash=args.machine_crash,
        time_jumps=args.time_jumps,
        jump_s=args.jump_hours * 3600,
        log=lambda m: print(m, flush=True),
    )
    torture = Torture(config)
    try:
        stats, result = torture.run()
    finally:
        if server is not None:
            server.kill()
    command = "scripts/torture.py " + " ".join(
        shlex.quote(a) for a in [*(argv if argv is not None else sys.argv[1:])]
    )
    print(result.report(), flush=True)
    print(stats.describe(), flush=True)
    summary = {**asdict(stats), "operations": stats.operations(), "command": command}
    (workdir / "stats.json").write_text(json.dumps(summary, indent=2))
    print(f"figures: {workdir / 'stats.json'}; history: {workdir / 'work' / 'history'}")
    print(
        f"replay: .venv/bin/python scripts/torture.py --seed {stats.seed} --backend {args.backend}"
    )
    return 0 if result.ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sys.exit(main())
