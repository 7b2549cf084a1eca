"""Concurrent writers: 8 of them appending to ONE partition (threads and processes on the local
disk, threads on SeaweedFS), and 8 creators racing for one topic name.

Afterwards the log must hold every acknowledged append at the offsets it was given, with its
payload, exactly once; offsets dense from 0 (invariants 1-3). moto is left out on purpose: its
conditional put is check-then-write without a lock, so it cannot arbitrate races.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from kstore import Store, TopicMetadata
from kstore.errors import TopicAlreadyExistsError
from kstore.segments import TIMESTAMP_TYPE
from kstore.storage import Storage
from tests.conftest import StoreTarget

WRITERS = 8
SECONDS = 3.0
TOPIC = "race"
REPO = Path(__file__).resolve().parents[1]

Ack = tuple[int, int, int]  # (sequence, base offset, last offset) of one acknowledged append


def payload(writer: int, seq: int) -> list[bytes]:
    """The values of append ``seq`` of ``writer``: 1 to 3 records, each naming its origin."""
    return [b"w%d-s%d-r%d" % (writer, seq, r) for r in range(seq % 3 + 1)]


def append_loop(
    url: str,
    options: dict[str, Any],
    writer: int,
    seconds: float,
    start_at: float,
    *,
    store: Store | None = None,
    emit: Callable[[Ack], None] | None = None,
) -> list[Ack]:
    """Append to partition 0 of TOPIC from ``start_at`` (wall clock) for ``seconds``."""
    store = store or Store(url, options, create=False)
    part = store.partition(TOPIC, 0)
    while time.time() < start_at:
        time.sleep(0.001)
    acks: list[Ack] = []
    deadline = time.monotonic() + seconds
    seq = 0
    while time.monotonic() < deadline:
        values = payload(writer, seq)
        table = pa.table(
            {
                "key": pa.array([b"w%d" % writer] * len(values), pa.binary()),
                "value": pa.array(values, pa.binary()),
                "timestamp": pa.array([int(time.time() * 1e6)] * len(values), TIMESTAMP_TYPE),
            }
        )
        result = part.append(table)
        assert not result.duplicate
        assert result.last_offset - result.base_offset + 1 == len(values)
        ack = (seq, result.base_offset, result.last_offset)
        acks.append(ack)
        if emit is not None:
            emit(ack)
        seq += 1
    return acks


def process_main() -> None:
    """Entry point of a writer subprocess: ``url options-json writer seconds``. Prints "ready"
    once imported and waits for a line on stdin (so that all writers start together), then
    prints one JSON line per acknowledged append, flushed at once (so that a parent that kills
    this process knows exactly what was acknowledged)."""
    url, options, writer = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
    seconds = float(sys.argv[4])
    store = Store(url, options, create=False)
    store.partition(TOPIC, 0).state()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    sys.stdin.readline()

    def emit(ack: Ack) -> None:
        sys.stdout.write(json.dumps(ack) + "\n")
        sys.stdout.flush()

    append_loop(url, options, writer, seconds, 0.0, store=store, emit=emit)
    sys.stdout.write("done\n")
    sys.stdout.flush()


def start_writer_processes(
    target: StoreTarget, count: int, seconds: float
) -> list[subprocess.Popen[str]]:
    """Start ``count`` writer processes and release them together once all are ready."""
    code = "from tests.test_races import process_main; process_main()"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                code,
                target.url,
                json.dumps(target.storage_options),
                str(writer),
                str(seconds),
            ],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for writer in range(count)
    ]
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if line != "ready\n":
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"writer process did not start: {line!r} {err}")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return procs


def parse_acks(stdout: str) -> list[Ack]:
    acks = []
    for line in stdout.splitlines():
        if line.startswith("["):
            seq, base, last = json.loads(line)
            acks.append((seq, base, last))
    return acks


def verify_log(target: StoreTarget, acks: dict[int, list[Ack]], *, exact: bool = True) -> int:
    """Check the partition against what the writers were told; returns its record count.

    ``exact``: every commit in the log was acknowledged (no writer died between landing a commit
    and hearing about it), so the log holds exactly the acknowledged records.
    """
    part = Store(target.url, target.storage_options, create=False).partition(TOPIC, 0)
    state = part.state()
    batches = list(part.read(0))
    table = pa.Table.from_batches(batches) if batches else None
    offsets = [] if table is None else table.column("offset").to_pylist()
    values = [] if table is None else table.column("value").to_pylist()
    n = state.end_offset
    # Dense and unique: 0..N-1, no gap, no repeat.
    assert offsets == list(range(n))
    assert len(set(values)) == n, "a record appears twice"
    # Segments tile the offsets exactly.
    expected_base = 0
    for seg in state.segments:
        assert seg.base_offset == expected_base
        expected_base = seg.last_offset + 1
    assert expected_base == n
    # Every acknowledged append is there, at its offsets, with its payload, in send order.
    acked_records = 0
    for writer, writer_acks in acks.items():
        previous_last = -1
        for seq, base, last in writer_acks:
            assert values[base : last + 1] == payload(writer, seq), (writer, seq, base, last)
            assert base > previous_last, "one producer's appends out of order"
            previous_last = last
            acked_records += last - base + 1
    if exact:
        assert acked_records == n, f"{n - acked_records} records in the log were never acknowledged"
        assert state.version + 1 == sum(len(a) for a in acks.values())  # one commit per append
    else:
        assert acked_records <= n
        # Anything not acknowledged is still a whole append of some writer (no torn commit).
        for value in values:
            assert value.startswith(b"w")
    return n


def prepare_topic(target: StoreTarget) -> Store:
    store = Store(target.url, target.storage_options)
    store.create_topic(TOPIC, 1)
    return store


def run_threads(target: StoreTarget, seconds: float) -> dict[int, list[Ack]]:
    prepare_topic(target)
    shared = Store(target.url, target.storage_options, create=False)
    start_at = time.time() + 0.5
    results: dict[int, list[Ack]] = {}
    errors: list[BaseException] = []

    def work(writer: int) -> None:
        # Half the writers share one Store (and so one Partition object); the others each
        # have their own, as separate clients would.
        own = shared if writer < WRITERS // 2 else None
        try:
            results[writer] = append_loop(
                target.url, target.storage_options, writer, seconds, start_at, store=own
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a writer hung"
    if errors:
        raise errors[0]
    return results


# --- appends -----------------------------------------------------------------------------------


def test_threads_appending_to_one_partition_on_local_disk(
    local_store_url: tuple[str, dict[str, Any]],
) -> None:
    target = StoreTarget("local", *local_store_url)
    acks = run_threads(target, SECONDS)
    verify_log(target, acks)
    assert all(acks[w] for w in range(WRITERS)), "a writer never got a commit in"


@pytest.mark.s3
def test_threads_appending_to_one_partition_on_seaweedfs(
    seaweed_bucket_url: tuple[str, dict[str, Any]],
) -> None:
    target = StoreTarget("seaweed", *seaweed_bucket_url)
    acks = run_threads(target, SECONDS)
    verify_log(target, acks)
    assert all(acks[w] for w in range(WRITERS)), "a writer never got a commit in"


def test_processes_appending_to_one_partition_on_local_disk(
    local_store_url: tuple[str, dict[str, Any]],
) -> None:
    target = StoreTarget("local", *local_store_url)
    prepare_topic(target)
    procs = start_writer_processes(target, WRITERS, SECONDS)
    acks: dict[int, list[Ack]] = {}
    for writer, proc in enumerate(procs):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out.endswith("done\n"), err
        acks[writer] = parse_acks(out)
    verify_log(target, acks)
    assert all(acks[w] for w in range(WRITERS)), "a writer never got a commit in"


# --- topic creation ----------------------------------------------------------------------------


def race_create_topic(target: StoreTarget, name: str) -> None:
    Store(target.url, target.storage_options)  # the marker, outside the race
    barrier = threading.Barrier(WRITERS)
    won: list[TopicMetadata] = []
    lost: list[TopicAlreadyExistsError] = []
    other: list[BaseException] = []

    def work() -> None:
        store = Store(target.url, target.storage_options, create=False)
        barrier.wait()
        try:
            won.append(store.create_topic(name, 2, {"retention.ms": 1000}))
        except TopicAlreadyExistsError as exc:
            lost.append(exc)
        except BaseException as exc:
            other.append(exc)

    threads = [threading.Thread(target=work) for _ in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not other, other
    assert len(won) == 1, f"{len(won)} creators won"
    assert len(lost) == WRITERS - 1
    fresh = Store(target.url, target.storage_options, create=False)
    assert fresh.topic(name) == won[0]
    assert fresh.list_topics().count(name) == 1
    assert fresh.topic(name).version == 0  # exactly one commit in the topic log


@pytest.mark.parametrize("backend", ["memory", "local"])
def test_concurrent_create_topic_one_winner(request: pytest.FixtureRequest, backend: str) -> None:
    url, options = request.getfixturevalue(f"{backend}_store_url")
    for round_ in range(3):
        race_create_topic(StoreTarget(backend, url, options), f"contested-{round_}")


@pytest.mark.s3
def test_concurrent_create_topic_one_winner_on_seaweedfs(
    seaweed_bucket_url: tuple[str, dict[str, Any]],
) -> None:
    race_create_topic(StoreTarget("seaweed", *seaweed_bucket_url), "contested")


def race_put_if_absent(storage: Storage, path: str) -> None:
    barrier = threading.Barrier(WRITERS)
    winners: list[bytes] = []
    losers: list[int] = []
    other: list[BaseException] = []

    def work(writer: int) -> None:
        mine = b"writer %d " % writer + b"x" * 4096
        barrier.wait()
        try:
            storage.put_if_absent(path, mine)
            winners.append(mine)
        except FileExistsError:
            losers.append(writer)
        except BaseException as exc:
            other.append(exc)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not other, other
    assert len(winners) == 1
    assert len(losers) == WRITERS - 1
    assert Storage(storage.url, storage.storage_options).read(path) == winners[0]


@pytest.mark.parametrize(
    "backend", ["memory", "local", pytest.param("seaweed", marks=pytest.mark.s3)]
)
def test_concurrent_put_if_absent_one_winner(request: pytest.FixtureRequest, backend: str) -> None:
    fixture = "seaweed_bucket_url" if backend == "seaweed" else f"{backend}_store_url"
    url, options = request.getfixturevalue(fixture)
    rounds = 1 if backend == "seaweed" else 5
    for round_ in range(rounds):
        race_put_if_absent(Storage(url, options), f"contested/{round_:020d}.json")
