"""Options of the ``kstore`` data source: parsing and validation, with the Kafka source's names.

Spark hands a data source its options with lower-cased keys; every name here is matched
case-insensitively and every error names the option at fault. Nothing in this module does I/O,
so a bad option fails at once on the driver, before any job runs.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kstore.errors import InvalidConfigurationError, InvalidGroupIdError
from kstore.names import validate_group_id, validate_topic_name
from kstore.partitioner import PARTITIONER_NAMES
from kstore.settings import (
    MAX_BYTES,
    BadSettingError,
    Setting,
    Validator,
    boolean_text,
    choice,
    duration_ms,
    integer,
    is_int,
    size_bytes,
)

log = logging.getLogger(__name__)

EARLIEST = -2  # Kafka's sentinels in the JSON offset form
LATEST = -1
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000  # Kafka's default "15m"
MAX_MIN_PARTITIONS = 100_000  # a limit on everything

# Options Spark itself may add to a data source's options (paths, streaming, and the table
# properties a catalog table carries); accepted and ignored.
SPARK_OPTIONS = frozenset(
    {
        "path",
        "paths",
        "checkpointlocation",
        "queryname",
        "provider",
        "location",
        "comment",
        "owner",
        "external",
        "is_managed_location",
        "collation",
        "serialization.format",
    }
)

# Kafka connector options a ported job carries. Kafka's own connector takes every "kafka.*"
# option as a client setting; kstore has no client to hand them to, so each is mapped to its
# kstore option, ignored with a logged note (broker, network and client tuning), or refused
# when ignoring it would silently change what the job does.
KAFKA_MAPPED = {
    "kafka.group.id": "groupid",
    "kafka.isolation.level": "isolationlevel",
    "kafka.acks": "acks",
    "kafka.compression.type": "compression",
}
KAFKA_REFUSED = {
    "kafka.auto.offset.reset": "use option 'startingOffsets' (earliest or latest)",
    "kafka.enable.auto.commit": "use option 'groupId' to record each micro-batch's offsets",
    "kafka.key.deserializer": "keys are read as binary (or a typed topic's declared type); "
    "cast or parse the 'key' column",
    "kafka.value.deserializer": "values are read as binary (or a typed topic's declared "
    "type); cast or parse the 'value' column",
    "kafka.key.serializer": "write 'key' as string or binary (or the typed topic's key type)",
    "kafka.value.serializer": "write 'value' as string or binary (or a struct for a typed topic)",
    "kafka.partitioner.class": "use option 'partitioner' (" + ", ".join(PARTITIONER_NAMES) + ")",
    "kafka.interceptor.classes": "kstore runs no client interceptors",
    "kafka.transactional.id": "writes are exactly-once per micro-batch already; for batch "
    "writes use options 'txnAppId' and 'txnVersion'",
}
# Kafka source options that choose or tune a Kafka consumer; nothing to choose without one.
KAFKA_IGNORED_OPTIONS = frozenset(
    {
        "groupidprefix",
        "kafkaconsumer.polltimeoutms",
        "fetchoffset.numretries",
        "fetchoffset.retryintervalms",
    }
)


def _text(value: Any) -> str:
    return str(value)


def _option(name: str, doc: str, default: str | None = None, parse: Validator = _text) -> Setting:
    """An option as Spark hands it over (a string); ``parse`` is its typed validator where
    one applies, else its own parser below reads it."""
    return Setting(name, default, parse, doc)


_POSITIVE = integer(1)
STORE_SETTINGS = (
    _option("store", "the store's URL"),
    _option("storageOptions", "fsspec storage options, a JSON object", "{}"),
)
READ_SETTINGS = (
    _option("subscribe", "comma-separated topics"),
    _option("subscribePattern", "a regular expression over whole topic names"),
    _option("assign", 'JSON {"topicA":[0,1]}'),
    _option("startingOffsets", "earliest, latest, group or JSON offsets"),
    _option("endingOffsets", "batch only: latest or JSON offsets", "latest"),
    _option("startingTimestamp", "ms: start at the first offset at or after it", None, integer(0)),
    _option("startingOffsetsByTimestamp", "JSON timestamps per partition"),
    _option(
        "startingOffsetsByTimestampStrategy",
        "error or latest, when no record is that new",
        "error",
        choice(("error", "latest"), lower=True),
    ),
    _option("endingTimestamp", "batch only: ms, the end", None, integer(0)),
    _option("endingOffsetsByTimestamp", "batch only: JSON timestamps per partition"),
    _option("maxOffsetsPerTrigger", "streaming: offsets per micro-batch", None, _POSITIVE),
    _option("minOffsetsPerTrigger", "streaming: wait for this many new offsets", None, _POSITIVE),
    _option("maxTriggerDelay", "...but no longer than this", "15m", duration_ms),
    _option("maxBytesPerTrigger", "streaming: stored bytes per micro-batch", None, size_bytes),
    _option(
        "minPartitions",
        "at least this many Spark partitions",
        None,
        integer(1, MAX_MIN_PARTITIONS),
    ),
    _option("maxRecordsPerPartition", "at most about this many offsets per task", None, _POSITIVE),
    _option("failOnDataLoss", "fail when offsets to read are gone", "true", boolean_text),
    _option("includeHeaders", "add the headers column", "false", boolean_text),
    _option(
        "isolationLevel",
        "read_committed or read_uncommitted",
        "read_committed",
        choice(("read_committed", "read_uncommitted"), lower=True),
    ),
    _option("groupId", "record each micro-batch's offsets in this consumer group"),
    _option("flattenValue", "typed topics: value fields as columns", "false", boolean_text),
)
WRITE_SETTINGS = (
    _option("topic", "the topic (overrides a topic column)"),
    _option("partitioner", ", ".join(PARTITIONER_NAMES), "murmur2"),
    _option("txnAppId", "transaction app id"),
    _option("txnVersion", "batch writes: with txnAppId, the job's version", None, integer(0)),
    _option(
        "segmentBytes",
        "buffered bytes per partition before a new segment",
        "64m",
        size_bytes,
    ),
    _option("compression", "none, zstd or lz4"),
    _option("acks", "all or 1", "all"),
    _option("keepTimestamp", "write the timestamp column as CreateTime", "false", boolean_text),
)
STORE_OPTIONS = tuple(s.name.lower() for s in STORE_SETTINGS)
READ_OPTIONS = tuple(s.name.lower() for s in READ_SETTINGS)
WRITE_OPTIONS = tuple(s.name.lower() for s in WRITE_SETTINGS)
_DEFAULTS = {s.name.lower(): s.default for s in (*STORE_SETTINGS, *READ_SETTINGS, *WRITE_SETTINGS)}
# The spelling shown in messages (Spark lower-cases the keys it hands over).
CANONICAL = {s.name.lower(): s.name for s in (*STORE_SETTINGS, *READ_SETTINGS, *WRITE_SETTINGS)}


class InvalidOptionError(InvalidConfigurationError):
    """A data source option is unknown, missing, malformed or conflicts with another."""


def given(options: Mapping[str, str], name: str) -> str:
    """The option's value as given, else its declared default."""
    value: str | None = options.get(name, _DEFAULTS[name])
    assert value is not None, f"option {name!r} has no default"
    return value


def shown(name: str) -> str:
    return CANONICAL.get(name.lower(), name)


def _bad(name: str, problem: str) -> InvalidOptionError:
    return InvalidOptionError(f"kstore option {shown(name)!r}: {problem}")


def normalize(options: Mapping[str, Any]) -> dict[str, str]:
    """Lower-cased keys; unknown options rejected with a suggestion (never silently ignored).

    Read and write options are both accepted on either side, so one SQL table definition
    (``CREATE TABLE ... USING kstore OPTIONS (...)``) serves SELECT and INSERT alike.
    """
    out: dict[str, str] = {}
    allowed = set(READ_OPTIONS) | set(WRITE_OPTIONS) | set(STORE_OPTIONS)
    plain = {str(k).lower() for k in options}
    for raw_key, value in options.items():
        key = str(raw_key).lower()
        if key.startswith("option."):
            # A catalog table also hands its options over as table properties "option.<name>".
            key = key[len("option.") :]
            if key in plain:
                continue
        if key in SPARK_OPTIONS or key.startswith(("__", "storage.")):
            out[key] = str(value)
            continue
        if key.startswith("kafka.") or key in KAFKA_IGNORED_OPTIONS:
            _kafka_option(str(raw_key), key, str(value), out)
            continue
        if key not in allowed:
            candidates = [shown(k) for k in sorted(allowed)]
            close = difflib.get_close_matches(shown(key), candidates, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise InvalidOptionError(f"unknown kstore option {raw_key!r}{hint}")
        if key in out and out[key] != str(value):
            raise _conflict(key, str(value), out[key])
        out[key] = str(value)
    if "kafka.bootstrap.servers" in out:
        if "store" not in out:
            raise InvalidOptionError(
                "kstore option 'store' is required: kstore has no brokers, so "
                "'kafka.bootstrap.servers' cannot stand for it; give the store's URL, e.g. "
                "option('store', 's3://bucket/prefix')"
            )
        del out["kafka.bootstrap.servers"]
    return out


def _conflict(key: str, value: str, other: str) -> InvalidOptionError:
    names = [k for k, v in KAFKA_MAPPED.items() if v == key]
    origin = f" (or {names[0]!r})" if names else ""
    return InvalidOptionError(
        f"kstore option {shown(key)!r}{origin} is given twice with different values: "
        f"{other!r} and {value!r}"
    )


def _kafka_option(raw_key: str, key: str, value: str, out: dict[str, str]) -> None:
    """A Kafka connector option: mapped to its kstore option, ignored with a logged note, or
    refused naming the kstore way (see KAFKA_MAPPED and KAFKA_REFUSED)."""
    if key in KAFKA_REFUSED:
        raise InvalidOptionError(
            f"kstore option {raw_key!r} is not supported: {KAFKA_REFUSED[key]}"
        )
    mapped = KAFKA_MAPPED.get(key)
    if mapped is not None:
        if mapped in out and out[mapped] != value:
            raise _conflict(mapped, value, out[mapped])
        out[mapped] = value
        return
    if key == "kafka.bootstrap.servers":
        out[key] = value  # dropped once 'store' is known to be given (normalize)
        return
    log.info(
        "kstore: ignoring option %r (it configures Kafka's clients; kstore reads and writes "
        "the store directly)",
        raw_key,
    )


# -- value parsers --------------------------------------------------------------------------------


def _checked(name: str, validator: Validator, value: str) -> Any:
    try:
        return validator(value)
    except BadSettingError as problem:
        raise _bad(name, str(problem)) from None


def parse_bool(name: str, value: str) -> bool:
    parsed: bool = _checked(name, boolean_text, value)
    return parsed


def parse_int(name: str, value: str, *, minimum: int = 0, maximum: int = MAX_BYTES) -> int:
    parsed: int = _checked(name, integer(minimum, maximum), value)
    return parsed


def parse_duration_ms(name: str, value: str) -> int:
    """Spark's time strings (``Utils.timeStringAsMs``): ``15m``, ``10s``, ``500ms``, ``100``."""
    parsed: int = _checked(name, duration_ms, value)
    return parsed


def parse_bytes(name: str, value: str) -> int:
    """Byte sizes as Spark writes them: ``1048576``, ``512k``, ``64m``, ``1g``."""
    parsed: int = _checked(name, size_bytes, value)
    return parsed


def parse_json(name: str, value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise _bad(name, f"malformed JSON ({exc}): {value!r}") from None


def _partition_number(name: str, topic: str, key: object) -> int:
    text = str(key)
    if not text.isdigit():
        raise _bad(name, f"topic {topic!r}: partition {key!r} is not a non-negative integer")
    return int(text)


def parse_offsets_json(
    name: str, value: str, *, allow: tuple[int, ...]
) -> dict[tuple[str, int], int]:
    """``{"topicA":{"0":23,"1":-1}}``: offsets per topic-partition; ``allow`` lists the
    sentinels (-2 earliest, -1 latest) this option accepts."""
    data = parse_json(name, value)
    if not isinstance(data, dict) or not data:
        raise _bad(name, 'expected a JSON object like {"topic":{"0":23,"1":-2}}')
    out: dict[tuple[str, int], int] = {}
    for topic, parts in data.items():
        _topic_name(name, topic)
        if not isinstance(parts, dict):
            raise _bad(name, f"topic {topic!r}: expected an object of partition -> offset")
        for key, offset in parts.items():
            p = _partition_number(name, topic, key)
            if not is_int(offset):
                raise _bad(name, f"{topic}-{p}: offset {offset!r} is not an integer")
            if offset < 0 and offset not in allow:
                meaning = {EARLIEST: "-2 (earliest)", LATEST: "-1 (latest)"}.get(
                    offset, str(offset)
                )
                raise _bad(name, f"{topic}-{p}: offset {meaning} is not allowed here")
            out[(topic, p)] = offset
    return out


def parse_timestamps_json(name: str, value: str) -> dict[tuple[str, int], int]:
    """``{"topicA":{"0":1700000000000}}``: a timestamp (ms) per topic-partition."""
    data = parse_json(name, value)
    if not isinstance(data, dict) or not data:
        raise _bad(name, 'expected a JSON object like {"topic":{"0":1700000000000}}')
    out: dict[tuple[str, int], int] = {}
    for topic, parts in data.items():
        _topic_name(name, topic)
        if not isinstance(parts, dict):
            raise _bad(name, f"topic {topic!r}: expected an object of partition -> timestamp")
        for key, stamp in parts.items():
            p = _partition_number(name, topic, key)
            if not is_int(stamp) or stamp < 0:
                raise _bad(
                    name, f"{topic}-{p}: timestamp {stamp!r} is not a non-negative integer (ms)"
                )
            out[(topic, p)] = stamp
    return out


def _topic_name(option: str, topic: object) -> str:
    try:
        return validate_topic_name(topic)
    except ValueError as exc:
        raise _bad(option, str(exc)) from None


# -- the store ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreRef:
    """Where the store is: URL plus fsspec storage options (hashable, so it keys a cache)."""

    url: str
    options_json: str = "{}"

    @property
    def storage_options(self) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.options_json)
        return value


def parse_store(options: Mapping[str, str]) -> StoreRef:
    url = options.get("store", "").strip()
    if not url:
        hint = ""
        if not options:
            # Spark 4.3 hands a Python data source none of a catalog table's options.
            hint = (
                " (no option at all reached the source: Spark does not pass a catalog table's "
                "options to a Python data source; use a temporary view, CREATE TEMPORARY VIEW v "
                "USING kstore OPTIONS (...), or give them in the statement: ... WITH ('store' = '...'))"
            )
        raise InvalidOptionError(
            "kstore option 'store' is required: the store's URL, e.g. file:///data/ks or "
            f"s3://bucket/prefix{hint}"
        )
    storage: dict[str, Any] = {}
    if "storageoptions" in options:
        data = parse_json("storageoptions", options["storageoptions"])
        if not isinstance(data, dict):
            raise _bad("storageoptions", "expected a JSON object of fsspec storage options")
        storage.update(data)
    for key, value in options.items():
        if key.startswith("storage."):
            name = key[len("storage.") :]
            if not name:
                raise InvalidOptionError(f"kstore option {key!r}: names no storage option")
            storage[name] = _storage_value(key, value)
    return StoreRef(url, json.dumps(storage, sort_keys=True))


def _storage_value(key: str, value: str) -> Any:
    """``storage.<name>`` values are strings, except true/false and JSON objects (nested
    settings such as ``client_kwargs``). Numbers stay strings: a secret may look like one."""
    text = value.strip()
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    if text.startswith("{"):
        return parse_json(key, text)
    return value


# -- read options ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Subscription:
    kind: str  # "subscribe", "subscribePattern" or "assign"
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, int], ...] = ()

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribePattern":
            assert self.pattern is not None
            return re.fullmatch(self.pattern, topic) is not None
        if self.kind == "assign":
            return any(t == topic for t, _ in self.assigned)
        return topic in self.topics


@dataclass(frozen=True)
class OffsetSpec:
    """A starting or ending position: earliest, latest, specific offsets or timestamps."""

    kind: str  # "earliest", "latest", "offsets", "timestamp", "timestamps"
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    timestamp_ms: int | None = None
    timestamps: dict[tuple[str, int], int] = field(default_factory=dict)
    option: str = ""  # the option it came from, for messages


@dataclass(frozen=True)
class ReadOptions:
    store: StoreRef
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    timestamp_strategy: str  # "error" or "latest"
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    max_bytes_per_trigger: int | None
    min_partitions: int | None
    fail_on_data_loss: bool
    include_headers: bool
    read_committed: bool
    group_id: str | None
    streaming: bool
    flatten_value: bool = False
    max_records_per_partition: int | None = None


def parse_subscription(options: Mapping[str, str]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in options]
    if len(given) != 1:
        names = ", ".join(shown(k) for k in given) if given else "none"
        raise InvalidOptionError(
            "kstore source: give exactly one of the options 'subscribe', 'subscribePattern' or "
            f"'assign' (given: {names})"
        )
    kind = given[0]
    value = options[kind]
    if kind == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise _bad(kind, "names no topic; expected a comma-separated list of topics")
        for t in topics:
            _topic_name(kind, t)
        return Subscription("subscribe", topics=tuple(dict.fromkeys(topics)))
    if kind == "subscribepattern":
        if not value.strip():
            raise _bad(kind, "is empty; expected a regular expression over topic names")
        try:
            re.compile(value)
        except re.error as exc:
            raise _bad(kind, f"invalid regular expression {value!r} ({exc})") from None
        return Subscription("subscribePattern", pattern=value)
    data = parse_json(kind, value)
    if not isinstance(data, dict) or not data:
        raise _bad(kind, 'expected a JSON object like {"topicA":[0,1],"topicB":[2,4]}')
    assigned: list[tuple[str, int]] = []
    for topic, parts in data.items():
        _topic_name(kind, topic)
        if not isinstance(parts, list) or not parts:
            raise _bad(kind, f"topic {topic!r}: expected a non-empty list of partition numbers")
        for p in parts:
            if not is_int(p) or p < 0:
                raise _bad(kind, f"topic {topic!r}: partition {p!r} is not a non-negative integer")
            assigned.append((topic, p))
    return Subscription("assign", assigned=tuple(dict.fromkeys(assigned)))


def _starting(options: Mapping[str, str], streaming: bool) -> OffsetSpec:
    # Kafka's precedence: startingTimestamp, then startingOffsetsByTimestamp, then startingOffsets.
    if "startingtimestamp" in options:
        stamp = parse_int("startingtimestamp", options["startingtimestamp"])
        return OffsetSpec("timestamp", timestamp_ms=stamp, option="startingTimestamp")
    if "startingoffsetsbytimestamp" in options:
        stamps = parse_timestamps_json(
            "startingoffsetsbytimestamp", options["startingoffsetsbytimestamp"]
        )
        return OffsetSpec("timestamps", timestamps=stamps, option="startingOffsetsByTimestamp")
    value = options.get("startingoffsets")
    if value is None:
        return OffsetSpec("latest" if streaming else "earliest", option="startingOffsets")
    text = value.strip()
    lowered = text.lower()
    if lowered == "earliest":
        return OffsetSpec("earliest", option="startingOffsets")
    if lowered == "latest":
        if not streaming:
            raise _bad(
                "startingoffsets",
                "'latest' is not allowed for batch queries (it would read nothing)",
            )
        return OffsetSpec("latest", option="startingOffsets")
    if lowered == "group":
        # Where the consumer group (option groupId) left off; checked against groupId below.
        return OffsetSpec("group", option="startingOffsets")
    if not text.startswith("{"):
        raise _bad("startingoffsets", f"expected earliest, latest or a JSON object, got {value!r}")
    allow = (EARLIEST, LATEST) if streaming else (EARLIEST,)
    offsets = parse_offsets_json("startingoffsets", text, allow=allow)
    return OffsetSpec("offsets", offsets=offsets, option="startingOffsets")


def _ending(options: Mapping[str, str], streaming: bool) -> OffsetSpec:
    given = [
        k for k in ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp") if k in options
    ]
    if streaming:
        if given:
            raise _bad(given[0], "is for batch queries only; a streaming query has no end")
        return OffsetSpec("latest", option="endingOffsets")
    if "endingtimestamp" in options:
        stamp = parse_int("endingtimestamp", options["endingtimestamp"])
        return OffsetSpec("timestamp", timestamp_ms=stamp, option="endingTimestamp")
    if "endingoffsetsbytimestamp" in options:
        stamps = parse_timestamps_json(
            "endingoffsetsbytimestamp", options["endingoffsetsbytimestamp"]
        )
        return OffsetSpec("timestamps", timestamps=stamps, option="endingOffsetsByTimestamp")
    value = options.get("endingoffsets")
    if value is None:
        return OffsetSpec("latest", option="endingOffsets")
    text = value.strip()
    lowered = text.lower()
    if lowered == "latest":
        return OffsetSpec("latest", option="endingOffsets")
    if lowered == "earliest":
        raise _bad("endingoffsets", "'earliest' is not allowed (it would read nothing)")
    if not text.startswith("{"):
        raise _bad("endingoffsets", f"expected latest or a JSON object, got {value!r}")
    offsets = parse_offsets_json("endingoffsets", text, allow=(LATEST,))
    return OffsetSpec("offsets", offsets=offsets, option="endingOffsets")


def parse_read_options(raw: Mapping[str, Any], *, streaming: bool) -> ReadOptions:
    options = normalize(raw)
    store = parse_store(options)
    subscription = parse_subscription(options)
    starting = _starting(options, streaming)
    ending = _ending(options, streaming)
    strategy = given(options, "startingoffsetsbytimestampstrategy").strip().lower()
    if strategy not in ("error", "latest"):
        raise _bad(
            "startingoffsetsbytimestampstrategy", f"expected error or latest, got {strategy!r}"
        )

    def optional_int(name: str, minimum: int) -> int | None:
        return parse_int(name, options[name], minimum=minimum) if name in options else None

    max_offsets = optional_int("maxoffsetspertrigger", 1)
    min_offsets = optional_int("minoffsetspertrigger", 1)
    if max_offsets is not None and min_offsets is not None and min_offsets > max_offsets:
        raise _bad(
            "minoffsetspertrigger", f"{min_offsets} exceeds maxOffsetsPerTrigger {max_offsets}"
        )
    if "maxtriggerdelay" in options and min_offsets is None:
        raise _bad("maxtriggerdelay", "only has a meaning together with 'minOffsetsPerTrigger'")
    delay = (
        parse_duration_ms("maxtriggerdelay", options["maxtriggerdelay"])
        if "maxtriggerdelay" in options
        else DEFAULT_MAX_TRIGGER_DELAY_MS
    )
    max_bytes = (
        parse_bytes("maxbytespertrigger", options["maxbytespertrigger"])
        if "maxbytespertrigger" in options
        else None
    )
    min_partitions = optional_int("minpartitions", 1)
    max_records = optional_int("maxrecordsperpartition", 1)
    if min_partitions is not None and min_partitions > MAX_MIN_PARTITIONS:
        raise _bad("minpartitions", f"{min_partitions} exceeds the limit {MAX_MIN_PARTITIONS}")
    isolation = given(options, "isolationlevel").strip().lower()
    if isolation not in ("read_committed", "read_uncommitted"):
        raise _bad(
            "isolationlevel", f"expected read_committed or read_uncommitted, got {isolation!r}"
        )
    group_id = options.get("groupid")
    if group_id is not None:
        try:
            group_id = validate_group_id(group_id)
        except InvalidGroupIdError as exc:
            raise _bad("groupid", str(exc)) from None
    if starting.kind == "group" and group_id is None:
        raise _bad("startingoffsets", "'group' needs the option groupId (the group to start from)")
    return ReadOptions(
        store=store,
        subscription=subscription,
        starting=starting,
        ending=ending,
        timestamp_strategy=strategy,
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=delay,
        max_bytes_per_trigger=max_bytes,
        min_partitions=min_partitions,
        max_records_per_partition=max_records,
        fail_on_data_loss=parse_bool("failondataloss", given(options, "failondataloss")),
        include_headers=parse_bool("includeheaders", given(options, "includeheaders")),
        flatten_value=parse_bool("flattenvalue", given(options, "flattenvalue")),
        read_committed=isolation == "read_committed",
        group_id=group_id,
        streaming=streaming,
    )


# -- write options --------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteOptions:
    store: StoreRef
    topic: str | None
    partitioner: str
    txn_app_id: str | None
    txn_version: int | None
    segment_bytes: int
    compression: str | None
    durable: bool
    checkpoint_location: str | None
    streaming: bool
    # Write the input's 'timestamp' column as CreateTime; by default, as Kafka's sink, every
    # record is stamped with the time of writing (a copy's records then age from the copy).
    keep_timestamp: bool = False


def parse_write_options(raw: Mapping[str, Any], *, streaming: bool) -> WriteOptions:
    options = normalize(raw)
    store = parse_store(options)
    topic = options.get("topic")
    if topic is not None:
        topic = _topic_name("topic", topic.strip())
    partitioner = given(options, "partitioner").strip()
    if partitioner not in PARTITIONER_NAMES:
        raise _bad(
            "partitioner",
            f"unknown partitioner {partitioner!r}; use one of {', '.join(PARTITIONER_NAMES)}",
        )
    app_id = options.get("txnappid")
    if app_id is not None and not app_id.strip():
        raise _bad("txnappid", "must not be empty")
    version: int | None = None
    if "txnversion" in options:
        if streaming:
            raise _bad("txnversion", "is for batch writes; a streaming query uses its batch id")
        version = parse_int("txnversion", options["txnversion"])
    if not streaming and (app_id is None) != (version is None):
        missing = "txnVersion" if version is None else "txnAppId"
        raise InvalidOptionError(
            f"kstore batch write: options 'txnAppId' and 'txnVersion' go together; {missing!r} is missing"
        )
    segment_bytes = parse_bytes("segmentbytes", given(options, "segmentbytes"))
    compression = options.get("compression")
    if compression is not None:
        compression = compression.strip().lower()
        compression = {"none": "uncompressed"}.get(compression, compression)
        if compression not in ("uncompressed", "zstd", "lz4"):
            raise _bad("compression", f"expected none, zstd or lz4, got {options['compression']!r}")
    acks = given(options, "acks").strip().lower()
    if acks not in ("all", "-1", "1"):
        raise _bad("acks", f"expected all or 1, got {options['acks']!r}")
    return WriteOptions(
        store=store,
        topic=topic,
        partitioner=partitioner,
        txn_app_id=app_id.strip() if app_id is not None else None,
        txn_version=version,
        segment_bytes=segment_bytes,
        compression=compression,
        durable=acks in ("all", "-1"),
        checkpoint_location=options.get("checkpointlocation"),
        streaming=streaming,
        keep_timestamp=parse_bool("keeptimestamp", given(options, "keeptimestamp")),
    )
