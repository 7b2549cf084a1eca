"""The consumer: Kafka's client API over the store, alone or as a member of a group.

A consumer reads partitions by polling their manifest logs for the next version by name (no
listing) and reading the segments that hold the requested offsets. In a group, a heartbeat
thread keeps the member's lease in the group log; ``poll()`` applies rebalances (calling the
listener) and auto-commits positions, as Kafka's client does.

Rebalances are cooperative: a member keeps the partitions it still owns, and a partition that
moves is read by its new owner only once the previous owner has released it (committing its
final position) or left the group, so no two live members ever read a partition at once.
"""

from __future__ import annotations

import concurrent.futures
import gc
import logging
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain, repeat
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kstore.assignors import check_assignors
from kstore.errors import (
    CommitFailedError,
    IllegalStateError,
    InvalidConfigurationError,
    KStoreError,
    OffsetOutOfRangeError,
    UnknownTopicOrPartitionError,
)
from kstore.groups import Group, GroupState, Member, normalized_offsets
from kstore.log import Log
from kstore.names import validate_group_id, validate_topic_name
from kstore.partition import Partition, PartitionState, prefetch
from kstore.records import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
)
from kstore.segments import fixed_array, numpy_values
from kstore.store import Store, TopicMetadata
from kstore.topic_log import TopicLog, TopicLogState

# How long a polling consumer reuses a topic's metadata before reading it again (a new
# partition count, a deleted or re-created topic are seen within this).
METADATA_RECHECK_S = 1.0

log = logging.getLogger(__name__)

DEFAULT_CONFIG: dict[str, Any] = {
    "client_id": None,
    "group_instance_id": None,
    "key_deserializer": None,
    "value_deserializer": None,
    "auto_offset_reset": "latest",
    "enable_auto_commit": True,
    "auto_commit_interval_ms": 5_000,
    "max_poll_records": 500,
    "fetch_max_bytes": 52_428_800,
    "max_partition_fetch_bytes": 1_048_576,
    "fetch_max_wait_ms": 100,  # an idle poll looks for new commits at most this far apart
    "session_timeout_ms": 45_000,
    "heartbeat_interval_ms": 3_000,
    "max_poll_interval_ms": 300_000,
    "partition_assignment_strategy": ("sticky", "range", "roundrobin"),
    "consumer_timeout_ms": float("inf"),
    "metadata_max_age_ms": 300_000,
    "isolation_level": "read_uncommitted",  # or read_committed: hide open/aborted transactions
    "storage_options": None,
}


def _sizes(column: pa.Array, items: list[Any]) -> Iterable[int]:
    """Serialized sizes of a binary column, -1 for nulls (Kafka's convention), from ``items``,
    the column as Python values (bytes; ``len`` over them runs in C, and costs less than an
    Arrow kernel's call on the few records a partition gets per poll). A string column's
    sizes are its UTF-8 lengths, from Arrow. Typed keys and values have no serialized form:
    -1 throughout."""
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        if column.null_count == 0:
            return list(map(len, items))
        return [-1 if item is None else len(item) for item in items]
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return repeat(-1, len(column))
    # Arrow scalars and numpy views built directly: pa.scalar (behind a Python -1) and
    # Array.to_numpy import pandas on first use, 0.3 s on a consumer's first poll.
    minus_one = fixed_array(np.array([-1], np.int64), pa.int64())[0]
    lengths = pc.fill_null(pc.binary_length(column).cast(pa.int64()), minus_one)
    return numpy_values(lengths, np.int64).tolist()  # type: ignore[no-any-return]


class ConsumerRebalanceListener(Protocol):
    """Called from poll(). A listener may also define ``on_partitions_lost(lost)``, called
    instead of ``on_partitions_revoked`` when the member was expelled from the group (its
    partitions may already have another reader, so nothing can be committed for them); as in
    Kafka, ``on_partitions_revoked`` is called when it does not."""

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None: ...

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None: ...


# A fetch on an object store waits for the next new records until this share of the average
# gap between arrivals has passed (a gap counts at most ARRIVAL_GAP_MAX_S: an idle spell does
# not make the reader slow to notice the next record).
ARRIVAL_EARLY = 0.8
ARRIVAL_GAP_MAX_S = 1.0
# A look there that finds nothing looks again after this share of that gap at first (then
# backing off): a flush a little late costs a few GETs, not one every doubling from 0.5 ms.
ARRIVAL_STEP = 0.05
# On local disk a look for new records is a failed open (microseconds), so a reader that found
# records within ARRIVAL_GAP_MAX_S looks this share of the average gap between arrivals apart,
# within these bounds, instead of backing off to fetch_max_wait_ms; an idle one backs off as
# before. A busy stream is found a fraction of a commit late; a slow one costs few looks.
LOCAL_LOOK_SHARE = 0.1
LOCAL_LOOK_MIN_S = 0.0002
LOCAL_LOOK_MAX_S = 0.001


@dataclass(frozen=True, slots=True)
class _IdleFetch:
    """What a fetch that found nothing to read read from (Consumer._unchanged_since_idle)."""

    states: tuple[tuple[TopicLog, TopicLogState], ...]
    positions: dict[TopicPartition, int]
    assigned: list[TopicPartition]
    paused: frozenset[TopicPartition]
    ownership: tuple[object, ...]
    metadata: dict[str, tuple[TopicMetadata, float]]
    metadata_until: float


def _ms_config(cfg: dict[str, Any], name: str, minimum: int = 0) -> int:
    value = cfg[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidConfigurationError(
            f"consumer config {name!r} must be an integer >= {minimum}, got {value!r}"
        )
    return value


class Consumer:
    """Reads records from a store's topics, with kafka-python's ``KafkaConsumer`` API.

    >>> consumer = Consumer("clicks", store="file:///tmp/ks", group_id="stats")  # doctest: +SKIP
    >>> for record in consumer: ...  # doctest: +SKIP
    """

    def __init__(
        self, *topics: str, store: Store | str, group_id: str | None = None, **configs: Any
    ) -> None:
        unknown = sorted(set(configs) - set(DEFAULT_CONFIG))
        if unknown:
            raise InvalidConfigurationError(
                f"unknown consumer config {unknown[0]!r}; known: {', '.join(sorted(DEFAULT_CONFIG))}"
            )
        cfg = {**DEFAULT_CONFIG, **configs}
        self.config = cfg
        if cfg["auto_offset_reset"] not in ("earliest", "latest", "none"):
            raise InvalidConfigurationError(
                f"auto_offset_reset must be earliest, latest or none, got {cfg['auto_offset_reset']!r}"
            )
        for name in (
            "auto_commit_interval_ms",
            "fetch_max_bytes",
            "max_partition_fetch_bytes",
            "fetch_max_wait_ms",
            "max_poll_interval_ms",
            "metadata_max_age_ms",
        ):
            _ms_config(cfg, name)
        _ms_config(cfg, "max_poll_records", 1)
        timeout = cfg["consumer_timeout_ms"]
        if (
            not isinstance(timeout, (int, float))
            or isinstance(timeout, bool)
            or math.isnan(timeout)
            or timeout < 0
        ):
            raise InvalidConfigurationError(
                "consumer config 'consumer_timeout_ms' must be a non-negative number of "
                f"milliseconds (float('inf') to wait forever), got {timeout!r}"
            )
        session = _ms_config(cfg, "session_timeout_ms", 1)
        heartbeat = _ms_config(cfg, "heartbeat_interval_ms", 1)
        if heartbeat >= session:
            raise InvalidConfigurationError(
                "heartbeat_interval_ms must be lower than session_timeout_ms"
            )
        self._assignors = check_assignors(cfg["partition_assignment_strategy"])
        if cfg["isolation_level"] not in ("read_uncommitted", "read_committed"):
            raise InvalidConfigurationError(
                f"isolation_level must be read_uncommitted or read_committed, got {cfg['isolation_level']!r}"
            )
        self._read_committed = cfg["isolation_level"] == "read_committed"
        for name in ("key_deserializer", "value_deserializer"):
            if cfg[name] is not None and not callable(cfg[name]):
                raise InvalidConfigurationError(f"consumer config {name!r} must be callable")
        self.store = (
            store
            if isinstance(store, Store)
            else Store(store, cfg["storage_options"], create=False)
        )
        self.group_id = validate_group_id(group_id) if group_id is not None else None
        self.client_id = cfg["client_id"] or f"consumer-{uuid.uuid4().hex[:8]}"
        if not isinstance(self.client_id, str) or not re.fullmatch(
            r"[a-zA-Z0-9._-]{1,200}", self.client_id
        ):
            raise InvalidConfigurationError(
                f"client_id {self.client_id!r} must be 1-200 ASCII letters, digits, '.', '_' or '-'"
            )

        self._lock = threading.RLock()  # guards group state shared with the heartbeat thread
        self._subscription: set[str] | None = None
        self._pattern: re.Pattern[str] | None = None
        self._listener: ConsumerRebalanceListener | None = None
        self._manual = False
        self._assigned: list[TopicPartition] = []
        self._positions: dict[TopicPartition, int] = {}
        self._paused: set[TopicPartition] = set()
        self._rotation = 0
        # The fetch buffer: per partition, the position its run starts at and the run's
        # batches with their sizes in bytes (what a fetch read and no poll has returned yet).
        self._buffer: dict[TopicPartition, tuple[int, list[tuple[pa.RecordBatch, int]]]] = {}
        # Object stores: when fetches last found new records, the average gap between them,
        # and when (monotonic) the next are expected (_note_arrival).
        self._last_arrival: float | None = None
        self._arrival_gap: float | None = None
        self._next_arrival = 0.0
        # Object stores: after a look that found nothing, the earliest time the next is worth
        # making, and the backoff it reached. Kept across polls until records arrive: a loop
        # of short polls over a quiet topic backs off as one long poll does, where each poll
        # started again from a few milliseconds (on S3, dozens of GETs a second per idle
        # consumer).
        self._next_look = 0.0
        self._look_backoff: float | None = None
        self._closed = False
        self._timestamp_types: dict[str, int] = {}
        # Topic metadata the fetch path reuses for METADATA_RECHECK_S: re-reading it for every
        # partition of every poll cost a request each on an object store.
        self._metadata: dict[str, tuple[TopicMetadata, float]] = {}
        # Layout 3: partitions a fetch found caught up, with what it found them at (see _fill).
        self._caught_up: dict[
            TopicPartition,
            tuple[tuple[TopicMetadata, float], TopicLog, PartitionState | None, int],
        ] = {}
        # The logs the last fetch tailed: when their writers' next commits are due.
        self._tailed: list[Log[Any]] = []
        # What the last fetch that found nothing to read read from (see _unchanged_since_idle).
        self._idle: _IdleFetch | None = None

        self._group: Group | None = Group(self.store, self.group_id) if self.group_id else None
        self._member_id: str | None = None
        self._generation = -1
        self._needs_rejoin = False
        # The partitions the group state last looked at assigns to this member.
        self._owned: tuple[GroupState | None, str | None, frozenset[TopicPartition]] = (
            None,
            None,
            frozenset(),
        )
        self._last_poll = time.monotonic()
        self._last_commit = time.monotonic()
        self._last_group_refresh = 0.0
        self._applied_group_state: GroupState | None = None  # the last one poll() applied
        self._heartbeat_stop = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None
        self._async_commits: concurrent.futures.ThreadPoolExecutor | None = None
        self._metrics = {
            "records-consumed-total": 0,
            "bytes-consumed-total": 0,
            "poll-total": 0,
            "rebalance-total": 0,
            "commit-total": 0,
        }
        if topics:
            self.subscribe(topics)

    # -- subscription and assignment ------------------------------------------------------------

    def subscribe(
        self,
        topics: Iterable[str] = (),
        pattern: str | None = None,
        listener: ConsumerRebalanceListener | None = None,
    ) -> None:
        """Subscribe to topics (or a regex ``pattern``); with a group, partitions are assigned
        by the group, otherwise every partition of every topic is read."""
        if self._manual:
            raise IllegalStateError("subscribe() after assign(): call unsubscribe() first")
        topics = [topics] if isinstance(topics, str) else list(topics)
        if bool(topics) == bool(pattern):
            raise IllegalStateError("subscribe() needs either topics or a pattern, not both")
        for topic in topics:
            validate_topic_name(topic)
        self._pattern = re.compile(pattern) if pattern else None
        self._listener = listener
        self._subscription = set(topics) if topics else self._matching_topics()
        with self._lock:
            if self._group is None:
                self._set_assignment(self._all_partitions(self._subscription))
                return
            try:
                self._join()
            except KStoreError as exc:
                if not exc.retriable:
                    raise
                # As Kafka's subscribe(), which never reaches the coordinator: the join is the
                # next poll's (retried there as a rejoin is), not an error that leaves the
                # caller without a consumer because a lease write failed once.
                log.warning(
                    "consumer %s: joining group %s failed (%s); the next poll joins",
                    self.client_id,
                    self.group_id,
                    exc,
                )
                self._needs_rejoin = True

    def unsubscribe(self) -> None:
        self._stop_heartbeat()
        with self._lock:
            self._leave_group()
            self._set_assignment([])
            self._subscription = None
            self._pattern = None
            self._manual = False

    def subscription(self) -> set[str] | None:
        return set(self._subscription) if self._subscription is not None else None

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions, outside any group assignment."""
        if self._subscription is not None:
            raise IllegalStateError("assign() after subscribe(): call unsubscribe() first")
        parts = []
        for tp in partitions:
            if not isinstance(tp, tuple) or len(tp) != 2:
                raise TypeError(f"assign() takes TopicPartition values, got {tp!r}")
            tp = TopicPartition(validate_topic_name(tp[0]), tp[1])
            self.store.partition(tp.topic, tp.partition)  # exists?
            parts.append(tp)
        self._manual = True
        self._set_assignment(parts)

    def assignment(self) -> set[TopicPartition]:
        return set(self._assigned)

    def _set_assignment(self, partitions: Iterable[TopicPartition]) -> None:
        self._assigned = sorted(set(partitions))
        keep = set(self._assigned)
        self._positions = {tp: o for tp, o in self._positions.items() if tp in keep}
        self._buffer = {tp: e for tp, e in self._buffer.items() if tp in keep}
        self._paused &= keep
        self._look_soon()

    def _look_soon(self) -> None:
        """The next poll looks at once: what it reads changed (assignment, position, pause)."""
        self._next_look = 0.0
        self._look_backoff = None

    def _matching_topics(self) -> set[str]:
        assert self._pattern is not None
        return {t for t in self.store.list_topics() if self._pattern.fullmatch(t)}

    def _all_partitions(self, topics: Iterable[str]) -> list[TopicPartition]:
        out: list[TopicPartition] = []
        for topic in sorted(topics):
            meta = self.store.topic(topic)
            out.extend(TopicPartition(topic, p) for p in range(meta.partitions))
        return out

    # -- group membership --------------------------------------------------------------------------

    def _join(self) -> None:
        assert self._group is not None
        assert self._subscription is not None
        self._member_id = f"{self.client_id}-{uuid.uuid4().hex[:12]}"
        member = Member(
            member_id=self._member_id,
            instance_id=self.config["group_instance_id"],
            client_id=self.client_id,
            topics=tuple(sorted(self._subscription)),
            assignors=tuple(self._assignors),
            session_timeout_ms=self.config["session_timeout_ms"],
            rebalance_timeout_ms=self.config["max_poll_interval_ms"],
            joined_ms=0,
        )
        state = self._group.join(member)
        self._needs_rejoin = False
        self._apply_group_state(state)
        if self._heartbeat_thread is None:
            self._heartbeat_stop.clear()
            self._heartbeat_thread = threading.Thread(
                target=self._heartbeat_loop, name=f"kstore-heartbeat-{self.client_id}", daemon=True
            )
            self._heartbeat_thread.start()

    def _stop_heartbeat(self) -> None:
        """Stop the heartbeat thread. Must not be called with self._lock held: the thread
        takes that lock, and joining it while holding the lock would deadlock."""
        self._heartbeat_stop.set()
        thread = self._heartbeat_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._heartbeat_thread = None

    def _leave_group(self) -> None:
        if (
            self._group is not None
            and self._member_id is not None
            and self.config["group_instance_id"] is None
        ):
            try:
                self._group.leave(self._member_id)
            except KStoreError as exc:
                log.warning(
                    "consumer %s: leaving group %s failed: %s", self.client_id, self.group_id, exc
                )
        self._member_id = None
        self._generation = -1

    def _heartbeat_loop(self) -> None:
        interval = self.config["heartbeat_interval_ms"] / 1000
        metadata_age = self.config["metadata_max_age_ms"] / 1000
        last_metadata = time.monotonic()
        # The heartbeats in a session timeout: each member lists the leases at least that often.
        lease_check_every = max(
            1, self.config["session_timeout_ms"] // self.config["heartbeat_interval_ms"]
        )
        # The lease (a PUT on S3) at the last heartbeat that keeps renewals at most a third of
        # the session timeout apart, not at every heartbeat: with Kafka's defaults (45 s, 3 s)
        # every 12 s. The heartbeat still reads the group log every interval.
        lease_renewal_s = max(0.0, self.config["session_timeout_ms"] / 3_000 - interval)
        while not self._heartbeat_stop.wait(interval):
            try:
                with self._lock:
                    if self._group is None or self._member_id is None or self._needs_rejoin:
                        continue
                    if (
                        time.monotonic() - self._last_poll
                        > self.config["max_poll_interval_ms"] / 1000
                    ):
                        log.warning(
                            "consumer %s: no poll() within max_poll_interval_ms; leaving group %s",
                            self.client_id,
                            self.group_id,
                        )
                        self._group.leave(self._member_id, "max_poll_interval_ms exceeded")
                        self._needs_rejoin = True
                        continue
                    check = time.monotonic() - last_metadata > metadata_age
                    if check:
                        last_metadata = time.monotonic()
                        if (
                            self._pattern is not None
                            and self._matching_topics() != self._subscription
                        ):
                            self._needs_rejoin = True  # poll() rejoins with the new topic list
                            continue
                    self._group.heartbeat(
                        self._member_id,
                        check_metadata=check,
                        lease_check_every=lease_check_every,
                        lease_renewal_s=lease_renewal_s,
                    )
            except CommitFailedError as exc:
                log.warning("consumer %s: %s", self.client_id, exc)
                self._needs_rejoin = True
            except Exception:
                log.exception("consumer %s: heartbeat failed", self.client_id)

    def _refresh_group(self, force: bool = False) -> None:
        """Apply the group's newest generation (rebalance callbacks run here, in poll()); a
        member that finds itself out of the group gives up its partitions and joins again."""
        if self._group is None or self._manual or self._subscription is None:
            return
        with self._lock:
            if not self._needs_rejoin:
                now = time.monotonic()
                if not force and now - self._last_group_refresh < self._group_refresh_interval():
                    # Between looks, what the heartbeat thread saw last (no request), once: a
                    # poll that waits comes here at every step of its backoff.
                    cached = self._group.cached_state()
                    if cached is not None and cached is not self._applied_group_state:
                        self._applied_group_state = cached
                        self._apply_group_state(cached)
                    return
                self._last_group_refresh = now
                self._applied_group_state = self._group.state()
                self._apply_group_state(self._applied_group_state)
            if self._needs_rejoin:
                self._rejoin()

    def _group_refresh_interval(self) -> float:
        """How often poll() looks at the group log itself. While partitions are being handed
        over, every 100 ms (a new owner waits for the old one's release); otherwise at the
        heartbeat's pace, which also looks, as a Kafka member learns of a rebalance from its
        heartbeat: on an object store each look is a GET, and a member polling every 100 ms
        sent ten a second for nothing."""
        heartbeat: float = self.config["heartbeat_interval_ms"] / 1000
        state = self._group.cached_state() if self._group is not None else None
        if state is None or state.pending_release:
            return min(0.1, heartbeat)
        return heartbeat

    def _rejoin(self) -> None:
        """Join again with a new member id. A member the group no longer has (expelled,
        replaced, or gone for a stalled poll) has lost its partitions: another member may
        be reading them already, so nothing is committed for them. A member still in the group
        (its pattern now matches other topics) revokes them, commits its positions (with
        auto-commit on) and leaves, so their new owners need not wait for it."""
        assert self._group is not None
        owned = set(self._assigned)
        if self._member_id is not None and self._member_id in self._group.state().members:
            if owned and self._listener is not None:
                self._listener.on_partitions_revoked(owned)
            if self.config["enable_auto_commit"] and self._positions:
                try:
                    self.commit()
                except KStoreError as exc:
                    log.warning("consumer %s: final commit failed: %s", self.client_id, exc)
            self._leave_group()
        else:
            self._lose_partitions()
        self._set_assignment([])
        if self._pattern is not None:
            self._subscription = self._matching_topics()
        self._join()

    def _lose_partitions(self) -> None:
        """Stop reading every partition at once: this member is no longer in the group."""
        self._needs_rejoin = True
        lost = set(self._assigned)
        self._set_assignment([])
        if lost and self._listener is not None:
            on_lost = getattr(self._listener, "on_partitions_lost", None)
            if callable(on_lost):
                on_lost(lost)
            else:
                self._listener.on_partitions_revoked(lost)

    def _apply_group_state(self, state: GroupState) -> None:
        assert self._group is not None
        assert self._member_id is not None
        if self._member_id not in state.members:
            self._lose_partitions()
            return
        owned = set(state.assignment.get(self._member_id, []))
        current = set(self._assigned)
        if state.generation == self._generation and owned == current:
            return
        revoked = current - owned
        if revoked:
            if self._listener is not None:
                self._listener.on_partitions_revoked(revoked)
            final = {
                tp: OffsetAndMetadata(self._positions[tp])
                for tp in revoked
                if tp in self._positions and self.config["enable_auto_commit"]
            }
            self._group.release(self._member_id, revoked, final)
        assigned = owned - current
        self._generation = state.generation
        self._set_assignment(owned)
        self._metrics["rebalance-total"] += 1
        if assigned and self._listener is not None:
            self._listener.on_partitions_assigned(assigned)

    def _fetchable(self, tp: TopicPartition) -> bool:
        return tp not in self._paused and self._owns(tp)

    def _owns(self, tp: TopicPartition) -> bool:
        """Whether this member may read ``tp`` by the newest group state it has seen (the
        heartbeat thread loads newer ones): not once it is out of the group, nor once ``tp``
        moved to another member and is no longer this member's to hand over, nor while its
        previous owner has not handed it over yet."""
        if self._group is None or self._manual:
            return True
        if self._needs_rejoin:
            return False
        state = self._group._state
        if state is None:
            return True
        member_id = self._member_id
        if member_id is None or member_id not in state.members:
            return False
        holder = state.pending_release.get(tp)
        if holder is not None:
            return holder == member_id
        seen, seen_member, owned = self._owned
        if seen is not state or seen_member != member_id:
            # One set per state: a fetch asks about every assigned partition.
            owned = frozenset(state.assignment.get(member_id, ()))
            self._owned = (state, member_id, owned)
        return tp in owned

    # -- positions -----------------------------------------------------------------------------

    def _partition(self, tp: TopicPartition, *, cached_metadata: bool = False) -> Partition:
        if not cached_metadata:
            return self.store.partition(tp.topic, tp.partition)
        now = time.monotonic()
        known = self._metadata.get(tp.topic)
        if known is None or now - known[1] > METADATA_RECHECK_S:
            known = (self.store.topic(tp.topic), now)
            self._metadata[tp.topic] = known
        return self.store.partition(tp.topic, tp.partition, known[0])

    def _reset(self, tp: TopicPartition, state: PartitionState, why: str) -> int:
        policy = self.config["auto_offset_reset"]
        if policy == "earliest":
            return state.start_offset
        if policy == "latest":
            return state.end_offset
        raise OffsetOutOfRangeError(
            f"{tp.topic}-{tp.partition}: {why} and auto_offset_reset is 'none'"
        )

    def _position_for(self, tp: TopicPartition, state: PartitionState) -> int:
        position = self._positions.get(tp)
        if position is None:
            committed = self._committed_offset(tp)
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
        self._positions[tp] = position
        return position

    def _committed_offset(self, tp: TopicPartition) -> int | None:
        if self._group is None:
            return None
        with self._lock:
            om = self._group.state().offsets.get(tp)
        return om.offset if om is not None else None

    def position(self, tp: TopicPartition) -> int:
        if tp not in self._assigned:
            raise IllegalStateError(f"{tp} is not assigned to this consumer")
        return self._position_for(tp, self._partition(tp).state())

    def seek(self, partition: TopicPartition, offset: int) -> None:
        if partition not in self._assigned:
            raise IllegalStateError(f"{partition} is not assigned to this consumer")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise ValueError(f"seek offset must be a non-negative integer, got {offset!r}")
        self._positions[partition] = offset
        self._look_soon()

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self._assigned):
            self.seek(tp, self._partition(tp).state().start_offset)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self._assigned):
            self.seek(tp, self._partition(tp).state().end_offset)

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._partition(tp).state().start_offset for tp in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._partition(tp).state().end_offset for tp in partitions}

    def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition, the earliest offset whose timestamp is at or after the given one."""
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp, ts in timestamps.items():
            if not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
                raise ValueError(
                    f"timestamp for {tp} must be a non-negative integer (ms), got {ts!r}"
                )
            part = self._partition(tp)
            state = part.state()
            offset = part.offset_for_timestamp(ts, state)
            if offset is None:
                out[tp] = None
                continue
            batch = next(part.read(offset, 1, state=state, columns=["timestamp", "offset"]))
            found = int(batch.column("timestamp").cast(pa.int64())[0].as_py()) // 1000
            out[tp] = OffsetAndTimestamp(offset, found)
        return out

    def pause(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            if tp not in self._assigned:
                raise IllegalStateError(f"{tp} is not assigned to this consumer")
            self._paused.add(tp)

    def resume(self, *partitions: TopicPartition) -> None:
        self._paused -= set(partitions)
        self._look_soon()

    def paused(self) -> set[TopicPartition]:
        return set(self._paused)

    def topics(self) -> set[str]:
        return set(self.store.list_topics())

    def partitions_for_topic(self, topic: str) -> set[int]:
        try:
            return set(range(self.store.topic(topic).partitions))
        except UnknownTopicOrPartitionError:
            return set()

    # -- fetching ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("consumer is closed")
        if self._subscription is None and not self._manual:
            raise IllegalStateError(
                "consumer is not subscribed to any topic or assigned any partition"
            )

    def _fetch_batches(self, max_records: int) -> dict[TopicPartition, list[pa.RecordBatch]]:
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
        parts = self._assigned
        if not buffer or not parts:
            return out
        start = self._rotation % len(parts)
        self._rotation += 1
        remaining = max_records
        consumed_bytes = 0
        for tp in parts[start:] + parts[:start]:
            entry = buffer.get(tp)
            if entry is None:
                continue
            first, sized = entry
            if self._positions.get(tp, first) != first or not self._owns(tp):
                del buffer[tp]
                continue
            if tp in self._paused or remaining <= 0:
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
            self._positions[tp] = position
            if sized:
                buffer[tp] = (position, sized)
            else:
                del buffer[tp]
        if out:
            self._metrics["records-consumed-total"] += sum(
                b.num_rows for batches in out.values() for b in batches
            )
            self._metrics["bytes-consumed-total"] += consumed_bytes
        return out

    def _fill(self) -> None:
        """One fetch into the buffer: every assigned partition that has nothing buffered, from
        its position, within ``fetch_max_bytes`` (and ``max_partition_fetch_bytes`` each)."""
        budget = self.config["fetch_max_bytes"]
        parts = self._assigned
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
            if not self._fetchable(tp) or tp in self._buffer:
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
                    and self._positions.get(tp) == position
                    and shared_state(shared).partitions.get(tp.partition) is raw
                ):
                    caught_up[tp] = seen
                    continue
            partition = self._partition(tp, cached_metadata=True)
            if partition.topic_log is None:
                state = partition.state(tail=True)
                tailed[id(partition.log)] = partition.log
                per_partition_logs = True
            else:
                state = shared_state(partition.topic_log).partition(tp.partition)
            if state.sealed_layout is not None:
                # Upgraded (PROTOCOL.md 8.29): the topic log is read from the next poll on.
                self._metadata.pop(tp.topic, None)
            plan.append((tp, partition, state))
        self._tailed = list(tailed.values())
        # Only partitions with a position: establishing one here would commit it later, for a
        # partition this poll may not reach (a never-read partition has no committed offset).
        prefetch(
            [
                (partition, state, self._positions[tp], self._visible_end(state))
                for tp, partition, state in plan
                if tp in self._positions
            ],
            max_bytes=budget,
            partition_max_bytes=self.config["max_partition_fetch_bytes"],
        )
        for tp, partition, state in plan:
            if budget <= 0:
                break
            established = tp in self._positions
            position = self._position_for(tp, state)
            visible_end = self._visible_end(state)
            if position >= visible_end:
                if established:
                    note_caught_up(tp, partition.topic_log, position)
                continue
            if not established:
                # A position is set when a poll returns records from it, not by the fetch: a
                # commit must not record a position for a partition no poll has reached.
                del self._positions[tp]
            try:
                # A segment of ``state`` whose file a merge and vacuum deleted meanwhile (a
                # pause longer than file.delete.delay.ms) is read from the newest state's
                # live files (Partition.read_tables, PROTOCOL.md 24 item 8).
                sized = list(
                    partition.read_sized(
                        position,
                        state=state,
                        committed_only=self._read_committed,
                        max_bytes=min(budget, self.config["max_partition_fetch_bytes"]),
                    )
                )
            except OffsetOutOfRangeError:
                # Retention removed the offsets while they were being read: the next fetch,
                # from the newest state, resets the position (auto_offset_reset).
                continue
            if not any(batch.num_rows for batch, _ in sized):
                # Only gaps (compaction, aborted transactions) up to the visible end: skip them.
                self._positions[tp] = visible_end
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
            self._note_arrival()
        elif not per_partition_logs and self._metadata:
            self._idle = _IdleFetch(
                tuple(asked.values()),
                dict(self._positions),
                parts,
                frozenset(self._paused),
                self._ownership(),
                dict(self._metadata),
                min(at for _, at in self._metadata.values()) + METADATA_RECHECK_S,
            )

    def _ownership(self) -> tuple[object, ...]:
        """What :meth:`_owns` answers from, compared by identity."""
        group_state = self._group._state if self._group is not None else None
        return (group_state, self._member_id, self._needs_rejoin, self._manual)

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
        if (
            now > idle.metadata_until
            or idle.assigned is not self._assigned
            or idle.paused != self._paused
            or idle.positions != self._positions
            or idle.metadata != self._metadata
            or any(a is not b for a, b in zip(idle.ownership, self._ownership(), strict=True))
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

    def _note_arrival(self) -> None:
        """A fetch found new records: learn how often they come (an average of the gaps
        between such fetches) and expect the next a little before that. A tailing reader on
        an object store then asks for the next version about once per producer flush instead
        of on a backoff from half a millisecond (several GETs that find nothing per flush)."""
        now = time.monotonic()
        self._look_soon()
        if self._last_arrival is not None:
            gap = min(now - self._last_arrival, ARRIVAL_GAP_MAX_S)
            self._arrival_gap = (
                gap if self._arrival_gap is None else 0.8 * self._arrival_gap + 0.2 * gap
            )
            self._next_arrival = now + ARRIVAL_EARLY * self._arrival_gap
        self._last_arrival = now

    def _found_lately(self, now: float) -> bool:
        """Whether a fetch found records within ARRIVAL_GAP_MAX_S of ``now``."""
        return self._last_arrival is not None and now - self._last_arrival < ARRIVAL_GAP_MAX_S

    def _local_look_step(self) -> float:
        """How far apart a reader on local disk that found records lately looks for more."""
        gap = self._arrival_gap
        if gap is None:
            return LOCAL_LOOK_MAX_S
        return min(LOCAL_LOOK_MAX_S, max(LOCAL_LOOK_MIN_S, LOCAL_LOOK_SHARE * gap))

    def _next_due(self) -> float | None:
        """Seconds until the next commit a tailed log's writers are due to land (negative: one
        is late), or None when no writer's rhythm is known (kstore.rhythm)."""
        dues = [d for log in self._tailed if (d := log.next_due()) is not None]
        return min(dues) if dues else None

    def _visible_end(self, state: PartitionState) -> int:
        return state.last_stable_offset if self._read_committed else state.end_offset

    def _poll_loop(
        self, timeout_ms: float, fetch: Callable[[], dict[TopicPartition, Any]]
    ) -> dict[TopicPartition, Any]:
        self._check_open()
        self._last_poll = time.monotonic()
        self._metrics["poll-total"] += 1
        deadline = time.monotonic() + max(0.0, timeout_ms) / 1000
        cap = self.config["fetch_max_wait_ms"] / 1000
        remote = self.store.storage.is_remote
        backoff = 0.0005
        if not remote and self._found_lately(time.monotonic()):
            backoff = self._local_look_step()
        if remote and self._arrival_gap is not None:
            backoff = min(cap, max(backoff, ARRIVAL_STEP * self._arrival_gap))
        if remote and self._look_backoff is not None:
            backoff = self._look_backoff  # the backoff the last polls' misses reached
        while True:
            self._refresh_group()
            self._maybe_auto_commit()
            if not self._buffer and remote:
                # On an object store every look is a GET: none before new data is due, within
                # what this poll may wait. When the producers' rhythms are known, when the
                # next of their commits is due; else a little before the average gap; and
                # after a look that found nothing, not before its backoff has passed. A poll
                # that ends before then returns nothing without a look.
                now = time.monotonic()
                due = self._next_due()
                wait = max(self._next_look - now, self._next_arrival - now if due is None else due)
                left = deadline - now
                if min(wait, cap) > left:
                    if left > 0:
                        time.sleep(left)
                    return {}
                if wait > 0:
                    time.sleep(min(wait, cap))
            result = fetch()
            if result:
                return result
            now = time.monotonic()
            left = deadline - now
            due = self._next_due() if remote else None
            if due is not None and due > backoff:
                # Nothing was late: the next commit due is further off than a backoff step.
                step = due
            else:
                step = backoff
                lately = not remote and self._found_lately(now)
                limit = min(cap, self._local_look_step()) if lately else cap
                backoff = min(limit, backoff * 2)
            if remote:
                self._next_look, self._look_backoff = now + step, backoff
            if left <= 0:
                return {}
            time.sleep(min(step, left))

    def poll(
        self, timeout_ms: float = 0, max_records: int | None = None, update_offsets: bool = True
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records from the assigned partitions, waiting up to ``timeout_ms`` for some."""
        limit = self._limit(max_records)

        def fetch() -> dict[TopicPartition, Any]:
            saved = None if update_offsets else dict(self._positions)
            batches = self._fetch_batches(limit)
            if saved is not None:
                self._positions = saved
            return self._to_records(batches)

        return self._poll_loop(timeout_ms, fetch)

    def poll_batches(
        self, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[pa.RecordBatch]]:
        """Like poll(), but records come as Arrow batches (columns key, value, timestamp,
        headers, offset): no per-record Python objects, for bulk readers."""
        limit = self._limit(max_records)
        return self._poll_loop(timeout_ms, lambda: self._fetch_batches(limit))

    def _limit(self, max_records: int | None) -> int:
        limit = self.config["max_poll_records"] if max_records is None else max_records
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise ValueError(f"max_records must be a positive integer, got {max_records!r}")
        return int(limit)

    def _timestamp_type(self, topic: str) -> int:
        kind = self._timestamp_types.get(topic)
        if kind is None:
            effective = self.store.topic(topic).effective_config
            kind = 1 if effective["message.timestamp.type"] == "LogAppendTime" else 0
            self._timestamp_types[topic] = kind
        return kind

    def _to_records(
        self, batches: dict[TopicPartition, list[pa.RecordBatch]]
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Arrow batches to ConsumerRecords, column by column and a topic at a time: every
        per-record step below is a C-level iteration (``map``/``zip``/``repeat``), since poll()
        builds one Python object per record and is bound by exactly that. A fetch of many
        partitions often holds a record or two per partition (a producer's flush spread over
        them): the partitions of a topic are joined into one batch and converted in one pass,
        whose fixed cost then comes once per poll, not once per partition (at 44 partitions of
        one record, a quarter of the time)."""
        # The cyclic garbage collector would run every 700 new tuples and rescan the growing
        # list of records each time, costing more than building them; these records hold
        # no reference cycles, so it is paused while they are made (and restored after).
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            out: dict[TopicPartition, list[ConsumerRecord]] = {}
            by_topic: dict[str, list[TopicPartition]] = {}
            for tp in batches:
                by_topic.setdefault(tp.topic, []).append(tp)
            for topic, tps in by_topic.items():
                flat = [b for tp in tps for b in batches[tp]]
                counts = [sum(b.num_rows for b in batches[tp]) for tp in tps]
                if not flat:
                    out.update((tp, []) for tp in tps)
                    continue
                try:
                    whole = pa.concat_batches(flat) if len(flat) > 1 else flat[0]
                except (pa.ArrowInvalid, pa.ArrowTypeError):  # schemas differ: batch by batch
                    for tp in tps:
                        out[tp] = [
                            record
                            for batch in batches[tp]
                            for record in self._build_records(
                                topic, batch, repeat(tp.partition, batch.num_rows)
                            )
                        ]
                    continue
                partitions = chain.from_iterable(
                    repeat(tp.partition, count) for tp, count in zip(tps, counts, strict=True)
                )
                records = self._build_records(topic, whole, partitions)
                start = 0
                for tp, count in zip(tps, counts, strict=True):
                    out[tp] = records[start : start + count]
                    start += count
            return out
        finally:
            if paused:
                gc.enable()

    def _build_records(
        self, topic: str, batch: pa.RecordBatch, partitions: Iterable[int]
    ) -> list[ConsumerRecord]:
        """The records of ``batch``, of ``topic``; ``partitions`` gives each record's."""
        key_de = self.config["key_deserializer"]
        value_de = self.config["value_deserializer"]
        ts_type = self._timestamp_type(topic)
        n = batch.num_rows
        key_col, value_col, header_col = batch.column(0), batch.column(1), batch.column(3)
        keys = key_col.to_pylist()
        # Typed values come back as dicts (maps too, rather than lists of pairs).
        values = (
            value_col.to_pylist(maps_as_pydicts="strict")
            if pa.types.is_struct(value_col.type)
            else value_col.to_pylist()
        )
        # Never null (segments refuse null timestamps); read without Array.to_numpy, which
        # imports pandas on first use. timestamp[us] is int64 microseconds: viewed as they
        # are, not cast.
        stamps = (numpy_values(batch.column(2), np.int64) // 1000).tolist()
        offsets = numpy_values(batch.column(4), np.int64).tolist()
        if header_col.null_count == n:
            headers: Iterable[Any] = repeat((), n)
        else:
            headers = [
                tuple((h["key"], h["value"]) for h in hs) if hs else ()
                for hs in header_col.to_pylist()
            ]
        key_sizes = _sizes(key_col, keys)
        value_sizes = _sizes(value_col, values)
        if key_de is not None:
            keys = [key_de(k) if k is not None else None for k in keys]
        if value_de is not None:
            values = [value_de(v) if v is not None else None for v in values]
        rows = zip(
            repeat(topic),
            partitions,
            offsets,
            stamps,
            repeat(ts_type),
            keys,
            values,
            headers,
            repeat(None),
            key_sizes,
            value_sizes,
            repeat(-1),
            repeat(-1),
        )
        return list(map(tuple.__new__, repeat(ConsumerRecord), rows))

    def __iter__(self) -> Iterator[ConsumerRecord]:
        timeout = self.config["consumer_timeout_ms"]
        last_record = time.monotonic()
        while True:
            batch = self.poll(timeout_ms=min(1000.0, timeout))
            if batch:
                last_record = time.monotonic()
                for records in batch.values():
                    yield from records
            elif (time.monotonic() - last_record) * 1000 >= timeout:
                return

    # -- commits -------------------------------------------------------------------------------

    def _maybe_auto_commit(self) -> None:
        if not self.config["enable_auto_commit"] or self._group is None:
            return
        if time.monotonic() - self._last_commit < self.config["auto_commit_interval_ms"] / 1000:
            return
        self._last_commit = time.monotonic()
        if not self._positions:
            return
        try:
            self.commit()
        except CommitFailedError as exc:
            log.warning("consumer %s: auto-commit rejected (%s); will rejoin", self.client_id, exc)
            self._refresh_group(force=True)

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata | int] | None = None) -> None:
        """Commit offsets (default: the current positions) in one atomic group log entry."""
        if self._group is None:
            raise IllegalStateError("commit() needs a group_id")
        if offsets is None:
            offsets = {
                tp: OffsetAndMetadata(o)
                for tp, o in self._positions.items()
                if tp in self._assigned
            }
        normalised = normalized_offsets(offsets)  # checked: names the partition and offset
        if not normalised:
            return
        with self._lock:
            if self._manual:
                self._group.commit_offsets(normalised, member_id=None, generation=-1)
            else:
                if self._member_id is None:
                    raise CommitFailedError(
                        "this consumer is not a member of the group (it must rejoin)"
                    )
                try:
                    self._group.commit_offsets(
                        normalised, member_id=self._member_id, generation=self._generation
                    )
                except CommitFailedError:
                    # The group moved on (a rebalance, or this member was expelled): the next
                    # poll() applies its newest state, whatever the refresh interval.
                    self._last_group_refresh = 0.0
                    raise
        self._metrics["commit-total"] += 1
        self._last_commit = time.monotonic()

    def commit_async(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata | int] | None = None,
        callback: Callable[[dict[TopicPartition, Any], BaseException | None], Any] | None = None,
    ) -> concurrent.futures.Future[None]:
        """Commit in the background; ``callback(offsets, exception)`` runs when done."""
        if offsets is None:
            offsets = {
                tp: OffsetAndMetadata(o)
                for tp, o in self._positions.items()
                if tp in self._assigned
            }
        if self._async_commits is None:
            self._async_commits = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="kstore-commit"
            )
        snapshot = dict(offsets)

        def run() -> None:
            error: BaseException | None = None
            try:
                self.commit(snapshot)
            except BaseException as exc:
                error = exc
                raise
            finally:
                if callback is not None:
                    callback(snapshot, error)

        return self._async_commits.submit(run)

    def committed(
        self, partition: TopicPartition, metadata: bool = False
    ) -> int | OffsetAndMetadata | None:
        if self._group is None:
            raise IllegalStateError("committed() needs a group_id")
        with self._lock:
            om = self._group.state().offsets.get(partition)
        if om is None:
            return None
        return om if metadata else om.offset

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self, autocommit: bool = True) -> None:
        if self._closed:
            return
        try:
            if (
                autocommit
                and self.config["enable_auto_commit"]
                and self._group is not None
                and self._positions
            ):
                try:
                    self.commit()
                except KStoreError as exc:
                    log.warning("consumer %s: final commit failed: %s", self.client_id, exc)
            self._stop_heartbeat()
            with self._lock:
                self._leave_group()
        finally:
            if self._async_commits is not None:
                self._async_commits.shutdown(wait=True)
            self._closed = True

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def metrics(self) -> dict[str, float]:
        return dict(self._metrics)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """For a transactional producer's send_offsets_to_transaction()."""
        if self.group_id is None:
            raise IllegalStateError("group_metadata() needs a group_id")
        return ConsumerGroupMetadata(
            self.group_id,
            self._generation if not self._manual else -1,
            None if self._manual else self._member_id,
            self.config["group_instance_id"],
        )

    @property
    def member_id(self) -> str | None:
        return self._member_id

    @property
    def generation(self) -> int:
        return self._generation
