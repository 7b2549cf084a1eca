"""The time rules of PROTOCOL.md 23.1: which clock judges each age, and the bounds that tie a
writer's commit deadline, vacuum's orphan age and file.delete.delay.ms together."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from kstore.retention import vacuum

from kstore import Store
from kstore.config import MAX_UNCOMMITTED_MS, MIN_ORPHAN_AGE_MS
from kstore.errors import InvalidConfigurationError, StaleWriteError
from kstore.log import RetryPolicy
from kstore.producer import Producer
from kstore.storage import Storage

ELEVEN_MINUTES_MS = 11 * 60_000


class ManualClock:
    """A monotonic clock that moves only when told to: a writer's pause, without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class PausingStorage(Storage):
    """Runs ``pause`` once, right after the first segment file is written: the moment a
    writer holds a written segment it has not committed yet (a GC pause, SIGSTOP, a frozen
    VM)."""

    def __init__(self, url: str, pause: Callable[[], None]) -> None:
        super().__init__(url)
        self.pause: Callable[[], None] | None = pause

    def put_new(self, rel: str, data: bytes | memoryview, *, durable: bool = True) -> None:
        super().put_new(rel, data, durable=durable)
        if "/segments/" in rel and self.pause is not None:
            pause, self.pause = self.pause, None
            pause()


def wall_ms() -> int:
    return int(time.time() * 1000)


def values(store: Store, topic: str) -> list[bytes]:
    part = store.partition(topic, 0)
    return [v for b in part.read(0) for v in b.column("value").to_pylist()]


def test_a_producer_paused_between_write_and_commit_never_commits_a_vacuumed_segment(
    tmp_path: Path,
) -> None:
    url = f"file://{tmp_path}/store"
    Store(url).create_topic("t", 1)
    clock = ManualClock()
    vacuumed: list[str] = []

    def pause() -> None:
        # 11 minutes pass for the producer (its monotonic clock) and for the storage (vacuum's
        # now): the segment just written is an unreferenced file older than the orphan age.
        clock.now += ELEVEN_MINUTES_MS / 1000
        summary = vacuum(
            None,
            url,
            verbose=False,
            orphan_age_ms=MIN_ORPHAN_AGE_MS,
            now_ms=wall_ms() + ELEVEN_MINUTES_MS,
        )
        vacuumed.extend(summary.files)

    storage = PausingStorage(url, pause)
    store = Store.from_storage(storage, create=False, retry=RetryPolicy(clock=clock))
    with Producer(store, acks="all") as producer:
        metadata = producer.send("t", b"v", partition=0).get(timeout=60)
    assert metadata.offset == 0
    assert len(vacuumed) == 1  # the paused write's file went; the record was written again
    assert values(Store(url), "t") == [b"v"]
    # And a later vacuum by the same storage clock keeps the committed file.
    vacuum(
        None,
        url,
        verbose=False,
        orphan_age_ms=MIN_ORPHAN_AGE_MS,
        now_ms=wall_ms() + ELEVEN_MINUTES_MS,
    )
    assert values(Store(url), "t") == [b"v"]


def test_every_commit_attempt_checks_the_age_of_the_files_it_references(tmp_path: Path) -> None:
    clock = ManualClock()
    store = Store(f"file://{tmp_path}/store", retry=RetryPolicy(clock=clock))
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    table = pa.table(
        {"key": [None], "value": [b"v"]}, pa.schema([("key", pa.binary()), ("value", pa.binary())])
    )
    written_at = clock()
    segment = part.write_segment(table)
    clock.now += MAX_UNCOMMITTED_MS / 1000
    with pytest.raises(StaleWriteError, match="nothing was committed"):
        part.commit_segments([segment], written_at=written_at)
    assert part.state().version == -1
    assert part.commit_segments([segment], written_at=clock()).base_offset == 0


def test_bounds_above_the_orphan_age_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidConfigurationError, match="delivery_timeout_ms"):
        Producer(f"file://{tmp_path}/store", delivery_timeout_ms=MAX_UNCOMMITTED_MS + 1)
    with pytest.raises(InvalidConfigurationError, match="max_uncommitted_s"):
        RetryPolicy(max_uncommitted_s=MIN_ORPHAN_AGE_MS / 1000)
    with pytest.raises(InvalidConfigurationError, match="timeout_s"):
        RetryPolicy(timeout_s=MAX_UNCOMMITTED_MS / 1000)
    assert MAX_UNCOMMITTED_MS < MIN_ORPHAN_AGE_MS
