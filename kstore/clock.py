"""The clock that every age and deadline of PROTOCOL.md 23.1 measured inside one process reads.

Linux's ``CLOCK_MONOTONIC`` (``time.monotonic``) stops while the machine is suspended: a state
confirmed as the newest before a three-day suspend would look seconds old after it, and the
24-hour reload rule, the commit deadline and sidecar freshness would all take a days-old state
for a fresh one. ``CLOCK_BOOTTIME`` counts the suspended time too (and, like the monotonic clock,
never steps with the wall clock), so it is what :func:`monotonic` reads where it exists.

:func:`advance` moves this clock forward for the whole process: the tests and the torture runs
use it to stand for a pause, a frozen VM or a suspend of any length without waiting for it.
"""

from __future__ import annotations

import threading
import time

from kstore.errors import InvalidArgumentError

_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)
_offset = 0.0
_lock = threading.Lock()


def _boottime() -> float:
    return time.clock_gettime(_BOOTTIME)  # type: ignore[arg-type]


_read = _boottime if _BOOTTIME is not None else time.monotonic


def monotonic() -> float:
    """Seconds on a clock that never goes back and counts suspended time (CLOCK_BOOTTIME)."""
    return _read() + _offset


def advance(seconds: float) -> None:
    """Move :func:`monotonic` forward by ``seconds`` for this process (a pause or suspend of
    that length, for tests and fault injection). The clock never goes back."""
    global _offset
    if not seconds >= 0:
        raise InvalidArgumentError(f"the clock only moves forward; got {seconds!r} s")
    with _lock:
        _offset += seconds
