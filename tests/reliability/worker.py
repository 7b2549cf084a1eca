"""The client loops of a torture run: producers, transactional producers and group members.

Each loop records what it does in a history (``tests.reliability.history``). They run as
threads of the driver or as processes of their own, which the driver kills with SIGKILL (and
which the fault-injecting filesystem may crash with ``os._exit``)::

    python -m tests.reliability.worker ROLE CONFIG_JSON

ROLE is ``producer``, ``txn``, ``consumer`` or ``maintenance``; CONFIG_JSON holds ``url``,
``options`` (storage options, possibly of ``faultfs``), ``name``, ``history`` (the JSON-lines
file), ``seed``; for ``txn``, ``tid`` (the transactional id); for ``maintenance``, ``jobs``
(names of :data:`JOBS`, or ``["service"]``: the maintenance service, :func:`service_loop`). Optional: ``skew_s``, seconds added to this process's wall clock
(``time.time``, ``time.time_ns``: an injected clock skew), and ``machine``, ``{"root",
"shadow"}`` to record what this process makes durable for a simulated machine crash
(``tests/reliability/machine.py``), and ``clock``, the file of the run's jumps of time that this
process's clocks follow (``tests/reliability/jumps.py``). A process runs until it is killed.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import random
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from kstore.consumer import Consumer
from kstore.errors import CommitFailedError, KStoreError
from kstore.producer import Producer
from kstore.records import ConsumerRecord
from kstore.store import Store
from tests.reliability import faultfs, jumps, machine
from tests.reliability.history import Recorder

# The topics of a run: (name, partitions, config).
TOPICS: list[tuple[str, int, dict[str, Any]]] = [
    (
        "events",
        3,
        {
            "cleanup.policy": "delete",
            "retention.bytes": 150_000,
            "segment.bytes": 65_536,
            "segment.ms": 500,
            # Short enough that the maintenance service removes records by age during a run,
            # some of them before the group has read them.
            "retention.ms": 15_000,
            "file.delete.delay.ms": 10_000,
            # Two topic logs for three partitions (0 and 2 share one): a delivery's commits,
            # acknowledgements and markers go to several logs (issue 45, defect 1).
            "commit.logs": 2,
        },
    ),
    (
        "state",
        2,
        {
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": 0.01,
            "segment.bytes": 65_536,
            "segment.ms": 500,
            "file.delete.delay.ms": 10_000,
            # Tombstones are dropped soon after a cleaning, so that a run sees it happen.
            "delete.retention.ms": 2_000,
            "max.compaction.lag.ms": 5_000,
            # Every flush a data object (the other topics' commits carry theirs, PROTOCOL.md
            # 11.8): a producer's segment-written crash point and pause, and the deadline of a
            # data object waiting for its commit, stay in the runs.
            "commit.inline.bytes": 0,
        },
    ),
]
COPY_TOPIC = ("copy", 2, {"file.delete.delay.ms": 10_000})
GROUP = "torture"
STATE_KEYS = 40
TOMBSTONE_SHARE = 0.15  # of the records sent to ``state``
ID_HEADER = "id"  # a tombstone has no value: its value id travels in this header

Stop = Callable[[], bool]
TXN_TIMEOUT_MS = 10_000
# The maintenance service of a run: passes every second, so that it removes and rewrites data
# during a 35 s run; a lease a killed service left is taken over after 15 s.
SERVICE_SETTINGS = {"interval_ms": 1_000, "vacuum_interval_ms": 3_000, "lease_ms": 15_000}


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:200]}"


def record_id(r: ConsumerRecord) -> tuple[str | None, bool]:
    """A read record's value id, and whether it is a tombstone (its id in a header)."""
    if r.value is not None:
        return r.value.decode(), False
    ids = [v for k, v in r.headers if k == ID_HEADER]
    return (ids[0].decode() if ids else None), True


def skew_clock(seconds: float) -> None:
    """Shift this process's wall clock by ``seconds`` (monotonic clocks are untouched, as on a
    machine whose clock is set wrong)."""
    real_time, real_ns = time.time, time.time_ns
    shift_ns = int(seconds * 1e9)
    time.time = lambda: real_time() + seconds
    time.time_ns = lambda: real_ns() + shift_ns


def produce_loop(store: Store, name: str, record: Recorder, rng: random.Random, stop: Stop) -> int:
    """Idempotent producing in small batches until ``stop()``; a producer that fails fatally
    is replaced by a new instance (a new name). Returns the records sent."""
    sent = 0
    instance = 0
    while not stop():
        pname = f"{name}.{instance}"
        instance += 1
        try:
            producer = Producer(
                store,
                enable_idempotence=True,
                acks="all",
                linger_ms=rng.choice([0, 2, 10]),
                delivery_timeout_ms=60_000,
            )
        except KStoreError as exc:
            record("error", who=pname, error=_error(exc))
            time.sleep(0.2)
            continue
        seq = 0
        healthy = True
        while healthy and not stop():
            futures = []
            for _ in range(rng.randint(1, 25)):
                if rng.random() < 0.7:
                    topic = "events"
                    key = f"e{rng.randrange(500)}" if rng.random() < 0.5 else None
                else:
                    topic, key = "state", f"k{rng.randrange(STATE_KEYS)}"
                vid = f"{pname}:{seq}"
                tombstone = topic == "state" and rng.random() < TOMBSTONE_SHARE
                record(
                    "send",
                    producer=pname,
                    seq=seq,
                    topic=topic,
                    key=key,
                    value=vid,
                    txn=None,
                    tombstone=tombstone,
                )
                try:
                    future = producer.send(
                        topic,
                        key=None if key is None else key.encode(),
                        value=None if tombstone else vid.encode(),
                        headers=[(ID_HEADER, vid.encode())] if tombstone else None,
                    )
                except KStoreError as exc:
                    record("nack", producer=pname, seq=seq, value=vid, error=_error(exc))
                    healthy = False
                    break
                futures.append((seq, vid, topic, future))
                seq += 1
                sent += 1
            for s, vid, topic, future in futures:
                try:
                    md = future.get(timeout=120)
                except Exception as exc:
                    record("nack", producer=pname, seq=s, value=vid, error=_error(exc))
                    continue
                record(
                    "ack",
                    producer=pname,
                    seq=s,
                    topic=topic,
                    partition=md.partition,
                    offset=md.offset,
                    value=vid,
                )
            time.sleep(rng.uniform(0, 0.03))
        try:
            producer.close(timeout=5)
        except Exception as exc:
            record("error", who=pname, error=_error(exc))
    return sent


def txn_loop(
    store: Store, name: str, tid: str, record: Recorder, rng: random.Random, stop: Stop
) -> int:
    """Transactions of 1-10 records to ``events``, 80% committed, 20% aborted; a failure
    leaves the outcome unknown and a new instance (which finishes the transaction) takes
    over. Returns the transactions ended."""
    ended = 0
    instance = 0
    while not stop():
        pname = f"{name}.{instance}"
        instance += 1
        try:
            producer = Producer(
                store,
                transactional_id=tid,
                linger_ms=1,
                delivery_timeout_ms=60_000,
                # Short, so that the maintenance service aborts transactions a killed or
                # paused instance left open (and a slow live one's commit must then fail).
                transaction_timeout_ms=TXN_TIMEOUT_MS,
            )
        except KStoreError as exc:
            record("error", who=pname, error=_error(exc))
            time.sleep(0.3)
            continue
        seq = 0
        n = 0
        healthy = True
        while healthy and not stop():
            txn = f"{pname}#{n}"
            n += 1
            try:
                producer.begin_transaction()
                futures = []
                for _ in range(rng.randint(1, 10)):
                    vid = f"{pname}:{seq}"
                    key = f"x{rng.randrange(100)}"
                    record(
                        "send", producer=pname, seq=seq, topic="events", key=key, value=vid, txn=txn
                    )
                    futures.append(
                        (seq, vid, producer.send("events", key=key.encode(), value=vid.encode()))
                    )
                    seq += 1
                producer.flush()
                for s, vid, future in futures:
                    md = future.get(timeout=120)
                    record(
                        "ack",
                        producer=pname,
                        seq=s,
                        topic="events",
                        partition=md.partition,
                        offset=md.offset,
                        value=vid,
                    )
                if rng.random() < 0.8:
                    record("txn", producer=pname, txn=txn, outcome="committing")
                    producer.commit_transaction()
                    record("txn", producer=pname, txn=txn, outcome="commit")
                else:
                    producer.abort_transaction()
                    record("txn", producer=pname, txn=txn, outcome="abort")
                ended += 1
            except Exception as exc:
                record("error", who=pname, txn=txn, error=_error(exc))
                healthy = False
            time.sleep(rng.uniform(0, 0.05))
        try:
            producer.close(timeout=5)
        except Exception as exc:
            record("error", who=pname, error=_error(exc))
    return ended


def consume_loop(store: Store, name: str, record: Recorder, stop: Stop) -> int:
    """A read_committed group member of ``GROUP`` that commits after every poll."""
    consumer = Consumer(
        "events",
        "state",
        store=store,
        group_id=GROUP,
        client_id=name,
        enable_auto_commit=False,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        session_timeout_ms=3_000,
        heartbeat_interval_ms=300,
        # A poll reads about one small segment per 3 records (the producers' commits are
        # small): on SeaweedFS 300 records took a new member's first poll 3-4 s on a quiet
        # machine, 100 took 1.2 s, and a member holds partitions moving to another member
        # until its poll ends.
        max_poll_records=100,
    )
    reads = 0
    while not stop():
        try:
            polled = consumer.poll(timeout_ms=200)
        except KStoreError as exc:
            record("error", who=name, error=_error(exc))
            time.sleep(0.1)
            continue
        generation = consumer.generation
        for tp, records in polled.items():
            for r in records:
                vid, tombstone = record_id(r)
                record(
                    "read",
                    reader=name,
                    **{"pass": f"{name}:g{generation}"},
                    iso="rc",
                    final=False,
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=r.offset,
                    value=vid,
                    tombstone=tombstone,
                )
                reads += 1
        if polled:
            try:
                consumer.commit()
                record("offset_commit", who=name, generation=generation, outcome="ok")
            except CommitFailedError as exc:
                record("offset_commit", who=name, generation=generation, outcome=_error(exc))
            except KStoreError as exc:
                record("error", who=name, error=_error(exc))
    try:
        consumer.close()
    except Exception as exc:
        record("error", who=name, error=_error(exc))
    return reads


# The maintenance jobs, run in-process (``spark=None``); vacuum at the smallest orphan age it
# accepts, so that a paused writer's file is taken for an orphan as early as allowed.
JOBS = ("compaction", "merge", "retention", "vacuum")


def _job(name: str, store: Store) -> Callable[[], Any]:
    from kstore.compaction import merge_segments, run_compaction
    from kstore.retention import MIN_ORPHAN_AGE_MS, run_retention, vacuum

    return {
        "compaction": lambda: run_compaction(None, store, verbose=False),
        "merge": lambda: merge_segments(None, store, verbose=False),
        "retention": lambda: run_retention(None, store, verbose=False),
        "vacuum": lambda: vacuum(None, store, verbose=False, orphan_age_ms=MIN_ORPHAN_AGE_MS),
    }[name]


def maintenance_loop(
    store: Store, name: str, jobs: list[str], record: Recorder, rng: random.Random, stop: Stop
) -> int:
    """Runs ``jobs`` (names of :data:`JOBS`) in random turns until ``stop()``; records each
    run (``job``, with every partition's outcome) or its failure. Returns the runs."""
    runs = 0
    while not stop():
        job = rng.choice(jobs)
        began = time.monotonic()
        try:
            summary = _job(job, store)()
            outcomes: dict[str, int] = {}
            for result in summary.partitions:
                what = f"{result.operation}:{result.outcome}"
                outcomes[what] = outcomes.get(what, 0) + 1
                if result.outcome == "error":
                    record("error", who=f"{name}-{what}", error=str(result.reason)[:500])
            record(
                "job",
                who=name,
                job=job,
                seconds=round(time.monotonic() - began, 3),
                outcomes=outcomes,
            )
        except Exception as exc:
            record("error", who=name, job=job, error=_error(exc))
            record("job", who=name, job=job, failed=True)
        runs += 1
        if stop():
            break
        time.sleep(rng.uniform(0.1, 0.6))
    return runs


# A line of the service's log: a task run (``TaskRun.line``), or a topic it could not plan.
_RUN_LINE = re.compile(
    r"^\[maintain\] (?P<task>\S+) (?P<topic>\S+): (?P<outcome>\w+)"
    r"(?: removed (?P<records>\d+) records, \d+ bytes, (?P<segments>\d+) segments, "
    r"(?P<files>\d+) files)? in (?P<seconds>[0-9.]+) s(?:: (?P<detail>.*))?$"
)
_NOT_PLANNED = re.compile(r"^\[maintain\] (?P<topic>\S+): not planned: (?P<why>.*)$")


def service_loop(store: Store, name: str, record: Recorder, stop: Stop) -> int:
    """The maintenance service (``kstore maintain``'s :class:`Service`, its passes driven here
    so that a failed pass is recorded): each task run is recorded as a ``job`` as soon as it
    ends (a pass on a faulty S3 takes tens of seconds), its errors and the topics it could not
    plan as ``error`` events. Returns the passes."""
    from kstore.maintenance import Service, Settings

    def log(line: str) -> None:
        if m := _NOT_PLANNED.match(line):
            record("error", who=f"{name}-plan", error=m["why"][:500])
        elif (m := _RUN_LINE.match(line)) and m["outcome"] != "taken":
            what = f"service-{m['task']}"
            if m["outcome"] == "error":
                # "<topic>-<partition>: <ErrorType>: ..." or "<ErrorType>: ..."
                error = m["detail"] or ""
                if error.startswith(f"{m['topic']}-"):
                    error = error.split(": ", 1)[-1]
                record("error", who=f"{name}-{what}", error=error[:500])
            record(
                "job",
                who=name,
                job=what,
                seconds=float(m["seconds"]),
                outcomes={f"{what}:{m['outcome']}": 1},
                removed={k: int(m[k] or 0) for k in ("records", "segments", "files")},
            )

    service = Service(store, Settings(**SERVICE_SETTINGS), holder=name, log=log)
    interval_s = SERVICE_SETTINGS["interval_ms"] / 1000
    passes = 0
    while not stop():
        began = time.monotonic()
        try:
            service.run_once()
        except Exception as exc:  # the plan failed (an injected fault): next interval
            record("error", who=name, job="service", error=_error(exc))
        passes += 1
        time.sleep(max(0.0, interval_s - (time.monotonic() - began)))
    return passes


def main() -> None:
    role, config = sys.argv[1], json.loads(sys.argv[2])
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # where a stuck worker is
    faultfs.register()
    logging.getLogger("kstore").setLevel(logging.ERROR)
    if config.get("machine"):
        machine.install(config["machine"]["root"], config["machine"]["shadow"])
    if config.get("skew_s"):
        skew_clock(float(config["skew_s"]))
    if config.get("clock"):
        jumps.install(config["clock"])  # the run's jumps of time (tests/reliability/jumps.py)
    record = Recorder(config["history"])
    rng = random.Random(config["seed"])
    store = Store(config["url"], config["options"], create=False)
    # Up and running (imports and the store's first reads take seconds on a loaded machine):
    # the driver disturbs only processes that got this far.
    record("start", who=config["name"], role=role)
    never = threading.Event().is_set
    if role == "producer":
        produce_loop(store, config["name"], record, rng, never)
    elif role == "txn":
        txn_loop(store, config["name"], config["tid"], record, rng, never)
    elif role == "consumer":
        consume_loop(store, config["name"], record, never)
    elif role == "maintenance" and config["jobs"] == ["service"]:
        service_loop(store, config["name"], record, never)
    elif role == "maintenance":
        maintenance_loop(store, config["name"], list(config["jobs"]), record, rng, never)
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main()
