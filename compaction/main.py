"""Command line of the compaction job: ``python -m kstore.compaction`` or spark-submit."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from kstore.compaction import merge_segments, run_compaction
from kstore.compaction.jobs import (
    Summary,
    base_parser,
    command_line,
    get_spark,
    parse_storage_options,
    report,
)


def main(argv: Sequence[str] | None = None) -> int:
    return command_line(_main, argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = base_parser(
        "kstore.compaction", "Compact topics with cleanup.policy=compact and merge small segments."
    )
    parser.add_argument(
        "command",
        nargs="?",
        default="all",
        choices=["all", "compact", "merge"],
        help="compact, merge, or both (default; compaction first)",
    )
    args = parser.parse_args(argv)
    options = parse_storage_options(args.option)
    spark = get_spark(args.local, "kstore-compaction")
    common = {"dry_run": args.dry_run, "tasks": args.tasks, "verbose": not args.quiet}
    topics = args.topic or None
    summaries: list[Summary] = []
    if args.command in ("all", "compact"):
        summaries.append(run_compaction(spark, args.store, options, topics, **common))
    if args.command in ("all", "merge"):
        summaries.append(merge_segments(spark, args.store, options, topics, **common))
    return report(summaries, args.json, printed=not args.quiet)


if __name__ == "__main__":
    sys.exit(main())
