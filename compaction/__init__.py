"""Spark jobs: key compaction (Kafka's log cleaner) and segment merging.

Python::

    from kstore.compaction import run_compaction, merge_segments
    summary = run_compaction(spark, "s3://bucket/ks", {"endpoint_url": "..."})
    summary = merge_segments(spark, "s3://bucket/ks", topics=["clicks"])

``spark=None`` runs the same work in this process, without a JVM. Command line (both run
compaction, then merging, unless a command is named)::

    spark-submit "$(python -c 'import kstore.compaction as m; print(m.SUBMIT_SCRIPT)')" \\
        --store s3://bucket/ks --option endpoint_url=http://... [compact|merge|all]
    python -m kstore.compaction --store file:///data/ks --local --dry-run
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from kstore.store import Store

from .cleaner import CompactionPlan, compact_partition, plan_compaction
from .jobs import PartitionResult, Summary, WorkItem, policies, run_job
from .merger import merge_partition, plan_merge, rewrite_ranges

__all__ = [
    "SUBMIT_SCRIPT",
    "CompactionPlan",
    "PartitionResult",
    "Summary",
    "WorkItem",
    "compact_partition",
    "merge_partition",
    "merge_segments",
    "plan_compaction",
    "plan_merge",
    "rewrite_ranges",
    "run_compaction",
]

# The file to hand to spark-submit (it runs main() of kstore.compaction.main).
SUBMIT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")


def run_compaction(
    spark: Any,
    store_url: str | Store,
    storage_options: Mapping[str, Any] | None = None,
    topics: Sequence[str] | None = None,
    *,
    dry_run: bool = False,
    tasks: int | None = None,
    verbose: bool = True,
    now_ms: int | None = None,
    max_dirty_records: int | None = None,
    memory_bytes: int | None = None,
) -> Summary:
    """Compact every partition of every topic whose ``cleanup.policy`` includes ``compact``
    (or of ``topics``): one Spark task per group of partitions, or in this process when
    ``spark`` is None. Prints progress and the summary unless ``verbose`` is False.

    ``now_ms`` fixes the job's clock (tests); ``max_dirty_records`` bounds the records one run
    maps per partition (default 50M); ``memory_bytes`` bounds decoded segments kept between
    its two passes (default 1 GiB).
    """
    return run_job(
        "compaction",
        compact_partition,
        lambda c: "compact" in policies(c),
        spark,
        store_url,
        storage_options,
        topics,
        dry_run=dry_run,
        tasks=tasks,
        verbose=verbose,
        options={
            "now_ms": now_ms,
            "max_dirty_records": max_dirty_records,
            "memory_bytes": memory_bytes,
        },
    )


def merge_segments(
    spark: Any,
    store_url: str | Store,
    storage_options: Mapping[str, Any] | None = None,
    topics: Sequence[str] | None = None,
    *,
    dry_run: bool = False,
    tasks: int | None = None,
    verbose: bool = True,
    now_ms: int | None = None,
) -> Summary:
    """Merge small segments of every topic (or of ``topics``) into Parquet segments near
    ``segment.bytes``, keeping every record and offset. In layout 3 every range of a data
    object below the last stable offset becomes part of a per-partition Parquet segment: the
    partitions of one topic log in one task, which reads each data object once for all of
    them (:func:`~kstore.compaction.merger.rewrite_ranges`)."""
    return run_job(
        "merge",
        merge_partition,
        lambda c: True,
        spark,
        store_url,
        storage_options,
        topics,
        dry_run=dry_run,
        tasks=tasks,
        verbose=verbose,
        options={"now_ms": now_ms},
        shared=rewrite_ranges,
    )
