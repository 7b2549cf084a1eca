"""How fast are the key partitioners, scalar (one key at a time) against batch (numpy)?

A producer partitions every keyed record, so partitioning must not be the bottleneck of a
batch ``send``. This benchmark places 1,000,000 random 8-byte keys into 8 partitions with:

- ``murmur2`` (Java client placement) and ``crc32`` (librdkafka ``consistent_random``):
  the scalar ``Partitioner.partition`` in a Python loop (the baseline), and the batch
  ``partition_batch`` on a pyarrow ``BinaryArray`` and on a Python ``list[bytes]``;
- two alternative baselines for the batch forms: murmur2 written with ``pyarrow.compute`` only
  (equal-length keys only; it shows what dropping numpy would cost or gain) and crc32 as
  ``zlib.crc32`` per key over the list;
- the batch forms on keys of mixed lengths (0..64 bytes), which take the sorted path.

Every variant's result is checked against the scalar one before it is timed. Median times,
keys per second and speed-ups over the scalar loop are printed and written to
benchmarks/results/partitioner.json.

Run: ``.venv/bin/python benchmarks/partitioner.py [--keys 1000000] [--repeat 5]``
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kstore.partitioner import Crc32Partitioner, Murmur2Partitioner

RESULTS = Path(__file__).resolve().parent / "results" / "partitioner.json"
PARTITIONS = 8
KEY_BYTES = 8


def murmur2_pyarrow_compute(keys: pa.BinaryArray, num_partitions: int) -> pa.Int32Array:
    """Baseline: Kafka murmur2 placement with pyarrow.compute only, for equal-length keys."""
    n = len(keys)
    length = len(keys[0].as_py()) if n else 0
    u32 = pa.uint32()
    m = pa.scalar(0x5BD1E995, u32)

    def shr(x: Any, bits: int) -> Any:
        return pc.shift_right(x, pa.scalar(bits, u32))

    h = pc.bit_wise_xor(pc.cast(pc.binary_length(keys), u32), pa.scalar(0x9747B28C, u32))
    for j in range(length // 4):
        word_bytes = pc.binary_slice(keys, 4 * j, 4 * j + 4)
        # Every slice is 4 bytes, so the sliced values are one contiguous uint32 buffer.
        words = pa.Array.from_buffers(u32, n, [None, word_bytes.buffers()[2]])
        k = pc.multiply(words, m)  # uint32 multiply wraps around, like Java's int
        k = pc.multiply(pc.bit_wise_xor(k, shr(k, 24)), m)
        h = pc.bit_wise_xor(pc.multiply(h, m), k)
    if length % 4:
        tail = pc.binary_slice(keys, length & ~3)
        tail_bytes = pa.Array.from_buffers(pa.uint8(), n * (length % 4), [None, tail.buffers()[2]])
        columns = pa.FixedSizeListArray.from_arrays(tail_bytes, length % 4)
        t = pa.scalar(0, u32)
        for i in range(length % 4):
            byte = pc.cast(pc.list_element(columns, i), u32)
            t = pc.bit_wise_or(t, pc.shift_left(byte, pa.scalar(8 * i, u32)))
        h = pc.multiply(pc.bit_wise_xor(h, t), m)
    h = pc.bit_wise_xor(h, shr(h, 13))
    h = pc.multiply(h, m)
    h = pc.bit_wise_xor(h, shr(h, 15))
    positive = pc.bit_wise_and(h, pa.scalar(0x7FFFFFFF, u32))
    n_scalar = pa.scalar(num_partitions, u32)
    remainder = pc.subtract(positive, pc.multiply(pc.divide(positive, n_scalar), n_scalar))
    return pc.cast(remainder, pa.int32())


def crc32_zlib_per_key(keys: list[bytes], num_partitions: int) -> list[int]:
    """Baseline: zlib.crc32 on each key (librdkafka's ``consistent`` formula)."""
    return [zlib.crc32(k) % num_partitions if k else -1 for k in keys]


def time_runs(fn: Callable[[], object], repeat: int) -> list[float]:
    fn()  # warm-up: first-touch page faults of fresh buffers are not the partitioner's cost
    runs = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - started)
    return runs


def as_list(result: object) -> list[int]:
    if isinstance(result, pa.Array | pa.ChunkedArray):
        return [int(x) for x in result.to_pylist()]
    return [int(x) for x in result]  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--scalar-repeat", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    rng = random.Random(8)
    raw = rng.randbytes(args.keys * KEY_BYTES)
    keys = [raw[i : i + KEY_BYTES] for i in range(0, len(raw), KEY_BYTES)]
    array = pa.array(keys, pa.binary())
    mixed = [rng.randbytes(rng.randrange(0, 65)) for _ in range(args.keys)]
    mixed_array = pa.array(mixed, pa.binary())
    murmur2, crc32 = Murmur2Partitioner(), Crc32Partitioner()

    def scalar(partitioner: Any, ks: list[bytes]) -> Callable[[], list[int]]:
        return lambda: [partitioner.partition(k, PARTITIONS) for k in ks]

    cases: list[tuple[str, str, Callable[[], object], int, str]] = [
        # name, hash, function, repeat, the scalar case it is checked against
        ("murmur2 scalar loop", "murmur2", scalar(murmur2, keys), args.scalar_repeat, ""),
        (
            "murmur2 batch, BinaryArray",
            "murmur2",
            lambda: murmur2.partition_batch(array, PARTITIONS),
            args.repeat,
            "murmur2 scalar loop",
        ),
        (
            "murmur2 batch, list[bytes]",
            "murmur2",
            lambda: murmur2.partition_batch(keys, PARTITIONS),
            args.repeat,
            "murmur2 scalar loop",
        ),
        (
            "murmur2 pyarrow.compute only (baseline)",
            "murmur2",
            lambda: murmur2_pyarrow_compute(array, PARTITIONS),
            args.repeat,
            "murmur2 scalar loop",
        ),
        ("crc32 scalar loop", "crc32", scalar(crc32, keys), args.scalar_repeat, ""),
        (
            "crc32 batch, BinaryArray",
            "crc32",
            lambda: crc32.partition_batch(array, PARTITIONS),
            args.repeat,
            "crc32 scalar loop",
        ),
        (
            "crc32 batch, list[bytes]",
            "crc32",
            lambda: crc32.partition_batch(keys, PARTITIONS),
            args.repeat,
            "crc32 scalar loop",
        ),
        (
            "crc32 zlib per key, list (baseline)",
            "crc32",
            lambda: crc32_zlib_per_key(keys, PARTITIONS),
            args.repeat,
            "crc32 scalar loop",
        ),
        (
            "murmur2 batch, mixed 0-64 B",
            "murmur2",
            lambda: murmur2.partition_batch(mixed_array, PARTITIONS),
            args.repeat,
            "",
        ),
        (
            "crc32 batch, mixed 0-64 B",
            "crc32",
            lambda: crc32.partition_batch(mixed_array, PARTITIONS),
            args.repeat,
            "",
        ),
    ]

    # Correctness first: every variant must place every key exactly as the scalar code does.
    expected = {
        "murmur2 scalar loop": as_list(scalar(murmur2, keys)()),
        "crc32 scalar loop": as_list(scalar(crc32, keys)()),
    }
    sample = range(0, len(mixed), max(1, len(mixed) // 20_000))
    mixed_sample = [mixed[i] for i in sample]
    for name, _, fn, _, reference in cases:
        if reference:
            assert as_list(fn()) == expected[reference], name
    for partitioner in (murmur2, crc32):
        got = np.asarray(partitioner.partition_batch(mixed_array, PARTITIONS))[list(sample)]
        want = [partitioner.partition(k, PARTITIONS) for k in mixed_sample]
        assert got.tolist() == want, partitioner

    results: dict[str, Any] = {}
    for name, hash_name, fn, repeat, _ in cases:
        runs = time_runs(fn, repeat)
        median = statistics.median(runs)
        results[name] = {
            "hash": hash_name,
            "median_ms": median * 1000,
            "min_ms": min(runs) * 1000,
            "runs_ms": [r * 1000 for r in runs],
            "keys_per_second": args.keys / median,
        }
    for entry in results.values():
        base = results[f"{entry['hash']} scalar loop"]["median_ms"]
        entry["speedup_over_scalar"] = base / entry["median_ms"]

    print(
        f"{args.keys:,} keys of {KEY_BYTES} bytes (mixed: 0-64 bytes) into {PARTITIONS} partitions"
    )
    print(f"{'case':42s} {'median ms':>10s} {'keys/s':>14s} {'vs scalar':>10s}")
    for name, entry in results.items():
        print(
            f"{name:42s} {entry['median_ms']:10.1f} {entry['keys_per_second']:14,.0f} "
            f"{entry['speedup_over_scalar']:9.1f}x"
        )

    report: dict[str, Any] = {
        "benchmark": "partitioner",
        "keys": args.keys,
        "key_bytes": KEY_BYTES,
        "partitions": PARTITIONS,
        "repeat": args.repeat,
        "scalar_repeat": args.scalar_repeat,
        "cases": results,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pyarrow": pa.__version__,
        "machine": platform.machine(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
