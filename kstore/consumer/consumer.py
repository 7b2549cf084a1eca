"""The consumer: Kafka's client API over the store, alone or as a member of a group.

A consumer reads partitions by polling their manifest logs for the next version by name (no
listing) and reading the segments that hold the requested offsets. In a group, a heartbeat
thread keeps the member's lease in the group log; ``poll()`` applies rebalances (calling the
listener) and auto-commits positions, as Kafka's client does.

``Consumer`` is the facade over its parts, each given what it needs when it is built here:
the subscription state (what is read, from where), the fetcher (reading it), the pacer (when
a poll looks for new records) and, with a ``group_id``, the group membership (kstore.consumer's
other modules).
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import pyarrow as pa

from kstore.consumer.builder import RecordBuilder
from kstore.consumer.config import DEFAULT_CONFIG, consumer_config
from kstore.consumer.fetcher import Fetcher, NoGroup
from kstore.consumer.membership import GroupMembership
from kstore.consumer.pacing import Pacer
from kstore.consumer.subscription import ConsumerRebalanceListener, SubscriptionState
from kstore.errors import (
    IllegalStateError,
    InvalidArgumentError,
    UnknownTopicOrPartitionError,
)
from kstore.groups import Group
from kstore.names import validate_group_id
from kstore.records import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
)
from kstore.store import Store

log = logging.getLogger("kstore.consumer")


class Consumer:
    """Reads records from a store's topics, with kafka-python's ``KafkaConsumer`` API.

    >>> consumer = Consumer("clicks", store="file:///tmp/ks", group_id="stats")  # doctest: +SKIP
    >>> for record in consumer: ...  # doctest: +SKIP
    """

    def __init__(
        self, *topics: str, store: Store | str, group_id: str | None = None, **configs: Any
    ) -> None:
        # Validated here, once (kstore.consumer.config); poll() reads only what is bound below.
        cfg = consumer_config(configs)
        self.config = cfg
        self.store = (
            store
            if isinstance(store, Store)
            else Store(store, cfg["storage_options"], create=False)
        )
        self.group_id = validate_group_id(group_id) if group_id is not None else None
        self.client_id = cfg["client_id"] or f"consumer-{uuid.uuid4().hex[:8]}"

        self._closed = False
        self._polls = 0
        self._subscription = SubscriptionState(self.store, self._reading_changed)
        self._pacer = Pacer(
            remote=self.store.storage.is_remote, max_wait_ms=cfg["fetch_max_wait_ms"]
        )
        self._membership = (
            GroupMembership(
                Group(self.store, self.group_id),
                self._subscription,
                client_id=self.client_id,
                instance_id=cfg["group_instance_id"],
                assignors=list(cfg["partition_assignment_strategy"]),
                session_timeout_ms=cfg["session_timeout_ms"],
                heartbeat_interval_ms=cfg["heartbeat_interval_ms"],
                max_poll_interval_ms=cfg["max_poll_interval_ms"],
                metadata_max_age_ms=cfg["metadata_max_age_ms"],
                auto_commit=bool(cfg["enable_auto_commit"]),
                auto_commit_interval_ms=cfg["auto_commit_interval_ms"],
            )
            if self.group_id is not None
            else None
        )
        self._fetcher = Fetcher(
            self.store,
            self._subscription,
            self._membership if self._membership is not None else NoGroup(),
            self._pacer,
            auto_offset_reset=cfg["auto_offset_reset"],
            read_committed=cfg["isolation_level"] == "read_committed",
            fetch_max_bytes=cfg["fetch_max_bytes"],
            max_partition_fetch_bytes=cfg["max_partition_fetch_bytes"],
        )
        self._records = RecordBuilder(
            self.store, cfg["key_deserializer"], cfg["value_deserializer"]
        )
        # The parts' methods every poll calls, bound once. What each look of a poll does
        # first: the group's duties (none without a group).
        self._poll_duties: Callable[[], None] = (
            self._membership.poll_duties if self._membership is not None else _nothing
        )
        self._note_poll: Callable[[], None] = (
            self._membership.note_poll if self._membership is not None else _nothing
        )
        self._pace = self._pacer.run
        self._buffered = self._fetcher.has_buffered
        self._fetch_batches = self._fetcher.fetch
        self._to_records = self._records.to_records
        self._async_commits: concurrent.futures.ThreadPoolExecutor | None = None
        if topics:
            self.subscribe(topics)

    def _reading_changed(self) -> None:
        """The assignment, a position or the pauses changed: the buffer keeps only what is
        still assigned, and the next poll looks at once."""
        self._fetcher.retain_assigned()
        self._pacer.look_soon()

    # -- subscription and assignment ------------------------------------------------------------

    def subscribe(
        self,
        topics: Iterable[str] = (),
        pattern: str | None = None,
        listener: ConsumerRebalanceListener | None = None,
    ) -> None:
        """Subscribe to topics (or a regex ``pattern``); with a group, partitions are assigned
        by the group, otherwise every partition of every topic is read."""
        self._subscription.subscribe(topics, pattern, listener)
        if self._membership is None:
            self._subscription.set_assignment(self._subscription.subscribed_partitions())
        else:
            self._membership.join()

    def unsubscribe(self) -> None:
        if self._membership is not None:
            self._membership.stop_heartbeat()
            self._membership.leave()
        self._subscription.unsubscribe()

    def subscription(self) -> set[str] | None:
        topics = self._subscription.topics
        return set(topics) if topics is not None else None

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions, outside any group assignment."""
        self._subscription.assign(partitions)

    def assignment(self) -> set[TopicPartition]:
        return set(self._subscription.assigned)

    # -- positions -----------------------------------------------------------------------------

    def position(self, tp: TopicPartition) -> int:
        if tp not in self._subscription.assigned:
            raise IllegalStateError(f"{tp} is not assigned to this consumer")
        return self._fetcher.position(tp)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._subscription.seek(partition, offset)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self._subscription.assigned):
            self.seek(tp, self._fetcher.start_offset(tp))

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        for tp in partitions or tuple(self._subscription.assigned):
            self.seek(tp, self._fetcher.end_offset(tp))

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._fetcher.start_offset(tp) for tp in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._fetcher.end_offset(tp) for tp in partitions}

    def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition, the earliest offset whose timestamp is at or after the given one."""
        out: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        for tp, ts in timestamps.items():
            if not isinstance(ts, int) or isinstance(ts, bool) or ts < 0:
                raise InvalidArgumentError(
                    f"timestamp for {tp} must be a non-negative integer (ms), got {ts!r}"
                )
            out[tp] = self._fetcher.offset_for_time(tp, ts)
        return out

    def pause(self, *partitions: TopicPartition) -> None:
        self._subscription.pause(*partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._subscription.resume(*partitions)

    def paused(self) -> set[TopicPartition]:
        return set(self._subscription.paused)

    def topics(self) -> set[str]:
        return set(self.store.list_topics())

    def partitions_for_topic(self, topic: str) -> set[int]:
        try:
            return set(range(self.store.topic(topic).partitions))
        except UnknownTopicOrPartitionError:
            return set()

    # -- polling -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError("consumer is closed")
        if not self._subscription.active:
            raise IllegalStateError(
                "consumer is not subscribed to any topic or assigned any partition"
            )

    def _poll_loop(
        self, timeout_ms: float, fetch: Callable[[], dict[TopicPartition, Any]]
    ) -> dict[TopicPartition, Any]:
        self._check_open()
        self._note_poll()
        self._polls += 1
        return self._pace(timeout_ms, fetch, self._poll_duties, self._buffered)

    def poll(
        self, timeout_ms: float = 0, max_records: int | None = None, update_offsets: bool = True
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records from the assigned partitions, waiting up to ``timeout_ms`` for some."""
        limit = self._limit(max_records)
        fetch_batches, to_records = self._fetch_batches, self._to_records
        subscription = self._subscription

        def fetch() -> dict[TopicPartition, Any]:
            saved = None if update_offsets else dict(subscription.positions)
            batches = fetch_batches(limit)
            if saved is not None:
                subscription.restore_positions(saved)
            return to_records(batches)

        return self._poll_loop(timeout_ms, fetch)

    def poll_batches(
        self, timeout_ms: float = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[pa.RecordBatch]]:
        """Like poll(), but records come as Arrow batches (columns key, value, timestamp,
        headers, offset): no per-record Python objects, for bulk readers."""
        limit = self._limit(max_records)
        fetch_batches = self._fetch_batches
        return self._poll_loop(timeout_ms, lambda: fetch_batches(limit))

    def _limit(self, max_records: int | None) -> int:
        limit = self.config["max_poll_records"] if max_records is None else max_records
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidArgumentError(
                f"max_records must be a positive integer, got {max_records!r}"
            )
        return int(limit)

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

    def _group(self, method: str) -> GroupMembership:
        if self._membership is None:
            raise IllegalStateError(f"{method}() needs a group_id")
        return self._membership

    def commit(self, offsets: dict[TopicPartition, OffsetAndMetadata | int] | None = None) -> None:
        """Commit offsets (default: the current positions) in one atomic group log entry."""
        self._group("commit").commit(offsets)

    def commit_async(
        self,
        offsets: dict[TopicPartition, OffsetAndMetadata | int] | None = None,
        callback: Callable[[dict[TopicPartition, Any], BaseException | None], Any] | None = None,
    ) -> concurrent.futures.Future[None]:
        """Commit in the background; ``callback(offsets, exception)`` runs when done."""
        if offsets is None:
            offsets = dict(self._subscription.offsets_to_commit())
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
        om = self._group("committed").committed(partition)
        if om is None:
            return None
        return om if metadata else om.offset

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self, autocommit: bool = True) -> None:
        if self._closed:
            return
        try:
            if self._membership is not None:
                self._membership.close(autocommit)
        finally:
            if self._async_commits is not None:
                self._async_commits.shutdown(wait=True)
            self._closed = True

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def metrics(self) -> dict[str, float]:
        fetched = self._fetcher.metrics()
        group = (
            self._membership.metrics()
            if self._membership is not None
            else {"rebalance-total": 0, "commit-total": 0}
        )
        return {
            "records-consumed-total": fetched["records-consumed-total"],
            "bytes-consumed-total": fetched["bytes-consumed-total"],
            "poll-total": self._polls,
            **{k: v for k, v in group.items() if k.startswith("group-")},
            "rebalance-total": group["rebalance-total"],
            "commit-total": group["commit-total"],
        }

    def group_metadata(self) -> ConsumerGroupMetadata:
        """For a transactional producer's send_offsets_to_transaction()."""
        if self.group_id is None:
            raise IllegalStateError("group_metadata() needs a group_id")
        manual = self._subscription.manual
        return ConsumerGroupMetadata(
            self.group_id,
            self.generation if not manual else -1,
            None if manual else self.member_id,
            self.config["group_instance_id"],
        )

    @property
    def member_id(self) -> str | None:
        return self._membership.member_id if self._membership is not None else None

    @property
    def generation(self) -> int:
        return self._membership.generation if self._membership is not None else -1


def _nothing() -> None:
    pass


__all__ = ["DEFAULT_CONFIG", "Consumer", "ConsumerRebalanceListener"]
