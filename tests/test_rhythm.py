"""A tailing reader's model of its writers' rhythms (kstore.rhythm): when the next commit of a
log is due, from the timestamps in the commits a reader found."""

from __future__ import annotations

import pytest

from kstore.rhythm import WriterRhythms


def _learn(rhythms: WriterRhythms, writer: str, start: float, period: float, lag: float) -> float:
    """Ten commits of ``writer`` every ``period`` s from ``start`` (its clock), each found
    ``lag`` s later, right after a look that missed it. Returns the last timestamp."""
    ts = start
    for _ in range(10):
        rhythms.note(writer, int(ts * 1000), ts + lag, tight=True)
        last, ts = ts, ts + period
    return last


def test_two_interleaved_writers_each_predict_their_next_commit() -> None:
    """Two producers 100 ms apart each, 30 ms out of phase: the versions come 30 and 70 ms
    apart, and the next due is the earlier writer's next commit, seen after its lag."""
    rhythms = WriterRhythms()
    a = _learn(rhythms, "a", 1000.0, 0.1, 0.008)
    b = _learn(rhythms, "b", 1000.03, 0.1, 0.012)
    assert a == pytest.approx(1000.9)
    assert b == pytest.approx(1000.93)
    now = b + 0.012  # b's last commit was just found
    assert rhythms.next_due(now) == pytest.approx(a + 0.1 + 0.008, abs=1e-3)
    assert rhythms.due_count(now) == 0
    # Past a's next commit: one due; past b's as well: two.
    assert rhythms.due_count(a + 0.1 + 0.009) == 1
    assert rhythms.due_count(b + 0.1 + 0.013) == 2


def test_a_writer_that_stopped_predicts_nothing_and_none_known_is_none() -> None:
    rhythms = WriterRhythms()
    assert rhythms.next_due(1000.0) is None
    assert rhythms.due_count(1000.0) is None
    last = _learn(rhythms, "a", 1000.0, 0.1, 0.01)
    assert rhythms.next_due(last + 0.05) is not None
    # Not seen for more than 2 s (and 3 of its periods): stopped.
    assert rhythms.next_due(last + 2.5) is None
    assert rhythms.due_count(last + 2.5) is None


def test_pauses_and_stale_commits_do_not_distort_the_period() -> None:
    rhythms = WriterRhythms()
    last = _learn(rhythms, "a", 1000.0, 0.1, 0.01)
    # A commit found late that is older than the last one seen, and a pause of 5 s: neither
    # changes the period learnt.
    rhythms.note("a", int((last - 0.3) * 1000), last + 0.2, tight=False)
    rhythms.note("a", int((last + 5.0) * 1000), last + 5.01, tight=True)
    assert rhythms.next_due(last + 5.02) == pytest.approx(last + 5.0 + 0.1 + 0.01, abs=1e-3)


def test_without_tight_finds_the_least_lag_seen_is_used() -> None:
    """Finds by a first look are late by that look's delay: the least of their lags is the
    best estimate; tight finds (right after a miss), when there are some, decide."""
    rhythms = WriterRhythms()
    ts = 1000.0
    for lag in (0.03, 0.02, 0.05, 0.04):
        rhythms.note("a", int(ts * 1000), ts + lag, tight=False)
        ts += 0.1
    last = ts - 0.1
    assert rhythms.next_due(last) == pytest.approx(last + 0.1 + 0.02, abs=1e-3)
    rhythms.note("a", int(ts * 1000), ts + 0.006, tight=True)
    assert rhythms.next_due(ts) == pytest.approx(ts + 0.1 + 0.006, abs=1e-3)


def test_a_look_a_little_before_the_due_time_counts_the_commit_due() -> None:
    rhythms = WriterRhythms()
    last = _learn(rhythms, "a", 1000.0, 0.1, 0.01)
    due = last + 0.1 + 0.01
    assert rhythms.due_count(due - 0.005) == 1  # within a tenth of the period
    assert rhythms.due_count(due - 0.02) == 0


def test_writers_whose_commits_are_overdue_are_forgotten_when_a_look_finds_none() -> None:
    """A producer that stopped would otherwise have its commits counted due, more and more of
    them, for 2 s: every look would ask for a window of versions that do not exist."""
    rhythms = WriterRhythms()
    a = _learn(rhythms, "a", 1000.0, 0.005, 0.002)
    b = _learn(rhythms, "b", 991.0, 1.0, 0.002)
    now = a + 0.5
    assert 95 <= (rhythms.due_count(now) or 0) <= 100  # a's, by its rhythm; b's not yet due
    rhythms.forget_overdue(now)
    assert rhythms.due_count(now) == 0  # b's rhythm stays
    assert rhythms.next_due(now) == pytest.approx(b + 1.0 + 0.002, abs=1e-3)
