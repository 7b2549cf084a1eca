"""``kstore consume``: the console consumer."""

from __future__ import annotations

import base64
import enum
import json
import signal
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from kstore.cli.common import UsageError, parse_client_properties, silence_stdout
from kstore.cli.options import shared
from kstore.cli.output import OutputFormat
from kstore.cli.produce import unescape
from kstore.cli.timeparse import parse_datetime_ms
from kstore.cli.typed import dumps, to_json

if TYPE_CHECKING:
    from kstore.consumer import Consumer
    from kstore.records import ConsumerRecord, TopicPartition

COMMIT_INTERVAL_S = 5.0
POLL_MS = 200  # how long one poll waits while following: also how fast Ctrl-C is noticed


class Isolation(enum.StrEnum):
    read_uncommitted = "read_uncommitted"
    read_committed = "read_committed"


class RecordFormat(enum.StrEnum):
    plain = "plain"
    json = "json"
    hex = "hex"


def _encoded(data: Any, prefix: str, out: dict[str, Any]) -> None:
    """``out[prefix]`` = the bytes as a UTF-8 string (or null); base64 when not UTF-8. A typed
    topic's value (a dict) and typed key (str, int, float) are written as JSON values."""
    if data is None:
        out[prefix] = None
        return
    if not isinstance(data, bytes):
        out[prefix] = to_json(data)
        return
    try:
        out[prefix] = data.decode("utf-8")
    except UnicodeDecodeError:
        out[prefix] = base64.b64encode(data).decode("ascii")
        out[f"{prefix}_encoding"] = "base64"


def record_json(record: ConsumerRecord) -> dict[str, Any]:
    out: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "timestamp_type": "LogAppendTime" if record.timestamp_type == 1 else "CreateTime",
    }
    _encoded(record.key, "key", out)
    _encoded(record.value, "value", out)
    headers = []
    for name, value in record.headers:
        header: dict[str, Any] = {"key": name}
        _encoded(value, "value", header)
        headers.append(header)
    out["headers"] = headers
    return out


class Formatter:
    """Kafka's DefaultMessageFormatter: optional ``CreateTime:<ms>``, ``Partition:<p>``,
    ``Offset:<o>``, headers and key, then the value, separated by the key separator."""

    def __init__(
        self,
        fmt: RecordFormat,
        *,
        print_key: bool,
        print_timestamp: bool,
        print_offset: bool,
        print_partition: bool,
        print_headers: bool,
        separator: bytes,
        null_text: bytes = b"null",
    ) -> None:
        self.fmt = fmt
        self.print_key = print_key
        self.print_timestamp = print_timestamp
        self.print_offset = print_offset
        self.print_partition = print_partition
        self.print_headers = print_headers
        self.separator = separator
        self.null = null_text

    def _bytes(self, data: Any) -> bytes:
        if data is None:
            return self.null
        raw: bytes
        if isinstance(data, bytes):
            raw = data
        else:
            # A typed topic: a value prints as a JSON object, a typed key as its text.
            raw = data.encode() if isinstance(data, str) else dumps(data).encode()
        return raw.hex().encode() if self.fmt is RecordFormat.hex else raw

    def format(self, record: ConsumerRecord) -> bytes:
        if self.fmt is RecordFormat.json:
            return (
                json.dumps(record_json(record), ensure_ascii=False, separators=(",", ":")).encode()
                + b"\n"
            )
        fields: list[bytes] = []
        if self.print_timestamp:
            kind = "LogAppendTime" if record.timestamp_type == 1 else "CreateTime"
            fields.append(f"{kind}:{record.timestamp}".encode())
        if self.print_partition:
            fields.append(f"Partition:{record.partition}".encode())
        if self.print_offset:
            fields.append(f"Offset:{record.offset}".encode())
        if self.print_headers:
            if record.headers:
                fields.append(
                    b",".join(
                        name.encode() + b":" + self._bytes(value) for name, value in record.headers
                    )
                )
            else:
                fields.append(b"NO_HEADERS")
        if self.print_key:
            fields.append(self._bytes(record.key))
        fields.append(self._bytes(record.value))
        return self.separator.join(fields) + b"\n"


class _Stop:
    """Ctrl-C and SIGTERM set a flag that the poll loop checks (the consumer's own code is
    never interrupted mid-commit); a second Ctrl-C stops at once."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Stop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


def _offset_spec(text: str | None) -> int | str | None:
    if text is None:
        return None
    lowered = text.strip().lower()
    if lowered in ("earliest", "beginning"):
        return "earliest"
    if lowered in ("latest", "end"):
        return "latest"
    try:
        return int(lowered)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: expected an offset, a negative number (that many before the end), "
            "earliest or latest",
            param_hint="'--offset'",
        ) from None


def _seek(
    consumer: Consumer,
    parts: list[TopicPartition],
    *,
    offset: int | str | None,
    from_time_ms: int | None,
    from_beginning: bool,
    follow: bool,
) -> None:
    from kstore.errors import OffsetOutOfRangeError

    if from_time_ms is not None:
        found = consumer.offsets_for_times(dict.fromkeys(parts, from_time_ms))
        for tp in parts:
            hit = found.get(tp)
            if hit is None:
                consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, hit.offset)
        return
    if offset is None:
        offset = "earliest" if from_beginning or not follow else "latest"
    if offset == "earliest":
        consumer.seek_to_beginning(*parts)
        return
    if offset == "latest":
        consumer.seek_to_end(*parts)
        return
    assert isinstance(offset, int)
    starts = consumer.beginning_offsets(parts)
    ends = consumer.end_offsets(parts)
    for tp in parts:
        target = ends[tp] + offset if offset < 0 else offset
        if offset < 0:
            target = max(target, starts[tp])
        if not starts[tp] <= target <= ends[tp]:
            raise OffsetOutOfRangeError(
                f"{tp.topic}-{tp.partition}: offset {offset} is outside the live range "
                f"[{starts[tp]}, {ends[tp]}]"
            )
        consumer.seek(tp, target)


def consume(
    ctx: typer.Context,
    topic: Annotated[
        str, typer.Argument(metavar="TOPIC", help="Topic to read.", show_default=False)
    ],
    from_beginning: Annotated[
        bool,
        typer.Option(
            "--from-beginning",
            help="Start at the log start (with --group: where no offset is committed).",
        ),
    ] = False,
    offset: Annotated[
        str | None,
        typer.Option(
            "--offset",
            metavar="OFFSET",
            help="Start offset: a number, -N (N before the end), earliest or latest.",
        ),
    ] = None,
    partition: Annotated[
        list[int] | None,
        typer.Option("--partition", "-p", min=0, help="Read only this partition; repeatable."),
    ] = None,
    from_time: Annotated[
        str | None,
        typer.Option(
            "--from-time",
            metavar="TIME",
            help="Start at the first record at or after TIME (ISO 8601, epoch ms, or 15m / 2h ago).",
        ),
    ] = None,
    max_messages: Annotated[
        int | None,
        typer.Option("--max-messages", "-n", min=1, help="Stop after this many records."),
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(
            "--group",
            "-g",
            help="Consume as a member of this consumer group and commit its offsets.",
        ),
    ] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="Keep waiting for new records (tail); Ctrl-C stops."),
    ] = False,
    timeout_ms: Annotated[
        int | None,
        typer.Option(
            "--timeout-ms", min=0, help="Stop when no record arrived for this long (with --follow)."
        ),
    ] = None,
    output: Annotated[
        RecordFormat | None,
        typer.Option(
            "--output",
            "-o",
            help="plain: the bytes (the default); json: a JSON object per line (key, value, "
            "headers, offset, timestamp, ...); hex: keys and values in hex. Given before the "
            "command, json is json here too.",
            show_default=False,
        ),
    ] = None,
    print_key: Annotated[
        bool, typer.Option("--print-key", "-K", help="Print the key before the value.")
    ] = False,
    print_timestamp: Annotated[
        bool, typer.Option("--print-timestamp", help="Print CreateTime:<ms>.")
    ] = False,
    print_offset: Annotated[
        bool, typer.Option("--print-offset", help="Print Offset:<offset>.")
    ] = False,
    print_partition: Annotated[
        bool, typer.Option("--print-partition", help="Print Partition:<p>.")
    ] = False,
    print_headers: Annotated[
        bool, typer.Option("--print-headers", help="Print NAME:VALUE,... headers.")
    ] = False,
    key_separator: Annotated[
        str,
        typer.Option(
            "--key-separator", metavar="SEP", help="Between printed fields (\\t for a tab)."
        ),
    ] = "\\t",
    isolation_level: Annotated[
        Isolation,
        typer.Option(
            "--isolation-level",
            help="read_committed hides the records of open and aborted transactions.",
        ),
    ] = Isolation.read_uncommitted,
    consumer_property: Annotated[
        list[str] | None,
        typer.Option(
            "--consumer-property",
            metavar="NAME=VALUE",
            help="A consumer config, Kafka's name or kstore's (fetch.max.bytes=52428800); "
            "repeatable. The group, offsets and isolation level have their own options.",
        ),
    ] = None,
) -> None:
    """Print a topic's records.

    Without --follow it prints what the topic holds and exits at its end, starting at the
    beginning (or --offset / --from-time). With --follow it starts at the end (unless
    --from-beginning, --offset or --from-time) and waits for new records until Ctrl-C,
    --max-messages or --timeout-ms. With --group it starts at the group's committed offsets
    and commits what it printed.
    """
    from kstore.consumer import Consumer
    from kstore.records import TopicPartition

    start = _offset_spec(offset)
    if group is not None and (partition or offset is not None or from_time is not None):
        raise UsageError(
            "--group reads the group's committed offsets: it excludes --partition, "
            "--offset and --from-time (use kstore groups reset-offsets)"
        )
    if isinstance(start, int) and start >= 0 and not partition:
        raise UsageError(
            "--offset N needs --partition (offsets differ between partitions); "
            "-N, earliest and latest work for every partition"
        )
    if (offset is not None) + (from_time is not None) + from_beginning > 1:
        raise UsageError("choose one of --from-beginning, --offset and --from-time")
    from_time_ms: int | None = None
    if from_time is not None:
        try:
            from_time_ms = parse_datetime_ms(from_time)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="'--from-time'") from None
    separator = unescape(key_separator)
    options = shared(ctx)
    if output is None:  # the shared --output, given before the command
        json_records = options.output_format is OutputFormat.json
        output = RecordFormat.json if json_records else RecordFormat.plain
    out = options.output
    formatter = Formatter(
        output,
        print_key=print_key,
        print_timestamp=print_timestamp,
        print_offset=print_offset,
        print_partition=print_partition,
        print_headers=print_headers,
        separator=separator,
    )

    properties = parse_client_properties(consumer_property, "--consumer-property")
    owned = {
        "group_id": "--group",
        "enable_auto_commit": "--group (offsets are committed as records are printed)",
        "auto_offset_reset": "--from-beginning or --offset",
        "isolation_level": "--isolation-level",
    }
    for name, flag in owned.items():
        if name in properties:
            raise UsageError(f"--consumer-property {name.replace('_', '.')}: use {flag}")
    handle = options.open_store()
    meta = handle.topic(topic)
    reset = "earliest" if from_beginning or not follow else "latest"
    consumer = Consumer(
        store=handle,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset=reset,
        isolation_level=isolation_level.value,
        **{"client_id": "kstore-cli", **properties},
    )
    printed = 0
    committed_at = time.monotonic()
    pending: dict[TopicPartition, int] = {}  # next offset to commit, per printed partition
    sink = sys.stdout.buffer
    broken_pipe = False

    def commit() -> None:
        nonlocal committed_at
        if group is None or not pending:
            return
        from kstore.errors import CommitFailedError

        try:
            consumer.commit(dict(pending))
            pending.clear()
        except CommitFailedError as exc:
            out.notice(f"warning: offsets not committed: {exc}")
        committed_at = time.monotonic()

    try:
        with _Stop() as stop:
            if group is not None:
                consumer.subscribe([topic])
            else:
                chosen = sorted(set(partition)) if partition else list(range(meta.partitions))
                for p in chosen:
                    if p >= meta.partitions:
                        from kstore.errors import UnknownTopicOrPartitionError

                        raise UnknownTopicOrPartitionError(
                            f"topic {topic!r} has partitions 0..{meta.partitions - 1}; {p} does not exist"
                        )
                parts = [TopicPartition(topic, p) for p in chosen]
                consumer.assign(parts)
                _seek(
                    consumer,
                    parts,
                    offset=start,
                    from_time_ms=from_time_ms,
                    from_beginning=from_beginning,
                    follow=follow,
                )
            last_record = time.monotonic()
            while not stop.requested:
                want = 500 if max_messages is None else min(500, max_messages - printed)
                batches = consumer.poll(timeout_ms=POLL_MS if follow else 0, max_records=want)
                if not batches:
                    if not follow:
                        break
                    if (
                        timeout_ms is not None
                        and (time.monotonic() - last_record) * 1000 >= timeout_ms
                    ):
                        break
                    if time.monotonic() - committed_at >= COMMIT_INTERVAL_S:
                        commit()
                    continue
                last_record = time.monotonic()
                for tp, records in batches.items():
                    try:
                        sink.write(b"".join(formatter.format(r) for r in records))
                    except BrokenPipeError:
                        broken_pipe = True
                        break
                    printed += len(records)
                    pending[tp] = records[-1].offset + 1
                if broken_pipe:
                    break
                try:
                    sink.flush()
                except BrokenPipeError:
                    broken_pipe = True
                    break
                if max_messages is not None and printed >= max_messages:
                    break
                if time.monotonic() - committed_at >= COMMIT_INTERVAL_S:
                    commit()
            commit()
    finally:
        consumer.close(autocommit=False)
    if broken_pipe:
        silence_stdout()
        return
    out.notice(f"Processed a total of {printed} messages")
