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
