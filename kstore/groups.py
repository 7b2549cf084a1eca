"""Consumer groups without a broker: membership, assignment and offsets in one manifest log.

Kafka's group coordinator is a broker; here the group's log is the coordinator. Every change
is a commit to ``groups/<group>/_log``: a member joining, heart-beating or leaving, a new
generation with its assignment, an offset commit. Commits are put-if-absent, so the log orders
them and each rebalance is decided exactly once: a member that notices a change (a join, a
leave, a member whose session expired, a topic that grew) computes the next assignment with a
deterministic assignor and publishes it together with the change; if another commit lands
first it reloads and decides again.

An offset commit is one log entry holding all of the member's partitions, tagged with its
member id and generation; it is accepted only if that member is in the current generation and
owns every partition it commits (a fenced zombie gets :class:`CommitFailedError`).

Heartbeats are not log commits: each member overwrites its own lease file,
``groups/<group>/members/<member id>.json``, so heart-beating members never contend on the log.
A member is live while its lease's modification time, as the storage records it, is within
its session timeout of the newest lease time; both times come from the storage's clock, so
members' clocks do not need to agree. (S3 records times to the second: keep session timeouts
well above a second there, as Kafka's 45 s default is.) The log is written only when something
changes: a join, a leave, an expiry, a new generation, an offset commit.
"""

from __future__ import annotations

import contextlib
import json
import operator
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kstore import clock
from kstore.assignors import ASSIGNORS, Assignment
from kstore.errors import (
    CommitFailedError,
    CorruptLogError,
    IllegalStateError,
    InvalidArgumentError,
    KStoreError,
    ProducerFencedError,
    UnknownTopicOrPartitionError,
)
from kstore.group_share import (
    REQUESTS_DIR,
    Decided,
    GroupRequest,
    GroupShare,
    default_takeover_ms,
)
from kstore.layout import GROUPS, group_dir, group_log_dir, group_members_dir
from kstore.log import (
    Action,
    CommitResult,
    Log,
    LogState,
    RetryPolicy,
    check_writer_version,
    protocol_action,
)
from kstore.names import validate_group_id, validate_topic_name
from kstore.records import OffsetAndMetadata, TopicPartition
from kstore.settings import is_int

if TYPE_CHECKING:
    from kstore.store import Store

ADMIN_MEMBER = "admin"  # the member id of offset resets made by tools, outside any generation
# Group logs are created at writer version 8: their members share commits (PROTOCOL.md 31),
# which writers below 8 would not honour. Logs at a lower writer version are written as that
# version says (each member racing for its commits) until `kstore groups upgrade` raises them.
GROUP_LOG_WRITER_VERSION = 8
# Decided requests (action 8.32) a checkpoint keeps: a day behind the newest decision, far
# longer than a pending request may wait to be taken (PROTOCOL.md 31.5).
DECIDED_KEEP_MS = 86_400_000
# The errors a combined commit records as a request's refusal (PROTOCOL.md 31.3); any other
# failure is the committer's own and fails its commit.
_REFUSALS = (CommitFailedError, ProducerFencedError, IllegalStateError, InvalidArgumentError)


@dataclass(frozen=True)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    topics: tuple[str, ...]
    assignors: tuple[str, ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    joined_ms: int

    def live(self, lease_ms: int | None, reference_ms: int) -> bool:
        return lease_ms is not None and reference_ms - lease_ms <= self.session_timeout_ms


class GroupState(LogState):
    def __init__(self) -> None:
        super().__init__()
        self.generation = 0
        self.assignor: str | None = None
        self.members: dict[str, Member] = {}
        self.assignment: dict[str, list[TopicPartition]] = {}
        self.assigned_partitions: dict[str, int] = {}  # topic -> partition count used
        self.subscriptions: dict[str, tuple[str, ...]] = {}  # member -> topics, as assigned
        self.offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        self.offset_times: dict[TopicPartition, int] = {}
        self.transactions: dict[str, int] = {}  # transactional id -> last committed version
        # Partitions whose new owner must wait: the previous owner is still a member and has
        # not released them yet (commits its final offsets and lets go), so no two live
        # members ever read one partition at once. Cleared by `release` or by the previous
        # owner leaving (or expiring).
        self.pending_release: dict[TopicPartition, str] = {}
        self.transaction_epochs: dict[str, int] = {}  # transactional id -> lowest epoch accepted
        self.deleted = False  # deleted by an administrator; any later use revives the group
        self.requests: dict[str, Decided] = {}  # writer id -> its last decided request (8.32)

    def copy(self) -> GroupState:
        clone: GroupState = super().copy()  # type: ignore[assignment]
        clone.members = dict(self.members)
        clone.assignment = dict(self.assignment)
        clone.assigned_partitions = dict(self.assigned_partitions)
        clone.subscriptions = dict(self.subscriptions)
        clone.offsets = dict(self.offsets)
        clone.offset_times = dict(self.offset_times)
        clone.transactions = dict(self.transactions)
        clone.pending_release = dict(self.pending_release)
        clone.transaction_epochs = dict(self.transaction_epochs)
        clone.requests = dict(self.requests)
        return clone

    def apply(self, name: str, body: dict[str, Any]) -> None:
        if name == "join" or (name == "offsets" and body.get("offsets")):
            self.deleted = False  # used again after a delete
        if name == "join":
            member = Member(
                member_id=str(body["memberId"]),
                instance_id=body.get("instanceId"),
                client_id=str(body.get("clientId", "")),
                topics=tuple(body["topics"]),
                assignors=tuple(body["assignors"]),
                session_timeout_ms=int(body["sessionTimeoutMs"]),
                rebalance_timeout_ms=int(body["rebalanceTimeoutMs"]),
                joined_ms=int(body["time"]),
            )
            if member.instance_id is not None:
                # Static membership: a restarted instance replaces its old member id and keeps
                # its partitions, with no new generation.
                for old_id, old in list(self.members.items()):
                    if old.instance_id == member.instance_id and old_id != member.member_id:
                        del self.members[old_id]
                        if old_id in self.assignment:
                            self.assignment[member.member_id] = self.assignment.pop(old_id)
                        if old_id in self.subscriptions:
                            self.subscriptions[member.member_id] = self.subscriptions.pop(old_id)
                        self.pending_release = {
                            tp: (member.member_id if m == old_id else m)
                            for tp, m in self.pending_release.items()
                        }
            self.members[member.member_id] = member
        elif name == "leave":
            member_id = str(body["memberId"])
            self.members.pop(member_id, None)
            self.assignment.pop(member_id, None)
            self.pending_release = {
                tp: m for tp, m in self.pending_release.items() if m != member_id
            }
        elif name == "release":
            member_id = str(body["memberId"])
            for t, p in body["partitions"]:
                tp = TopicPartition(str(t), int(p))
                if self.pending_release.get(tp) == member_id:
                    del self.pending_release[tp]
        elif name == "assignment":
            previous = self.assignment
            self.generation = int(body["generation"])
            self.assignor = body.get("assignor")
            self.assignment = {
                m: [TopicPartition(str(t), int(p)) for t, p in parts]
                for m, parts in dict(body["members"]).items()
            }
            owner_before = {tp: m for m, parts in previous.items() for tp in parts}
            pending = {}
            for member_id, parts in self.assignment.items():
                for tp in parts:
                    before = self.pending_release.get(tp) or owner_before.get(tp)
                    if before is not None and before != member_id and before in self.members:
                        pending[tp] = before
            self.pending_release = pending
            if "pendingRelease" in body:  # checkpoints restore it exactly
                self.pending_release = {
                    TopicPartition(str(t), int(p)): str(m) for t, p, m in body["pendingRelease"]
                }
            self.assigned_partitions = {
                str(k): int(v) for k, v in dict(body.get("partitions", {})).items()
            }
            self.subscriptions = {
                str(m): tuple(t) for m, t in dict(body.get("subscriptions", {})).items()
            }
        elif name == "offsets":
            when = int(body.get("time", 0))
            for item in body["offsets"]:
                tp = TopicPartition(str(item["topic"]), int(item["partition"]))
                metadata = item.get("metadata")
                self.offsets[tp] = OffsetAndMetadata(
                    int(item["offset"]), "" if metadata is None else str(metadata)
                )
                self.offset_times[tp] = when
            txn = body.get("transaction")
            if isinstance(txn, dict):
                tid = str(txn["id"])
                self.transactions[tid] = max(self.transactions.get(tid, -1), int(txn["version"]))
                if "epoch" in txn:
                    self.transaction_epochs[tid] = max(
                        self.transaction_epochs.get(tid, -1), int(txn["epoch"])
                    )
        elif name == "txnFence":
            tid = str(body["id"])
            self.transaction_epochs[tid] = max(
                self.transaction_epochs.get(tid, -1), int(body["epoch"])
            )
        elif name == "deleteOffsets":
            for item in body["partitions"]:
                tp = TopicPartition(str(item["topic"]), int(item["partition"]))
                self.offsets.pop(tp, None)
                self.offset_times.pop(tp, None)
        elif name == "requests":
            for item in body.get("decided", []):
                writer, number = str(item["writer"]), int(item["number"])
                if number > self.requests.get(writer, Decided(-1, 0)).number:
                    error = item.get("error")
                    message = item.get("message")
                    self.requests[writer] = Decided(
                        number,
                        int(item.get("time", 0)),
                        None if error is None else str(error),
                        None if message is None else str(message),
                    )
        elif name == "deleteGroup":
            generation, version = self.generation, self.version
            transactions, fences = self.transactions, self.transaction_epochs
            requests, protocol = self.requests, (self.min_reader_version, self.min_writer_version)
            self.__init__()  # type: ignore[misc]
            self.generation = generation  # never reuse a generation: old members stay fenced
            self.version = version
            self.min_reader_version, self.min_writer_version = protocol
            # Transaction decisions and fences belong to producers, not to the members being
            # forgotten: a decided transaction must still roll forward after a delete; and a
            # request decided before the delete must not be taken again after it.
            self.transactions, self.transaction_epochs = transactions, fences
            self.requests = requests
            self.deleted = True
        else:
            super().apply(name, body)

    def checkpoint_actions(self) -> list[Action]:
        actions = super().checkpoint_actions()
        if self.deleted:  # first: replaying it resets what precedes it
            actions.append({"deleteGroup": {"time": 0}})
        for m in self.members.values():
            actions.append({"join": _join_body(m, m.joined_ms)})
        body = _assignment_body(
            self.generation, self.assignor, self.assignment, self.assigned_partitions
        )
        body["pendingRelease"] = [
            [tp.topic, tp.partition, m] for tp, m in sorted(self.pending_release.items())
        ]
        body["subscriptions"] = {m: list(t) for m, t in sorted(self.subscriptions.items())}
        actions.append({"assignment": body})
        by_time: dict[int, list[dict[str, Any]]] = {}
        for tp, om in sorted(self.offsets.items()):
            by_time.setdefault(self.offset_times.get(tp, 0), []).append(
                {
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "offset": om.offset,
                    "metadata": om.metadata,
                }
            )
        for when, items in sorted(by_time.items()):
            actions.append(
                {
                    "offsets": {
                        "memberId": ADMIN_MEMBER,
                        "generation": -1,
                        "time": when,
                        "offsets": items,
                    }
                }
            )
        for tid, version in sorted(self.transactions.items()):
            actions.append(
                {
                    "offsets": {
                        "memberId": ADMIN_MEMBER,
                        "generation": -1,
                        "time": 0,
                        "offsets": [],
                        "transaction": {"id": tid, "version": version},
                    }
                }
            )
        for tid, epoch in sorted(self.transaction_epochs.items()):
            actions.append({"txnFence": {"id": tid, "epoch": epoch}})
        if self.requests:
            newest = max(d.time_ms for d in self.requests.values())
            kept = [
                _decided_item(writer, d)
                for writer, d in sorted(self.requests.items())
                if newest - d.time_ms <= DECIDED_KEEP_MS
            ]
            actions.append({"requests": {"decided": kept}})
        return actions

    # -- queries ---------------------------------------------------------------------------------

    def owner_of(self, tp: TopicPartition) -> str | None:
        for member, parts in self.assignment.items():
            if tp in parts:
                return member
        return None


def _join_body(m: Member, when: int) -> dict[str, Any]:
    return {
        "memberId": m.member_id,
        "instanceId": m.instance_id,
        "clientId": m.client_id,
        "topics": list(m.topics),
        "assignors": list(m.assignors),
        "sessionTimeoutMs": m.session_timeout_ms,
        "rebalanceTimeoutMs": m.rebalance_timeout_ms,
        "time": when,
    }


def _assignment_body(
    generation: int,
    assignor: str | None,
    assignment: Mapping[str, list[TopicPartition]],
    partitions: Mapping[str, int],
) -> dict[str, Any]:
    return {
        "generation": generation,
        "assignor": assignor,
        "members": {
            m: [[tp.topic, tp.partition] for tp in parts] for m, parts in sorted(assignment.items())
        },
        "partitions": dict(sorted(partitions.items())),
    }


def _checked_offsets(
    offsets: Mapping[TopicPartition, OffsetAndMetadata],
) -> dict[TopicPartition, OffsetAndMetadata]:
    """``offsets`` with every key and value checked (names, partition numbers, offsets,
    metadata); None metadata becomes "" as in Kafka. Raises ValueError naming the culprit."""
    if not isinstance(offsets, Mapping):
        raise InvalidArgumentError(
            f"offsets must be a mapping of TopicPartition to OffsetAndMetadata, got "
            f"{type(offsets).__name__}"
        )
    out: dict[TopicPartition, OffsetAndMetadata] = {}
    for tp, om in offsets.items():
        if not isinstance(tp, tuple) or len(tp) != 2:
            raise InvalidArgumentError(f"offsets: key {tp!r} is not a TopicPartition")
        topic = validate_topic_name(tp[0])
        if not is_int(tp[1]) or tp[1] < 0:
            raise InvalidArgumentError(
                f"offsets: partition of {topic!r} must be a non-negative integer, got {tp[1]!r}"
            )
        if not isinstance(om, OffsetAndMetadata):
            raise InvalidArgumentError(
                f"offsets: value for {topic}-{tp[1]} is not an OffsetAndMetadata"
            )
        if not is_int(om.offset) or om.offset < 0:
            raise InvalidArgumentError(
                f"offset for {topic}-{tp[1]} must be a non-negative integer, got {om.offset!r}"
            )
        if om.metadata is not None and not isinstance(om.metadata, str):
            raise InvalidArgumentError(
                f"offsets: metadata for {topic}-{tp[1]} must be a string, got "
                f"{type(om.metadata).__name__}"
            )
        out[TopicPartition(topic, tp[1])] = OffsetAndMetadata(
            om.offset, om.metadata or "", om.leader_epoch
        )
    return out


def _offset_items(checked: Mapping[TopicPartition, OffsetAndMetadata]) -> list[dict[str, Any]]:
    return [
        {"topic": tp.topic, "partition": tp.partition, "offset": om.offset, "metadata": om.metadata}
        for tp, om in sorted(checked.items())
    ]


def _offsets_of_items(items: Any) -> dict[TopicPartition, OffsetAndMetadata]:
    """A request's offset items, checked as a member's own offsets are."""
    if not isinstance(items, list):
        raise InvalidArgumentError("offsets must be a list")
    out: dict[TopicPartition, OffsetAndMetadata] = {}
    for item in items:
        if not isinstance(item, dict):
            raise InvalidArgumentError(f"offset item {item!r} is not an object")
        metadata = item.get("metadata")
        tp = TopicPartition(item.get("topic"), item.get("partition"))  # type: ignore[arg-type]
        out[tp] = OffsetAndMetadata(item.get("offset"), metadata)  # type: ignore[arg-type]
    return _checked_offsets(out)


def _decided_item(writer: str, d: Decided) -> dict[str, Any]:
    item: dict[str, Any] = {"writer": writer, "number": d.number, "time": d.time_ms}
    if d.error is not None:
        item["error"] = d.error
        item["message"] = d.message or ""
    return item


def group_protocol_action() -> Action:
    return protocol_action(1, GROUP_LOG_WRITER_VERSION)


def shares_commits(state: GroupState) -> bool:
    """Whether the members of a group log at ``state`` share its commits (PROTOCOL.md 31):
    a log at writer version 8, or one yet to be created (created there)."""
    return state.version < 0 or state.min_writer_version >= GROUP_LOG_WRITER_VERSION


def normalized_offsets(
    offsets: Mapping[TopicPartition, Any],
) -> dict[TopicPartition, OffsetAndMetadata]:
    """Offsets as callers give them (an OffsetAndMetadata or a plain integer offset per
    partition), every key and value checked as :meth:`Group.commit_offsets` checks them.
    Raises ValueError naming the partition and the value, before anything is written."""
    if not isinstance(offsets, Mapping):
        raise InvalidArgumentError(
            f"offsets must be a mapping of TopicPartition to OffsetAndMetadata or int, got "
            f"{type(offsets).__name__}"
        )
    out: dict[TopicPartition, OffsetAndMetadata] = {}
    for tp, om in offsets.items():
        if not isinstance(om, OffsetAndMetadata):
            if not isinstance(om, bool) and hasattr(type(om), "__index__"):
                om = operator.index(om)  # numpy integers too; 1.5 or "1" stay as they are
            om = OffsetAndMetadata(om)  # anything but an integer is named by the check below
        out[tp] = om
    return _checked_offsets(out)


def _lease_name(member_id: str) -> str:
    # Member ids are made by the consumer from a validated client id and a random suffix;
    # check again anyway: this name becomes a path.
    validate_group_id(member_id)
    return f"{member_id}.json"


def _now_ms() -> int:
    return int(time.time() * 1000)


class Group:
    """A consumer group's log, with the operations members and tools perform on it."""

    def __init__(self, store: Store, group_id: str, *, retry: RetryPolicy | None = None) -> None:
        self.store = store
        self.group_id = validate_group_id(group_id)
        self.log: Log[GroupState] = Log(
            store.storage,
            group_log_dir(group_id),
            GroupState,
            checkpoint_interval=100,
            retry=retry or store.retry,
        )
        self._state: GroupState | None = None
        self._members_dir = group_members_dir(group_id)
        self._beats = 0  # heartbeats sent through this object (which of them list the leases)
        self._renewed: dict[str, float] = {}  # member id -> when (monotonic) its lease was written
        self.metrics: dict[str, int] = {}
        self._share = GroupShare(
            log_=self.log,
            storage=store.storage,
            requests_dir=f"{group_dir(group_id)}/{REQUESTS_DIR}",
            build=self._build_round,
            takeover_s=default_takeover_ms(store.storage) / 1000,
            metrics=self.metrics,
        )

    def state(self) -> GroupState:
        self._state = self.log.load() if self._state is None else self.log.update(self._state)
        return self._state

    def cached_state(self) -> GroupState | None:
        """The newest state this object has seen, without asking the storage."""
        return self._state

    # -- leases ----------------------------------------------------------------------------------

    def write_lease(self, member_id: str) -> None:
        """Renew a member's lease: one overwrite of its own file, no log commit."""
        body = json.dumps({"memberId": member_id, "time": _now_ms()}).encode()
        self.store.storage.put(f"{self._members_dir}/{_lease_name(member_id)}", body, durable=False)
        self._renewed[member_id] = clock.monotonic()

    def drop_lease(self, member_id: str) -> None:
        self.store.storage.delete([f"{self._members_dir}/{_lease_name(member_id)}"])

    def leases(self) -> dict[str, int]:
        """member id -> time of its newest heartbeat, by the storage's clock."""
        out = {}
        for info in self.store.storage.list_dir(self._members_dir):
            if (
                info.name.endswith(".json")
                and not info.name.startswith(".")
                and info.mtime_ms is not None
            ):
                out[info.name[: -len(".json")]] = info.mtime_ms
        return out

    def storage_now_ms(self) -> int:
        """The storage's idea of now. Local and memory stores share our clock; on an object
        store a probe file is written and its recorded time read back."""
        storage = self.store.storage
        if not storage.is_remote:
            return _now_ms()
        probe = f"{self._members_dir}/.probe-{uuid.uuid4().hex}"
        storage.put(probe, b"{}", durable=False)
        try:
            for info in storage.list_dir(self._members_dir):
                if f"{self._members_dir}/{info.name}" == probe and info.mtime_ms is not None:
                    return info.mtime_ms
        finally:
            storage.delete([probe])
        return _now_ms()

    def live_members(
        self,
        state: GroupState,
        *,
        reference_ms: int | None = None,
        leases: Mapping[str, int] | None = None,
    ) -> dict[str, Member]:
        leases = self.leases() if leases is None else leases
        reference = self.storage_now_ms() if reference_ms is None else reference_ms
        return {mid: m for mid, m in state.members.items() if m.live(leases.get(mid), reference)}

    def exists(self) -> bool:
        state = self.state()
        return state.version >= 0 and not state.deleted

    def _commit(
        self, build: Callable[[GroupState], list[Action] | None], operation: str
    ) -> CommitResult[GroupState] | None:
        def guarded(state: GroupState) -> list[Action] | None:
            actions = build(state)
            if not actions:
                return None
            if state.version < 0:
                actions = [group_protocol_action(), *actions]
            return actions

        result = self.log.commit(self.state(), guarded, operation=operation)
        self._state = result.state if result is not None else self.log.update(self.state())
        return result

    # -- rebalancing -----------------------------------------------------------------------------

    def _partition_counts(self, topics: Iterable[str]) -> dict[str, int]:
        counts = {}
        for topic in sorted(set(topics)):
            try:
                counts[topic] = self.store.topic(topic).partitions
            except UnknownTopicOrPartitionError:
                continue  # subscribed to a topic that does not exist (yet): nothing to assign
        return counts

    def plan(
        self,
        state: GroupState,
        live_ids: set[str],
        pending: list[Action],
        counts: Mapping[str, int] | None = None,
    ) -> list[Action]:
        """The actions ``pending`` plus, when membership, subscriptions or partition counts
        changed, the expiry of members not in ``live_ids`` and a new generation's assignment.
        Members joining in ``pending`` count as live."""
        trial = state.copy()
        joining = set()
        for action in pending:
            ((name, body),) = action.items()
            trial.apply(name, body)
            if name == "join":
                joining.add(str(body["memberId"]))
        actions = list(pending)
        now_ms = _now_ms()
        for member_id in list(trial.members):
            if member_id not in live_ids and member_id not in joining:
                leave: Action = {
                    "leave": {"memberId": member_id, "reason": "session expired", "time": now_ms}
                }
                actions.append(leave)
                trial.apply("leave", leave["leave"])
        live = trial.members
        topics = {t for m in live.values() for t in m.topics}
        counts = dict(counts) if counts is not None else self._partition_counts(topics)
        subscriptions = {mid: m.topics for mid, m in live.items()}
        # Compare with the members the current generation was computed for (a leave removes a
        # member from the assignment, but not from the subscriptions it was computed from).
        unchanged = (
            set(state.subscriptions) == set(live)
            and counts == state.assigned_partitions
            and all(state.subscriptions.get(mid) == m.topics for mid, m in live.items())
        )
        if unchanged and state.generation > 0:
            return actions
        if not live and not state.assignment:
            return actions
        assignor = _common_assignor(live.values())
        assignment: Assignment = ASSIGNORS[assignor](subscriptions, counts, trial.assignment)
        body = _assignment_body(trial.generation + 1, assignor, assignment, counts)
        body["subscriptions"] = {mid: list(t) for mid, t in sorted(subscriptions.items())}
        actions.append({"assignment": body})
        return actions

    def join(self, member: Member) -> GroupState:
        """Add (or, for a static member, replace) a member and rebalance if needed."""

        # A log that cannot be read or written here is refused before the lease exists: a
        # failed join must leave nothing behind.
        before = self.state().members
        check_writer_version(self.state())
        self.write_lease(member.member_id)  # before the join: a member always has a lease

        request = GroupRequest("join", member.member_id, _join_body(member, 0))
        try:
            self._submit(request, "JOIN GROUP")
        except BaseException:
            with contextlib.suppress(Exception):
                self.drop_lease(member.member_id)
            raise
        if member.instance_id is not None:  # a static member replaced its old id: drop that lease
            for old_id, old in before.items():
                if old.instance_id == member.instance_id and old_id != member.member_id:
                    self.drop_lease(old_id)
        return self.state()

    def heartbeat(
        self,
        member_id: str,
        *,
        check_metadata: bool = False,
        lease_check_every: int = 1,
        lease_renewal_s: float = 0.0,
    ) -> GroupState:
        """Look at the group log and renew the member's lease when due; when a member's lease
        expired (or, with ``check_metadata``, a subscribed topic changed its partition count)
        commit the expiry and a new generation. Raises CommitFailedError if this member is no
        longer in the group.

        ``lease_renewal_s``: the lease (a PUT on S3) is written when its last write is at least
        this old, and before every listing of the leases, so the lister's own lease is a fresh
        reading of the storage's clock. A caller renews well within the session timeout (the
        consumer: at least every third of it).

        ``lease_check_every``: the members share the listing of the leases (a LIST on S3)
        that finds an expired one: each member lists at one heartbeat in
        ``min(members, lease_check_every)``, so a group of n members lists about once per
        heartbeat interval, not n times. Joins need no listing: they are commits to the group
        log, which every heartbeat reads. A caller passes at most the heartbeats in a session
        timeout, so every member still lists at least once per session timeout."""
        state = self.state()
        if member_id not in state.members:
            raise CommitFailedError(
                f"group {self.group_id!r}: member {member_id} is no longer in the group "
                "(session expired or fenced); it must rejoin"
            )
        self._beats += 1
        every = max(1, min(len(state.members), lease_check_every))
        listing = check_metadata or self._beats % every == 0
        renewed = self._renewed.get(member_id)
        if listing or renewed is None or clock.monotonic() - renewed >= lease_renewal_s:
            self.write_lease(member_id)
        if not listing:
            return state
        leases = self.leases()
        reference = leases.get(member_id) or self.storage_now_ms()
        live = set(self.live_members(state, reference_ms=reference, leases=leases))
        if live == set(state.members) and not check_metadata:
            return state
        expired: set[str] = set()

        def build(current: GroupState) -> list[Action] | None:
            if member_id not in current.members:
                raise CommitFailedError(
                    f"group {self.group_id!r}: member {member_id} is no longer in the group"
                )
            # Listed again on every attempt, after `current` was read: a member whose join
            # landed after the first listing has its lease in this one, so it is not taken
            # for dead (every member writes its lease before its join).
            fresh = self.leases()
            now = fresh.get(member_id) or self.storage_now_ms()
            alive = set(self.live_members(current, reference_ms=now, leases=fresh)) | {member_id}
            expired.clear()
            expired.update(set(current.members) - alive)
            return self.plan(current, alive, [])

        if self._commit(build, "REBALANCE") is not None:
            # Only the members this commit expelled: one that renewed its lease meanwhile
            # keeps it.
            for dead in expired:
                self.drop_lease(dead)
        return self.state()

    def leave(self, member_id: str, reason: str = "consumer closed") -> None:
        self._submit(GroupRequest("leave", member_id, {"reason": reason}), "LEAVE GROUP")
        self.drop_lease(member_id)

    # -- offsets -------------------------------------------------------------------------------

    def commit_offsets(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata],
        *,
        member_id: str | None,
        generation: int,
        transaction: tuple[str, int, int] | None = None,
    ) -> GroupState:
        """Commit offsets in one log entry. The member must be in the group and own every
        partition it commits in the current generation (or be handing it over); ``member_id=None``
        commits outside any generation, which is allowed only while the group has no live
        members (manual assignment, tools).

        ``transaction`` = (transactional id, version, producer epoch) makes this commit the
        decision of that producer transaction: refused for a fenced epoch, a no-op if that
        version is already committed."""
        # Checked before anything is written: an entry with an illegal topic name or a bad
        # partition would stay in the group log for good and break every later describe.
        items = _offset_items(_checked_offsets(offsets))
        if member_id is not None and transaction is None:
            request = GroupRequest(
                "offsets", member_id, {"generation": generation, "offsets": items}
            )
            return self._submit(request, "COMMIT OFFSETS")

        def build(state: GroupState) -> list[Action] | None:
            if transaction is not None:
                tid, version, epoch = transaction
                if epoch < state.transaction_epochs.get(tid, -1):
                    raise ProducerFencedError(
                        f"transactional id {tid!r}: epoch {epoch} was fenced (group {self.group_id!r} "
                        f"accepts epoch {state.transaction_epochs[tid]} and newer)"
                    )
                if state.transactions.get(tid, -1) >= version:
                    return None  # this transaction's offsets are already committed
            if member_id is None:
                live = self.live_members(state)
                if live:
                    raise CommitFailedError(
                        f"group {self.group_id!r} has {len(live)} live member(s); commits outside "
                        "the group's generation are refused while it is active"
                    )
            body = self._offsets_body(state, member_id, generation, items)
            if transaction is not None:
                body["transaction"] = {
                    "id": transaction[0],
                    "version": transaction[1],
                    "epoch": transaction[2],
                }
            return [{"offsets": body}]

        self._commit(build, "COMMIT OFFSETS")
        return self.state()

    def _offsets_body(
        self,
        state: GroupState,
        member_id: str | None,
        generation: int,
        items: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """An ``offsets`` action's body, after the checks a member's commit must pass on
        ``state``: the member is in the group and owns every partition it commits."""
        if member_id is not None:
            if member_id not in state.members:
                raise CommitFailedError(
                    f"group {self.group_id!r}: member {member_id} is not in the group "
                    "(session expired, left, or replaced): commit rejected"
                )
            checked = _offsets_of_items(items)
            # Ownership, not the generation number, is what fences: rebalances are
            # cooperative, so a member that has not yet seen the newest generation still
            # owns every partition that did not move, and no other member can have read
            # those. A partition that moved away is committable only by its previous
            # owner while it hands it over (its final position), never after.
            releasing = {tp for tp, m in state.pending_release.items() if m == member_id}
            awaiting = {tp for tp, m in state.pending_release.items() if m != member_id}
            allowed = (set(state.assignment.get(member_id, [])) - awaiting) | releasing
            foreign = sorted(tp for tp in checked if tp not in allowed)
            if foreign or generation > state.generation:
                raise CommitFailedError(
                    f"group {self.group_id!r}: commit from member {member_id} (generation "
                    f"{generation}) rejected: it does not own {[f'{t}-{p}' for t, p in foreign[:3]]} "
                    f"at generation {state.generation} (a rebalance moved them)"
                )
        return {
            "memberId": member_id or ADMIN_MEMBER,
            "generation": generation,
            "time": _now_ms(),
            "offsets": items,
        }

    def release(
        self,
        member_id: str,
        partitions: Iterable[TopicPartition],
        offsets: Mapping[TopicPartition, OffsetAndMetadata] | None = None,
    ) -> GroupState:
        """Hand partitions over to their new owners, with final offsets, in one commit."""
        parts = sorted(set(partitions))
        final = _checked_offsets({tp: om for tp, om in (offsets or {}).items() if tp in parts})
        body = {
            "partitions": [[tp.topic, tp.partition] for tp in parts],
            "offsets": _offset_items(final),
        }
        return self._submit(GroupRequest("release", member_id, body), "RELEASE PARTITIONS")

    # -- combined commits (PROTOCOL.md 31) -------------------------------------------------------

    def _submit(self, request: GroupRequest, operation: str) -> GroupState:
        """Commit a member's change, directly or shared with the other members' (31.4)."""
        state = self.state()
        # On a refusal the state stays the last one seen (membership answers from it, and
        # the next look reads what the log holds now).
        self._state = self._share.submit(request, operation, state, shared=shares_commits(state))
        return self._state

    def _build_round(
        self, state: GroupState, requests: list[GroupRequest]
    ) -> tuple[list[Action], dict[str, BaseException | None]]:
        """One commit taking ``requests`` in order on ``state`` (31.3): each validated on
        the state the requests before it leave, as its member's own commit would be; the
        membership changes last, with one new generation for all of them. Returns the
        actions and each request's outcome, keyed by its name (``""``: the caller's own
        request without a pending file)."""
        trial = state.copy()
        actions: list[Action] = []
        outcomes: dict[str, BaseException | None] = {}
        membership: list[GroupRequest] = []
        for request in requests:
            key = request.name if request.pending else ""
            if request.kind in ("join", "leave"):
                membership.append(request)
                continue
            try:
                taken = self._change_actions(trial, request)
            except _REFUSALS as exc:
                outcomes[key] = exc
                continue
            for action in taken:
                ((name, body),) = action.items()
                trial.apply(name, body)
            actions.extend(taken)
            outcomes[key] = None
        if membership:
            actions.extend(self._membership_actions(trial, membership, outcomes))
        decided = [
            _decided_item(
                r.writer,
                Decided(
                    r.number,
                    _now_ms(),
                    *_error_of(outcomes.get(r.name)),
                ),
            )
            for r in requests
            if r.pending
        ]
        if decided:
            actions.append({"requests": {"decided": decided}})
        if actions and state.version < 0:
            actions.insert(0, group_protocol_action())
        return actions, outcomes

    def _change_actions(self, state: GroupState, request: GroupRequest) -> list[Action]:
        """The actions of an offset commit or a release on ``state``; raises its refusal."""
        body, member_id = request.body, request.member_id
        validate_group_id(member_id)
        if request.kind == "offsets":
            generation = body.get("generation")
            if not is_int(generation):
                raise InvalidArgumentError(f"generation must be an integer, got {generation!r}")
            items = _offset_items(_offsets_of_items(body.get("offsets")))
            return [{"offsets": self._offsets_body(state, member_id, generation, items)}]
        parts = body.get("partitions")
        if not isinstance(parts, list) or not all(
            isinstance(x, list) and len(x) == 2 for x in parts
        ):
            raise InvalidArgumentError("release: partitions must be [topic, partition] pairs")
        wanted = {TopicPartition(validate_topic_name(t), p) for t, p in parts if is_int(p)}
        mine = sorted(tp for tp in wanted if state.pending_release.get(tp) == member_id)
        if not mine:
            return []
        actions: list[Action] = []
        final = {
            tp: om for tp, om in _offsets_of_items(body.get("offsets", [])).items() if tp in mine
        }
        if final:
            items = _offset_items(final)
            actions.append(
                {
                    "offsets": {
                        "memberId": member_id,
                        "generation": state.generation,
                        "time": _now_ms(),
                        "offsets": items,
                    }
                }
            )
        actions.append(
            {
                "release": {
                    "memberId": member_id,
                    "partitions": [[tp.topic, tp.partition] for tp in mine],
                }
            }
        )
        return actions

    def _membership_actions(
        self,
        state: GroupState,
        requests: list[GroupRequest],
        outcomes: dict[str, BaseException | None],
    ) -> list[Action]:
        """Joins and leaves on ``state``, with the expiries and one new generation they
        need (none for a static member rejoining with its topics)."""
        leases = self.leases()
        joined = [
            leases[r.member_id] for r in requests if r.kind == "join" and r.member_id in leases
        ]
        # The joiners' own leases are fresh readings of the storage's clock (each writes its
        # lease before its join); a leave alone asks the storage.
        reference = max(joined) if joined else self.storage_now_ms()
        live = set(self.live_members(state, reference_ms=reference, leases=leases))
        changes: list[Action] = []
        leaving: set[str] = set()
        joining: set[str] = set()
        rebalance = False
        now = _now_ms()
        for request in requests:
            key = request.name if request.pending else ""
            try:
                member_id = validate_group_id(request.member_id)
                if request.kind == "join":
                    body = {**request.body, "memberId": member_id, "time": now}
                    member = _member_of(body)
                    static = member.instance_id is not None and any(
                        m.instance_id == member.instance_id
                        and mid in live
                        and m.topics == member.topics
                        for mid, m in state.members.items()
                    )
                    rebalance = rebalance or not static
                    changes.append({"join": body})
                    joining.add(member_id)
                    leaving.discard(member_id)
                elif member_id in state.members or member_id in joining:
                    changes.append(
                        {
                            "leave": {
                                "memberId": member_id,
                                "reason": str(request.body.get("reason", "")),
                                "time": now,
                            }
                        }
                    )
                    leaving.add(member_id)
                    joining.discard(member_id)
                    rebalance = True
            except _REFUSALS as exc:
                outcomes[key] = exc
                continue
            outcomes[key] = None
        if not rebalance:
            return changes  # static rejoins only: same partitions, same generation
        return self.plan(state, live - leaving, changes)

    def fence_transaction(self, transactional_id: str, epoch: int) -> None:
        """Refuse, from now on, transaction decisions of older epochs of this producer."""

        def build(state: GroupState) -> list[Action] | None:
            if state.transaction_epochs.get(transactional_id, -1) >= epoch:
                return None
            return [{"txnFence": {"id": transactional_id, "epoch": epoch}}]

        self._commit(build, "FENCE PRODUCER")

    def committed(self, tp: TopicPartition) -> OffsetAndMetadata | None:
        return self.state().offsets.get(tp)

    # -- administration ---------------------------------------------------------------------------

    def delete(self) -> None:
        def build(state: GroupState) -> list[Action]:
            if state.version < 0 or state.deleted:
                raise KStoreError(f"group {self.group_id!r} does not exist")
            live = self.live_members(state)
            if live:
                raise IllegalStateError(
                    f"group {self.group_id!r} has {len(live)} live member(s); stop them before deleting it"
                )
            return [{"deleteGroup": {"time": _now_ms()}}]

        self._commit(build, "DELETE GROUP")

    def delete_offsets(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Forget the committed offsets of these partitions (Kafka's --delete-offsets, action
        8.21); returns those that had one. Refused for a topic a live member subscribes to, as
        Kafka refuses it (the member would commit it again)."""
        wanted = sorted(set(partitions))

        def build(state: GroupState) -> list[Action] | None:
            if state.version < 0 or state.deleted:
                raise KStoreError(f"group {self.group_id!r} does not exist")
            for member in self.live_members(state).values():
                busy = sorted({tp.topic for tp in wanted} & set(member.topics))
                if busy:
                    raise IllegalStateError(
                        f"group {self.group_id!r} has a live member subscribed to "
                        f"{', '.join(map(repr, busy))}; stop it before deleting offsets"
                    )
            present = [tp for tp in wanted if tp in state.offsets]
            if not present:
                return None
            items = [{"topic": tp.topic, "partition": tp.partition} for tp in present]
            return [{"deleteOffsets": {"partitions": items}}]

        before = self.state()
        had = [tp for tp in wanted if tp in before.offsets]
        self._commit(build, "DELETE OFFSETS")
        return [tp for tp in had if tp not in self.state().offsets]


def _member_of(body: dict[str, Any]) -> Member:
    """The member a join's body describes, checked (a request's body is another process's)."""
    scratch = GroupState()
    try:
        scratch.apply("join", body)
        (member,) = scratch.members.values()
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"join: malformed member ({exc!r})") from None
    for topic in member.topics:
        validate_topic_name(topic)
    if member.instance_id is not None and not isinstance(member.instance_id, str):
        raise InvalidArgumentError("join: instanceId must be a string")
    if member.session_timeout_ms <= 0 or not member.assignors:
        raise InvalidArgumentError("join: sessionTimeoutMs and assignors are required")
    return member


def _error_of(outcome: BaseException | None) -> tuple[str | None, str | None]:
    if outcome is None:
        return None, None
    return type(outcome).__name__, str(outcome)[:500]


def _common_assignor(members: Iterable[Member]) -> str:
    members = list(members)
    if not members:
        return "sticky"
    first = members[0].assignors
    for name in first:
        if all(name in m.assignors for m in members):
            return name
    raise CommitFailedError(
        "group members share no partition assignment strategy: "
        + "; ".join(f"{m.member_id}: {list(m.assignors)}" for m in members)
    )


# -- group administration (kafka-consumer-groups) ---------------------------------------------------


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    current_offset: int | None
    log_end_offset: int
    lag: int | None
    member_id: str | None
    client_id: str | None
    metadata: str = ""


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    state: str  # Stable, Empty, Dead (deleted or never used)
    generation: int
    assignor: str | None
    members: list[Member]
    partitions: list[PartitionLag] = field(default_factory=list)

    @property
    def total_lag(self) -> int:
        return sum(p.lag or 0 for p in self.partitions)

    @property
    def uncommitted(self) -> int:
        """Partitions the group reads with no committed offset (their lag is unknown)."""
        return sum(1 for p in self.partitions if p.current_offset is None)


def list_groups(store: Store) -> list[str]:
    names = []
    for info in store.storage.list_dir(GROUPS):
        try:
            validate_group_id(info.name)
        except ValueError:
            continue
        try:
            exists = Group(store, info.name).exists()
        except CorruptLogError:
            exists = True  # listed: describing it names what is wrong with its log
        if exists:
            names.append(info.name)
    return sorted(names)


def describe_group(store: Store, group_id: str) -> GroupDescription:
    group = Group(store, group_id)
    state = group.state()
    # Read-only: judged by this machine's clock (no probe written), so describing a group
    # needs no write permission; a clock far off the storage's shows liveness wrongly.
    live = group.live_members(state, reference_ms=_now_ms())
    # Every partition of every topic the group reads (subscribed, assigned or committed): a
    # partition with no committed offset still has unread records, so it is shown too.
    topics = (
        {tp.topic for tp in state.offsets}
        | {tp.topic for parts in state.assignment.values() for tp in parts}
        | {topic for member in live.values() for topic in member.topics}
    )
    rows: dict[TopicPartition, PartitionLag] = {}
    for topic in sorted(topics):
        try:
            meta = store.topic(topic)
        except UnknownTopicOrPartitionError:
            continue
        for p in range(meta.partitions):
            tp = TopicPartition(topic, p)
            owner = state.owner_of(tp)
            committed = state.offsets.get(tp)
            end = store.partition_state(topic, p, meta).end_offset
            current = committed.offset if committed else None
            rows[tp] = PartitionLag(
                topic,
                p,
                current,
                end,
                None if current is None else max(0, end - current),
                owner if owner in live else None,
                live[owner].client_id if owner in live else None,
                committed.metadata if committed else "",
            )
    if state.version < 0 or state.deleted:
        status = "Dead"
    elif live:
        status = "Stable"
    else:
        status = "Empty"
    return GroupDescription(
        group_id,
        status,
        state.generation,
        state.assignor,
        sorted(live.values(), key=lambda m: m.member_id),
        [rows[k] for k in sorted(rows)],
    )


def reset_offsets(
    store: Store,
    group_id: str,
    topics: Iterable[str],
    *,
    to_earliest: bool = False,
    to_latest: bool = False,
    to_offset: int | None = None,
    to_datetime_ms: int | None = None,
    shift_by: int | None = None,
    by_duration_ms: int | None = None,
    partitions: Iterable[int] | None = None,
    execute: bool = False,
) -> dict[TopicPartition, int]:
    """Compute (and with ``execute``, commit) new offsets, as ``kafka-consumer-groups
    --reset-offsets``. Refused while the group has live members. Offsets are clamped to each
    partition's live range."""
    chosen = [
        to_earliest,
        to_latest,
        to_offset is not None,
        to_datetime_ms is not None,
        shift_by is not None,
        by_duration_ms is not None,
    ]
    if sum(chosen) != 1:
        raise InvalidArgumentError(
            "choose exactly one of to_earliest, to_latest, to_offset, to_datetime, shift_by, by_duration"
        )
    for name, value in (
        ("to_offset", to_offset),
        ("to_datetime_ms", to_datetime_ms),
        ("shift_by", shift_by),
        ("by_duration_ms", by_duration_ms),
    ):
        if value is not None and not is_int(value):
            raise InvalidArgumentError(f"{name} must be an integer, got {value!r}")
        if value is not None and name != "shift_by" and value < 0:
            raise InvalidArgumentError(f"{name} must not be negative, got {value!r}")
    # One topic name given as a string is that topic, not its characters.
    topic_list = [topics] if isinstance(topics, str) else list(topics)
    for topic in topic_list:
        validate_topic_name(topic)
    wanted = set(partitions) if partitions is not None else None
    if wanted is not None:
        for p in wanted:
            if not is_int(p) or p < 0:
                raise InvalidArgumentError(f"partition must be a non-negative integer, got {p!r}")
    group = Group(store, group_id)
    state = group.state()
    live = group.live_members(state)
    if live:
        raise IllegalStateError(
            f"group {group_id!r} has {len(live)} live member(s); offsets can only be reset while it is inactive"
        )
    metas = {topic: store.topic(topic) for topic in topic_list}
    if wanted is not None:
        for topic, meta in metas.items():
            missing = sorted(p for p in wanted if p >= meta.partitions)
            if missing:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} has partitions 0..{meta.partitions - 1}; "
                    f"partition {missing[0]} does not exist"
                )
    plan: dict[TopicPartition, int] = {}
    for topic, meta in metas.items():
        for p in range(meta.partitions):
            if wanted is not None and p not in wanted:
                continue
            part = store.partition(topic, p, meta)
            pstate = part.state()
            start, end = pstate.start_offset, pstate.end_offset
            tp = TopicPartition(topic, p)
            current = state.offsets.get(tp)
            if to_earliest:
                target = start
            elif to_latest:
                target = end
            elif to_offset is not None:
                target = to_offset
            elif to_datetime_ms is not None or by_duration_ms is not None:
                when = (
                    to_datetime_ms
                    if to_datetime_ms is not None
                    else _now_ms() - (by_duration_ms or 0)
                )
                found = part.offset_for_timestamp(when, pstate)
                target = end if found is None else found
            else:
                base = current.offset if current is not None else start
                target = base + (shift_by or 0)
            plan[tp] = min(max(target, start), end)
    if execute and plan:
        group.commit_offsets(
            {tp: OffsetAndMetadata(o, "reset") for tp, o in plan.items()},
            member_id=None,
            generation=-1,
        )
    return plan


def upgrade_group(store: Store, group_id: str, *, dry_run: bool = False) -> tuple[int, int]:
    """Raise a group log to writer version 8, where its members share commits (PROTOCOL.md
    31.7): one commit of its own, while members run. Members of a kstore below writer
    version 8 are refused by the log after it (``UnsupportedFormatVersionError``, naming the
    versions). Returns the log's (minReaderVersion, minWriterVersion) before the change; a
    log at 8 already, or ``dry_run``, is left as it is."""
    group = Group(store, group_id)
    before = group.state()
    if before.version < 0 or before.deleted:
        raise KStoreError(f"group {group_id!r} does not exist")
    versions = (before.min_reader_version, before.min_writer_version)
    if dry_run or shares_commits(before):
        return versions

    def build(state: GroupState) -> list[Action] | None:
        if state.min_writer_version >= GROUP_LOG_WRITER_VERSION:
            return None
        return [protocol_action(state.min_reader_version, GROUP_LOG_WRITER_VERSION)]

    group._commit(build, "UPGRADE GROUP")
    return versions


def delete_group(store: Store, group_id: str) -> None:
    Group(store, group_id).delete()
