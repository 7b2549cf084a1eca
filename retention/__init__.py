"""Spark jobs: time and size retention, and vacuum of files no reader needs any more.

Python::

    from kstore.retention import run_retention, vacuum
    summary = run_retention(spark, "s3://bucket/ks", {"endpoint_url": "..."})
    summary = vacuum(spark, "s3://bucket/ks", dry_run=True)

``spark=None`` runs the same work in this process, without a JVM. Command line::

    spark-submit "$(python -c 'import kstore.retention as m; print(m.SUBMIT_SCRIPT)')" \\
        --store s3://bucket/ks --option endpoint_url=http://... [retention|vacuum|all]
    python -m kstore.retention --store file:///data/ks --local vacuum --dry-run
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from kstore.compaction.jobs import PartitionResult, Summary, open_store, policies, run_job

from kstore.errors import InvalidConfigurationError
from kstore.store import Store

from .deletion import RetentionPlan, plan_retention, retention_partition
from .housekeeping import abort_expired_transactions, prune_logs
from .purge import DeletedIncarnation, PurgeReport, purge_deleted_topics
from .vacuum import (
    DEFAULT_LOG_RETENTION_MS,
    DEFAULT_ORPHAN_AGE_MS,
    MIN_LOG_RETENTION_MS,
    MIN_ORPHAN_AGE_MS,
    check_ages,
    stale_incarnations,
    vacuum_partition,
)

__all__ = [
    "DEFAULT_LOG_RETENTION_MS",
    "DEFAULT_ORPHAN_AGE_MS",
    "MIN_LOG_RETENTION_MS",
    "MIN_ORPHAN_AGE_MS",
    "SUBMIT_SCRIPT",
    "DeletedIncarnation",
    "PartitionResult",
    "PurgeReport",
    "RetentionPlan",
    "Summary",
    "abort_expired_transactions",
    "plan_retention",
    "prune_logs",
    "purge_deleted_topics",
    "retention_partition",
    "run_retention",
    "vacuum",
    "vacuum_partition",
]

# The file to hand to spark-submit (it runs main() of kstore.retention.main).
SUBMIT_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "__main__.py")


def _checked_arguments(
    topics: Sequence[str] | None, tasks: int | None, now_ms: int | None
) -> list[str] | None:
    """The job's arguments checked before any work: a bad one is a clear error, never a
    TypeError half way through a run. One topic name given as a string is that topic."""
    for name, value, minimum in (("tasks", tasks, 1), ("now_ms", now_ms, 0)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < minimum
        ):
            raise InvalidConfigurationError(
                f"{name} must be an integer >= {minimum}, got {value!r}"
            )
    if topics is None:
        return None
    return [topics] if isinstance(topics, str) else list(topics)


def run_retention(
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
    """Apply ``retention.ms`` and ``retention.bytes`` to every partition of every topic whose
    ``cleanup.policy`` includes ``delete`` (or of ``topics``): one Spark task per group of
    partitions, or in this process when ``spark`` is None. Reads manifests only. Prints
    progress and the summary unless ``verbose`` is False; ``now_ms`` fixes the clock (tests)."""
    topics = _checked_arguments(topics, tasks, now_ms)
    return run_job(
        "retention",
        retention_partition,
        lambda c: "delete" in policies(c),
        spark,
        store_url,
        storage_options,
        topics,
        dry_run=dry_run,
        tasks=tasks,
        verbose=verbose,
        options={"now_ms": now_ms},
    )


def vacuum(
    spark: Any,
    store_url: str | Store,
    storage_options: Mapping[str, Any] | None = None,
    topics: Sequence[str] | None = None,
    *,
    dry_run: bool = False,
    orphan_age_ms: int = DEFAULT_ORPHAN_AGE_MS,
    log_retention_ms: int = DEFAULT_LOG_RETENTION_MS,
    tasks: int | None = None,
    verbose: bool = True,
    now_ms: int | None = None,
) -> Summary:
    """Delete removed segments past ``file.delete.delay.ms``, orphan files older than
    ``orphan_age_ms`` (at least 10 minutes), log versions older than the newest checkpoint
    past ``log_retention_ms`` (at least 2 days), data of deleted topics past their
    ``file.delete.delay.ms`` (:func:`purge_deleted_topics`) and of other stale topic
    incarnations. ``dry_run`` lists what would go (``summary.files``) and deletes nothing."""
    topics = _checked_arguments(topics, tasks, now_ms)
    check_ages(orphan_age_ms, log_retention_ms)
    options = {
        "now_ms": now_ms,
        "orphan_age_ms": orphan_age_ms,
        "log_retention_ms": log_retention_ms,
    }
    summary = run_job(
        "vacuum",
        vacuum_partition,
        lambda c: True,
        spark,
        store_url,
        storage_options,
        topics,
        dry_run=dry_run,
        tasks=tasks,
        verbose=verbose,
        options=options,
        print_summary=False,
    )
    store = open_store(store_url, storage_options)
    stale = stale_incarnations(
        store, list(topics) if topics else None, now_ms, orphan_age_ms, dry_run=dry_run
    )
    if not dry_run:
        for directory in stale:
            store.storage.delete_tree(directory)
    purged = purge_deleted_topics(
        store, now_ms, topics=list(topics) if topics else None, dry_run=dry_run
    )
    summary.extra_files = sorted([*stale, *purged.directories])
    if verbose:
        print(summary.format(), flush=True)
    return summary
