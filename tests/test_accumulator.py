"""The record accumulator on its own (kstore/accumulator.py): batches opened, grown, sealed and
drained, the buffer they hold and its backpressure, the producer's lifecycle, and a batch's
conversion to Arrow columns. Driven from test threads as ``send()`` and the sender drive it."""

from __future__ import annotations

import random
import threading
import time

import pyarrow as pa
import pytest

from kstore import accumulator
from kstore.accumulator import Batch, RecordAccumulator
from kstore.errors import IllegalStateError, KafkaTimeoutError, ProducerFencedError
from kstore.segments import BINARY, TIMESTAMP_TYPE

KIB = 1024


def _add(acc: RecordAccumulator, batch: Batch, nbytes: int) -> None:
    """One record of ``nbytes``, as send() adds it (lock held)."""
    with acc.lock:
        batch.add_key(None)
        batch.add_value(b"v")
        batch.add_timestamp(time.time())
        batch.nbytes += nbytes
        if batch.nbytes >= batch.mark:
            acc.grow_or_seal(batch.topic, batch)


def _open(acc: RecordAccumulator, topic: str, size: int) -> Batch:
    with acc.lock:
        return acc.open_batch(topic, size, None)


def test_a_batch_reserves_its_buffer_a_chunk_at_a_time_and_is_sealed_when_full() -> None:
    acc = RecordAccumulator(batch_size=10 * KIB, buffer_memory=100 * KIB, max_block_ms=1_000)
    batch = _open(acc, "t", 100)
    assert acc.open == {"t": batch}
    # A first chunk: the batch size (the smaller of it and 1 MiB) for the whole batch.
    assert batch.reserved == acc.buffered == 10 * KIB
    assert batch.mark == 10 * KIB
    for _ in range(9):
        _add(acc, batch, KIB)
    assert acc.open == {"t": batch}  # 9 KiB: still open
    _add(acc, batch, KIB)
    assert acc.open == {}  # full: handed to the sender
    assert acc.drain(60.0, None) == [batch]


def test_a_batch_that_outgrows_its_chunk_reserves_another() -> None:
    big = 4 * accumulator.RESERVE_CHUNK_BYTES
    acc = RecordAccumulator(batch_size=big, buffer_memory=2 * big, max_block_ms=1_000)
    batch = _open(acc, "t", 100)
    assert batch.reserved == accumulator.RESERVE_CHUNK_BYTES
    _add(acc, batch, accumulator.RESERVE_CHUNK_BYTES)
    assert acc.open == {"t": batch}
    assert batch.reserved == acc.buffered == 2 * accumulator.RESERVE_CHUNK_BYTES


def test_drain_hands_out_lingered_batches_and_holds_new_records_while_a_write_runs() -> None:
    acc = RecordAccumulator(batch_size=10 * KIB, buffer_memory=100 * KIB, max_block_ms=1_000)
    first = _open(acc, "a", 10)
    # linger_ms 0: lingered at once.
    assert acc.drain(0.0, None) == [first]
    # A delivery is being written: a new open batch keeps filling, nothing is handed out,
    # until the write ends.
    writing = threading.Event()
    second = _open(acc, "b", 10)
    got: list[list[Batch] | None] = []
    drainer = threading.Thread(target=lambda: got.append(acc.drain(0.0, writing.is_set)))
    drainer.start()
    time.sleep(0.2)
    assert got == []
    assert acc.open == {"b": second}
    writing.set()
    acc.wake()
    drainer.join(10)
    assert got == [[second]]
    # Written and nothing queued: [] (finish the delivery).
    assert acc.drain(60.0, lambda: True) == []


def test_flush_hands_out_open_batches_and_waits_for_those_in_flight() -> None:
    acc = RecordAccumulator(batch_size=10 * KIB, buffer_memory=100 * KIB, max_block_ms=1_000)
    in_flight = _open(acc, "a", 10)
    assert acc.drain(0.0, None) == [in_flight]
    queued = _open(acc, "b", 10)
    assert acc.flush() == [in_flight, queued]
    assert acc.open == {}
    # The flush is asked for even of batches that have not lingered.
    assert acc.drain(60.0, None) == [queued]
    acc.release([in_flight, queued])
    assert acc.buffered == 0
    assert acc.flush() == []


def test_a_whole_table_goes_after_the_records_sent_before_it() -> None:
    acc = RecordAccumulator(batch_size=10 * KIB, buffer_memory=100 * KIB, max_block_ms=1_000)
    earlier = _open(acc, "t", 10)
    table = Batch("t", time.monotonic())
    table.nbytes = 3 * KIB
    acc.enqueue(table)
    assert acc.open == {}
    assert table.reserved == 3 * KIB
    assert acc.buffered == 13 * KIB
    assert acc.drain(60.0, None) == [earlier, table]


def test_a_full_buffer_blocks_until_released_or_max_block_ms() -> None:
    acc = RecordAccumulator(batch_size=10 * KIB, buffer_memory=20 * KIB, max_block_ms=300)
    first = _open(acc, "a", 10)
    second = _open(acc, "b", 10)
    assert acc.buffered == 20 * KIB
    started = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match="max_block_ms=300"):
        _open(acc, "c", 10)
    assert time.monotonic() - started >= 0.3
    # Waiting handed the open batches to the sender, to make room.
    assert acc.open == {}
    work = acc.drain(60.0, None)
    assert work == [first, second]
    opened: list[Batch] = []
    blocked = threading.Thread(target=lambda: opened.append(_open(acc, "c", 10)))
    blocked.start()
    time.sleep(0.05)
    acc.release([first])
    blocked.join(10)
    assert len(opened) == 1
    assert acc.open == {"c": opened[0]}


def test_a_fatal_error_fails_the_open_batches_and_every_later_record() -> None:
    acc = RecordAccumulator(batch_size=10 * KIB, buffer_memory=100 * KIB, max_block_ms=1_000)
    acc.check_usable()
    batch = _open(acc, "t", 10)
    fenced = ProducerFencedError("fenced by epoch 2")
    acc.fail(fenced)
    assert acc.open == {}
    assert acc.drain(60.0, None) == [batch]  # sent, to be completed with their outcome
    with pytest.raises(ProducerFencedError, match="epoch 2"):
        acc.check_usable()
    with pytest.raises(ProducerFencedError):
        acc.enqueue(Batch("t", time.monotonic()))


def test_close_sends_what_is_open_and_stops_the_sender_once_drained() -> None:
    acc = RecordAccumulator(batch_size=10 * KIB, buffer_memory=100 * KIB, max_block_ms=1_000)
    batch = _open(acc, "t", 10)
    acc.close()
    with pytest.raises(IllegalStateError, match="producer is closed"):
        acc.check_usable()
    assert acc.drain(60.0, None) == [batch]
    assert acc.drain(60.0, None) is None


def test_after_a_fork_the_child_takes_no_records() -> None:
    acc = RecordAccumulator(batch_size=10 * KIB, buffer_memory=100 * KIB, max_block_ms=1_000)
    _open(acc, "t", 10)
    acc.after_fork()
    assert acc.open == {}
    with pytest.raises(IllegalStateError, match=r"os\.fork\(\)"):
        acc.check_usable()


@pytest.mark.parametrize("size", [1, accumulator.SMALL_BATCH, accumulator.SMALL_BATCH + 1, 3000])
def test_a_batch_converts_its_timestamps_alike_whatever_its_size(size: int) -> None:
    """send()'s float seconds become microseconds rounded half to even (numpy for a small
    batch, Arrow's kernels for a large one), and timestamps given in ms stay exact."""
    batch = Batch("t", time.time())
    rng = random.Random(size)
    seconds: list[float] = []
    for i in range(size):
        # Some exactly half a microsecond past a whole one, both ways of rounding.
        value = 1_700_000_000 + rng.randrange(10**6) / 10**3 + (0.5 + i % 2) / 10**6
        seconds.append(value)
        batch.add_key(b"k")
        batch.add_value(b"v")
        batch.add_timestamp(value)
    given = {i: 1_700_000_000_123 + i for i in range(0, size, 7)}
    batch.given_timestamps = dict(given)
    table = accumulator.build_table(batch, BINARY)
    micros = table.column("timestamp").cast(pa.int64()).to_pylist()
    expected = [given[i] * 1000 if i in given else round(s * 1e6) for i, s in enumerate(seconds)]
    assert micros == expected
    assert table.schema.field("timestamp").type == TIMESTAMP_TYPE
