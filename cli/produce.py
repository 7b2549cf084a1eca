"""``kstore produce``: the console producer.

Reads records one per line from stdin or a file. Text mode follows Kafka's console producer
(``parse.key``, ``key.separator``, ``parse.headers``, ``null.marker``); JSON-lines mode reads
objects with ``key``, ``value``, ``headers``, ``partition`` and ``timestamp``, the same shape
``kstore consume --output json`` prints, so the two round-trip.
"""

from __future__ import annotations

import array
import base64
import binascii
import enum
import json
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Annotated, Any

import typer
from kstore.cli.common import EXIT_FAILURE, UsageError, error_message, parse_client_properties
from kstore.cli.options import shared
from kstore.cli.timeparse import parse_datetime_ms
from kstore.cli.typed import TypedInput, TypedInputError, loads

from kstore.settings import is_int


class Acks(enum.StrEnum):
    none = "0"
    leader = "1"
    all = "all"


class InputFormat(enum.StrEnum):
    text = "text"
    json = "json"


class InputError(ValueError):
    """A line that cannot be turned into a record."""


@dataclass
class InputRecord:
    value: Any  # bytes, or on a typed topic a dict of field values (None: a tombstone)
    key: Any = None  # bytes, or on a typed topic with a typed key: str, int or float
    headers: list[tuple[str, bytes]] | None = None
    partition: int | None = None
    timestamp_ms: int | None = None


def unescape(separator: str) -> bytes:
    """Separators as typed: ``\\t``, ``\\n`` and ``\\\\`` stand for a tab, newline, backslash."""
    out, i = [], 0
    while i < len(separator):
        char = separator[i]
        if char == "\\" and i + 1 < len(separator) and separator[i + 1] in "tn\\":
            out.append({"t": "\t", "n": "\n", "\\": "\\"}[separator[i + 1]])
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out).encode()


@dataclass
class TextParser:
    """Kafka's LineMessageReader: ``[headers<delimiter>][key<separator>]value``."""

    key_separator: bytes | None = None
    parse_headers: bool = False
    headers_delimiter: bytes = b"\t"
    headers_separator: bytes = b","
    headers_key_separator: bytes = b":"
    null_marker: bytes | None = None

    def parse(self, line: bytes) -> InputRecord:
        headers: list[tuple[str, bytes]] | None = None
        if self.parse_headers:
            head, sep, line = line.partition(self.headers_delimiter)
            if not sep:
                raise InputError(f"no headers delimiter {self.headers_delimiter.decode()!r} found")
            headers = []
            if head and head != self.null_marker:
                for item in head.split(self.headers_separator):
                    name, hsep, header_value = item.partition(self.headers_key_separator)
                    if not hsep:
                        raise InputError(
                            f"header {item.decode(errors='replace')!r} has no "
                            f"{self.headers_key_separator.decode()!r} between name and value"
                        )
                    try:
                        headers.append((name.decode("utf-8"), header_value))
                    except UnicodeDecodeError:
                        raise InputError("a header name is not UTF-8") from None
        key: bytes | None = None
        if self.key_separator is not None:
            key, sep, line = line.partition(self.key_separator)
            if not sep:
                raise InputError(f"no key separator {self.key_separator.decode()!r} found")
            if key == self.null_marker:
                key = None
        value: bytes | None = None if line == self.null_marker else line
        return InputRecord(value, key, headers)


_JSON_FIELDS = {
    "key",
    "value",
    "headers",
    "partition",
    "timestamp",
    "key_encoding",
    "value_encoding",
}
# Fields that `kstore consume --output json` prints and that make no sense to produce.
_JSON_IGNORED = {"topic", "offset", "timestamp_type"}


def _json_bytes(obj: Any, encoding: Any, what: str) -> bytes | None:
    if obj is None:
        return None
    if encoding not in (None, "utf-8", "base64"):
        raise InputError(f"{what}_encoding must be 'utf-8' or 'base64', got {encoding!r}")
    if isinstance(obj, str):
        if encoding == "base64":
            try:
                return base64.b64decode(obj, validate=True)
            except (binascii.Error, ValueError):
                raise InputError(f"{what} is not valid base64") from None
        return obj.encode("utf-8")
    if encoding == "base64":
        raise InputError(f"{what} must be a string when {what}_encoding is base64")
    # Any other JSON value is sent as its compact JSON text.
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _json_headers(obj: Any) -> list[tuple[str, bytes]] | None:
    if obj is None:
        return None
    items: list[tuple[Any, Any, Any]] = []
    if isinstance(obj, dict):
        items = [(k, v, None) for k, v in obj.items()]
    elif isinstance(obj, list):
        for item in obj:
            if isinstance(item, dict) and "key" in item:
                unknown = set(item) - {"key", "value", "value_encoding"}
                if unknown:
                    raise InputError(f"header field(s) {sorted(unknown)} are unknown")
                items.append((item["key"], item.get("value"), item.get("value_encoding")))
            elif isinstance(item, list) and len(item) == 2:
                items.append((item[0], item[1], None))
            else:
                raise InputError(
                    'headers must be an object, or a list of {"key": ..., "value": ...} '
                    "or [name, value] pairs"
                )
    else:
        raise InputError("headers must be an object or a list")
    out = []
    for name, value, encoding in items:
        if not isinstance(name, str):
            raise InputError(f"header name {name!r} is not a string")
        data = _json_bytes(value, encoding, f"header {name!r}")
        out.append((name, b"" if data is None else data))
    return out


def parse_json_record(line: bytes, typed: TypedInput | None = None) -> InputRecord:
    """One JSON-lines record. On a typed topic (``typed``) the ``value`` is a JSON object of
    the schema's fields and a typed ``key`` is a JSON string or number."""
    try:
        obj = json.loads(line) if typed is None else loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise InputError("each line must be a JSON object")
    unknown = set(obj) - _JSON_FIELDS - _JSON_IGNORED
    if unknown:
        raise InputError(f"unknown field(s) {sorted(unknown)}; known: {sorted(_JSON_FIELDS)}")
    if "value" not in obj:
        raise InputError('a record needs a "value" (null for a tombstone)')
    partition = obj.get("partition")
    if partition is not None and (not is_int(partition)):
        raise InputError(f"partition must be an integer, got {partition!r}")
    stamp = obj.get("timestamp")
    timestamp_ms: int | None = None
    if is_int(stamp):
        timestamp_ms = stamp
    elif isinstance(stamp, str):
        try:
            timestamp_ms = parse_datetime_ms(stamp)
        except ValueError as exc:
            raise InputError(str(exc)) from None
    elif stamp is not None:
        raise InputError(
            f"timestamp must be epoch milliseconds or an ISO 8601 string, got {stamp!r}"
        )
    value: Any
    key: Any
    if typed is None:
        value = _json_bytes(obj["value"], obj.get("value_encoding"), "value")
        key = _json_bytes(obj.get("key"), obj.get("key_encoding"), "key")
    else:
        if obj.get("value_encoding") is not None:
            raise InputError("value_encoding does not apply to a typed topic's values")
        value = typed.value_from_json(obj["value"])
        key = (
            typed.key_from_json(obj.get("key"), obj.get("key_encoding"))
            if typed.key_type is not None
            else _json_bytes(obj.get("key"), obj.get("key_encoding"), "key")
        )
    return InputRecord(
        value=value,
        key=key,
        headers=_json_headers(obj.get("headers")),
        partition=partition,
        timestamp_ms=timestamp_ms,
    )


def _typed_text(record: InputRecord, typed: TypedInput) -> InputRecord:
    """A text-mode line on a typed topic: the value part is a JSON object, a typed key is
    parsed as its type."""
    if record.value is not None:
        record.value = typed.value_from_text(record.value)
    if record.key is not None and typed.key_type is not None:
        record.key = typed.key_from_text(record.key)
    return record


@dataclass
class _Delivery:
    """What the producer reported back (callbacks run on its sender thread)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    delivered: int = 0
    failed: int = 0
    first_error: BaseException | None = None
    partitions: dict[int, list[int]] = field(
        default_factory=dict
    )  # partition -> [count, first, last]
    # Input line numbers of the records not delivered (8 bytes each, sorted when reported).
    failed_lines: array.array[int] = field(default_factory=lambda: array.array("q"))
    # Set by a failure that every later record would meet too (the storage refuses writes:
    # a full disk, a read-only filesystem): the input is not read further.
    fatal: BaseException | None = None

    def ok(self, metadata: Any) -> None:
        with self.lock:
            self.delivered += 1
            entry = self.partitions.setdefault(
                metadata.partition, [0, metadata.offset, metadata.offset]
            )
            entry[0] += 1
            if metadata.offset >= 0:
                entry[1] = min(entry[1], metadata.offset) if entry[1] >= 0 else metadata.offset
                entry[2] = max(entry[2], metadata.offset)

    def error(self, exc: BaseException, line: int = 0) -> None:
        from kstore.errors import StorageNotWritableError

        with self.lock:
            self.failed += 1
            if line:
                self.failed_lines.append(line)
            if self.first_error is None:
                self.first_error = exc
            if self.fatal is None and isinstance(exc, StorageNotWritableError):
                self.fatal = exc

    def errback(self, line: int) -> Any:
        """The errback of the record read from input line ``line``."""
        return lambda exc: self.error(exc, line)

    def not_delivered(self) -> tuple[list[list[int]], str]:
        """The input lines not delivered, as ``[first, last]`` runs, and in words
        (``lines 3-7, 12``; at most ten runs, then how many more)."""
        runs: list[list[int]] = []
        for line in sorted(self.failed_lines):
            if runs and line == runs[-1][1] + 1:
                runs[-1][1] = line
            else:
                runs.append([line, line])
        shown = [f"{a}-{b}" if a != b else f"{a}" for a, b in runs[:10]]
        words = ", ".join(shown)
        if len(runs) > 10:
            rest = sum(b - a + 1 for a, b in runs[10:])
            words += f" and {rest} more line(s) up to {runs[-1][1]}"
        return runs, ("line " if len(self.failed_lines) == 1 else "lines ") + words


class _Interrupt:
    """Ctrl-C (or SIGTERM) stops reading and delivers what was read. The signal interrupts a
    blocked read at once, but never the producer's own code (whose locks and buffers must not
    be left half-updated): there it only sets a flag, checked between records."""

    def __init__(self) -> None:
        self.stopped = False
        self.reading = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Interrupt:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.stopped = True
        if self.reading:
            raise KeyboardInterrupt


def _lines(stream: IO[bytes], interrupt: _Interrupt) -> Any:
    number = 0
    while not interrupt.stopped:
        interrupt.reading = True
        try:
            raw = stream.readline()
        except KeyboardInterrupt:
            return
        finally:
            interrupt.reading = False
        if not raw:
            return
        number += 1
        yield number, raw.removesuffix(b"\n").removesuffix(b"\r")


def produce(
    ctx: typer.Context,
    topic: Annotated[
        str, typer.Argument(metavar="TOPIC", help="Topic to write to.", show_default=False)
    ],
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            exists=True,
            dir_okay=False,
            readable=True,
            help="Read records from this file instead of stdin.",
        ),
    ] = None,
    input_format: Annotated[
        InputFormat,
        typer.Option("--format", help="text: one record per line; json: one JSON object per line."),
    ] = InputFormat.text,
    key_separator: Annotated[
        str | None,
        typer.Option(
            "--key-separator",
            "-k",
            metavar="SEP",
            help="Text mode: each line is KEY<SEP>VALUE (\\t for a tab).",
        ),
    ] = None,
    headers: Annotated[
        bool,
        typer.Option(
            "--headers",
            help="Text mode: each line starts with headers: NAME:VALUE,NAME:VALUE<TAB>...",
        ),
    ] = False,
    headers_delimiter: Annotated[
        str,
        typer.Option(
            "--headers-delimiter",
            metavar="SEP",
            help="Between the headers and the rest of the line.",
        ),
    ] = "\\t",
    headers_separator: Annotated[
        str, typer.Option("--headers-separator", metavar="SEP", help="Between two headers.")
    ] = ",",
    headers_key_separator: Annotated[
        str,
        typer.Option(
            "--headers-key-separator", metavar="SEP", help="Between a header's name and value."
        ),
    ] = ":",
    null_marker: Annotated[
        str | None,
        typer.Option(
            "--null-marker",
            metavar="TEXT",
            help="Text mode: a key or value equal to TEXT is sent as null (a value: a tombstone).",
        ),
    ] = None,
    acks: Annotated[
        Acks,
        typer.Option(
            "--acks", help="0: do not wait; 1: wait until visible; all: visible and durable."
        ),
    ] = Acks.all,
    partition: Annotated[
        int | None,
        typer.Option("--partition", "-p", min=0, help="Send every record to this partition."),
    ] = None,
    producer_property: Annotated[
        list[str] | None,
        typer.Option(
            "--producer-property",
            metavar="NAME=VALUE",
            help="A producer config, Kafka's name or kstore's (max.request.size=5242880, "
            "linger.ms=50); repeatable. max.request.size defaults to the topic's "
            "max.message.bytes.",
        ),
    ] = None,
) -> None:
    """Write records read line by line from stdin (or --file) to a topic.

    On a typed topic each value is a JSON object of the schema's fields (dates and times in
    ISO 8601, decimals as strings or numbers, binary in base64), validated before it is sent:
    a line that does not fit stops the input, naming the line and the field.

    Ends at end of input (Ctrl-D on a terminal) or on Ctrl-C, after delivering every record
    read. A summary goes to stderr (with -o json: a JSON object to stdout).
    """
    from kstore.errors import KStoreError
    from kstore.producer import Producer

    if input_format is InputFormat.json and (
        key_separator is not None or headers or null_marker is not None
    ):
        raise UsageError("--key-separator, --headers and --null-marker apply to --format text only")
    parser = TextParser(
        key_separator=unescape(key_separator) if key_separator is not None else None,
        parse_headers=headers,
        headers_delimiter=unescape(headers_delimiter),
        headers_separator=unescape(headers_separator),
        headers_key_separator=unescape(headers_key_separator),
        null_marker=unescape(null_marker) if null_marker is not None else None,
    )
    for name, sep in (
        ("--key-separator", parser.key_separator),
        ("--headers-delimiter", parser.headers_delimiter),
        ("--headers-separator", parser.headers_separator),
        ("--headers-key-separator", parser.headers_key_separator),
    ):
        if sep is not None and not sep:
            raise UsageError(f"{name} must not be empty")
    properties = parse_client_properties(producer_property, "--producer-property")
    handle = shared(ctx).open_store()
    out = shared(ctx).output
    meta = handle.topic(topic)  # fail before reading any input if the topic does not exist
    if partition is not None and partition >= meta.partitions:
        from kstore.errors import UnknownTopicOrPartitionError

        raise UnknownTopicOrPartitionError(
            f"topic {topic!r} has partitions 0..{meta.partitions - 1}; {partition} does not exist"
        )
    typed = TypedInput(meta.schema) if meta.schema is not None else None
    acks_value: int | str = "all" if acks is Acks.all else int(acks.value)
    stream: IO[bytes] = open(file, "rb") if file is not None else sys.stdin.buffer  # noqa: SIM115
    if file is None and sys.stdin.isatty():
        out.notice(f"Reading records for {topic!r}, one per line; Ctrl-D to finish.")
    delivery = _Delivery()
    failure: str | None = None
    sent = 0
    # The topic's own limit, not the client's 1 MiB default: a topic that allows 200 MB takes
    # a 200 MB record from the console producer too.
    configs: dict[str, Any] = {
        "acks": acks_value,
        "client_id": "kstore-cli",
        "max_request_size": max(1_048_576, int(meta.effective_config["max.message.bytes"])),
        **properties,
    }
    producer = Producer(handle, **configs)
    stopped_at: int | None = None  # the first input line not read (a fatal failure)
    try:
        with _Interrupt() as interrupt:
            for number, line in _lines(stream, interrupt):
                if delivery.fatal is not None:
                    # The storage refuses writes: every record sent now would fail the same
                    # way. This line and the rest of the input are not sent.
                    stopped_at = number
                    break
                if input_format is InputFormat.json and not line.strip():
                    continue
                try:
                    if input_format is InputFormat.json:
                        record = parse_json_record(line, typed)
                    else:
                        record = parser.parse(line)
                        if typed is not None:
                            record = _typed_text(record, typed)
                    future = producer.send(
                        topic,
                        value=record.value,
                        key=record.key,
                        headers=record.headers,
                        partition=partition if partition is not None else record.partition,
                        timestamp_ms=record.timestamp_ms,
                    )
                except (InputError, TypedInputError, KStoreError) as exc:
                    detail = str(exc) if not isinstance(exc, KStoreError) else error_message(exc)
                    failure = f"line {number}: {detail}"
                    break
                future.add_callback(delivery.ok).add_errback(delivery.errback(number))
                sent += 1
    finally:
        try:
            producer.close()
        finally:
            if file is not None:
                stream.close()
    per_partition = [
        {"partition": p, "records": c, "first_offset": lo, "last_offset": hi}
        for p, (c, lo, hi) in sorted(delivery.partitions.items())
    ]
    runs, lines_text = delivery.not_delivered()
    summary: dict[str, Any] = {
        "topic": topic,
        "records": delivery.delivered,
        "failed": delivery.failed,
        "partitions": per_partition,
        "failed_lines": runs,  # input lines not delivered, as [first, last] runs
        "unread_from_line": None,
    }
    if delivery.failed and failure is None:
        assert delivery.first_error is not None
        failure = (
            f"{delivery.failed} of {sent} records were not delivered ({lines_text} of the "
            f"input): {error_message(delivery.first_error)}"
        )
        if stopped_at is not None:
            summary["unread_from_line"] = stopped_at
            failure += f"; input from line {stopped_at} on was not sent"
    out.record({**summary, "error": failure})
    ranges = ", ".join(
        f"partition {p['partition']}: {p['records']}"
        + (f" (offsets {p['first_offset']}..{p['last_offset']})" if p["first_offset"] >= 0 else "")
        for p in per_partition
    )
    out.message(
        f"Produced {delivery.delivered} record(s) to {topic!r}"
        + (f": {ranges}." if ranges else ".")
    )
    if failure is not None:
        out.notice(f"error: {failure}")
        raise typer.Exit(EXIT_FAILURE)
