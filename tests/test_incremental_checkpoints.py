"""Incremental checkpoints of topic logs (PROTOCOL.md 13.4, version 4): a partition's state in
a checkpoint is a chain of sidecars, a base and deltas of its actions since, so that a
checkpoint writes what the commits since the previous one wrote, not the partitions' states.

The workload is driven through the topic log itself with synthetic manifest actions (appends
into data objects, merges replacing them, retention, compaction's cleaned point, vacuumed
files, producer entries and their expiry, transactions and their markers), so that the
replay through chains is compared with a replay of every commit at every checkpoint."""

from __future__ import annotations

import gzip
import itertools
import json
import random
import time
import uuid
from typing import Any

import pytest

from kstore import CorruptLogError, Store
from kstore.errors import StorageError, UnsupportedFormatVersionError
from kstore.layout import topic_data_dir
from kstore.log import (
    Action,
    checkpoint_file,
    compact_json,
    decode_commit,
    version_file,
    wait_for_checkpoints,
)
from kstore.manifest import PartitionState
from kstore.storage import Storage
from kstore.topic_log import (
    CHAIN_VERSION,
    HORIZON_VERSION,
    SIDECARS,
    TOPIC_LOG_VERSION,
    TOPIC_LOG_WRITER_VERSION,
    TopicLog,
    TopicLogFiles,
    TopicLogState,
    sidecar_name,
)
from kstore.upgrade import upgrade_topic

StoreURL = tuple[str, dict[str, Any]]
DAY_MS = 24 * 3600 * 1000


# -- a synthetic workload ---------------------------------------------------------------------------


class Workload:
    """Deterministic commits to one topic log: each picks some partitions and, for each, one
    of: an append (a ranged add and its producer entry, sometimes inside a transaction),
    a transaction marker, a merge of its oldest ranges into one segment, retention of its
    first segment, compaction's cleaned point, or forgetting removed files (vacuumed)."""

    def __init__(
        self, shared: TopicLog, partitions: list[int], seed: int = 7, now: int | None = None
    ) -> None:
        self.shared = shared
        self.partitions = partitions
        self.rng = random.Random(seed)
        self.now = int(time.time() * 1000) if now is None else now
        self.open_txn: dict[int, tuple[str, int]] = {}
        self.txn_version = 0

    def _add(self, state: PartitionState, count: int, transaction: str | None = None) -> Action:
        self.now += 7
        body: dict[str, Any] = {
            "path": f"_data/{self.now:013d}-{uuid.UUID(int=self.rng.getrandbits(128)).hex}.kdat",
            "baseOffset": state.end_offset,
            "lastOffset": state.end_offset + count - 1,
            "records": count,
            "minTimestamp": self.now - 40,
            "maxTimestamp": self.now - 3,
            "size": 900 + count,
            "checksum": f"crc32c:{self.rng.getrandbits(32):08x}",
            "format": "arrow",
            "sparse": False,
            "createdTime": self.now,
            "range": [self.rng.randrange(100_000), 900 + count],
        }
        if transaction is not None:
            body["transaction"] = transaction
        return {"add": body}

    def _producer(self, state: PartitionState, pid: str, count: int, ts: int) -> Action:
        return {
            "producer": {
                "id": pid,
                "epoch": 0,
                "firstSequence": state.end_offset,
                "lastSequence": state.end_offset + count - 1,
                "baseOffset": state.end_offset,
                "lastOffset": state.end_offset + count - 1,
                "timestamp": ts,
            }
        }

    def actions(self, partition: int, state: PartitionState) -> list[Action]:
        rng = self.rng
        live = state.segments
        roll = rng.random()
        if partition in self.open_txn and roll < 0.3:
            pid, version = self.open_txn.pop(partition)
            return [
                {
                    "txnMarker": {
                        "producerId": pid,
                        "epoch": 0,
                        "version": version,
                        "commit": True,
                        "timestamp": self.now,
                    }
                },
                {"txn": {"appId": f"app-{partition}", "version": version}},
            ]
        if roll < 0.08 and len(live) >= 4:  # a merge: the oldest ranges into one segment
            run = live[:3]
            records = sum(s.record_count for s in run)
            if any(s.transaction is not None for s in run):
                return self.actions(partition, state)
            out: list[Action] = [
                {"remove": {"path": s.path, "deletionTimestamp": self.now}} for s in run
            ]
            out.append(
                {
                    "add": {
                        "path": f"segments/{self.now:013d}-{uuid.UUID(int=rng.getrandbits(128)).hex}.parquet",
                        "baseOffset": run[0].base_offset,
                        "lastOffset": run[-1].last_offset,
                        "records": records,
                        "minTimestamp": run[0].min_timestamp_ms,
                        "maxTimestamp": run[-1].max_timestamp_ms,
                        "size": 5000,
                        "checksum": "crc32c:00000000",
                        "format": "parquet",
                        "sparse": False,
                        "createdTime": self.now,
                    }
                }
            )
            return out
        if roll < 0.11 and len(live) >= 2 and live[0].transaction is None:  # retention
            first = live[0]
            return [
                {"logStart": {"offset": first.last_offset + 1}},
                {"remove": {"path": first.path, "deletionTimestamp": self.now}},
            ]
        if roll < 0.13 and state.end_offset > state.cleaned_offset:
            return [{"cleaned": {"offset": state.end_offset}}]
        if roll < 0.16 and state.removed:
            gone = sorted(state.removed)[: rng.randint(1, len(state.removed))]
            return [{"vacuumed": {"paths": gone}}]
        count = rng.randint(1, 50)
        if roll < 0.2 and partition not in self.open_txn:
            self.txn_version += 1
            pid = f"{partition:08x}" + "t" * 24
            self.open_txn[partition] = (pid, self.txn_version)
            key = f"{pid}:{self.txn_version}"
            return [self._add(state, count, key), self._producer(state, pid, count, self.now)]
        # Producers come and go; one wrote long ago, so that its entry has expired.
        pid = f"{rng.randrange(6):032x}"
        stamp = self.now - 8 * DAY_MS if pid == f"{0:032x}" else self.now
        return [self._add(state, count), self._producer(state, pid, count, stamp)]

    def commit(self, *, background: bool = False) -> int:
        chosen = self.rng.sample(self.partitions, self.rng.randint(1, len(self.partitions)))
        builds = {p: (lambda state, p=p: self.actions(p, state)) for p in chosen}
        result, refused = self.shared.commit(
            builds, operation="TEST", background_checkpoint=background
        )
        assert not refused
        assert result is not None
        return result.version

    def run(self, commits: int, *, background: bool = False) -> int:
        version = -1
        for _ in range(commits):
            version = self.commit(background=background)
        return version


def _topic(url: StoreURL, *, partitions: int = 3, interval: int = 10) -> tuple[Store, TopicLog]:
    store = Store(*url)
    store.create_topic("t", partitions, config={"checkpoint.interval": interval})
    return store, store.topic_log("t", store.topic("t"), 0)


def _files(shared: TopicLog) -> TopicLogFiles:
    log = shared.log
    assert isinstance(log, TopicLogFiles)
    return TopicLogFiles(log.storage, log.directory, TopicLogState, checkpoint_interval=10**9)


def _replayed(shared: TopicLog, version: int) -> TopicLogState:
    """The state at ``version`` from every commit, no checkpoint."""
    files = _files(shared)
    state = TopicLogState()
    for v in range(version + 1):
        commit = files.read_commit(v)
        assert commit is not None, v
        files._apply_commit(state, v, *commit)
    return state


def _same(a: TopicLogState, b: TopicLogState) -> None:
    assert a.version == b.version
    assert set(a.partitions) == set(b.partitions)
    for p in a.partitions:
        assert a.partition(p).checkpoint_actions() == b.partition(p).checkpoint_actions(), p


def _checkpoint(shared: TopicLog, version: int) -> list[tuple[str, dict[str, Any]]]:
    storage = shared.log.storage
    return decode_commit(storage.read(f"{shared.directory}/{checkpoint_file(version)}"), "c")[1]


def _chains(shared: TopicLog, version: int) -> dict[int, list[dict[str, Any]]]:
    chains: dict[int, list[dict[str, Any]]] = {}
    for name, body in _checkpoint(shared, version):
        if name == "sidecar":
            chains.setdefault(body["partition"], []).append(body)
    return chains


def _incarnation(shared: TopicLog) -> str:
    return shared.directory.rsplit("/", 1)[0]


def _put_checkpoint(shared: TopicLog, version: int, actions: list[tuple[str, Any]]) -> None:
    storage = shared.log.storage
    path = f"{shared.directory}/{checkpoint_file(version)}"
    info = decode_commit(storage.read(path), "c")[0]
    lines = [json.dumps({"commitInfo": info})]
    lines += [json.dumps({name: body}) for name, body in actions]
    storage.put(path, ("\n".join(lines) + "\n").encode())


# -- replay ------------------------------------------------------------------------------------------


def test_replay_through_chains_equals_replay_of_every_commit(local_store: StoreURL) -> None:
    _, shared = _topic(local_store, partitions=3, interval=10)
    newest = Workload(shared, [0, 1, 2]).run(400)
    files = _files(shared)
    lengths: list[int] = []
    for version in range(10, newest + 1, 10):
        chains = _chains(shared, version)
        lengths += [len(c) for c in chains.values()]
        for chain in chains.values():
            base, deltas = chain[0], chain[1:]
            assert "delta" not in base
            assert base["path"].endswith(".json.gz")
            assert all("delta" in d for d in deltas)
            # The bound (13.4): deltas add up to no more than the base, and are few.
            assert sum(d["size"] for d in deltas) <= base["size"]
        loaded = files._read_checkpoint(version)
        assert loaded is not None
        _same(loaded, _replayed(shared, version))
    # Chains did grow, and were consolidated into new bases.
    assert max(lengths) >= 4
    assert lengths.count(1) > 3
    # A reader that opens the log now: the newest checkpoint's chains plus later commits.
    _same(
        Store(*local_store).topic_log("t", Store(*local_store).topic("t"), 0).log.load(),
        _replayed(shared, newest),
    )
    # The writer's bases are made of the lines its commits encoded (a new segment's line is
    # kept from its commit, not encoded again), which are exactly its actions' own lines.
    state = shared.state(refresh=False)
    for partition in (0, 1, 2):
        view = state.partition(partition)
        assert view.checkpoint_lines() == [
            compact_json(a) for a in view.checkpoint_actions() if "protocol" not in a
        ]
    Workload(shared, [0], seed=5).run(3)
    newest_segment = shared.state(refresh=False).partition(0).last_segment
    assert newest_segment is not None
    assert newest_segment.transaction is not None or newest_segment._add_line is not None


def test_checkpoints_written_in_the_background_chain_as_those_of_the_committing_thread(
    local_store: StoreURL,
) -> None:
    """A producer's checkpoints are written on a background thread from copies of its states,
    while its later states go on from the originals. Those learn the newest checkpoint from the
    log (its lineage), so the same commits give the same chains as checkpoints written by the
    committing thread, not a new base for every partition each time."""
    store, inline = _topic(local_store, partitions=3, interval=10)
    store.create_topic("b", 3, config={"checkpoint.interval": 10})
    background = store.topic_log("b", store.topic("b"), 0)
    # The same actions to the byte: a chain's bound compares compressed sizes, which other
    # timestamps would move by a byte or two, and with them where a new base is due.
    now = int(time.time() * 1000)
    inline_work = Workload(inline, [0, 1, 2], now=now)
    background_work = Workload(background, [0, 1, 2], now=now)
    for _ in range(300):
        inline_work.commit()
        newest = background_work.commit(background=True)
        assert wait_for_checkpoints(10)
    shapes = {
        name: [
            [len(chain) for _, chain in sorted(_chains(shared, version).items())]
            for version in range(10, newest + 1, 10)
        ]
        for name, shared in (("inline", inline), ("background", background))
    }
    assert shapes["background"] == shapes["inline"]
    assert max(n for shape in shapes["inline"] for n in shape) >= 4


def test_checkpoints_written_in_the_background_while_commits_go_on_equal_the_replay(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits go on while each checkpoint is written: a checkpoint due meanwhile waits (or
    is replaced by a newer one), the states committed meanwhile adopt it when it is done, and
    every checkpoint still equals the replay of every commit, chains extended across them."""
    _, shared = _topic(local_store, partitions=3, interval=10)
    real = TopicLogFiles._write_checkpoint

    def slow(self: TopicLogFiles, state: TopicLogState) -> None:
        time.sleep(0.03)  # commits land meanwhile
        real(self, state)

    monkeypatch.setattr(TopicLogFiles, "_write_checkpoint", slow)
    newest = Workload(shared, [0, 1, 2]).run(400, background=True)
    assert wait_for_checkpoints(30)
    files = _files(shared)
    written = [v for v in range(10, newest + 1, 10) if files._read_checkpoint(v) is not None]
    assert len(written) >= 5, written
    lengths: list[int] = []
    for version in written:
        lengths += [len(c) for c in _chains(shared, version).values()]
        loaded = files._read_checkpoint(version)
        assert loaded is not None
        _same(loaded, _replayed(shared, version))
    assert max(lengths) >= 2, lengths  # bases alone would be chains of one everywhere


def test_a_state_adopts_a_newer_checkpoint_and_keeps_only_its_actions_since() -> None:
    """TopicLogState.adopt: the actions a delta of the next checkpoint needs are those after
    the adopted one; a partition changed since whose actions were not all kept loses its
    chain (a new base next time) while an unchanged one keeps it."""
    state = TopicLogState()
    state.keeps_pending = True  # a writer's
    for version in range(6):
        state = state.copy()  # as each commit does: it knows which partitions it changes
        for partition in (0, 1) if version < 3 else (0,):
            state.apply("endOffset", {"partition": partition, "offset": version + 1})
        state.stamp(version)
    chains = {0: [{"path": "a"}], 1: [{"path": "b"}]}
    state.adopt((3, chains, 1.0))
    assert (state.sidecar_version, state.pending_since, state.sidecars) == (3, 3, chains)
    assert state.pending_lines(0, 3) == ['{"endOffset":{"offset":5}}', '{"endOffset":{"offset":6}}']
    assert state.pending_lines(1, 3) == []
    # Actions kept only from version 4 on (a reader's state that dropped older ones): the
    # partition that changed after the adopted checkpoint cannot extend its chain.
    state.pending, state.pending_since = {}, 4
    state.adopt((3, chains, 2.0))
    assert state.pending_since == 4
    assert state.sidecars == {1: [{"path": "b"}]}


def test_bytes_a_checkpoint_writes_follow_the_commits_since_not_the_live_state(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends only, so that the live state grows all along: the sidecar bytes each checkpoint
    writes stay flat in version 4 (deltas) and grow with the state in version 3 (whole
    sidecars); with twice the commits between checkpoints, a delta is about twice as big."""

    def written(interval: int, version: int, commits: int) -> list[int]:
        monkeypatch.setattr("kstore.topic_log.TOPIC_LOG_VERSION", version)
        monkeypatch.setattr("kstore.store.TOPIC_LOG_VERSION", version)
        writer = version if version < CHAIN_VERSION else HORIZON_VERSION
        monkeypatch.setattr("kstore.topic_log.TOPIC_LOG_WRITER_VERSION", writer)
        monkeypatch.setattr("kstore.store.TOPIC_LOG_WRITER_VERSION", writer)
        url = (f"{local_store[0]}-{interval}-{version}", local_store[1])
        _, shared = _topic(url, partitions=1, interval=interval)
        work = Workload(shared, [0], seed=3)
        work.rng.random = lambda: 0.99  # type: ignore[method-assign]  # appends only
        work.run(commits)
        seen: set[str] = set()
        out = []
        for v in range(interval, commits, interval):
            chain = _chains(shared, v)[0]
            out.append(sum(b["size"] for b in chain if b["path"] not in seen))
            seen |= {b["path"] for b in chain}
        return out

    v4 = written(10, CHAIN_VERSION, 400)
    deltas = [b for i, b in enumerate(v4) if i and b < v4[0] * 2]  # not new bases
    assert len(deltas) >= 20
    assert max(deltas[-5:]) < 1.5 * min(deltas[:5])  # flat while the state grew 40-fold
    v3 = written(10, 3, 400)
    assert v3[-1] > 10 * v3[1]  # whole states: grow with the live state
    assert sum(v4) * 5 < sum(v3)
    double = written(20, CHAIN_VERSION, 400)
    wide = [b for i, b in enumerate(double) if i and b < double[0] * 2]
    assert 1.5 < (sum(wide) / len(wide)) / (sum(deltas) / len(deltas)) < 2.5


def _bulk(shared: TopicLog, partition: int, appends: int) -> None:
    """One commit of many appends to one partition: a large state in few commits."""
    work = Workload(shared, [partition], seed=9)

    def build(state: PartitionState) -> list[Action]:
        out: list[Action] = []
        end = state.end_offset
        for _ in range(appends):
            add = work._add(state, 10)
            add["add"]["baseOffset"], add["add"]["lastOffset"] = end, end + 9
            out.append(add)
            end += 10
        return out

    shared.commit({partition: build}, operation="TEST")


def test_chains_are_consolidated_at_their_bounds(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("kstore.topic_log.MAX_DELTAS", 3)
    _, shared = _topic(local_store, partitions=1, interval=2)
    _bulk(shared, 0, 300)  # version 0: a large state, so that deltas stay small beside it
    work = Workload(shared, [0], seed=5)
    work.rng.random = lambda: 0.99  # type: ignore[method-assign]  # appends only
    work.run(20)
    lengths = [len(_chains(shared, v)[0]) for v in range(2, 21, 2)]
    assert lengths == [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]  # at most 3 deltas, then a new base
    # The size bound alone: a small base and deltas as large, so new bases come early.
    monkeypatch.setattr("kstore.topic_log.MAX_DELTAS", 100)
    _, small = _topic((f"{local_store[0]}-small", {}), partitions=1, interval=5)
    work = Workload(small, [0], seed=5)
    work.rng.random = lambda: 0.99  # type: ignore[method-assign]
    work.run(50)
    lengths = []
    for v in range(5, 50, 5):
        chain = _chains(small, v)[0]
        lengths.append(len(chain))
        assert sum(d["size"] for d in chain[1:]) <= chain[0]["size"]
    assert 1 in lengths[1:], lengths  # a new base before the count bound
    assert 2 in lengths, lengths


# -- corruption --------------------------------------------------------------------------------------


def _chained(local_store: StoreURL) -> tuple[TopicLog, int, int, dict[str, Any]]:
    """A log whose newest checkpoint names a chain with deltas for partition 1: (the log, the
    checkpoint's version, the newest version, one delta of that chain)."""
    _, shared = _topic(local_store, partitions=2, interval=10)
    work = Workload(shared, [0, 1], seed=11)
    newest = work.run(95)
    for version in range(90, 0, -10):
        chain = _chains(shared, version)[1]
        if len(chain) >= 3:
            # Made the newest checkpoint, the one readers start from.
            storage = shared.log.storage
            for later in range(version + 10, newest + 1, 10):
                storage.delete([f"{shared.directory}/{checkpoint_file(later)}"])
            storage.put(f"{shared.directory}/_last_checkpoint", b'{"version": %d}' % version)
            return shared, version, newest, chain[1]
    raise AssertionError("no chain with two deltas")


def _at_protocol(
    actions: list[tuple[str, dict[str, Any]]], reader: int, writer: int
) -> list[tuple[str, dict[str, Any]]]:
    """A checkpoint's actions with its ``protocol`` set to ``reader``/``writer``."""
    versions = {"minReaderVersion": reader, "minWriterVersion": writer}
    return [(n, versions if n == "protocol" else b) for n, b in actions]


def _refused(shared: TopicLog, version: int, match: str) -> None:
    """The checkpoint is corrupt, and so is the log for a reader that starts from it (9.3,
    14.1): it is reported, naming the checkpoint, never replaced by a partial state."""
    with pytest.raises(CorruptLogError, match=match):
        _files(shared)._read_checkpoint(version)
    with pytest.raises(CorruptLogError, match=match) as refused:
        _files(shared).load()
    assert checkpoint_file(version) in str(refused.value)


def _at_versions(monkeypatch: pytest.MonkeyPatch, reader: int, writer: int) -> None:
    """New topic logs (and their topics' metadata) start at ``reader``/``writer``."""
    for module in ("kstore.topic_log", "kstore.store"):
        monkeypatch.setattr(f"{module}.TOPIC_LOG_VERSION", reader)
        monkeypatch.setattr(f"{module}.TOPIC_LOG_WRITER_VERSION", writer)


def test_a_missing_or_truncated_delta_makes_the_checkpoint_corrupt(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 5/6 a file per sidecar (members of shared files: the tests after this one)."""
    _at_versions(monkeypatch, 5, 6)
    shared, version, newest, delta = _chained(local_store)
    storage = shared.log.storage
    path = f"{_incarnation(shared)}/{delta['path']}"
    content = storage.read(path)
    storage.put(path, content[:-9])
    _refused(shared, version, "bytes, the checkpoint records")
    storage.delete([path])
    _refused(shared, version, "is missing")
    # Truncated and the recorded size changed to match: the gzip stream does not end.
    storage.put(path, content[:-9])
    original = _checkpoint(shared, version)
    actions = json.loads(json.dumps(original))
    for _, body in actions:
        if body.get("path") == delta["path"]:
            body["size"] -= 9
    _put_checkpoint(shared, version, actions)
    _refused(shared, version, "truncated")
    # Repaired: the same log loads, to the state a replay of every commit builds.
    storage.put(path, content)
    _put_checkpoint(shared, version, original)
    _same(_files(shared).load(), _replayed(shared, newest))


def test_a_chain_with_a_foreign_partition_another_count_or_a_gap_is_corrupt(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch
) -> None:
    _at_versions(monkeypatch, 5, 6)
    shared, version, newest, delta = _chained(local_store)
    storage = shared.log.storage
    original = _checkpoint(shared, version)

    def altered(change: Any) -> list[tuple[str, Any]]:
        actions = json.loads(json.dumps(original))
        for _, body in actions:
            if body.get("path") == delta["path"]:
                change(body)
        return [tuple(a) for a in actions]

    # The delta of partition 1 named as partition 0's: its header names partition 1.
    swapped = altered(lambda b: b.update(partition=0))
    _put_checkpoint(shared, version, swapped)
    _refused(shared, version, "holds partition 1, not 0|first sidecar")
    _put_checkpoint(shared, version, altered(lambda b: b.update(actions=b["actions"] + 1)))
    _refused(shared, version, "action count differs")
    # A range that leaves a gap after the base: rewritten in the checkpoint and the header
    # alike, so only the chain's contiguity catches it.
    first, last = delta["delta"]
    path = f"{_incarnation(shared)}/{delta['path']}"
    text = gzip.decompress(storage.read(path)).decode()
    header, rest = text.split("\n", 1)
    head = json.loads(header)
    head["sidecar"]["delta"] = [first + 1, last]
    payload = gzip.compress((json.dumps(head, separators=(",", ":")) + "\n" + rest).encode())
    storage.put(path, payload)
    gap = altered(lambda b: b.update(delta=[first + 1, last], size=len(payload)))
    _put_checkpoint(shared, version, gap)
    _refused(shared, version, "but the chain before it ends at")
    # Two bases for one partition.
    _put_checkpoint(shared, version, altered(lambda b: b.pop("delta")))
    _refused(shared, version, "two base sidecars")
    # A chain in a checkpoint of a log below version 4.
    _put_checkpoint(shared, version, _at_protocol(original, 3, 3))
    _refused(shared, version, "below version 4")
    assert newest > version


def _shared_member(shared: TopicLog) -> tuple[int, int, dict[str, Any], dict[str, Any]]:
    """A log (at 6/7) whose newest checkpoint names, for partition 1, a member of a file that
    holds partition 0's too: (that checkpoint's version, the newest version, partition 0's
    member, partition 1's)."""
    work = Workload(shared, [0, 1], seed=11)
    newest = work.run(95)
    for version in range(90, 0, -10):
        chains = _chains(shared, version)
        last = {p: chains[p][-1] for p in (0, 1)}
        if f"-{version:020d}-" in last[1]["path"] and last[0]["path"] == last[1]["path"]:
            storage = shared.log.storage
            for later in range(version + 10, newest + 1, 10):
                storage.delete([f"{shared.directory}/{checkpoint_file(later)}"])
            storage.put(f"{shared.directory}/_last_checkpoint", b'{"version": %d}' % version)
            return version, newest, last[0], last[1]
    raise AssertionError("no checkpoint wrote both partitions' sidecars")


def test_members_of_a_shared_sidecar_file_are_read_by_range_and_checked_alone(
    local_store: StoreURL,
) -> None:
    """Version 6 (7.4): one file per checkpoint, each partition's new sidecar a gzip member at
    the range its `sidecar` action names; each member is checked as a sidecar of its own, and
    a range that does not fit the file, its size or its member makes the checkpoint corrupt."""
    _, shared = _topic(local_store, partitions=2, interval=10)
    version, newest, first, second = _shared_member(shared)
    storage = shared.log.storage
    path = f"{_incarnation(shared)}/{second['path']}"
    content = storage.read(path)
    # The members, one after the other, nothing around them; each a whole gzip member.
    assert first["range"] == [0, first["size"]]
    assert second["range"] == [first["size"], second["size"]]
    assert len(content) == first["size"] + second["size"]
    assert gzip.decompress(content[first["size"] :]).startswith(b'{"sidecar":{"partition":1,')
    _same(_files(shared)._read_checkpoint(version) or TopicLogState(), _replayed(shared, version))
    original = _checkpoint(shared, version)

    def altered(change: Any) -> list[tuple[str, Any]]:
        actions = json.loads(json.dumps(original))
        for _, body in actions:
            if body.get("path") == second["path"] and body["partition"] == 1:
                change(body)
        return [tuple(a) for a in actions]

    start, length = second["range"]
    # A file shorter than the range: truncated, or the range past its end.
    storage.put(path, content[:-9])
    _refused(shared, version, "shorter than the range")
    storage.put(path, content)
    _put_checkpoint(shared, version, altered(lambda b: b.update(range=[start + 9, length])))
    _refused(shared, version, "shorter than the range")
    # A range whose length is not the member's recorded size.
    _put_checkpoint(shared, version, altered(lambda b: b.update(range=[start, length - 1])))
    _refused(shared, version, "illegal range")
    # Partition 0's member named as partition 1's: its header names partition 0.
    _put_checkpoint(
        shared, version, altered(lambda b: b.update(range=first["range"], size=first["size"]))
    )
    _refused(shared, version, "holds partition 0, not 1")
    # A member cut short, size and range alike: its gzip member does not end.
    _put_checkpoint(
        shared, version, altered(lambda b: b.update(range=[start, length - 9], size=length - 9))
    )
    _refused(shared, version, "truncated")
    # A range that starts inside the previous member: not a gzip member there.
    _put_checkpoint(shared, version, altered(lambda b: b.update(range=[start - 5, length])))
    _refused(shared, version, "gzip")
    # A range in a checkpoint below 6/7.
    _put_checkpoint(shared, version, _at_protocol(original, 5, 6))
    _refused(shared, version, "a shared sidecar file below version 6/7")
    storage.delete([path])
    _put_checkpoint(shared, version, original)
    _refused(shared, version, "is missing")
    # Repaired: the log loads, to the state a replay of every commit builds.
    storage.put(path, content)
    _same(_files(shared).load(), _replayed(shared, newest))


def test_a_checkpoint_with_many_changed_partitions_writes_one_sidecar_file(
    local_store: StoreURL,
) -> None:
    """However many partitions changed, a checkpoint at 6/7 writes one sidecar file (bases
    and deltas alike), named by the lowest of its partitions; a checkpoint with one new
    sidecar writes it as a file of its own. Chains mix both, and load as the replay."""
    _, shared = _topic(local_store, partitions=16, interval=5)
    work = Workload(shared, list(range(16)), seed=4)
    newest = work.run(80)
    for version in range(5, newest + 1, 5):
        new = [
            body
            for chain in _chains(shared, version).values()
            for body in chain
            if f"-{version:020d}-" in body["path"]
        ]
        files = {body["path"] for body in new}
        assert len(files) <= 1, version
        if len(new) > 1:
            (name,) = files
            lowest = min(body["partition"] for body in new)
            assert name.startswith(f"{SIDECARS}/{lowest}-{version:020d}-")
            ranges = sorted(body["range"] for body in new)
            assert ranges[0][0] == 0
            assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(ranges))
        elif new:
            assert "range" not in new[0]
    assert any(len(chain) > 2 for chain in _chains(shared, newest - newest % 5).values())
    _same(_files(shared).load(), _replayed(shared, newest))


def test_a_5_6_log_keeps_a_file_per_sidecar_until_the_upgrade_raises_it(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic log at 5/6 is read and written as 5/6 specifies (a file per sidecar); `kstore
    topics upgrade` raises it to 6/7 (27.4), after which its checkpoints share one file, and
    chains that began before the raise are extended with members of shared files."""
    with monkeypatch.context() as old:
        _at_versions(old, 5, 6)
        store, shared = _topic(local_store, partitions=4, interval=5)
        work = Workload(shared, [0, 1, 2, 3], seed=6)
        work.run(30)
    work.run(10)  # written by this version, still at 5/6
    state = shared.state()
    assert (state.min_reader_version, state.min_writer_version) == (5, 6)
    for v in range(5, 40, 5):
        for chain in _chains(shared, v).values():
            assert all("range" not in body for body in chain)
    report = upgrade_topic(store, "t")
    assert [s for _, s in report.topic_logs] == ["done"]
    assert report.metadata == "done"
    newest = work.run(40)
    mixed = [
        (v, p)
        for v in range(45, newest + 1, 5)
        for p, c in _chains(shared, v).items()
        if "range" not in c[0] and any("range" in b for b in c[1:])
    ]
    assert mixed  # a base from before the raise, extended by members of shared files
    assert any("range" in b for c in _chains(shared, 75).values() for b in c)
    _same(_files(shared).load(), _replayed(shared, newest))
    assert Store(*local_store)._topic_log("t").load().min_reader_version == TOPIC_LOG_VERSION


# -- versions ----------------------------------------------------------------------------------------


def test_a_version_3_log_keeps_whole_sidecars_until_the_upgrade_raises_it(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as old:
        old.setattr("kstore.topic_log.TOPIC_LOG_VERSION", 3)
        old.setattr("kstore.store.TOPIC_LOG_VERSION", 3)
        old.setattr("kstore.topic_log.TOPIC_LOG_WRITER_VERSION", 3)
        old.setattr("kstore.store.TOPIC_LOG_WRITER_VERSION", 3)
        store, shared = _topic(local_store, partitions=2, interval=5)
        work = Workload(shared, [0, 1], seed=2)
        work.run(30)
    state = shared.state()
    assert (state.min_reader_version, state.min_writer_version) == (3, 3)
    work.run(20)  # written by this version, still at version 3
    for v in range(5, 50, 5):
        for chain in _chains(shared, v).values():
            assert len(chain) == 1
            assert chain[0]["path"].endswith(".json")
            assert "version" not in chain[0]
    # The dry run reports, and changes nothing.
    report = upgrade_topic(store, "t", dry_run=True)
    assert [s for _, s in report.topic_logs] == ["planned"]
    assert report.metadata == "planned"
    assert _files(shared).load().min_reader_version == 3
    assert store._topic_log("t").load().min_reader_version == 3
    report = upgrade_topic(store, "t")
    assert [s for _, s in report.topic_logs] == ["done"]
    assert report.metadata == "done"
    assert report.changed
    fresh = Store(*local_store)
    assert fresh._topic_log("t").load().min_reader_version == TOPIC_LOG_VERSION
    loaded = _files(shared).load()
    assert (loaded.min_reader_version, loaded.min_writer_version) == (
        TOPIC_LOG_VERSION,
        TOPIC_LOG_WRITER_VERSION,
    )
    again = upgrade_topic(fresh, "t")
    assert not again.changed
    assert again.metadata == "already"
    # From now on: the upgrade's commit (version 50) is checkpointed with new bases for the
    # changed partitions (a version-3 base does not record its version), the next checkpoints
    # extend them with deltas; all of it reads back as the replay of every commit.
    newest = work.run(30)
    assert all(len(c) == 1 for c in _chains(shared, 50).values())
    assert any(len(c) > 1 for c in _chains(shared, 60).values())
    _same(_files(shared).load(), _replayed(shared, newest))
    _same(_files(shared)._read_checkpoint(45) or TopicLogState(), _replayed(shared, 45))


@pytest.mark.parametrize("reader", [3, CHAIN_VERSION, 5])
def test_new_layout_3_topics_are_at_the_newest_version_and_older_readers_are_refused(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch, reader: int
) -> None:
    """New topics are at reader version 6 (shared sidecar files, PROTOCOL.md 7.4): a reader of
    version 3 (no chains), 4 (chains, no carried data) or 5 (no shared files) refuses them."""
    store, shared = _topic(local_store, partitions=2, interval=5)
    Workload(shared, [0, 1]).run(7)
    assert shared.state().min_reader_version == TOPIC_LOG_VERSION
    assert store._topic_log("t").load().min_reader_version == TOPIC_LOG_VERSION
    monkeypatch.setattr("kstore.log.READER_VERSION", reader)
    # The topic's metadata refuses it first, naming the log and both versions.
    with pytest.raises(UnsupportedFormatVersionError) as refused:
        Store(*local_store).topic("t")
    message = str(refused.value)
    assert f"reader version {TOPIC_LOG_VERSION}" in message
    assert f"reads up to {reader}" in message
    assert "topics/t/_log/00000000000000000000.json" in message  # the metadata log's file
    # So does the topic log itself, from its checkpoint or from its version 0.
    with pytest.raises(UnsupportedFormatVersionError) as refused:
        _files(shared).load()
    message = str(refused.value)
    assert shared.directory in message
    assert f"reader version {TOPIC_LOG_VERSION}" in message
    assert f"reads up to {reader}" in message


# -- vacuum ------------------------------------------------------------------------------------------


def test_vacuum_keeps_every_chain_member_of_the_kept_checkpoint(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kstore.retention import vacuum

    monkeypatch.setattr("kstore.topic_log.MAX_DELTAS", 3)  # new bases leave old sidecars
    store, shared = _topic(local_store, partitions=2, interval=5)
    _bulk(shared, 0, 200)
    _bulk(shared, 1, 200)
    work = Workload(shared, [0, 1], seed=4)
    work.rng.random = lambda: 0.99  # type: ignore[method-assign]  # appends: chains grow
    # Versions 2..44: bases at checkpoints 5, 25; the newest, 40, names a base and 3 deltas.
    newest = work.run(43)
    kept = 40
    chains = _chains(shared, kept)
    assert all(len(c) == 4 for c in chains.values()), chains
    named = {b["path"] for c in chains.values() for b in c}
    sidecar_dir = f"{topic_data_dir('t', store.topic('t').topic_id)}/{SIDECARS}"
    before = {f"{SIDECARS}/{i.name}" for i in store.storage.list_dir(sidecar_dir)}
    assert named < before  # older checkpoints' sidecars no kept checkpoint names
    expected = _replayed(shared, newest)
    summary = vacuum(
        None, *local_store, verbose=False, now_ms=int(time.time() * 1000) + 31 * DAY_MS
    )
    assert summary.errors == []
    after = {f"{SIDECARS}/{i.name}" for i in store.storage.list_dir(sidecar_dir)}
    assert after == named
    # The older commits are gone with their checkpoints: the kept chains carry the state.
    assert store.storage.read_if_exists(f"{shared.directory}/{version_file(0)}") is None
    fresh = Store(*local_store)
    _same(fresh.topic_log("t", fresh.topic("t"), 0).log.load(), expected)


@pytest.mark.parametrize("backend", ["local_store", "seaweed_store"])
def test_vacuum_keeps_a_shared_sidecar_file_while_one_member_is_named(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """A shared file (7.4) whose members were replaced by new bases for every partition but an
    idle one, whose chain still names its member, stays; the shared files no kept checkpoint
    names go (22.5). On S3 vacuum finds them by their names' partition, the lowest member's."""
    from kstore.retention import vacuum

    url: StoreURL = request.getfixturevalue(backend)
    monkeypatch.setattr("kstore.topic_log.MAX_DELTAS", 2)  # new bases leave old files
    store, shared = _topic(url, partitions=3, interval=5)
    Workload(shared, [0, 1, 2], seed=4).run(6)  # checkpoint 5: a base each, in one file
    idle_base = _chains(shared, 5)[2][0]
    assert "range" in idle_base
    work = Workload(shared, [0, 1], seed=4)
    work.rng.random = lambda: 0.99  # type: ignore[method-assign]  # appends: chains grow
    newest = work.run(40)
    kept = newest - newest % 5
    chains = _chains(shared, kept)
    assert chains[2] == [idle_base]  # partition 2 still names its member of checkpoint 5
    named = {b["path"] for c in chains.values() for b in c}
    sidecar_dir = f"{topic_data_dir('t', store.topic('t').topic_id)}/{SIDECARS}"
    before = {f"{SIDECARS}/{i.name}" for i in store.storage.list_dir(sidecar_dir)}
    assert named < before
    assert all(b["path"] != idle_base["path"] for p in (0, 1) for b in chains[p])
    expected = _replayed(shared, newest)
    summary = vacuum(None, *url, verbose=False, now_ms=int(time.time() * 1000) + 31 * DAY_MS)
    assert summary.errors == []
    after = {f"{SIDECARS}/{i.name}" for i in store.storage.list_dir(sidecar_dir)}
    assert after == named
    assert idle_base["path"] in after
    fresh = Store(*url)
    _same(fresh.topic_log("t", fresh.topic("t"), 0).log.load(), expected)


def test_the_upgrade_command_raises_a_version_3_topic_with_a_dry_run(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kstore.cli.app import app
    from typer.testing import CliRunner

    with monkeypatch.context() as old:
        old.setattr("kstore.topic_log.TOPIC_LOG_VERSION", 3)
        old.setattr("kstore.store.TOPIC_LOG_VERSION", 3)
        old.setattr("kstore.topic_log.TOPIC_LOG_WRITER_VERSION", 3)
        old.setattr("kstore.store.TOPIC_LOG_WRITER_VERSION", 3)
        _, shared = _topic(local_store, partitions=2, interval=5)
        Workload(shared, [0, 1], seed=6).run(12)
    runner = CliRunner()

    def cli(*args: str) -> Any:
        result = runner.invoke(app, ["topics", "upgrade", "t", *args, "--store", local_store[0]])
        assert result.exit_code == 0, (result.stdout, result.stderr, result.exception)
        return result

    newest = f"reader version {TOPIC_LOG_VERSION}, writer version {TOPIC_LOG_WRITER_VERSION}"
    dry = cli("--dry-run")
    assert f"Topic log 0 (_log): would be raised to {newest}." in dry.stderr
    assert f"Metadata: would be raised to {newest}." in dry.stderr
    assert "would be raised; nothing was changed" in dry.stderr
    assert _files(shared).load().min_reader_version == 3
    done = cli()
    assert f"Topic log 0 (_log): raised to {newest}." in done.stderr
    assert f"its logs are now at {newest}" in done.stderr
    assert Store(*local_store)._topic_log("t").load().min_writer_version == (
        TOPIC_LOG_WRITER_VERSION
    )
    out = json.loads(cli("-o", "json").stdout)
    assert out["changed"] is False
    assert out["topic_logs"] == [{"index": 0, "raised": "already"}]
    assert f"in layout 3 already, at {newest}" in cli().stderr


@pytest.mark.s3
@pytest.mark.parametrize("versions", [(5, 6), (6, 7)])
def test_a_checkpoint_writes_its_sidecars_in_one_batch_and_none_when_one_fails(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch, versions: tuple[int, int]
) -> None:
    """The new sidecars of a checkpoint (a base or a delta per changed partition) are written
    at once, not one after another: at 6/7 as the members of one file (7.4), at 5/6 a file
    each; when one cannot be written the checkpoint is not published, the commit stands, and
    readers load from the previous checkpoint."""
    _at_versions(monkeypatch, *versions)
    _, shared = _topic(local_store, partitions=8, interval=5)
    batches: list[list[str]] = []
    real = Storage.put_new_many

    def put_new_many(self: Storage, files: dict[str, bytes], *, durable: bool = True) -> None:
        batches.append(sorted(files))
        real(self, files, durable=durable)

    monkeypatch.setattr(Storage, "put_new_many", put_new_many)
    workload = Workload(shared, list(range(8)), seed=5)
    assert workload.run(11) == 10  # versions 0-10: checkpoints 5 and 10
    assert len(batches) == 2
    for version, batch in zip((5, 10), batches, strict=True):
        written = {
            f"{_incarnation(shared)}/{body['path']}"
            for chain in _chains(shared, version).values()
            for body in chain
            if f"-{version:020d}-" in body["path"]  # new at this checkpoint
        }
        assert written == set(batch), version  # every new sidecar, in the one batch
    # The first: a base per partition, in one file at 6/7 (each its member), else 8 files.
    assert len(batches[0]) == (1 if versions == (6, 7) else 8)
    first = [body for chain in _chains(shared, 5).values() for body in chain]
    assert sorted(body["partition"] for body in first) == list(range(8))
    assert all(("range" in body) == (versions == (6, 7)) for body in first)

    def fail(self: Storage, files: dict[str, bytes], *, durable: bool = True) -> None:
        raise StorageError("injected: a sidecar could not be written")

    monkeypatch.setattr(Storage, "put_new_many", fail)
    newest = workload.run(5)  # version 15 commits; its checkpoint fails
    assert newest == 15
    storage = shared.log.storage
    assert not storage.exists(f"{shared.directory}/{checkpoint_file(15)}")
    monkeypatch.undo()
    fresh = Store(*local_store)
    loaded = fresh.topic_log("t", fresh.topic("t"), 0).log.load()
    _same(loaded, _replayed(shared, newest))


def test_chains_on_an_object_store(seaweed_store: StoreURL) -> None:
    """The same through S3 (SeaweedFS): sidecars are written with put-if-absent and a chain's
    members read in one concurrent batch."""
    _, shared = _topic(seaweed_store, partitions=2, interval=5)
    _bulk(shared, 0, 100)
    newest = Workload(shared, [0, 1], seed=12).run(60)
    assert any(len(c) >= 3 for c in _chains(shared, 60).values())
    fresh = Store(*seaweed_store)
    _same(fresh.topic_log("t", fresh.topic("t"), 0).log.load(), _replayed(shared, newest))


# -- the sidecar horizon (writer version 5) ---------------------------------------------------------


def test_no_checkpoint_names_a_sidecar_older_than_the_horizon(
    local_store: StoreURL, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle partition's chain is reused by reference, and a busy one's extended, only while
    each sidecar was written at most SIDECAR_HORIZON versions before the checkpoint naming it
    (13.4): past that the partition gets a new base. Vacuum relies on it (22.5)."""
    monkeypatch.setattr("kstore.topic_log.SIDECAR_HORIZON", 12)
    _store, shared = _topic(local_store, partitions=3, interval=2)
    work = Workload(shared, [0, 1, 2], seed=9)
    work.run(6)  # every partition gets state
    busy = Workload(shared, [0], seed=10)
    newest = busy.run(40)  # partitions 1 and 2 stay as they were
    rebased: set[int] = set()
    for version in range(2, newest + 1, 2):
        for partition, chain in _chains(shared, version).items():
            for body in chain:
                parsed = sidecar_name(body["path"].removeprefix(f"{SIDECARS}/"))
                assert parsed is not None
                # A shared file (6/7) is named by the lowest partition of its members.
                assert parsed[0] == partition if "range" not in body else parsed[0] <= partition
                assert parsed[1] >= version - 12, (version, body)
            if partition and chain[0]["version"] > 6:
                rebased.add(partition)
    assert rebased == {1, 2}  # the idle partitions got new bases, with nothing new in them
    _same(_files(shared).load(), _replayed(shared, newest))
    # New topic logs are past writer version 5, which the horizon came with.
    assert shared.state().min_writer_version == TOPIC_LOG_WRITER_VERSION > HORIZON_VERSION


def test_a_delta_cuts_its_lines_from_the_commit_lines_it_was_given() -> None:
    """An action applied with its commit line (Log.commit's apply_encoded) goes into a delta as
    that line without its trailing partition, not encoded again; one whose line does not end
    with its partition, or that came without a line (another writer's commit, read), is
    encoded from its body. Either way the delta line is the body without ``partition``."""
    state = TopicLogState()
    state.keeps_pending = True
    body = {"offset": 7, "partition": 2}
    state.apply_encoded("endOffset", body, compact_json({"endOffset": body}))
    # A line that differs from its body shows which of the two the delta was made from.
    marked = {"offset": 8, "partition": 2}
    state.apply_encoded("endOffset", marked, '{"endOffset":{"offset":8,"seen":1,"partition":2}}')
    first = {"partition": 2, "offset": 9}  # partition not last: its line cannot be cut
    state.apply_encoded("endOffset", first, '{"endOffset":{"partition":2,"offset":99}}')
    state.apply("endOffset", {"offset": 10, "partition": 2})
    state.stamp(0)
    assert state.pending_lines(2, -1) == [
        '{"endOffset":{"offset":7}}',
        '{"endOffset":{"offset":8,"seen":1}}',
        '{"endOffset":{"offset":9}}',
        '{"endOffset":{"offset":10}}',
    ]


def test_a_base_holds_the_lines_of_its_actions_as_they_are_now() -> None:
    """A base sidecar's lines (PartitionState.checkpoint_lines, whose segment lines are kept
    once made) are the compact encoding of checkpoint_actions, also once a segment's
    transaction ends: its line loses the transaction, as its action does."""
    state = PartitionState()
    for n, transaction in enumerate((None, "p:1", None)):
        body = {
            "path": f"segments/{n:020d}.arrow",
            "baseOffset": n,
            "lastOffset": n,
            "records": 1,
            "minTimestamp": 1,
            "maxTimestamp": 1,
            "size": 10,
            "checksum": "crc32c:00000000",
            "format": "arrow",
        }
        state.apply("add", body if transaction is None else {**body, "transaction": transaction})

    def expected() -> list[str]:
        return [compact_json(a) for a in state.checkpoint_actions() if "protocol" not in a]

    assert state.checkpoint_lines() == expected()
    assert any('"transaction":"p:1"' in line for line in state.checkpoint_lines())
    state.apply("txnMarker", {"producerId": "p", "epoch": 0, "version": 1, "commit": True})
    assert state.checkpoint_lines() == expected()
    assert not any('"transaction"' in line for line in state.checkpoint_lines())
    assert state.checkpoint_lines() == expected()  # kept lines, asked again
