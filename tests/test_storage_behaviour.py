"""One behaviour suite for the storage abstraction, run against every backend (memory, a local
directory, moto, SeaweedFS) through the ``any_store`` fixture.

Everything the log builds on is here: put-if-absent is the commit primitive, so it must refuse a
second create with FileExistsError on every backend (SeaweedFS's 412 included), never accept an
empty body, and a filesystem without an atomic create must be refused for writing unless the
user opts in.
"""

from __future__ import annotations

import errno
import os
import pickle
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from kstore import Store
from kstore.errors import (
    InvalidStoreError,
    StorageError,
    StorageNotWritableError,
    UnsafeStorageError,
)
from kstore.storage import Storage, unique_id
from tests.conftest import StoreTarget


def storage_of(target: StoreTarget) -> Storage:
    return Storage(target.url, target.storage_options)


def names(storage: Storage, rel: str) -> set[str]:
    return {info.name for info in storage.list_dir(rel)}


# --- put_if_absent ---------------------------------------------------------------------------


def test_put_if_absent_creates_once_and_refuses_a_second_create(any_store: StoreTarget) -> None:
    st = storage_of(any_store)
    path = "topics/t/_log/00000000000000000000.json"
    assert not st.exists(path)
    st.put_if_absent(path, b'{"first": true}\n')
    assert st.exists(path)
    assert st.read(path) == b'{"first": true}\n'
    with pytest.raises(FileExistsError):
        st.put_if_absent(path, b'{"second": true}\n')
    # The loser changed nothing.
    assert st.read(path) == b'{"first": true}\n'
    # A different name is independent.
    st.put_if_absent("topics/t/_log/00000000000000000001.json", b"next\n")
    assert st.read("topics/t/_log/00000000000000000001.json") == b"next\n"
    assert st.read(path) == b'{"first": true}\n'


def test_put_if_absent_refuses_a_file_made_by_put(any_store: StoreTarget) -> None:
    st = storage_of(any_store)
    st.put("a/hint", b"1")
    with pytest.raises(FileExistsError):
        st.put_if_absent("a/hint", b"2")
    assert st.read("a/hint") == b"1"


@pytest.mark.parametrize(
    "empty", [b"", bytearray(), memoryview(b"")], ids=["bytes", "bytearray", "memoryview"]
)
def test_empty_bodies_are_refused(any_store: StoreTarget, empty: Any) -> None:
    # On S3 an empty body bypasses If-None-Match (it becomes a touch that overwrites).
    st = storage_of(any_store)
    with pytest.raises(ValueError, match="non-empty"):
        st.put_if_absent("x/empty.json", empty)
    assert not st.exists("x/empty.json")
    assert st.list_dir("x") == []
    # ... and an existing file is not overwritten by one either.
    st.put_if_absent("x/full.json", b"data")
    with pytest.raises(ValueError, match="non-empty"):
        st.put_if_absent("x/full.json", empty)
    assert st.read("x/full.json") == b"data"


# --- reads -------------------------------------------------------------------------------------


def test_put_new_creates_a_segment_once_with_no_temporary_file(any_store: StoreTarget) -> None:
    st = storage_of(any_store)
    path = f"topics/t/0/segments/{unique_id()}.arrow"
    st.put_new(path, b"segment bytes", durable=False)
    assert st.read(path) == b"segment bytes"
    # The same write again (a retry after a lost answer) finds its own file: success.
    st.put_new(path, b"segment bytes", durable=False)
    # Other content under the unique name is not this write's: refused, nothing replaced.
    with pytest.raises(StorageError, match="already exists with other content"):
        st.put_new(path, b"other bytes")
    assert st.read(path) == b"segment bytes"
    assert names(st, "topics/t/0/segments") == {path.rsplit("/", 1)[1]}  # no .tmp-* left


def test_put_new_many_writes_every_file_at_once_and_raises_the_first_failure(
    any_store: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = storage_of(any_store)
    files = {f"t/_sidecars/{p}-{unique_id()}.json.gz": b"sidecar %d" % p for p in range(20)}
    # Concurrently: two writes meet at a barrier, which one after another never would.
    meet = threading.Barrier(2, timeout=10)
    real_put_new = Storage.put_new

    def put_new(self: Storage, rel: str, data: bytes, *, durable: bool = True) -> None:
        if rel.split("/")[-1].split("-")[0] in ("0", "1"):  # the files of "partitions" 0 and 1
            meet.wait()
        real_put_new(self, rel, data, durable=durable)

    monkeypatch.setattr(Storage, "put_new", put_new)
    st.put_new_many(files, durable=False)
    monkeypatch.undo()
    assert {rel: st.read(rel) for rel in files} == files
    assert len(names(st, "t/_sidecars")) == 20
    # Again (a retry after lost answers): each finds its own file. One name taken by other
    # content fails the call, after the other writes were made.
    clash = next(iter(files))
    st.put(clash, b"someone else's")
    more = {**files, f"t/_sidecars/x-{unique_id()}.json.gz": b"new"}
    with pytest.raises(StorageError, match="already exists with other content"):
        st.put_new_many(more, durable=False)
    assert all(st.read(rel) == data for rel, data in more.items() if rel != clash)
    st.put_new_many({}, durable=False)  # nothing to write: nothing written


def test_put_new_that_fails_leaves_no_partial_file(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = Storage(str(tmp_path))
    real_write = os.write

    def disk_full(fd: int, data: Any) -> int:
        real_write(fd, bytes(data)[:3])  # part of it lands, then the disk fills up
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    # Not a StorageError (whose outcome may be unknown, and which is retried): nothing landed.
    with pytest.raises(StorageNotWritableError, match="no space left"):
        st.put_new("seg/a.arrow", b"0123456789")
    monkeypatch.undo()
    assert not st.exists("seg/a.arrow")
    assert names(st, "seg") == set()


def test_unique_ids_differ_between_a_process_and_its_fork(tmp_path: Any) -> None:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the ids it draws next, then leave at once
        os.close(read_end)
        os.write(write_end, " ".join(unique_id() for _ in range(100)).encode())
        os._exit(0)
    os.close(write_end)
    mine = {unique_id() for _ in range(100)}
    with os.fdopen(read_end, "rb") as pipe:
        child = set(pipe.read().decode().split())
    os.waitpid(pid, 0)
    assert len(child) == 100
    assert len(mine) == 100
    assert not mine & child  # a forked child does not replay the parent's sequence
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in mine)


def test_read_exists_and_missing_files(any_store: StoreTarget) -> None:
    st = storage_of(any_store)
    assert not st.exists("nope/file")
    with pytest.raises(FileNotFoundError):
        st.read("nope/file")
    assert st.read_if_exists("nope/file") is None
    payload = bytes(range(256)) * 40  # binary, every byte value
    st.put_if_absent("bin/blob", payload)
    assert st.read("bin/blob") == payload
    assert st.read_if_exists("bin/blob") == payload
    assert st.exists("bin/blob")
    assert st.exists("bin")  # a directory with something in it exists


def test_read_ranges_returns_each_range_in_the_order_asked(any_store: StoreTarget) -> None:
    st = storage_of(any_store)
    data = bytes(range(256)) * 4  # 1024 bytes, every byte value
    st.put_if_absent("r/file", data)
    asked = [(500, 510), (0, 10), (5, 15), (10, 20), (1000, 1024), (7, 7), (1020, 1100)]
    expected = [data[lo:hi] for lo, hi in asked]
    assert st.read_ranges("r/file", asked) == expected  # all in one run
    assert st.read_ranges("r/file", asked, gap=0) == expected  # several runs
    assert st.read_ranges("r/file", [(1020, 1100)], gap=0) == [data[1020:]]  # short at the end
    assert st.read_ranges("r/file", [(2000, 2010)], gap=0) == [b""]  # wholly past the end
    assert st.read_ranges("r/file", []) == []
    with pytest.raises(FileNotFoundError):
        st.read_ranges("r/absent", [(0, 1)])
    for bad in ([(5, 2)], [(-1, 3)], [(0, 1.5)], [(0,)], [[0, 1]]):
        with pytest.raises(ValueError, match="read_ranges: range 0"):
            st.read_ranges("r/file", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gap"):
        st.read_ranges("r/file", [(0, 1)], gap=-1)


def test_large_neighbouring_ranges_are_read_apart_on_local_disk(
    any_store: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ranges that touch each other come back whole and in the order asked on every store. On
    local disk those whose run would pass LOCAL_RUN_BYTES are each read into a buffer of their
    own (one pread each), not read together and copied out of the run; small ones still share
    a read."""
    import kstore.storage.local as storage_module

    st = storage_of(any_store)
    size = storage_module.LOCAL_RUN_BYTES // 2 + 1000
    data = os.urandom(3 * size)
    st.put_if_absent("big/object", data)
    big = [(2 * size, 3 * size), (0, size), (size, 2 * size)]
    small = [(10, 20), (20, 30), (40, 50)]
    reads: list[int] = []
    real_pread = os.pread

    def pread(fd: int, length: int, offset: int) -> bytes:
        reads.append(length)
        return real_pread(fd, length, offset)

    monkeypatch.setattr(storage_module.os, "pread", pread)
    assert st.read_ranges("big/object", big) == [data[a:b] for a, b in big]
    assert st.read_ranges("big/object", small) == [data[a:b] for a, b in small]
    if st.local_root is not None:
        assert reads == [size, size, size, 40]


def test_large_files_are_written_whole_in_calls_of_at_most_write_call_bytes(
    any_store: StoreTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every way of writing a file lands it whole on every store. On local disk no write()
    call hands the kernel more than WRITE_CALL_BYTES (larger calls were throttled to disk
    speed on the machines measured), including for a pyarrow buffer (a data object)."""
    import pyarrow as pa

    import kstore.storage.local as storage_module

    st = storage_of(any_store)
    limit = storage_module.WRITE_CALL_BYTES
    data = os.urandom(2 * limit + 12345)
    calls: list[int] = []
    real_write = os.write

    def write(fd: int, chunk: Any) -> int:
        calls.append(len(chunk))
        return real_write(fd, chunk)

    monkeypatch.setattr(storage_module.os, "write", write)
    st.put_new("w/new", memoryview(pa.py_buffer(data)))
    st.put_if_absent("w/absent", data)
    st.put("w/replaced", b"old")
    st.put("w/replaced", data)
    for name in ("w/new", "w/absent", "w/replaced"):
        assert st.read(name) == data
    if st.local_root is not None:
        assert calls
        assert max(calls) <= limit
        assert sum(calls) == 3 * len(data) + 3


def test_put_overwrites_whole_file(any_store: StoreTarget) -> None:
    st = storage_of(any_store)
    st.put("p/_last_checkpoint", b'{"version": 100, "padding": "xxxxxxxxxxxxxxxx"}')
    st.put("p/_last_checkpoint", b'{"version": 200}')
    assert st.read("p/_last_checkpoint") == b'{"version": 200}'  # no leftover tail
    st.put_if_absent("p/made-once", b"one")
    st.put("p/made-once", b"two")
    assert st.read("p/made-once") == b"two"


def test_list_dir_gives_direct_children_with_sizes(any_store: StoreTarget) -> None:
    st = storage_of(any_store)
    assert st.list_dir("d") == []  # absent: empty, not an error
    st.put_if_absent("d/a.json", b"a" * 10)
    st.put_if_absent("d/b.json", b"b" * 20)
    st.put_if_absent("d/sub/c.json", b"c" * 30)
    st.put_if_absent("d2/other.json", b"o")  # a sibling whose name starts with "d"
    listing = {info.name: info for info in st.list_dir("d")}
    assert set(listing) == {"a.json", "b.json", "sub"}
    assert listing["a.json"].size == 10
    assert listing["b.json"].size == 20
    assert names(st, "d/sub") == {"c.json"}
    assert {"d", "d2"} <= names(st, "")


def test_delete_files(any_store: StoreTarget) -> None:
    st = storage_of(any_store)
    st.put_if_absent("d/a", b"1")
    st.put_if_absent("d/b", b"2")
    st.put_if_absent("d/c", b"3")
    st.delete(["d/a", "d/c", "d/never-existed"])  # absent files are not an error
    assert not st.exists("d/a")
    assert not st.exists("d/c")
    assert st.read("d/b") == b"2"
    assert names(st, "d") == {"b"}
    st.delete([])  # nothing to do
    assert names(st, "d") == {"b"}
    # A deleted name can be created again.
    st.put_if_absent("d/a", b"again")
    assert st.read("d/a") == b"again"


def test_delete_tree_removes_everything_below_and_nothing_beside(any_store: StoreTarget) -> None:
    st = storage_of(any_store)
    for rel in ("t/x/1", "t/x/2", "t/x/deep/er/3", "t/keep", "t/x2/sibling"):
        st.put_if_absent(rel, rel.encode())
    st.delete_tree("t/x")
    assert not st.exists("t/x/1")
    assert not st.exists("t/x/deep/er/3")
    assert st.list_dir("t/x") == []
    assert st.read("t/keep") == b"t/keep"
    assert st.read("t/x2/sibling") == b"t/x2/sibling"  # same prefix, different directory
    st.delete_tree("t/x")  # absent: not an error
    st.delete_tree("never/was")
    # The tree can be written again after its removal.
    st.put_if_absent("t/x/1", b"new")
    assert st.read("t/x/1") == b"new"


# --- pickling ----------------------------------------------------------------------------------


def test_storage_pickles_and_the_copy_reads_and_writes_the_same_data(
    any_store: StoreTarget,
) -> None:
    st = storage_of(any_store)
    st.put_if_absent("pk/one", b"written before pickling")
    st.fs  # noqa: B018 - open a live connection first: it must not travel in the pickle
    copy = pickle.loads(pickle.dumps(st))
    assert isinstance(copy, Storage)
    assert copy.url == st.url
    assert copy.root == st.root
    assert copy.storage_options == st.storage_options
    assert copy.read("pk/one") == b"written before pickling"
    assert names(copy, "pk") == {"one"}
    copy.put_if_absent("pk/two", b"written by the copy")
    assert st.read("pk/two") == b"written by the copy"
    with pytest.raises(FileExistsError):
        copy.put_if_absent("pk/one", b"x")
    # A whole Store pickles too (Spark ships it to executors).
    store = Store(any_store.url, any_store.storage_options)
    store.create_topic("pickled", 1)
    clone = pickle.loads(pickle.dumps(store))
    assert clone.store_id == store.store_id
    assert clone.topic("pickled").topic_id == store.topic("pickled").topic_id


def test_repr_hides_secrets(any_store: StoreTarget) -> None:
    st = storage_of(any_store)
    secret = any_store.storage_options.get("secret")
    if secret:
        assert secret not in repr(st)
        assert secret not in repr(Store(any_store.url, any_store.storage_options))
    assert repr(Storage("s3://AKIA:hunter2@bucket/x")) == "Storage('s3://***@bucket/x')"


# --- filesystems without an atomic create ----------------------------------------------------


class NoAtomicCreateFS(MemoryFileSystem):  # type: ignore[misc]
    """An in-memory filesystem under a protocol kstore knows nothing about, so no atomic create."""

    protocol = ("kstore-test-noatomic",)
    store: ClassVar[dict[str, Any]] = {}
    pseudo_dirs: ClassVar[list[str]] = [""]


@pytest.fixture
def no_atomic_fs() -> NoAtomicCreateFS:
    fsspec.register_implementation("kstore-test-noatomic", NoAtomicCreateFS, clobber=True)
    NoAtomicCreateFS.store.clear()
    NoAtomicCreateFS.pseudo_dirs[:] = [""]
    return NoAtomicCreateFS()


def test_filesystem_without_atomic_create_is_refused(no_atomic_fs: NoAtomicCreateFS) -> None:
    url = "kstore-test-noatomic://bucket/store"
    st = Storage(url)
    assert st.atomic_create is None
    writes: list[Callable[[], None]] = [
        lambda: st.put_if_absent("a", b"1"),
        lambda: st.put("a", b"1"),
        lambda: st.delete(["a"]),
        lambda: st.delete_tree("a"),
    ]
    for write in writes:
        with pytest.raises(UnsafeStorageError, match="allow_unsafe_writes"):
            write()
    with pytest.raises(UnsafeStorageError):
        Store(url)  # creating the store marker is a write
    assert no_atomic_fs.find("/") == []  # nothing at all was written
    # Reads are allowed: nothing is there.
    assert st.read_if_exists("a") is None
    assert st.list_dir("") == []


def test_filesystem_without_atomic_create_works_when_the_user_opts_in(
    no_atomic_fs: NoAtomicCreateFS,
) -> None:
    url = "kstore-test-noatomic://bucket/store"
    st = Storage(url, allow_unsafe_writes=True)
    st.put_if_absent("a/b", b"1")
    with pytest.raises(FileExistsError):
        st.put_if_absent("a/b", b"2")
    assert st.read("a/b") == b"1"
    st.put("a/b", b"3")
    assert st.read("a/b") == b"3"
    store = Store(url, allow_unsafe_writes=True)
    store.create_topic("t", 1)
    assert store.list_topics() == ["t"]
    # The opt-in travels with a pickled copy.
    copy = pickle.loads(pickle.dumps(st))
    assert copy.allow_unsafe_writes
    copy.put("a/c", b"4")


def test_ftp_is_refused_even_with_the_opt_in() -> None:
    # Never contacted: FTP has no atomic create and its host is not passed on, so no store can
    # live there, opted in to unsafe writes or not.
    for allow in (False, True):
        with pytest.raises(InvalidStoreError, match="'ftp://'"):
            Storage("ftp://127.0.0.1:1/store", allow_unsafe_writes=allow)


@pytest.mark.parametrize(
    ("url", "protocol", "atomic"),
    [
        ("memory://x/y", "memory", "lock"),
        ("/tmp/somewhere", "file", "link"),
        ("file:///tmp/somewhere", "file", "link"),
        ("s3://bucket/prefix", "s3", "if-none-match"),
    ],
)
def test_known_backends_have_an_atomic_create(url: str, protocol: str, atomic: str) -> None:
    st = Storage(url)
    assert st.protocol == protocol
    assert st.atomic_create == atomic
    st.check_writable()
