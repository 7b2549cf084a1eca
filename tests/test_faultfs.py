"""The fault-injecting filesystem (tests/reliability/faultfs.py) and the Storage hook that lets a
store run over it: the target's put-if-absent semantics are kept, faults do what they say, and
kstore survives each kind of fault without losing or duplicating a record. (A torn commit
file: tests/test_regressions.py.)"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from kstore import Producer, Store
from kstore.errors import StorageError
from kstore.storage import Storage
from tests.conftest import StoreTarget
from tests.reliability import faultfs


def values(store: Store, topic: str, partition: int = 0) -> list[bytes]:
    part = store.partition(topic, partition)
    return [
        r["value"] for batch in part.read(part.state().log_start_offset) for r in batch.to_pylist()
    ]


@pytest.fixture(params=["memory", "local", pytest.param("seaweed", marks=pytest.mark.s3)])
def target(request: pytest.FixtureRequest) -> StoreTarget:
    fixture = {
        "memory": "memory_store_url",
        "local": "local_store_url",
        "seaweed": "seaweed_bucket_url",
    }[request.param]
    url, options = request.getfixturevalue(fixture)
    return StoreTarget(request.param, url, options)


def test_a_store_over_faultfs_keeps_the_targets_put_if_absent(target: StoreTarget) -> None:
    url, options = faultfs.wrap_url(target.url, target.storage_options)
    storage = Storage(url, options)
    assert (
        storage.atomic_create
        == {
            "memory": "lock",
            "local": "link",
            "seaweed": "if-none-match",
        }[target.name]
    )
    storage.check_writable()  # no UnsafeStorageError: the wrapper declares its kind
    winners: list[int] = []
    lost: list[int] = []

    def race(i: int) -> None:
        try:
            Storage(url, options).put_if_absent("race/0.json", b"%d" % i)
            winners.append(i)
        except FileExistsError:
            lost.append(i)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
    assert len(lost) == 7
    assert storage.read("race/0.json") == b"%d" % winners[0]
    # The same bytes through the unwrapped store: the wrapper adds nothing to the layout.
    assert Storage(target.url, target.storage_options).read("race/0.json") == b"%d" % winners[0]
    # Picklable (Spark ships it), and rebuilt with the same hook.
    clone = pickle.loads(pickle.dumps(storage))
    assert clone.atomic_create == storage.atomic_create
    assert clone.read("race/0.json") == b"%d" % winners[0]


def test_a_store_over_faultfs_works_end_to_end(target: StoreTarget) -> None:
    url, options = faultfs.wrap_url(target.url, target.storage_options)
    store = Store(url, options)
    store.create_topic("t", 1)
    producer = Producer(store, acks="all", linger_ms=1)
    for i in range(20):
        producer.send("t", value=b"%d" % i)
    producer.flush()
    producer.close()
    assert values(Store(target.url, target.storage_options, create=False), "t") == [
        b"%d" % i for i in range(20)
    ]


def test_range_reads_through_faultfs_return_the_asked_bytes(target: StoreTarget) -> None:
    """Layout 3 reads every segment as a byte range of a data object: through the wrapper the
    ranges must be the target's (s3fs's cat_file takes version_id before start and end, so
    positional arguments read from the wrong offset)."""
    url, options = faultfs.wrap_url(target.url, target.storage_options)
    storage = Storage(url, options)
    data = bytes(range(256)) * 40
    storage.put_if_absent("r/object", data)
    spans = [(0, 10), (100, 356), (5000, 10240)]
    assert storage.read_ranges("r/object", spans, gap=0) == [data[a:b] for a, b in spans]
    store = Store(url, options)
    store.create_topic("t", 2)
    with Producer(store, linger_ms=1) as producer:
        for i in range(20):
            producer.send("t", value=b"%d" % i, partition=i % 2)
    reader = Store(url, options, create=False)
    assert values(reader, "t", 0) == [b"%d" % i for i in range(0, 20, 2)]
    assert values(reader, "t", 1) == [b"%d" % i for i in range(1, 20, 2)]


def test_an_unknown_filesystem_without_the_hook_is_still_refused() -> None:
    import fsspec
    from fsspec.implementations.dirfs import DirFileSystem

    from kstore.errors import UnsafeStorageError

    class NoHookFileSystem(DirFileSystem):  # an fsspec filesystem kstore knows nothing of
        protocol = "kstore-test-nohook"

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(path="/", fs=fsspec.filesystem("memory"), **kwargs)

    fsspec.register_implementation("kstore-test-nohook", NoHookFileSystem, clobber=True)
    with pytest.raises(UnsafeStorageError):
        Storage("kstore-test-nohook://x").check_writable()


def test_messages_name_no_credentials(seaweed_bucket_url: Any) -> None:
    url, options = seaweed_bucket_url
    wrapped, wrapped_options = faultfs.wrap_url(
        url, options, faults=[{"op": "read", "kind": "fail"}]
    )
    storage = Storage(wrapped, wrapped_options)
    with pytest.raises(StorageError) as info:
        storage.read("anything")
    for secret in (
        options.get("secret"),
        options.get("key"),
        options.get("client_kwargs", {}).get("aws_secret_access_key"),
    ):
        if secret:
            assert secret not in str(info.value)
    assert "secret" not in repr(storage).lower()


@pytest.mark.parametrize("kind", ["fail", "ambiguous", "delay"])
def test_every_commit_failing_once_neither_loses_nor_duplicates(
    local_store_url: Any, kind: str
) -> None:
    """Each log version's first write fails before landing, lands but reports failure
    (ambiguous), or is delayed: every acknowledged record is there exactly once, in order."""
    base, _ = local_store_url
    Store(base).create_topic("t", 1)
    url, options = faultfs.wrap_url(
        base, faults=[{"op": "create", "kind": kind, "p": 0.5, "path": r"/_log/\d+\.json$"}], seed=3
    )
    store = Store(url, options, create=False)
    for idempotent in (True, False):
        producer = Producer(store, acks="all", linger_ms=0, enable_idempotence=idempotent)
        offsets = [  # one commit per record
            producer.send("t", value=b"%d-%d" % (idempotent, i)).get(timeout=60).offset
            for i in range(40)
        ]
        producer.close()
        assert offsets == sorted(offsets)
    assert faultfs.wrapper_of(store.storage).counts().get(kind, 0) > 5
    expected = [b"%d-%d" % (flag, i) for flag in (1, 0) for i in range(40)]
    assert values(Store(base, create=False), "t") == expected


def test_a_torn_last_checkpoint_hint_is_ignored(local_store_url: Any) -> None:
    base, _ = local_store_url
    Store(base).create_topic("t", 1, config={"checkpoint.interval": 2})
    url, options = faultfs.wrap_url(
        base, faults=[{"op": "put", "kind": "truncate", "path": "_last_checkpoint$"}]
    )
    store = Store(url, options, create=False)
    producer = Producer(store, acks="all", linger_ms=0)
    for i in range(7):
        producer.send("t", value=b"%d" % i).get(timeout=30)
    producer.close()
    assert faultfs.wrapper_of(store.storage).counts()["truncate"] >= 1
    hint = Storage(base).read(f"{store.partition('t', 0).log.directory}/_last_checkpoint")
    with pytest.raises(ValueError):
        __import__("json").loads(hint)  # really torn
    assert values(Store(base, create=False), "t") == [b"%d" % i for i in range(7)]


def test_rules_are_validated() -> None:
    with pytest.raises(ValueError, match="unknown fault kind"):
        _ = Storage(*faultfs.wrap_url("memory://x/y", faults=[{"op": "read", "kind": "bad"}])).fs
    with pytest.raises(ValueError, match="unknown crash point"):
        faultfs.Crash.of({"point": "nowhere"})


def test_crash_points_fire_in_the_topic_logs_and_sidecars_of_layout_3(tmp_path: Path) -> None:
    """`commit-landed` fires on a commit of topic log 1 (`_log.1/`), `checkpoint-write` on a
    sidecar; what is left is readable: the landed commits are there, the interrupted
    checkpoint is not."""
    base = (tmp_path / "store").as_uri()
    Store(base).create_topic("t", 2, {"commit.logs": 2, "checkpoint.interval": 2})
    script = textwrap.dedent(
        """
        import json, sys
        from tests.reliability import faultfs
        faultfs.register()
        from kstore import Store, Producer
        store = Store(sys.argv[1], json.loads(sys.argv[2]), create=False)
        with Producer(store, acks="all", linger_ms=0) as producer:
            for _ in range(int(sys.argv[3])):
                producer.send("t", value=b"x", partition=1).get(timeout=30)
        print("survived")
        """
    )
    cases = [
        ("commit-landed", r"/_log\.1/\d+\.json$", 1, 1),
        ("checkpoint-write", "/_sidecars/", 2, 3),
    ]
    for point, path, sends, end_offset in cases:
        url, options = faultfs.wrap_url(base, crashes=[{"point": point, "at": 1, "path": path}])
        proc = subprocess.run(
            [sys.executable, "-c", script, url, json.dumps(options), str(sends)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=str(Path(__file__).resolve().parents[1]),
        )
        assert proc.returncode == faultfs.CRASH_EXIT_CODE, (point, proc.stdout, proc.stderr)
        part = Store(base, create=False).partition("t", 1)
        assert part.log.directory.endswith("/_log.1")
        assert part.state().end_offset == end_offset, point
        assert values(Store(base, create=False), "t", 1) == [b"x"] * end_offset, point
    # The sidecar write was interrupted before the checkpoint that would name it.
    names = {i.name for i in Storage(base).list_dir(part.log.directory)}
    assert not any(name.endswith(".checkpoint.json") for name in names)
    assert "_last_checkpoint" not in names
    assert values(Store(base, create=False), "t", 0) == []


def test_a_jump_of_time_moves_the_clocks_and_the_storage_times_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tests/reliability/jumps.py: after a jump, kstore.clock is that much further on, a file
    written after it is reported that much later by the wrapper, one written before it is not."""
    from kstore import clock
    from tests.reliability import jumps

    monkeypatch.setattr(clock, "_read", clock._read)
    path = str(tmp_path / "clock.json")
    jumps.install(path)
    url, options = faultfs.wrap_url((tmp_path / "store").as_uri(), clock_path=path)
    storage = Storage(url, options)
    storage.put("before", b"x")
    start = clock.monotonic()
    jumps.jump(path, 86_400.0, int(time.time() * 1000) + 1)
    time.sleep(0.01)
    storage.put("after", b"x")
    assert 86_400 <= clock.monotonic() - start < 86_400 + 5
    found = storage.stat_many(["before", "after"])
    before, after = found["before"].mtime_ms, found["after"].mtime_ms
    assert before is not None
    assert after is not None
    assert 86_400_000 <= after - before < 86_400_000 + 5_000
    assert abs(before - time.time() * 1000) < 5_000
    listed = {i.name: i.mtime_ms for i in storage.list_dir("")}
    assert listed["after"] == after
