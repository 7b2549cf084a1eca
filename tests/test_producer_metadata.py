"""The producer's topic metadata on its own (kstore/producer_metadata.py): read once, kept for
metadata_max_age_ms, refreshed on demand, kept when a refresh fails, and a layout-2 topic
refused."""

from __future__ import annotations

import pytest

import kstore
from kstore.errors import (
    InvalidTopicError,
    LayoutUpgradeRequiredError,
    UnknownTopicOrPartitionError,
)
from kstore.producer_metadata import Backoff, ProducerMetadata
from tests import layout2
from tests.faults import Fault, FaultyStorage


def create_layout2_topic(store: kstore.Store, name: str, partitions: int = 1) -> None:
    """A topic whose metadata says layout 2 (tests/layout2.py: nothing in kstore creates one)."""
    layout2.create_topic(store, name, partitions)
    assert store.topic(name).layout == 2


def _metadata(store: kstore.Store, **overrides: object) -> ProducerMetadata:
    settings: dict[str, object] = {
        "max_age_ms": 300_000,
        "max_block_ms": 1_000,
        "max_request_size": 1_048_576,
        "compression": None,
        "backoff": Backoff(1, 10),
        "client_id": "unit",
    }
    settings.update(overrides)
    return ProducerMetadata(store, **settings)  # type: ignore[arg-type]


@pytest.fixture
def faulty(local_store: tuple[str, dict[str, object]]) -> tuple[FaultyStorage, kstore.Store]:
    storage = FaultyStorage(kstore.Storage(local_store[0]))
    return storage, kstore.Store.from_storage(storage)


def test_a_topic_is_read_once_and_kept_until_it_is_older_than_the_max_age(
    faulty: tuple[FaultyStorage, kstore.Store],
) -> None:
    storage, store = faulty
    store.create_topic("t", 2, config={"max.message.bytes": 5_000, "compression.type": "zstd"})
    metadata = _metadata(store, max_request_size=4_000)
    info = metadata.topic("t")
    assert metadata.cached == {"t": info}
    assert (info.max_message_bytes, info.record_limit) == (5_000, 4_000)
    assert info.compression == "zstd"
    store.add_partitions("t", 3)
    assert metadata.topic("t") is info  # younger than the max age: not read again
    assert metadata.topic("t", refresh=True).metadata.partitions == 3
    # A refresh that fails keeps the copy it has (Kafka's producer does the same).
    storage.add(Fault("read", when="before"))
    kept = metadata.topic("t", refresh=True)
    assert kept.metadata.partitions == 3
    assert storage.injected


def test_an_expired_entry_is_read_again(local_store: tuple[str, dict[str, object]]) -> None:
    store = kstore.Store(local_store[0])
    store.create_topic("t", 1)
    metadata = _metadata(store, max_age_ms=0)
    first = metadata.topic("t")
    assert metadata.topic("t") is not first


def test_the_producers_compression_overrides_the_topics(
    local_store: tuple[str, dict[str, object]],
) -> None:
    store = kstore.Store(local_store[0])
    store.create_topic("t", 1)  # compression.type "producer": uncompressed unless the producer says
    assert _metadata(store).topic("t").compression == "uncompressed"
    assert _metadata(store, compression="lz4").topic("t").compression == "lz4"


def test_bad_names_missing_topics_and_layout_2_topics_are_refused(
    local_store: tuple[str, dict[str, object]],
) -> None:
    store = kstore.Store(local_store[0])
    metadata = _metadata(store)
    with pytest.raises(InvalidTopicError):
        metadata.topic("../etc")
    with pytest.raises(InvalidTopicError):
        metadata.topic(["t"])  # type: ignore[arg-type]
    with pytest.raises(UnknownTopicOrPartitionError):
        metadata.topic("missing")
    create_layout2_topic(store, "old")
    with pytest.raises(
        LayoutUpgradeRequiredError, match=r"'old' has layout 2.*`kstore topics upgrade old`"
    ):
        metadata.topic("old")
    assert "old" not in metadata.cached


def test_backoff_doubles_up_to_its_cap() -> None:
    backoff = Backoff(100, 1_000)
    assert [backoff.seconds(n) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
