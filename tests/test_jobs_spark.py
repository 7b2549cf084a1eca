"""The maintenance jobs on Spark: results, safety while producers and a consumer work, and
spark-submit. Uses the shared ``spark`` session of conftest.py."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import kstore.compaction as compaction
import kstore.retention as retention
import pytest
from kstore.compaction import merge_segments, run_compaction
from kstore.compaction.jobs import Summary
from kstore.retention import run_retention, vacuum

from kstore import Store
from kstore.consumer import Consumer
from kstore.producer import Producer
from kstore.records import TopicPartition
from tests.test_jobs_support import (
    BACKENDS,
    Target,
    append,
    latest_per_key,
    now_ms,
    open_store,
    rows,
    segment_files,
)

pytestmark = pytest.mark.spark

HOUR = 3_600_000


@pytest.mark.parametrize("target", BACKENDS)
def test_the_jobs_on_spark(spark: Any, target: str, request: pytest.FixtureRequest) -> None:
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("users", 3, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0})
    store.create_topic("events", 3, {"retention.ms": HOUR, "segment.bytes": 1 << 20})
    rng = random.Random(5)
    now = now_ms()
    users = {}
    for p in range(3):
        part = store.partition("users", p)
        for _ in range(4):
            append(
                part,
                [b"u%d" % rng.randrange(10) for _ in range(10)],
                [rng.randbytes(20) for _ in range(10)],
                now - HOUR,
            )
        users[p] = latest_per_key(rows(part))
        events = store.partition("events", p)
        for age in (3 * HOUR, 2 * HOUR, 0, 0, 0):
            append(events, [b"e"], [b"%d" % age], now - age)

    kept = run_retention(spark, *where, verbose=False, tasks=2)
    assert kept.tasks == 2
    assert kept.partitions_scanned == 3
    assert kept.segments_removed == 6
    compacted = run_compaction(spark, *where, verbose=False, tasks=2)
    assert compacted.count("committed") == 3
    assert not compacted.errors
    merged = merge_segments(spark, *where, verbose=False, tasks=2)
    assert merged.partitions_scanned == 6
    assert merged.segments_removed == 9
    swept = vacuum(spark, *where, verbose=False, now_ms=now_ms() + 2 * HOUR)
    assert swept.files_deleted == 3 * 2 + 3 * 4 + 3 * 3
    assert not swept.errors
    for p in range(3):
        assert rows(store.partition("users", p)) == users[p]
        events = store.partition("events", p)
        assert [o for o, _, _ in rows(events)] == [2, 3, 4]
        assert events.state().log_start_offset == 2
        for topic in ("users", "events"):
            part = store.partition(topic, p)
            assert {f"segments/{n}" for n in segment_files(store, part)} == {
                s.path for s in part.state().segments
            }


class Acked:
    """Records acknowledged by the producers: (topic, partition, offset) -> value."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: dict[tuple[str, int, int], bytes] = {}


def produce(
    url: str,
    options: dict[str, Any],
    name: str,
    acked: Acked,
    stop: threading.Event,
    errors: list[BaseException],
) -> None:
    try:
        with Producer(Store(url, options), acks="all", linger_ms=2, client_id=name) as producer:
            i = 0
            while not stop.is_set():
                pending = []
                for _ in range(20):
                    for topic in ("live", "rolling"):
                        value = b"%s-%d-" % (name.encode(), i) + os.urandom(40)
                        pending.append(
                            (
                                topic,
                                value,
                                producer.send(
                                    topic, key=b"%s-%d" % (name.encode(), i), value=value
                                ),
                            )
                        )
                    i += 1
                for topic, value, future in pending:
                    meta = future.get(timeout=60)
                    with acked.lock:
                        acked.records[(topic, meta.partition, meta.offset)] = value
    except BaseException as exc:
        errors.append(exc)


def consume(
    url: str,
    options: dict[str, Any],
    seen: dict[TopicPartition, list[tuple[int, bytes]]],
    stop: threading.Event,
    errors: list[BaseException],
) -> None:
    try:
        consumer = Consumer(store=Store(url, options, create=False), auto_offset_reset="earliest")
        consumer.assign([TopicPartition(t, p) for t in ("live", "rolling") for p in range(2)])
        while not stop.is_set():
            for tp, records in consumer.poll(timeout_ms=50, max_records=2000).items():
                seen[tp].extend((r.offset, r.value) for r in records)
        consumer.close()
    except BaseException as exc:
        errors.append(exc)


@pytest.mark.parametrize("target", BACKENDS)
def test_maintenance_while_two_producers_and_a_consumer_work(
    spark: Any, target: str, request: pytest.FixtureRequest
) -> None:
    """Compaction, merging, retention and vacuum run on Spark in a loop while two producers
    append (unique keys) and a consumer reads from the beginning: no acknowledged record is
    lost (beyond retention), and the consumer never sees a gap on the compacted topic, whose
    records are all kept because every key is unique."""
    where: Target = request.getfixturevalue(target)
    url, options = where
    store = open_store(where)
    common = {"segment.bytes": 30_000, "file.delete.delay.ms": 10_000}  # the smallest allowed
    store.create_topic(
        "live",
        2,
        {
            **common,
            "cleanup.policy": "compact,delete",
            "retention.ms": -1,
            "min.cleanable.dirty.ratio": 0.0,
        },
    )
    store.create_topic("rolling", 2, {**common, "segment.bytes": 6_000, "retention.bytes": 8_000})
    acked = Acked()
    errors: list[BaseException] = []
    stop_producing, stop_consuming = threading.Event(), threading.Event()
    seen: dict[TopicPartition, list[tuple[int, bytes]]] = {
        TopicPartition(t, p): [] for t in ("live", "rolling") for p in range(2)
    }
    producers = [
        threading.Thread(
            target=produce, args=(url, options, f"p{i}", acked, stop_producing, errors)
        )
        for i in range(2)
    ]
    consumer = threading.Thread(target=consume, args=(url, options, seen, stop_consuming, errors))
    for thread in [*producers, consumer]:
        thread.start()
    summaries: list[Summary] = []
    deadline = time.monotonic() + 8
    try:
        while time.monotonic() < deadline or not summaries:
            summaries.append(run_compaction(spark, *where, verbose=False, tasks=2))
            summaries.append(merge_segments(spark, *where, verbose=False, tasks=2))
            summaries.append(run_retention(spark, *where, verbose=False, tasks=2))
            summaries.append(vacuum(spark, *where, verbose=False, tasks=2))
    finally:
        stop_producing.set()
        for thread in producers:
            thread.join(120)
    ends = {
        TopicPartition(t, p): store.partition(t, p).state().end_offset
        for t in ("live", "rolling")
        for p in range(2)
    }
    wait = time.monotonic() + 60
    while (
        any(
            (seen[tp][-1][0] + 1 if seen[tp] else 0) < ends[tp] for tp in ends if tp.topic == "live"
        )
        and time.monotonic() < wait
    ):
        time.sleep(0.05)
    time.sleep(0.3)
    stop_consuming.set()
    consumer.join(60)
    assert not errors, errors
    assert not [p for s in summaries for p in s.errors], [
        p.reason for s in summaries for p in s.errors
    ]
    assert sum(s.count("committed") for s in summaries if s.operation == "compaction") > 0
    assert sum(s.count("committed") for s in summaries if s.operation == "merge") > 0
    assert sum(s.count("committed") for s in summaries if s.operation == "retention") > 0
    fresh = Store(url, options)
    for p in range(2):
        tp = TopicPartition("live", p)
        acked_here = sorted(
            (o, v) for (t, q, o), v in acked.records.items() if (t, q) == ("live", p)
        )
        assert acked_here
        assert [o for o, _ in acked_here] == list(range(len(acked_here)))
        # Every acknowledged record, at its offset, with its value.
        assert [(o, v) for o, _, v in rows(fresh.partition("live", p))] == acked_here
        # The consumer saw them all, in order, without a gap or a repeat.
        assert seen[tp] == acked_here

        tp = TopicPartition("rolling", p)
        state = fresh.partition("rolling", p).state()
        assert state.log_start_offset > 0
        acked_here = sorted(
            (o, v) for (t, q, o), v in acked.records.items() if (t, q) == ("rolling", p)
        )
        live = [(o, v) for o, _, v in rows(fresh.partition("rolling", p))]
        assert live == [(o, v) for o, v in acked_here if o >= state.log_start_offset]
        offsets = [o for o, _ in seen[tp]]
        assert offsets == sorted(set(offsets))
        assert all(v == dict(acked_here)[o] for o, v in seen[tp])


@pytest.mark.parametrize("job", ["compaction", "retention"])
def test_the_jobs_run_under_spark_submit(local_store: Target, tmp_path: Path, job: str) -> None:
    store = open_store(local_store)
    store.create_topic(
        "users",
        2,
        {
            "cleanup.policy": "compact,delete",
            "retention.ms": HOUR,
            "min.cleanable.dirty.ratio": 0.0,
        },
    )
    now = now_ms()
    for p in range(2):
        part = store.partition("users", p)
        append(part, [b"a", b"b", b"a"], [b"1", b"2", b"3"], now - 2 * HOUR)
        append(part, [b"a", b"b"], [b"4", b"5"], now)
    submit = shutil.which("spark-submit", path=os.path.dirname(sys.executable))
    assert submit is not None
    script = compaction.SUBMIT_SCRIPT if job == "compaction" else retention.SUBMIT_SCRIPT
    command = "all"
    out = tmp_path / "summary.json"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    done = subprocess.run(
        [
            submit,
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            script,
            "--store",
            local_store[0],
            "--json",
            str(out),
            command,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summaries = json.loads(out.read_text())
    assert done.stdout.count("partitions in") == len(summaries)
    if job == "compaction":
        assert [s["operation"] for s in summaries] == ["compaction", "merge"]
        assert summaries[0]["committed"] == 2
        assert summaries[0]["records_dropped"] == 6
        for p in range(2):
            assert rows(store.partition("users", p)) == [(3, b"a", b"4"), (4, b"b", b"5")]
    else:
        assert [s["operation"] for s in summaries] == ["retention", "vacuum"]
        assert summaries[0]["segments_removed"] == 2
        for p in range(2):
            assert rows(store.partition("users", p)) == [(3, b"a", b"4"), (4, b"b", b"5")]
