"""A consumer's membership of its group (Kafka's ConsumerCoordinator): joining, the heartbeat
thread that keeps the member's lease, rebalances applied from poll() with the listener's
callbacks, ownership of partitions while they are handed over, and offset commits, all
through the group log (kstore.groups).

Rebalances are cooperative: a member keeps the partitions it still owns, and a partition that
moves is read by its new owner only once the previous owner has released it (committing its
final position) or left the group, so no two live members ever read a partition at once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping

from kstore.consumer.subscription import SubscriptionState
from kstore.errors import CommitFailedError, KStoreError
from kstore.groups import Group, GroupState, Member, normalized_offsets
from kstore.records import OffsetAndMetadata, TopicPartition

log = logging.getLogger("kstore.consumer")


class GroupMembership:
    """One consumer's membership of ``group``, over the assignment in ``subscription``."""

    def __init__(
        self,
        group: Group,
        subscription: SubscriptionState,
        *,
        client_id: str,
        instance_id: str | None,
        assignors: list[str],
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
        max_poll_interval_ms: int,
        metadata_max_age_ms: int,
        auto_commit: bool,
        auto_commit_interval_ms: int,
    ) -> None:
        self._group = group
        self._subscription = subscription
        self._client_id = client_id
        self._instance_id = instance_id
        self._assignors = tuple(assignors)
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._max_poll_interval_ms = max_poll_interval_ms
        self._metadata_max_age_ms = metadata_max_age_ms
        self._auto_commit = auto_commit
        self._auto_commit_interval_ms = auto_commit_interval_ms

        self._lock = threading.RLock()  # guards group state shared with the heartbeat thread
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
        self._rebalances = 0
        self._commits = 0

    @property
    def group_id(self) -> str:
        return self._group.group_id

    @property
    def member_id(self) -> str | None:
        return self._member_id

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def needs_rejoin(self) -> bool:
        """Whether this member found itself out of the group (its next poll joins again)."""
        return self._needs_rejoin

    def metrics(self) -> dict[str, int]:
        """Rebalances and commits, and the group log's shared commits (PROTOCOL.md 31)."""
        return {
            **self._group.metrics,
            "rebalance-total": self._rebalances,
            "commit-total": self._commits,
        }

    # -- joining and leaving ------------------------------------------------------------------------

    def join(self) -> None:
        """Join with the subscription's topics; a failure worth retrying leaves the join to
        the next poll."""
        with self._lock:
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
                    self._client_id,
                    self.group_id,
                    exc,
                )
                self._needs_rejoin = True

    def _join(self) -> None:
        topics = self._subscription.topics
        assert topics is not None
        self._member_id = f"{self._client_id}-{uuid.uuid4().hex[:12]}"
        member = Member(
            member_id=self._member_id,
            instance_id=self._instance_id,
            client_id=self._client_id,
            topics=tuple(sorted(topics)),
            assignors=self._assignors,
            session_timeout_ms=self._session_timeout_ms,
            rebalance_timeout_ms=self._max_poll_interval_ms,
            joined_ms=0,
        )
        state = self._group.join(member)
        self._needs_rejoin = False
        self._apply_group_state(state)
        if self._heartbeat_thread is None:
            self._heartbeat_stop.clear()
            self._heartbeat_thread = threading.Thread(
                target=self._heartbeat_loop,
                name=f"kstore-heartbeat-{self._client_id}",
                daemon=True,
            )
            self._heartbeat_thread.start()

    def stop_heartbeat(self) -> None:
        """Stop the heartbeat thread (no more heartbeats: the session expires unless the
        member leaves). Must not be called with the lock held: the thread takes that lock,
        and joining it while holding the lock would deadlock."""
        self._heartbeat_stop.set()
        thread = self._heartbeat_thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self._heartbeat_thread = None

    def leave(self) -> None:
        """Leave the group (a static member, with ``group_instance_id``, stays in it)."""
        with self._lock:
            self._leave_group()

    def _leave_group(self) -> None:
        if self._member_id is not None and self._instance_id is None:
            try:
                self._group.leave(self._member_id)
            except KStoreError as exc:
                log.warning(
                    "consumer %s: leaving group %s failed: %s", self._client_id, self.group_id, exc
                )
        self._member_id = None
        self._generation = -1

    def close(self, autocommit: bool) -> None:
        """Commit the positions (with ``autocommit`` and auto-commit on), stop heartbeats and
        leave the group."""
        if autocommit and self._auto_commit and self._subscription.positions:
            try:
                self.commit()
            except KStoreError as exc:
                log.warning("consumer %s: final commit failed: %s", self._client_id, exc)
        self.stop_heartbeat()
        self.leave()

    def _heartbeat_loop(self) -> None:
        interval = self._heartbeat_interval_ms / 1000
        metadata_age = self._metadata_max_age_ms / 1000
        last_metadata = time.monotonic()
        # The heartbeats in a session timeout: each member lists the leases at least that often.
        lease_check_every = max(1, self._session_timeout_ms // self._heartbeat_interval_ms)
        # The lease (a PUT on S3) at the last heartbeat that keeps renewals at most a third of
        # the session timeout apart, not at every heartbeat: with Kafka's defaults (45 s, 3 s)
        # every 12 s. The heartbeat still reads the group log every interval.
        lease_renewal_s = max(0.0, self._session_timeout_ms / 3_000 - interval)
        subscription = self._subscription
        while not self._heartbeat_stop.wait(interval):
            try:
                with self._lock:
                    if self._member_id is None or self._needs_rejoin:
                        continue
                    if time.monotonic() - self._last_poll > self._max_poll_interval_ms / 1000:
                        log.warning(
                            "consumer %s: no poll() within max_poll_interval_ms; leaving group %s",
                            self._client_id,
                            self.group_id,
                        )
                        self._group.leave(self._member_id, "max_poll_interval_ms exceeded")
                        self._needs_rejoin = True
                        continue
                    check = time.monotonic() - last_metadata > metadata_age
                    if check:
                        last_metadata = time.monotonic()
                        if (
                            subscription.pattern is not None
                            and subscription.matching_topics() != subscription.topics
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
                log.warning("consumer %s: %s", self._client_id, exc)
                self._needs_rejoin = True
            except Exception:
                log.exception("consumer %s: heartbeat failed", self._client_id)

    # -- what poll() does ---------------------------------------------------------------------------

    def note_poll(self) -> None:
        """A poll began: the member is alive (max_poll_interval_ms)."""
        self._last_poll = time.monotonic()

    def poll_duties(self) -> None:
        """At each look of a poll: apply the group's newest state, auto-commit when due."""
        self.refresh()
        self._maybe_auto_commit()

    def refresh(self, force: bool = False) -> None:
        """Apply the group's newest generation (rebalance callbacks run here, in poll()); a
        member that finds itself out of the group gives up its partitions and joins again."""
        subscription = self._subscription
        if subscription.manual or subscription.topics is None:
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
        heartbeat: float = self._heartbeat_interval_ms / 1000
        state = self._group.cached_state()
        if state is None or state.pending_release:
            return min(0.1, heartbeat)
        return heartbeat

    def _rejoin(self) -> None:
        """Join again with a new member id. A member the group no longer has (expelled,
        replaced, or gone for a stalled poll) has lost its partitions: another member may
        be reading them already, so nothing is committed for them. A member still in the group
        (its pattern now matches other topics) revokes them, commits its positions (with
        auto-commit on) and leaves, so their new owners need not wait for it."""
        subscription = self._subscription
        owned = set(subscription.assigned)
        if self._member_id is not None and self._member_id in self._group.state().members:
            listener = subscription.listener
            if owned and listener is not None:
                listener.on_partitions_revoked(owned)
            if self._auto_commit and subscription.positions:
                try:
                    self.commit()
                except KStoreError as exc:
                    log.warning("consumer %s: final commit failed: %s", self._client_id, exc)
            self._leave_group()
        else:
            self._lose_partitions()
        subscription.set_assignment([])
        subscription.follow_pattern()
        self._join()

    def _lose_partitions(self) -> None:
        """Stop reading every partition at once: this member is no longer in the group."""
        self._needs_rejoin = True
        subscription = self._subscription
        lost = set(subscription.assigned)
        subscription.set_assignment([])
        listener = subscription.listener
        if lost and listener is not None:
            on_lost = getattr(listener, "on_partitions_lost", None)
            if callable(on_lost):
                on_lost(lost)
            else:
                listener.on_partitions_revoked(lost)

    def _apply_group_state(self, state: GroupState) -> None:
        assert self._member_id is not None
        if self._member_id not in state.members:
            self._lose_partitions()
            return
        subscription = self._subscription
        owned = set(state.assignment.get(self._member_id, []))
        current = set(subscription.assigned)
        if state.generation == self._generation and owned == current:
            return
        revoked = current - owned
        listener = subscription.listener
        if revoked:
            if listener is not None:
                listener.on_partitions_revoked(revoked)
            positions = subscription.positions
            final = {
                tp: OffsetAndMetadata(positions[tp])
                for tp in revoked
                if tp in positions and self._auto_commit
            }
            self._group.release(self._member_id, revoked, final)
        assigned = owned - current
        self._generation = state.generation
        subscription.set_assignment(owned)
        self._rebalances += 1
        if assigned and listener is not None:
            listener.on_partitions_assigned(assigned)

    # -- ownership ------------------------------------------------------------------------------

    def owns(self, tp: TopicPartition) -> bool:
        """Whether this member may read ``tp`` by the newest group state it has seen (the
        heartbeat thread loads newer ones): not once it is out of the group, nor once ``tp``
        moved to another member and is no longer this member's to hand over, nor while its
        previous owner has not handed it over yet."""
        if self._subscription.manual:
            return True
        if self._needs_rejoin:
            return False
        state = self._group.cached_state()
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

    def ownership(self) -> tuple[object, ...]:
        """What :meth:`owns` answers from, compared by identity."""
        return (
            self._group.cached_state(),
            self._member_id,
            self._needs_rejoin,
            self._subscription.manual,
        )

    # -- offsets -------------------------------------------------------------------------------

    def _maybe_auto_commit(self) -> None:
        if not self._auto_commit:
            return
        if time.monotonic() - self._last_commit < self._auto_commit_interval_ms / 1000:
            return
        self._last_commit = time.monotonic()
        if not self._subscription.positions:
            return
        try:
            self.commit()
        except CommitFailedError as exc:
            log.warning("consumer %s: auto-commit rejected (%s); will rejoin", self._client_id, exc)
            self.refresh(force=True)

    def commit(
        self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None
    ) -> None:
        """Commit offsets (default: the current positions) in one atomic group log entry."""
        if offsets is None:
            offsets = self._subscription.offsets_to_commit()
        normalised = normalized_offsets(offsets)  # checked: names the partition and offset
        if not normalised:
            return
        with self._lock:
            if self._subscription.manual:
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
        self._commits += 1
        self._last_commit = time.monotonic()

    def committed(self, tp: TopicPartition) -> OffsetAndMetadata | None:
        """The group's committed offset of ``tp`` (a look at the group log)."""
        with self._lock:
            return self._group.state().offsets.get(tp)

    def committed_offset(self, tp: TopicPartition) -> int | None:
        om = self.committed(tp)
        return om.offset if om is not None else None
