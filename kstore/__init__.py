"""kstore: Kafka's log model as a Spark-native storage layer with no brokers."""

from __future__ import annotations

__version__ = "0.1.0"

from kstore.errors import *  # noqa: E402,F403 - the error names are part of the public API
from kstore.errors import KStoreError  # noqa: E402
from kstore.partition import AppendResult, Partition, PartitionState, Segment  # noqa: E402
from kstore.segments import READ_SCHEMA, RECORD_SCHEMA  # noqa: E402
from kstore.storage import Storage  # noqa: E402
from kstore.store import Store, TopicDescription, TopicMetadata  # noqa: E402

__all__ = [
    "READ_SCHEMA",
    "RECORD_SCHEMA",
    "AppendResult",
    "KStoreError",
    "Partition",
    "PartitionState",
    "Segment",
    "Storage",
    "Store",
    "TopicDescription",
    "TopicMetadata",
    "__version__",
]
