"""Segments: immutable files of records, Arrow IPC (producers) or Parquet (compaction, merging).

A *dense* segment holds records at consecutive offsets starting at the ``base_offset`` its
manifest entry assigns at commit time; the file itself holds no offsets, so a lost commit race
costs one retry of the small commit, never a rewrite of data. A *sparse* segment (written by
compaction) carries an explicit ``offset`` column. Every file has a CRC-32C checksum (Kafka's
record-batch checksum) recorded in the manifest and verified on every read.
"""

from __future__ import annotations

import re
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, cast

import crc32c
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from kstore.errors import CorruptRecordError, InvalidRecordError, MissingSegmentError
from kstore.manifest import DATA_PREFIX, is_carried_path, segment_location
from kstore.storage import Storage, unique_id

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

# Exactly the types Spark's Python data source accepts (binary, not large_binary; every field
# nullable), so batches flow to Spark without a cast.
RECORD_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("timestamp", TIMESTAMP_TYPE),
        pa.field("headers", HEADERS_TYPE),
    ]
)
OFFSET_FIELD = pa.field("offset", pa.int64())
# What readers get back, and what sparse and Parquet segments store.
READ_SCHEMA = RECORD_SCHEMA.append(OFFSET_FIELD)


@dataclass(frozen=True)
class Layout:
    """What a partition's segments hold: binary keys and values, or a typed topic's key type
    and value struct (PROTOCOL.md 25). ``schema_id`` is 0 for binary topics."""

    key: pa.DataType = pa.binary()  # noqa: RUF009 - immutable Arrow types
    value: pa.DataType = pa.binary()  # noqa: RUF009
    schema_id: int = 0

    @property
    def typed(self) -> bool:
        return self.schema_id > 0

    @cached_property
    def record_schema(self) -> pa.Schema:
        if not self.typed:
            return RECORD_SCHEMA
        return pa.schema(
            [
                pa.field("key", self.key),
                pa.field("value", self.value),
                pa.field("timestamp", TIMESTAMP_TYPE),
                pa.field("headers", HEADERS_TYPE),
            ]
        )

    @cached_property
    def read_schema(self) -> pa.Schema:
        return self.record_schema.append(OFFSET_FIELD)


BINARY = Layout()


def layout_of(metadata: Any) -> Layout:
    """The layout of a topic's current schema (a TopicMetadata)."""
    schema = metadata.schema
    if schema is None:
        return BINARY
    return Layout(key=schema.key_type, value=schema.value, schema_id=schema.id)


FORMAT_ARROW = "arrow"
FORMAT_PARQUET = "parquet"
CHECKSUM_ALGORITHM = "crc32c"
COMPRESSIONS = {"uncompressed": None, "zstd": "zstd", "lz4": "lz4"}
# A segment or range whose records hold fewer bytes than this (Table.nbytes: what the slice
# holds, not the buffers it shares) is written uncompressed whatever the compression asked
# (readers decode both alike). Arrow compresses each buffer of a record
# batch on its own, a dozen of them, each with a fresh codec context: about 100 us (lz4) to
# 200 us (zstd) to write a small range and as much to read it, against 20 and 10 uncompressed,
# where it saves little or nothing (a two-record range comes out larger). A producer flush
# spread over many partitions writes exactly such ranges, one per partition.
COMPRESS_MIN_BYTES = 4096
# A data object's range is encoded by pyarrow's IPC writer straight into the object's buffer
# when its table holds more than FRAMED_MAX_ROWS records and more than FRAMED_MAX_BYTES of IPC;
# any other is framed (_ipc_file, about a third of the writer's cost for a few records) and
# copied in. Above the bytes the second copy costs more than framing saves; below the rows the
# size check itself costs more (a few microseconds a range inside a flush, and a 64-partition
# flush has a range of a record or two per partition) unless the records are KBs each.
FRAMED_MAX_BYTES = 64 << 10
FRAMED_MAX_ROWS = 256
_UNCOMPRESSED = ipc.IpcWriteOptions()


def _write_options(table: pa.Table, options: ipc.IpcWriteOptions) -> ipc.IpcWriteOptions:
    # Table.nbytes counts what a slice holds (a partition's share of a flush is a slice of
    # the flush's sorted table, whose buffers are the whole flush's).
    if options.compression is None or table.nbytes >= COMPRESS_MIN_BYTES:
        return options
    return _UNCOMPRESSED


@dataclass(frozen=True)
class SegmentFile:
    """A segment written to storage but not yet (or no longer) part of any manifest."""

    path: str  # relative to the partition directory, e.g. "segments/<name>.arrow"
    record_count: int
    min_timestamp_ms: int
    max_timestamp_ms: int
    size_bytes: int
    checksum: str
    format: str
    sparse: bool
    first_offset: int | None = None  # sparse segments only: first and last record offsets
    last_offset: int | None = None
    # Layout 3: the segment is bytes [start, start + length) of a data object (``path``).
    byte_range: tuple[int, int] | None = None


# pyarrow's pa.array, pa.scalar and Array.to_numpy import pandas the first time they run (to
# recognise pandas objects): about 0.3 s, paid by a producer's first delivery and a consumer's
# first read. The record path builds and reads its arrays through these helpers instead.

_INT32_MAX = (1 << 31) - 1


def fixed_array(values: np.ndarray[Any, Any], type: pa.DataType) -> pa.Array:
    """A fixed-width array without nulls over a 1-d numpy array of the same width (no copy
    when ``values`` is contiguous)."""
    values = np.ascontiguousarray(values)
    if values.ndim != 1 or values.dtype.itemsize * 8 != type.bit_width:
        raise ValueError(f"cannot view a {values.ndim}-d {values.dtype} array as {type}")
    return pa.Array.from_buffers(type, len(values), [None, pa.py_buffer(values)])


def numpy_values(array: pa.Array | pa.ChunkedArray, dtype: Any) -> np.ndarray[Any, Any]:
    """The values of a fixed-width array without nulls as numpy ``dtype`` of the same width
    (no copy for an array or a one-chunk column)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.chunk(0) if array.num_chunks == 1 else array.combine_chunks()
    dtype = np.dtype(dtype)
    if array.null_count or array.type.bit_width != dtype.itemsize * 8:
        raise ValueError(f"cannot view {array.type} with {array.null_count} nulls as {dtype}")
    if len(array) == 0:
        return np.empty(0, dtype)
    return np.frombuffer(
        array.buffers()[1], dtype, count=len(array), offset=array.offset * dtype.itemsize
    )


def binary_array(items: list[bytes | None], type: pa.DataType) -> pa.Array | pa.ChunkedArray:
    """``items`` as a binary or large_binary array, None as null."""
    n = len(items)
    validity = None
    present: list[bytes] = items  # type: ignore[assignment]  # len() refuses a None
    try:
        lengths = np.fromiter(map(len, present), np.int64, n)
    except TypeError:
        mask = np.fromiter((x is not None for x in items), np.bool_, n)
        validity = pa.py_buffer(np.packbits(mask, bitorder="little"))
        present = [b"" if x is None else x for x in items]
        lengths = np.fromiter(map(len, present), np.int64, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if type == pa.binary():
        if offsets[-1] > _INT32_MAX:
            return pa.array(items, type)  # past int32 offsets, which pyarrow splits in chunks
        offsets = offsets.astype(np.int32)
    elif type != pa.large_binary():
        raise ValueError(f"binary_array builds binary or large_binary, not {type}")
    data = pa.py_buffer(b"".join(present))
    return pa.Array.from_buffers(type, n, [validity, pa.py_buffer(offsets), data])


def headers_array(rows: dict[int, list[tuple[str, bytes]]], n: int) -> pa.Array:
    """Headers (HEADERS_TYPE) of ``n`` records: ``rows`` maps a record's index to its
    headers (an empty list is no headers); a record not in it has null headers."""
    order = sorted(rows)
    valid = np.zeros(n, np.bool_)
    counts = np.zeros(n, np.int32)
    valid[order] = True
    counts[order] = [len(rows[i]) for i in order]
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(counts, out=offsets[1:])
    pairs = [pair for i in order for pair in rows[i]]
    names = binary_array([name.encode() for name, _ in pairs], pa.binary())
    values = binary_array([value for _, value in pairs], pa.binary())
    if not isinstance(names, pa.Array) or not isinstance(values, pa.Array):
        raise InvalidRecordError("headers of one batch exceed 2 GiB")
    # Encoded from str: valid UTF-8, so the binary buffers are a string array as they are.
    names = pa.Array.from_buffers(pa.string(), len(pairs), names.buffers())
    struct = pa.StructArray.from_arrays([names, values], fields=list(HEADER_TYPE))
    validity = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(
        HEADERS_TYPE, n, [validity, pa.py_buffer(offsets)], children=[struct]
    )


def null_headers(n: int) -> pa.Array:
    """``n`` null headers (HEADERS_TYPE) that hold nothing else. ``pa.nulls`` allocates the
    list's children for ``n`` values as well, and an IPC message of it, or of a slice of it,
    carries those buffers: 8 bytes a record, and a slice of a large one all of its parent's."""
    global _NULL_HEADERS
    found = _NULL_HEADERS  # read once: another thread may put a shorter one meanwhile
    if len(found) < n:
        found = headers_array({}, max(n, 2 * len(found), 1024))  # built once, then sliced
        _NULL_HEADERS = found
    return found.slice(0, n)


_NULL_HEADERS: pa.Array = pa.nulls(0, HEADERS_TYPE)


def new_segment_name(extension: str) -> str:
    # Time-ordered and unique: listings sort by age, and no two writers ever collide.
    return f"segments/{int(time.time() * 1000):013d}-{unique_id()}.{extension}"


def checksum(data: bytes | memoryview) -> str:
    return f"{CHECKSUM_ALGORITHM}:{crc32c.crc32c(data):08x}"


def conform(table: pa.Table | pa.RecordBatch, schema: pa.Schema = RECORD_SCHEMA) -> pa.Table:
    """Cast/arrange a table to ``schema`` exactly; InvalidRecordError naming what is wrong."""
    if isinstance(table, pa.RecordBatch):
        table = pa.Table.from_batches([table])
    columns = []
    for field in schema:
        if field.name not in table.column_names:
            if field.name == "timestamp":  # records without a time are stamped now
                now_us = int(time.time() * 1_000_000)
                stamps = fixed_array(np.full(table.num_rows, now_us, np.int64), pa.int64())
                columns.append(stamps.cast(field.type))
                continue
            if field.name in ("key", "headers"):
                columns.append(
                    null_headers(table.num_rows)
                    if field.type == HEADERS_TYPE
                    else pa.nulls(table.num_rows, field.type)
                )
                continue
            raise InvalidRecordError(
                f"records need a {field.name!r} column; got {table.column_names}"
            )
        column = table.column(field.name)
        if column.type != field.type:
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InvalidRecordError(
                    f"column {field.name!r} has type {column.type}, expected {field.type}: {exc}"
                ) from None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)


def _timestamp_range_ms(table: pa.Table) -> tuple[int, int]:
    column = table.column("timestamp")
    if column.null_count:
        raise InvalidRecordError("every record needs a timestamp (null timestamp found)")
    # numpy over the int64 view: pyarrow's min_max costs more in its Python wrapper than in
    # the kernel, and this runs for every partition of every flush.
    micros = numpy_values(column, np.int64)  # timestamp[us]: int64 microseconds
    if len(micros) <= 32:
        # A partition's share of a small flush: numpy's reductions cost several times Python's
        # over a list of a few values.
        values = micros.tolist()
        return min(values) // 1000, max(values) // 1000
    return int(micros.min()) // 1000, int(micros.max()) // 1000


def encode_arrow(table: pa.Table, compression: str) -> pa.Buffer:
    if compression not in COMPRESSIONS:
        raise InvalidRecordError(
            f"unknown segment compression {compression!r}; use {sorted(COMPRESSIONS)}"
        )
    options = _write_options(table, ipc.IpcWriteOptions(compression=COMPRESSIONS[compression]))
    if options.compression is not None:
        sink = pa.BufferOutputStream()
        _write_ipc_file(sink, table, table.schema, options)
        return sink.getvalue()
    # Uncompressed, the file's size is known from a pass that only counts bytes: one buffer of
    # exactly that size is filled, where a growing stream copies the data again at each
    # doubling (and faults in fresh pages each time). A data object's large ranges are
    # written the same way (_assemble).
    counter = pa.MockOutputStream()
    _write_ipc_file(counter, table, table.schema, options)
    buf = pa.allocate_buffer(counter.size())
    _write_ipc_file(pa.FixedSizeBufferWriter(buf), table, table.schema, options)
    return buf


def write_segment(
    storage: Storage,
    partition_dir: str,
    table: pa.Table,
    *,
    compression: str = "uncompressed",
    durable: bool = True,
    fmt: str = FORMAT_ARROW,
    parquet_row_group_size: int = 1 << 20,
    layout: Layout = BINARY,
    name: str | None = None,
) -> SegmentFile:
    """Write ``table`` as a new segment under a unique name (``name``: one chosen beforehand
    by :func:`new_segment_name`, for a writer that records it before writing).

    A table with an ``offset`` column becomes a sparse segment (offsets must be strictly
    increasing); otherwise a dense one. Parquet segments always carry offsets.
    """
    buf, name, described = encode_segment(
        table,
        compression=compression,
        fmt=fmt,
        parquet_row_group_size=parquet_row_group_size,
        layout=layout,
        name=name,
    )
    data = memoryview(buf)
    storage.put_new(
        f"{partition_dir}/{name}", data if storage.writes_views else data.tobytes(), durable=durable
    )
    return described


def encode_segment(
    table: pa.Table,
    *,
    compression: str = "uncompressed",
    fmt: str = FORMAT_ARROW,
    parquet_row_group_size: int = 1 << 20,
    layout: Layout = BINARY,
    name: str | None = None,
) -> tuple[pa.Buffer, str, SegmentFile]:
    """A segment's bytes, its name (``name``, or a new one) and its description, without
    writing it."""
    sparse = "offset" in table.column_names or fmt == FORMAT_PARQUET
    if table.num_rows == 0:
        raise InvalidRecordError("a segment needs at least one record")
    if name is not None and not re.fullmatch(
        rf"segments/[0-9]{{13}}-[0-9a-f]{{32}}\.{re.escape(fmt)}", name
    ):
        raise ValueError(
            f"segment name {name!r} is not a new {fmt} segment's name "
            f"(segments/<13 digits>-<32 hex>.{fmt}, from new_segment_name)"
        )
    table = conform(table, layout.read_schema if sparse else layout.record_schema)
    first_offset = last_offset = None
    if sparse:
        column = table.column("offset")
        offsets = numpy_values(column, np.int64) if not column.null_count else None
        if offsets is None or (len(offsets) > 1 and not bool(np.all(np.diff(offsets) > 0))):
            raise InvalidRecordError(
                "sparse segment offsets must be non-null and strictly increasing"
            )
        first_offset, last_offset = int(offsets[0]), int(offsets[-1])
    min_ts, max_ts = _timestamp_range_ms(table)
    if fmt == FORMAT_ARROW:
        buf = encode_arrow(table, compression)
        name = name or new_segment_name(FORMAT_ARROW)
    elif fmt == FORMAT_PARQUET:
        sink = pa.BufferOutputStream()
        if compression not in COMPRESSIONS:
            raise InvalidRecordError(
                f"unknown segment compression {compression!r}; use {sorted(COMPRESSIONS)}"
            )
        codec = COMPRESSIONS[compression] or "none"
        pq.write_table(table, sink, compression=codec, row_group_size=parquet_row_group_size)
        buf = sink.getvalue()
        name = name or new_segment_name(FORMAT_PARQUET)
    else:
        raise InvalidRecordError(f"unknown segment format {fmt!r}")
    return (
        buf,
        name,
        SegmentFile(
            path=name,
            record_count=table.num_rows,
            min_timestamp_ms=min_ts,
            max_timestamp_ms=max_ts,
            size_bytes=buf.size,
            checksum=checksum(memoryview(buf)),
            format=fmt,
            sparse=sparse,
            first_offset=first_offset,
            last_offset=last_offset,
        ),
    )


def write_data_object(
    storage: Storage,
    incarnation_dir: str,
    parts: Sequence[tuple[int, pa.Table, Layout]],
    *,
    compression: str = "uncompressed",
    durable: bool = True,
) -> dict[int, SegmentFile]:
    """Layout 3: write the records of several partitions as ONE data object, each partition's
    records a dense arrow segment at its own byte range (PROTOCOL.md 11.7). Returns, per
    partition, the description of its range (not yet committed)."""
    name = new_data_object_name()
    data, out = encode_data_object(parts, name, compression=compression)
    put_data_object(storage, f"{incarnation_dir}/{name}", data, durable=durable)
    return out


def new_data_object_name() -> str:
    """A new data object's manifest path (PROTOCOL.md 5.8): ``_data/<ms>-<32 hex>.kdat``."""
    return f"{DATA_PREFIX}{int(time.time() * 1000):013d}-{unique_id()}.kdat"


def put_data_object(
    storage: Storage, location: str, data: pa.Buffer | bytes, *, durable: bool = True
) -> None:
    """Write an encoded data object (:func:`encode_data_object`) under a new name."""
    view = memoryview(data)
    storage.put_new(location, view if storage.writes_views else view.tobytes(), durable=durable)


def encode_data_object(
    parts: Sequence[tuple[int, pa.Table, Layout]],
    path: str,
    *,
    compression: str = "uncompressed",
) -> tuple[pa.Buffer | bytes, dict[int, SegmentFile]]:
    """The bytes of a data object holding ``parts`` (PROTOCOL.md 11.7), and per partition the
    description of its range, named ``path``: a data object's name, or the placeholder of the
    data a commit carries (11.8), whose ranges count from the data's start as well.

    This runs once per producer flush for every partition the flush touches, so its cost per
    partition is kept to the encoding itself: a table already in the layout's schema is not
    conformed again, and no name or description is made per range beyond its own."""
    if not parts:
        raise ValueError("a data object needs at least one partition")
    if compression not in COMPRESSIONS:
        raise InvalidRecordError(
            f"unknown segment compression {compression!r}; use {sorted(COMPRESSIONS)}"
        )
    options = ipc.IpcWriteOptions(compression=COMPRESSIONS[compression])
    buffers: list[pa.Buffer | bytes | None] = []  # None: written in place by _assemble
    in_place: list[tuple[int, pa.Table, pa.Schema, ipc.IpcWriteOptions]] = []
    out: dict[int, SegmentFile] = {}
    position = 0
    for partition, table, layout in parts:
        if partition in out:
            raise ValueError(f"partition {partition} appears twice in one data object")
        schema = layout.record_schema
        exact = table.schema.equals(schema)  # the record schema has no offset column
        if not exact and "offset" in table.column_names:
            raise ValueError("a data object holds dense records only (no offset column)")
        if table.num_rows == 0:
            raise InvalidRecordError("a segment needs at least one record")
        if not exact:
            table = conform(table, schema)
        min_ts, max_ts = _timestamp_range_ms(table)
        # Each range is a whole IPC file of its own (its footer's offsets count from its
        # start). A large one is written by the writer straight into the object's buffer
        # (_assemble): framed or compressed first, it would be copied once more.
        opts = _write_options(table, options)
        if (
            opts.compression is None
            and table.num_rows > FRAMED_MAX_ROWS
            and _ipc_body_exceeds(table, FRAMED_MAX_BYTES)
        ):
            counter = pa.MockOutputStream()
            _write_ipc_file(counter, table, schema, opts)
            size, crc = counter.size(), ""  # the checksum once written
            buffers.append(None)
            in_place.append((partition, table, schema, opts))
        else:
            buf = _ipc_file(table, schema, opts)
            size, crc = len(buf), checksum(memoryview(buf))
            buffers.append(buf)
        out[partition] = SegmentFile(
            path=path,
            record_count=table.num_rows,
            min_timestamp_ms=min_ts,
            max_timestamp_ms=max_ts,
            size_bytes=size,
            checksum=crc,
            format=FORMAT_ARROW,
            sparse=False,
            byte_range=(position, size),
        )
        position += size
    if in_place:
        return _assemble(buffers, in_place, out, position), out
    ready = cast(list[pa.Buffer | bytes], buffers)  # every range encoded already
    return (b"".join(memoryview(b) for b in ready) if len(ready) > 1 else ready[0]), out


def _assemble(
    buffers: list[pa.Buffer | bytes | None],
    in_place: list[tuple[int, pa.Table, pa.Schema, ipc.IpcWriteOptions]],
    out: dict[int, SegmentFile],
    size: int,
) -> pa.Buffer:
    """The data object of :func:`encode_data_object` when some ranges are to be written in
    place: one buffer of ``size`` bytes, each range encoded already copied in, each other
    written there by the IPC writer (and its description given its checksum)."""
    data = pa.allocate_buffer(size)
    view = memoryview(data).cast("B")
    writes = iter(in_place)
    for buf, described in zip(buffers, list(out.values()), strict=True):
        start, length = described.byte_range or (0, 0)
        region = view[start : start + length]
        if buf is not None:
            region[:] = memoryview(buf).cast("B")
            continue
        partition, table, schema, opts = next(writes)
        sink = pa.FixedSizeBufferWriter(pa.py_buffer(region))
        _write_ipc_file(sink, table, schema, opts)
        if sink.tell() != length:  # the buffer is not zeroed: no byte may stay unwritten
            raise AssertionError(f"IPC writer wrote {sink.tell()} bytes of {length} counted")
        out[partition] = replace(described, checksum=checksum(region))
    return data


def _ipc_body_exceeds(table: pa.Table, limit: int) -> bool:
    """Whether ``table``'s record batches take more than ``limit`` bytes in IPC. The buffers'
    total bounds it from above at a fraction of the cost (0.4 against 1.2 us a batch), but
    counts all of a slice's buffers (a few records of a large table, or the producer's shared
    null headers)."""
    if table.get_total_buffer_size() <= limit:
        return False
    body: int = sum(ipc.get_record_batch_size(batch) for batch in table.to_batches())
    return body > limit


def _write_ipc_file(
    sink: pa.NativeFile, table: pa.Table, schema: pa.Schema, options: ipc.IpcWriteOptions
) -> None:
    with ipc.RecordBatchFileWriter(sink, schema, options=options) as writer:
        writer.write_table(table, max_chunksize=max(table.num_rows, 1))


def _ipc_file_by_writer(table: pa.Table, schema: pa.Schema, options: ipc.IpcWriteOptions) -> bytes:
    sink = pa.BufferOutputStream()
    _write_ipc_file(sink, table, schema, options)
    written: bytes = sink.getvalue().to_pybytes()
    return written


class _IpcFileFrame:
    """What this pyarrow's IPC file writer puts around the one record batch of a file of
    ``schema``: the magic and the schema message before it, the end-of-stream marker and the
    footer after it. The footer differs from file to file only in the batch's block (its
    offset, metadata length and body length, one struct at a fixed place). Learned from a
    file the writer wrote, and trusted only once it reproduced a second such file byte for
    byte; until then, and for anything else (compression, several batches), the writer
    writes."""

    __slots__ = ("block_at", "checked", "footer", "head", "schema")

    def __init__(self, schema: pa.Schema, written: bytes, batch: pa.RecordBatch) -> None:
        self.schema = schema
        self.checked = False
        self.head = b"ARROW1\0\0" + _schema_message(schema)
        message = batch.serialize().to_pybytes()
        footer_length = int.from_bytes(written[-10:-6], "little", signed=True)
        footer_start = len(self.head) + len(message) + len(_END_OF_STREAM)
        self.footer = written[footer_start : footer_start + footer_length]
        block = self._block(message)
        self.block_at = self.footer.find(block)
        if (
            not written.startswith(self.head + message + _END_OF_STREAM)
            or footer_start + footer_length + 10 != len(written)
            or self.footer.count(block) != 1
        ):
            self.block_at = -1  # framed otherwise than expected: the writer it is

    def _block(self, message: bytes | pa.Buffer) -> bytes:
        metadata = 8 + int.from_bytes(memoryview(message)[4:8], "little", signed=True)
        return struct.pack("<qi4xq", len(self.head), metadata, len(message) - metadata)

    def file(self, batch: pa.RecordBatch) -> bytes:
        message = batch.serialize()  # joined below as it is: no copy to bytes first
        at = self.block_at
        footer = b"".join((self.footer[:at], self._block(message), self.footer[at + 24 :]))
        return b"".join(
            (
                self.head,
                message,
                _END_OF_STREAM,
                footer,
                len(footer).to_bytes(4, "little"),
                b"ARROW1",
            )
        )


# id(schema) -> its frame (None: the writer writes files of it). Keyed by identity, as
# _SCHEMA_MESSAGES; the frame holds its schema so the id stays unique.
_IPC_FRAMES: dict[int, _IpcFileFrame | None] = {}


def _ipc_file(table: pa.Table, schema: pa.Schema, options: ipc.IpcWriteOptions) -> bytes:
    """``table`` (of ``schema``) as an IPC file of one record batch: what
    ``RecordBatchFileWriter`` writes, byte for byte. A producer writes one per partition per
    flush; the writer's setup costs about three times the framing of a batch's message
    (10.5 against 3.8 us for a few records), so once this pyarrow's framing is learned for a
    schema (:class:`_IpcFileFrame`) files of it are framed here."""
    if options.compression is not None or table.num_rows == 0:
        return _ipc_file_by_writer(table, schema, options)
    batches = table.to_batches()
    if len(batches) != 1:  # one batch either way, whichever writes it
        table = table.combine_chunks()
        batches = table.to_batches()
    batch = batches[0]
    key = id(schema)
    if key not in _IPC_FRAMES or (
        (known := _IPC_FRAMES[key]) is not None and known.schema is not schema
    ):
        written = _ipc_file_by_writer(table, schema, options)
        learned = _IpcFileFrame(schema, written, batch)
        _IPC_FRAMES[key] = learned if learned.block_at >= 0 else None
        return written
    frame = _IPC_FRAMES[key]
    if frame is None:
        return _ipc_file_by_writer(table, schema, options)
    if not frame.checked:
        written = _ipc_file_by_writer(table, schema, options)
        if frame.file(batch) != written:
            _IPC_FRAMES[key] = None  # did not reproduce the writer: it writes from now on
            return written
        frame.checked = True
        return written
    return frame.file(batch)


def decode_segment(
    data: bytes,
    *,
    where: str,
    expected_checksum: str | None,
    fmt: str,
    sparse: bool,
    base_offset: int,
    record_count: int,
    columns: list[str] | None = None,
    layout: Layout = BINARY,
) -> pa.Table:
    """Verify and decode a segment's bytes into a table with the layout's read schema (or
    ``columns`` of it). A typed segment written under another schema version is projected
    onto the layout's (fields matched by name, missing ones null)."""
    if expected_checksum is not None:
        algorithm, _, _ = expected_checksum.partition(":")
        if algorithm != CHECKSUM_ALGORITHM:
            raise CorruptRecordError(f"{where}: unknown checksum algorithm {algorithm!r}")
        actual = checksum(data)
        if actual != expected_checksum:
            raise CorruptRecordError(
                f"{where}: checksum mismatch (manifest {expected_checksum}, file {actual}): "
                "the segment is corrupt"
            )
    if fmt == FORMAT_ARROW and not sparse and columns is None:
        fast = _decode_dense_arrow(data, layout, base_offset, record_count)
        if fast is not None:
            return fast
    wanted = [c for c in (columns or READ_SCHEMA.names) if c != "offset"]
    try:
        if fmt == FORMAT_ARROW:
            # The reader class over a buffer: ipc.open_file's wrapper costs several times
            # the decoding of a small range, which a consumer does per partition per flush.
            reader = ipc.RecordBatchFileReader(pa.py_buffer(data))
            file_schema = reader.schema
            table = reader.read_all()
        elif fmt == FORMAT_PARQUET:
            pf = pq.ParquetFile(pa.BufferReader(data))
            file_schema = pf.schema_arrow
            read_cols = wanted + (["offset"] if sparse else [])
            table = pf.read(columns=read_cols)
        else:
            raise CorruptRecordError(f"{where}: unknown segment format {fmt!r}")
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise CorruptRecordError(f"{where}: cannot decode segment ({exc})") from None
    expected_schema = layout.read_schema if sparse else layout.record_schema
    if not file_schema.equals(expected_schema):
        table = _adapt(table, file_schema, expected_schema, layout, where)
    if table.num_rows != record_count:
        raise CorruptRecordError(
            f"{where}: holds {table.num_rows} records, the manifest says {record_count}"
        )
    if sparse:
        offsets = table.column("offset")
    else:
        offsets = fixed_array(
            np.arange(base_offset, base_offset + table.num_rows, dtype=np.int64), pa.int64()
        )
    out_cols = [table.column(c) for c in wanted]
    names = list(wanted)
    if columns is None or "offset" in columns:
        out_cols.append(
            offsets if isinstance(offsets, pa.ChunkedArray) else pa.chunked_array([offsets])
        )
        names.append("offset")
    read_schema = layout.read_schema
    schema = (
        read_schema
        if names == read_schema.names
        else pa.schema([read_schema.field(n) for n in names])
    )
    return pa.Table.from_arrays(out_cols, schema=schema).combine_chunks()


# id(schema) -> (schema, its IPC schema message as this pyarrow frames it). Keyed by identity:
# hashing a pa.Schema costs more than a whole fast decode. The schema is held so its id stays
# unique.
_SCHEMA_MESSAGES: dict[int, tuple[pa.Schema, bytes]] = {}
# The IPC stream's end-of-stream marker: a continuation token and a zero length.
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def _schema_message(schema: pa.Schema) -> bytes:
    """``schema``'s IPC schema message, framed (continuation, length, flatbuffer, padding), as
    a writer of this pyarrow writes it at the start of every stream."""
    found = _SCHEMA_MESSAGES.get(id(schema))
    if found is None or found[0] is not schema:
        found = (schema, schema.serialize().to_pybytes())
        _SCHEMA_MESSAGES[id(schema)] = found
    return found[1]


def _decode_dense_arrow(
    data: bytes, layout: Layout, base_offset: int, record_count: int
) -> pa.Table | None:
    """A dense arrow segment whose schema is exactly the layout's record schema, decoded from
    the IPC stream that every IPC file holds after its 8-byte magic (the footer only indexes
    the same messages, and the checksum has already vouched for every byte). A consumer
    decodes a range per partition per producer flush: this costs a fraction of opening the
    file with a reader. None for anything else (another schema version, a dictionary, a file
    this pyarrow writes differently): the general path then decodes, checks and names it."""
    if len(data) < 16 or data[:6] != b"ARROW1":
        return None
    schema = layout.record_schema
    head = _schema_message(schema)
    if data[8 : 8 + len(head)] != head:
        return None  # another schema (version), or framed differently: the general path
    buf = pa.py_buffer(data)
    position = 8 + len(head)  # a schema message has no body
    try:
        message = ipc.read_message(buf.slice(position))
        if message.type != "record batch":
            return None
        # One batch, as this project's writers write a range: the end-of-stream marker right
        # after it. Otherwise every message is read in turn.
        length = int.from_bytes(data[position + 4 : position + 8], "little", signed=True)
        end = position + 8 + length + message.body.size
        if data[end : end + 8] == _END_OF_STREAM:
            batch = ipc.read_record_batch(message, schema)
        else:
            reader = ipc.MessageReader.open_stream(buf.slice(position))
            batches = []
            while True:
                try:
                    message = reader.read_next_message()
                except StopIteration:
                    break
                if message.type != "record batch":
                    return None
                batches.append(ipc.read_record_batch(message, schema))
            batch = pa.concat_batches(batches)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError):
        return None  # the general path names the damage
    if batch.num_rows != record_count:
        return None
    offsets = fixed_array(
        np.arange(base_offset, base_offset + record_count, dtype=np.int64), pa.int64()
    )
    return pa.Table.from_batches([batch.append_column(OFFSET_FIELD, offsets)])


def _adapt(
    table: pa.Table, file_schema: pa.Schema, expected: pa.Schema, layout: Layout, where: str
) -> pa.Table:
    """A typed segment written under another schema version, as the layout's schema. Every
    column but ``value`` must match exactly; anything else is a corrupt segment."""
    from kstore.schema import IncompatibleSchemaError, project

    problem = f"{where}: unexpected segment schema {file_schema}"
    if not layout.typed or file_schema.names != expected.names:
        raise CorruptRecordError(problem)
    for field in expected:
        if field.name != "value" and not file_schema.field(field.name).equals(field):
            raise CorruptRecordError(problem)
    if "value" not in table.column_names:
        return table
    stored = file_schema.field("value").type
    if not pa.types.is_struct(stored):
        raise CorruptRecordError(problem)
    try:
        value = project(table.column("value"), layout.value)
    except IncompatibleSchemaError as exc:
        raise CorruptRecordError(f"{where}: {exc}") from None
    index = table.schema.get_field_index("value")
    return table.set_column(index, expected.field("value"), value)


class SegmentCache:
    """A small LRU of decoded segments, bounded in bytes. Segments never change, so a cached
    table is valid for as long as its path exists; reading it again re-verifies nothing."""

    def __init__(self, max_bytes: int = 256 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[pa.Table, int]] = OrderedDict()  # table, bytes
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> pa.Table | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: str, table: pa.Table) -> None:
        # The buffers' size, not Table.nbytes: a decoded segment owns its buffers whole, and
        # nbytes walks every buffer to add up slices (ten times slower, per cached segment).
        size = table.get_total_buffer_size()
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._items:
                return
            self._items[key] = (table, size)
            self._bytes += size
            while self._bytes > self.max_bytes and self._items:
                _, (_, old) = self._items.popitem(last=False)
                self._bytes -= old


def read_segment_bytes(storage: Storage, path: str, where: str) -> bytes:
    try:
        return storage.read(path)
    except FileNotFoundError:
        raise MissingSegmentError(f"{where}: segment file is missing from storage") from None


def read_segment_data(storage: Storage, partition_dir: str, seg: Any, where: str) -> bytes:
    """A live segment's bytes: its file, or its range of a data object (one range GET)."""
    location = segment_location(partition_dir, seg.path)
    if seg.byte_range is None:
        return read_segment_bytes(storage, location, where)
    start, length = seg.byte_range
    try:
        (data,) = storage.read_ranges(location, [(start, start + length)])
    except FileNotFoundError:
        raise MissingSegmentError(f"{where}: data object is missing from storage") from None
    if len(data) != length:
        if is_carried_path(seg.path) and not data:
            raise MissingSegmentError(
                f"{where}: the data this commit carried was vacuumed (PROTOCOL.md 22.5)"
            )
        raise CorruptRecordError(
            f"{where}: range {start}+{length} is cut short at {len(data)} bytes"
        )
    return data


def read_segments(storage: Storage, partition_dir: str, segs: Sequence[Any]) -> dict[str, bytes]:
    """Several live segments' bytes, by manifest path, fetched concurrently: whole files in
    one batch, the ranges of each data object coalesced. Absent files are left out."""
    whole = [s for s in segs if s.byte_range is None]
    found: dict[str, bytes] = {}
    if whole:
        locations = {segment_location(partition_dir, s.path): s.path for s in whole}
        for location, data in storage.read_many(list(locations)).items():
            found[locations[location]] = data
    by_object: dict[str, list[Any]] = {}
    for seg in segs:
        if seg.byte_range is not None:
            by_object.setdefault(segment_location(partition_dir, seg.path), []).append(seg)
    pieces = read_object_ranges(
        storage,
        {
            location: [(s.byte_range[0], s.byte_range[0] + s.byte_range[1]) for s in ranged]
            for location, ranged in by_object.items()
        },
    )
    for location, ranged in by_object.items():
        for seg, data in zip(ranged, pieces.get(location, ()), strict=False):
            found[seg.path] = data
    return found


def read_object_ranges(
    storage: Storage, wanted: dict[str, list[tuple[int, int]]]
) -> dict[str, list[bytes]]:
    """Byte ranges ``[start, end)`` of several objects, by location, in the order asked: the
    ranges of one object coalesced (:meth:`Storage.read_ranges`), the objects concurrently on
    an object store. Absent objects are left out."""

    def fetch(location: str) -> tuple[str, list[bytes] | None]:
        try:
            return location, storage.read_ranges(location, wanted[location])
        except FileNotFoundError:
            return location, None

    if len(wanted) < 2 or not storage.is_remote:
        fetched = [fetch(location) for location in wanted]
    else:
        with ThreadPoolExecutor(min(_OBJECT_READS, len(wanted))) as pool:
            fetched = list(pool.map(fetch, wanted))
    return {location: data for location, data in fetched if data is not None}


# Data objects read at once by a maintenance job (each read a coalesced GET of its ranges).
_OBJECT_READS = 8


def describe_file(seg: SegmentFile) -> dict[str, Any]:
    return {
        "path": seg.path,
        "records": seg.record_count,
        "bytes": seg.size_bytes,
        "format": seg.format,
        "sparse": seg.sparse,
    }
