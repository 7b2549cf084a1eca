"""The backend contract (kstore.storage.backend.Backend): every backend the factory chooses
(memory, local disk, S3 on moto and on SeaweedFS) answers the same primitive operations the
same way, including a race of put-if-absent, missing files, a missing bucket and the counting
of requests. Each test builds the backend itself, through kstore.storage.factory."""

from __future__ import annotations

import os
import pickle
import threading
import uuid

import pytest

from kstore.errors import BucketNotFoundError, InvalidStoreError, StorageError
from kstore.storage import Storage
from kstore.storage.backend import Backend
from kstore.storage.factory import open_backend
from tests.conftest import StoreTarget

_FIXTURES = {
    "memory": "memory_store_url",
    "local": "local_store_url",
    "moto": "moto_bucket_url",
    "seaweed": "seaweed_bucket_url",
}
_S3 = ("moto", "seaweed")


@pytest.fixture(
    params=[
        "memory",
        "local",
        pytest.param("moto", marks=pytest.mark.s3),
        pytest.param("seaweed", marks=pytest.mark.s3),
    ]
)
def target(request: pytest.FixtureRequest) -> StoreTarget:
    url, options = request.getfixturevalue(_FIXTURES[request.param])
    return StoreTarget(request.param, url, options)


def backend_of(target: StoreTarget) -> Backend:
    _, backend = open_backend(
        target.url.rstrip("/"), target.storage_options, timeout_s=30.0, attempt_timeout_s=10.0
    )
    return backend


# --- what each backend says it is -------------------------------------------------------------


def test_capabilities_are_those_of_the_kind_of_storage(target: StoreTarget) -> None:
    backend = backend_of(target)
    on_s3 = target.name in _S3
    assert backend.remote == on_s3
    assert backend.pages_are_requests == on_s3
    assert backend.counts_requests == on_s3
    assert (
        backend.atomic_create
        == {
            "memory": "lock",
            "local": "link",
            "moto": "if-none-match",
            "seaweed": "if-none-match",
        }[target.name]
    )
    assert (backend.local_root is not None) == (target.name == "local")
    assert backend.writes_views == (target.name == "local")
    assert (backend.object_store_url("t/x") is not None) == on_s3
    if on_s3:
        assert backend.object_store_url("t/x") == f"s3://{backend.root}/t/x"
        assert backend.object_store_options()["AWS_ENDPOINT_URL"].startswith("http://")
    else:
        assert backend.object_store_options() == {}


def test_a_local_root_is_where_the_files_are(local_store_url: tuple[str, dict[str, str]]) -> None:
    backend = backend_of(StoreTarget("local", *local_store_url))
    assert backend.local_root is not None
    backend.put_if_absent("d/f", b"data", durable=True)
    with open(os.path.join(backend.local_root, "d", "f"), "rb") as f:
        assert f.read() == b"data"


# --- put-if-absent ----------------------------------------------------------------------------


def test_put_if_absent_creates_once(target: StoreTarget) -> None:
    backend = backend_of(target)
    backend.put_if_absent("log/0.json", b"first", durable=True)
    with pytest.raises(FileExistsError):
        backend.put_if_absent("log/0.json", b"second", durable=True)
    assert backend.read("log/0.json") == b"first"
    assert backend.exists("log/0.json")


def test_of_racing_put_if_absent_exactly_one_wins(target: StoreTarget) -> None:
    """Eight writers, each with a backend of its own, create one path at once, round after
    round. On moto, several rounds matter: unlocked, its check-then-write let two of them win
    in about 1 round of 40 under load (the suite's moto child serialises key writes)."""
    backends = [backend_of(target) for _ in range(8)]
    # SeaweedFS holds a losing conditional PUT for about a second: fewer rounds there.
    for round_ in range(3 if target.name == "seaweed" else 40):
        path = f"race/{round_}.json"
        winners, lost, failed = _race_to_create(backends, path)
        assert failed == [], round_
        assert len(winners) == 1, (round_, winners)
        assert len(lost) == len(backends) - 1, round_
        assert backend_of(target).read(path) == b"writer %d" % winners[0]


def _race_to_create(
    backends: list[Backend], path: str
) -> tuple[list[int], list[int], list[BaseException]]:
    """Every backend creates ``path`` at once: who won, who lost, what failed otherwise."""
    start = threading.Barrier(len(backends))
    winners: list[int] = []
    lost: list[int] = []
    failed: list[BaseException] = []

    def race(i: int) -> None:
        start.wait()
        try:
            backends[i].put_if_absent(path, b"writer %d" % i, durable=True)
            winners.append(i)
        except FileExistsError:
            lost.append(i)
        except BaseException as exc:  # reported by the caller: a failure is not a lost race
            failed.append(exc)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(backends))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return winners, lost, failed


def test_put_replaces_and_put_new_refuses_an_existing_name(target: StoreTarget) -> None:
    backend = backend_of(target)
    backend.put("hint", b"old", durable=True)
    backend.put("hint", b"new", durable=True)
    assert backend.read("hint") == b"new"
    backend.put_new("seg/a.kseg", b"segment", durable=True)
    with pytest.raises(FileExistsError):
        backend.put_new("seg/a.kseg", b"segment", durable=True)
    if backend.writes_views:
        backend.put_new("seg/b.kseg", memoryview(b"a view"), durable=True)
        assert backend.read("seg/b.kseg") == b"a view"


# --- missing files ----------------------------------------------------------------------------


def test_missing_files_read_as_absent(target: StoreTarget) -> None:
    backend = backend_of(target)
    backend.put_if_absent("present/a", b"a", durable=True)
    with pytest.raises(FileNotFoundError):
        backend.read("present/missing")
    with pytest.raises(FileNotFoundError):
        backend.read_ranges("present/missing", [(0, 10)])
    backend.check_root()  # the bucket is there: nothing to say
    assert not backend.exists("present/missing")
    assert backend.list_dir("absent-dir") == []
    assert list(backend.list_pages("absent-dir", "", 10)) == []
    assert backend.stat_many(["present/a", "present/missing"]).keys() == {"present/a"}
    assert backend.read_many(["present/a", "present/missing"]) == {"present/a": b"a"}
    backend.delete(["present/missing"])  # already gone: not an error
    backend.delete_tree("absent-dir")


@pytest.mark.parametrize("name", _S3)
def test_a_missing_bucket_is_named(name: str, request: pytest.FixtureRequest) -> None:
    """A bucket nobody created: the miss is a missing bucket, not a missing file, for reads
    through the facade and for writes."""
    url, options = request.getfixturevalue(_FIXTURES[name])
    bucket = url.removeprefix("s3://").split("/", 1)[0]
    missing = url.replace(bucket, f"kst-missing-{uuid.uuid4().hex[:12]}", 1)
    backend = backend_of(StoreTarget(name, missing, options))
    with pytest.raises(FileNotFoundError):
        backend.read("x")
    with pytest.raises(BucketNotFoundError, match="does not exist"):
        backend.check_root()
    storage = Storage(missing, options)
    with pytest.raises(BucketNotFoundError, match="create it first"):
        storage.read("x")
    with pytest.raises(BucketNotFoundError):
        Storage(missing, options).put_if_absent("x", b"1")


# --- reads, listings, deletes -----------------------------------------------------------------


def test_read_ranges_come_back_short_past_the_end(target: StoreTarget) -> None:
    backend = backend_of(target)
    data = bytes(range(100))
    backend.put_if_absent("obj", data, durable=True)
    assert backend.read_ranges("obj", [(0, 10), (50, 60), (95, 120), (200, 210)]) == [
        data[0:10],
        data[50:60],
        data[95:],
        b"",
    ]


def test_listings_report_sizes_and_times_in_name_order(target: StoreTarget) -> None:
    backend = backend_of(target)
    for name in ("c", "a", "b", "d"):
        backend.put_if_absent(f"dir/{name}", name.encode() * 3, durable=True)
    backend.put_if_absent("dir/sub/e", b"e", durable=True)
    listed = {i.name: i for i in backend.list_dir("dir")}
    assert set(listed) == {"a", "b", "c", "d", "sub"}
    assert {n: listed[n].size for n in "abcd"} == dict.fromkeys("abcd", 3)
    assert all(listed[n].mtime_ms is not None for n in "abcd")  # leases are judged by them
    pages = list(backend.list_pages("dir", "a", 2))
    assert [[i.name for i in page] for page in pages] == [["b", "c"], ["d", "sub"]]
    stats = backend.stat_many(["dir/a", "dir/b"])
    assert {rel: info.size for rel, info in stats.items()} == {"dir/a": 3, "dir/b": 3}


def test_delete_tree_removes_only_what_is_below(target: StoreTarget) -> None:
    backend = backend_of(target)
    for rel in ("t/1/a", "t/1/b/c", "t/2", "t-beside/x"):
        backend.put_if_absent(rel, b"x", durable=True)
    backend.delete(["t/2"])
    assert not backend.exists("t/2")
    backend.delete_tree("t")
    assert backend.list_dir("t") == []
    assert backend.read("t-beside/x") == b"x"


# --- requests counted, and the facade over every backend --------------------------------------


def test_requests_are_counted_where_they_are_sent(target: StoreTarget) -> None:
    backend = backend_of(target)
    if not backend.counts_requests:
        with pytest.raises(InvalidStoreError, match="not on S3"), backend.count_requests():
            pass
        return
    backend.put_if_absent("c/a", b"a", durable=True)
    with backend.count_requests() as counts:
        backend.put_if_absent("c/b", b"b", durable=True)
        assert backend.read("c/a") == b"a"
        backend.list_dir("c")
        backend.stat_many(["c/a", "c/b"])
        assert list(backend.list_pages("c", "", 1000))
    assert dict(counts) == {"PUT": 1, "GET": 1, "LIST": 2, "HEAD": 2}


def test_the_facade_pickles_and_maps_failures(target: StoreTarget) -> None:
    storage = Storage(target.url, target.storage_options)
    storage.put_if_absent("p/x", b"x")
    clone: Storage = pickle.loads(pickle.dumps(storage))
    assert clone.read("p/x") == b"x"
    assert clone.is_remote == storage.backend.remote
    with pytest.raises(ValueError, match="non-empty body"):
        storage.put_if_absent("p/empty", b"")
    storage.put_if_absent("p/dir/inside", b"y")
    with pytest.raises((StorageError, FileNotFoundError)):
        storage.read("p/dir")  # a directory is no file, on any backend
