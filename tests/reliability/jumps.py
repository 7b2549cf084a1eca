"""Time that jumps, for torture runs: a suspend of every machine, or a process stopped for
days, in seconds of real time.

A run's jumps are kept in one JSON file, ``{"jumps": [[wall_ms, seconds], ...]}``: at the wall
time ``wall_ms`` (this machine's clock, which is also the storage's on local disk and on a
SeaweedFS on loopback) the world's time moved on by ``seconds``. Two clocks follow it:

- every process's boot-time clock (``kstore.clock``, which all ages of PROTOCOL.md 23.1 and
  23.2 inside a process read) is the real one plus every jump so far (:func:`install`);
- the storage's clock: a time the storage recorded (a file's modification time, a listing's,
  vacuum's probe) is shifted by the jumps made before it (:func:`storage_time_ms`), which the
  fault-injecting filesystem applies to every time it reports (``faultfs``).

So a file written before a jump of three days looks three days old to vacuum after it, a
cached state confirmed before it is stale, and a process stopped across it (SIGSTOP) resumes
with its clock three days on and its write, landing after the jump, recorded three days after
the files it wrote before: what a real three-day freeze does, with no one waiting for it.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from kstore import clock

_cache: dict[str, tuple[int, list[tuple[int, float]]]] = {}
_lock = threading.Lock()


def jumps(path: str) -> list[tuple[int, float]]:
    """The jumps recorded at ``path`` (wall ms, seconds), oldest first; re-read when the file
    changed."""
    try:
        stamp = os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return []
    with _lock:
        cached = _cache.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
    try:
        loaded = [(int(w), float(s)) for w, s in json.loads(Path(path).read_text())["jumps"]]
    except (ValueError, KeyError, OSError):  # caught mid-replace: the previous list holds
        return cached[1] if cached is not None else []
    with _lock:
        _cache[path] = (stamp, loaded)
    return loaded


def offset_s(path: str) -> float:
    """How far every clock has jumped so far."""
    return sum(seconds for _, seconds in jumps(path))


def storage_time_ms(path: str, recorded_ms: int) -> int:
    """A time the storage recorded, as the storage's clock would have it: shifted by every
    jump made before it."""
    return recorded_ms + int(1000 * sum(s for wall, s in jumps(path) if wall <= recorded_ms))


def jump(path: str, seconds: float, wall_ms: int) -> None:
    """Record a jump of ``seconds`` at ``wall_ms`` (atomically: readers see the old list or the
    new one)."""
    recorded = jumps(path)
    data = {"jumps": [[w, s] for w, s in recorded] + [[wall_ms, seconds]]}
    temporary = f"{path}.tmp-{os.getpid()}"
    Path(temporary).write_text(json.dumps(data))
    os.replace(temporary, path)


_unjumped: list[Any] = []  # the clock readers :func:`install` replaced, to put back


def install(path: str) -> None:
    """Make this process's ``kstore.clock`` follow the jumps at ``path``."""
    real = clock._read
    _unjumped.append(real)

    def jumped() -> float:
        return real() + offset_s(path)

    clock._read = jumped


def uninstall() -> None:
    """Undo the last :func:`install` (a driver in a test process: later tests keep a clock
    of their own)."""
    if _unjumped:
        clock._read = _unjumped.pop()


def shift_times(path: str, info: dict[str, Any]) -> dict[str, Any]:
    """A copy of an fsspec file description with its times as the jumped storage's clock has
    them (``mtime`` in seconds, ``LastModified``/``created`` as datetimes or seconds)."""
    out = dict(info)
    for key in ("mtime", "created"):
        value = out.get(key)
        if isinstance(value, int | float):
            out[key] = storage_time_ms(path, int(value * 1000)) / 1000
    modified = out.get("LastModified")
    if modified is not None and hasattr(modified, "timestamp"):
        import datetime

        shifted = storage_time_ms(path, int(modified.timestamp() * 1000)) / 1000
        out["LastModified"] = datetime.datetime.fromtimestamp(shifted, tz=datetime.UTC)
    return out
