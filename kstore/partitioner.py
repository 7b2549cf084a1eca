"""Key partitioners that place records exactly where Kafka's clients would.

A topic written by kstore may be read side by side with data that Kafka producers partitioned,
and users move producers between the two, so keyed records must land on the same partition
number as with the client they replace:

* ``murmur2`` (the default): the Java client's ``BuiltInPartitioner.partitionForKey``,
  ``toPositive(Utils.murmur2(key)) % numPartitions``; also librdkafka's ``murmur2_random``.
* ``crc32``: librdkafka's ``consistent_random`` (its default), ``crc32(key) % partition_cnt``.

A key the hash does not place (``None``; for ``crc32`` also ``b""``) gets :data:`NO_PARTITION`
(-1) and the caller places it with a :class:`StickyPartitioner`, as both clients do (KIP-480).

Each partitioner has a scalar form and a batch form; the batch form hashes a whole Arrow column
(or list) of keys with numpy word operations and gives the same numbers as the scalar form.
"""

from __future__ import annotations

import random
import struct
import threading
import zlib
from collections.abc import Sequence
from typing import Final, Protocol, TypeAlias, runtime_checkable

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from kstore.errors import InvalidConfigurationError, InvalidPartitionsError, InvalidRecordError

__all__ = [
    "DEFAULT_PARTITIONER",
    "MAX_PARTITIONS",
    "NO_PARTITION",
    "PARTITIONER_NAMES",
    "Crc32Partitioner",
    "KeyBytes",
    "Keys",
    "Murmur2Partitioner",
    "Partitioner",
    "StickyPartitioner",
    "crc32",
    "crc32_hashes",
    "crc32_partition",
    "get_partitioner",
    "murmur2",
    "murmur2_hashes",
    "murmur2_partition",
    "partition_keys_crc32",
    "partition_keys_murmur2",
    "to_positive",
]

NO_PARTITION: Final = -1
"""Partition number given to a key the hash does not place; use a sticky partitioner for it."""

DEFAULT_PARTITIONER: Final = "murmur2"

MAX_PARTITIONS: Final = 2**31 - 1  # Kafka partition numbers are Java ints

KeyBytes: TypeAlias = bytes | bytearray | memoryview
Keys: TypeAlias = pa.Array | pa.ChunkedArray | Sequence[KeyBytes | None]
"""A batch of keys: an Arrow binary/string column (nulls allowed) or a sequence of bytes/None."""

_U32 = npt.NDArray[np.uint32]
_I64 = npt.NDArray[np.int64]
_Bool = npt.NDArray[np.bool_]

# Constants of Kafka's Utils.murmur2 (MurmurHash2 with a fixed seed).
_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_MASK32: Final = 0xFFFFFFFF
_M32: Final = np.uint32(_M)
_SH24: Final = np.uint32(24)
_SH13: Final = np.uint32(13)
_SH15: Final = np.uint32(15)
_SH16: Final = np.uint32(16)
_SH8: Final = np.uint32(8)
_LOW16: Final = np.uint32(0xFFFF)
_LOW8: Final = np.uint32(0xFF)
_ONES32: Final = np.uint32(_MASK32)

# Below this many keys still being hashed, numpy's per-call overhead costs more than hashing
# the remaining (long) keys one by one, so the batch functions finish those with the scalar
# code. This also sends small batches entirely down the scalar path.
_SCALAR_CUTOFF: Final = 16

# Keys per block when lengths are mixed: 64K keys of typical sizes keep their bytes in cache.
_BLOCK_KEYS = 1 << 16


# --- scalar ------------------------------------------------------------------------------------


def to_positive(number: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``, so MIN_VALUE maps to 0)."""
    return number & 0x7FFFFFFF


def murmur2(data: KeyBytes) -> int:
    """Kafka's ``Utils.murmur2``: 32-bit MurmurHash2, seed 0x9747b28c, as a signed Java int."""
    view = _key_view(data)
    h = _murmur2_u32(view)
    return h - (1 << 32) if h & 0x80000000 else h


def murmur2_partition(key: KeyBytes, num_partitions: int) -> int:
    """The Java client's partition for a non-null key: ``toPositive(murmur2(key)) % n``."""
    _check_num_partitions(num_partitions)
    return (_murmur2_u32(_key_view(key)) & 0x7FFFFFFF) % num_partitions


def crc32(data: KeyBytes) -> int:
    """librdkafka's ``rd_crc32``: the zlib/IEEE CRC-32 (reflected 0x04c11db7), unsigned."""
    return zlib.crc32(_key_view(data))


def crc32_partition(key: KeyBytes, num_partitions: int) -> int:
    """librdkafka's ``consistent`` partitioner: ``rd_crc32(key) % partition_cnt``.

    ``consistent_random`` (the ``crc32`` partitioner here) sends empty keys to a random
    partition instead; this function hashes them (CRC of ``b""`` is 0, so partition 0).
    """
    _check_num_partitions(num_partitions)
    return zlib.crc32(_key_view(key)) % num_partitions


def _murmur2_u32(data: memoryview) -> int:
    length = len(data)
    h = _murmur2_mix_words((_SEED ^ length) & _MASK32, data[: length & ~3])
    return _murmur2_finish(h, data[length & ~3 :])


def _murmur2_mix_words(h: int, words: memoryview) -> int:
    # The body loop: little-endian 4-byte words, each mixed with wraparound 32-bit multiplies.
    for (k,) in struct.iter_unpack("<I", words):
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    return h


def _murmur2_finish(h: int, tail: memoryview) -> int:
    # Java's fall-through switch on length % 4, then the final avalanche.
    if tail:
        t = 0
        for i, b in enumerate(tail):
            t |= b << (8 * i)
        h = ((h ^ t) * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    return h ^ (h >> 15)


def _key_view(key: object) -> memoryview:
    # Keys are raw bytes in Kafka; a str would need an encoding choice, so it is refused.
    if isinstance(key, bytes | bytearray):
        return memoryview(key)
    if isinstance(key, memoryview):
        return key.cast("B") if key.format != "B" or key.ndim != 1 else key
    raise InvalidRecordError(
        f"a record key must be bytes, bytearray or memoryview, not {type(key).__name__}"
        + (" (encode the str first, e.g. key.encode())" if isinstance(key, str) else "")
    )


def _check_num_partitions(num_partitions: object) -> int:
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int | np.integer):
        raise InvalidPartitionsError(
            f"num_partitions must be an int, not {type(num_partitions).__name__}"
        )
    n = int(num_partitions)
    if not 1 <= n <= MAX_PARTITIONS:
        raise InvalidPartitionsError(f"num_partitions must be in 1..{MAX_PARTITIONS}, got {n}")
    return n


# --- batch: key layout ---------------------------------------------------------------------------


class _KeyColumn:
    """The bytes of a batch of keys as numpy arrays: one buffer plus start offsets and lengths.

    Null keys have length 0 here; ``valid`` says which keys were null (None: no null key).
    ``contiguous``: each key starts where the previous one ends (no gaps: no null key with
    bytes behind it), so equal-length keys form a 2D matrix.
    """

    __slots__ = ("contiguous", "data", "lengths", "starts", "valid")

    def __init__(
        self,
        data: npt.NDArray[np.uint8],
        starts: _I64,
        lengths: _I64,
        valid: _Bool | None,
        contiguous: bool,
    ):
        self.data = data
        self.starts = starts
        self.lengths = lengths
        self.valid = valid
        self.contiguous = contiguous

    def __len__(self) -> int:
        return len(self.starts)

    def key(self, i: int) -> memoryview:
        start = int(self.starts[i])
        return self.data.data[start : start + int(self.lengths[i])]


class _ColumnHash(Protocol):
    def __call__(self, col: _KeyColumn, /) -> _U32: ...


def _key_columns(keys: object) -> list[_KeyColumn]:
    """One :class:`_KeyColumn` per Arrow chunk (a sequence makes one), without copying Arrow data."""
    if isinstance(keys, pa.ChunkedArray):
        return [_arrow_column(chunk) for chunk in keys.chunks]
    if isinstance(keys, pa.Array):
        return [_arrow_column(keys)]
    if isinstance(keys, Sequence) and not isinstance(keys, str | bytes | bytearray):
        return [_sequence_column(keys)]
    raise InvalidRecordError(
        "keys must be a pyarrow binary/string array or a sequence of bytes/None, "
        f"not {type(keys).__name__}"
    )


def _arrow_column(array: pa.Array) -> _KeyColumn:
    t = array.type
    n = len(array)
    if pa.types.is_null(t):
        empty = np.zeros(n, np.int64)
        return _KeyColumn(np.zeros(0, np.uint8), empty, empty, np.zeros(n, bool), False)
    if pa.types.is_binary_view(t) or pa.types.is_string_view(t):
        array = array.cast(pa.large_binary())
        t = array.type
    if pa.types.is_fixed_size_binary(t):
        width = t.byte_width
        buffers = array.buffers()
        data = _buffer_u8(buffers[1])
        starts = (np.arange(n, dtype=np.int64) + array.offset) * width
        lengths = np.full(n, width, np.int64)
    elif pa.types.is_binary(t) or pa.types.is_string(t):
        data, starts, lengths = _offsets_layout(array, np.int32)
    elif pa.types.is_large_binary(t) or pa.types.is_large_string(t):
        data, starts, lengths = _offsets_layout(array, np.int64)
    else:
        raise InvalidRecordError(f"keys must be an Arrow binary or string array, not {t}")
    if array.null_count == 0:
        return _KeyColumn(data, starts, lengths, None, True)
    # Arrow lets a null slot have bytes behind it: they must not be hashed. The validity
    # bitmap is read directly: Array.to_numpy imports pandas on first use (0.3 s).
    bits = np.frombuffer(array.buffers()[0], np.uint8)
    valid = np.unpackbits(bits, bitorder="little")[array.offset : array.offset + n].astype(bool)
    return _KeyColumn(data, starts, np.where(valid, lengths, 0), valid, False)


def _offsets_layout(
    array: pa.Array, offset_type: type[np.int32] | type[np.int64]
) -> tuple[npt.NDArray[np.uint8], _I64, _I64]:
    buffers = array.buffers()
    n = len(array)
    raw = np.frombuffer(buffers[1], dtype=offset_type)[array.offset : array.offset + n + 1]
    offsets: _I64 = raw.astype(np.int64)
    return _buffer_u8(buffers[2]), offsets[:-1], np.diff(offsets)


def _buffer_u8(buffer: pa.Buffer | None) -> npt.NDArray[np.uint8]:
    # An array of only empty values may have no data buffer at all.
    if buffer is None or buffer.size == 0:
        return np.zeros(0, np.uint8)
    return np.frombuffer(buffer, dtype=np.uint8)


_SEQUENCE_TYPES: Final = frozenset({bytes, bytearray, memoryview, type(None)})


def _sequence_column(keys: Sequence[object]) -> _KeyColumn:
    # b"".join and map(len) run in C: several times faster than pa.array(keys) for this.
    n = len(keys)
    types = set(map(type, keys))
    if not types <= _SEQUENCE_TYPES:
        for k in keys:
            if k is not None:
                _key_view(k)  # raises the scalar functions' error for the first bad key
    has_null = type(None) in types
    items: Sequence[object] = keys
    if has_null or memoryview in types:
        items = [b"" if k is None else bytes(k) if isinstance(k, memoryview) else k for k in keys]
    valid = np.fromiter((k is not None for k in keys), bool, count=n) if has_null else None
    lengths = np.fromiter(map(len, items), dtype=np.int64, count=n)  # type: ignore[arg-type]
    data = np.frombuffer(b"".join(items), dtype=np.uint8)  # type: ignore[arg-type]
    starts = np.zeros(n, np.int64)
    if n > 1:
        np.cumsum(lengths[:-1], out=starts[1:])
    return _KeyColumn(data, starts, lengths, valid, True)


class _WordStep(Protocol):
    def __call__(self, state: _U32, words: _U32, /) -> None: ...


def _mix_words(col: _KeyColumn, state: _U32, step: _WordStep) -> _I64 | None:
    """Feed every key's 4-byte little-endian words, in order, into its hash state.

    ``step(states, words)`` updates, in place, the states of keys that have a word at the
    current position; ``state`` (in key order) is updated in place. Returns the indexes of
    keys left for the scalar code to hash (when too few long keys remain for numpy's per-call
    overhead to pay), or None.
    """
    n = len(col)
    if n == 0:
        return None
    min_length, max_length = int(col.lengths.min()), int(col.lengths.max())
    max_words = max_length >> 2
    if max_words == 0:
        return None
    if min_length == max_length and col.contiguous:
        # Equal-length keys back to back (the common case) are the rows of a strided 2D view
        # of the buffer: each word position is a column, read without a gather.
        matrix: _U32 = np.ndarray(
            (n, max_words),
            dtype="<u4",
            buffer=col.data,
            offset=int(col.starts[0]),
            strides=(max_length, 4),
        )
        for j in range(max_words):
            step(state, matrix[:, j])
        return None
    if min_length >> 2 == max_words:
        # Same word count, different tails: one gather per word position, no bookkeeping.
        view = _u32_view(col.data)
        for j in range(max_words):
            step(state, view[col.starts + 4 * j])
        return None
    # Mixed lengths: blocks small enough for their key bytes to stay in cache while each is
    # read once per word position.
    left_over = [
        rest + start
        for start in range(0, n, _BLOCK_KEYS)
        if (rest := _mix_sorted_block(col, start, state, step)) is not None
    ]
    return np.concatenate(left_over) if left_over else None


def _mix_sorted_block(col: _KeyColumn, start: int, state: _U32, step: _WordStep) -> _I64 | None:
    # Keys sorted by word count, longest first: those with a word at position j are a prefix,
    # so every step works on a slice and the total work is proportional to the total bytes.
    stop = min(start + _BLOCK_KEYS, len(col))
    nwords = col.lengths[start:stop] >> 2
    max_words = int(nwords.max())
    if max_words == 0:
        return None
    if max_words < 1 << 16:
        # A stable sort of 16-bit keys is a radix sort in numpy: O(n).
        order = np.argsort((max_words - nwords).astype(np.uint16), kind="stable")
    else:
        order = np.argsort(-nwords, kind="stable")
    counts = np.bincount(nwords, minlength=max_words + 1)
    active = (len(nwords) - np.cumsum(counts)[:-1]).tolist()
    pos = col.starts[start:stop][order]
    block_state = state[start:stop]
    sub = block_state[order]
    view = _u32_view(col.data)
    left_over: _I64 | None = None
    for j in range(max_words):
        a = active[j]
        if a <= _SCALAR_CUTOFF:
            left_over = order[:a].astype(np.int64)
            break
        step(sub[:a], view[pos[:a]])
        pos[:a] += 4
    block_state[order] = sub
    return left_over


def _u32_view(data: npt.NDArray[np.uint8]) -> _U32:
    # Every byte offset as the start of a little-endian uint32 (overlapping, unaligned view),
    # so a key's word at any byte offset is one gather.
    if len(data) < 4:
        return np.zeros(0, np.uint32)
    return np.ndarray((len(data) - 3,), dtype="<u4", buffer=data, offset=0, strides=(1,))


_TAIL_MASKS: Final = np.array([0, 0xFF, 0xFFFF, 0xFFFFFF], dtype=np.uint32)
_TAIL_FACTORS: Final = np.array([1, _M, _M, _M], dtype=np.uint32)


def _tail_bytes(col: _KeyColumn) -> tuple[_U32, npt.NDArray[np.int64]] | None:
    """The 1-3 bytes after each key's last whole word, little-endian, with how many there are
    (0 for keys without a tail); None when no key has a tail."""
    rem = col.lengths & 3
    if not rem.any():
        return None
    pos = col.starts + (col.lengths & ~3)
    data = col.data
    if len(data) < 4:
        data = np.zeros(len(data) + 4, np.uint8)
        data[: len(col.data)] = col.data
    # One word gather per key. A word that would run past the end of the buffer is read 1-3
    # bytes earlier and shifted back (only its first ``rem`` bytes are kept).
    clipped = np.minimum(pos, len(data) - 4)
    shift = (np.minimum(pos - clipped, 3) * 8).astype(np.uint32)
    return (_u32_view(data)[clipped] >> shift) & _TAIL_MASKS[rem], rem


# --- batch: murmur2 -------------------------------------------------------------------------------


def _murmur2_step(h: _U32, words: _U32) -> None:
    k = words * _M32  # a new array: ``words`` may be a view of the read-only key buffer
    k ^= k >> _SH24
    k *= _M32
    h *= _M32
    h ^= k


def _murmur2_column(col: _KeyColumn) -> _U32:
    n = len(col)
    if n <= _SCALAR_CUTOFF:
        return np.fromiter((_murmur2_u32(col.key(i)) for i in range(n)), np.uint32, count=n)
    h = col.lengths.astype(np.uint32) ^ np.uint32(_SEED)
    scalar_keys = _mix_words(col, h, _murmur2_step)
    tail = _tail_bytes(col)
    if tail is not None:
        # Java's switch: keys with a tail xor it in and multiply once more; others do neither.
        h ^= tail[0]
        h *= _TAIL_FACTORS[tail[1]]
    h ^= h >> _SH13
    h *= _M32
    h ^= h >> _SH15
    if scalar_keys is not None:
        h[scalar_keys] = [_murmur2_u32(col.key(int(i))) for i in scalar_keys]
    return h


def murmur2_hashes(keys: Keys) -> pa.Int32Array:
    """``murmur2`` of every key as a signed int32 (Java's value); null where the key is null."""
    hashes, valid, _ = _hash_all(keys, _murmur2_column)
    return pa.array(hashes.view(np.int32), type=pa.int32(), mask=None if valid is None else ~valid)


def partition_keys_murmur2(keys: Keys, num_partitions: int) -> pa.Int32Array:
    """The Java client's partition of every key; :data:`NO_PARTITION` (-1) for null keys.

    Empty keys are hashed, as in Java (only a null key is unkeyed there).
    """
    n = _check_num_partitions(num_partitions)
    hashes, valid, _ = _hash_all(keys, _murmur2_column)
    hashes &= np.uint32(0x7FFFFFFF)  # to_positive
    hashes %= np.uint32(n)
    parts = hashes.view(np.int32)  # all below 2**31: the same numbers as int32
    if valid is not None:
        parts[~valid] = NO_PARTITION
    return _int32_array(parts)


# --- batch: crc32 ----------------------------------------------------------------------------------


def _crc32_tables() -> tuple[_U32, _U32, _U32]:
    """The byte table, and two 16-bit tables that advance the CRC by a whole 4-byte word."""
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & np.uint32(1), (t >> np.uint32(1)) ^ np.uint32(0xEDB88320), t >> 1)
    t = t.astype(np.uint32)
    # slicing-by-4: tables[k][b] is the CRC contribution of byte b followed by k zero bytes.
    tables = [t]
    for _ in range(3):
        prev = tables[-1]
        tables.append((prev >> _SH8) ^ t[prev & _LOW8])
    t0, t1, t2, t3 = tables
    lo = np.arange(1 << 16, dtype=np.uint32)
    # Word state c (after c ^= word) maps to t3[c0] ^ t2[c1] ^ t1[c2] ^ t0[c3]; pair the bytes.
    low_half = t3[lo & _LOW8] ^ t2[lo >> _SH8]
    high_half = t1[lo & _LOW8] ^ t0[lo >> _SH8]
    return t, low_half, high_half


_CRC_TABLE, _CRC_LOW, _CRC_HIGH = _crc32_tables()


def _crc32_step(c: _U32, words: _U32) -> None:
    c ^= words
    c[:] = _CRC_LOW[c & _LOW16] ^ _CRC_HIGH[c >> _SH16]


def _crc32_column(col: _KeyColumn) -> _U32:
    n = len(col)
    if n <= _SCALAR_CUTOFF:
        return np.fromiter((zlib.crc32(col.key(i)) for i in range(n)), np.uint32, count=n)
    c = np.full(n, _ONES32, np.uint32)  # the CRC-32 register starts at all ones
    scalar_keys = _mix_words(col, c, _crc32_step)
    tail = _tail_bytes(col)
    if tail is not None:
        # The 1-3 bytes after the last word, one table step each, for the keys that have them.
        tail_bytes, rem = tail
        for i in range(3):
            has_byte = rem > i
            if not has_byte.any():
                break
            byte = (tail_bytes >> np.uint32(8 * i)) & _LOW8
            np.copyto(c, _CRC_TABLE[(c ^ byte) & _LOW8] ^ (c >> _SH8), where=has_byte)
    c ^= _ONES32
    if scalar_keys is not None:
        c[scalar_keys] = [zlib.crc32(col.key(int(i))) for i in scalar_keys]
    return c


def crc32_hashes(keys: Keys) -> pa.UInt32Array:
    """``crc32`` of every key (unsigned, as librdkafka's ``rd_crc32``); null for null keys."""
    hashes, valid, _ = _hash_all(keys, _crc32_column)
    return pa.array(hashes, type=pa.uint32(), mask=None if valid is None else ~valid)


def partition_keys_crc32(keys: Keys, num_partitions: int) -> pa.Int32Array:
    """librdkafka ``consistent_random`` partition of every key.

    :data:`NO_PARTITION` (-1) for null *and empty* keys, which librdkafka sends to its
    random/sticky partitioner (``keylen == 0``).
    """
    n = _check_num_partitions(num_partitions)
    hashes, _, lengths = _hash_all(keys, _crc32_column)
    hashes %= np.uint32(n)
    parts = hashes.view(np.int32)  # all below 2**31: the same numbers as int32
    parts[lengths == 0] = NO_PARTITION  # null keys have length 0 too
    return _int32_array(parts)


def _int32_array(values: npt.NDArray[np.int32]) -> pa.Int32Array:
    # Over the numpy buffer: pa.array imports pandas on first use (0.3 s on a first send).
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.int32(), len(values), [None, pa.py_buffer(values)])


def _hash_all(keys: object, column_hash: _ColumnHash) -> tuple[_U32, _Bool | None, _I64]:
    """Hashes, validity (None: no null key) and lengths (0 for null keys) of all keys; the
    chunks of a ChunkedArray are concatenated."""
    cols = _key_columns(keys)
    if len(cols) == 1:
        col = cols[0]
        return column_hash(col), col.valid, col.lengths
    if not cols:
        return np.zeros(0, np.uint32), None, np.zeros(0, np.int64)
    valid = None
    if any(col.valid is not None for col in cols):
        valid = np.concatenate(
            [np.ones(len(col), bool) if col.valid is None else col.valid for col in cols]
        )
    return (
        np.concatenate([column_hash(col) for col in cols]),
        valid,
        np.concatenate([col.lengths for col in cols]),
    )


# --- partitioner objects ---------------------------------------------------------------------------


@runtime_checkable
class Partitioner(Protocol):
    """Places keyed records; :data:`NO_PARTITION` means "unkeyed: use the sticky partitioner"."""

    @property
    def name(self) -> str: ...

    def partition(self, key: KeyBytes | None, num_partitions: int) -> int: ...

    def partition_batch(self, keys: Keys, num_partitions: int) -> pa.Int32Array: ...


class Murmur2Partitioner:
    """Java client (``BuiltInPartitioner``) and librdkafka ``murmur2_random`` placement."""

    name = "murmur2"

    def partition(self, key: KeyBytes | None, num_partitions: int) -> int:
        if key is None:
            _check_num_partitions(num_partitions)
            return NO_PARTITION
        return murmur2_partition(key, num_partitions)

    def partition_batch(self, keys: Keys, num_partitions: int) -> pa.Int32Array:
        return partition_keys_murmur2(keys, num_partitions)

    def __repr__(self) -> str:
        return "Murmur2Partitioner()"


class Crc32Partitioner:
    """librdkafka ``consistent_random`` placement (CRC-32; null and empty keys unkeyed)."""

    name = "crc32"

    def partition(self, key: KeyBytes | None, num_partitions: int) -> int:
        if key is None or len(_key_view(key)) == 0:
            _check_num_partitions(num_partitions)
            return NO_PARTITION
        return crc32_partition(key, num_partitions)

    def partition_batch(self, keys: Keys, num_partitions: int) -> pa.Int32Array:
        return partition_keys_crc32(keys, num_partitions)

    def __repr__(self) -> str:
        return "Crc32Partitioner()"


_PARTITIONERS: Final[dict[str, type[Murmur2Partitioner] | type[Crc32Partitioner]]] = {
    "murmur2": Murmur2Partitioner,
    "crc32": Crc32Partitioner,
    # librdkafka's names for the same placements, so its configs carry over unchanged.
    "murmur2_random": Murmur2Partitioner,
    "consistent_random": Crc32Partitioner,
}
PARTITIONER_NAMES: Final = tuple(_PARTITIONERS)


def get_partitioner(name: str = DEFAULT_PARTITIONER) -> Partitioner:
    """The partitioner called ``name`` (see :data:`PARTITIONER_NAMES`)."""
    cls = _PARTITIONERS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise InvalidConfigurationError(
            f"unknown partitioner {name!r}; valid names: {', '.join(PARTITIONER_NAMES)}"
        )
    return cls()


class StickyPartitioner:
    """Places unkeyed records (KIP-480): one partition until the batch is done, then another.

    The producer calls :meth:`partition` for each unkeyed record (or :meth:`fill` for a batch)
    and :meth:`on_new_batch` when it completes the batch for the current partition; the next
    partition is chosen at random among the others, so consecutive batches spread the load.
    Thread-safe.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random()
        self._current: int | None = None
        self._lock = threading.Lock()

    def partition(self, num_partitions: int) -> int:
        """The current sticky partition (chosen now if there is none or it no longer exists)."""
        n = _check_num_partitions(num_partitions)
        with self._lock:
            if self._current is None or self._current >= n:
                self._current = self._rng.randrange(n)
            return self._current

    def on_new_batch(self, num_partitions: int, prev_partition: int | None = None) -> int:
        """Switch to another partition because the batch for the current one is complete.

        As Kafka's ``StickyPartitionCache.nextPartition``: when ``prev_partition`` is given
        and is no longer the current one, another thread already switched, so nothing changes.
        Returns the (new) current partition.
        """
        n = _check_num_partitions(num_partitions)
        with self._lock:
            current = self._current
            if current is not None and prev_partition not in (None, current) and current < n:
                return current
            if n == 1:
                self._current = 0
            elif current is None or current >= n:
                self._current = self._rng.randrange(n)
            else:
                # Uniform over the other n - 1 partitions: never the same one twice in a row.
                pick = self._rng.randrange(n - 1)
                self._current = pick + 1 if pick >= current else pick
            return self._current

    def fill(self, partitions: pa.Int32Array, num_partitions: int) -> pa.Int32Array:
        """Replace every :data:`NO_PARTITION` in a batch result with the sticky partition."""
        values = np.asarray(partitions.to_numpy(zero_copy_only=False), dtype=np.int32)
        unkeyed = values == NO_PARTITION
        if not unkeyed.any():
            return partitions
        values = values.copy()
        values[unkeyed] = self.partition(num_partitions)
        return pa.array(values, type=pa.int32())

    def __repr__(self) -> str:
        return f"StickyPartitioner(current={self._current})"
