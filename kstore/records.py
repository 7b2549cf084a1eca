"""Kafka's record and position types, with kafka-python's names and shapes."""

from __future__ import annotations

from typing import Any, NamedTuple


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class OffsetAndMetadata(NamedTuple):
    offset: int
    metadata: str = ""
    leader_epoch: int = -1


class OffsetAndTimestamp(NamedTuple):
    offset: int
    timestamp: int
    leader_epoch: int = -1


class RecordMetadata(NamedTuple):
    """What a producer learns about a record once it is committed."""

    topic: str
    partition: int
    topic_partition: TopicPartition
    offset: int  # -1 with acks=0: the producer does not wait to learn it
    timestamp: int  # milliseconds since the epoch
    log_start_offset: int
    checksum: None
    serialized_key_size: int
    serialized_value_size: int
    serialized_header_size: int


class ConsumerRecord(NamedTuple):
    topic: str
    partition: int
    offset: int
    timestamp: int  # milliseconds since the epoch
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime
    key: Any
    value: Any
    headers: tuple[tuple[str, bytes], ...]  # (name, value) pairs; () when there are none
    checksum: None
    serialized_key_size: int
    serialized_value_size: int
    serialized_header_size: int
    leader_epoch: int = -1


class ConsumerGroupMetadata(NamedTuple):
    """What a transactional producer needs to commit a consumer's offsets (Kafka's
    ``consumer.group_metadata()``)."""

    group_id: str
    generation_id: int
    member_id: str | None
    group_instance_id: str | None
