"""Times and durations as people type them on a command line."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime, timedelta

from kstore.errors import InvalidArgumentError

_UNITS_MS = {
    "ms": 1,
    "s": 1000,
    "sec": 1000,
    "m": 60_000,
    "min": 60_000,
    "h": 3_600_000,
    "d": 86_400_000,
    "w": 604_800_000,
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SIMPLE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|sec|min|s|m|h|d|w)")
_ISO = re.compile(
    r"P(?:(?P<d>\d+(?:\.\d+)?)D)?"
    r"(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)?",
    re.IGNORECASE,
)


def parse_duration_ms(text: str) -> int:
    """``90s``, ``15m``, ``1h30m``, ``2d``, ``500ms``, or ISO 8601 ``PT1H30M`` / ``P1DT2H``
    (Kafka's ``--by-duration`` format). Raises InvalidArgumentError (a ValueError)."""
    raw = text.strip()
    if not raw:
        raise InvalidArgumentError("empty duration")
    iso = _ISO.fullmatch(raw)
    if iso and raw.upper() not in ("P", "PT") and any(iso.groupdict().values()):
        parts = iso.groupdict()
        total = sum(
            float(parts[k] or 0) * _UNITS_MS[u]
            for k, u in (("d", "d"), ("h", "h"), ("m", "m"), ("s", "s"))
        )
        return round(total)
    position, total_ms = 0, 0.0
    compact = raw.replace(" ", "")
    while position < len(compact):
        match = _SIMPLE.match(compact, position)
        if match is None:
            raise InvalidArgumentError(
                f"{text!r} is not a duration (use e.g. 90s, 15m, 1h30m, 2d or PT1H)"
            )
        total_ms += float(match.group(1)) * _UNITS_MS[match.group(2)]
        position = match.end()
    return round(total_ms)


def parse_datetime_ms(text: str, *, now_ms: int | None = None) -> int:
    """A point in time, in ms since the epoch, from:

    - an ISO 8601 date-time (``2026-11-21T10:00:00Z``, ``2026-11-21T10:00:00.500+01:00``,
      ``2026-11-21 10:00``, ``2026-11-21``); without a zone it is local time, as in Kafka's
      ``--to-datetime``;
    - epoch milliseconds (``1795262458817``);
    - a duration meaning "that long ago" (``15m``, ``2h``, ``PT1H``), optionally with a
      leading ``-`` or a trailing `` ago``;
    - ``now``.
    """
    raw = text.strip()
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if raw.lower() == "now":
        return now
    if raw.isdigit():
        return int(raw)
    ago = raw.removeprefix("-").removesuffix("ago").strip()
    try:
        return now - parse_duration_ms(ago)
    except ValueError:
        pass
    iso = raw.replace("z", "Z")
    if iso.endswith("Z"):
        iso = iso[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(iso)
    except ValueError:
        raise InvalidArgumentError(
            f"{text!r} is not a time: use ISO 8601 (2026-11-21T10:00:00Z), epoch milliseconds, "
            "or a duration ago (15m, 2h)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.astimezone()  # local time, as Kafka's tools read it
    return (parsed - _EPOCH) // timedelta(milliseconds=1)
