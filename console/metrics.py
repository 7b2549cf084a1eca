"""``/metrics``: the newest :class:`~kstore.console.snapshot.Snapshot` in Prometheus's text
format, through ``prometheus_client``.

Group lag carries kafka-lag-exporter's names and labels (``kafka_consumergroup_group_lag``,
``..._lag_seconds``, ``..._max_lag_seconds``, ``kafka_partition_latest_offset``, ...), the
offsets and lag also kafka_exporter's (``kafka_consumergroup_lag``,
``kafka_topic_partition_current_offset``, ...), so that dashboards and alerts made for either
work unchanged; what Kafka has no name for is ``kstore_*``. docs/CONSOLE.md lists every one.
A scrape reads no storage: it formats the snapshot the refresh thread keeps.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

if TYPE_CHECKING:
    from .snapshot import RunCounts, Snapshot, Snapshots

_GROUP_PARTITION = [
    "cluster_name",
    "group",
    "topic",
    "partition",
    "member_host",
    "consumer_id",
    "client_id",
]
_GROUP_MAX = ["cluster_name", "group", "is_simple_consumer"]
_TP = ["topic", "partition"]


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class StoreCollector(Collector):
    """Metric families built at each scrape from the newest snapshot (and the process's own
    counters: maintenance runs, storage requests)."""

    def __init__(
        self,
        snapshots: Snapshots,
        *,
        cluster_name: str,
        requests: collections.Counter[str] | None = None,
        runs: RunCounts | None = None,
        redact: Callable[[str], str] = lambda text: text,
    ) -> None:
        self.snapshots = snapshots
        self.cluster_name = redact(cluster_name)
        self.requests = requests
        self.runs = runs
        self.redact = redact

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshots.latest()
        yield from self._console(snap)
        if self.requests is not None:
            requests = CounterMetricFamily(
                "kstore_storage_requests",
                "Storage requests this process sent, by kind (S3: GET, PUT, HEAD, LIST, DELETE).",
                labels=["kind"],
            )
            for kind, count in sorted(self.requests.copy().items()):
                requests.add_metric([kind], count)
            yield requests
        if self.runs is not None:
            yield from self._runs(self.runs)
        if snap is None:
            return
        yield from self._partitions(snap)
        yield from self._groups(snap)
        yield from self._maintenance(snap)

    # -- the exporter itself --------------------------------------------------------------------

    def _console(self, snap: Snapshot | None) -> Iterator[Metric]:
        up = _gauge("kstore_up", "1 when the newest refresh read the store, else 0.", [])
        up.add_metric([], 0 if snap is None or self.snapshots.failure() is not None else 1)
        yield up
        refreshes = CounterMetricFamily(
            "kstore_refreshes", "Refreshes of the store's snapshot, by result.", labels=["result"]
        )
        refreshes.add_metric(["ok"], self.snapshots.refreshes)
        refreshes.add_metric(["error"], self.snapshots.failures)
        yield refreshes
        if snap is None:
            return
        taken = _gauge(
            "kstore_snapshot_timestamp_seconds", "When the snapshot shown was taken.", []
        )
        taken.add_metric([], snap.taken_ms / 1000)
        yield taken
        took = _gauge("kstore_snapshot_duration_seconds", "How long its refresh took.", [])
        took.add_metric([], snap.elapsed_s)
        yield took
        calls = _gauge(
            "kstore_snapshot_storage_calls",
            "Storage calls its refresh sent (each path read at most once a refresh).",
            [],
        )
        calls.add_metric([], snap.storage_calls)
        yield calls

    def _runs(self, runs: RunCounts) -> Iterator[Metric]:
        counts, removed = runs.copy()
        total = CounterMetricFamily(
            "kstore_maintenance_runs",
            "Maintenance task runs this process made, by task and outcome.",
            labels=["task", "outcome"],
        )
        for (task, outcome), n in sorted(counts.items()):
            total.add_metric([task, outcome], n)
        yield total
        for unit in ("records", "bytes", "segments"):
            family = CounterMetricFamily(
                f"kstore_maintenance_removed_{unit}",
                f"The {unit} this process's maintenance runs removed, by task.",
                labels=["task"],
            )
            for (task, what), n in sorted(removed.items()):
                if what == unit:
                    family.add_metric([task], n)
            yield family

    # -- topics and partitions -------------------------------------------------------------------

    def _partitions(self, snap: Snapshot) -> Iterator[Metric]:
        c = self.cluster_name
        latest = _gauge(
            "kafka_partition_latest_offset",
            "The log end offset of a partition (the next offset to be written).",
            ["cluster_name", "topic", "partition"],
        )
        earliest = _gauge(
            "kafka_partition_earliest_offset",
            "The log start offset of a partition (the first offset readable).",
            ["cluster_name", "topic", "partition"],
        )
        count = _gauge("kafka_topic_partitions", "Partitions of a topic.", ["topic"])
        current = _gauge(
            "kafka_topic_partition_current_offset", "A partition's log end offset.", _TP
        )
        oldest = _gauge(
            "kafka_topic_partition_oldest_offset", "A partition's log start offset.", _TP
        )
        records = _gauge("kstore_partition_records", "Live records of a partition.", _TP)
        size = _gauge("kstore_partition_bytes", "Bytes of a partition's live segments.", _TP)
        segments = _gauge("kstore_partition_segments", "Live segments of a partition.", _TP)
        oldest_ts = _gauge(
            "kstore_partition_oldest_timestamp_seconds",
            "The oldest record timestamp of a partition's live segments.",
            _TP,
        )
        newest_ts = _gauge(
            "kstore_partition_newest_timestamp_seconds",
            "The newest record timestamp of a partition's live segments.",
            _TP,
        )
        producers = _gauge(
            "kstore_partition_producers", "Producers a partition's manifest remembers.", _TP
        )
        readable = _gauge(
            "kstore_topic_readable", "1 when the topic's logs could be read, else 0.", ["topic"]
        )
        for name, facts in sorted(snap.topics.items()):
            readable.add_metric([name], 0 if facts.description is None else 1)
            if facts.description is None:
                continue
            count.add_metric([name], facts.description.metadata.partitions)
            for p in facts.description.partitions:
                labels = [name, str(p.partition)]
                latest.add_metric([c, *labels], p.log_end_offset)
                earliest.add_metric([c, *labels], p.log_start_offset)
                current.add_metric(labels, p.log_end_offset)
                oldest.add_metric(labels, p.log_start_offset)
                records.add_metric(labels, p.records)
                size.add_metric(labels, p.size_bytes)
                segments.add_metric(labels, p.segments)
                if p.oldest_timestamp_ms is not None:
                    oldest_ts.add_metric(labels, p.oldest_timestamp_ms / 1000)
                if p.newest_timestamp_ms is not None:
                    newest_ts.add_metric(labels, p.newest_timestamp_ms / 1000)
                producers.add_metric(labels, len(facts.producers.get(p.partition, ())))
        yield from (latest, earliest, count, current, oldest, records, size, segments)
        yield from (oldest_ts, newest_ts, producers, readable)

    # -- consumer groups --------------------------------------------------------------------------

    def _groups(self, snap: Snapshot) -> Iterator[Metric]:
        c = self.cluster_name
        offset = _gauge(
            "kafka_consumergroup_group_offset",
            "The group's committed offset on a partition (the next offset it reads).",
            _GROUP_PARTITION,
        )
        lag = _gauge(
            "kafka_consumergroup_group_lag",
            "Records between the group's committed offset and the log end offset.",
            _GROUP_PARTITION,
        )
        lag_s = _gauge(
            "kafka_consumergroup_group_lag_seconds",
            "Age of the next record the group would read (0 when caught up), estimated from "
            "the manifest's segment timestamps.",
            _GROUP_PARTITION,
        )
        max_lag = _gauge(
            "kafka_consumergroup_group_max_lag", "The group's highest partition lag.", _GROUP_MAX
        )
        max_lag_s = _gauge(
            "kafka_consumergroup_group_max_lag_seconds",
            "The group's highest partition lag in seconds.",
            _GROUP_MAX,
        )
        sum_lag = _gauge(
            "kafka_consumergroup_group_sum_lag",
            "The group's lag summed over its partitions.",
            ["cluster_name", "group"],
        )
        topic_sum = _gauge(
            "kafka_consumergroup_group_topic_sum_lag",
            "The group's lag summed over one topic's partitions.",
            ["cluster_name", "group", "topic"],
        )
        ke_offset = _gauge(
            "kafka_consumergroup_current_offset",
            "The group's committed offset on a partition (kafka_exporter's name).",
            ["consumergroup", "topic", "partition"],
        )
        ke_lag = _gauge(
            "kafka_consumergroup_lag",
            "The group's lag on a partition (kafka_exporter's name).",
            ["consumergroup", "topic", "partition"],
        )
        ke_sum = _gauge(
            "kafka_consumergroup_lag_sum",
            "The group's lag summed over a topic (kafka_exporter's name).",
            ["consumergroup", "topic"],
        )
        members = _gauge(
            "kafka_consumergroup_members", "Live members of a group.", ["consumergroup"]
        )
        uncommitted = _gauge(
            "kstore_consumergroup_uncommitted_partitions",
            "Partitions the group reads with no committed offset (their lag is unknown).",
            ["group"],
        )
        readable = _gauge(
            "kstore_consumergroup_readable",
            "1 when the group's log could be read, else 0.",
            ["group"],
        )
        for name, facts in sorted(snap.groups.items()):
            readable.add_metric([name], 0 if facts.description is None else 1)
            desc = facts.description
            if desc is None:
                continue
            members.add_metric([name], len(desc.members))
            uncommitted.add_metric([name], desc.uncommitted)
            simple = "true" if desc.assignor is None and not desc.members else "false"
            by_topic: dict[str, int] = {}
            for p in facts.partitions:
                if p.current_offset is None or p.lag is None:
                    continue  # lag unknown: as kafka-lag-exporter, no series
                labels = [
                    c,
                    name,
                    p.topic,
                    str(p.partition),
                    "",
                    p.member_id or "",
                    self.redact(p.client_id or ""),
                ]
                offset.add_metric(labels, p.current_offset)
                lag.add_metric(labels, p.lag)
                lag_s.add_metric(labels, p.lag_seconds or 0.0)
                ke_offset.add_metric([name, p.topic, str(p.partition)], p.current_offset)
                ke_lag.add_metric([name, p.topic, str(p.partition)], p.lag)
                by_topic[p.topic] = by_topic.get(p.topic, 0) + p.lag
            max_lag.add_metric([c, name, simple], facts.max_lag)
            max_lag_s.add_metric([c, name, simple], facts.max_lag_seconds)
            sum_lag.add_metric([c, name], sum(by_topic.values()))
            for topic, total in sorted(by_topic.items()):
                topic_sum.add_metric([c, name, topic], total)
                ke_sum.add_metric([name, topic], total)
        yield from (offset, lag, lag_s, max_lag, max_lag_s, sum_lag, topic_sum)
        yield from (ke_offset, ke_lag, ke_sum, members, uncommitted, readable)

    # -- maintenance -----------------------------------------------------------------------------

    def _maintenance(self, snap: Snapshot) -> Iterator[Metric]:
        data = snap.maintenance
        if data is None:
            return
        task_labels = ["topic", "task"]
        last = _gauge(
            "kstore_maintenance_last_run_timestamp_seconds",
            "When a task last finished on a topic ('' for the store's own tasks), by outcome.",
            ["topic", "task", "outcome"],
        )
        last_removed = {
            unit: _gauge(
                f"kstore_maintenance_last_run_removed_{unit}",
                f"The {unit} a task's last run on a topic removed.",
                task_labels,
            )
            for unit in ("records", "bytes", "segments", "files")
        }
        due = _gauge(
            "kstore_maintenance_task_due", "1 when a task is due on a topic now.", task_labels
        )
        upcoming = _gauge(
            "kstore_maintenance_next_due_timestamp_seconds",
            "When a task that is not due yet becomes due on a topic.",
            task_labels,
        )
        running = _gauge(
            "kstore_maintenance_task_running",
            "1 while a maintainer holds the task's lease.",
            task_labels,
        )
        open_txns = _gauge(
            "kstore_partition_open_transactions", "Open transactions on a partition.", _TP
        )
        txn_age = _gauge(
            "kstore_partition_oldest_open_transaction_age_seconds",
            "Age of the oldest open transaction on a partition.",
            _TP,
        )
        dirty = _gauge(
            "kstore_partition_dirty_ratio",
            "Share of a partition's bytes above the compaction cleaner point.",
            _TP,
        )
        not_read = _gauge(
            "kstore_maintenance_topic_errors",
            "1 for a topic the maintenance planner could not read.",
            ["topic"],
        )
        rows: list[tuple[str, dict[str, object]]] = [
            (t["topic"], task) for t in data["topics"] for task in t["tasks"]
        ]
        rows += [("", task) for task in data["store_tasks"]]
        for topic, task in rows:
            labels = [topic, str(task["task"])]
            run = task["last_run"]
            if isinstance(run, dict):
                last.add_metric([*labels, str(run["outcome"])], int(run["finished_ms"]) / 1000)
                for unit, family in last_removed.items():
                    family.add_metric(labels, int(run[unit]))
            due.add_metric(labels, 1 if task["due"] else 0)
            next_ms = task["next_ms"]
            if not task["due"] and isinstance(next_ms, int):
                upcoming.add_metric(labels, next_ms / 1000)
            running.add_metric(labels, 1 if task["running_by"] else 0)
        for t in data["topics"]:
            for p in t["partitions"]:
                labels = [t["topic"], str(p["partition"])]
                opened = p["open_transactions"]
                open_txns.add_metric(labels, len(opened))
                ages = [o["age_ms"] for o in opened if o["age_ms"] is not None]
                txn_age.add_metric(labels, max(ages) / 1000 if ages else 0.0)
                dirty.add_metric(labels, float(p["dirty_ratio"]))
        for topic in sorted(data["errors"]):
            not_read.add_metric([topic], 1)
        yield from (last, *last_removed.values(), due, upcoming, running)
        yield from (open_txns, txn_age, dirty, not_read)


def registry_for(collectors: Iterable[Collector]) -> CollectorRegistry:
    """A registry of its own (not the process-wide default: tests run several servers)."""
    registry = CollectorRegistry(auto_describe=False)
    for collector in collectors:
        registry.register(collector)
    return registry


def exposition(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The registry in Prometheus's text format, and its content type."""
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(registry), CONTENT_TYPE_LATEST
