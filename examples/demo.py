"""The end-to-end demo (``make demo``): the whole product working together on a local store.

1. creates ``clicks`` (8 partitions, delete policy, one hour of retention) and ``profiles``
   (compacted);
2. a producer writes click events keyed by user (the first half two hours old, the rest
   recent) and profile updates, including tombstones;
3. a Structured Streaming query counts clicks per page and minute into a Delta table, exactly
   once (Delta app transactions), with a ``groupId`` so its lag is visible;
4. the group's lag, as ``kstore groups describe`` shows it, falls to zero;
5. compaction runs on ``profiles`` and retention on ``clicks``; the topics' descriptions show
   the effect;
6. a replay reads ``clicks`` from a timestamp, as an event-sourcing rebuild would;
7. a summary with the throughput of each step.

Run: ``make demo`` or ``.venv/bin/python examples/demo.py [--clicks N] [--dir PATH]``.
Re-running starts clean (the demo directory is recreated).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from kstore import Store
from kstore.consumer import Consumer
from kstore.groups import describe_group
from kstore.producer import Producer

console = Console(highlight=False)
PAGES = [f"/page/{i}" for i in range(20)]
HOUR_MS = 3_600_000


@dataclass
class Results:
    clicks: int = 0
    profile_keys_live: int = 0
    delta_total: int = 0
    compacted_records: int = 0
    replayed: int = 0
    lag_seen: list[int] = field(default_factory=list)
    steps: list[tuple[str, float, str]] = field(default_factory=list)


def step(results: Results, name: str, started: float, detail: str) -> None:
    elapsed = time.perf_counter() - started
    results.steps.append((name, elapsed, detail))
    console.print(f"[green]done[/] {name} in {elapsed:.1f} s: {detail}")


def create_topics(store: Store) -> None:
    store.create_topic(
        "clicks", partitions=8, config={"cleanup.policy": "delete", "retention.ms": HOUR_MS}
    )
    store.create_topic(
        "profiles",
        partitions=2,
        config={
            "cleanup.policy": "compact",
            "min.cleanable.dirty.ratio": 0.1,
            "delete.retention.ms": 0,
        },
    )


def produce(store: Store, clicks: int, results: Results) -> None:
    now = int(time.time() * 1000)
    old = now - 2 * HOUR_MS
    with Producer(store, acks=1, linger_ms=5) as producer, Progress(console=console) as progress:
        task = progress.add_task("clicks", total=clicks)
        half = clicks // 2
        for i in range(clicks):
            user = b"user-%d" % (i % 5_000)
            page = PAGES[(i * 7) % len(PAGES)].encode()
            # The first half is two hours old: past the topic's one-hour retention.
            ts = old + i * 10 if i < half else now - (clicks - i) * 2
            producer.send("clicks", key=user, value=page, timestamp_ms=ts)
            if i == half - 1:
                producer.flush()  # the old events make whole segments of their own
            if i % 5_000 == 0:
                progress.update(task, completed=i)
        producer.flush()
        progress.update(task, completed=clicks)
        live: dict[bytes, bytes | None] = {}
        for i in range(3_000):  # profile updates: 1,000 users, 3 versions each, some deleted
            user = b"user-%d" % (i % 1_000)
            value = None if (i >= 2_000 and i % 7 == 0) else b'{"version": %d}' % (i // 1_000)
            producer.send("profiles", key=user, value=value)
            live[user] = value
        producer.flush()
    results.clicks = clicks
    results.profile_keys_live = sum(1 for v in live.values() if v is not None)


def stream_to_delta(
    spark: Any, url: str, table: str, checkpoint: str, store: Store, results: Results
) -> None:
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    app_id = "demo-clicks-per-minute"

    def write(batch: Any, batch_id: int) -> None:
        if DeltaTable.is_deltatable(table):
            done = DeltaTable(table).transaction_version(app_id)
            if done is not None and done >= batch_id:
                return  # a replayed micro-batch: already counted (exactly once)
        counts = (
            batch.selectExpr(
                "date_trunc('minute', timestamp) AS minute", "CAST(value AS STRING) AS page"
            )
            .groupBy("minute", "page")
            .count()
            .toArrow()
        )
        if counts.num_rows:
            write_deltalake(
                table,
                counts,
                mode="append",
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(app_id, batch_id)]
                ),
            )

    query = (
        spark.readStream.format("kstore")
        .option("store", url)
        .option("subscribe", "clicks")
        .option("startingOffsets", "earliest")
        .option("groupId", "clicks-per-minute")
        .option("maxOffsetsPerTrigger", max(1, results.clicks // 6))
        .load()
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    while query.isActive:  # the lag as group tools see it, while the query works
        group = describe_group(store, "clicks-per-minute")
        lag = group.total_lag
        if group.state != "Dead" and (not results.lag_seen or lag != results.lag_seen[-1]):
            results.lag_seen.append(lag)
            console.print(f"  group clicks-per-minute: lag {lag:,}")
        time.sleep(0.5)
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"streaming query failed: {query.exception()}")
    results.lag_seen.append(describe_group(store, "clicks-per-minute").total_lag)
    counted = (
        spark.read.parquet(*DeltaTable(table).file_uris()).agg({"count": "sum"}).collect()[0][0]
    )
    results.delta_total = int(counted or 0)


def show_group(store: Store) -> None:
    group = describe_group(store, "clicks-per-minute")
    table = Table(title="kstore groups describe clicks-per-minute")
    for column in ("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG"):
        table.add_column(column)
    for p in group.partitions:
        table.add_row(
            p.topic, str(p.partition), str(p.current_offset), str(p.log_end_offset), str(p.lag)
        )
    console.print(table)


def show_topics(store: Store, title: str) -> None:
    table = Table(title=title)
    for column in ("TOPIC", "PARTITION", "LOG-START", "LOG-END", "RECORDS", "SEGMENTS", "BYTES"):
        table.add_column(column)
    for name in ("clicks", "profiles"):
        for p in store.describe_topic(name).partitions:
            table.add_row(
                name,
                str(p.partition),
                str(p.log_start_offset),
                str(p.log_end_offset),
                str(p.records),
                str(p.segments),
                f"{p.size_bytes:,}",
            )
    console.print(table)


def maintain(spark: Any, url: str, results: Results) -> None:
    from kstore.compaction import run_compaction
    from kstore.retention import run_retention

    compaction = run_compaction(spark, url, topics=["profiles"], verbose=False)
    retention = run_retention(spark, url, topics=["clicks"], verbose=False)
    console.print(f"  compaction: {compaction.format().splitlines()[0]}")
    console.print(f"  retention:  {retention.format().splitlines()[0]}")


def replay(store: Store, results: Results) -> None:
    since = int(time.time() * 1000) - HOUR_MS  # an event-sourcing rebuild of the last hour
    with Consumer(store=store, auto_offset_reset="earliest", consumer_timeout_ms=1_000) as consumer:
        consumer.subscribe(["clicks"])
        consumer.poll(timeout_ms=0)
        starts = consumer.offsets_for_times(dict.fromkeys(consumer.assignment(), since))
        for tp, found in starts.items():
            if found is None:
                consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, found.offset)
        total = 0
        while batches := consumer.poll_batches(timeout_ms=500, max_records=100_000):
            total += sum(b.num_rows for bs in batches.values() for b in bs)
    results.replayed = total


def count_compacted(store: Store) -> int:
    with Consumer(
        "profiles", store=store, auto_offset_reset="earliest", consumer_timeout_ms=1_000
    ) as consumer:
        return sum(1 for r in consumer if r.value is not None)


def run(directory: Path, clicks: int, spark: Any = None) -> Results:
    shutil.rmtree(directory, ignore_errors=True)  # re-running starts clean
    directory.mkdir(parents=True)
    url = (directory / "store").as_uri()
    store = Store(url)
    results = Results()
    own_spark = spark is None
    if own_spark:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        from pyspark.sql import SparkSession

        spark = (
            SparkSession.builder.master("local[2]")
            .appName("kstore-demo")
            .config("spark.sql.shuffle.partitions", "4")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
    from kstore.spark_ext import register

    register(spark)
    try:
        console.rule("1. topics")
        started = time.perf_counter()
        create_topics(store)
        step(
            results,
            "create topics",
            started,
            "clicks (8 partitions, 1 h retention), profiles (compacted)",
        )

        console.rule("2. produce")
        started = time.perf_counter()
        produce(store, clicks, results)
        rate = (clicks + 3_000) / (time.perf_counter() - started)
        step(
            results,
            "produce",
            started,
            f"{clicks:,} clicks and 3,000 profile updates, {rate:,.0f} records/s",
        )

        console.rule("3-4. stream into Delta, exactly once; group lag")
        started = time.perf_counter()
        stream_to_delta(
            spark, url, str(directory / "delta"), str(directory / "checkpoint"), store, results
        )
        elapsed = time.perf_counter() - started
        show_group(store)
        step(
            results,
            "stream to Delta",
            started,
            f"{results.delta_total:,} clicks counted, {clicks / elapsed:,.0f} records/s; lag {results.lag_seen}",
        )

        console.rule("5. compaction and retention")
        show_topics(store, "kstore topics describe (before)")
        started = time.perf_counter()
        maintain(spark, url, results)
        show_topics(store, "kstore topics describe (after)")
        results.compacted_records = count_compacted(store)
        step(
            results,
            "compaction + retention",
            started,
            f"profiles: {results.compacted_records:,} live records for {results.profile_keys_live:,} live keys",
        )

        console.rule("6. replay from a timestamp")
        started = time.perf_counter()
        replay(store, results)
        step(
            results,
            "replay last hour",
            started,
            f"{results.replayed:,} clicks, {results.replayed / max(1e-9, time.perf_counter() - started):,.0f} records/s",
        )
    finally:
        if own_spark:
            spark.stop()

    console.rule("7. summary")
    summary = Table(title="kstore demo")
    summary.add_column("step")
    summary.add_column("seconds", justify="right")
    summary.add_column("what happened")
    for name, seconds, detail in results.steps:
        summary.add_row(name, f"{seconds:.1f}", detail)
    console.print(summary)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="kstore end-to-end demo")
    parser.add_argument("--clicks", type=int, default=300_000)
    parser.add_argument("--dir", type=Path, default=Path(".demo"))
    args = parser.parse_args(argv)
    results = run(args.dir.resolve(), args.clicks)
    ok = (
        results.delta_total == results.clicks
        and results.compacted_records == results.profile_keys_live
    )
    console.print("[bold green]demo OK[/]" if ok else "[bold red]demo results do not add up[/]")
    return 0 if ok else 1


if __name__ == "__main__":
    threading.excepthook = lambda args: console.print(f"[red]thread error:[/] {args.exc_value}")
    from kstore.cli.common import exit_process

    exit_process(main())  # not the teardown that can abort once deltalake is loaded
