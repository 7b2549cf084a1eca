"""kstore: Kafka's log model as a Spark-native storage layer with no brokers.

The public names below are imported on first use (PEP 562), so that ``import kstore`` stays
cheap for tools that need only part of the library (the CLI starts in well under a second).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from kstore.errors import *  # noqa: F403 - the error names are part of the public API
from kstore.errors import KStoreError

_LAZY = {
    "AppendResult": "kstore.partition",
    "Partition": "kstore.partition",
    "PartitionState": "kstore.partition",
    "Segment": "kstore.partition",
    "READ_SCHEMA": "kstore.segments",
    "RECORD_SCHEMA": "kstore.segments",
    "Storage": "kstore.storage",
    "Store": "kstore.store",
    "TopicDescription": "kstore.store",
    "TopicMetadata": "kstore.store",
    "Producer": "kstore.producer",
    "Consumer": "kstore.consumer",
    "TopicPartition": "kstore.records",
    "OffsetAndMetadata": "kstore.records",
    "ConsumerRecord": "kstore.records",
    "RecordMetadata": "kstore.records",
}

if TYPE_CHECKING:
    from kstore.consumer import Consumer
    from kstore.partition import AppendResult, Partition, PartitionState, Segment
    from kstore.producer import Producer
    from kstore.records import ConsumerRecord, OffsetAndMetadata, RecordMetadata, TopicPartition
    from kstore.segments import READ_SCHEMA, RECORD_SCHEMA
    from kstore.storage import Storage
    from kstore.store import Store, TopicDescription, TopicMetadata


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "READ_SCHEMA",
    "RECORD_SCHEMA",
    "AppendResult",
    "Consumer",
    "ConsumerRecord",
    "KStoreError",
    "OffsetAndMetadata",
    "Partition",
    "PartitionState",
    "Producer",
    "RecordMetadata",
    "Segment",
    "Storage",
    "Store",
    "TopicDescription",
    "TopicMetadata",
    "TopicPartition",
    "__version__",
]
