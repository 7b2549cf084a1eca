"""Topic configuration: Kafka's names, Kafka's defaults where they exist, and validation.

Only explicitly set values are stored in the topic log; defaults are applied when read, so a
later release can change a default without rewriting any topic (and `describe` can tell the
two apart, as ``kafka-configs --describe`` does).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kstore.errors import InvalidConfigurationError

INT64_MAX = 9_223_372_036_854_775_807

CLEANUP_POLICIES = ("delete", "compact")
# Arrow IPC supports exactly these two codecs; "producer" keeps whatever the producer chose.
COMPRESSION_TYPES = ("producer", "uncompressed", "zstd", "lz4")
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
TABLE_FORMATS = ("none", "delta")  # table.format: publish the Parquet segments as a table

# Time rules (PROTOCOL.md 23.1). Vacuum deletes an unreferenced file only when the storage's
# clock says it is older than the orphan age, at least MIN_ORPHAN_AGE_MS. A writer commits a
# file it wrote only while its own monotonic clock says the write started less than
# MAX_UNCOMMITTED_MS ago; the difference is the margin for a pause between that check and the
# commit landing. Every timeout that bounds how long a writer retries a commit (a producer's
# delivery_timeout_ms, the commit retry budget) is at most MAX_UNCOMMITTED_MS.
MIN_ORPHAN_AGE_MS = 10 * 60_000
MAX_UNCOMMITTED_MS = MIN_ORPHAN_AGE_MS // 2
# Removed files stay at least this long after the commit that removed them (storage clock):
# the window in which a reader that loaded the state before the removal opens the files it
# names, plus the storage clock's resolution (S3 records times to the second).
MIN_FILE_DELETE_DELAY_MS = 10_000
# A Spark sink's files wait for the driver's commit under a write intent, which keeps vacuum
# off them for INTENT_PROTECTION_MS (storage clock). The driver commits a file only within
# MAX_SINK_UNCOMMITTED_MS of the time in its name (the task's wall clock at the start of the
# write, against the driver's): the difference is the margin for skew between those clocks.
INTENT_PROTECTION_MS = 7 * 24 * 3600 * 1000
MAX_SINK_UNCOMMITTED_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class ConfigSpec:
    name: str
    default: Any
    parse: Callable[[str, Any], Any]
    doc: str
    # How a stored value is read, when more leniently than a new value is validated.
    read: Callable[[str, Any], Any] | None = None


def _int(
    minimum: int, maximum: int = INT64_MAX, *, allow_minus_one: bool = False
) -> Callable[[str, Any], int]:
    def parse(name: str, value: Any) -> int:
        if isinstance(value, bool):
            raise InvalidConfigurationError(f"config {name!r}: expected an integer, got a boolean")
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise InvalidConfigurationError(
                    f"config {name!r}: expected an integer, got {value!r}"
                ) from None
        if not isinstance(value, int):
            raise InvalidConfigurationError(
                f"config {name!r}: expected an integer, got {type(value).__name__}"
            )
        if allow_minus_one and value == -1:
            return value
        if not minimum <= value <= maximum:
            extra = " (or -1 for unlimited)" if allow_minus_one else ""
            raise InvalidConfigurationError(
                f"config {name!r}: {value} is out of range [{minimum}, {maximum}]{extra}"
            )
        return value

    return parse


def _at_least(floor: int) -> Callable[[str, Any], int]:
    """Reads a stored integer below ``floor`` (written before the floor existed) as ``floor``."""
    lenient = _int(0)

    def read(name: str, value: Any) -> int:
        return max(lenient(name, value), floor)

    return read


def _ratio(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise InvalidConfigurationError(
            f"config {name!r}: expected a number, got {value!r}"
        ) from None
    if isinstance(value, bool) or not 0.0 <= number <= 1.0:
        raise InvalidConfigurationError(f"config {name!r}: {value!r} is out of range [0, 1]")
    return number


def _choice(
    choices: tuple[str, ...], aliases: Mapping[str, str] | None = None
) -> Callable[[str, Any], str]:
    def parse(name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise InvalidConfigurationError(
                f"config {name!r}: expected a string, got {type(value).__name__}"
            )
        text = (aliases or {}).get(value.strip(), value.strip())
        if text not in choices:
            raise InvalidConfigurationError(
                f"config {name!r}: {value!r} is not one of {', '.join(choices)}"
            )
        return text

    return parse


def _cleanup_policy(name: str, value: Any) -> str:
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    parts = [str(p).strip() for p in items if str(p).strip()]
    if not parts:
        raise InvalidConfigurationError(
            f"config {name!r}: must name at least one of delete, compact"
        )
    for part in parts:
        if part not in CLEANUP_POLICIES:
            raise InvalidConfigurationError(
                f"config {name!r}: {part!r} is not a cleanup policy (delete, compact, or both)"
            )
    # Canonical order so that "delete,compact" and "compact,delete" compare equal.
    return ",".join(p for p in CLEANUP_POLICIES if p in parts)


_SPECS = [
    ConfigSpec(
        "cleanup.policy",
        "delete",
        _cleanup_policy,
        "delete (retention), compact (latest value per key), or compact,delete",
    ),
    ConfigSpec(
        "retention.ms",
        604_800_000,
        _int(0, allow_minus_one=True),
        "remove segments whose newest record is older than this; -1: keep forever",
    ),
    ConfigSpec(
        "retention.bytes",
        -1,
        _int(0, allow_minus_one=True),
        "remove the oldest segments while a partition is larger; -1: no limit",
    ),
    ConfigSpec("segment.bytes", 1_073_741_824, _int(14), "target size of merged segments"),
    ConfigSpec(
        "segment.ms",
        604_800_000,
        _int(1),
        "largest span of record timestamps in a segment that merging or compaction writes "
        "(with time retention, at most a tenth of retention.ms)",
    ),
    ConfigSpec(
        "min.compaction.lag.ms", 0, _int(0), "a record stays uncompacted at least this long"
    ),
    ConfigSpec(
        "max.compaction.lag.ms",
        INT64_MAX,
        _int(1),
        "a record is eligible for compaction at most this long after it was written",
    ),
    ConfigSpec(
        "delete.retention.ms", 86_400_000, _int(0), "how long tombstones survive compaction"
    ),
    ConfigSpec(
        "max.message.bytes", 1_048_588, _int(0), "largest record (key + value + headers) accepted"
    ),
    ConfigSpec(
        "compression.type",
        "producer",
        _choice(COMPRESSION_TYPES, {"none": "uncompressed"}),
        "segment compression: producer, uncompressed, zstd, lz4",
    ),
    ConfigSpec(
        "min.cleanable.dirty.ratio",
        0.5,
        _ratio,
        "compact only when at least this fraction of the log is uncompacted",
    ),
    ConfigSpec(
        "file.delete.delay.ms",
        60_000,
        _int(MIN_FILE_DELETE_DELAY_MS),
        "grace period between removing a file from the manifest and deleting it, by the "
        f"storage's clock; at least {MIN_FILE_DELETE_DELAY_MS}",
        _at_least(MIN_FILE_DELETE_DELAY_MS),
    ),
    ConfigSpec(
        "message.timestamp.type",
        "CreateTime",
        _choice(TIMESTAMP_TYPES),
        "CreateTime (the producer's) or LogAppendTime (when the segment is written)",
    ),
    ConfigSpec(
        "commit.logs",
        1,
        _int(1, 100_000),
        "layout 3: how many commit logs the partitions share, partition p in log p mod this; "
        "fixed at creation (kstore-specific)",
    ),
    ConfigSpec(
        "commit.inline.bytes",
        1_048_576,
        _int(0, 64 << 20),
        "layout 3 at version 5/6 and later: a producer flush whose data for one commit log encodes to at "
        "most this many bytes is carried in the commit itself, with no data object (one PUT "
        "instead of two); 0 turns it off (kstore-specific)",
    ),
    ConfigSpec(
        "table.format",
        "none",
        _choice(TABLE_FORMATS),
        "none, or delta: the maintenance jobs publish the merged Parquet segments as a Delta "
        "table in the topic's directory, by reference (kstore-specific)",
    ),
    ConfigSpec(
        "checkpoint.interval",
        100,
        _int(1, 100_000),
        "write a partition checkpoint every this many commits (kstore-specific)",
    ),
]
SPECS: dict[str, ConfigSpec] = {spec.name: spec for spec in _SPECS}


def _unknown(name: str) -> InvalidConfigurationError:
    close = difflib.get_close_matches(name, list(SPECS), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return InvalidConfigurationError(f"unknown topic config {name!r}{hint}")


def validate_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """Validate explicitly set values; return them parsed into canonical types."""
    if not isinstance(values, Mapping):
        raise InvalidConfigurationError(
            f"topic config must be a mapping, got {type(values).__name__}"
        )
    parsed: dict[str, Any] = {}
    for name, value in values.items():
        if not isinstance(name, str) or name not in SPECS:
            raise _unknown(str(name))
        parsed[name] = SPECS[name].parse(name, value)
    _check_relations({**defaults(), **parsed})
    return parsed


def _check_relations(effective: Mapping[str, Any]) -> None:
    if effective["min.compaction.lag.ms"] > effective["max.compaction.lag.ms"]:
        raise InvalidConfigurationError(
            "config 'min.compaction.lag.ms' must not exceed 'max.compaction.lag.ms'"
        )


def read_config(stored: Mapping[str, Any]) -> dict[str, Any]:
    """Config as stored in a topic log, for reading: known keys parsed, unknown keys (from a
    newer writer) kept as they are, and a value this version cannot parse falls back to the
    default rather than making the topic unreadable."""
    out: dict[str, Any] = {}
    for name, value in stored.items():
        spec = SPECS.get(name)
        if spec is None:
            out[name] = value
            continue
        try:
            out[name] = (spec.read or spec.parse)(name, value)
        except InvalidConfigurationError:
            continue
    return out


def validate_names(names: list[str]) -> None:
    for name in names:
        if not isinstance(name, str) or name not in SPECS:
            raise _unknown(str(name))


def defaults() -> dict[str, Any]:
    return {name: spec.default for name, spec in SPECS.items()}


def effective(explicit: Mapping[str, Any]) -> dict[str, Any]:
    """Every known config value: explicit ones over the defaults."""
    return {**defaults(), **{k: v for k, v in explicit.items() if k in SPECS}}


def parse_config_value(name: str, value: Any) -> Any:
    if name not in SPECS:
        raise _unknown(name)
    return SPECS[name].parse(name, value)
