"""The hook point for consumer-group offsets of streaming queries.

After each micro-batch Spark has committed, the stream reader calls :func:`batch_committed`
on the driver with the batch's end offsets: per topic-partition, the next offset the query
will read (Kafka's meaning of a committed offset). It runs in the Python process that serves
the query's source, once per committed position, in order.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kstore.records import TopicPartition

from .options import ReadOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommittedBatch:
    """What a hook receives: the source's options and the committed end offsets."""

    options: ReadOptions
    offsets: Mapping[TopicPartition, int]


CommitHook = Callable[[CommittedBatch], None]
_hooks: list[CommitHook] = []


def add_commit_hook(hook: CommitHook) -> None:
    """Register ``hook`` in this process (the process serving the source must import the
    module that registers it)."""
    _hooks.append(hook)


def remove_commit_hook(hook: CommitHook) -> None:
    _hooks.remove(hook)


def batch_committed(options: ReadOptions, offsets: Mapping[TopicPartition, int]) -> None:
    event = CommittedBatch(options, dict(offsets))
    for hook in list(_hooks):
        hook(event)


def commit_group_offsets(event: CommittedBatch) -> None:
    """With option ``groupId``: record the committed end offsets in that consumer group's
    transactional manifest, so group tools show the query's lag and a rewritten query can
    start where this one left off (``startingOffsets=group``).

    The commit is outside any generation (the query is not a group member), which the group
    accepts only while it has no live members: a group shared with running consumers is
    refused (logged, the query goes on) rather than overwritten.
    """
    group_id = event.options.group_id
    if group_id is None or not event.offsets:
        return
    from kstore.errors import KStoreError
    from kstore.groups import Group
    from kstore.records import OffsetAndMetadata

    from .stores import get_store

    offsets = {tp: OffsetAndMetadata(offset, "spark") for tp, offset in event.offsets.items()}
    try:
        Group(get_store(event.options.store), group_id).commit_offsets(
            offsets, member_id=None, generation=-1
        )
    except KStoreError as exc:
        log.warning("group %s: could not record the query's offsets: %s", group_id, exc)


add_commit_hook(commit_group_offsets)
