"""Upgrading a topic from layout 2 (a log per partition) to layout 3 (shared topic logs).

Three steps, each idempotent, so that a run that stops anywhere is finished by running it
again (docs/PROTOCOL.md 27):

1. :func:`seal_partitions`: every partition log gets a commit holding ``protocol``
   (``minWriterVersion`` 3, ``minReaderVersion`` unchanged) and ``sealed {"layout": 3}``. From
   then on writers of this version refuse it with :class:`~kstore.errors.TopicUpgradedError`
   and older writers refuse it by its version, so its state is final.
2. :func:`adopt_partitions`: version 0 of every topic log (put-if-absent) holds ``protocol``
   6/7 (reader 6, writer 7; 5/6, 4/5, 4/4 and 3/3 before) and the whole final state of each of its partitions, as that
   partition's checkpoint actions naming the partition. Segments are adopted by reference:
   their ``segments/`` paths stay relative to the partition directory, nothing is copied.
3. :func:`switch_layout`: the topic's metadata log gets ``metaData`` with ``layout: 3`` (every
   other field carried, schemas included) and ``protocol`` 6/7, so that readers that predate
   layout 3 refuse the topic instead of reading partition logs nobody writes any more.

Between steps 1 and 3 the topic is readable as before but not writable: writers are told to
run the upgrade again. Administration only: reads manifests, never segment data (no pyarrow).

A topic already in layout 3 whose logs are below 6/7 (version 3: written before incremental
checkpoints; 4/4: before the sidecar horizon of writer version 5; 4/5: before commits carried
their data; 5/6: before a checkpoint's sidecars shared one file) gets them raised to 6/7
instead: :func:`raise_topic_logs` (27.4).
"""

from __future__ import annotations

import concurrent.futures
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kstore.errors import CorruptLogError, IllegalStateError, UnknownTopicOrPartitionError
from kstore.layout import partition_dir, topic_data_dir
from kstore.log import Action, Log
from kstore.manifest import PartitionState
from kstore.topic_log import (
    LAYOUT3_VERSION,
    LAYOUT_V2,
    LAYOUT_V3,
    TOPIC_LOG_VERSION,
    TOPIC_LOG_WRITER_VERSION,
    TopicLog,
    TopicLogState,
    log_index,
    shared_log_dir,
    tag_actions,
    topic_log_protocol,
)

if TYPE_CHECKING:
    from kstore.store import Store, TopicMetadata, TopicState

SEALED = "sealed"
# Every commit of the upgrade, in every log it writes (PROTOCOL.md 27.1).
OPERATION = "UPGRADE TOPIC"
# Rounds of steps 1 and 2 for partitions added while the upgrade runs, before giving up.
_MAX_ROUNDS = 5
# Partition logs are sealed concurrently: on an object store each seal is a few round trips.
_SEAL_THREADS = 8


class Step(enum.StrEnum):
    """What one step did for one partition, topic log or the metadata."""

    done = "done"  # this run did it
    already = "already"  # found done (an earlier run, or a concurrent one)
    planned = "planned"  # a dry run: would be done


@dataclass(frozen=True)
class PartitionUpgrade:
    """One partition: its final layout-2 state as adopted, and what each step did to it."""

    partition: int
    topic_log: int  # the index of the topic log that adopts it
    start_offset: int
    end_offset: int
    segments: int
    open_transactions: int
    producers: int
    sealed: Step
    adopted: Step

    def to_json(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "topic_log": self.topic_log,
            "log_start_offset": self.start_offset,
            "log_end_offset": self.end_offset,
            "segments": self.segments,
            "open_transactions": self.open_transactions,
            "producers": self.producers,
            "sealed": str(self.sealed),
            "adopted": str(self.adopted),
        }


@dataclass(frozen=True)
class UpgradeReport:
    topic: str
    topic_id: str
    dry_run: bool
    layout_before: int  # 3: the topic was in layout 3 already: only versions were raised
    partitions: tuple[PartitionUpgrade, ...]
    # (index, what step 2 did to its version 0; layout 3 before: what raising it to 6/7 did)
    topic_logs: tuple[tuple[int, Step], ...]
    metadata: Step  # layout 3 before: what raising the metadata log to 6/7 did

    @property
    def changed(self) -> bool:
        """True when this run wrote anything."""
        steps = [self.metadata, *(p.sealed for p in self.partitions)]
        steps += [p.adopted for p in self.partitions]
        steps += [step for _, step in self.topic_logs]
        return Step.done in steps

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "topic_id": self.topic_id,
            "dry_run": self.dry_run,
            "layout_before": self.layout_before,
            "layout": LAYOUT_V3 if not self.dry_run else self.layout_before,
            "changed": self.changed,
            "metadata": str(self.metadata),
            # Layout 2 before: what step 2 did to each topic log's version 0; layout 3 before:
            # what raising each topic log to 6/7 did (27.4).
            "topic_logs": [
                {
                    "index": i,
                    ("raised" if self.layout_before == LAYOUT_V3 else "version0"): str(s),
                }
                for i, s in self.topic_logs
            ],
            "partitions": [p.to_json() for p in self.partitions],
        }


# -- the whole upgrade -----------------------------------------------------------------------------


def upgrade_topic(store: Store, topic: str, *, dry_run: bool = False) -> UpgradeReport:
    """Upgrade ``topic`` from layout 2 to layout 3 (all three steps; see the module). A topic
    already in layout 3 gets its topic logs and metadata log raised to 6/7 (incremental
    checkpoints, the sidecar horizon, data carried in commits, shared sidecar files) if they
    are below. ``dry_run``: report what would be done, write nothing.

    Partitions added while the upgrade runs are sealed and adopted too before the layout
    switches (PROTOCOL.md 27.1)."""
    first = meta = store.topic(topic)
    if meta.layout == LAYOUT_V3:
        logs_raised, metadata = raise_topic_logs(store, meta, dry_run=dry_run)
        return UpgradeReport(
            topic,
            meta.topic_id,
            dry_run,
            LAYOUT_V3,
            (),
            tuple(sorted(logs_raised.items())),
            metadata,
        )
    _check_layout(meta)
    states: dict[int, PartitionState] = {}
    sealed: dict[int, Step] = {}
    adopted: dict[int, Step] = {}
    logs: dict[int, Step] = {}
    for _ in range(_MAX_ROUNDS):
        round_states, round_sealed = _seal(store, meta, dry_run=dry_run)
        round_adopted, round_logs = _adopt(store, meta, round_states, dry_run=dry_run)
        states.update(round_states)
        # A later round finds done what an earlier one did: the first news is kept.
        for merged, found in ((sealed, round_sealed), (adopted, round_adopted), (logs, round_logs)):
            for key, step in found.items():
                if merged.get(key, Step.already) is Step.already:
                    merged[key] = step
        try:
            metadata = _switch(store, meta, dry_run=dry_run)
            break
        except _PartitionsGrewError:
            meta = store.topic(topic)
            if meta.topic_id != first.topic_id:
                raise UnknownTopicOrPartitionError(
                    f"topic {topic!r} (id {first.topic_id}) was deleted during the upgrade"
                ) from None
            if meta.layout == LAYOUT_V3:  # a concurrent run switched it
                metadata = Step.already
                break
    else:
        raise IllegalStateError(
            f"topic {topic!r} kept growing during the upgrade ({_MAX_ROUNDS} rounds); "
            "run it again once partitions are no longer being added"
        )
    if not dry_run:
        _forget_partitions(store, topic)
    return UpgradeReport(
        topic,
        first.topic_id,
        dry_run,
        LAYOUT_V2,
        tuple(_partition_report(p, states[p], meta, sealed[p], adopted[p]) for p in sorted(states)),
        tuple(sorted(logs.items())),
        metadata,
    )


# -- the steps, each on its own (a run that stopped after one is finished by upgrade_topic) ------


def seal_partitions(store: Store, topic: str) -> dict[int, Step]:
    """Step 1 alone: seal every partition log of a layout-2 topic."""
    meta = _layout2_topic(store, topic)
    return _seal(store, meta, dry_run=False)[1]


def adopt_partitions(store: Store, topic: str) -> dict[int, Step]:
    """Step 2 alone: every partition's final state into version 0 of its topic log. Refused
    (IllegalStateError) while a partition log is not sealed."""
    meta = _layout2_topic(store, topic)
    states = {p: _partition_log(store, meta, p).load() for p in range(meta.partitions)}
    unsealed = [p for p, s in sorted(states.items()) if s.sealed_layout != LAYOUT_V3]
    if unsealed:
        raise IllegalStateError(
            f"topic {topic!r}: partition log(s) {_numbers(unsealed)} are not sealed; an "
            "unsealed log can still change, so its state cannot be adopted (seal first)"
        )
    return _adopt(store, meta, states, dry_run=False)[0]


def switch_layout(store: Store, topic: str) -> Step:
    """Step 3 alone: commit the topic's metadata with ``layout: 3``. Refused
    (IllegalStateError) while a topic log has not adopted all of its partitions."""
    meta = store.topic(topic)
    if meta.layout == LAYOUT_V3:
        return Step.already
    _check_layout(meta)
    missing = [
        p
        for k, log in _topic_logs(store, meta).items()
        for p in _expected(meta, k)
        if p not in log.log.load().partitions
    ]
    if missing:
        raise IllegalStateError(
            f"topic {topic!r}: partition(s) {_numbers(missing)} are not in a topic log yet; "
            "switching the layout now would hide their records (adopt them first)"
        )
    step = _switch(store, meta, dry_run=False)
    _forget_partitions(store, topic)
    return step


# -- step 1 ----------------------------------------------------------------------------------------


def _seal(
    store: Store, meta: TopicMetadata, *, dry_run: bool
) -> tuple[dict[int, PartitionState], dict[int, Step]]:
    """Each partition's final state (as of its seal) and what step 1 did to it."""

    def seal(partition: int) -> tuple[PartitionState, Step]:
        log = _partition_log(store, meta, partition)
        state = log.load()
        if _is_sealed(state, log):
            return state, Step.already
        if dry_run:
            return state, Step.planned
        did: list[bool] = []

        def build(current: PartitionState) -> list[Action] | None:
            did.clear()
            if _is_sealed(current, log):
                return None  # a concurrent run sealed it
            did.append(True)
            return [
                {
                    "protocol": {
                        # Readers are not affected: the log stays readable as it was.
                        "minReaderVersion": current.min_reader_version,
                        "minWriterVersion": max(current.min_writer_version, LAYOUT3_VERSION),
                    }
                },
                {SEALED: {"layout": LAYOUT_V3}},
            ]

        result = log.commit(
            state,
            build,
            operation=OPERATION,
            info={"topic": meta.name, "partition": partition, "upgradeStep": 1},
        )
        final = result.state if result is not None else log.load()
        return final, Step.done if did else Step.already

    partitions = list(range(meta.partitions))
    if store.storage.is_remote and len(partitions) > 1:
        with concurrent.futures.ThreadPoolExecutor(min(_SEAL_THREADS, len(partitions))) as pool:
            outcomes = list(pool.map(seal, partitions))
    else:
        outcomes = [seal(p) for p in partitions]
    states = {p: outcome[0] for p, outcome in zip(partitions, outcomes, strict=True)}
    steps = {p: outcome[1] for p, outcome in zip(partitions, outcomes, strict=True)}
    return states, steps


def _is_sealed(state: PartitionState, log: Log[PartitionState]) -> bool:
    if state.sealed_layout is None:
        return False
    if state.sealed_layout != LAYOUT_V3:
        raise CorruptLogError(
            f"{log.storage.display_url}/{log.directory}: sealed for layout "
            f"{state.sealed_layout}, not {LAYOUT_V3}"
        )
    return state.min_writer_version >= LAYOUT3_VERSION


# -- step 2 ----------------------------------------------------------------------------------------


def partition_actions(state: PartitionState, partition: int) -> list[Action]:
    """A layout-2 partition's whole state as topic-log actions naming ``partition``: its
    checkpoint actions without the partition log's own ``protocol`` and ``sealed``."""
    own = ("protocol", SEALED)
    kept = [a for a in state.checkpoint_actions() if not any(name in a for name in own)]
    return tag_actions(kept, partition)


def _adopt(
    store: Store, meta: TopicMetadata, states: Mapping[int, PartitionState], *, dry_run: bool
) -> tuple[dict[int, Step], dict[int, Step]]:
    """What step 2 did per partition and per topic log."""
    per_partition: dict[int, Step] = {}
    per_log: dict[int, Step] = {}
    new = Step.planned if dry_run else Step.done
    for index, topic_log in _topic_logs(store, meta).items():
        expected = _expected(meta, index)
        adopted = _adopt_log(topic_log, meta, expected, states, dry_run=dry_run)
        for p in expected:
            per_partition[p] = new if p in adopted else Step.already
        per_log[index] = new if adopted else Step.already
    return per_partition, per_log


def _adopt_log(
    topic_log: TopicLog,
    meta: TopicMetadata,
    expected: Sequence[int],
    states: Mapping[int, PartitionState],
    *,
    dry_run: bool,
) -> list[int]:
    """Adopt into one topic log the expected partitions it does not hold yet (all of them in
    its version 0, unless a run that stopped was followed by partitions being added); returns
    the partitions this run adopted (or would)."""
    where = f"{topic_log.log.storage.display_url}/{topic_log.directory}"
    current = topic_log.log.load()
    adopted: list[int] = []

    def build(state: TopicLogState) -> list[Action] | None:
        adopted.clear()
        _check_adopted(state, expected, states, where)
        missing = [p for p in expected if p not in state.partitions]
        if not missing:
            return None
        actions: list[Action] = []
        if state.version < 0:
            actions.append(topic_log_protocol())
        for p in missing:
            actions.extend(partition_actions(states[p], p))
        adopted.extend(missing)
        return actions

    if dry_run:
        build(current)
        return adopted
    # Put-if-absent of version 0: a lost race (a concurrent run) is rebuilt on the winner's
    # version 0, which is then only checked.
    topic_log.log.commit(
        current,
        build,
        operation=OPERATION,
        info={"topic": meta.name, "log": topic_log.index, "upgradeStep": 2},
    )
    return adopted


def _check_adopted(
    state: TopicLogState,
    expected: Sequence[int],
    states: Mapping[int, PartitionState],
    where: str,
) -> None:
    """A topic log that exists already must hold these partitions' states, not others: offsets
    only grow, so each adopted partition ends at or after its sealed end offset."""
    stray = sorted(set(state.partitions) - set(expected))
    if stray:
        raise CorruptLogError(
            f"{where}: holds partition(s) {_numbers(stray)}, which do not belong to this topic "
            "log; it was not made by an upgrade of this topic"
        )
    for p in expected:
        held = state.partitions.get(p)
        if held is None:
            continue
        sealed = states[p]
        if held.end_offset < sealed.end_offset or held.log_start_offset < sealed.log_start_offset:
            raise CorruptLogError(
                f"{where}: partition {p} holds offsets [{held.log_start_offset}, "
                f"{held.end_offset}) but its sealed partition log holds [{sealed.log_start_offset}, "
                f"{sealed.end_offset}); the topic log was not made from it"
            )


# -- layout 3: topic logs from version 3, 4 or 5 to 6/7 -----------------------------------------------


def raise_topic_logs(
    store: Store, meta: TopicMetadata, *, dry_run: bool = False
) -> tuple[dict[int, Step], Step]:
    """A layout-3 topic's topic logs, then its metadata log, raised to reader version 6 and
    writer version 7 (incremental checkpoints, the sidecar horizon, data carried in commits,
    shared sidecar files, PROTOCOL.md 27.4): what was done to each topic log and to the
    metadata. A log not created yet is left alone (its first commit creates it at 6/7)."""
    new = Step.planned if dry_run else Step.done
    steps: dict[int, Step] = {}
    for topic_log in store.topic_logs(meta.name, meta):
        index = topic_log.index
        state = topic_log.log.load()
        if state.version < 0 or _at_least(state):
            steps[index] = Step.already
            continue
        if dry_run:
            steps[index] = Step.planned
            continue
        result = topic_log.log.commit(
            state,
            lambda current: None if _at_least(current) else [_raised(current)],
            operation=OPERATION,
            info={"topic": meta.name, "log": index, "upgradeStep": 4},
        )
        if result is not None:
            topic_log._remember(result.state, confirmed=True)
        steps[index] = new if result is not None else Step.already
    metadata_log = store._topic_log(meta.name)
    metadata_state = store._topic_state(meta.name)

    def build(current: TopicState) -> list[Action] | None:
        found = current.to_metadata()
        if found is None or found.topic_id != meta.topic_id:
            raise UnknownTopicOrPartitionError(
                f"topic {meta.name!r} (id {meta.topic_id}) was deleted during the upgrade"
            )
        return None if _at_least(current) else [_raised(current)]

    if dry_run:
        return steps, Step.planned if build(metadata_state) is not None else Step.already
    switched = metadata_log.commit(
        metadata_state, build, operation=OPERATION, info={"upgradeStep": 4}
    )
    with store._lock:
        store._topic_logs[meta.name] = (
            switched.state if switched is not None else metadata_log.update(metadata_state)
        )
    return steps, new if switched is not None else Step.already


def _at_least(state: Any) -> bool:
    """Whether a log is at the version of new topic logs (or above)."""
    return bool(
        state.min_reader_version >= TOPIC_LOG_VERSION
        and state.min_writer_version >= TOPIC_LOG_WRITER_VERSION
    )


def _raised(state: Any) -> Action:
    """The ``protocol`` that raises a log to the version of new topic logs (never lowering)."""
    return {
        "protocol": {
            "minReaderVersion": max(state.min_reader_version, TOPIC_LOG_VERSION),
            "minWriterVersion": max(state.min_writer_version, TOPIC_LOG_WRITER_VERSION),
        }
    }


# -- step 3 ----------------------------------------------------------------------------------------


def _switch(store: Store, meta: TopicMetadata, *, dry_run: bool) -> Step:
    log = store._topic_log(meta.name)
    state = store._topic_state(meta.name)
    did: list[bool] = []

    def build(current: TopicState) -> list[Action] | None:
        did.clear()
        found = current.to_metadata()
        if found is None or found.topic_id != meta.topic_id:
            raise UnknownTopicOrPartitionError(
                f"topic {meta.name!r} (id {meta.topic_id}) was deleted during the upgrade"
            )
        if found.layout == LAYOUT_V3:
            return None
        if found.partitions != meta.partitions:
            raise _PartitionsGrewError(
                f"topic {meta.name!r} grew from {meta.partitions} to {found.partitions} "
                "partitions during the upgrade; run the upgrade again to adopt the new ones"
            )
        actions: list[Action] = []
        if not _at_least(current):
            # Readers that predate layout 3 must refuse the topic, not read sealed logs.
            actions.append(_raised(current))
        # Every other field is carried as read (schemas, config, unknown fields).
        actions.append({"metaData": {**(current.metadata or {}), "layout": LAYOUT_V3}})
        did.append(True)
        return actions

    if dry_run:
        return Step.planned if build(state) is not None else Step.already
    result = log.commit(state, build, operation=OPERATION, info={"upgradeStep": 3})
    with store._lock:
        store._topic_logs[meta.name] = result.state if result is not None else log.update(state)
    return Step.done if did else Step.already


class _PartitionsGrewError(IllegalStateError):
    """Step 3 found more partitions than steps 1 and 2 moved: they must be moved first."""


def _forget_partitions(store: Store, topic: str) -> None:
    """Drop this store object's layout-2 partition objects of the topic, so that its next
    reads and writes go through the topic logs."""
    with store._lock:
        for key, part in list(store._partitions.items()):
            if key[0] == topic and part.topic_log is None:
                del store._partitions[key]


# -- helpers ---------------------------------------------------------------------------------------


def _check_layout(meta: TopicMetadata) -> None:
    if meta.layout != LAYOUT_V2:
        raise IllegalStateError(
            f"topic {meta.name!r} has layout {meta.layout}; only layout 2 can be upgraded"
        )


def _layout2_topic(store: Store, topic: str) -> TopicMetadata:
    meta = store.topic(topic)
    if meta.layout == LAYOUT_V3:
        raise IllegalStateError(f"topic {topic!r} is in layout 3 already")
    _check_layout(meta)
    return meta


def _partition_log(store: Store, meta: TopicMetadata, partition: int) -> Log[PartitionState]:
    return Log(
        store.storage,
        f"{partition_dir(meta.name, meta.topic_id, partition)}/_log",
        PartitionState,
        checkpoint_interval=_interval(meta),
        retry=store.retry,
    )


def _topic_logs(store: Store, meta: TopicMetadata) -> dict[int, TopicLog]:
    """The topic logs the upgraded topic will have (``commit.logs`` of them, at most one per
    partition), as TopicLog objects of their own (the store builds them for layout 3 only)."""
    incarnation = topic_data_dir(meta.name, meta.topic_id)
    return {
        k: TopicLog(
            store.storage,
            shared_log_dir(incarnation, k),
            topic=meta.name,
            index=k,
            checkpoint_interval=_interval(meta),
            retry=store.retry,
        )
        for k in range(min(meta.commit_logs, meta.partitions))
    }


def _expected(meta: TopicMetadata, index: int) -> list[int]:
    return [p for p in range(meta.partitions) if log_index(p, meta.commit_logs) == index]


def _interval(meta: TopicMetadata) -> int:
    return int(meta.effective_config["checkpoint.interval"])


def _partition_report(
    partition: int, state: PartitionState, meta: TopicMetadata, sealed: Step, adopted: Step
) -> PartitionUpgrade:
    return PartitionUpgrade(
        partition=partition,
        topic_log=log_index(partition, meta.commit_logs),
        start_offset=state.start_offset,
        end_offset=state.end_offset,
        segments=len(state.segments),
        open_transactions=len(state.open_transactions),
        producers=len(state.producers),
        sealed=sealed,
        adopted=adopted,
    )


def _numbers(items: Sequence[int], limit: int = 10) -> str:
    shown = ", ".join(str(i) for i in items[:limit])
    return shown if len(items) <= limit else f"{shown}, ... ({len(items)} in all)"


__all__ = [
    "PartitionUpgrade",
    "Step",
    "UpgradeReport",
    "adopt_partitions",
    "partition_actions",
    "raise_topic_logs",
    "seal_partitions",
    "switch_layout",
    "upgrade_topic",
]
