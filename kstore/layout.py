"""Where things live in a store. Every path is built here, from validated names only."""

from __future__ import annotations

import hashlib
import re

from kstore.errors import InvalidArgumentError
from kstore.names import validate_group_id, validate_topic_name
from kstore.settings import is_int

STORE_MARKER = "_kstore.json"
TOPICS = "topics"
GROUPS = "groups"
PRODUCERS = "producers"
_TOPIC_ID = re.compile(r"[0-9a-f]{32}")


def topic_dir(topic: str) -> str:
    return f"{TOPICS}/{validate_topic_name(topic)}"


def topic_log_dir(topic: str) -> str:
    return f"{topic_dir(topic)}/_log"


def topic_data_dir(topic: str, topic_id: str) -> str:
    """Data of one incarnation of a topic: a re-created topic never sees the old one's files."""
    if not _TOPIC_ID.fullmatch(topic_id):
        raise InvalidArgumentError(f"illegal topic id {topic_id!r}")
    return f"{topic_dir(topic)}/{topic_id}"


def partition_dir(topic: str, topic_id: str, partition: int) -> str:
    if not is_int(partition) or partition < 0:
        raise InvalidArgumentError(f"illegal partition number {partition!r}")
    return f"{topic_data_dir(topic, topic_id)}/{partition}"


def group_dir(group_id: str) -> str:
    return f"{GROUPS}/{validate_group_id(group_id)}"


def group_log_dir(group_id: str) -> str:
    return f"{group_dir(group_id)}/_log"


def group_members_dir(group_id: str) -> str:
    return f"{GROUPS}/{validate_group_id(group_id)}/members"


def producer_log_dir(transactional_id: str) -> str:
    """Transactional ids may be any string (as in Kafka), so the path uses their hash."""
    if not isinstance(transactional_id, str) or not transactional_id:
        raise InvalidArgumentError(
            f"transactional id must be a non-empty string, got {transactional_id!r}"
        )
    digest = hashlib.sha256(transactional_id.encode()).hexdigest()[:40]
    return f"{PRODUCERS}/{digest}/_log"
