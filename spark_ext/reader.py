"""The Spark readers: batch (with filter pushdown) and streaming (with admission control)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, Filter, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from kstore.errors import InvalidConfigurationError
from kstore.records import TopicPartition

from . import hooks
from .filters import Pushdown, push
from .options import ReadOptions
from .reading import (
    Offsets,
    Range,
    ReadContext,
    ReadTask,
    Resolver,
    byte_limit,
    check_range,
    from_json_offsets,
    plan_tasks,
    rate_limit,
    read_task,
    report_data_loss,
    timestamp_type_of,
    to_json_offsets,
)
from .schema import Projection
from .stores import BATCH_CACHE_BYTES, STREAM_CACHE_BYTES, get_store

log = logging.getLogger(__name__)


def _read(partition: InputPartition, ctx: ReadContext) -> Iterator[pa.RecordBatch]:
    # Spark plans one InputPartition(None) when a read has no task at all.
    if isinstance(partition, ReadTask):
        yield from read_task(partition, ctx)


class KStoreBatchReader(DataSourceReader):
    """``spark.read.format("kstore")``: offsets [startingOffsets, endingOffsets) of every
    subscribed partition, planned on the driver from the manifests."""

    def __init__(self, options: ReadOptions, projection: Projection) -> None:
        self.options = options
        self.projection = projection
        self.pushdown = Pushdown()

    def _context(self) -> ReadContext:
        return ReadContext(
            store=self.options.store,
            projection=self.projection,
            fail_on_data_loss=self.options.fail_on_data_loss,
            cache_bytes=BATCH_CACHE_BYTES,
            pushdown=self.pushdown,
            read_committed=self.options.read_committed,
        )

    def partitions(self) -> list[InputPartition]:
        opts = self.options
        if self.pushdown.impossible():
            return []
        resolver = Resolver(get_store(opts.store), opts)
        tps = resolver.topic_partitions(strict=True)
        states = resolver.states(tps)
        starts = resolver.resolve(opts.starting, states, ending=False)
        ends = resolver.resolve(opts.ending, states, ending=True)
        low, high = self.pushdown.bounds("offset")
        ranges = []
        for tp in tps:
            meta = resolver.metadata[tp.topic]
            if not self.pushdown.accepts_task(tp.topic, tp.partition, timestamp_type_of(meta)):
                continue
            start, end = starts[tp], ends[tp]
            if start > end:
                raise InvalidConfigurationError(
                    f"kstore source: for {tp.topic}-{tp.partition} the starting offset {start} "
                    f"({opts.starting.option}) is after the ending offset {end} ({opts.ending.option})"
                )
            r = check_range(tp, start, end, states[tp], fail_on_data_loss=opts.fail_on_data_loss)
            # Offset filters are exact once they narrow the range.
            start = r.start if low is None else max(r.start, low)
            end = r.end if high is None else min(r.end, high + 1)
            ranges.append(Range(tp, start, max(start, end)))
        tasks: list[InputPartition] = list(
            plan_tasks(
                ranges,
                states,
                resolver.metadata,
                min_partitions=opts.min_partitions,
                max_records_per_partition=opts.max_records_per_partition,
                snapshot=False,
                open_end=opts.ending.kind == "latest" and high is None,
                earliest_start=opts.starting.kind == "earliest",
            )
        )
        return tasks

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read(partition, self._context())


class KStoreFilteringBatchReader(KStoreBatchReader):
    """The batch reader with filter pushdown (needs spark.sql.python.filterPushdown.enabled)."""

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:  # noqa: N802 - Spark's name
        pushdown, kept = push(filters)
        self.pushdown = pushdown
        if pushdown.conditions:
            log.info("kstore: pushed down %s", pushdown.conditions)
        return kept


class KStoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("kstore")``.

    The driver-side methods run in one long-lived Python process per query, so the resolver
    (with its cached manifest states), the last trigger time and the availableNow target
    live on this object between triggers. Polling for new data reads the next manifest
    version by name, once per partition log or (layout 3) per topic log: one GET that usually
    finds nothing, never a listing.
    """

    def __init__(self, options: ReadOptions, projection: Projection) -> None:
        self.options = options
        self.projection = projection
        self._init_driver_state()

    def _init_driver_state(self) -> None:
        self._resolver: Resolver | None = None
        self._last_trigger_ms = 0  # as Kafka: the first trigger never waits for minOffsets
        self._target: Offsets | None = None  # availableNow: nothing beyond these
        self._latest: Offsets | None = None
        self._committed: Offsets | None = None
        self._initial: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only; driver state never travels.
        return {"options": self.options, "projection": self.projection}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.options = state["options"]
        self.projection = state["projection"]
        self._init_driver_state()

    @property
    def resolver(self) -> Resolver:
        if self._resolver is None:
            self._resolver = Resolver(
                get_store(self.options.store, STREAM_CACHE_BYTES), self.options
            )
        return self._resolver

    # -- offsets ---------------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - Spark's name
        # Spark asks twice (to plan the first batch, then to run it); "latest" must not move
        # in between, or records committed meanwhile would fall between the two answers.
        if self._initial is None:
            self._initial = self._resolve_initial()
        return self._initial

    def _resolve_initial(self) -> dict[str, Any]:
        tps = self.resolver.topic_partitions(strict=False)
        states = self.resolver.states(tps)
        starts = self.resolver.resolve(self.options.starting, states, ending=False)
        for tp, offset in starts.items():
            state = states[tp]
            if offset < state.start_offset:
                report_data_loss(
                    self.options.fail_on_data_loss,
                    f"{tp.topic}-{tp.partition}: {self.options.starting.option} asks for offset "
                    f"{offset}, but the log starts at {state.start_offset}",
                )
                starts[tp] = state.start_offset
        return to_json_offsets(starts)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name
        # Spark hands this limit back to latestOffset on every trigger except when the trigger
        # asks for everything (ReadAllAvailable); every configured limit is then applied there.
        opts = self.options
        if opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(opts.max_offsets_per_trigger)
        if opts.max_bytes_per_trigger is not None:
            return ReadMaxBytes(opts.max_bytes_per_trigger)
        if opts.min_offsets_per_trigger is not None:
            return ReadMinRows(opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        tps = self.resolver.topic_partitions(strict=False)
        self._target = {
            tp: self.resolver.visible_end(s) for tp, s in self.resolver.states(tps).items()
        }
        log.info("kstore availableNow target: %s", to_json_offsets(self._target))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        begin = from_json_offsets(start)
        # Spark asks for the next batch only once the previous one is committed.
        self._batch_committed(begin)
        tps = self.resolver.topic_partitions(strict=False)
        states = self.resolver.states(tps)
        latest = {tp: self.resolver.visible_end(states[tp]) for tp in tps}
        self._latest = latest
        for tp in sorted(set(begin) - set(latest)):
            report_data_loss(
                self.options.fail_on_data_loss,
                f"{tp.topic}-{tp.partition} is gone (its topic was deleted or no longer matches)",
            )
        until: Offsets = {}
        for tp, end in latest.items():
            if self._target is not None:
                end = min(end, self._target.get(tp, begin.get(tp, 0)))
            if tp in begin or end > 0:
                until[tp] = end
        if not isinstance(limit, ReadAllAvailable):
            until = self._admit(begin, until, states, limit)
        if until == begin:
            return start  # nothing new: the same offsets tell Spark to run no batch
        return to_json_offsets(until)

    def _admit(
        self,
        begin: Offsets,
        until: Offsets,
        states: dict[TopicPartition, Any],
        limit: ReadLimit,
    ) -> Offsets:
        opts = self.options
        max_rows = opts.max_offsets_per_trigger
        if isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows if max_rows is None else min(max_rows, limit.max_rows)
        max_bytes = opts.max_bytes_per_trigger
        if isinstance(limit, ReadMaxBytes):
            max_bytes = limit.max_bytes if max_bytes is None else min(max_bytes, limit.max_bytes)
        min_rows = opts.min_offsets_per_trigger
        if isinstance(limit, ReadMinRows):
            min_rows = limit.min_rows
        # availableNow must reach its target, so it never waits for more data (as Kafka).
        if min_rows is not None and self._target is None:
            now = int(time.time() * 1000)
            if now - self._last_trigger_ms < opts.max_trigger_delay_ms:
                available = sum(max(0, end - begin.get(tp, 0)) for tp, end in until.items())
                if available < min_rows:
                    return {tp: begin.get(tp, 0) for tp in until if tp in begin}
            self._last_trigger_ms = now
        if max_rows is not None:
            until = rate_limit(max_rows, begin, until)
        if max_bytes is not None:
            until = byte_limit(max_bytes, begin, until, states)
        return until

    def reportLatestOffset(self) -> dict[str, Any] | None:  # noqa: N802 - Spark's name
        return None if self._latest is None else to_json_offsets(self._latest)

    # -- batches ---------------------------------------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin = from_json_offsets(start)
        until = from_json_offsets(end)
        resolver = self.resolver
        present = []
        for tp in sorted(until):
            if tp.topic not in resolver.metadata:
                resolver.topics(strict=False)
            if tp.topic not in resolver.metadata:
                report_data_loss(self.options.fail_on_data_loss, f"topic {tp.topic!r} is gone")
                continue
            present.append(tp)
        # One request per topic log (layout 3) or partition log, as latestOffset asks.
        states = resolver.states(present)
        ranges = [
            check_range(
                tp,
                begin.get(tp, 0),
                until[tp],
                states[tp],
                fail_on_data_loss=self.options.fail_on_data_loss,
            )
            for tp in present
        ]
        tasks: list[InputPartition] = list(
            plan_tasks(
                ranges,
                states,
                resolver.metadata,
                min_partitions=self.options.min_partitions,
                max_records_per_partition=self.options.max_records_per_partition,
                snapshot=True,
            )
        )
        return tasks

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        ctx = ReadContext(
            store=self.options.store,
            projection=self.projection,
            fail_on_data_loss=self.options.fail_on_data_loss,
            cache_bytes=STREAM_CACHE_BYTES,
            read_committed=self.options.read_committed,
        )
        return _read(partition, ctx)

    def commit(self, end: dict[str, Any]) -> None:
        self._batch_committed(from_json_offsets(end))

    def _batch_committed(self, end: Offsets) -> None:
        """The hook point for group offsets: ``end`` was processed and committed by Spark.

        Spark calls commit(end) one batch late and never for the last batch of an
        availableNow run, but it passes every committed end as the start of the next
        latestOffset call; both paths land here, each position once and never one older than
        a position already reported.
        """
        done = self._committed
        if not end or (
            done is not None and all(offset <= done.get(tp, -1) for tp, offset in end.items())
        ):
            return
        self._committed = {**(done or {}), **end}
        hooks.batch_committed(self.options, end)

    def stop(self) -> None:
        self._resolver = None
