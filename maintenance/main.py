"""Command line of the maintenance service: ``python -m kstore.maintenance`` or spark-submit
with ``--spark`` (the driver plans every interval, executors run the due tasks)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kstore.compaction.jobs import command_line, parse_storage_options

from kstore.store import Store

from .service import Service, handle_stop_signals
from .tasks import (
    DEFAULT_INTERVAL_MS,
    DEFAULT_LEASE_MS,
    DEFAULT_MERGE_MIN_SEGMENTS,
    DEFAULT_VACUUM_INTERVAL_MS,
    Settings,
)


def main(argv: Sequence[str] | None = None) -> int:
    return command_line(_main, argv)


def _log(line: str) -> None:
    print(line, flush=True)


def _main(argv: Sequence[str] | None) -> int:
    parser = argparse.ArgumentParser(
        prog="kstore.maintenance",
        description="Run retention, compaction, merging and vacuum when each topic's config "
        "says they are due, every interval, until SIGTERM.",
    )
    parser.add_argument("--store", required=True, help="store URL (file://, s3://, path)")
    parser.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE", help="storage option"
    )
    parser.add_argument(
        "--topic", action="append", default=[], metavar="NAME", help="only this topic"
    )
    parser.add_argument("--interval-ms", type=int, default=DEFAULT_INTERVAL_MS)
    parser.add_argument("--vacuum-interval-ms", type=int, default=DEFAULT_VACUUM_INTERVAL_MS)
    parser.add_argument("--merge-min-segments", type=int, default=DEFAULT_MERGE_MIN_SEGMENTS)
    parser.add_argument("--lease-ms", type=int, default=DEFAULT_LEASE_MS)
    parser.add_argument("--once", action="store_true", help="one pass, then exit")
    parser.add_argument("--spark", action="store_true", help="run the due tasks on Spark executors")
    args = parser.parse_args(argv)
    try:
        settings = Settings(
            args.interval_ms, args.vacuum_interval_ms, args.merge_min_segments, args.lease_ms
        )
    except ValueError as exc:
        parser.error(str(exc))
    store = Store(
        args.store, parse_storage_options(args.option), create=False, segment_cache_bytes=0
    )
    spark = None
    if args.spark:
        from pyspark.sql import SparkSession

        spark = SparkSession.builder.appName("kstore-maintenance").getOrCreate()
    service = Service(store, settings, spark=spark, topics=args.topic or None, log=_log)
    with handle_stop_signals(service):
        if args.once:
            runs = service.run_once()
            return 1 if any(r.outcome == "error" for r in runs) else 0
        service.run_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
