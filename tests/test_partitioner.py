"""Key partitioners: Kafka (Java client) and librdkafka placement, scalar and batch forms.

Test vectors come from the clients' own tests:

* apache/kafka ``clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java``
  (``testMurmur2``). Kafka's ``DefaultPartitionerTest``, ``BuiltInPartitionerTest`` and
  ``StickyPartitionCacheTest`` assert only stability and stickiness, no partition numbers.
* confluentinc/librdkafka ``src/rdmurmur2.c`` (``unittest_murmur2``: hashes its comments say
  are the Java client's, including unaligned substrings and the empty key).
* confluentinc/librdkafka ``tests/0048-partitioner.c`` (``do_test_partitioners``: expected
  partitions of five keys for the ``consistent``, ``consistent_random``, ``murmur2`` and
  ``murmur2_random`` partitioners, with 7 and 17 partitions; its CRC values came from the
  ``crc32`` command).
* librdkafka's ``rd_crc32`` is the CRC-32 of ``src/rdcrc32.h`` (poly 0x04c11db7 reflected, init
  and xorout 0xffffffff; zlib's ``crc32`` when built with zlib), whose standard check value
  for ``b"123456789"`` is 0xCBF43926.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kstore import partitioner as kp
from kstore.errors import InvalidConfigurationError, InvalidPartitionsError, InvalidRecordError

# Kafka UtilsTest.testMurmur2.
KAFKA_MURMUR2 = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (bytes([ord("a"), ord("b"), ord("c")]), 479470107),
]


def _java_int(u32: int) -> int:
    return u32 - (1 << 32) if u32 & 0x80000000 else u32


# librdkafka src/rdmurmur2.c unittest_murmur2 (as the int32_t it compares against).
_UNALIGNED = b"PreAmbleWillBeRemoved,ThePrePartThatIs"
LIBRDKAFKA_MURMUR2 = [
    (b"kafka", 0xD067CF64),
    (b"giberish123456789", 0x8F552B0C),
    (b"1234", 0x9FC97B14),
    (b"234", 0xE7C009CA),
    (b"34", 0x873930DA),
    (b"4", 0x5A4B5CA1),
    (_UNALIGNED, 0x78424F1C),
    (_UNALIGNED[1:], 0x4A62B377),
    (_UNALIGNED[2:], 0xE0E4E09E),
    (_UNALIGNED[3:], 0x62B8B43F),
    (b"", 0x106E08D9),
]

# librdkafka tests/0048-partitioner.c: keys NULL, "", "23456" ("123456" + 1), a long string,
# "hejsan"; expected partition = constant % part_cnt, or -1 for "random" (unkeyed here).
LIBRDKAFKA_0048_KEYS: list[bytes | None] = [
    None,
    b"",
    b"23456",
    b"this is another string with more length to it perhaps",
    b"hejsan",
]
_CRC = [0x0, 0x0, 0xB1B451D7, 0xB0150DF7, 0xD077037E]
_MURMUR = [0x106E08D9, 0x106E08D9, 0x058D780F, 0x4F7703DA, 0x5EC19395]


def _expect(constants: list[int], unkeyed: set[int], n: int) -> list[int]:
    return [-1 if i in unkeyed else c % n for i, c in enumerate(constants)]


# --- scalar vectors ------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "expected"), KAFKA_MURMUR2)
def test_murmur2_matches_kafka_utils_test(key: bytes, expected: int) -> None:
    assert kp.murmur2(key) == expected


@pytest.mark.parametrize(("key", "expected"), LIBRDKAFKA_MURMUR2)
def test_murmur2_matches_librdkafka_unittest(key: bytes, expected: int) -> None:
    assert kp.murmur2(key) == _java_int(expected)
    assert kp.murmur2(bytearray(key)) == _java_int(expected)
    assert kp.murmur2(memoryview(b"x" + key)[1:]) == _java_int(expected)


def test_to_positive_is_javas_sign_bit_mask() -> None:
    assert kp.to_positive(-(2**31)) == 0  # Integer.MIN_VALUE: not abs()
    assert kp.to_positive(-1) == 0x7FFFFFFF
    assert kp.to_positive(0) == 0
    assert kp.to_positive(2**31 - 1) == 2**31 - 1
    assert kp.to_positive(-973932308) == -973932308 & 0x7FFFFFFF


def test_crc32_is_the_standard_crc32() -> None:
    assert kp.crc32(b"123456789") == 0xCBF43926  # CRC-32 check value
    assert kp.crc32(b"") == 0
    for key, crc in zip(LIBRDKAFKA_0048_KEYS[1:], _CRC[1:], strict=True):
        assert key is not None
        assert kp.crc32(key) == crc
        assert kp.crc32(key) == zlib.crc32(key)


@pytest.mark.parametrize("n", [7, 17])
def test_librdkafka_0048_expected_partitions(n: int) -> None:
    keys = LIBRDKAFKA_0048_KEYS
    murmur2 = kp.Murmur2Partitioner()
    crc32 = kp.Crc32Partitioner()
    # murmur2_random: only NULL is random; "" hashes like Java.
    assert [murmur2.partition(k, n) for k in keys] == _expect(_MURMUR, {0}, n)
    # consistent_random: NULL and "" (keylen == 0) are random.
    assert [crc32.partition(k, n) for k in keys] == _expect(_CRC, {0, 1}, n)
    # consistent and murmur2 (non-random variants) hash "" too.
    assert kp.crc32_partition(b"", n) == 0
    assert [kp.murmur2_partition(k, n) for k in keys[1:] if k is not None] == [
        c % n for c in _MURMUR[1:]
    ]
    # The batch forms agree, from a list and from Arrow.
    for batch in (keys, pa.array(keys, pa.binary())):
        assert kp.partition_keys_murmur2(batch, n).to_pylist() == _expect(_MURMUR, {0}, n)
        assert kp.partition_keys_crc32(batch, n).to_pylist() == _expect(_CRC, {0, 1}, n)


def test_kafka_partition_formula() -> None:
    for key, h in KAFKA_MURMUR2:
        for n in (1, 2, 3, 8, 12, 100, 2**31 - 1):
            assert kp.murmur2_partition(key, n) == (h & 0x7FFFFFFF) % n


# --- batch equals scalar -----------------------------------------------------------------------


def _random_keys(rng: random.Random) -> list[bytes]:
    keys = [rng.randbytes(length) for length in range(65) for _ in range(5)]
    keys += [rng.randbytes(length) for length in (127, 128, 129, 1000, 4097, 70001)]
    rng.shuffle(keys)
    return keys


def _scalar(keys: list[bytes | None]) -> tuple[list[int | None], list[int | None]]:
    return (
        [None if k is None else kp.murmur2(k) for k in keys],
        [None if k is None else kp.crc32(k) for k in keys],
    )


def _check_batch(keys: list[bytes | None], batch: object) -> None:
    murmur, crc = _scalar(keys)
    assert kp.murmur2_hashes(batch).to_pylist() == murmur
    assert kp.crc32_hashes(batch).to_pylist() == crc
    for n in (1, 7, 8, 1000):
        m2 = kp.partition_keys_murmur2(batch, n)
        c32 = kp.partition_keys_crc32(batch, n)
        assert m2.type == pa.int32()
        assert m2.null_count == 0
        assert m2.to_pylist() == [kp.Murmur2Partitioner().partition(k, n) for k in keys]
        assert c32.to_pylist() == [kp.Crc32Partitioner().partition(k, n) for k in keys]


def _inputs(keys: list[bytes | None]) -> list[object]:
    half = len(keys) // 2
    return [
        keys,
        tuple(keys),
        pa.array(keys, pa.binary()),
        pa.array(keys, pa.large_binary()),
        pa.array(keys, pa.binary_view()),
        pa.chunked_array([pa.array(keys[:half], pa.binary()), pa.array(keys[half:], pa.binary())]),
    ]


@pytest.fixture(params=["default", "tiny"])
def block_keys(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs a test with the default block size, and with tiny blocks (many blocks per batch)."""
    if request.param == "tiny":
        monkeypatch.setattr(kp, "_BLOCK_KEYS", 40)


@pytest.mark.usefixtures("block_keys")
@pytest.mark.parametrize("null_fraction", [0.0, 0.1])
def test_batch_equals_scalar_for_every_length_mixed(null_fraction: float) -> None:
    rng = random.Random(480)
    keys: list[bytes | None] = [
        None if rng.random() < null_fraction else k for k in _random_keys(rng)
    ]
    for batch in _inputs(keys):
        _check_batch(keys, batch)


@pytest.mark.parametrize("length", [*range(13), 31, 32, 33, 64, 65, 300])
def test_batch_equals_scalar_equal_lengths(length: int) -> None:
    # Equal-length batches take the strided 2D view path.
    rng = random.Random(length)
    keys: list[bytes | None] = [rng.randbytes(length) for _ in range(100)]
    for batch in _inputs(keys):
        _check_batch(keys, batch)
    fixed = pa.array(keys, pa.binary(length)) if length else None
    if fixed is not None:
        _check_batch(keys, fixed)
        _check_batch(keys[10:60], fixed.slice(10, 50))


def test_batch_same_word_count_different_tails() -> None:
    # Lengths 8..11 share the word count but not the tail: the gather path without a sort.
    rng = random.Random(7)
    keys: list[bytes | None] = [rng.randbytes(rng.randrange(8, 12)) for _ in range(200)]
    for batch in _inputs(keys):
        _check_batch(keys, batch)


@pytest.mark.usefixtures("block_keys")
def test_batch_many_long_keys_and_few_very_long() -> None:
    # More long keys than the scalar cut-off (vector loop over a shrinking prefix), plus a
    # handful of very long ones (finished one by one).
    rng = random.Random(11)
    keys: list[bytes | None] = [rng.randbytes(rng.randrange(0, 6)) for _ in range(500)]
    keys += [rng.randbytes(rng.randrange(200, 400)) for _ in range(60)]
    keys += [rng.randbytes(20000 + i) for i in range(3)]
    keys += [None] * 5
    rng.shuffle(keys)
    for batch in _inputs(keys):
        _check_batch(keys, batch)


def test_batch_tails_at_the_ends_of_tiny_and_small_buffers() -> None:
    # Under 4 bytes of key data in all, and tails that end exactly at the buffer's end.
    tiny: list[bytes | None] = [*[b""] * 18, b"a", None, b"bc"]
    small: list[bytes | None] = [*[b"abcd"] * 17, b"abcdefg", b"xyz"]
    for keys in (tiny, small, tiny[::-1], small[::-1]):
        for batch in _inputs(keys):
            _check_batch(keys, batch)


def test_batch_larger_than_one_block() -> None:
    rng = random.Random(12)
    keys: list[bytes | None] = [
        None if i % 101 == 0 else rng.randbytes(rng.randrange(0, 24)) for i in range(70_000)
    ]
    keys[69_990] = rng.randbytes(5000)  # a long key in the last block
    _check_batch(keys, pa.array(keys, pa.binary()))


def test_batch_of_sliced_arrow_array() -> None:
    rng = random.Random(3)
    keys: list[bytes | None] = [None if i % 9 == 0 else k for i, k in enumerate(_random_keys(rng))]
    array = pa.array(keys, pa.binary())
    _check_batch(keys[37:300], array.slice(37, 263))
    _check_batch(keys[5:6], array.slice(5, 1))
    _check_batch([], array.slice(5, 0))


def test_batch_of_strings_hashes_their_utf8_bytes() -> None:
    texts = ["", "a", "héllo wörld", "日本語のキー", "x" * 50, None]
    keys = [None if t is None else t.encode() for t in texts]
    for typ in (pa.string(), pa.large_string(), pa.string_view()):
        _check_batch(keys, pa.array(texts, typ))


def test_small_batches_and_edge_shapes() -> None:
    for keys in ([], [None], [b""], [b"a"], [None, None], [b"abcd"] * 3, [b"", None] * 20):
        _check_batch(list(keys), list(keys))
        _check_batch(list(keys), pa.array(keys, pa.binary()))
    assert kp.partition_keys_murmur2(pa.nulls(3), 4).to_pylist() == [-1, -1, -1]
    assert kp.partition_keys_crc32(pa.nulls(3), 4).to_pylist() == [-1, -1, -1]
    assert kp.murmur2_hashes(pa.chunked_array([], pa.binary())).to_pylist() == []
    assert kp.partition_keys_crc32(pa.chunked_array([], pa.binary()), 3).to_pylist() == []


def test_batch_from_bytearray_and_memoryview_items() -> None:
    keys: list[bytes | None] = [b"foobar", b"21", None, b"abc", b""] * 5
    mixed: list[object] = []
    for i, k in enumerate(keys):
        if k is None:
            mixed.append(None)
        elif i % 3 == 0:
            mixed.append(bytearray(k))
        elif i % 3 == 1:
            mixed.append(memoryview(b"__" + k)[2:])
        else:
            mixed.append(k)
    _check_batch(keys, mixed)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.binary(max_size=70)), max_size=60))
def test_batch_equals_scalar_property(keys: list[bytes | None]) -> None:
    _check_batch(keys, keys)
    _check_batch(keys, pa.array(keys, pa.binary()))


def test_batch_does_not_modify_its_input() -> None:
    keys = [bytes([i % 256]) * 8 for i in range(1000)]
    array = pa.array(keys, pa.binary())
    kp.partition_keys_murmur2(array, 8)
    kp.partition_keys_crc32(array, 8)
    assert array.to_pylist() == keys
    assert keys[1] == b"\x01" * 8


def test_batch_result_is_usable_as_numpy() -> None:
    parts = kp.partition_keys_murmur2([b"a", None, b"b"], 3)
    values = parts.to_numpy()
    assert values.dtype == np.int32
    assert values[1] == kp.NO_PARTITION


# --- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, -1, 2**31, True, 1.5, "8", None])
def test_bad_num_partitions(n: object) -> None:
    with pytest.raises(InvalidPartitionsError, match="num_partitions"):
        kp.murmur2_partition(b"k", n)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_partitions"):
        kp.crc32_partition(b"k", n)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_partitions"):
        kp.partition_keys_murmur2([b"k"], n)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_partitions"):
        kp.partition_keys_crc32(pa.array([b"k"]), n)  # type: ignore[arg-type]
    for partitioner in (kp.Murmur2Partitioner(), kp.Crc32Partitioner()):
        with pytest.raises(ValueError, match="num_partitions"):
            partitioner.partition(None, n)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_partitions"):
        kp.StickyPartitioner().partition(n)  # type: ignore[arg-type]


def test_numpy_integer_num_partitions_is_accepted() -> None:
    assert kp.murmur2_partition(b"21", np.int64(7)) == kp.murmur2_partition(b"21", 7)  # type: ignore[arg-type]


@pytest.mark.parametrize("key", ["text", 12, 1.0, [1, 2], object()])
def test_non_bytes_keys_are_refused(key: object) -> None:
    with pytest.raises(InvalidRecordError, match="key must be bytes"):
        kp.murmur2(key)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be bytes"):
        kp.crc32_partition(key, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be bytes"):
        kp.Murmur2Partitioner().partition(key, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key must be bytes"):
        kp.partition_keys_murmur2([b"ok", None, key], 3)
    with pytest.raises(TypeError, match="key must be bytes"):
        kp.partition_keys_crc32([key], 3)


def test_str_key_error_says_how_to_fix() -> None:
    with pytest.raises(TypeError, match=r"encode"):
        kp.murmur2("abc")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "keys", [pa.array([1, 2, 3]), pa.array([[b"a"]]), "abc", b"abc", 12, {b"a": 1}]
)
def test_bad_key_batches_are_refused(keys: object) -> None:
    with pytest.raises(TypeError, match="keys must be"):
        kp.partition_keys_murmur2(keys, 3)
    with pytest.raises(TypeError, match="keys must be"):
        kp.crc32_hashes(keys)


# --- partitioner objects -----------------------------------------------------------------------


def test_get_partitioner_by_name() -> None:
    default = kp.get_partitioner()
    assert isinstance(default, kp.Murmur2Partitioner)
    assert default.name == kp.DEFAULT_PARTITIONER == "murmur2"
    assert isinstance(kp.get_partitioner("crc32"), kp.Crc32Partitioner)
    assert isinstance(kp.get_partitioner("murmur2_random"), kp.Murmur2Partitioner)
    assert isinstance(kp.get_partitioner("consistent_random"), kp.Crc32Partitioner)
    for name in kp.PARTITIONER_NAMES:
        assert isinstance(kp.get_partitioner(name), kp.Partitioner)


@pytest.mark.parametrize("name", ["murmur3", "", "MURMUR2", "consistent", None])
def test_unknown_partitioner_name_lists_valid_names(name: object) -> None:
    with pytest.raises(InvalidConfigurationError) as info:
        kp.get_partitioner(name)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    for valid in ("murmur2", "crc32"):
        assert valid in str(info.value)


def test_partitioner_objects_scalar_and_batch_agree() -> None:
    keys: list[bytes | None] = [b"k1", None, b"", b"a-little-bit-long-string"]
    for name in ("murmur2", "crc32"):
        p = kp.get_partitioner(name)
        assert p.partition_batch(keys, 5).to_pylist() == [p.partition(k, 5) for k in keys]
    assert kp.Murmur2Partitioner().partition(b"", 5) == 0x106E08D9 % 5
    assert kp.Crc32Partitioner().partition(b"", 5) == kp.NO_PARTITION
    assert kp.Murmur2Partitioner().partition(None, 5) == kp.NO_PARTITION


# --- sticky partitioner --------------------------------------------------------------------------


def test_sticky_sticks_until_the_batch_is_complete() -> None:
    sticky = kp.StickyPartitioner(random.Random(1))
    first = sticky.partition(10)
    assert all(sticky.partition(10) == first for _ in range(100))
    second = sticky.on_new_batch(10)
    assert second != first
    assert all(sticky.partition(10) == second for _ in range(100))


def test_sticky_never_repeats_and_visits_every_partition() -> None:
    sticky = kp.StickyPartitioner(random.Random(2))
    previous = sticky.partition(5)
    seen: Counter[int] = Counter()
    for _ in range(5000):
        current = sticky.on_new_batch(5)
        assert current != previous
        assert 0 <= current < 5
        seen[current] += 1
        previous = current
    assert set(seen) == set(range(5))
    assert min(seen.values()) > 800  # uniform over the other partitions


def test_sticky_with_one_partition() -> None:
    sticky = kp.StickyPartitioner()
    assert sticky.partition(1) == 0
    assert all(sticky.on_new_batch(1) == 0 for _ in range(10))


def test_sticky_ignores_a_stale_new_batch_signal() -> None:
    # Kafka StickyPartitionCache: switching only if prev_partition is still the current one.
    sticky = kp.StickyPartitioner(random.Random(3))
    a = sticky.partition(8)
    b = sticky.on_new_batch(8, prev_partition=a)
    assert b != a
    assert sticky.on_new_batch(8, prev_partition=a) == b  # someone already switched
    assert sticky.on_new_batch(8, prev_partition=b) != b


def test_sticky_follows_a_partition_count_change() -> None:
    sticky = kp.StickyPartitioner(random.Random(4))
    for _ in range(50):
        sticky.on_new_batch(100)
        assert sticky.partition(3) < 3  # re-chosen when its partition no longer exists


def test_sticky_is_deterministic_with_a_seeded_rng() -> None:
    def run() -> list[int]:
        s = kp.StickyPartitioner(random.Random(99))
        return [s.partition(6)] + [s.on_new_batch(6) for _ in range(20)]

    assert run() == run()


def test_sticky_fill_places_only_unkeyed_records() -> None:
    sticky = kp.StickyPartitioner(random.Random(5))
    parts = kp.partition_keys_murmur2([b"a", None, b"b", None], 4)
    filled = sticky.fill(parts, 4).to_pylist()
    current = sticky.partition(4)
    assert filled == [parts[0].as_py(), current, parts[2].as_py(), current]
    keyed = kp.partition_keys_murmur2([b"a", b"b"], 4)
    assert sticky.fill(keyed, 4) is keyed


# --- cross-check against librdkafka itself (only where confluent-kafka is installed) ---------------


def test_cross_check_with_librdkafka_mock_cluster() -> None:
    """Partitions librdkafka's own partitioners choose, via its built-in mock cluster.

    confluent-kafka is not a dependency; this runs where a developer installed it. The mock
    cluster listens on 127.0.0.1 only and auto-creates topics with its default partition count.
    """
    ck = pytest.importorskip("confluent_kafka")
    keys = [b"", b"a", b"21", b"foobar", b"x" * 37] + [f"order-{i}".encode() for i in range(300)]
    for name, ours in (
        ("murmur2_random", kp.Murmur2Partitioner()),
        ("consistent_random", kp.Crc32Partitioner()),
    ):
        producer = ck.Producer(
            {"test.mock.num.brokers": 1, "partitioner": name, "linger.ms": 0, "log_level": 3}
        )
        producer.produce("t", key=b"create", value=b"v")
        assert producer.flush(10) == 0
        n = len(producer.list_topics("t", timeout=10).topics["t"].partitions)
        got: dict[bytes, int] = {}

        def on_delivery(err: object, msg: object, got: dict[bytes, int] = got) -> None:
            assert err is None
            got[msg.key()] = msg.partition()  # type: ignore[attr-defined]

        for key in keys:
            producer.produce("t", key=key, value=b"v", on_delivery=on_delivery)
        assert producer.flush(10) == 0
        expected = {k: ours.partition(k, n) for k in keys}
        assert {k: p for k, p in got.items() if expected[k] != kp.NO_PARTITION} == {
            k: p for k, p in expected.items() if p != kp.NO_PARTITION
        }
