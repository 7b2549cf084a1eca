"""The record browser: a page of a partition's records from an offset or a time, read with the
library's own consumer (no group, nothing committed), with keys, values and headers shown as
text, JSON or hex, and a typed topic's fields as columns."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kstore.errors import InvalidArgumentError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from kstore.records import ConsumerRecord, TopicPartition

if TYPE_CHECKING:
    from kstore.store import Store

FORMATS = ("auto", "text", "json", "hex")
DEFAULT_LIMIT = 50
MAX_LIMIT = 500
# A key, value or header longer than this is cut on the page (its size is shown).
MAX_SHOWN_BYTES = 4096


@dataclass(frozen=True)
class Shown:
    """One key, value or header value as the page shows it."""

    text: str | None  # None: null
    form: str  # text, json, hex, or null
    size: int
    cut: bool = False


@dataclass(frozen=True)
class RecordRow:
    offset: int
    timestamp_ms: int
    timestamp_type: str
    key: Shown
    value: Shown
    headers: tuple[tuple[str, Shown], ...]
    fields: Mapping[str, str] | None  # a typed topic's value, field by field


@dataclass(frozen=True)
class RecordPage:
    topic: str
    partition: int
    start_offset: int  # the partition's live range when read
    end_offset: int
    first: int  # the offset the page was asked from
    rows: tuple[RecordRow, ...]
    columns: tuple[str, ...]  # a typed topic's field names, in schema order
    typed: bool
    partitions: int  # the topic's partition count

    @property
    def next_offset(self) -> int | None:
        if not self.rows:
            return None
        after = self.rows[-1].offset + 1
        return after if after < self.end_offset else None


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)


def typed_json(value: Any) -> str:
    return json.dumps(value, default=_json_default, ensure_ascii=False, sort_keys=False)


def show(data: Any, form: str) -> Shown:
    """``data`` (bytes, or a typed topic's Python value) in ``form``: ``auto`` picks JSON when
    it parses, else text when it is UTF-8, else hex."""
    if data is None:
        return Shown(None, "null", 0)
    if not isinstance(data, bytes | bytearray | memoryview):
        text = json.dumps(data, default=_json_default, ensure_ascii=False, indent=1)
        return _cut(text, "json", len(text.encode()))
    raw = bytes(data)
    if form == "hex":
        return _hex(raw)
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError:
        return _hex(raw)  # not text: hex, whatever was asked
    if form in ("json", "auto"):
        try:
            parsed = json.loads(decoded)
        except ValueError:
            if form == "json":
                return _cut(decoded, "text (not JSON)", len(raw))
        else:
            if form == "json" or isinstance(parsed, dict | list):
                pretty = json.dumps(parsed, ensure_ascii=False, indent=1)
                return _cut(pretty, "json", len(raw))
    return _cut(decoded, "text", len(raw))


def _hex(raw: bytes) -> Shown:
    cut = len(raw) > MAX_SHOWN_BYTES
    return Shown(raw[:MAX_SHOWN_BYTES].hex(" "), "hex", len(raw), cut)


def _cut(text: str, form: str, size: int) -> Shown:
    if len(text) > MAX_SHOWN_BYTES:
        return Shown(text[:MAX_SHOWN_BYTES], form, size, True)
    return Shown(text, form, size)


def _row(record: ConsumerRecord, form: str, columns: tuple[str, ...]) -> RecordRow:
    fields = None
    if columns and isinstance(record.value, Mapping):
        fields = {
            name: "null"
            if record.value.get(name) is None
            else (
                record.value[name]
                if isinstance(record.value[name], str)
                else typed_json(record.value[name])
            )
            for name in columns
        }
    return RecordRow(
        offset=record.offset,
        timestamp_ms=record.timestamp,
        timestamp_type="LogAppendTime" if record.timestamp_type == 1 else "CreateTime",
        key=show(record.key, form),
        value=show(record.value, form),
        headers=tuple((name, show(value, form)) for name, value in record.headers),
        fields=fields,
    )


def read_page(
    store: Store,
    topic: str,
    partition: int,
    *,
    offset: int | None = None,
    timestamp_ms: int | None = None,
    limit: int = DEFAULT_LIMIT,
    form: str = "auto",
    read_committed: bool = False,
) -> RecordPage:
    """Up to ``limit`` records of ``topic``-``partition`` from ``offset`` (default: the
    newest ``limit``), or from the first record at or after ``timestamp_ms``."""
    from kstore.consumer import Consumer

    if form not in FORMATS:
        raise InvalidArgumentError(f"format must be one of {', '.join(FORMATS)}, got {form!r}")
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgumentError(f"limit must be in [1, {MAX_LIMIT}], got {limit}")
    meta = store.topic(topic)
    if not 0 <= partition < meta.partitions:
        raise UnknownTopicOrPartitionError(
            f"topic {topic!r} has partitions 0..{meta.partitions - 1}; {partition} does not exist"
        )
    state = store.partition_state(topic, partition, meta)
    start, end = state.start_offset, state.end_offset
    schema = meta.schema
    columns = tuple(f.name for f in schema.value) if schema is not None else ()
    consumer = Consumer(
        store=store,
        enable_auto_commit=False,
        isolation_level="read_committed" if read_committed else "read_uncommitted",
        client_id="kstore-console",
    )
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        if timestamp_ms is not None:
            found = consumer.offsets_for_times({tp: timestamp_ms}).get(tp)
            first = end if found is None else found.offset
        elif offset is None:
            first = max(start, end - limit)
        elif start <= offset <= end:
            first = offset
        else:
            raise OffsetOutOfRangeError(
                f"{topic}-{partition}: offset {offset} is outside the live range [{start}, {end}]"
            )
        consumer.seek(tp, first)
        rows: list[RecordRow] = []
        while len(rows) < limit and first < end:
            batches = consumer.poll(timeout_ms=0, max_records=limit - len(rows))
            got = batches.get(tp, [])
            if not got:
                break
            rows.extend(_row(r, form, columns) for r in got)
    finally:
        consumer.close(autocommit=False)
    return RecordPage(
        topic, partition, start, end, first, tuple(rows), columns, bool(columns), meta.partitions
    )
