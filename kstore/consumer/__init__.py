"""The consumer (kafka-python's ``KafkaConsumer`` API), split as Kafka's client is:

- ``consumer``: the ``Consumer`` facade (poll, commits, close);
- ``config``: its configuration, declared on the settings model (``kstore.settings``);
- ``subscription``: what it reads: subscription, assignment, positions, pauses;
- ``fetcher``: reading the assigned partitions into a fetch buffer;
- ``pacing``: when a poll looks for new records, and how long it waits;
- ``membership``: the group membership: joins, heartbeats, rebalances, offset commits;
- ``builder``: fetched batches as ``ConsumerRecord`` values.
"""

from kstore.consumer.consumer import DEFAULT_CONFIG, Consumer
from kstore.consumer.fetcher import METADATA_RECHECK_S
from kstore.consumer.pacing import (
    ARRIVAL_EARLY,
    ARRIVAL_GAP_MAX_S,
    ARRIVAL_STEP,
    LOCAL_LOOK_MAX_S,
    LOCAL_LOOK_MIN_S,
    LOCAL_LOOK_SHARE,
)
from kstore.consumer.subscription import ConsumerRebalanceListener

__all__ = [
    "ARRIVAL_EARLY",
    "ARRIVAL_GAP_MAX_S",
    "ARRIVAL_STEP",
    "DEFAULT_CONFIG",
    "LOCAL_LOOK_MAX_S",
    "LOCAL_LOOK_MIN_S",
    "LOCAL_LOOK_SHARE",
    "METADATA_RECHECK_S",
    "Consumer",
    "ConsumerRebalanceListener",
]
