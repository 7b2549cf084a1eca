"""A producer whose clock runs a day behind the others keeps its entry in checkpoints (issue 45,
PROTOCOL.md 8.9): a retry of its last batch after a reload from a checkpoint is a duplicate.

Producer entries expire from checkpoints after a day of the writers' clocks (8.9). The times
come from the writers, so a producer whose wall clock is a day behind records its entries a
day in the past: by the median of the other entries' times every one of them looked expired,
every checkpoint dropped it, and after a reload from one its retry of an ambiguous batch
(same producer id, epoch and sequence) was appended a second time. The rule now also keeps an
entry while few producers have written to the partition after it (the log's own order, which
no clock moves)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from kstore import Producer, Store
from kstore.log import wait_for_checkpoints
from kstore.manifest import (
    PRODUCER_EXPIRATION_MS,
    RECENT_PRODUCERS,
    PartitionState,
    ProducerBatch,
)
from kstore.segments import write_data_object

StoreURL = tuple[str, dict[str, Any]]
DAY_S = 86_400
BEHIND_S = DAY_S + 3_600  # a clock 25 hours behind
PARTITION = 1


@contextlib.contextmanager
def _clock_behind(seconds: float, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every wall-clock read of this process (``time.time``: the times a writer records in
    the commits it writes, 23.1) runs ``seconds`` behind, as on a machine whose clock is off."""
    real = time.time
    with monkeypatch.context() as patch:
        patch.setattr(time, "time", lambda: real() - seconds)
        yield


def _send(store: Store, producer: Producer, value: bytes) -> int:
    offset = producer.send("t", value=value, partition=PARTITION).get(30).offset
    producer.flush()
    return offset


def _values(store: Store) -> list[tuple[int, bytes]]:
    part = store.partition("t", PARTITION)
    out: list[tuple[int, bytes]] = []
    for batch in part.read(0):
        for offset, value in zip(
            batch.column("offset").to_pylist(), batch.column("value").to_pylist(), strict=True
        ):
            out.append((offset, value))
    return out


@pytest.mark.parametrize("logs", [1, 3])
def test_a_producer_a_day_behind_keeps_its_entry_and_its_retry_is_a_duplicate(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch, logs: int
) -> None:
    store = Store(*local_store)
    store.create_topic(
        "t", 3, config={"commit.logs": logs, "checkpoint.interval": 1, "commit.inline.bytes": 0}
    )
    skewed = Producer(store, linger_ms=0)
    others = [Producer(store, linger_ms=0) for _ in range(3)]
    try:
        with _clock_behind(BEHIND_S, monkeypatch):
            _send(store, skewed, b"s-0")
            offset = _send(store, skewed, b"s-1")  # its last batch: the one it will retry
        for n, other in enumerate(others):
            _send(store, other, b"o-%d" % n)
        assert wait_for_checkpoints(30)
    finally:
        for producer in (skewed, *others):
            producer.close()
    before = _values(store)
    assert [v for _, v in before] == [b"s-0", b"s-1", b"o-0", b"o-1", b"o-2"]
    pid = skewed.producer_id
    # The premise: by the other producers' clocks (every later commit, and the median of the
    # entries' times) the skewed producer's entry is more than a day old.
    state = store.partition("t", PARTITION).state()
    entry = state.producers[pid]
    newest = max(p.timestamp_ms for p in state.producers.values())
    assert newest - entry.timestamp_ms > PRODUCER_EXPIRATION_MS
    assert state.last_commit_ms is not None
    assert state.last_commit_ms - entry.timestamp_ms > PRODUCER_EXPIRATION_MS

    # A reload: a new process reads the partition from the newest checkpoint.
    fresh = Store(*local_store)
    shared = fresh.topic_log("t", fresh.topic("t"), PARTITION)
    loaded = shared.log.load()
    assert loaded.sidecar_version == loaded.version  # loaded from a checkpoint, nothing replayed
    assert pid in loaded.partition(PARTITION).producers
    # The retry of the ambiguous last batch: the same records, producer, epoch and sequence,
    # in a data object written again (the sender writes its data again once the first write
    # is too old to commit; data carried in a commit is new at every attempt).
    part = fresh.partition("t", PARTITION)
    (seg,) = [s for s in loaded.partition(PARTITION).segments if s.base_offset == offset]
    records = part.read_segment(seg)
    schema = part.layout.record_schema
    retried = write_data_object(
        fresh.storage,
        part.directory.rsplit("/", 1)[0],
        [(PARTITION, records.select(schema.names), part.layout)],
    )[PARTITION]
    assert retried.path != seg.path
    outcome: dict[str, Any] = {}
    build = part.append_build(
        [retried], producer=ProducerBatch(pid, entry.epoch, 1, 1), outcome=outcome
    )
    with _clock_behind(BEHIND_S, monkeypatch):
        result, refused = shared.commit({PARTITION: build}, operation="APPEND", isolate=True)
    assert not refused
    assert outcome.get("duplicate") == (offset, offset), outcome
    assert result is None  # nothing committed
    assert _values(Store(*local_store)) == before


def _entry(last_offset: int, ts: int) -> dict[str, Any]:
    return {
        "id": f"p{last_offset}",
        "epoch": 0,
        "firstSequence": 0,
        "lastSequence": 0,
        "baseOffset": last_offset,
        "lastOffset": last_offset,
        "timestamp": ts,
    }


def _kept(state: PartitionState) -> set[str]:
    return {a["producer"]["id"] for a in state.checkpoint_actions() if "producer" in a}


def test_an_old_entry_leaves_checkpoints_only_once_enough_producers_followed_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule of 8.9 in full: an entry more than a day older than the reference leaves the
    checkpoint only once more than RECENT_PRODUCERS entries' batches follow its own in the
    partition (offsets: the log's order); an entry without a time, or one that a marker made
    (no batch), goes by the times alone, as before."""
    monkeypatch.setattr("kstore.manifest.RECENT_PRODUCERS", 3)
    now = 1_800_000_000_000
    old = now - PRODUCER_EXPIRATION_MS - 1
    state = PartitionState()
    state.last_commit_ms = now
    state.apply("producer", _entry(0, old))
    state.apply("producer", _entry(1, now))
    state.apply("producer", _entry(2, now))
    assert _kept(state) == {"p0", "p1", "p2"}  # three batches: all among the newest three
    state.apply("producer", _entry(3, now))
    assert _kept(state) == {"p1", "p2", "p3"}  # old, and three producers wrote after it
    # A day-old entry whose batch is among the newest stays (a clock a day behind).
    state.apply("producer", _entry(4, old))
    assert _kept(state) == {"p1", "p2", "p3", "p4"}  # p1 is young: it stays by its time
    # No time at all: omitted whatever its rank, as before.
    state.apply("producer", _entry(5, 0))
    assert "p5" not in _kept(state)
    # An entry a marker made (a newer epoch, no batch here) goes by its time.
    for pid, ts in (("old-marker", old), ("new-marker", now)):
        marker = {"producerId": pid, "epoch": 1, "version": 0, "result": "commit", "timestamp": ts}
        state.apply("txnMarker", marker)
    kept = _kept(state)
    assert "new-marker" in kept
    assert "old-marker" not in kept
    # The real bound.
    monkeypatch.undo()
    assert RECENT_PRODUCERS == 1_000
