"""The producer's configuration, declared on the settings model (kstore.settings).

Every key is a keyword argument of ``Producer``, named as kafka-python names it (Kafka's name
with ``_`` for ``.``). :func:`producer_config` is the one entry point: it validates the given
values, fills in the defaults and applies the rules that tie keys together. It runs once, when
a producer is built; ``send()`` never reads the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kstore.config import MAX_UNCOMMITTED_MS, MIN_ORPHAN_AGE_MS
from kstore.errors import InvalidConfigurationError
from kstore.partitioner import PARTITIONER_NAMES
from kstore.settings import (
    BadSettingError,
    Setting,
    Settings,
    a_callable,
    as_given,
    boolean_text,
    optional,
    whole,
)


def _acks(value: Any) -> int | str:
    # Compared with ``in``, as ever: 0 and 1 also arrive as strings (a CLI, a properties file).
    if value in (0, "0"):
        return 0
    if value in (1, "1"):
        return 1
    if value in ("all", -1, "-1"):
        return "all"
    raise BadSettingError(f"must be 0, 1 or 'all' (or -1), got {value!r}")


# Arrow IPC has exactly two codecs; "none" is Kafka's name for no compression.
_CODECS = {"none": "uncompressed", "uncompressed": "uncompressed", "zstd": "zstd", "lz4": "lz4"}


def _compression(value: Any) -> str:
    codec = _CODECS.get(str(value).lower())
    if codec is None:
        raise BadSettingError(
            f"{value!r} is not supported; use zstd, lz4 or none (segments are Arrow IPC, whose "
            "codecs are zstd and lz4)"
        )
    return codec


def _partitioner(value: Any) -> str:
    if not isinstance(value, str) or value not in PARTITIONER_NAMES:
        raise BadSettingError(
            f"unknown partitioner {value!r}; valid names: {', '.join(PARTITIONER_NAMES)}"
        )
    return value


_non_negative = whole(0)


def _delivery_timeout(value: Any) -> int:
    timeout: int = _non_negative(value)
    if timeout > MAX_UNCOMMITTED_MS:
        # PROTOCOL.md 23.1: no writer holds a written segment longer than this.
        raise BadSettingError(
            f"{timeout} exceeds {MAX_UNCOMMITTED_MS}, the longest a written segment may wait "
            f"for its commit (half the minimum orphan age, {MIN_ORPHAN_AGE_MS} ms, after which "
            "vacuum may delete it)"
        )
    return timeout


PRODUCER_SETTINGS = Settings(
    "producer config",
    [
        Setting("acks", 1, _acks, "0, 1 or 'all' (-1): when a send is acknowledged"),
        Setting(
            "linger_ms",
            5,
            _non_negative,
            "how long a batch waits for more records",
            kafka_name="linger.ms",
        ),
        Setting(
            "batch_size",
            16 * 1024 * 1024,
            whole(1),
            "bytes per topic batch before it is sent without lingering",
            kafka_name="batch.size",
        ),
        Setting(
            "buffer_memory",
            64 * 1024 * 1024,
            whole(1),
            "bytes of queued records; send() blocks when they are used up",
            kafka_name="buffer.memory",
        ),
        Setting(
            "max_block_ms",
            60_000,
            _non_negative,
            "how long send() blocks on a full buffer",
            kafka_name="max.block.ms",
        ),
        Setting(
            "max_request_size",
            1_048_576,
            _non_negative,
            "the largest record accepted",
            kafka_name="max.request.size",
        ),
        Setting(
            "compression_type",
            None,
            optional(_compression),
            "zstd, lz4 or none; None: the topic's compression.type",
            kafka_name="compression.type",
        ),
        Setting(
            "retries",
            2_147_483_647,
            _non_negative,
            "retries of a commit that failed with a retriable error",
        ),
        Setting(
            "retry_backoff_ms",
            100,
            _non_negative,
            "the first backoff before a retry, doubled at each",
            kafka_name="retry.backoff.ms",
        ),
        Setting(
            "retry_backoff_max_ms",
            1_000,
            _non_negative,
            "the largest backoff",
            kafka_name="retry.backoff.max.ms",
        ),
        Setting(
            "delivery_timeout_ms",
            120_000,
            _delivery_timeout,
            f"no retry starts later than this after the batch opened; at most {MAX_UNCOMMITTED_MS}",
            kafka_name="delivery.timeout.ms",
        ),
        Setting(
            "enable_idempotence",
            True,
            as_given,
            "producer id, epoch and sequences in every commit (read as a truth value)",
            kafka_name="enable.idempotence",
        ),
        Setting(
            "transactional_id",
            None,
            as_given,
            "enables transactions, and forces acks='all'",
            kafka_name="transactional.id",
        ),
        Setting(
            "transaction_timeout_ms",
            60_000,
            whole(1),
            "how long a transaction may stay open before maintenance aborts it",
            kafka_name="transaction.timeout.ms",
        ),
        Setting(
            "partitioner",
            "murmur2",
            _partitioner,
            f"keyed placement: {', '.join(PARTITIONER_NAMES)}",
        ),
        Setting(
            "key_serializer",
            None,
            optional(a_callable),
            "a callable turning a key into bytes",
            kafka_name="key.serializer",
        ),
        Setting(
            "value_serializer",
            None,
            optional(a_callable),
            "a callable turning a value into bytes",
            kafka_name="value.serializer",
        ),
        Setting(
            "client_id",
            None,
            as_given,
            "a name for logs (default producer-<8 hex>)",
            kafka_name="client.id",
        ),
        Setting(
            "metadata_max_age_ms",
            300_000,
            _non_negative,
            "how long topic metadata is cached",
            kafka_name="metadata.max.age.ms",
        ),
        Setting(
            "max_in_flight_partitions",
            None,
            optional(whole(1)),
            "topic logs written at once; None: chosen for the storage (sender.default_in_flight)",
        ),
        Setting(
            "shared_commits",
            True,
            boolean_text,
            "share a topic log's commits with its other writers (PROTOCOL.md 30): an idempotent "
            "producer's small flushes wait for the holder's next commit instead of racing; "
            "false: commit every flush itself, as writers below version 8 do",
        ),
        Setting(
            "shared_commit_takeover_ms",
            None,
            optional(whole(1)),
            "how long a flush waits for another writer's commit before its producer commits "
            "itself; None: 20 on local disk and in memory, 250 on an object store",
        ),
        Setting("storage_options", None, as_given, "fsspec options when the store is a URL"),
    ],
    label=lambda name: f"producer config {name!r}",
)

DEFAULT_CONFIG: dict[str, Any] = PRODUCER_SETTINGS.defaults()


def producer_config(configs: Mapping[str, Any]) -> dict[str, Any]:
    """Every producer config: the given ones validated (unknown names refused), defaults for
    the rest; acks and compression_type in their canonical form (0, 1 or 'all'; a codec)."""
    given = PRODUCER_SETTINGS.validate(configs)
    cfg = {**DEFAULT_CONFIG, **given}
    if cfg["transactional_id"] is not None:
        # As in Kafka: transactions need durable appends, or a machine crash could lose an
        # append of a transaction whose (durable) decision says it committed.
        if given.get("acks", "all") != "all":
            raise InvalidConfigurationError("a transactional producer needs acks='all'")
        cfg["acks"] = "all"
    return cfg


__all__ = ["DEFAULT_CONFIG", "PRODUCER_SETTINGS", "producer_config"]
