"""The consumer's configuration, declared on the settings model (kstore.settings).

Every key is a keyword argument of ``Consumer``, named as kafka-python names it (Kafka's name
with ``_`` for ``.``). :func:`consumer_config` is the one entry point: it validates the given
values, fills in the defaults and applies the rules that tie keys together. It runs once, when
a consumer is built; ``poll()`` never reads the model.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from kstore.assignors import check_assignors
from kstore.errors import InvalidConfigurationError
from kstore.settings import (
    BadSettingError,
    Setting,
    Settings,
    a_callable,
    as_given,
    choice,
    optional,
    whole,
)

_CLIENT_ID = re.compile(r"[a-zA-Z0-9._-]{1,200}")


def _client_id(value: Any) -> Any:
    # An empty id, like None, means "make one up".
    if value != "" and (not isinstance(value, str) or not _CLIENT_ID.fullmatch(value)):
        raise BadSettingError(f"{value!r} must be 1-200 ASCII letters, digits, '.', '_' or '-'")
    return value


def _assignors(value: Any) -> tuple[str, ...]:
    try:
        return tuple(check_assignors(value))
    except InvalidConfigurationError as problem:
        raise BadSettingError(str(problem)) from None


def _wait_ms(value: Any) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or math.isnan(value)
        or value < 0
    ):
        raise BadSettingError(
            "must be a non-negative number of milliseconds (float('inf') to wait forever), "
            f"got {value!r}"
        )
    return value


_non_negative = whole(0)
_positive = whole(1)

CONSUMER_SETTINGS = Settings(
    "consumer config",
    [
        Setting(
            "client_id",
            None,
            optional(_client_id),
            "1-200 of [a-zA-Z0-9._-] (default consumer-<8 hex>)",
            kafka_name="client.id",
        ),
        Setting(
            "group_instance_id",
            None,
            as_given,
            "static membership",
            kafka_name="group.instance.id",
        ),
        Setting(
            "key_deserializer",
            None,
            optional(a_callable),
            "a callable applied to non-null keys",
            kafka_name="key.deserializer",
        ),
        Setting(
            "value_deserializer",
            None,
            optional(a_callable),
            "a callable applied to non-null values",
            kafka_name="value.deserializer",
        ),
        Setting(
            "auto_offset_reset",
            "latest",
            choice(("earliest", "latest", "none")),
            "where to start without a committed offset: earliest, latest or none",
            kafka_name="auto.offset.reset",
        ),
        Setting(
            "enable_auto_commit",
            True,
            as_given,
            "commit positions during poll() (read as a truth value)",
            kafka_name="enable.auto.commit",
        ),
        Setting(
            "auto_commit_interval_ms",
            5_000,
            _non_negative,
            "how often positions are auto-committed",
            kafka_name="auto.commit.interval.ms",
        ),
        Setting(
            "max_poll_records",
            500,
            _positive,
            "records per poll() at most",
            kafka_name="max.poll.records",
        ),
        Setting(
            "fetch_max_bytes",
            52_428_800,
            _non_negative,
            "bytes one fetch reads across partitions, roughly",
            kafka_name="fetch.max.bytes",
        ),
        Setting(
            "max_partition_fetch_bytes",
            1_048_576,
            _non_negative,
            "bytes one fetch reads per partition, roughly",
            kafka_name="max.partition.fetch.bytes",
        ),
        Setting(
            "fetch_max_wait_ms",
            100,
            _non_negative,
            "an idle poll looks for new commits at most this far apart",
            kafka_name="fetch.max.wait.ms",
        ),
        Setting(
            "session_timeout_ms",
            45_000,
            _positive,
            "a member whose lease is older than this is expired",
            kafka_name="session.timeout.ms",
        ),
        Setting(
            "heartbeat_interval_ms",
            3_000,
            _positive,
            "how often the heartbeat looks at the group log; below session_timeout_ms",
            kafka_name="heartbeat.interval.ms",
        ),
        Setting(
            "max_poll_interval_ms",
            300_000,
            _non_negative,
            "a member that does not poll() for this long leaves the group",
            kafka_name="max.poll.interval.ms",
        ),
        Setting(
            "partition_assignment_strategy",
            ("sticky", "range", "roundrobin"),
            _assignors,
            "assignors this member supports, preferred first",
            kafka_name="partition.assignment.strategy",
        ),
        Setting(
            "consumer_timeout_ms",
            float("inf"),
            _wait_ms,
            "iteration stops after this long without records",
        ),
        Setting(
            "metadata_max_age_ms",
            300_000,
            _non_negative,
            "how often a member checks subscribed topics for new partitions",
            kafka_name="metadata.max.age.ms",
        ),
        Setting(
            "isolation_level",
            "read_uncommitted",
            choice(("read_uncommitted", "read_committed")),
            "read_committed: hide open and aborted transactions",
            kafka_name="isolation.level",
        ),
        Setting("storage_options", None, as_given, "fsspec options when the store is a URL"),
    ],
    label=lambda name: f"consumer config {name!r}",
)

DEFAULT_CONFIG: dict[str, Any] = CONSUMER_SETTINGS.defaults()


def consumer_config(configs: Mapping[str, Any]) -> dict[str, Any]:
    """Every consumer config: the given ones validated (unknown names refused), defaults for
    the rest."""
    cfg = {**DEFAULT_CONFIG, **CONSUMER_SETTINGS.validate(configs)}
    if cfg["heartbeat_interval_ms"] >= cfg["session_timeout_ms"]:
        raise InvalidConfigurationError(
            "heartbeat_interval_ms must be lower than session_timeout_ms"
        )
    return cfg


__all__ = ["CONSUMER_SETTINGS", "DEFAULT_CONFIG", "consumer_config"]
