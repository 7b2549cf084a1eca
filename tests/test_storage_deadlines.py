"""The storage layer against servers that misbehave, and the requests it sends to S3.

- A server that accepts connections and never answers: every storage call, and the ``kstore``
  command, fails with :class:`StorageTimeoutError` naming the endpoint once the deadline (the
  storage option ``timeout_ms``) passes. The time bounds asserted are loose multiples of the
  deadline: they check that a deadline exists, not how fast anything is.
- A read that fails is not an absent file: ``read_many`` raises instead of leaving it out.
- A segment PUT whose answer was lost and which the client library sent again (and which got
  412) is the writer's own file: ``put_new`` succeeds and the producer's send goes through.
- A whole-file read is one GET and no HEAD.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import botocore.exceptions
import pytest

from kstore import Consumer, Producer, Store
from kstore.errors import InvalidStoreError, StorageError, StorageTimeoutError
from kstore.storage import Storage, unique_id
from tests.reliability.faultfs import wrap_url

KSTORE = str(Path(sys.executable).parent / "kstore")
S3_BACKENDS = [
    pytest.param("moto", marks=pytest.mark.s3),
    pytest.param("seaweed", marks=pytest.mark.s3),
]


# --- a server that never answers ---------------------------------------------------------------


class SilentServer:
    """Accepts TCP connections on a free loopback port, reads nothing, answers nothing."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(128)
        self._connections: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def endpoint_url(self) -> str:
        host, port = self._socket.getsockname()
        return f"http://{host}:{port}"

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:
                return  # closed
            self._connections.append(connection)

    def close(self) -> None:
        self._socket.close()
        for connection in self._connections:
            connection.close()
        self._thread.join(timeout=5)


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


def silent_options(server: SilentServer, **extra: Any) -> dict[str, Any]:
    return {
        "key": "kstore-test",
        "secret": "kstore-test-secret",
        "client_kwargs": {"endpoint_url": server.endpoint_url, "region_name": "us-east-1"},
        **extra,
    }


def test_every_call_to_a_silent_server_fails_once_the_deadline_passes(
    silent: SilentServer,
) -> None:
    deadline_s = 1.0
    st = Storage("s3://bucket/ks", silent_options(silent, timeout_ms=int(deadline_s * 1000)))
    calls: dict[str, Callable[[], object]] = {
        "read": lambda: st.read("topics/_log/00000000000000000000.json"),
        "read_if_exists": lambda: st.read_if_exists("a"),
        "read_many": lambda: st.read_many(["a", "b", "c"]),
        # Range reads of data objects (layout 3): two runs, fetched concurrently.
        "read_ranges": lambda: st.read_ranges("a", [(0, 10), (10 << 20, (10 << 20) + 10)]),
        "exists": lambda: st.exists("a"),
        "list_dir": lambda: st.list_dir("topics"),
        "put_if_absent": lambda: st.put_if_absent("a", b"x"),
        "put_new": lambda: st.put_new(f"seg/{unique_id()}.arrow", b"x"),
        "put": lambda: st.put("_last_checkpoint", b"x"),
        "delete": lambda: st.delete(["a"]),
        "delete_tree": lambda: st.delete_tree("topics/t"),
    }
    for name, call in calls.items():
        began = time.monotonic()
        with pytest.raises(StorageTimeoutError) as caught:
            call()
        waited = time.monotonic() - began
        message = str(caught.value)
        assert silent.endpoint_url in message, (name, message)
        assert "within 1 s" in message, (name, message)
        assert "timeout_ms" in message, (name, message)
        assert "kstore-test-secret" not in message
        assert caught.value.retriable
        assert isinstance(caught.value, StorageError)  # callers' retries and resolution apply
        # Functional: the call ended because of the deadline, not after stacked retries.
        assert waited < 3 * deadline_s + 2, (name, waited)


def test_the_deadline_bounds_each_attempt_too(silent: SilentServer) -> None:
    # A short attempt timeout lets retries happen inside the deadline; the call still ends
    # with the deadline, not after (attempts x timeout).
    st = Storage("s3://bucket/ks", silent_options(silent, timeout_ms=1500, attempt_timeout_ms=300))
    began = time.monotonic()
    with pytest.raises(StorageTimeoutError, match=r"within 1\.5 s"):
        st.read("a")
    assert time.monotonic() - began < 3 * 1.5 + 2


def test_kstore_command_against_a_silent_server_says_what_it_waits_for_and_fails(
    silent: SilentServer,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KSTORE_", "AWS_"))}
    env.update(
        KSTORE_STORE="s3://bucket/ks",
        KSTORE_OPTION_KEY="kstore-test",
        KSTORE_OPTION_SECRET="kstore-test-secret",
        KSTORE_OPTION_CLIENT_KWARGS__ENDPOINT_URL=silent.endpoint_url,
        KSTORE_OPTION_CLIENT_KWARGS__REGION_NAME="us-east-1",
        KSTORE_OPTION_TIMEOUT_MS="3000",
        AWS_SHARED_CREDENTIALS_FILE="/nonexistent",
        AWS_CONFIG_FILE="/nonexistent",
        AWS_EC2_METADATA_DISABLED="true",
    )
    began = time.monotonic()
    result = subprocess.run(
        [KSTORE, "topics", "list"], env=env, capture_output=True, text=True, timeout=120
    )
    waited = time.monotonic() - began
    assert result.returncode == 1, result
    assert result.stdout == ""  # scripted output untouched: the notes go to stderr
    assert "waiting for s3://bucket/ks (reading '_kstore.json')..." in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr
    assert f"no answer from {silent.endpoint_url} within 3 s" in errors[0]
    assert "Traceback" not in result.stderr
    assert "kstore-test-secret" not in result.stderr
    assert waited < 3 * 3 + 10, waited  # start-up included; a deadline, not a speed claim


# --- the timeout options ------------------------------------------------------------------------


def test_timeout_options_defaults_and_checks(tmp_path: Path) -> None:
    st = Storage("s3://bucket/ks")
    assert (st.timeout_s, st.attempt_timeout_s) == (30.0, 10.0)
    st = Storage("s3://bucket/ks", {"timeout_ms": "2000", "attempt_timeout_ms": 5000})
    assert (st.timeout_s, st.attempt_timeout_s) == (2.0, 2.0)  # an attempt within the deadline
    for bad in (0, -1, 1.5, "soon", True, None, 10**12):
        for name in ("timeout_ms", "attempt_timeout_ms"):
            with pytest.raises(InvalidStoreError, match=f"storage option '{name}'"):
                Storage("s3://bucket/ks", {name: bad})
    # kstore's own options never reach the filesystem (fsspec would refuse or mistake them).
    local = Store(str(tmp_path / "ks"), {"timeout_ms": 5000})
    local.create_topic("t", 1)
    memory = Storage(f"memory://{unique_id()}/ks", {"timeout_ms": 5000})
    memory.put_if_absent("a", b"1")
    assert memory.read("a") == b"1"


def test_s3_attempt_timeouts_are_set_unless_the_user_sets_them() -> None:
    fs = Storage("s3://bucket/ks", {"attempt_timeout_ms": 4000}).fs
    assert fs.config_kwargs["connect_timeout"] == 4.0
    assert fs.config_kwargs["read_timeout"] == 4.0
    assert fs.config_kwargs["retries"]["max_attempts"] == 3
    fs = Storage(
        "s3://bucket/ks", {"config_kwargs": {"read_timeout": 7, "retries": {"max_attempts": 1}}}
    ).fs
    assert fs.config_kwargs["read_timeout"] == 7
    assert fs.config_kwargs["connect_timeout"] == 10.0
    assert fs.config_kwargs["retries"] == {"max_attempts": 1}


# --- reads: errors are not absences; one GET per read --------------------------------------------


@pytest.fixture(params=S3_BACKENDS)
def s3_store(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    url, options = request.getfixturevalue(f"{request.param}_store")
    return url, options


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "s3fs"])
def test_read_many_raises_when_a_read_fails_on_s3(
    s3_store: tuple[str, dict[str, Any]], direct: bool
) -> None:
    url, options = s3_store
    st = Storage(url, {**options, "s3_direct_requests": direct})
    st.put_if_absent("d/a", b"A")
    st.put_if_absent("d/b", b"B")
    assert st.read_many(["d/a", "d/b", "d/absent"]) == {"d/a": b"A", "d/b": b"B"}
    sender = st.direct_requests()
    assert (sender is not None) == direct

    def refuse_b_directly(method: str, key: str) -> None:
        if method == "GET" and key.endswith("/d/b"):
            raise PermissionError("GET refused (HTTP 403 AccessDenied)")

    if sender is not None:
        sender.before_send.append(refuse_b_directly)

    def refuse_b(params: dict[str, Any], **_: Any) -> None:
        if str(params.get("url_path", "")).endswith("/d/b"):  # the request, serialised
            raise botocore.exceptions.ClientError(
                {
                    "Error": {"Code": "AccessDenied", "Message": "injected refusal"},
                    "ResponseMetadata": {"HTTPStatusCode": 403},
                },
                "GetObject",
            )

    events = st.s3_client().meta.events
    events.register("before-call.s3.GetObject", refuse_b)
    try:
        with pytest.raises(StorageError, match="reading 'd/b'") as caught:
            st.read_many(["d/a", "d/b", "d/absent"])
        assert caught.value.retriable
        with pytest.raises(StorageError, match="reading 'd/b'"):
            st.read("d/b")
        # Absent is still absent.
        assert st.read_many(["d/a", "d/absent"]) == {"d/a": b"A"}
    finally:
        events.unregister("before-call.s3.GetObject", refuse_b)
        if sender is not None:
            sender.before_send.remove(refuse_b_directly)


def test_read_many_raises_when_a_read_fails_on_a_wrapped_filesystem(tmp_path: Path) -> None:
    inner = Storage(str(tmp_path / "ks"))
    inner.put_if_absent("d/a", b"A")
    inner.put_if_absent("d/b", b"B")
    url, options = wrap_url(
        str(tmp_path / "ks"), faults=[{"op": "read", "kind": "fail", "path": "/d/b$"}]
    )
    st = Storage(url, options)
    assert st.is_remote  # the concurrent path of read_many
    with pytest.raises(StorageError, match="reading 'd/b'"):
        st.read_many(["d/a", "d/b", "d/absent"])
    assert st.read_many(["d/a", "d/absent"]) == {"d/a": b"A"}


def test_a_whole_file_read_is_one_get_and_no_head(s3_store: tuple[str, dict[str, Any]]) -> None:
    st = Storage(*s3_store)
    small = b"x" * 100
    large = os.urandom(6 << 20)  # above s3fs's block size, where it would split the read
    st.put_if_absent("r/small", small)
    st.put_if_absent("r/large", large)
    for rel, data in (("r/small", small), ("r/large", large)):
        with st.count_requests() as counts:
            assert st.read(rel) == data
        assert dict(counts) == {"GET": 1}, (rel, counts)
    with st.count_requests() as counts:
        assert st.read_if_exists("r/absent") is None
    assert dict(counts) == {"GET": 1}
    with st.count_requests() as counts:
        found = st.read_many(["r/small", "r/large", "r/absent"])
    assert found == {"r/small": small, "r/large": large}
    assert dict(counts) == {"GET": 3}
    with st.count_requests() as counts:
        st.put_new(f"r/{unique_id()}", b"segment")
        st.list_dir("r")
        st.delete(["r/small"])
    assert dict(counts) == {"PUT": 1, "LIST": 1, "DELETE": 1}


def test_read_ranges_coalesces_near_ranges_into_one_get(
    s3_store: tuple[str, dict[str, Any]],
) -> None:
    st = Storage(*s3_store)
    data = os.urandom(1 << 20)
    st.put_if_absent("r/segment", data)
    asked = [(0, 100), (100, 200), (50, 150), (300_000, 300_010), (900_000, 1 << 20)]
    expected = [data[lo:hi] for lo, hi in asked]
    with st.count_requests() as counts:
        assert st.read_ranges("r/segment", asked, gap=1 << 20) == expected
    assert dict(counts) == {"GET": 1}
    with st.count_requests() as counts:
        assert st.read_ranges("r/segment", asked, gap=0) == expected
    assert dict(counts) == {"GET": 3}  # the three overlapping ranges share one
    with st.count_requests() as counts:
        assert st.read_ranges("r/segment", asked) == expected  # 64 KiB: near ones merge
    assert dict(counts) == {"GET": 3}
    with st.count_requests() as counts:
        assert st.read_ranges("r/segment", [(2 << 20, (2 << 20) + 5)]) == [b""]  # a 416
    assert dict(counts) == {"GET": 1}


@pytest.mark.s3
def test_a_tree_of_several_pages_lists_and_deletes_whole(
    moto_store: tuple[str, dict[str, Any]],
) -> None:
    st = Storage(*moto_store)
    names = {f"{i:05d}.json" for i in range(1005)}  # two pages of at most 1000 keys
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda name: st.put_if_absent(f"log/{name}", b"{}"), names))
    st.put_if_absent("log/sub/deeper.json", b"{}")
    st.put_if_absent("logs-beside/x", b"{}")
    with st.count_requests() as counts:
        listing = st.list_dir("log")
    assert {info.name for info in listing} == names | {"sub"}
    assert all(info.size == 2 and info.mtime_ms for info in listing if info.name != "sub")
    assert dict(counts) == {"LIST": 2}
    with st.count_requests() as counts:
        assert st.list_dir("absent") == []
    assert dict(counts) == {"LIST": 1}
    # Deleting the tree: two LIST pages, two bulk DELETEs of at most 1,000 keys, then one
    # DELETE per directory entry (log/sub, log).
    with st.count_requests() as counts:
        st.delete_tree("log")
    assert dict(counts) == {"LIST": 2, "DELETE": 4}
    assert st.list_dir("log") == []
    assert st.read("logs-beside/x") == b"{}"


def test_count_requests_is_for_s3_only(tmp_path: Path) -> None:
    with (
        pytest.raises(InvalidStoreError, match="not on S3"),
        Storage(str(tmp_path)).count_requests(),
    ):
        pass


# --- a segment PUT sent again after its answer was lost ------------------------------------------


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "s3fs"])
def test_send_succeeds_when_a_segment_put_is_sent_again_after_its_answer_was_lost(
    s3_store: tuple[str, dict[str, Any]], direct: bool
) -> None:
    """The data object (written as a segment is; not data the commit carries, PROTOCOL.md
    11.8)."""
    url, options = s3_store
    options = {**options, "s3_direct_requests": direct}
    Store(url, options).create_topic("t", 1, {"commit.inline.bytes": 0})
    written = "/_data/"
    producer = Producer(url, storage_options=options, acks=1, linger_ms=0, retries=5)
    lost: list[str] = []

    def lose_first_direct_answer(method: str, key: str, status: int) -> bool:
        # As below, on the direct path: the PUT landed, its answer is lost, it is sent again.
        if method == "PUT" and written in f"/{key}" and status == 200 and not lost:
            lost.append(key)
            return True
        return False

    sender = producer.store.storage.direct_requests()
    assert (sender is not None) == direct
    if sender is not None:
        sender.after_answer.append(lose_first_direct_answer)

    def lose_first_segment_answer(
        response: Any, request_dict: dict[str, Any], **_: Any
    ) -> float | None:
        # The PUT landed (200), but its answer is "lost": botocore sends it again at once,
        # and the second PUT gets 412 because the first one created the object.
        url_path = str(request_dict.get("url_path", ""))
        status = response[0].status_code if response else None
        if written in url_path and status == 200 and not lost:
            lost.append(url_path)
            return 0.0
        return None

    events = producer.store.storage.s3_client().meta.events
    events.register_first("needs-retry.s3.PutObject", lose_first_segment_answer)
    try:
        metadata = producer.send("t", value=b"once", key=b"k").get(timeout=60)
        producer.flush()
    finally:
        events.unregister("needs-retry.s3.PutObject", lose_first_segment_answer)
        if sender is not None:
            sender.after_answer.remove(lose_first_direct_answer)
        producer.close()
    assert len(lost) == 1  # the lost answer was injected (and the retry got "exists")
    assert metadata.offset == 0
    with Consumer("t", store=Store(url, options), auto_offset_reset="earliest") as consumer:
        records = [r for batch in consumer.poll(timeout_ms=5000).values() for r in batch]
    assert [(r.key, r.value, r.offset) for r in records] == [(b"k", b"once", 0)]


# --- a create sent again after its answer was lost (direct requests) ---------------------------


def test_a_create_whose_answer_was_lost_succeeds_and_another_writers_stands(
    s3_store: tuple[str, dict[str, Any]],
) -> None:
    """The direct path sends an unanswered PUT again; the retry of a create that landed gets
    412. It reads the object back: its own bytes are its own create (seen in CI under load, a
    fresh key's first create reported as "exists"); another writer's bytes are a refusal."""
    url, options = s3_store
    storage = Storage(url, options)
    sender = storage.direct_requests()
    assert sender is not None
    storage.put_if_absent("taken", b"theirs")
    lost: list[tuple[str, int]] = []

    def lose_first_answer(method: str, key: str, status: int) -> bool:
        if method == "PUT" and not any(k == key for k, _ in lost):
            lost.append((key, status))
            return True
        return False

    sender.after_answer.append(lose_first_answer)
    try:
        storage.put_if_absent("fresh", b"mine")
        with pytest.raises(FileExistsError):
            storage.put_if_absent("taken", b"mine")
    finally:
        sender.after_answer.remove(lose_first_answer)
    assert [status for key, status in lost if key.endswith("fresh")] == [200]  # it had landed
    assert [status for key, status in lost if key.endswith("taken")] == [412]
    assert storage.read("fresh") == b"mine"
    assert storage.read("taken") == b"theirs"
    with pytest.raises(FileExistsError):  # a later create, answered, is refused as before
        storage.put_if_absent("fresh", b"mine")
