"""The producer's and the consumer's config entry points, built directly (no store)."""

from __future__ import annotations

from typing import Any

import pytest

from kstore.consumer import DEFAULT_CONFIG as CONSUMER_DEFAULTS
from kstore.consumer.config import consumer_config
from kstore.errors import InvalidConfigurationError, KStoreError
from kstore.producer import DEFAULT_CONFIG as PRODUCER_DEFAULTS
from kstore.producer_config import producer_config
from kstore.settings import BadSettingError, a_callable, optional, whole


def test_the_defaults_are_the_whole_config_when_nothing_is_given() -> None:
    assert producer_config({}) == PRODUCER_DEFAULTS
    assert consumer_config({}) == CONSUMER_DEFAULTS
    assert producer_config({}) is not PRODUCER_DEFAULTS  # a producer may fill in its copy


@pytest.mark.parametrize(
    ("given", "acks"),
    [(0, 0), ("0", 0), (1, 1), ("1", 1), ("all", "all"), (-1, "all"), ("-1", "all")],
)
def test_acks_takes_kafkas_spellings(given: Any, acks: Any) -> None:
    assert producer_config({"acks": given})["acks"] == acks


@pytest.mark.parametrize(
    ("given", "codec"),
    [(None, None), ("none", "uncompressed"), ("ZSTD", "zstd"), ("lz4", "lz4")],
)
def test_compression_type_is_read_as_a_codec(given: Any, codec: str | None) -> None:
    assert producer_config({"compression_type": given})["compression_type"] == codec


def test_a_transactional_producer_is_durable() -> None:
    assert producer_config({"transactional_id": "app"})["acks"] == "all"
    assert producer_config({"transactional_id": "app", "acks": -1})["acks"] == "all"
    with pytest.raises(InvalidConfigurationError, match="acks='all'"):
        producer_config({"transactional_id": "app", "acks": 0})


def test_delivery_timeout_is_bounded_by_the_commit_deadline() -> None:
    assert producer_config({"delivery_timeout_ms": 300_000})["delivery_timeout_ms"] == 300_000
    with pytest.raises(InvalidConfigurationError, match="'delivery_timeout_ms': 300001 exceeds"):
        producer_config({"delivery_timeout_ms": 300_001})


def test_consumer_rules_across_keys_and_canonical_values() -> None:
    cfg = consumer_config({"partition_assignment_strategy": "range", "client_id": ""})
    assert cfg["partition_assignment_strategy"] == ("range",)
    assert cfg["client_id"] == ""  # empty, like None: one is made up
    assert consumer_config({"consumer_timeout_ms": 1.5})["consumer_timeout_ms"] == 1.5
    with pytest.raises(InvalidConfigurationError, match="lower than session_timeout_ms"):
        consumer_config({"heartbeat_interval_ms": 10, "session_timeout_ms": 10})
    with pytest.raises(InvalidConfigurationError, match="'consumer_timeout_ms'"):
        consumer_config({"consumer_timeout_ms": float("nan")})


def test_errors_are_kstore_and_value_errors_naming_the_key() -> None:
    with pytest.raises(InvalidConfigurationError) as info:
        producer_config({"retries": 1.5})
    assert isinstance(info.value, KStoreError)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == "producer config 'retries': must be a non-negative integer, got 1.5"
    with pytest.raises(InvalidConfigurationError, match="did you mean 'max_poll_records'"):
        consumer_config({"max_poll_record": 5})


def test_the_new_validators() -> None:
    assert whole(1)(3) == 3
    for bad in (0, True, 2.0, "3"):
        with pytest.raises(BadSettingError, match="must be an integer >= 1"):
            whole(1)(bad)
    assert optional(whole(0))(None) is None
    assert a_callable(len) is len
    with pytest.raises(BadSettingError, match="must be callable, got str"):
        a_callable("len")
