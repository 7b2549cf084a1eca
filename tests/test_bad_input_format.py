"""Malformed, truncated and future-version files (invariant 8), beyond tests/test_bad_input.py:
the `_last_checkpoint` hint, checkpoints, group logs, producer logs, truncated Arrow and
Parquet segments, logs whose early versions are gone, and names that are not part of a store.

A corrupt file is reported with its path, and nothing is written or "repaired" (the store is
compared byte for byte); a hint that cannot be used is ignored, never trusted.
"""

from __future__ import annotations

import gzip
import json
import re
from typing import Any

import pyarrow as pa
import pytest

from kstore import Consumer, Producer, Store
from kstore.errors import CorruptLogError, CorruptRecordError, UnsupportedFormatVersionError
from kstore.groups import Group, describe_group, list_groups
from kstore.layout import group_log_dir, producer_log_dir, topic_log_dir
from kstore.log import (
    LAST_CHECKPOINT,
    checkpoint_file,
    decode_commit,
    encode_commit,
    version_file,
)
from kstore.manifest import segment_location
from kstore.records import OffsetAndMetadata, TopicPartition
from tests import layout2
from tests.badinput import open_store, quick_store, refused, snapshot
from tests.conftest import StoreTarget

__all__ = ["quick_store"]  # the fixture, imported for pytest

FUTURE_READER = {"protocol": {"minReaderVersion": 99, "minWriterVersion": 99}}
FUTURE_WRITER = {"protocol": {"minReaderVersion": 1, "minWriterVersion": 99}}
INFO = {"timestamp": 1, "operation": "UPGRADE", "commitId": "f" * 32}


def values(store: Store, topic: str = "t") -> list[bytes]:
    part = store.partition(topic, 0)
    batches = list(part.read(part.state().start_offset))
    return [] if not batches else pa.Table.from_batches(batches).column("value").to_pylist()


def topic_with(store: Store, layout: int, config: dict[str, Any], values: list[bytes]) -> None:
    """Topic "t", one partition, one commit per value by an idempotent producer; layout 2
    as an older version wrote it (tests/layout2.py: this version writes layout 3 only)."""
    if layout == 2:
        layout2.create_topic(store, "t", 1, config)
        producer = layout2.Idempotent(store)
        for value in values:
            producer.send("t", 0, layout2.records([value]))
        return
    store.create_topic("t", 1, config)
    with Producer(store, linger_ms=0) as p:
        for value in values:
            p.send("t", value).get(10)


def checkpointed_topic(
    target: StoreTarget, layout: int = 3, config: dict[str, Any] | None = None
) -> tuple[Store, str]:
    """Topic "t" with a checkpoint every 2 commits and 5 commits: checkpoints at 2 and 4."""
    store = open_store(target)
    topic_with(
        store, layout, {"checkpoint.interval": 2, **(config or {})}, [b"v%d" % i for i in range(5)]
    )
    log_dir = store.partition("t", 0).log.directory
    assert store.storage.read(f"{log_dir}/{LAST_CHECKPOINT}") == b'{"version": 4}'
    return store, log_dir


EXPECTED = [b"v%d" % i for i in range(5)]

# --- the _last_checkpoint hint ------------------------------------------------------------------

BAD_HINTS = {
    "not-json": b"version 4",
    "truncated": b'{"versi',
    "empty": b"",
    "list": b"[4]",
    "string-version": b'{"version": "4"}',
    "bool-version": b'{"version": true}',
    "negative": b'{"version": -1}',
    "float": b'{"version": 4.0}',
    "missing-checkpoint": b'{"version": 3}',
    "beyond-the-log": b'{"version": 999999}',
    "not-utf8": b'\xff{"version": 4}',
    "nul": b'{"version": 4}\x00',
    "unknown-fields": b'{"version": 2, "size": 17, "future": {"x": 1}}',
}


@pytest.mark.parametrize("hint", list(BAD_HINTS.values()), ids=list(BAD_HINTS))
def test_an_unusable_last_checkpoint_hint_is_ignored(quick_store: StoreTarget, hint: bytes) -> None:
    store, log_dir = checkpointed_topic(quick_store)
    store.storage.put(f"{log_dir}/{LAST_CHECKPOINT}", hint)
    before = snapshot(store.storage)
    fresh = open_store(quick_store)
    assert fresh.partition("t", 0).state().version == 4
    assert values(fresh) == EXPECTED
    assert snapshot(store.storage) == before


def test_a_hint_to_a_corrupt_checkpoint_is_a_corrupt_log(quick_store: StoreTarget) -> None:
    store, log_dir = checkpointed_topic(quick_store)
    path = f"{log_dir}/{checkpoint_file(4)}"
    good = store.storage.read(path)
    store.storage.put(path, good[: len(good) // 2])
    refused(
        store.storage,
        lambda: open_store(quick_store).partition("t", 0).state(),
        CorruptLogError,
        checkpoint_file(4),
        "truncated",
    )


@pytest.mark.parametrize(
    ("header", "fragment"),
    [
        ({"checkpointVersion": 2}, "checkpoint header names version 2"),
        ({"checkpointVersion": "4"}, "checkpoint header names version '4'"),
        ({}, "checkpoint header names version None"),
    ],
    ids=["other-version", "string", "missing"],
)
def test_a_checkpoint_whose_header_disagrees_is_a_corrupt_log(
    quick_store: StoreTarget, header: dict[str, Any], fragment: str
) -> None:
    store, log_dir = checkpointed_topic(quick_store)
    state = store.partition("t", 0).state()
    store.storage.put(
        f"{log_dir}/{checkpoint_file(4)}", encode_commit(state.checkpoint_actions(), header)
    )
    refused(
        store.storage,
        lambda: open_store(quick_store).partition("t", 0).state(),
        CorruptLogError,
        checkpoint_file(4),
        fragment,
    )


@pytest.mark.parametrize("layout", [2, 3])
def test_a_boolean_checkpoint_version_is_not_version_1(
    quick_store: StoreTarget, layout: int
) -> None:
    """Regression: True == 1 in Python, so a header `"checkpointVersion": true` passed for
    checkpoint 1 (and `"actions": true` for a commit of one action). Layout 3: the checkpoint
    of the topic log, with its sidecar; the commit is rewritten as text, so its flush's data
    goes to a data object rather than being carried by it (PROTOCOL.md 11.8)."""
    store = open_store(quick_store)
    topic_with(store, layout, {"commit.inline.bytes": 0}, [b"v0", b"v1"])
    part = store.partition("t", 0)
    checkpoint = f"{part.log.directory}/{checkpoint_file(1)}"
    part.log.write_checkpoint(part.log.load_version(1))  # a checkpoint as writers write it
    _, actions = decode_commit(store.storage.read(checkpoint), checkpoint)
    assert [name for name, _ in actions][1:] == (
        ["sidecar"] if layout == 3 else ["endOffset", "logStart", "add", "add", "producer"]
    )
    store.storage.put(
        checkpoint,
        encode_commit([{n: b} for n, b in actions], {"checkpointVersion": True}),
    )
    refused(
        store.storage,
        lambda: open_store(quick_store).partition("t", 0).state(),
        CorruptLogError,
        "checkpoint header names version True",
    )
    store.storage.delete([f"{part.log.directory}/{checkpoint_file(1)}"])
    path = f"{part.log.directory}/{version_file(1)}"
    lines = store.storage.read(path).split(b"\n")
    info = json.loads(lines[0])
    info["commitInfo"]["actions"] = True
    lines = [json.dumps(info).encode(), lines[1], b""]  # one action, announced as `true`
    store.storage.put(path, b"\n".join(lines))
    refused(
        store.storage,
        lambda: open_store(quick_store).partition("t", 0).state(),
        CorruptLogError,
        "commitInfo announces True actions",
    )


@pytest.mark.parametrize("layout", [2, 3])
def test_a_checkpoint_requiring_a_newer_reader_is_refused(
    quick_store: StoreTarget, layout: int
) -> None:
    """Layout 3: the checkpoint of the topic log, its sidecar intact."""
    store, log_dir = checkpointed_topic(quick_store, layout)
    path = f"{log_dir}/{checkpoint_file(4)}"
    _, actions = decode_commit(store.storage.read(path), path)
    assert actions[0][0] == "protocol"
    future = [FUTURE_READER, *({n: b} for n, b in actions[1:])]
    store.storage.put(path, encode_commit(future, {"checkpointVersion": 4}))
    refused(
        store.storage,
        lambda: open_store(quick_store).partition("t", 0).state(),
        UnsupportedFormatVersionError,
        checkpoint_file(4),
        "reader version 99",
    )


def _with_future_fields(action: dict[str, Any]) -> dict[str, Any]:
    ((name, body),) = action.items()
    return {name: {**body, "zzFuture": [1, {"a": None}]}}


FUTURE_ACTION = {"futureAction": {"anything": True}}


def _future_sidecar(storage: Any, path: str) -> tuple[int, int]:
    """Rewrites a sidecar with an unknown field on its header and on every action, and an
    unknown action; returns its new action count and size (for the checkpoint naming it).
    A compressed sidecar (``.json.gz``, version 4) is rewritten compressed."""
    data = storage.read(path)
    compressed = path.endswith(".gz")
    lines = (gzip.decompress(data) if compressed else data).splitlines()
    ((kind, header),) = json.loads(lines[0]).items()
    actions = [_with_future_fields(json.loads(line)) for line in lines[1:]] + [FUTURE_ACTION]
    head = {kind: {**header, "actions": len(actions), "zzFuture": 1}}
    payload = "".join(json.dumps(a) + "\n" for a in [head, *actions]).encode()
    if compressed:
        payload = gzip.compress(payload)
    storage.put(path, payload)
    return len(actions), len(payload)


@pytest.mark.parametrize("layout", [2, 3])
def test_unknown_fields_and_actions_are_ignored(quick_store: StoreTarget, layout: int) -> None:
    """Layout 2: the partition log's checkpoint; layout 3: the topic log's checkpoint and the
    partition's sidecar. The commits the checkpoint covers are deleted, so their flushes' data
    is in data objects, not carried by the commits (PROTOCOL.md 11.8)."""
    store, log_dir = checkpointed_topic(quick_store, layout, {"commit.inline.bytes": 0})
    path = f"{log_dir}/{checkpoint_file(4)}"
    _, top = decode_commit(store.storage.read(path), path)
    actions = []
    for name, body in top:
        if name == "sidecar":
            incarnation = log_dir.rsplit("/", 1)[0]
            count, size = _future_sidecar(store.storage, f"{incarnation}/{body['path']}")
            body = {**body, "actions": count, "size": size}
        actions.append(_with_future_fields({name: body}))
    if layout == 3:  # the partition's chain (13.4): a base and a delta since checkpoint 2
        assert [name for name, _ in top] == ["protocol", "sidecar", "sidecar"]
    actions.append(FUTURE_ACTION)
    store.storage.put(path, encode_commit(actions, {"checkpointVersion": 4, "futureInfo": 1}))
    store.storage.put(f"{log_dir}/{LAST_CHECKPOINT}", b'{"version": 4, "zzFuture": 1}')
    # The checkpoint is the only way to the state: the commits it covers are gone.
    store.storage.delete([f"{log_dir}/{version_file(v)}" for v in range(5)])
    fresh = open_store(quick_store)
    assert fresh.partition("t", 0).state().version == 4
    assert values(fresh) == EXPECTED
    if layout == 2:  # an older version's writer carries on
        assert layout2.append(fresh, "t", 0, layout2.records([b"v5"])).base_offset == 5
    else:  # a current writer carries on
        with Producer(fresh, linger_ms=0) as p:
            assert p.send("t", b"v5").get(10).offset == 5
    assert values(open_store(quick_store)) == [*EXPECTED, b"v5"]


def test_a_log_whose_early_versions_are_gone_is_a_corrupt_log(quick_store: StoreTarget) -> None:
    store, log_dir = checkpointed_topic(quick_store)
    store.storage.delete(
        [
            f"{log_dir}/{name}"
            for name in (
                version_file(0),
                version_file(1),
                checkpoint_file(2),
                checkpoint_file(4),
                LAST_CHECKPOINT,
            )
        ]
    )
    refused(
        store.storage,
        lambda: open_store(quick_store).partition("t", 0).state(),
        CorruptLogError,
        "versions before 2 are gone",
    )
    refused(
        store.storage,
        lambda: open_store(quick_store).partition("t", 0).log.load_version(1),
        CorruptLogError,
        "version 1 is not available",
    )


# --- segments ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", [2, 3])
@pytest.mark.parametrize("how", ["truncated", "empty", "header-only", "other-segment"])
def test_truncated_and_swapped_arrow_segments_are_corrupt_records(
    quick_store: StoreTarget, how: str, layout: int
) -> None:
    """Layout 2: segment files; layout 3: the data objects the segments are ranges of (not
    data the commits carry, PROTOCOL.md 11.8)."""
    store = open_store(quick_store)
    topic_with(store, layout, {"commit.inline.bytes": 0}, [b"value-%d" % i for i in range(3)])
    part = store.partition("t", 0)
    segs = part.state().segments
    assert [s.byte_range is not None for s in segs] == [layout == 3] * 3
    path = segment_location(part.directory, segs[1].path)
    data = store.storage.read(path)
    bad = {
        "truncated": data[: len(data) - 7],
        "empty": b"",
        "header-only": data[:8],
        "other-segment": store.storage.read(segment_location(part.directory, segs[0].path)),
    }[how]
    assert bad != data
    store.storage.put(path, bad)
    before = snapshot(store.storage)
    fresh = open_store(quick_store)
    with pytest.raises(CorruptRecordError, match=re.escape(segs[1].path)):
        list(fresh.partition("t", 0).read(0))
    consumer = Consumer(store=fresh, auto_offset_reset="earliest")
    consumer.assign([TopicPartition("t", 0)])
    consumer.seek(TopicPartition("t", 0), 1)
    with pytest.raises(CorruptRecordError, match=re.escape(segs[1].path)):
        consumer.poll(timeout_ms=1000)
    consumer.close()
    assert snapshot(store.storage) == before
    intact = next(open_store(quick_store).partition("t", 0).read(0, max_records=1))
    assert intact.column("value").to_pylist() == [b"value-0"]  # what is intact stays readable


@pytest.mark.parametrize("how", ["cut-in-the-second-range", "ranges-swapped"])
def test_a_damaged_data_object_refuses_the_ranges_it_damages_only(
    quick_store: StoreTarget, how: str
) -> None:
    """Layout 3: one data object holds the ranges of two partitions. Each range is verified on
    its own bytes: a damaged range is refused naming the object, an intact one stays readable,
    for a partition's reader and for a consumer (which fetches the ranges of an object
    together)."""
    store = open_store(quick_store)
    store.create_topic("t", 2)
    with Producer(store, linger_ms=60_000) as p:  # one flush: one object, both partitions
        for i in range(4):
            p.send("t", b"value-%d" % i, partition=i % 2)
        p.flush()
    segs = {n: store.partition("t", n).state().segments for n in (0, 1)}
    assert [len(s) for s in segs.values()] == [1, 1]
    (first, second) = sorted((s[0] for s in segs.values()), key=lambda s: s.byte_range or (0, 0))
    assert first.path == second.path  # one object
    assert first.byte_range is not None
    assert second.byte_range is not None
    object_path = segment_location(store.partition("t", 0).directory, first.path)
    data = store.storage.read(object_path)
    (a_start, a_len), (b_start, b_len) = first.byte_range, second.byte_range
    assert (a_start, a_start + a_len, b_start + b_len) == (0, b_start, len(data))
    if how == "cut-in-the-second-range":
        bad, damaged = data[: b_start + b_len // 2], [second]
    else:
        bad, damaged = data[b_start:] + data[:b_start], [first, second]
    store.storage.put(object_path, bad)
    before = snapshot(store.storage)
    for partition, (seg,) in segs.items():
        fresh = open_store(quick_store)
        tp = TopicPartition("t", partition)
        expected = [b"value-%d" % i for i in (partition, partition + 2)]
        consumer = Consumer(store=fresh, auto_offset_reset="earliest")
        consumer.assign([tp])
        if seg in damaged:
            with pytest.raises(CorruptRecordError, match=re.escape(seg.path)):
                list(fresh.partition("t", partition).read(0))
            with pytest.raises(CorruptRecordError, match=re.escape(seg.path)):
                consumer.poll(timeout_ms=1000)
        else:
            got = pa.Table.from_batches(list(fresh.partition("t", partition).read(0)))
            assert got.column("value").to_pylist() == expected
            polled = consumer.poll(timeout_ms=1000)
            assert [r.value for r in polled[tp]] == expected
        consumer.close()
    assert snapshot(store.storage) == before


# --- group logs --------------------------------------------------------------------------------


def _group_with_offsets(target: StoreTarget) -> Store:
    store = open_store(target)
    store.create_topic("t", 1)
    group = Group(store, "g")
    for offset in (1, 2):
        group.commit_offsets(
            {TopicPartition("t", 0): OffsetAndMetadata(offset)}, member_id=None, generation=-1
        )
    return store


GROUP_MALFORMATIONS = {
    "truncated": lambda good: good[: len(good) // 2],
    "no-final-newline": lambda good: good[:-1],
    "not-json": lambda good: b"not json\n",
    "offset-not-int": lambda good: good.replace(b'"offset":2', b'"offset":"two"'),
    "offsets-not-list": lambda good: re.sub(rb'"offsets":\[.*\]', b'"offsets":5', good),
    "join-without-member": lambda good: encode_commit([{"join": {"topics": ["t"]}}], INFO),
    "assignment-bad-members": lambda good: encode_commit(
        [{"assignment": {"generation": 1, "members": [1, 2]}}], INFO
    ),
}


@pytest.mark.parametrize("make", list(GROUP_MALFORMATIONS.values()), ids=list(GROUP_MALFORMATIONS))
def test_a_malformed_group_log_is_a_corrupt_log(quick_store: StoreTarget, make: Any) -> None:
    store = _group_with_offsets(quick_store)
    path = f"{group_log_dir('g')}/{version_file(1)}"
    store.storage.put(path, make(store.storage.read(path)))
    where = f"groups/g/_log/{version_file(1)}"
    s = store.storage
    refused(s, lambda: Group(open_store(quick_store), "g").state(), CorruptLogError, where)
    refused(s, lambda: describe_group(open_store(quick_store), "g"), CorruptLogError, where)
    refused(
        s,
        lambda: Consumer("t", store=open_store(quick_store), group_id="g"),
        CorruptLogError,
        where,
    )
    # Listed, not an error for the whole store: describing it names the damage (above).
    assert list_groups(open_store(quick_store)) == ["g"]


def test_a_group_log_from_the_future_is_refused(quick_store: StoreTarget) -> None:
    """Regression (also for the malformed group logs above): a consumer joining a group whose
    log it could not read or write left its lease file behind."""
    store = _group_with_offsets(quick_store)
    store.storage.put_if_absent(
        f"{group_log_dir('g')}/{version_file(2)}", encode_commit([FUTURE_READER], INFO)
    )
    refused(
        store.storage,
        lambda: describe_group(open_store(quick_store), "g"),
        UnsupportedFormatVersionError,
        "reader version 99",
    )
    store.storage.put(
        f"{group_log_dir('g')}/{version_file(2)}", encode_commit([FUTURE_WRITER], INFO)
    )
    assert describe_group(open_store(quick_store), "g").partitions[0].current_offset == 2
    refused(
        store.storage,
        lambda: Group(open_store(quick_store), "g").commit_offsets(
            {TopicPartition("t", 0): OffsetAndMetadata(3)}, member_id=None, generation=-1
        ),
        UnsupportedFormatVersionError,
        "writer version 99",
    )
    refused(
        store.storage,
        lambda: Consumer("t", store=open_store(quick_store), group_id="g"),
        UnsupportedFormatVersionError,
        "writer version 99",
    )


# --- producer logs -----------------------------------------------------------------------------


def _producer_log(target: StoreTarget) -> Store:
    store = open_store(target)
    store.create_topic("t", 1)
    with Producer(store, transactional_id="app") as p:
        p.begin_transaction()
        p.send("t", b"x")
        p.commit_transaction()
    return store


PRODUCER_MALFORMATIONS = {
    "truncated": lambda good: good[: len(good) // 2],
    "not-utf8": lambda good: b"\xff" + good,
    "epoch-not-int": lambda good: encode_commit(
        [{"producerEpoch": {"epoch": "one", "producerId": "p", "transactionalId": "app"}}], INFO
    ),
    "partitions-not-pairs": lambda good: encode_commit(
        [{"txnPartitions": {"version": 0, "epoch": 0, "partitions": [["t"]]}}], INFO
    ),
}


@pytest.mark.parametrize(
    "make", list(PRODUCER_MALFORMATIONS.values()), ids=list(PRODUCER_MALFORMATIONS)
)
def test_a_malformed_producer_log_is_a_corrupt_log(quick_store: StoreTarget, make: Any) -> None:
    store = _producer_log(quick_store)
    path = f"{producer_log_dir('app')}/{version_file(1)}"
    store.storage.put(path, make(store.storage.read(path)))
    refused(
        store.storage,
        lambda: Producer(open_store(quick_store), transactional_id="app"),
        CorruptLogError,
        f"{producer_log_dir('app')}/{version_file(1)}",
    )


@pytest.mark.parametrize(
    ("protocol", "fragment"),
    [(FUTURE_READER, "reader version 99"), (FUTURE_WRITER, "writer version 99")],
    ids=["reader", "writer"],
)
def test_a_producer_log_from_the_future_is_refused(
    quick_store: StoreTarget, protocol: dict[str, Any], fragment: str
) -> None:
    store = _producer_log(quick_store)
    n = 0
    while store.storage.exists(f"{producer_log_dir('app')}/{version_file(n)}"):
        n += 1
    store.storage.put_if_absent(
        f"{producer_log_dir('app')}/{version_file(n)}", encode_commit([protocol], INFO)
    )
    refused(
        store.storage,
        lambda: Producer(open_store(quick_store), transactional_id="app"),
        UnsupportedFormatVersionError,
        fragment,
    )


# --- topic logs --------------------------------------------------------------------------------


def test_a_topic_log_requiring_a_newer_writer_is_read_but_not_altered(
    quick_store: StoreTarget,
) -> None:
    store = open_store(quick_store)
    store.create_topic("t", 1)
    store.storage.put_if_absent(
        f"{topic_log_dir('t')}/{version_file(1)}", encode_commit([FUTURE_WRITER], INFO)
    )
    fresh = open_store(quick_store)
    assert fresh.topic("t").partitions == 1
    s = store.storage
    for call in (
        lambda: fresh.alter_topic_config("t", set={"retention.ms": 5}),
        lambda: fresh.add_partitions("t", 2),
        lambda: fresh.delete_topic("t"),
    ):
        refused(s, call, UnsupportedFormatVersionError, "writer version 99")


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"name": "t", "id": "../../x", "partitions": 1, "config": {}, "createdTime": 0}, "32 hex"),
        ({"name": "t", "id": "A" * 32, "partitions": 1, "config": {}, "createdTime": 0}, "32 hex"),
        ({"name": "t", "id": "a" * 32, "partitions": 0, "config": {}, "createdTime": 0}, "range"),
        ({"name": "t", "id": "a" * 32, "partitions": True, "config": {}, "createdTime": 0}, "int"),
        ({"name": "t", "id": "a" * 32, "partitions": 1, "config": [], "createdTime": 0}, "dict"),
    ],
    ids=["traversal-id", "upper-hex-id", "zero-partitions", "bool-partitions", "config-list"],
)
def test_a_malformed_topic_metadata_is_a_corrupt_log(
    quick_store: StoreTarget, body: dict[str, Any], fragment: str
) -> None:
    store = open_store(quick_store)
    store.create_topic("t", 1)
    store.storage.put_if_absent(
        f"{topic_log_dir('t')}/{version_file(1)}", encode_commit([{"metaData": body}], INFO)
    )
    refused(
        store.storage,
        lambda: open_store(quick_store).topic("t"),
        CorruptLogError,
        f"topics/t/_log/{version_file(1)}",
        fragment,
    )


# --- names that are not part of a store --------------------------------------------------------


def test_entries_with_illegal_names_are_ignored(quick_store: StoreTarget) -> None:
    store = _group_with_offsets(quick_store)
    for junk in (
        "topics/bad name/_log/00000000000000000000.json",
        "topics/caf\u00e9/_log/00000000000000000000.json",
        "groups/a b/_log/00000000000000000000.json",
        "producers/not-a-hash/_log/00000000000000000000.json",
        "junk-at-root.txt",
        f"{topic_log_dir('t')}/0000.json",
        f"{topic_log_dir('t')}/{version_file(9)}.tmp",
        f"{group_log_dir('g')}/notes.txt",
    ):
        store.storage.put(junk, b"{}")
    before = snapshot(store.storage)
    fresh = open_store(quick_store)
    assert fresh.list_topics() == ["t"]
    assert list_groups(fresh) == ["g"]
    assert describe_group(fresh, "g").partitions[0].current_offset == 2
    assert snapshot(store.storage) == before
