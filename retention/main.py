"""Command line of the retention job: ``python -m kstore.retention`` or spark-submit."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from kstore.compaction.jobs import (
    Summary,
    base_parser,
    command_line,
    get_spark,
    parse_storage_options,
    report,
)
from kstore.retention import (
    DEFAULT_LOG_RETENTION_MS,
    DEFAULT_ORPHAN_AGE_MS,
    run_retention,
    vacuum,
)


def main(argv: Sequence[str] | None = None) -> int:
    return command_line(_main, argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = base_parser("kstore.retention", "Apply time/size retention and vacuum deleted files.")
    parser.add_argument(
        "command",
        nargs="?",
        default="retention",
        choices=["retention", "vacuum", "all"],
        help="retention (default), vacuum, or all (retention, then vacuum)",
    )
    parser.add_argument(
        "--orphan-age-ms",
        type=int,
        default=DEFAULT_ORPHAN_AGE_MS,
        help="vacuum: delete unreferenced files older than this by the storage's clock "
        "(default 1 h, at least 10 min)",
    )
    parser.add_argument(
        "--log-retention-ms",
        type=int,
        default=DEFAULT_LOG_RETENTION_MS,
        help="vacuum: keep log versions this long (default 2 days, the least allowed)",
    )
    args = parser.parse_args(argv)
    options = parse_storage_options(args.option)
    spark = get_spark(args.local, "kstore-retention")
    common = {"dry_run": args.dry_run, "tasks": args.tasks, "verbose": not args.quiet}
    topics = args.topic or None
    summaries: list[Summary] = []
    if args.command in ("retention", "all"):
        summaries.append(run_retention(spark, args.store, options, topics, **common))
    if args.command in ("vacuum", "all"):
        summaries.append(
            vacuum(
                spark,
                args.store,
                options,
                topics,
                orphan_age_ms=args.orphan_age_ms,
                log_retention_ms=args.log_retention_ms,
                **common,
            )
        )
    return report(summaries, args.json, printed=not args.quiet)


if __name__ == "__main__":
    sys.exit(main())
