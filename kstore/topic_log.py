"""Layout 3's topic logs: one commit log shared by many partitions of a topic.

A topic of layout 3 keeps no log per partition. Its partitions share ``commit.logs`` topic
logs (partition ``p`` belongs to log ``p mod commit.logs``); every partition-scoped action in
a topic log names its ``partition``, and one commit may change many partitions at once, all
visible together. Replaying a topic log yields one :class:`PartitionState` per partition,
exactly the state a layout-2 partition log would replay to (docs/PROTOCOL.md 26).

Pure data and replay rules, like :mod:`kstore.manifest`: no pyarrow.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kstore.errors import CorruptLogError, UnsupportedFormatVersionError
from kstore.log import (
    Action,
    CommitResult,
    Log,
    LogState,
    RetryPolicy,
    checkpoint_file,
    decode_commit,
    protocol_action,
)
from kstore.manifest import PartitionState
from kstore.storage import unique_id

LAYOUT_V2 = 2
LAYOUT_V3 = 3
# The log protocol version layout 3 requires of readers and writers (PROTOCOL.md 3.2).
TOPIC_LOG_VERSION = 3

# A partition build: receives the partition's state as of the commit's base version and
# returns its actions (None: nothing to commit for it) or raises to refuse the commit.
PartitionBuild = Callable[[PartitionState], "list[Action] | None"]


def shared_log_dir(incarnation_dir: str, index: int) -> str:
    """Topic log ``index`` of an incarnation: ``_log`` for log 0, ``_log.<k>`` after it."""
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        raise ValueError(f"illegal topic log index {index!r}")
    return f"{incarnation_dir}/_log" if index == 0 else f"{incarnation_dir}/_log.{index}"


def log_index(partition: int, commit_logs: int) -> int:
    return partition % commit_logs


class TopicLogState(LogState):
    """A topic log replayed: partition number -> that partition's state.

    Copy-on-write per partition: a commit copies only the partitions it touches, so applying a
    commit costs what the commit changes, not the number of partitions of the topic.
    """

    def __init__(self) -> None:
        super().__init__()
        self.partitions: dict[int, PartitionState] = {}
        # Partitions already copied for the version being built (safe to change in place).
        self._own: set[int] = set()
        # Partition -> the topic log version that last changed it (checkpoint sidecars).
        self.changed: dict[int, int] = {}
        self._views: dict[int, PartitionState] = {}
        # The checkpoint this state descends from: its version and sidecar per partition
        # (a partition unchanged since keeps its sidecar in the next checkpoint).
        self.sidecar_version = -1
        self.sidecars: dict[int, Action] = {}
        self.sidecars_seen = 0.0  # when that checkpoint was read or written (monotonic)

    def copy(self) -> TopicLogState:
        clone: TopicLogState = super().copy()  # type: ignore[assignment]
        clone.partitions = dict(self.partitions)
        clone._own = set()
        clone.changed = dict(self.changed)
        clone._views = {}
        clone.sidecars = dict(self.sidecars)
        return clone

    def apply(self, name: str, body: dict[str, Any]) -> None:
        partition = body.get("partition")
        if partition is None:
            if name in PARTITION_ACTIONS:
                raise CorruptLogError(f"action {name!r} in a topic log must name its partition")
            super().apply(name, body)
            return
        if name == "sidecar":  # checkpoints only: loaded by TopicLogFiles
            return
        if type(partition) is not int or partition < 0:
            raise CorruptLogError(f"action {name!r}: illegal partition {partition!r}")
        state = self.partitions.get(partition)
        if partition not in self._own:
            state = PartitionState() if state is None else state.copy()
            self.partitions[partition] = state
            self._own.add(partition)
        assert state is not None
        state.apply(name, body)
        self._views.pop(partition, None)

    def stamp(self, version: int) -> None:
        super().stamp(version)
        # Partitions copied since this state was copied: at most the ones changed up to here.
        for partition in self._own:
            self.changed[partition] = version
        self._views = {}

    def partition(self, partition: int) -> PartitionState:
        """The state of one partition as of this topic log version (a read-only view whose
        ``version`` is the topic log's)."""
        view = self._views.get(partition)
        if view is not None:
            return view
        state = self.partitions.get(partition)
        # A shallow copy: it shares the state's lists, which no one changes once handed out.
        view = PartitionState() if state is None else state.view()
        view.version = self.version
        view.last_commit_ms = self.last_commit_ms
        view.min_reader_version = self.min_reader_version
        view.min_writer_version = self.min_writer_version
        self._views[partition] = view
        return view

    def checkpoint_actions(self) -> list[Action]:
        actions = super().checkpoint_actions()
        for partition in sorted(self.partitions):
            actions.extend(self.partition_checkpoint_actions(partition))
        return actions

    def partition_checkpoint_actions(self, partition: int) -> list[Action]:
        """One partition's whole state as topic-log actions (each naming the partition)."""
        state = self.partition(partition)
        return tag_actions(
            [a for a in state.checkpoint_actions() if "protocol" not in a], partition
        )


def tag_actions(actions: list[Action], partition: int) -> list[Action]:
    """Partition actions as a topic log records them: each names its partition."""
    out: list[Action] = []
    for action in actions:
        ((name, body),) = action.items()
        out.append({name: {**body, "partition": partition}})
    return out


SIDECARS = "_sidecars"
# Actions that belong to one partition (PROTOCOL.md 8.27): in a topic log each names it.
PARTITION_ACTIONS = frozenset(
    {
        "add",
        "remove",
        "logStart",
        "endOffset",
        "producer",
        "txn",
        "cleaned",
        "tombstone",
        "txnMarker",
        "vacuumed",
        "txnEnded",
    }
)


def encode_sidecar(partition: int, version: int, actions: list[Action]) -> bytes:
    """A sidecar file (PROTOCOL.md 7.4): a header line, then one partition's actions."""
    header = {"sidecar": {"partition": partition, "version": version, "actions": len(actions)}}
    lines = [json.dumps(header, separators=(",", ":"))]
    lines.extend(json.dumps(a, separators=(",", ":")) for a in actions)
    return ("\n".join(lines) + "\n").encode()


def decode_sidecar(data: bytes, where: str, partition: int) -> list[tuple[str, dict[str, Any]]]:
    """A sidecar's actions; CorruptLogError when it is damaged or holds another partition."""
    # The same line syntax and truncation checks as a commit, with its own header line.
    if not data.startswith(b'{"sidecar":'):
        raise CorruptLogError(f"{where}: the first line must be the sidecar header")
    info, actions = decode_commit(data.replace(b'{"sidecar":', b'{"commitInfo":', 1), where)
    if info.get("partition") != partition:
        raise CorruptLogError(
            f"{where}: holds partition {info.get('partition')!r}, not {partition}"
        )
    return actions


class TopicLogFiles(Log[TopicLogState]):
    """A topic log's files: checkpoints keep each partition's state in a sidecar file, and
    a partition that did not change since the previous checkpoint keeps its sidecar by
    reference (Delta's v2 checkpoints): a checkpoint writes what changed, not the whole
    topic (PROTOCOL.md 7.4, 13.2)."""

    def _sidecar_dir(self) -> str:
        return f"{self.directory.rsplit('/', 1)[0]}/{SIDECARS}"

    def write_checkpoint(self, state: TopicLogState) -> None:
        sidecars: dict[int, Action] = {}
        # A sidecar is reused only from a checkpoint this writer read or wrote recently:
        # vacuum may delete sidecars that no checkpoint newer than the log retention names.
        fresh = time.monotonic() - state.sidecars_seen < STALE_STATE_S
        for partition in sorted(state.partitions):
            known = state.sidecars.get(partition) if fresh else None
            if known is not None and state.changed.get(partition, 0) <= state.sidecar_version:
                sidecars[partition] = known
                continue
            actions = [
                a for a in state.partition(partition).checkpoint_actions() if "protocol" not in a
            ]
            name = f"{partition}-{state.version:020d}-{unique_id()}.json"
            payload = encode_sidecar(partition, state.version, actions)
            self.storage.put_new(f"{self._sidecar_dir()}/{name}", payload)
            sidecars[partition] = {
                "partition": partition,
                "path": f"{SIDECARS}/{name}",
                "actions": len(actions),
                "size": len(payload),
            }
        top: list[Action] = [
            *LogState.checkpoint_actions(state),
            *({"sidecar": sidecars[p]} for p in sorted(sidecars)),
        ]
        self._publish_checkpoint(state, top)
        state.sidecars, state.sidecar_version = sidecars, state.version
        state.sidecars_seen = time.monotonic()

    def _read_checkpoint(self, version: int) -> TopicLogState | None:
        where = f"{self.storage.display_url}/{self._path(checkpoint_file(version))}"
        data = self.storage.read_if_exists(self._path(checkpoint_file(version)))
        if data is None:
            return None
        info, actions = decode_commit(data, where)
        header = info.get("checkpointVersion")
        if not isinstance(header, int) or isinstance(header, bool) or header != version:
            raise CorruptLogError(
                f"{where}: checkpoint header names version {info.get('checkpointVersion')!r}"
            )
        state = self.state_factory()
        sidecars: dict[int, Action] = {}
        try:
            for name, body in actions:
                if name == "sidecar":
                    partition, path = body["partition"], body["path"]
                    if (
                        type(partition) is not int
                        or partition < 0
                        or not isinstance(path, str)
                        or not path.startswith(f"{SIDECARS}/")
                        or ".." in path
                    ):
                        raise CorruptLogError(f"sidecar: illegal partition or path in {body!r}")
                    sidecars[partition] = body
                else:
                    state.apply(name, body)
            incarnation = self.directory.rsplit("/", 1)[0]
            paths = {p: f"{incarnation}/{body['path']}" for p, body in sidecars.items()}
            found = self.storage.read_many(list(paths.values()))
            for partition, path in paths.items():
                content = found.get(path)
                if content is None:
                    raise CorruptLogError(f"sidecar {path} of partition {partition} is missing")
                expected = sidecars[partition]
                if len(content) != expected.get("size"):
                    raise CorruptLogError(
                        f"sidecar {path} has {len(content)} bytes, the checkpoint records "
                        f"{expected.get('size')!r}"
                    )
                partition_actions = decode_sidecar(content, path, partition)
                if len(partition_actions) != expected.get("actions"):
                    raise CorruptLogError(
                        f"sidecar {path}: action count differs from the checkpoint's"
                    )
                for name, body in partition_actions:
                    state.apply(name, {**body, "partition": partition})
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptLogError(f"{where}: malformed checkpoint ({exc})") from None
        except CorruptLogError as exc:
            raise CorruptLogError(f"{where}: {exc}") from None
        except UnsupportedFormatVersionError as exc:
            raise UnsupportedFormatVersionError(f"{where}: {exc}") from None
        state.stamp(version)
        state.sidecars, state.sidecar_version = sidecars, version
        state.sidecars_seen = time.monotonic()
        ts = info.get("timestamp")
        if isinstance(ts, int):
            state.last_commit_ms = ts
        return state


class TopicLog:
    """One topic log, shared by the partitions of a topic that belong to it (thread-safe).

    It keeps the newest state it has seen, so that a reader of many partitions asks the
    storage once per poll, not once per partition.
    """

    def __init__(
        self,
        storage: Any,
        directory: str,
        *,
        topic: str,
        index: int,
        checkpoint_interval: int = 100,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.topic = topic
        self.index = index
        self.directory = directory
        self.log: Log[TopicLogState] = TopicLogFiles(
            storage,
            directory,
            TopicLogState,
            checkpoint_interval=checkpoint_interval,
            retry=retry,
        )
        self._state: TopicLogState | None = None
        self._lock = threading.Lock()
        self._confirmed = time.monotonic()  # when the cached state was last known newest

    def __repr__(self) -> str:
        return f"TopicLog({self.topic!r}, {self.index})"

    def state(
        self, *, refresh: bool = True, max_age_s: float = 0.0, tail: bool = False
    ) -> TopicLogState:
        """The newest state. ``max_age_s``: a state confirmed newest less than that long ago is
        returned as it is (readers of many partitions share one request per poll). ``tail``:
        a poll of a reader that looks again soon (``Log.update``)."""
        with self._lock:
            current, confirmed = self._state, self._confirmed
        now = time.monotonic()
        if current is None or (refresh and now - confirmed > STALE_STATE_S):
            # Polling by name cannot step over versions vacuum deleted (PROTOCOL.md 17.5).
            current = self.log.load()
            self._remember(current, confirmed=True)
        elif refresh and now - confirmed >= max_age_s:
            current = self.log.update(current, tail=tail)
            self._remember(current, confirmed=True)
        return current

    def _remember(self, state: TopicLogState, *, confirmed: bool = False) -> None:
        with self._lock:
            if self._state is None or state.version >= self._state.version:
                self._state = state
                if confirmed:
                    self._confirmed = time.monotonic()

    def commit(
        self,
        builds: Mapping[int, PartitionBuild],
        *,
        operation: str,
        durable: bool = True,
        written_at: float | None = None,
        isolate: bool = False,
        info: dict[str, Any] | None = None,
        background_checkpoint: bool = False,
    ) -> tuple[CommitResult[TopicLogState] | None, dict[int, BaseException]]:
        """One commit holding the actions of several partitions, built against the newest
        state and rebuilt after every lost race.

        With ``isolate``, a partition whose build raises is left out of the commit and its
        error returned (a producer's batches fail one partition at a time, as in Kafka);
        without it the error is raised and nothing is committed. Returns the commit (None when
        no partition had anything to commit) and the refused partitions' errors.
        ``background_checkpoint``: as :meth:`Log.commit`'s.
        """
        refused: dict[int, BaseException] = {}

        def build(state: TopicLogState) -> list[Action] | None:
            refused.clear()
            per_partition: dict[int, list[Action]] = {}
            for partition, partition_build in builds.items():
                try:
                    actions = partition_build(state.partition(partition))
                except Exception as exc:
                    if not isolate:
                        raise
                    refused[partition] = exc
                    continue
                if actions:
                    per_partition[partition] = actions
            if not per_partition:
                return None
            out: list[Action] = []
            if state.version < 0:
                out.append(protocol_action(TOPIC_LOG_VERSION))
            for partition in sorted(per_partition):
                # A partition build written for a layout-2 log may open a new log with a
                # protocol action; a topic log has its own, above.
                body = [a for a in per_partition[partition] if "protocol" not in a]
                out.extend(tag_actions(body, partition))
            return out

        state = self._base_state()
        result = self.log.commit(
            state,
            build,
            operation=operation,
            durable=durable,
            info={"topic": self.topic, "log": self.index, **(info or {})},
            written_at=written_at,
            background_checkpoint=background_checkpoint,
        )
        if result is not None:
            self._remember(result.state, confirmed=True)
        else:
            self._remember(self.log.update(state), confirmed=True)
        return result, dict(refused)

    def _base_state(self) -> TopicLogState:
        state = self.state(refresh=False)
        if time.monotonic() - self._confirmed > STALE_STATE_S:
            # A commit built on a state older than the versions vacuum deleted could take a
            # deleted version's name and be lost: reload it first.
            state = self.state()
        return state


# A cached state not confirmed as the newest for this long is reloaded from a checkpoint
# before it is used: vacuum keeps log versions at least twice as long (PROTOCOL.md 17.5).
STALE_STATE_S = 24 * 3600.0
