"""When a tailing reader expects the next commit of a log: each writer's rhythm.

On an object store every look for a new version is a GET, and a look before the version landed
finds nothing. Producers commit in rhythms of their own (one every ``linger_ms`` plus the time
a commit takes), and a log that several producers write sees those rhythms interleaved, so the
gap between versions is irregular even when each writer is regular. A reader that learns each
writer's rhythm from the timestamps in its commits (``commitInfo.timestamp``, the writer's
clock) can look when the next one is due.

The writer's clock is never compared with the reader's directly: what is learnt is, per writer,
how long after its timestamp a commit is seen here (the commit's own latency plus any clock
skew), measured from finds that came right after a look that missed (so they are within one
backoff step of the landing), and the upper quartile of those is used.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

# A writer not seen for this many of its periods (or this long) has stopped: it predicts nothing.
_STOPPED_PERIODS = 3
_STOPPED_S = 2.0
# Gaps between a writer's commits longer than this are pauses, not its rhythm.
_MAX_PERIOD_S = 1.0
_LAGS_KEPT = 16
_WRITERS_KEPT = 64
# Share of a period before its due time at which a writer's next commit counts as due.
_DUE_TOLERANCE = 0.1


def _lag(writer: _Writer) -> float:
    """How long after its timestamp a writer's commit is seen (a look finds it). Tight finds
    are within a backoff step of the landing: their upper quartile (a look a little late costs
    a few milliseconds, one a little early a GET that finds nothing and a backoff step).
    Without them, the least lag seen (a find on a first look is late by the look's delay)."""
    if len(writer.lags) >= 4:
        return statistics.quantiles(writer.lags, n=4)[2]
    if writer.lags:
        return statistics.median(writer.lags)
    return min(writer.loose)


@dataclass
class _Writer:
    last_ts: float  # seconds, the writer's clock
    seen_at: float  # seconds, the reader's wall clock
    period: float | None = None
    lags: deque[float] = field(default_factory=lambda: deque(maxlen=_LAGS_KEPT))
    loose: deque[float] = field(default_factory=lambda: deque(maxlen=_LAGS_KEPT))


class WriterRhythms:
    """Per writer of a log: its period and how late after its timestamp a commit is seen."""

    def __init__(self) -> None:
        self._writers: dict[str, _Writer] = {}

    def note(self, writer: str, timestamp_ms: int, seen_at: float, *, tight: bool) -> None:
        """A commit by ``writer`` stamped ``timestamp_ms`` was found at ``seen_at`` (wall clock,
        seconds). ``tight``: found by a look moments after one that missed it."""
        ts = timestamp_ms / 1000
        known = self._writers.get(writer)
        if known is None:
            if len(self._writers) >= _WRITERS_KEPT:
                oldest = min(self._writers, key=lambda w: self._writers[w].seen_at)
                del self._writers[oldest]
            known = self._writers[writer] = _Writer(last_ts=ts, seen_at=seen_at)
        elif ts > known.last_ts:
            gap = ts - known.last_ts
            if gap <= _MAX_PERIOD_S:
                known.period = gap if known.period is None else 0.8 * known.period + 0.2 * gap
            known.last_ts, known.seen_at = ts, seen_at
        else:
            return  # an older commit of this writer (found late, or its clock stepped back)
        (known.lags if tight else known.loose).append(seen_at - ts)

    def due_count(self, now: float) -> int | None:
        """How many commits of writers in rhythm are due by ``now`` (wall clock, seconds);
        None when no writer is in a rhythm."""
        count: int | None = None
        for writer, lag in self._in_rhythm(now):
            assert writer.period is not None
            # A look a little before the due time counts it due: that is when looks are made.
            late = (now - writer.last_ts - lag) / writer.period + _DUE_TOLERANCE
            count = (count or 0) + max(0, int(late))
        return count

    def forget_overdue(self, now: float) -> None:
        """A look asked for the commits the rhythms said were due and found none: the writers
        whose commit is overdue have stopped or paused, and predict nothing until their next
        commits teach them again (a stopped writer would otherwise make every look ask for a
        window of versions that do not exist)."""
        for key, (writer, lag) in list(self._keyed_in_rhythm(now).items()):
            assert writer.period is not None
            if now > writer.last_ts + writer.period + lag:
                del self._writers[key]

    def _in_rhythm(self, now: float) -> list[tuple[_Writer, float]]:
        """The writers in a rhythm, each with its lag."""
        return list(self._keyed_in_rhythm(now).values())

    def _keyed_in_rhythm(self, now: float) -> dict[str, tuple[_Writer, float]]:
        out = {}
        for key, writer in self._writers.items():
            period = writer.period
            if period is None or now - writer.seen_at > max(_STOPPED_PERIODS * period, _STOPPED_S):
                continue
            if not writer.lags and not writer.loose:
                continue
            out[key] = (writer, _lag(writer))
        return out

    def next_due(self, now: float) -> float | None:
        """The wall-clock time (seconds) the next commit of a writer in rhythm is expected to be
        seen, the earliest of them; None when no writer is in a rhythm. A time in the past
        means a commit is late."""
        due: float | None = None
        for writer, lag in self._in_rhythm(now):
            assert writer.period is not None
            when = writer.last_ts + writer.period + lag
            due = when if due is None else min(due, when)
        return due
