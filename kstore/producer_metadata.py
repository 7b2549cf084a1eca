"""The producer's topic metadata (Kafka's ``ProducerMetadata``): what a producer needs to know
of each topic it writes, read from the store once and refreshed after ``metadata_max_age_ms``,
and the retry backoff the producer's parts share.

A topic the producer cannot write is refused here, when the producer first meets it: a topic
of layout 2 (a log per partition) is written by no producer of this version; ``kstore topics
upgrade`` moves it to layout 3 (PROTOCOL.md 27).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from kstore.errors import StorageError
from kstore.names import validate_topic_name
from kstore.schema import Validator, validator
from kstore.segments import BINARY, Layout, layout_of
from kstore.store import Store, TopicMetadata, require_layout3

log = logging.getLogger("kstore.producer")


@dataclass
class TopicInfo:
    """What the producer knows of one topic, as of ``loaded`` (time.monotonic())."""

    metadata: TopicMetadata
    loaded: float
    max_message_bytes: int
    record_limit: int  # the smaller of max.message.bytes and max_request_size
    compression: str
    log_append_time: bool
    layout: Layout = BINARY
    # Typed topics: checks and normalizes a value (a dict, dataclass, pydantic model), and a key.
    check_value: Validator | None = None
    check_key: Validator | None = None


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff between attempts: ``retry_backoff_ms`` doubled per attempt, capped
    at ``retry_backoff_max_ms`` (Kafka's producer configs of those names)."""

    base_ms: int
    max_ms: int

    def seconds(self, attempt: int) -> float:
        """The wait before retry ``attempt``."""
        return float(min(self.max_ms, self.base_ms * 2 ** min(attempt, 10))) / 1000


class ProducerMetadata:
    """The topics a producer writes to, each read once and refreshed when older than
    ``max_age_ms`` (or when asked). ``cached`` is read directly by ``send()``, which takes a
    topic's info as it is once known."""

    def __init__(
        self,
        store: Store,
        *,
        max_age_ms: int,
        max_block_ms: int,
        max_request_size: int,
        compression: str | None,
        backoff: Backoff,
        client_id: str,
    ) -> None:
        self.store = store
        self.cached: dict[str, TopicInfo] = {}
        self._max_age_s = max_age_ms / 1000
        self._max_block_s = max_block_ms / 1000
        self._max_request_size = max_request_size
        self._compression = compression  # None: the topic's compression.type
        self._backoff = backoff
        self._client_id = client_id

    def topic(self, topic: str, *, refresh: bool = False) -> TopicInfo:
        """The info of ``topic``: cached while younger than ``metadata_max_age_ms`` unless
        ``refresh``. Raises for a bad name, a missing topic and a topic of layout 2."""
        try:
            info = self.cached.get(topic)
        except TypeError:  # unhashable, so not a name: raises InvalidTopicError naming it
            validate_topic_name(topic)
            raise
        if info is not None and not refresh and time.monotonic() - info.loaded < self._max_age_s:
            return info
        validate_topic_name(topic)
        if info is None:
            meta = self._read_topic(topic)
        else:
            try:
                meta = self.store.topic(topic)
            except StorageError as exc:
                # Kafka keeps producing with the metadata it has while a refresh fails: so
                # does this producer (a batch's own retries and delivery timeout still apply).
                log.warning(
                    "producer %s: metadata of %r not refreshed (%s); using the cached copy",
                    self._client_id,
                    topic,
                    exc,
                )
                return info
        if meta.layout == 2:
            self.cached.pop(topic, None)  # a topic of that name recreated in layout 2
            require_layout3(meta, "producing")
        effective = meta.effective_config
        topic_compression = effective["compression.type"]
        compression = self._compression or (
            "uncompressed" if topic_compression == "producer" else topic_compression
        )
        info = TopicInfo(
            metadata=meta,
            loaded=time.monotonic(),
            max_message_bytes=int(effective["max.message.bytes"]),
            record_limit=min(int(effective["max.message.bytes"]), self._max_request_size),
            compression=compression,
            log_append_time=effective["message.timestamp.type"] == "LogAppendTime",
            layout=layout_of(meta),
        )
        schema = meta.schema
        if schema is not None:
            info.check_value = validator(schema.value, schema.value_nulls)
            if schema.key is not None:
                info.check_key = validator(schema.key)
        self.cached[topic] = info
        return info

    def _read_topic(self, topic: str) -> TopicMetadata:
        """The topic's metadata, retrying transient storage errors with backoff for at most
        ``max_block_ms`` (as Kafka's metadata fetch blocks); then the last error."""
        deadline = time.monotonic() + self._max_block_s
        attempt = 0
        while True:
            try:
                return self.store.topic(topic)
            except StorageError as exc:
                attempt += 1
                backoff = self._backoff.seconds(attempt)
                if time.monotonic() + backoff >= deadline:
                    raise
                log.warning(
                    "producer %s: reading the metadata of %r failed (%s); retrying",
                    self._client_id,
                    topic,
                    exc,
                )
                time.sleep(backoff)
