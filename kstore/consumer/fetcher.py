"""A consumer's fetcher (Kafka's Fetcher): reads the assigned partitions' records from their
positions into a fetch buffer, and hands them out ``max_records`` at a time.

One fetch reads every assigned partition: in layout 3 one request per topic log (the
partitions of a log share its state), new ranges of each data object read together; layout-2
topics are read through each partition's own log. Partitions found caught up (or read to their
end) are skipped until a commit touches them, and a look at topic logs unchanged since a fetch
that found nothing returns before any partition is visited. Positions without one are set
from the group's committed offset or ``auto_offset_reset``; ``read_committed`` reads up to the
last stable offset and leaves out aborted records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from kstore.consumer.pacing import Pacer
from kstore.consumer.subscription import SubscriptionState
from kstore.errors import OffsetOutOfRangeError
from kstore.log import Log
from kstore.partition import Partition, PartitionState, prefetch
from kstore.records import OffsetAndTimestamp, TopicPartition
from kstore.store import Store, TopicMetadata
from kstore.topic_log import TopicLog, TopicLogState

# How long a polling consumer reuses a topic's metadata before reading it again (a new
# partition count, a deleted or re-created topic are seen within this).
METADATA_RECHECK_S = 1.0


class GroupView(Protocol):
    """What the fetcher asks of the consumer's group (kstore.consumer.membership)."""

    def owns(self, tp: TopicPartition) -> bool:
        """Whether the partition may be read now (not while it is handed over)."""
        ...

    def ownership(self) -> tuple[object, ...]:
        """What ``owns`` answers from, compared by identity."""
        ...

    def committed_offset(self, tp: TopicPartition) -> int | None:
        """Where the group's reading of the partition stopped."""
        ...


class NoGroup:
    """A consumer without a group: every assigned partition is its to read, none committed."""

    def owns(self, tp: TopicPartition) -> bool:
        return True

    def ownership(self) -> tuple[object, ...]:
        return ()

    def committed_offset(self, tp: TopicPartition) -> int | None:
        return None


@dataclass(frozen=True, slots=True)
class _IdleFetch:
    """What a fetch that found nothing to read read from (Fetcher._unchanged_since_idle)."""

    states: tuple[tuple[TopicLog, TopicLogState], ...]
    positions: dict[TopicPartition, int]
    assigned: list[TopicPartition]
    paused: frozenset[TopicPartition]
    ownership: tuple[object, ...]
    metadata: dict[str, tuple[TopicMetadata, float]]
    metadata_until: float


class Fetcher:
    """Reads the partitions ``subscription`` assigns, from its positions."""

    def __init__(
        self,
        store: Store,
        subscription: SubscriptionState,
        group: GroupView,
        pacer: Pacer,
        *,
        auto_offset_reset: str,
        read_committed: bool,
        fetch_max_bytes: int,
        max_partition_fetch_bytes: int,
    ) -> None:
        self._store = store
        self._subscription = subscription
        self._group = group
        self._pacer = pacer
        self._auto_offset_reset = auto_offset_reset
        self._read_committed = read_committed
        self._fetch_max_bytes = fetch_max_bytes
        self._max_partition_fetch_bytes = max_partition_fetch_bytes
        self._rotation = 0
        # The fetch buffer: per partition, the position its run starts at and the run's
        # batches with their sizes in bytes (what a fetch read and no poll has returned yet).
        self._buffer: dict[TopicPartition, tuple[int, list[tuple[pa.RecordBatch, int]]]] = {}
        # Topic metadata the fetch path reuses for METADATA_RECHECK_S: re-reading it for every
        # partition of every poll cost a request each on an object store.
        self._metadata: dict[str, tuple[TopicMetadata, float]] = {}
        # Layout 3: partitions a fetch found caught up, with what it found them at (see _fill).
        self._caught_up: dict[
            TopicPartition,
            tuple[tuple[TopicMetadata, float], TopicLog, PartitionState | None, int],
        ] = {}
        # What the last fetch that found nothing to read read from (see _unchanged_since_idle).
        self._idle: _IdleFetch | None = None
        self._records_consumed = 0
        self._bytes_consumed = 0

    def metrics(self) -> dict[str, int]:
        return {
            "records-consumed-total": self._records_consumed,
            "bytes-consumed-total": self._bytes_consumed,
        }

    def has_buffered(self) -> bool:
        """Whether records a fetch read wait in the buffer (the next poll needs no request)."""
        return bool(self._buffer)

    def retain_assigned(self) -> None:
        """Drop what the buffer holds of partitions no longer assigned (the assignment
        changed: a partition assigned again starts from its new position)."""
        keep = set(self._subscription.assigned)
        self._buffer = {tp: e for tp, e in self._buffer.items() if tp in keep}

    # -- partitions and positions ----------------------------------------------------------------

    def partition(self, tp: TopicPartition, *, cached_metadata: bool = False) -> Partition:
        """The partition's object, with its topic's metadata read again, or (``cached_metadata``)
        as read within METADATA_RECHECK_S."""
        if not cached_metadata:
            return self._store.partition(tp.topic, tp.partition)
        now = time.monotonic()
        known = self._metadata.get(tp.topic)
        if known is None or now - known[1] > METADATA_RECHECK_S:
            known = (self._store.topic(tp.topic), now)
            self._metadata[tp.topic] = known
        return self._store.partition(tp.topic, tp.partition, known[0])

    def _reset(self, tp: TopicPartition, state: PartitionState, why: str) -> int:
        policy = self._auto_offset_reset
        if policy == "earliest":
            return state.start_offset
        if policy == "latest":
            return state.end_offset
        raise OffsetOutOfRangeError(
            f"{tp.topic}-{tp.partition}: {why} and auto_offset_reset is 'none'"
        )

    def position_for(self, tp: TopicPartition, state: PartitionState) -> int:
        """The partition's position in ``state``, set if it has none (the group's committed
        offset, else ``auto_offset_reset``) or it is outside the live range (reset)."""
        position = self._subscription.positions.get(tp)
        if position is None:
            committed = self._group.committed_offset(tp)
            if committed is not None:
                position = committed
            else:
                position = self._reset(tp, state, "no committed offset")
        if position < state.start_offset or position > state.end_offset:
            position = self._reset(
                tp,
                state,
                f"offset {position} is outside the live range [{state.start_offset}, {state.end_offset}]",
            )
        self._subscription.set_position(tp, position)
        return position

    def position(self, tp: TopicPartition) -> int:
        """The partition's position in its newest state."""
        return self.position_for(tp, self.partition(tp).state())

    def start_offset(self, tp: TopicPartition) -> int:
        return self.partition(tp).state().start_offset

    def end_offset(self, tp: TopicPartition) -> int:
        return self.partition(tp).state().end_offset

    def offset_for_time(self, tp: TopicPartition, timestamp_ms: int) -> OffsetAndTimestamp | None:
        """The earliest offset whose timestamp is at or after ``timestamp_ms``, with its
        timestamp."""
        part = self.partition(tp)
        state = part.state()
        offset = part.offset_for_timestamp(timestamp_ms, state)
        if offset is None:
            return None
        batch = next(part.read(offset, 1, state=state, columns=["timestamp", "offset"]))
        found = int(batch.column("timestamp").cast(pa.int64())[0].as_py()) // 1000
        return OffsetAndTimestamp(offset, found)

    def _visible_end(self, state: PartitionState) -> int:
        return state.last_stable_offset if self._read_committed else state.end_offset

    # -- fetching ------------------------------------------------------------------------------

    def fetch(self, max_records: int) -> dict[TopicPartition, list[pa.RecordBatch]]:
        """Up to ``max_records`` records: from the fetch buffer while it holds some, else from
        one fetch of every assigned partition into the buffer (Kafka's fetcher: a poll that is
        capped by ``max_poll_records`` hands out what an earlier fetch read, so the cost of a
        fetch, one request per topic log and the decoding of what is new, is paid once for
        however many polls drain it)."""
        served = self._serve(max_records)
        if served:
            return served
        self._fill()
        return self._serve(max_records)

    def _serve(self, max_records: int) -> dict[TopicPartition, list[pa.RecordBatch]]:
        """Records from the fetch buffer, partitions in turn, each from its position. A buffered
        run that no longer starts at its partition's position (a seek, a reset, a rebalance)
        is dropped; a paused partition's is kept for when it resumes."""
        out: dict[TopicPartition, list[pa.RecordBatch]] = {}
        buffer = self._buffer
        subscription = self._subscription
        parts = subscription.assigned
        if not buffer or not parts:
            return out
        positions = subscription.positions
        paused = subscription.paused
        owns = self._group.owns
        start = self._rotation % len(parts)
        self._rotation += 1
        remaining = max_records
        consumed_bytes = 0
        for tp in parts[start:] + parts[:start]:
            entry = buffer.get(tp)
            if entry is None:
                continue
            first, sized = entry
            if positions.get(tp, first) != first or not owns(tp):
                del buffer[tp]
                continue
            if tp in paused or remaining <= 0:
                continue
            taken: list[pa.RecordBatch] = []
            while sized and remaining > 0:
                batch, size = sized[0]
                rows = batch.num_rows
                if rows <= remaining:
                    sized.pop(0)
                    taken.append(batch)
                    consumed_bytes += size
                    remaining -= rows
                else:
                    per_row = size // max(rows, 1)
                    taken.append(batch.slice(0, remaining))
                    sized[0] = (batch.slice(remaining), size - per_row * remaining)
                    consumed_bytes += per_row * remaining
                    remaining = 0
            out[tp] = taken
            position = int(taken[-1].column("offset")[-1].as_py()) + 1
            subscription.set_position(tp, position)
            if sized:
                buffer[tp] = (position, sized)
            else:
                del buffer[tp]
        if out:
            self._records_consumed += sum(b.num_rows for batches in out.values() for b in batches)
            self._bytes_consumed += consumed_bytes
        return out

    def _fill(self) -> None:
        """One fetch into the buffer: every assigned partition that has nothing buffered, from
        its position, within ``fetch_max_bytes`` (and ``max_partition_fetch_bytes`` each)."""
        budget = self._fetch_max_bytes
        subscription = self._subscription
        parts = subscription.assigned
        assigned = set(parts)
        self._buffer = {tp: e for tp, e in self._buffer.items() if tp in assigned}
        if not parts:
            return
        start = self._rotation % len(parts)
        now = time.monotonic()
        # Which partitions to read, and from where. In layout 3 the partitions of one topic
        # log share its state: one request per topic log per poll, not one per partition.
        asked: dict[int, tuple[TopicLog, TopicLogState]] = {}
        if self._unchanged_since_idle(now, asked):
            return
        positions = subscription.positions
        paused = subscription.paused
        owns = self._group.owns
        tailed: dict[int, Log[Any]] = {id(shared.log): shared.log for shared, _ in asked.values()}
        per_partition_logs = False
        plan: list[tuple[TopicPartition, Partition, PartitionState]] = []
        caught_up = self._caught_up
        if len(caught_up) > len(parts):
            self._caught_up = caught_up = {tp: v for tp, v in caught_up.items() if tp in assigned}

        def shared_state(shared: TopicLog) -> TopicLogState:
            known = asked.get(id(shared))
            if known is None:
                known = asked[id(shared)] = (shared, shared.state(tail=True))
                tailed[id(shared.log)] = shared.log
            return known[1]

        def note_caught_up(tp: TopicPartition, topic_log: TopicLog | None, position: int) -> None:
            # Skipped by later fetches while its topic log holds the same state of it (None for
            # a partition never written) and its position is ``position``.
            topic_metadata = self._metadata.get(tp.topic)
            if topic_log is not None and topic_metadata is not None:
                found = asked[id(topic_log)][1].partitions.get(tp.partition)
                caught_up[tp] = (topic_metadata, topic_log, found, position)

        for tp in parts[start:] + parts[:start]:
            if tp in paused or not owns(tp) or tp in self._buffer:
                continue
            seen = caught_up.pop(tp, None)
            if seen is not None:
                # Caught up at an earlier fetch: nothing to read while its topic log holds the
                # same state of it (copy-on-write: a commit that touches it makes a new one)
                # and its position has not moved. A poll of many partitions, few of which a
                # commit touches, skips the rest at a dict lookup each.
                metadata, shared, raw, position = seen
                if (
                    self._metadata.get(tp.topic) is metadata
                    and now - metadata[1] <= METADATA_RECHECK_S
                    and positions.get(tp) == position
                    and shared_state(shared).partitions.get(tp.partition) is raw
                ):
                    caught_up[tp] = seen
                    continue
            partition = self.partition(tp, cached_metadata=True)
            if partition.topic_log is None:
                # Layout 2: the partition's own log.
                state = partition.state(tail=True)
                tailed[id(partition.log)] = partition.log
                per_partition_logs = True
            else:
                state = shared_state(partition.topic_log).partition(tp.partition)
            if state.sealed_layout is not None:
                # Upgraded (PROTOCOL.md 8.29): the topic log is read from the next poll on.
                self._metadata.pop(tp.topic, None)
            plan.append((tp, partition, state))
        self._pacer.tailing(list(tailed.values()))
        # Only partitions with a position: establishing one here would commit it later, for a
        # partition this poll may not reach (a never-read partition has no committed offset).
        prefetch(
            [
                (partition, state, positions[tp], self._visible_end(state))
                for tp, partition, state in plan
                if tp in positions
            ],
            max_bytes=budget,
            partition_max_bytes=self._max_partition_fetch_bytes,
        )
        for tp, partition, state in plan:
            if budget <= 0:
                break
            established = tp in subscription.positions
            position = self.position_for(tp, state)
            visible_end = self._visible_end(state)
            if position >= visible_end:
                if established:
                    note_caught_up(tp, partition.topic_log, position)
                continue
            if not established:
                # A position is set when a poll returns records from it, not by the fetch: a
                # commit must not record a position for a partition no poll has reached.
                subscription.forget_position(tp)
            try:
                # A segment of ``state`` whose file a merge and vacuum deleted meanwhile (a
                # pause longer than file.delete.delay.ms) is read from the newest state's
                # live files (Partition.read_tables, PROTOCOL.md 24 item 8).
                sized = list(
                    partition.read_sized(
                        position,
                        state=state,
                        committed_only=self._read_committed,
                        max_bytes=min(budget, self._max_partition_fetch_bytes),
                    )
                )
            except OffsetOutOfRangeError:
                # Retention removed the offsets while they were being read: the next fetch,
                # from the newest state, resets the position (auto_offset_reset).
                continue
            if not any(batch.num_rows for batch, _ in sized):
                # Only gaps (compaction, aborted transactions) up to the visible end: skip them.
                subscription.set_position(tp, visible_end)
                continue
            kept = [(b, n) for b, n in sized if b.num_rows]
            self._buffer[tp] = (position, kept)
            budget -= sum(n for _, n in sized)
            end = int(kept[-1][0].column("offset")[-1].as_py()) + 1
            if end >= visible_end:
                # Read to the visible end: caught up once the buffer is served, unless a
                # commit changes the partition (the next poll need not plan it again).
                note_caught_up(tp, partition.topic_log, end)
        if self._buffer:
            self._pacer.note_arrival()
        elif not per_partition_logs and self._metadata:
            self._idle = _IdleFetch(
                tuple(asked.values()),
                dict(subscription.positions),
                parts,
                frozenset(paused),
                self._group.ownership(),
                dict(self._metadata),
                min(at for _, at in self._metadata.values()) + METADATA_RECHECK_S,
            )

    def _unchanged_since_idle(
        self, now: float, asked: dict[int, tuple[TopicLog, TopicLogState]]
    ) -> bool:
        """Whether this fetch would read nothing because nothing it depends on changed since
        the last one that found nothing to read: the same partitions, positions, pauses,
        ownership and topic metadata, and the same state of every topic log (one look each, as
        the fetch would make; the states found are left in ``asked`` for it). A tailing reader
        of many partitions looks for new commits far more often than they come, and each look
        would otherwise go through every partition it reads."""
        idle = self._idle
        if idle is None or self._buffer:
            return False
        self._idle = None
        subscription = self._subscription
        if (
            now > idle.metadata_until
            or idle.assigned is not subscription.assigned
            or idle.paused != subscription.paused
            or idle.positions != subscription.positions
            or idle.metadata != self._metadata
            or any(a is not b for a, b in zip(idle.ownership, self._group.ownership(), strict=True))
        ):
            return False
        unchanged = True
        for shared, state in idle.states:
            found = shared.state(tail=True)
            asked[id(shared)] = (shared, found)
            unchanged = unchanged and found is state
        if unchanged:
            self._idle = idle
        return unchanged
