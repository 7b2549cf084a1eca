"""A reader never sees a half-written commit or segment (invariant 3), whatever happens to the
writer: (a) it dies after writing a segment but before committing it; (b) it is killed with
SIGKILL while committing in a loop; (c) a commit file on disk is truncated or malformed."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from typing import Any

import pyarrow as pa
import pytest

from kstore import PartitionState, Store
from kstore.errors import CorruptLogError
from kstore.log import encode_commit, parse_log_file_name, version_file
from kstore.partition import Partition
from kstore.segments import TIMESTAMP_TYPE, decode_segment, read_segment_data
from tests.conftest import StoreTarget
from tests.test_races import TOPIC, Ack, parse_acks, start_writer_processes, verify_log


def records(values: list[bytes]) -> pa.Table:
    return pa.table(
        {
            "value": pa.array(values, pa.binary()),
            "timestamp": pa.array(
                [1_700_000_000_000_000 + i for i in range(len(values))], TIMESTAMP_TYPE
            ),
        }
    )


def summary(state: PartitionState) -> tuple[Any, ...]:
    return (
        state.version,
        tuple(state.segments),
        state.end_offset,
        state.log_start_offset,
        dict(state.producers),
        dict(state.txns),
    )


def values_of(part: Partition) -> list[bytes]:
    batches = list(part.read(0))
    return [] if not batches else pa.Table.from_batches(batches).column("value").to_pylist()


def log_listing(store: Store, part: Partition) -> dict[str, bytes]:
    directory = part.log.directory
    return {
        i.name: store.storage.read(f"{directory}/{i.name}")
        for i in store.storage.list_dir(directory)
    }


# --- (a) a segment written but never committed -------------------------------------------------


def test_an_uncommitted_segment_is_invisible(any_store: StoreTarget) -> None:
    store = Store(any_store.url, any_store.storage_options)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    part.append(records([b"a", b"b"]))
    before = summary(part.state())
    log_before = log_listing(store, part)

    # Phase one of an append, then the writer "crashes": phase two never happens.
    orphan = part.write_segment(records([b"never", b"committed"]), compression="zstd")
    assert store.storage.exists(f"{part.directory}/{orphan.path}")

    for reader in (part, Store(any_store.url, any_store.storage_options).partition("t", 0)):
        state = reader.state()
        assert summary(state) == before
        assert orphan.path not in {s.path for s in state.segments}
        assert values_of(reader) == [b"a", b"b"]
        assert reader.offset_for_timestamp(0) == 0
    assert log_listing(store, part) == log_before
    # The next append takes the next offsets; the orphan never shows up.
    result = (
        Store(any_store.url, any_store.storage_options).partition("t", 0).append(records([b"c"]))
    )
    assert (result.base_offset, result.version) == (2, 1)
    assert values_of(Store(any_store.url, any_store.storage_options).partition("t", 0)) == [
        b"a",
        b"b",
        b"c",
    ]


# --- (b) SIGKILL during commits ----------------------------------------------------------------


def kill_writers_mid_flight(
    target: StoreTarget, writers: int, run_s: float
) -> dict[int, list[Ack]]:
    """Start writer processes committing in a loop, SIGKILL them ``run_s`` seconds after each
    has had a first append acknowledged, and return what each had been told was committed."""
    procs = start_writer_processes(target, writers, seconds=600.0)
    # Wait for a first acknowledgement from every writer, however loaded the machine (a first
    # append may take longer than run_s): the kill must land while they are committing.
    first: list[str] = []
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("["), f"writer stopped before its first append: {line!r}"
        first.append(line)
    time.sleep(run_s)
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
    acks: dict[int, list[Ack]] = {}
    for writer, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        assert "done" not in out  # it really died mid-loop
        acks[writer] = parse_acks(first[writer] + out)
    return acks


@pytest.mark.parametrize("backend", ["local", pytest.param("seaweed", marks=pytest.mark.s3)])
def test_a_writer_killed_mid_commit_leaves_a_clean_log(
    request: pytest.FixtureRequest, backend: str
) -> None:
    """The topic log, with its checkpoints' sidecars."""
    fixture = "seaweed_bucket_url" if backend == "seaweed" else "local_store_url"
    url, options = request.getfixturevalue(fixture)
    target = StoreTarget(backend, url, options)
    store = Store(url, options)
    store.create_topic(TOPIC, 1, {"checkpoint.interval": 7})

    acks = kill_writers_mid_flight(target, writers=2, run_s=1.0)
    assert sum(len(a) for a in acks.values()) > 0, "the writers never committed anything"

    # The log replays cleanly; offsets are dense; every acknowledged append is there. A commit
    # that landed just before the kill but was never acknowledged may be there too, whole.
    verify_log(target, acks, exact=False)
    fresh = Store(url, options, create=False).partition(TOPIC, 0)
    state = fresh.state()

    # Every committed segment is there and its checksum verifies.
    for seg in state.segments:
        data = read_segment_data(fresh.storage, fresh.directory, seg, seg.path)
        table = decode_segment(
            data,
            where=seg.path,
            expected_checksum=seg.checksum,
            fmt=seg.format,
            sparse=seg.sparse,
            base_offset=seg.base_offset,
            record_count=seg.record_count,
        )
        assert table.num_rows == seg.record_count

    # Log versions are 0..V with no hole; leftovers of the kill (".tmp-*" files on the local
    # disk) are never taken for versions.
    names = [i.name for i in fresh.storage.list_dir(fresh.log.directory)]
    versions = sorted(p[0] for n in names if (p := parse_log_file_name(n)) is not None and not p[1])
    assert versions == list(range(state.version + 1))
    assert all(parse_log_file_name(n) is None for n in names if n.startswith(".tmp-"))

    # The log is not wedged: a new writer carries on at the end.
    result = fresh.append(records([b"after the crash"]))
    assert result.base_offset == state.end_offset
    assert result.version == state.version + 1
    assert (
        values_of(Store(url, options, create=False).partition(TOPIC, 0))[-1] == b"after the crash"
    )


def test_a_leftover_temporary_file_is_never_a_log_version(
    local_store_url: tuple[str, dict[str, Any]],
) -> None:
    url, options = local_store_url
    store = Store(url, options)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    part.append(records([b"a"]))
    log_dir = store.storage.full_path(part.log.directory)
    seg_dir = store.storage.full_path(f"{part.directory}/segments")
    # What a writer killed between writing its temporary file and linking it leaves behind:
    # a complete-looking next commit and a half-written one, under temporary names.
    whole = encode_commit(
        [{"add": {"path": "segments/ghost.arrow"}}], {"timestamp": 1, "commitId": "x"}
    )
    for directory, name, data in (
        (log_dir, ".tmp-0123456789abcdef0123456789abcdef", whole),
        (log_dir, ".tmp-fedcba9876543210fedcba9876543210", whole[:20]),
        (seg_dir, ".tmp-00000000000000000000000000000000", b"ARROW1\x00\x00half"),
    ):
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)
    fresh = Store(url, options).partition("t", 0)
    assert fresh.state().version == 0
    assert values_of(fresh) == [b"a"]
    assert fresh.append(records([b"b"])).version == 1
    assert values_of(Store(url, options).partition("t", 0)) == [b"a", b"b"]


# --- (c) a truncated or malformed commit file --------------------------------------------------


def _bad_commits(good: bytes) -> dict[str, bytes]:
    lines = good.split(b"\n")
    return {
        "truncated-mid-line": good[: len(good) * 2 // 3],
        "truncated-at-line-end": b"\n".join(lines[:-2]) + b"\n",
        "garbage": b"\x00\x01binary garbage\xff\n",
        "empty": b"",
        "json-but-not-a-commit": json.dumps({"hello": "world"}).encode() + b"\n",
    }


def test_a_truncated_or_malformed_commit_is_named_and_changes_nothing(
    local_store_url: tuple[str, dict[str, Any]],
) -> None:
    url, options = local_store_url
    store = Store(url, options)
    store.create_topic("t", 1)
    writer = store.partition("t", 0)
    writer.append(records([b"a", b"b"]))
    writer.append(records([b"c"]))
    assert writer.state().version == 1
    # What the next commit would look like, to damage it.
    template = writer.log.read_commit(1)
    assert template is not None
    good = store.storage.read(f"{writer.log.directory}/{version_file(1)}")
    next_path = os.path.join(store.storage.full_path(writer.log.directory), version_file(2))
    for label, bad in _bad_commits(good).items():
        with open(next_path, "wb") as f:  # written by hand at the next version
            f.write(bad)
        before = log_listing(store, writer)
        for reader in (writer, Store(url, options).partition("t", 0)):
            with pytest.raises(CorruptLogError, match=re.escape(version_file(2))):
                reader.state()
            with pytest.raises(CorruptLogError, match=re.escape(version_file(2))):
                list(reader.read(0))
            with pytest.raises(CorruptLogError, match=re.escape(version_file(2))):
                reader.append(records([b"refused"]))
        with pytest.raises(CorruptLogError, match=re.escape(version_file(2))):
            Store(url, options).describe_topic("t")
        # Nothing in the log changed: the bad file is neither repaired nor overwritten, and no
        # later version or checkpoint appeared.
        assert log_listing(store, writer) == before, label
        with open(next_path, "rb") as f:
            assert f.read() == bad
    # Once the damage is removed, the log reads as it was.
    os.unlink(next_path)
    fresh = Store(url, options).partition("t", 0)
    assert fresh.state().version == 1
    assert values_of(fresh) == [b"a", b"b", b"c"]
