"""Requests and end-to-end latency on SeaweedFS (or local disk) as the partition count grows.

One producer process sends keyed 100-byte records at a fixed rate (linger 0, acks=1) to a topic
of 1, 8 or 64 partitions; one consumer in this process tails every partition and measures
send-to-receive time from the timestamp in each value. On SeaweedFS each side counts the S3
requests it sends (PUT, GET, HEAD, LIST, DELETE; ``Storage.count_requests``, every HTTP
attempt). Then the producer stops and the consumer polls an idle topic for ``--idle-seconds``:
its requests per poll. At the end of each case the topic's files are summed: the log (commits,
checkpoints, ``_last_checkpoint``: everything under ``_log*/``, plus ``_sidecars/``) against the
data (``_data/`` objects and ``segments/``).

The same record rate at every partition count, so what grows is what the format costs per
partition. Variants of the layout (``--layouts``: a flush's data carried in its commit, or a
data object per flush, or the topic log at format 5/6) run side by side: the cases take turns
over ``--rounds`` rounds, the variants alternating, and each figure is reported as the median
with its range over the rounds.
``--backend local`` measures latency on the local disk instead (no requests to count).

Each run replaces its own section (backend and rate) in benchmarks/results/requests.json and
keeps the others, so the 500 and 5,000 records/s runs sit side by side:

    .venv/bin/python benchmarks/requests.py --rate 5000 --seconds 10 --rounds 3
    .venv/bin/python benchmarks/requests.py --rate 500 --seconds 10 --rounds 3
    .venv/bin/python benchmarks/requests.py --backend local --rate 5000 --rounds 3

``--cost-example`` measures instead the shape of the cost example in docs/OPERATIONS.md: two
producer processes (linger 100 ms, ``--rate`` records/s between them) writing all 8 partitions
of one topic, and one consumer-group member's share (2 of the 8 partitions) read with the
consumer's defaults; its requests per producer delivery and per member, by kind. Then one
group of 4 members (the consumer's defaults) shares the topic while a producer writes
200 records/s: their requests to the group's files per member and second. Between the two,
the merge job (in this process) over what the two producers wrote: its requests per delivery:

    .venv/bin/python benchmarks/requests.py --cost-example --rate 5000 --seconds 15 --rounds 2
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import gc
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import RESULTS, percentile, table, write_results
from kstore import Store
from kstore.consumer import Consumer
from kstore.layout import topic_data_dir
from kstore.producer import Producer
from kstore.records import TopicPartition
from kstore.storage import Storage

TOPIC = "req"

PRODUCER_SCRIPT = r"""
import contextlib, collections, gc, json, struct, sys, time
from kstore import Store
from kstore.producer import Producer
url, options, rate, seconds = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
linger_ms, prefix, gc_freeze = int(sys.argv[5]), sys.argv[6].encode(), sys.argv[7] == "1"
compression = sys.argv[8] if len(sys.argv) > 8 else None
store = Store(url, options, create=False)
with Producer(store, acks=1, linger_ms=linger_ms, compression_type=compression) as producer:
    producer.partitions_for("req")
    if gc_freeze:  # OPERATIONS.md "Tail latency": the S3 client's objects out of every collection
        gc.collect()
        gc.freeze()
    before = producer.metrics()
    print("ready", flush=True)
    sys.stdin.readline()
    counting = store.storage.count_requests() if store.storage.counts_requests else contextlib.nullcontext(collections.Counter())
    with counting as counts:
        interval = 1.0 / rate
        start = time.perf_counter()
        i = 0
        while time.perf_counter() - start < seconds:
            due = start + i * interval
            now = time.perf_counter()
            if due > now:
                time.sleep(due - now)
            producer.send("req", struct.pack(">d", time.time()) + b"x" * 92, prefix + b"%d" % i)
            i += 1
        producer.flush()
        elapsed = time.perf_counter() - start
    after = producer.metrics()
    print(json.dumps({
        "sent": i,
        "elapsed": elapsed,
        "requests": dict(counts),
        "flushes": after["batch-total"] - before["batch-total"],
        "commits": after["commit-total"] - before["commit-total"],
    }), flush=True)
"""

RECORD_BYTES = 100 + 8  # value and a key of about 8 bytes


def topic_bytes(store: Store, topic: str) -> dict[str, int]:
    """Bytes of the topic's files by kind: ``log`` (everything under ``_log*/`` and
    ``_sidecars/``), of which ``checkpoint`` (checkpoint files, ``_last_checkpoint`` and
    sidecars), and ``data`` (``_data/`` objects and ``segments/``)."""
    meta = store.topic(topic)
    root = topic_data_dir(topic, meta.topic_id)
    # A storage of its own: the store's may hold commit files as they were read, before
    # vacuum removed their data (Storage.remember).
    storage = Storage(store.storage.url, store.storage.storage_options)
    sizes: list[tuple[str, int]] = []
    if storage.local_root is not None:
        base = storage.full_path(root)
        for folder, _, names in os.walk(base):
            for name in names:
                full = os.path.join(folder, name)
                sizes.append(
                    (os.path.relpath(full, base).replace(os.sep, "/"), os.path.getsize(full))
                )
    else:
        base = storage.full_path(root)
        storage.fs.invalidate_cache(base)
        for path, info in storage.fs.find(base, detail=True).items():
            sizes.append((path[len(base) :].lstrip("/"), int(info.get("size") or 0)))
    out = {"log": 0, "checkpoint": 0, "data": 0, "other": 0, "log_files": 0, "data_files": 0}
    for rel, size in sizes:
        parts = rel.split("/")
        name = parts[-1]
        if name.startswith(".tmp-"):
            continue
        if any(p.startswith("_log") for p in parts[:-1]) or parts[0] == "_sidecars":
            carried = carried_bytes(storage, f"{root}/{rel}") if name.endswith(".json") else 0
            out["data"] += carried  # the flush's data a commit carries (PROTOCOL.md 11.8)
            size -= carried
            out["log"] += size
            out["log_files"] += 1
            if ".checkpoint." in name or name == "_last_checkpoint" or parts[0] == "_sidecars":
                out["checkpoint"] += size
        elif parts[0] == "_data" or "segments" in parts[:-1]:
            out["data"] += size
            out["data_files"] += 1
        else:
            out["other"] += size
    return out


def carried_bytes(storage: Any, rel: str) -> int:
    """The bytes of data a commit file carries (``commitInfo.dataBytes``), from its first
    line; 0 for any other log file."""
    (head,) = storage.read_ranges(rel, [(0, 4096)])
    first = head.split(b"\n", 1)[0]
    if b'"dataBytes"' not in first:
        return 0
    try:
        return int(json.loads(first)["commitInfo"]["dataBytes"])
    except (ValueError, KeyError, TypeError):
        return 0


def load_now() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def busy_processes(limit: int = 8) -> list[str]:
    """The processes using the most CPU right now (what else ran), as ``ps`` shows them."""
    out = subprocess.run(
        ["ps", "-eo", "pcpu,etime,args", "--sort=-pcpu"], capture_output=True, text=True
    ).stdout.splitlines()
    return [line.strip()[:160] for line in out[1:] if "ps -eo" not in line][:limit]


@contextlib.contextmanager
def counting(store: Store) -> Iterator[collections.Counter[str]]:
    if store.storage.counts_requests:
        with store.storage.count_requests() as counts:
            yield counts
    else:
        yield collections.Counter()


def create_topic(store: Store, partitions: int, layout: str) -> None:
    """``layout``: "3", layout 3 as configured by default (a flush's data carried in its
    commit, PROTOCOL.md 11.8; a checkpoint's new sidecars in one file, 7.4); "3d", layout 3
    with a data object per flush (``commit.inline.bytes`` 0), the layout-3 format before
    version 5/6; "3v5", layout 3 with its topic log at 5/6 (a sidecar file per changed
    partition at each checkpoint), the format before 6/7."""
    config = {"commit.inline.bytes": 0} if layout == "3d" else None
    if layout != "3v5":
        store.create_topic(TOPIC, partitions=partitions, config=config)
        return
    # A topic log is created at the versions of the writer of its first commit: the topic
    # and that commit (one record, before the measured run) made as a writer of version 6.
    with contextlib.ExitStack() as older:
        for module in ("kstore.topic_log", "kstore.store"):
            older.enter_context(mock.patch(f"{module}.TOPIC_LOG_VERSION", 5))
            older.enter_context(mock.patch(f"{module}.TOPIC_LOG_WRITER_VERSION", 6))
        store.create_topic(TOPIC, partitions=partitions, layout=3)
        with Producer(store, acks=1) as producer:
            producer.send(TOPIC, struct.pack(">d", time.time()) + b"x" * 92, b"first")
    state = store.topic_logs(TOPIC)[0].state()
    assert (state.min_reader_version, state.min_writer_version) == (5, 6)


def run_case(
    url: str, options: dict[str, Any], partitions: int, layout: str, args: Any
) -> dict[str, Any]:
    load_before = load_now()
    store = Store(url, options)
    create_topic(store, partitions, layout)
    consumer = Consumer(
        TOPIC,
        store=store,
        auto_offset_reset="latest",
        fetch_max_wait_ms=args.fetch_max_wait_ms,
        max_poll_records=args.max_poll_records,
    )
    consumer.poll(timeout_ms=0)
    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    proc = start_producer(
        url,
        options,
        args.rate,
        args.seconds,
        linger_ms=0,
        prefix="k",
        gc_freeze=args.gc_freeze,
        compression=args.compression,
    )
    assert proc.stdout is not None
    assert proc.stdin is not None
    proc.stdout.readline()
    samples: list[float] = []
    with counting(store) as consumed:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        started = time.perf_counter()
        deadline = time.time() + args.seconds + args.drain_seconds
        expected = int(args.rate * args.seconds * 0.98)
        polls = 0
        while time.time() < deadline and len(samples) < expected:
            polls += 1
            for records in consumer.poll(timeout_ms=50).values():
                now = time.time()
                samples.extend((now - struct.unpack(">d", r.value[:8])[0]) * 1000 for r in records)
        consume_elapsed = time.perf_counter() - started
        consume_requests = dict(consumed)
    produced = json.loads(proc.stdout.readline())
    proc.wait()
    # Idle: the records still in flight are read first (a consumer that fell behind reads
    # them now), and only the polls that return nothing count, with the requests they sent.
    catch_up_end = time.time() + args.drain_seconds
    received = len(samples)
    while received < produced["sent"] and time.time() < catch_up_end:
        late = consumer.poll(timeout_ms=50)
        if not late:
            break
        received += sum(len(records) for records in late.values())
    idle_polls = 0
    idle_requests: collections.Counter[str] = collections.Counter()
    with counting(store) as idle:
        idle_end = time.perf_counter() + args.idle_seconds
        while time.perf_counter() < idle_end:
            sent_before = collections.Counter(idle)
            if not consumer.poll(timeout_ms=0):
                idle_polls += 1
                idle_requests.update(idle - sent_before)
            time.sleep(0.1)
    consumer.close()
    gc.unfreeze()
    files = topic_bytes(store, TOPIC)
    warm = samples[len(samples) // 10 :]  # the first tenth: connections and caches warming
    mb = produced["sent"] * RECORD_BYTES / 1e6
    produce_total = sum(produced["requests"].values())
    consume_total = sum(consume_requests.values())
    flushes = max(produced["flushes"], 1)
    return {
        "partitions": partitions,
        "layout": layout,
        "sent": produced["sent"],
        "received": len(samples),
        "p50_ms": percentile(warm, 50),
        "p99_ms": percentile(warm, 99),
        "flushes": produced["flushes"],
        "commits": produced["commits"],
        "commits_per_flush": produced["commits"] / flushes,
        "produce_requests": produced["requests"],
        "produce_requests_per_s": produce_total / produced["elapsed"],
        "produce_requests_per_mb": produce_total / mb,
        "produce_requests_per_flush": produce_total / flushes,
        "consume_polls": polls,
        "consume_requests": consume_requests,
        "consume_requests_per_s": consume_total / consume_elapsed,
        "consume_requests_per_mb": consume_total / mb,
        "idle_polls": idle_polls,
        "idle_requests_per_poll": sum(idle_requests.values()) / max(idle_polls, 1),
        "idle_requests": dict(idle_requests),
        "bytes": files,
        "checkpoint_pct_of_data": 100 * files["checkpoint"] / max(files["data"], 1),
        "log_pct_of_data": 100 * files["log"] / max(files["data"], 1),
        "load_before": load_before,
        "load_after": load_now(),
    }


def start_producer(
    url: str,
    options: dict[str, Any],
    rate: float,
    seconds: float,
    *,
    linger_ms: int,
    prefix: str,
    gc_freeze: bool = False,
    compression: str | None = None,
) -> subprocess.Popen[str]:
    """A producer process; it prints "ready", starts on a line of input, and prints its
    figures (records sent, requests, deliveries, commits) as one JSON line at the end."""
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            PRODUCER_SCRIPT,
            url,
            json.dumps(options),
            str(rate),
            str(seconds),
            str(linger_ms),
            prefix,
            "1" if gc_freeze else "0",
            *([compression] if compression else []),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def request_kind(url: str) -> str:
    """What a request to the topic's files reads: the topic metadata log, the topic or a
    partition log (commits, checkpoints), a data object (ranges) or a segment."""
    path = url.split("?", 1)[0]
    rest = path.split(f"/topics/{TOPIC}/", 1)[1] if f"/topics/{TOPIC}/" in path else ""
    if not rest:
        return "other"
    if rest.startswith("_log/"):
        return "topic metadata"
    if "/_data/" in rest:
        return "data object"
    if "/segments/" in rest:
        return "segment"
    if "/_sidecars/" in rest:
        return "sidecar"
    if "/_log" in rest:
        return "commit log"
    return "other"


@contextlib.contextmanager
def by_file(store: Store) -> Iterator[collections.Counter[str]]:
    """Requests to the topic's files while the block runs, by :func:`request_kind`."""
    kinds: collections.Counter[str] = collections.Counter()

    def classify(request: Any, **_: Any) -> None:
        kinds[request_kind(str(request.url))] += 1

    def classify_direct(method: str, key: str) -> None:
        kinds[request_kind(key)] += 1

    events = store.storage.s3_client().meta.events if store.storage.counts_requests else None
    direct = store.storage.direct_requests() if store.storage.counts_requests else None
    if events is not None:
        events.register("before-send.s3", classify)
    if direct is not None:
        direct.before_send.append(classify_direct)
    try:
        yield kinds
    finally:
        if events is not None:
            events.unregister("before-send.s3", classify)
        if direct is not None:
            direct.before_send.remove(classify_direct)


def run_cost_case(url: str, options: dict[str, Any], layout: str, args: Any) -> dict[str, Any]:
    """The shape of OPERATIONS.md's cost example: two producer processes (linger 100 ms)
    writing all 8 partitions of one topic, and one consumer-group member's share (partitions
    0 and 1, assigned) read with the consumer's defaults (``poll(timeout_ms=100)``, auto
    commit off: group-log requests are not counted here). Requests per producer delivery
    and per member, by kind."""
    load_before = load_now()
    store = Store(url, options)
    create_topic(store, 8, layout)
    member = Consumer(store=store, auto_offset_reset="latest", enable_auto_commit=False)
    member.assign([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
    member.poll(timeout_ms=0)
    procs = [
        start_producer(url, options, args.rate / 2, args.seconds, linger_ms=100, prefix=f"p{n}-")
        for n in range(2)
    ]
    for proc in procs:
        assert proc.stdout is not None
        proc.stdout.readline()
    received = polls = 0
    with counting(store) as counts, by_file(store) as kinds:
        started = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        end = started + args.seconds + 2
        while time.perf_counter() < end:
            polls += 1
            received += sum(len(r) for r in member.poll(timeout_ms=100).values())
        member_elapsed = time.perf_counter() - started
        member_requests = dict(counts)
    produced = []
    for proc in procs:
        assert proc.stdout is not None
        produced.append(json.loads(proc.stdout.readline()))
        proc.wait()
    member.close()
    # Before the group's phase, whose producer writes more: only the two producers' data.
    merge, merge_by_file = run_merge_phase(url, options)
    vacuumed, vacuum_by_file = run_vacuum_phase(url, options)
    group = run_group_phase(url, options, args)
    flushes = sum(p["flushes"] for p in produced)
    producer_requests: collections.Counter[str] = collections.Counter()
    for p in produced:
        producer_requests.update(p["requests"])
    elapsed = max(p["elapsed"] for p in produced)
    return {
        "layout": layout,
        "sent": sum(p["sent"] for p in produced),
        "flushes": flushes,
        "flushes_per_s": flushes / elapsed,
        "commits": sum(p["commits"] for p in produced),
        "producer_requests": dict(producer_requests),
        "producer_requests_per_flush": {
            k: v / max(flushes, 1) for k, v in producer_requests.items()
        },
        "member_received": received,
        "member_polls": polls,
        "member_requests": member_requests,
        "member_requests_per_s": {k: v / member_elapsed for k, v in member_requests.items()},
        "member_requests_per_flush": {k: v / max(flushes, 1) for k, v in member_requests.items()},
        "member_requests_by_file": dict(kinds),
        "member_requests_by_file_per_flush": {k: v / max(flushes, 1) for k, v in kinds.items()},
        "bytes": topic_bytes(store, TOPIC),
        **group,
        "merge_requests": merge,
        "merge_requests_per_flush": {k: v / max(flushes, 1) for k, v in merge.items()},
        "merge_requests_by_file_per_flush": {
            k: v / max(flushes, 1) for k, v in merge_by_file.items()
        },
        "vacuum_requests": vacuumed,
        "vacuum_requests_per_flush": {k: v / max(flushes, 1) for k, v in vacuumed.items()},
        "vacuum_requests_by_file_per_flush": {
            k: v / max(flushes, 1) for k, v in vacuum_by_file.items()
        },
        "load_before": load_before,
        "load_after": load_now(),
    }


def run_merge_phase(url: str, options: dict[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """The merge job (in this process, as ``kstore maintain`` runs it) over what the producers
    wrote: its requests by kind and by file, counted on a store of its own."""
    from kstore.compaction import merge_segments

    store = Store(url, options, create=False, segment_cache_bytes=0)
    with counting(store) as counts, by_file(store) as kinds:
        summary = merge_segments(None, store, topics=[TOPIC], verbose=False)
    if summary.errors:
        raise SystemExit(f"the merge failed: {summary.errors[0].reason}")
    return dict(counts), dict(kinds)


def run_vacuum_phase(url: str, options: dict[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """Vacuum (in this process) right after the merge, at a time when the merge's removals
    are due (``file.delete.delay.ms`` past) and the log retention is not: in layout 3 the
    data objects the merge rewrote are deleted (DELETE, free on S3), or the commits that
    carried the data lose it (a GET and a PUT each, PROTOCOL.md 22.5). Its requests by
    kind and by file."""
    from kstore.retention import vacuum

    store = Store(url, options, create=False)
    delay = int(store.topic(TOPIC).effective_config["file.delete.delay.ms"])
    with counting(store) as counts, by_file(store) as kinds:
        summary = vacuum(
            None, store, topics=[TOPIC], verbose=False, now_ms=int(time.time() * 1000) + 2 * delay
        )
    if summary.errors:
        raise SystemExit(f"vacuum failed: {summary.errors[0].reason}")
    return dict(counts), dict(kinds)


GROUP_MEMBERS = 4


def run_group_phase(url: str, options: dict[str, Any], args: Any) -> dict[str, Any]:
    """One of the cost example's groups: GROUP_MEMBERS members (each with a Store of its own,
    as in separate processes) share the topic's partitions with the consumer's defaults
    (``heartbeat_interval_ms`` 3 s, auto-commit every 5 s, ``poll(timeout_ms=100)`` taking
    turns) while one producer writes 200 records/s, so that positions move and auto-commits
    happen. After the members have settled (5 s), their requests to the group's files
    (``groups/``: the group log, the members' leases) are counted for ``args.seconds``; per
    member per second, by method."""
    members = [
        Consumer(
            TOPIC, store=Store(url, options), group_id="cost-group", auto_offset_reset="latest"
        )
        for _ in range(GROUP_MEMBERS)
    ]
    proc = start_producer(url, options, 200, args.seconds + 6, linger_ms=100, prefix="g-")
    assert proc.stdout is not None
    assert proc.stdin is not None
    proc.stdout.readline()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    kinds: collections.Counter[str] = collections.Counter()
    counting_now = [False]

    def group_file(text: str) -> bool:
        return "groups/" in text or "groups%2F" in text

    def classify(request: Any, **_: Any) -> None:
        url_text = str(request.url)
        if counting_now[0] and group_file(url_text):
            kinds["LIST" if "list-type" in url_text else str(request.method)] += 1

    def classify_direct(method: str, key: str) -> None:
        if counting_now[0] and group_file(key):
            kinds[method] += 1

    storage = members[0].store.storage
    events = storage.s3_client().meta.events if storage.counts_requests else None
    direct = storage.direct_requests() if storage.counts_requests else None
    if events is not None:
        events.register("before-send.s3", classify)
    if direct is not None:
        direct.before_send.append(classify_direct)
    try:
        settle = time.perf_counter() + 5
        while time.perf_counter() < settle:
            for m in members:
                m.poll(timeout_ms=25)
        counting_now[0] = True
        started = time.perf_counter()
        while time.perf_counter() - started < args.seconds:
            for m in members:
                m.poll(timeout_ms=100 / GROUP_MEMBERS)
        elapsed = time.perf_counter() - started
        counting_now[0] = False
    finally:
        if events is not None:
            events.unregister("before-send.s3", classify)
        if direct is not None:
            direct.before_send.remove(classify_direct)
        for m in members:
            m.close()
        proc.communicate()
    return {
        "group_members": GROUP_MEMBERS,
        "group_requests_per_member_per_s": {
            k: v / GROUP_MEMBERS / elapsed for k, v in kinds.items()
        },
    }


# (column, key in a run) of the summary rows: medians over the rounds, with their ranges.
COLUMNS = [
    ("p50 ms", "p50_ms"),
    ("p99 ms", "p99_ms"),
    ("prod req/s", "produce_requests_per_s"),
    ("prod req/MB", "produce_requests_per_mb"),
    ("prod req/flush", "produce_requests_per_flush"),
    ("commits/flush", "commits_per_flush"),
    ("cons req/s", "consume_requests_per_s"),
    ("cons req/MB", "consume_requests_per_mb"),
    ("idle req/poll", "idle_requests_per_poll"),
    ("ckpt % data", "checkpoint_pct_of_data"),
    ("log % data", "log_pct_of_data"),
]


def summarise(
    runs: list[dict[str, Any]], counts: list[int], layouts: list[str]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for layout in layouts:
        first_total: float | None = None
        for p in counts:
            mine = [r for r in runs if r["layout"] == layout and r["partitions"] == p]
            if not mine:
                continue
            row: dict[str, Any] = {"layout": layout, "partitions": p, "rounds": len(mine)}
            for column, key in COLUMNS:
                values = [r[key] for r in mine]
                row[column] = statistics.median(values)
                row[column + " range"] = [min(values), max(values)]
            total = row["prod req/s"] + row["cons req/s"]
            if first_total is None:
                first_total = total
            row["total req/s vs first"] = total / first_total if first_total else float("nan")
            rows.append(row)
    return rows


def summarise_cost(runs: list[dict[str, Any]], layouts: list[str]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for layout in layouts:
        mine = [r for r in runs if r["layout"] == layout]
        row: dict[str, Any] = {"layout": layout, "rounds": len(mine)}
        row["flushes/s"] = statistics.median(r["flushes_per_s"] for r in mine)
        for side in ("producer", "member"):
            for kind in ("PUT", "GET", "LIST"):
                key = f"{side}_requests_per_flush"
                row[f"{side} {kind}/flush"] = statistics.median(r[key].get(kind, 0) for r in mine)
        row["member GET/s"] = statistics.median(
            r["member_requests_per_s"].get("GET", 0) for r in mine
        )
        for kind in ("PUT", "GET"):
            row[f"merge {kind}/flush"] = statistics.median(
                r.get("merge_requests_per_flush", {}).get(kind, 0) for r in mine
            )
        for files in ("data object", "commit log"):
            row[f"merge {files}s/flush"] = statistics.median(
                r.get("merge_requests_by_file_per_flush", {}).get(files, 0) for r in mine
            )
        for kind in ("PUT", "GET", "LIST", "DELETE"):
            row[f"vacuum {kind}/flush"] = statistics.median(
                r.get("vacuum_requests_per_flush", {}).get(kind, 0) for r in mine
            )
        grouped = [r for r in mine if "group_requests_per_member_per_s" in r]
        for kind in ("PUT", "GET", "LIST") if grouped else ():
            row[f"group member {kind}/s"] = statistics.median(
                r["group_requests_per_member_per_s"].get(kind, 0) for r in grouped
            )
        rows.append(row)
    return rows


def parse_ints(text: str, what: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{what} must be integers separated by commas, got {text!r}") from None
    if not values:
        raise SystemExit(f"{what} is empty")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rate", type=float, default=500.0, help="records per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle-seconds", type=float, default=3.0)
    parser.add_argument(
        "--max-poll-records", type=int, default=500, help="the consumer's (500: Kafka's default)"
    )
    parser.add_argument(
        "--drain-seconds", type=float, default=30.0, help="how long the consumer may lag"
    )
    parser.add_argument("--partitions", default="1,8,64")
    parser.add_argument(
        "--compression",
        choices=["zstd", "lz4"],
        help="the latency producer's compression_type (default: the topic's, uncompressed)",
    )
    parser.add_argument(
        "--layouts",
        default="3d,3",
        help="layout variants to run side by side: 3 (data carried in commits, the default); 3d "
        "(layout 3 with a data object per flush, commit.inline.bytes=0); 3v5 (layout 3 at "
        "format 5/6: a sidecar file per changed partition at each checkpoint)",
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--fetch-max-wait-ms",
        type=int,
        default=5,
        help="the consumer's fetch_max_wait_ms (5 by default here; the consumer's own default is 100)",
    )
    parser.add_argument("--backend", choices=["seaweedfs", "local"], default="seaweedfs")
    parser.add_argument(
        "--cost-example",
        action="store_true",
        help="two producers (linger 100 ms) on 8 partitions and one member reading 2 of them",
    )
    parser.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() in the producer and consumer once their clients are open "
        "(OPERATIONS.md, Tail latency)",
    )
    args = parser.parse_args()
    counts = parse_ints(args.partitions, "--partitions")
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    if not layouts or any(layout not in ("3", "3d", "3v5") for layout in layouts):
        raise SystemExit(f"--layouts must name 3, 3d and/or 3v5, got {args.layouts!r}")
    if args.rate <= 0 or args.seconds <= 0 or args.rounds < 1 or args.max_poll_records < 1:
        raise SystemExit(
            "--rate and --seconds must be positive, --rounds and --max-poll-records at least 1"
        )

    section = f"{'cost-example' if args.cost_example else args.backend}@{args.rate:g}"
    if args.max_poll_records != 500:
        section += f" max_poll_records={args.max_poll_records}"
    if args.gc_freeze:
        section += " gc-freeze"
    if args.compression:
        section += f" {args.compression}"
    if args.fetch_max_wait_ms != 5:
        section += f" fetch_max_wait_ms={args.fetch_max_wait_ms}"
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    before = {"load": load_now(), "busiest": busy_processes()}
    runs: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="kstore-bench-req-"))
    server: Any = None
    if args.backend == "seaweedfs":
        from tests.servers import SeaweedServer

        server = SeaweedServer(work / "seaweed")
        server.start()
    try:
        for round_no in range(args.rounds):
            # Every case once per round; the layouts alternate, and which goes first swaps
            # each round, so a slow spell of the shared machine falls on both alike.
            order = layouts if round_no % 2 == 0 else layouts[::-1]
            if args.cost_example:
                for layout in order:
                    if server is not None:
                        url, options = server.new_store_url(f"cost-l{layout}")
                    else:
                        url, options = str(work / f"cost-l{layout}-{round_no}"), {}
                    result = run_cost_case(url, options, layout, args)
                    result["round"] = round_no
                    runs.append(result)
                    print(json.dumps(result), flush=True)
                continue
            for partitions in counts:
                for layout in order:
                    name = f"req-l{layout}-{partitions}"
                    if server is not None:
                        url, options = server.new_store_url(name)
                    else:
                        url, options = str(work / f"{name}-{round_no}"), {}
                    result = run_case(url, options, partitions, layout, args)
                    result["round"] = round_no
                    runs.append(result)
                    brief = {
                        k: v for k, v in result.items() if "requests" not in k and k != "bytes"
                    }
                    print(json.dumps(brief), flush=True)
    finally:
        if server is not None:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)

    rows = summarise_cost(runs, layouts) if args.cost_example else summarise(runs, counts, layouts)
    shown = ["layout", "partitions", *(c for c, _ in COLUMNS), "total req/s vs first"]
    if args.cost_example:
        shown = list(dict.fromkeys(k for row in rows for k in row))
    elif args.backend == "local":
        shown = [
            "layout",
            "partitions",
            "p50 ms",
            "p99 ms",
            "commits/flush",
            "ckpt % data",
            "log % data",
        ]
    print(table(rows, shown))

    # One section per backend and rate; the sections of other runs are kept.
    previous_path = RESULTS / "requests.json"
    sections: dict[str, Any] = {}
    if previous_path.exists():
        with contextlib.suppress(ValueError):
            sections = dict(json.loads(previous_path.read_text()).get("sections", {}))
    sections[section] = {
        "command": " ".join([os.path.relpath(sys.executable, RESULTS.parent.parent), *sys.argv]),
        "started": started_at,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine_before": before,
        "machine_after": {"load": load_now(), "busiest": busy_processes()},
        "args": vars(args),
        "rows": rows,
        "runs": runs,
    }
    print(f"\nwrote {write_results('requests', {'sections': dict(sorted(sections.items()))})}")


if __name__ == "__main__":
    main()
