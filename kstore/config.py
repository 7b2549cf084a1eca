"""Topic configuration: Kafka's names, Kafka's defaults where they exist, and validation.

Only explicitly set values are stored in the topic log; defaults are applied when read, so a
later release can change a default without rewriting any topic (and `describe` can tell the
two apart, as ``kafka-configs --describe`` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kstore.errors import InvalidConfigurationError
from kstore.settings import (
    INT64_MAX,
    BadSettingError,
    Setting,
    Settings,
    at_least,
    choice,
    integer,
    ratio,
)

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


# The declaration of one topic config key (kstore.settings' model).
ConfigSpec = Setting


def _cleanup_policy(value: Any) -> str:
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    parts = [str(p).strip() for p in items if str(p).strip()]
    if not parts:
        raise BadSettingError("must name at least one of delete, compact")
    for part in parts:
        if part not in CLEANUP_POLICIES:
            raise BadSettingError(f"{part!r} is not a cleanup policy (delete, compact, or both)")
    # Canonical order so that "delete,compact" and "compact,delete" compare equal.
    return ",".join(p for p in CLEANUP_POLICIES if p in parts)


_SPECS = [
    Setting(
        "cleanup.policy",
        "delete",
        _cleanup_policy,
        "delete (retention), compact (latest value per key), or compact,delete",
    ),
    Setting(
        "retention.ms",
        604_800_000,
        integer(0, allow_minus_one=True),
        "remove segments whose newest record is older than this; -1: keep forever",
    ),
    Setting(
        "retention.bytes",
        -1,
        integer(0, allow_minus_one=True),
        "remove the oldest segments while a partition is larger; -1: no limit",
    ),
    Setting("segment.bytes", 1_073_741_824, integer(14), "target size of merged segments"),
    Setting(
        "segment.ms",
        604_800_000,
        integer(1),
        "largest span of record timestamps in a segment that merging or compaction writes "
        "(with time retention, at most a tenth of retention.ms)",
    ),
    Setting(
        "min.compaction.lag.ms", 0, integer(0), "a record stays uncompacted at least this long"
    ),
    Setting(
        "max.compaction.lag.ms",
        INT64_MAX,
        integer(1),
        "a record is eligible for compaction at most this long after it was written",
    ),
    Setting(
        "delete.retention.ms", 86_400_000, integer(0), "how long tombstones survive compaction"
    ),
    Setting(
        "max.message.bytes",
        1_048_588,
        integer(0),
        "largest record (key + value + headers) accepted",
    ),
    Setting(
        "compression.type",
        "producer",
        choice(COMPRESSION_TYPES, {"none": "uncompressed"}),
        "segment compression: producer, uncompressed, zstd, lz4",
    ),
    Setting(
        "min.cleanable.dirty.ratio",
        0.5,
        ratio,
        "compact only when at least this fraction of the log is uncompacted",
    ),
    Setting(
        "file.delete.delay.ms",
        60_000,
        integer(MIN_FILE_DELETE_DELAY_MS),
        "grace period between removing a file from the manifest and deleting it, by the "
        f"storage's clock; at least {MIN_FILE_DELETE_DELAY_MS}",
        at_least(MIN_FILE_DELETE_DELAY_MS),
    ),
    Setting(
        "message.timestamp.type",
        "CreateTime",
        choice(TIMESTAMP_TYPES),
        "CreateTime (the producer's) or LogAppendTime (when the segment is written)",
    ),
    Setting(
        "commit.logs",
        1,
        integer(1, 100_000),
        "layout 3: how many commit logs the partitions share, partition p in log p mod this; "
        "fixed at creation (kstore-specific)",
    ),
    Setting(
        "commit.inline.bytes",
        1_048_576,
        integer(0, 64 << 20),
        "layout 3 at version 5/6 and later: a producer flush whose data for one commit log encodes to at "
        "most this many bytes is carried in the commit itself, with no data object (one PUT "
        "instead of two); 0 turns it off (kstore-specific)",
    ),
    Setting(
        "table.format",
        "none",
        choice(TABLE_FORMATS),
        "none, or delta: the maintenance jobs publish the merged Parquet segments as a Delta "
        "table in the topic's directory, by reference (kstore-specific)",
    ),
    Setting(
        "checkpoint.interval",
        100,
        integer(1, 100_000),
        "write a partition checkpoint every this many commits (kstore-specific)",
    ),
]
SPECS = Settings("topic config", _SPECS)


def validate_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """Validate explicitly set values; return them parsed into canonical types."""
    parsed = SPECS.validate(values)
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
        if name not in SPECS:
            out[name] = value
            continue
        try:
            out[name] = SPECS.read(name, value)
        except InvalidConfigurationError:
            continue
    return out


def validate_names(names: list[str]) -> None:
    SPECS.check_names(names)


def defaults() -> dict[str, Any]:
    return SPECS.defaults()


def effective(explicit: Mapping[str, Any]) -> dict[str, Any]:
    """Every known config value: explicit ones over the defaults."""
    return {**defaults(), **{k: v for k, v in explicit.items() if k in SPECS}}


def parse_config_value(name: str, value: Any) -> Any:
    return SPECS.parse(name, value)
