"""S3 GETs and PUTs sent straight over HTTP (kstore.storage.s3direct): the same answers as through
s3fs on moto and SeaweedFS, the fallbacks to s3fs, and the failures a scripted server gives
(retried, refused, named without credentials)."""

from __future__ import annotations

import http.server
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kstore.errors import InvalidStoreError, StorageError
from kstore.storage import Storage

S3_BACKENDS = [
    pytest.param("moto", marks=pytest.mark.s3),
    pytest.param("seaweed", marks=pytest.mark.s3),
]


@pytest.fixture(params=S3_BACKENDS)
def s3_store(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    url, options = request.getfixturevalue(f"{request.param}_store")
    return url, options


def test_direct_and_s3fs_requests_see_the_same_objects(
    s3_store: tuple[str, dict[str, Any]],
) -> None:
    url, options = s3_store
    direct = Storage(url, options)
    plain = Storage(url, {**options, "s3_direct_requests": "false"})
    assert direct.direct_requests() is not None
    assert plain.direct_requests() is None
    body = os.urandom(200_000)
    direct.put_if_absent("o/a b+c%.bin", body)  # a key that must be quoted
    assert plain.read("o/a b+c%.bin") == body
    with pytest.raises(FileExistsError):
        direct.put_if_absent("o/a b+c%.bin", b"other")
    with pytest.raises(FileExistsError):
        plain.put_if_absent("o/a b+c%.bin", b"other")
    plain.put("o/hint", b"1")
    direct.put("o/hint", b"22")  # an overwrite
    assert plain.read("o/hint") == b"22"
    assert direct.read_if_exists("o/absent") is None
    with pytest.raises(FileNotFoundError):
        direct.read("o/absent")
    ranges = [(0, 10), (150_000, 150_100), (199_990, 200_000), (250_000, 250_010)]
    assert direct.read_ranges("o/a b+c%.bin", ranges, gap=0) == [
        body[0:10],
        body[150_000:150_100],
        body[199_990:200_000],
        b"",  # past the end
    ]
    assert direct.read_many(["o/hint", "o/absent", "o/a b+c%.bin"]) == {
        "o/hint": b"22",
        "o/a b+c%.bin": body,
    }
    with direct.count_requests() as counts:
        direct.read("o/hint")
        direct.put("o/hint", b"3")
        direct.read_many(["o/hint", "o/absent"])
    assert dict(counts) == {"GET": 3, "PUT": 1}


def test_the_option_is_checked_and_other_request_arguments_keep_s3fs(
    moto_store: tuple[str, dict[str, Any]],
) -> None:
    url, options = moto_store
    with pytest.raises(InvalidStoreError, match="s3_direct_requests"):
        Storage(url, {**options, "s3_direct_requests": "sometimes"})
    # Server-side encryption arguments go with every PUT s3fs sends; the direct path does not
    # send them, so such a store keeps s3fs.
    encrypted = Storage(
        url, {**options, "s3_additional_kwargs": {"ServerSideEncryption": "AES256"}}
    )
    assert encrypted.direct_requests() is None
    encrypted.put_if_absent("e/x", b"x")
    assert encrypted.read("e/x") == b"x"


class ScriptedS3(http.server.ThreadingHTTPServer):
    """Answers each request with the next of a script of (status, body); records requests."""

    def __init__(self, script: list[tuple[int, bytes]]) -> None:
        self.script = list(script)
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def endpoint_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: ScriptedS3

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        with self.server.lock:
            headers = {k.lower(): v for k, v in self.headers.items()}
            self.server.requests.append((self.command, self.path, headers))
            status, body = self.server.script.pop(0) if self.server.script else (500, b"")
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = _answer  # noqa: N815

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[ScriptedS3]:
    server = ScriptedS3([])
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _storage(server: ScriptedS3) -> Storage:
    return Storage(
        "s3://bucket/ks",
        {
            "key": "kstore-test",
            "secret": "kstore-test-secret",
            "client_kwargs": {"endpoint_url": server.endpoint_url, "region_name": "us-east-1"},
            "timeout_ms": 5000,
        },
    )


def _error(code: str) -> bytes:
    return f"<Error><Code>{code}</Code><Message>m</Message></Error>".encode()


def test_throttling_and_server_errors_are_retried(scripted: ScriptedS3) -> None:
    scripted.script = [(503, _error("SlowDown")), (500, _error("InternalError")), (200, b"data")]
    st = _storage(scripted)
    assert st.direct_requests() is not None
    assert st.read("a") == b"data"
    assert [(m, p) for m, p, _ in scripted.requests] == [("GET", "/bucket/ks/a")] * 3
    signed = scripted.requests[0][2]
    assert signed["authorization"].startswith("AWS4-HMAC-SHA256 Credential=kstore-test/")
    assert "kstore-test-secret" not in str(scripted.requests)


def test_an_error_answered_three_times_fails_naming_it_and_no_credential(
    scripted: ScriptedS3,
) -> None:
    scripted.script = [(500, _error("InternalError"))] * 3
    st = _storage(scripted)
    with pytest.raises(StorageError, match="HTTP 500 InternalError") as caught:
        st.read("a")
    assert "kstore-test-secret" not in str(caught.value)
    assert len(scripted.requests) == 3


def test_a_refused_request_is_not_retried(scripted: ScriptedS3) -> None:
    scripted.script = [(403, _error("SignatureDoesNotMatch"))]
    st = _storage(scripted)
    with pytest.raises(StorageError, match="403 SignatureDoesNotMatch") as caught:
        st.put("a", b"x")
    assert "kstore-test-secret" not in str(caught.value)
    assert len(scripted.requests) == 1


def test_a_conditional_put_sends_if_none_match_and_reads_412_as_exists(
    scripted: ScriptedS3,
) -> None:
    scripted.script = [(200, b""), (412, _error("PreconditionFailed"))]
    st = _storage(scripted)
    st.put_if_absent("c", b"first")
    with pytest.raises(FileExistsError):
        st.put_if_absent("c", b"second")
    for method, path, headers in scripted.requests:
        assert (method, path, headers.get("if-none-match")) == ("PUT", "/bucket/ks/c", "*")
        assert headers["x-amz-content-sha256"] != "UNSIGNED-PAYLOAD"  # the body is signed


def test_a_stray_report_of_a_lost_body_write_is_dropped_and_nothing_else() -> None:
    """asyncio reports aiohttp's body-writing task that failed on a connection the server closed
    (the request itself was retried or raised): that report alone is dropped."""
    import logging

    from aiohttp.client_exceptions import ClientConnectionResetError

    from kstore.storage.s3direct import _WriteOfALostRequest

    def record(message: str, exc: BaseException | None) -> logging.LogRecord:
        info = (type(exc), exc, None) if exc is not None else None
        return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, message, (), info)

    drop = _WriteOfALostRequest()
    lost = ClientConnectionResetError("Cannot write to closing transport")
    stray = "Task exception was never retrieved\\nfuture: <Task finished coro=<ClientRequest.write_bytes() done>"
    assert not drop.filter(record(stray, lost))
    assert drop.filter(record("Task exception was never retrieved", ValueError("other")))
    assert drop.filter(record("write_bytes", None))
    assert drop.filter(record("Task exception was never retrieved coro=<other()>", lost))
