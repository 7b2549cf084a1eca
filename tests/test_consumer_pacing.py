"""The consumer's pacer on its own, on a clock the test moves: how often a poll looks for new
records on local disk and on an object store (more in test_fetch_path.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest

import kstore.consumer.pacing as pacing
from kstore.consumer.pacing import Pacer


class Clock:
    """The pacer's ``time``: a monotonic clock that its sleeps move, and that records them."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(pacing, "time", clock)
    return clock


class Looks:
    """A fetch that finds records at the given looks (counted from 1)."""

    def __init__(self, *finding: int) -> None:
        self.finding = set(finding)
        self.count = 0

    def __call__(self) -> dict[str, int]:
        self.count += 1
        return {"records": 1} if self.count in self.finding else {}


def never_buffered() -> bool:
    return False


def test_an_idle_local_reader_backs_off_to_the_longest_wait(clock: Clock) -> None:
    pacer = Pacer(remote=False, max_wait_ms=4)
    duties: list[float] = []
    fetch = Looks()
    assert pacer.run(20, fetch, lambda: duties.append(clock.now), never_buffered) == {}
    assert clock.sleeps[:5] == [0.0005, 0.001, 0.002, 0.004, 0.004], clock.sleeps
    assert round(sum(clock.sleeps), 6) == 0.02  # the last sleep ends at the deadline
    assert len(duties) == fetch.count  # the group's duties before every look


def test_a_poll_returns_what_the_first_look_that_finds_records_found(clock: Clock) -> None:
    pacer = Pacer(remote=False, max_wait_ms=100)
    fetch = Looks(3)
    assert pacer.run(1_000, fetch, lambda: None, never_buffered) == {"records": 1}
    assert fetch.count == 3
    assert pacer.run(0, Looks(), lambda: None, never_buffered) == {}  # one look, no wait
    assert clock.sleeps == [0.0005, 0.001]


def test_a_local_reader_that_found_records_lately_looks_at_a_share_of_their_gap(
    clock: Clock,
) -> None:
    pacer = Pacer(remote=False, max_wait_ms=100)
    pacer.note_arrival()
    clock.now += 0.004  # records every 4 ms: looks 0.4 ms apart
    pacer.note_arrival()
    pacer.run(2, Looks(), lambda: None, never_buffered)
    assert set(clock.sleeps[:-1]) == {0.0004}, clock.sleeps
    clock.now += 5.0  # nothing found for long: the backoff from half a millisecond again
    clock.sleeps.clear()
    pacer.run(2, Looks(), lambda: None, never_buffered)
    assert clock.sleeps[:2] == [0.0005, 0.001], clock.sleeps


def test_an_object_store_reader_waits_for_the_next_records_unless_some_are_buffered(
    clock: Clock,
) -> None:
    pacer = Pacer(remote=True, max_wait_ms=500)
    pacer.note_arrival()
    clock.now += 0.2
    pacer.note_arrival()  # records every 200 ms: the next expected in 160 ms
    fetch = Looks()
    assert pacer.run(100, fetch, lambda: None, never_buffered) == {}
    assert fetch.count == 0  # not due within the poll: no request at all
    assert clock.sleeps == [0.1]
    fetch = Looks(1)
    assert pacer.run(100, fetch, lambda: None, lambda: True) == {"records": 1}
    assert fetch.count == 1  # buffered records are handed out without a wait
    assert clock.sleeps == [0.1]
