"""When a polling consumer looks for new records, and how long it waits between looks.

On an object store every look is a GET: a poll waits for the next commit its writers are due
to make (kstore.rhythm), or for a share of the average gap between arrivals, and after a look
that found nothing backs off, across polls. On local disk a look is a failed open
(microseconds): a reader that found records lately looks a fraction of that gap apart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

# A fetch on an object store waits for the next new records until this share of the average
# gap between arrivals has passed (a gap counts at most ARRIVAL_GAP_MAX_S: an idle spell does
# not make the reader slow to notice the next record).
ARRIVAL_EARLY = 0.8
ARRIVAL_GAP_MAX_S = 1.0
# A look there that finds nothing looks again after this share of that gap at first (then
# backing off): a flush a little late costs a few GETs, not one every doubling from 0.5 ms.
ARRIVAL_STEP = 0.05
# On local disk a look for new records is a failed open (microseconds), so a reader that found
# records within ARRIVAL_GAP_MAX_S looks this share of the average gap between arrivals apart,
# within these bounds, instead of backing off to fetch_max_wait_ms; an idle one backs off as
# before. A busy stream is found a fraction of a commit late; a slow one costs few looks.
LOCAL_LOOK_SHARE = 0.1
LOCAL_LOOK_MIN_S = 0.0002
LOCAL_LOOK_MAX_S = 0.001

K = TypeVar("K")
V = TypeVar("V")


class Tailed(Protocol):
    """A log a fetch tailed (kstore.log.Log): when its writers' next commit is due."""

    def next_due(self) -> float | None: ...


class Pacer:
    """The waits of a consumer's polls, learnt from when its fetches found records."""

    def __init__(self, *, remote: bool, max_wait_ms: int) -> None:
        self._remote = remote  # an object store, where every look is a request
        self._cap = max_wait_ms / 1000  # fetch_max_wait_ms: the longest wait between looks
        # When fetches last found new records, the average gap between them, and when
        # (monotonic) the next are expected (note_arrival).
        self._last_arrival: float | None = None
        self._arrival_gap: float | None = None
        self._next_arrival = 0.0
        # Object stores: after a look that found nothing, the earliest time the next is worth
        # making, and the backoff it reached. Kept across polls until records arrive: a loop
        # of short polls over a quiet topic backs off as one long poll does, where each poll
        # started again from a few milliseconds (on S3, dozens of GETs a second per idle
        # consumer).
        self._next_look = 0.0
        self._look_backoff: float | None = None
        # The logs the last fetch tailed: when their writers' next commits are due.
        self._tailed: Sequence[Tailed] = ()

    def look_soon(self) -> None:
        """The next poll looks at once: what it reads changed (assignment, position, pause)."""
        self._next_look = 0.0
        self._look_backoff = None

    def tailing(self, logs: Sequence[Tailed]) -> None:
        """The logs a fetch tailed (their writers' rhythms say when to look next)."""
        self._tailed = logs

    def note_arrival(self) -> None:
        """A fetch found new records: learn how often they come (an average of the gaps
        between such fetches) and expect the next a little before that. A tailing reader on
        an object store then asks for the next version about once per producer flush instead
        of on a backoff from half a millisecond (several GETs that find nothing per flush)."""
        now = time.monotonic()
        self.look_soon()
        if self._last_arrival is not None:
            gap = min(now - self._last_arrival, ARRIVAL_GAP_MAX_S)
            self._arrival_gap = (
                gap if self._arrival_gap is None else 0.8 * self._arrival_gap + 0.2 * gap
            )
            self._next_arrival = now + ARRIVAL_EARLY * self._arrival_gap
        self._last_arrival = now

    def _found_lately(self, now: float) -> bool:
        """Whether a fetch found records within ARRIVAL_GAP_MAX_S of ``now``."""
        return self._last_arrival is not None and now - self._last_arrival < ARRIVAL_GAP_MAX_S

    def _local_look_step(self) -> float:
        """How far apart a reader on local disk that found records lately looks for more."""
        gap = self._arrival_gap
        if gap is None:
            return LOCAL_LOOK_MAX_S
        return min(LOCAL_LOOK_MAX_S, max(LOCAL_LOOK_MIN_S, LOCAL_LOOK_SHARE * gap))

    def _next_due(self) -> float | None:
        """Seconds until the next commit a tailed log's writers are due to land (negative: one
        is late), or None when no writer's rhythm is known (kstore.rhythm)."""
        dues = [d for log in self._tailed if (d := log.next_due()) is not None]
        return min(dues) if dues else None

    def run(
        self,
        timeout_ms: float,
        fetch: Callable[[], dict[K, V]],
        before_look: Callable[[], None],
        buffered: Callable[[], bool],
    ) -> dict[K, V]:
        """Look with ``fetch`` until it returns something or ``timeout_ms`` has passed (then
        the last, empty, result). ``before_look`` runs before each look (the group's duties);
        ``buffered`` tells whether records are already at hand (no request, no wait)."""
        deadline = time.monotonic() + max(0.0, timeout_ms) / 1000
        cap = self._cap
        remote = self._remote
        backoff = 0.0005
        if not remote and self._found_lately(time.monotonic()):
            backoff = self._local_look_step()
        if remote and self._arrival_gap is not None:
            backoff = min(cap, max(backoff, ARRIVAL_STEP * self._arrival_gap))
        if remote and self._look_backoff is not None:
            backoff = self._look_backoff  # the backoff the last polls' misses reached
        while True:
            before_look()
            if remote and not buffered():
                # On an object store every look is a GET: none before new data is due, within
                # what this poll may wait. When the producers' rhythms are known, when the
                # next of their commits is due; else a little before the average gap; and
                # after a look that found nothing, not before its backoff has passed. A poll
                # that ends before then returns nothing without a look.
                now = time.monotonic()
                due = self._next_due()
                wait = max(self._next_look - now, self._next_arrival - now if due is None else due)
                left = deadline - now
                if min(wait, cap) > left:
                    if left > 0:
                        time.sleep(left)
                    return {}
                if wait > 0:
                    time.sleep(min(wait, cap))
            result = fetch()
            if result:
                return result
            now = time.monotonic()
            left = deadline - now
            due = self._next_due() if remote else None
            if due is not None and due > backoff:
                # Nothing was late: the next commit due is further off than a backoff step.
                step = due
            else:
                step = backoff
                lately = not remote and self._found_lately(now)
                limit = min(cap, self._local_look_step()) if lately else cap
                backoff = min(limit, backoff * 2)
            if remote:
                self._next_look, self._look_backoff = now + step, backoff
            if left <= 0:
                return {}
            time.sleep(min(step, left))
