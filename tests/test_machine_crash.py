"""Durability across a machine crash on local disk (PROTOCOL 12.2): a record acknowledged at
``acks="all"`` survives the loss of everything that was not fsynced.

``kill -9`` keeps the page cache, so it cannot catch a missing ``fsync``; the simulation of
``tests/reliability/machine.py`` drops every write and directory entry not made durable. First
the simulation itself is checked against the POSIX rules it models, then a producer's
acknowledged records are checked after a crash."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from kstore import Producer, Store
from kstore.consumer import Consumer
from kstore.records import TopicPartition
from tests.reliability import machine


def _write(path: Path, data: bytes, *, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_the_simulated_crash_keeps_only_what_was_fsynced(tmp_path: Path) -> None:
    root, shadow = tmp_path / "disk", str(tmp_path / "shadow")
    root.mkdir()
    (root / "old").write_bytes(b"before")
    with machine.recording(str(root), shadow):
        _write(root / "synced", b"both", sync=True)
        _write(root / "data", b"data", sync=True)
        (root / "sub").mkdir()
        _write(root / "sub" / "in-new-dir", b"x", sync=True)
        _sync_dir(root / "sub")
        _sync_dir(root)
        _write(root / "data-only-2", b"lost", sync=True)
        _write(root / "entry-only", b"never synced", sync=False)
        _sync_dir(root)
        os.rename(root / "data-only-2", root / "renamed")  # its directory is not synced after
        os.unlink(root / "old")
        _write(root / "late", b"data but no entry", sync=True)  # no directory fsync after it
    lost = machine.crash(str(root), shadow)
    assert sorted(os.listdir(root)) == [
        "data",
        "data-only-2",
        "entry-only",
        "old",
        "sub",
        "synced",
    ]
    assert (root / "synced").read_bytes() == b"both"
    assert (root / "data").read_bytes() == b"data"
    assert (root / "data-only-2").read_bytes() == b"lost"  # the rename was not durable
    assert (root / "entry-only").read_bytes() == b""  # the entry was durable, its data not
    assert (root / "old").read_bytes() == b"before"  # the unlink was not durable
    assert (root / "sub" / "in-new-dir").read_bytes() == b"x"
    assert lost["emptied"] == 1
    assert lost["gone"] == 2  # "renamed" and "late"


def test_a_directory_never_fsynced_after_an_entry_loses_it(tmp_path: Path) -> None:
    root, shadow = tmp_path / "disk", str(tmp_path / "shadow")
    root.mkdir()
    with machine.recording(str(root), shadow):
        (root / "a" / "b").mkdir(parents=True)
        _write(root / "a" / "b" / "f", b"data", sync=True)
        _sync_dir(root / "a" / "b")  # but neither a nor root: a is not durable
    machine.crash(str(root), shadow)
    assert os.listdir(root) == []


@pytest.mark.parametrize("compression", ["uncompressed", "zstd"])
def test_records_acknowledged_at_acks_all_survive_a_machine_crash(
    tmp_path: Path, compression: str
) -> None:
    root, shadow = tmp_path / "store", str(tmp_path / "shadow")
    Store(root.as_uri()).create_topic("t", 3)
    acked: dict[bytes, tuple[int, int]] = {}
    with machine.recording(str(root), shadow):
        store = Store(root.as_uri(), create=False)
        producer = Producer(store, acks="all", linger_ms=0, compression_type=compression)
        # Enough commits per partition for checkpoints and their hints to be written too.
        for batch in range(40):
            futures = [
                (v, producer.send("t", key=b"k%d" % (i % 7), value=v))
                for i in range(25)
                for v in [b"%d-%d" % (batch, i)]
            ]
            for v, future in futures:
                md = future.get(timeout=60)
                acked[v] = (md.partition, md.offset)
        producer.close()
    lost = machine.crash(str(root), shadow)
    assert lost["files"] > 0
    store = Store(root.as_uri(), create=False)
    found: dict[bytes, tuple[int, int]] = {}
    for p in range(3):
        tp = TopicPartition("t", p)
        consumer = Consumer(store=store, max_poll_records=5000)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        while consumer.position(tp) < end:
            for records in consumer.poll(timeout_ms=500).values():
                for r in records:
                    assert r.value is not None
                    found[r.value] = (p, r.offset)
        consumer.close()
    missing = {v: at for v, at in acked.items() if found.get(v) != at}
    assert not missing, f"{len(missing)} acknowledged records lost or moved, e.g. " + str(
        sorted(missing.items())[:5]
    )


def test_a_failed_directory_fsync_after_a_commit_landed_loses_no_acknowledged_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the torture's machine-crash mode: an fsync of a log directory that fails (EIO)
    after the commit's link. The commit is there; whatever the producer reports for its record,
    every record it acknowledges must be in the log at the offset it gave."""
    import errno
    import stat

    Store(tmp_path.as_uri()).create_topic("t", 1)
    store = Store(tmp_path.as_uri(), create=False)
    real_fsync = os.fsync
    log_dir_fsyncs = 0

    def fsync(fd: int) -> None:
        nonlocal log_dir_fsyncs
        real_fsync(fd)
        if stat.S_ISDIR(os.fstat(fd).st_mode) and os.readlink(f"/proc/self/fd/{fd}").endswith(
            "/_log"
        ):
            log_dir_fsyncs += 1
            if log_dir_fsyncs == 3:
                raise OSError(errno.EIO, "injected EIO on a directory fsync")

    monkeypatch.setattr(os, "fsync", fsync)
    producer = Producer(store, acks="all", linger_ms=0, enable_idempotence=True)
    acked: dict[bytes, int] = {}
    for i in range(6):
        value = b"v%d" % i
        # A failure report is allowed; a wrong acknowledgement is not.
        with contextlib.suppress(Exception):
            acked[value] = producer.send("t", value=value).get(timeout=30).offset
    producer.close()
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert log_dir_fsyncs >= 3  # the fault was injected
    part = Store(tmp_path.as_uri(), create=False).partition("t", 0)
    values = [r["value"] for b in part.read(0) for r in b.to_pylist()]
    assert {v: values.index(v) if v in values else None for v in acked} == acked


def test_a_commit_whose_directory_fsync_failed_is_not_acknowledged_even_with_retries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit is visible but may not survive a crash: the producer must report the record
    failed, and must not retry into an acknowledgement (a retry finds the commit by its producer
    entry and would report it written). The topic log's directory."""
    import errno

    from kstore.errors import CommitStateUnknownError
    from kstore.storage import local as storage_module

    Store(tmp_path.as_uri()).create_topic("t", 1)
    store = Store(tmp_path.as_uri(), create=False)
    log_dir = os.path.normpath(store.storage.full_path(store.partition("t", 0).log.directory))
    assert log_dir.endswith(f"{os.sep}_log")
    real = storage_module._fsync_dir
    failed: list[str] = []

    def fsync_dir(directory: str) -> None:
        real(directory)
        landed = any(n.endswith(".json") for n in os.listdir(directory))
        if not failed and os.path.normpath(directory) == log_dir and landed:
            failed.append(directory)
            raise OSError(errno.EIO, "injected EIO on a directory fsync")

    monkeypatch.setattr(storage_module, "_fsync_dir", fsync_dir)
    producer = Producer(store, acks="all", linger_ms=0, retries=5, enable_idempotence=True)
    with pytest.raises(CommitStateUnknownError, match="not known to be durable"):
        producer.send("t", value=b"first").get(timeout=30)
    second = producer.send("t", value=b"second").get(timeout=30)
    producer.close()
    assert failed  # the fault was injected after the first commit landed
    part = Store(tmp_path.as_uri(), create=False).partition("t", 0)
    values = [r["value"] for b in part.read(0) for r in b.to_pylist()]
    # The first record is in the log (readable, not acknowledged); the second was written
    # under a new epoch, at the offset reported, not taken for the first one's retry.
    assert values == [b"first", b"second"]
    assert second.offset == 1
