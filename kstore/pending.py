"""Pending flushes (PROTOCOL.md 30.2): a producer flush written under a name only its writer
uses, for whichever writer of the topic log commits next to take.

A pending flush is the text of the commit its writer would make, without what a commit
assigns (offsets, the commit's own path), followed by the flush's data section: byte for byte
the data a commit carries (11.8). Pure encoding and checking: no storage, no state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from kstore.errors import CorruptLogError
from kstore.log import CARRIED
from kstore.manifest import ProducerBatch
from kstore.segments import CHECKSUM_ALGORITHM, FORMAT_ARROW, SegmentFile, checksum

# The directory of topic log k's pending flushes, in its incarnation directory.
PENDING_DIR = "_flushes"
PENDING_SUFFIX = ".kfl"
_NAME = re.compile(r"([0-9a-f]{32})-([0-9]{20})\.kfl")
_HEX32 = re.compile(r"[0-9a-f]{32}")
_TAG = re.compile(r"[0-9a-f]{32}:(0|[1-9][0-9]*)")  # a transaction tag (5.6)
MAX_PENDING_TEXT = 1 << 20  # Appendix A: a pending flush's text
_CODECS = ("uncompressed", "zstd", "lz4")


def pending_dir(incarnation_dir: str, index: int) -> str:
    """``_flushes`` for topic log 0, ``_flushes.<k>`` after it (PROTOCOL.md 30.2)."""
    return (
        f"{incarnation_dir}/{PENDING_DIR}"
        if index == 0
        else f"{incarnation_dir}/{PENDING_DIR}.{index}"
    )


def pending_name(writer: str, number: int) -> str:
    return f"{writer}-{number:020d}{PENDING_SUFFIX}"


def parse_pending_name(name: str) -> tuple[str, int] | None:
    """(writer id, number) of a pending flush's file name; None for any other name (a
    temporary file, a probe, a name no writer makes)."""
    found = _NAME.fullmatch(name)
    return None if found is None else (found.group(1), int(found.group(2)))


@dataclass(frozen=True)
class Part:
    """One partition's share of a flush: its records' range in the flush's data section
    (``file.byte_range``, path :data:`CARRIED`), its producer batch, its transaction tag."""

    partition: int
    file: SegmentFile
    producer: ProducerBatch
    transaction: str | None = None


@dataclass
class Flush:
    """A producer flush to one topic log, as its pending file holds it (or, for a committer's
    own flush, as it would)."""

    writer: str
    number: int
    log: int
    data: bytes
    parts: dict[int, Part]
    durable: bool = True
    compression: str = "uncompressed"
    timestamp_ms: int = 0
    # Foreign flushes: the listed modification time (ordering only), -1 for one's own.
    listed_ms: int = -1
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return pending_name(self.writer, self.number)

    def part_bytes(self, part: Part) -> memoryview:
        start, length = part.file.byte_range or (0, 0)
        return memoryview(self.data)[start : start + length]


def encode_pending(flush: Flush) -> bytes:
    """The pending file of ``flush``: its ``flushInfo`` line, one ``add`` and one ``producer``
    per partition (without offsets), padding, then the data section."""
    lines: list[bytes] = []
    for p in sorted(flush.parts):
        part = flush.parts[p]
        f = part.file
        start, length = f.byte_range or (0, 0)
        add: dict[str, Any] = {
            "records": f.record_count,
            "minTimestamp": f.min_timestamp_ms,
            "maxTimestamp": f.max_timestamp_ms,
            "size": f.size_bytes,
            "checksum": f.checksum,
            "format": f.format,
            "range": [start, length],
        }
        if part.transaction is not None:
            add["transaction"] = part.transaction
        add["partition"] = p
        batch = part.producer
        producer = {
            **batch.extra,
            "id": batch.producer_id,
            "epoch": batch.epoch,
            "firstSequence": batch.first_sequence,
            "lastSequence": batch.last_sequence,
            "partition": p,
        }
        lines.append(orjson.dumps({"add": add}))
        lines.append(orjson.dumps({"producer": producer}))
    body = b"\n".join(lines) + b"\n"
    info: dict[str, Any] = {
        "writer": flush.writer,
        "number": flush.number,
        "log": flush.log,
        "timestamp": flush.timestamp_ms,
        "durable": flush.durable,
        "compression": flush.compression,
        "actions": len(lines),
        "dataBytes": len(flush.data),
    }
    # The offset is in the line it follows: grow it until the text fits before it.
    offset = 0
    while True:
        head = orjson.dumps({"flushInfo": {**info, "dataOffset": offset}}) + b"\n"
        needed = len(head) + len(body)
        if needed <= offset:
            break
        offset = needed
    text = head + body
    if len(text) > MAX_PENDING_TEXT:
        raise ValueError(f"a pending flush's text is {len(text)} bytes, over {MAX_PENDING_TEXT}")
    return b"".join((text, b" " * (offset - len(text)), flush.data))


def decode_pending(data: bytes, *, name: str, log: int, where: str) -> Flush:
    """A pending file checked as a reader checks a commit (PROTOCOL.md 30.4): its name, its
    ``flushInfo``, every action, every range inside the data section and its CRC-32C. Raises
    :class:`CorruptLogError` naming what is wrong."""
    parsed = parse_pending_name(name)
    if parsed is None:
        raise CorruptLogError(f"{where}: not a pending flush's name")
    newline = data.find(b"\n")
    if newline < 0:
        raise CorruptLogError(f"{where}: no flushInfo line")
    try:
        first = orjson.loads(data[:newline])
        info = first["flushInfo"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        raise CorruptLogError(f"{where}: the first line is not a flushInfo action") from None
    if not isinstance(info, dict):
        raise CorruptLogError(f"{where}: flushInfo is not an object")
    writer, number = info.get("writer"), info.get("number")
    if (writer, number) != parsed:
        raise CorruptLogError(f"{where}: flushInfo names writer {writer!r}, number {number!r}")
    if info.get("log") != log:
        raise CorruptLogError(f"{where}: flushInfo names topic log {info.get('log')!r}, not {log}")
    offset, size, count = info.get("dataOffset"), info.get("dataBytes"), info.get("actions")
    if not (
        isinstance(offset, int)
        and isinstance(size, int)
        and isinstance(count, int)
        and all(type(v) is int and v >= 0 for v in (offset, size, count))
    ):
        raise CorruptLogError(f"{where}: illegal dataOffset, dataBytes or actions in flushInfo")
    if offset > MAX_PENDING_TEXT or offset + size != len(data) or size < 1:
        raise CorruptLogError(
            f"{where}: {len(data)} bytes, flushInfo gives text {offset} and data {size}"
        )
    durable, codec = info.get("durable", True), info.get("compression", "uncompressed")
    if not isinstance(durable, bool) or codec not in _CODECS:
        raise CorruptLogError(f"{where}: illegal durable or compression in flushInfo")
    try:
        text = data[newline + 1 : offset].decode()
    except UnicodeDecodeError:
        raise CorruptLogError(f"{where}: the text is not UTF-8") from None
    lines = text.rstrip(" ").split("\n")
    if lines[-1] != "":
        raise CorruptLogError(f"{where}: the text does not end with a newline")
    lines.pop()
    if len(lines) != count:
        raise CorruptLogError(f"{where}: {len(lines)} actions, flushInfo counts {count}")
    section = data[offset:]
    adds: dict[int, tuple[SegmentFile, str | None]] = {}
    producers: dict[int, ProducerBatch] = {}
    for line in lines:
        try:
            action = orjson.loads(line)
            ((kind, body),) = action.items()
        except (orjson.JSONDecodeError, ValueError, AttributeError):
            raise CorruptLogError(f"{where}: a line is not one action") from None
        if not isinstance(body, dict):
            raise CorruptLogError(f"{where}: action {kind!r} is not an object")
        partition = body.get("partition")
        if type(partition) is not int or partition < 0:
            raise CorruptLogError(f"{where}: action {kind!r}: illegal partition {partition!r}")
        if kind == "add":
            if partition in adds:
                raise CorruptLogError(f"{where}: two adds for partition {partition}")
            adds[partition] = (_checked_add(body, section, where), _tag(body, where))
        elif kind == "producer":
            if partition in producers:
                raise CorruptLogError(f"{where}: two producer batches for partition {partition}")
            producers[partition] = _checked_producer(body, where)
        else:
            # Taken exactly or not at all: an action this version does not know could matter.
            raise CorruptLogError(f"{where}: action {kind!r} is not allowed in a pending flush")
    if not adds or set(adds) != set(producers):
        raise CorruptLogError(f"{where}: every partition needs one add and one producer batch")
    parts = {p: Part(p, file, producers[p], transaction) for p, (file, transaction) in adds.items()}
    stamp = info.get("timestamp", 0)
    return Flush(
        writer=parsed[0],
        number=parsed[1],
        log=log,
        data=section,
        parts=parts,
        durable=durable,
        compression=str(codec),
        timestamp_ms=stamp if type(stamp) is int else 0,
    )


def _tag(body: dict[str, Any], where: str) -> str | None:
    tag = body.get("transaction")
    if tag is not None and not (isinstance(tag, str) and _TAG.fullmatch(tag)):
        raise CorruptLogError(f"{where}: illegal transaction tag {tag!r}")
    return tag


def _checked_add(body: dict[str, Any], section: bytes, where: str) -> SegmentFile:
    fields = ("records", "minTimestamp", "maxTimestamp", "size")
    if not all(type(body.get(f)) is int for f in fields) or body["records"] < 1:
        raise CorruptLogError(f"{where}: add: illegal records, timestamps or size")
    if body.get("format") != FORMAT_ARROW or body.get("sparse", False) is not False:
        raise CorruptLogError(f"{where}: add: only dense arrow ranges are pending")
    span = body.get("range")
    if (
        not isinstance(span, list)
        or len(span) != 2
        or not all(type(v) is int for v in span)
        or span[0] < 0
        or span[1] < 1
        or span[0] + span[1] > len(section)
        or span[1] != body["size"]
    ):
        raise CorruptLogError(f"{where}: add: illegal range {span!r}")
    crc = body.get("checksum")
    if not isinstance(crc, str) or not crc.startswith(f"{CHECKSUM_ALGORITHM}:"):
        raise CorruptLogError(f"{where}: add: illegal checksum {crc!r}")
    actual = checksum(memoryview(section)[span[0] : span[0] + span[1]])
    if actual != crc:
        raise CorruptLogError(
            f"{where}: partition {body['partition']}'s range has checksum {actual}, the add "
            f"records {crc}"
        )
    return SegmentFile(
        path=CARRIED,
        record_count=body["records"],
        min_timestamp_ms=body["minTimestamp"],
        max_timestamp_ms=body["maxTimestamp"],
        size_bytes=body["size"],
        checksum=crc,
        format=FORMAT_ARROW,
        sparse=False,
        byte_range=(span[0], span[1]),
    )


def _checked_producer(body: dict[str, Any], where: str) -> ProducerBatch:
    pid, epoch = body.get("id"), body.get("epoch")
    first, last = body.get("firstSequence"), body.get("lastSequence")
    if not (
        isinstance(pid, str)
        and _HEX32.fullmatch(pid)
        and type(epoch) is int
        and epoch >= 0
        and type(first) is int
        and type(last) is int
        and 0 <= first <= last
    ):
        raise CorruptLogError(f"{where}: producer: illegal id, epoch or sequences")
    known = {"id", "epoch", "firstSequence", "lastSequence", "partition"}
    extra = {k: v for k, v in body.items() if k not in known}
    return ProducerBatch(pid, epoch, first, last, extra)
