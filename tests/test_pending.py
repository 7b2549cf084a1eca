"""Pending flushes (PROTOCOL.md 30.2): the file a waiting writer leaves for a committer, and
every check a committer runs before it takes one (30.4 step 2)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from kstore.errors import CorruptLogError
from kstore.log import CARRIED
from kstore.manifest import ProducerBatch
from kstore.pending import (
    Flush,
    Part,
    decode_pending,
    encode_pending,
    parse_pending_name,
    pending_dir,
    pending_name,
)
from kstore.segments import BINARY, encode_data_object

WRITER = "4e1f0c8d2a7b4c3d9e6f1a2b3c4d5ec2"
PRODUCER = "1d5c8e0f2a7b4c3d9e6f1a2b3c4d5e6f"


def _records(n: int, tag: str) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([b"k%d" % i for i in range(n)], pa.binary()),
            "value": pa.array([f"{tag}-{i}".encode() for i in range(n)], pa.binary()),
            "timestamp": pa.array([1_000_000 * (i + 1) for i in range(n)], pa.timestamp("us")),
        }
    )


def _flush(number: int = 7, transaction: str | None = None) -> Flush:
    data, files = encode_data_object(
        [(0, _records(3, "a"), BINARY), (2, _records(2, "b"), BINARY)], CARRIED
    )
    blob = data if isinstance(data, bytes) else memoryview(data).tobytes()
    parts = {
        p: Part(
            p,
            files[p],
            ProducerBatch(PRODUCER, 1, 10 * p, 10 * p + f.record_count - 1),
            transaction,
        )
        for p, f in files.items()
    }
    return Flush(WRITER, number, 0, blob, parts, durable=False, compression="zstd", timestamp_ms=5)


def _decode(data: bytes, name: str | None = None, log: int = 0) -> Flush:
    return decode_pending(data, name=name or pending_name(WRITER, 7), log=log, where="f")


def test_a_pending_flush_reads_back_as_written() -> None:
    flush = _flush(transaction=f"{PRODUCER}:4")
    data = encode_pending(flush)
    assert data.startswith(b'{"flushInfo":')
    back = _decode(data)
    assert (back.writer, back.number, back.log) == (WRITER, 7, 0)
    assert (back.durable, back.compression, back.timestamp_ms) == (False, "zstd", 5)
    assert back.data == flush.data
    for p in (0, 2):
        assert back.parts[p].file == flush.parts[p].file
        assert back.parts[p].producer == flush.parts[p].producer
        assert back.parts[p].transaction == f"{PRODUCER}:4"
        assert bytes(back.part_bytes(back.parts[p])) == bytes(flush.part_bytes(flush.parts[p]))


def test_names_and_directories() -> None:
    assert pending_name(WRITER, 17) == f"{WRITER}-00000000000000000017.kfl"
    assert parse_pending_name(pending_name(WRITER, 17)) == (WRITER, 17)
    for other in (".tmp-x", f"{WRITER}-17.kfl", f"{WRITER.upper()}-00000000000000000017.kfl", "a"):
        assert parse_pending_name(other) is None
    assert pending_dir("topics/t/id", 0) == "topics/t/id/_flushes"
    assert pending_dir("topics/t/id", 3) == "topics/t/id/_flushes.3"


def _tampered(old: bytes, new: bytes) -> bytes:
    data = encode_pending(_flush())
    assert old in data
    return data.replace(old, new, 1)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "no flushInfo"),
        (b"{}\n", "not a flushInfo"),
        (_tampered(b'"log":0', b'"log":1'), "topic log 1"),
        (_tampered(b'"number":7', b'"number":8'), "number 8"),
        (_tampered(b'"actions":4', b'"actions":3'), "flushInfo counts 3"),
        (_tampered(b'"compression":"zstd"', b'"compression":"gzip"'), "compression"),
        (_tampered(b'"firstSequence":0,', b'"firstSequence":9,'), "producer: illegal"),
        (_tampered(b'"format":"arrow"', b'"format":"avro!"'), "dense arrow"),
        (_tampered(b'"producer":{', b'"txnMarkr":{'), "not allowed"),
    ],
    ids=["empty", "no-info", "log", "name", "count", "codec", "sequence", "format", "action"],
)
def test_a_damaged_pending_flush_is_refused_naming_what_is_wrong(data: bytes, match: str) -> None:
    with pytest.raises(CorruptLogError, match=match):
        _decode(data)


def test_truncated_padded_and_flipped_files_are_refused() -> None:
    data = encode_pending(_flush())
    with pytest.raises(CorruptLogError, match="bytes, flushInfo gives"):
        _decode(data[:-1])
    with pytest.raises(CorruptLogError, match="bytes, flushInfo gives"):
        _decode(data + b"x")
    flipped = bytearray(data)
    flipped[-5] ^= 0xFF  # inside partition 2's range
    with pytest.raises(CorruptLogError, match="checksum"):
        _decode(bytes(flipped))
    with pytest.raises(CorruptLogError, match="not a pending flush's name"):
        _decode(data, name="x.kfl")


def test_a_transaction_tag_must_be_one_a_producer_makes() -> None:
    flush = _flush()
    flush.parts[2] = Part(2, flush.parts[2].file, flush.parts[0].producer, "not-a-tag")
    with pytest.raises(CorruptLogError, match="transaction tag"):
        _decode(encode_pending(flush))
