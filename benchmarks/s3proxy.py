"""An HTTP proxy in front of an S3 endpoint that answers as S3 does over a slower network.

For the benchmarks of many writers on one log (issue 42): SeaweedFS on loopback answers in
about 3 ms, and holds a losing conditional PUT for about a second (DESIGN.md section 8), where
S3 answers every request in tens of milliseconds and refuses a losing put-if-absent at once.
This proxy, in its own process, sits between the clients and SeaweedFS (or any S3 endpoint) and

* waits ``--delay-ms`` (default 20) after a request has arrived, before deciding or
  forwarding it: the round trip to S3, for every request;
* decides put-if-absent itself: a PUT (or a multipart completion) with ``If-None-Match: *``
  on a key it knows to exist gets 412 at once, without reaching the backend. Conditional
  writes of one key are serialised here, so the backend sees at most one at a time and its
  own answer (201/200, or 412 for a key that existed before the proxy saw it) settles the
  key's fate; a key is known to exist once a write of it succeeded or the backend refused
  one, and forgotten when a DELETE (or a multi-object delete naming it) succeeds;
* counts every request by method (``LIST`` for a GET of a bucket), status and prefix class of
  the key (``_log``, ``_flushes``, ``_data``, ``_sidecars``, ``groups``, other), with the
  put-if-absent writes by status and class and the 412s it decided itself apart, and the
  bytes each way; ``GET /__proxy/stats`` returns them as JSON
  (with the proxy's own CPU seconds, to check it is not the bottleneck) and
  ``POST /__proxy/reset`` zeroes them.

Requests pass through byte for byte: the request line and headers as sent (the ``Host`` the
client signed included, so SigV4 signatures stay valid), bodies by ``Content-Length`` or in
their HTTP chunked framing as they came (``aws-chunked`` bodies, checksums and Content-MD5 are
the body's and the headers' business, untouched), responses streamed back as they arrive.
Only hop-by-hop headers are dropped, and ``Expect: 100-continue`` is answered here (the body
is read before the request is decided). One asyncio loop serves every connection; the delay
is a timer, not a thread.

Run alone (prints its URL, then serves until its standard input closes):

    .venv/bin/python benchmarks/s3proxy.py --backend http://127.0.0.1:8333 --delay-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from html import unescape
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

STATS_PATH = "/__proxy/stats"
RESET_PATH = "/__proxy/reset"
CLASSES = ("_log", "_flushes", "_data", "_sidecars", "groups", "other")
_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "upgrade"}
)
_HEAD_LIMIT = 1 << 20
_DELETE_KEY = re.compile(rb"<Key>(.*?)</Key>", re.DOTALL)


def prefix_class(path: str) -> str:
    """The class of an object path (``/bucket/...``) for the counts: ``groups`` for anything
    under a ``groups/`` folder (a group's log and its pending commits), else the innermost
    folder that names a class (``_log.<k>`` and ``_flushes.<k>`` count as their base)."""
    segments = [s for s in path.split("/")[2:-1] if s]
    if "groups" in segments:
        return "groups"
    for segment in reversed(segments):
        for name in ("_flushes", "_sidecars", "_data", "_log"):
            if segment == name or segment.startswith(name + "."):
                return name
    return "other"


class Stats:
    """What the proxy saw, by (method, status, class)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests: collections.Counter[str] = collections.Counter()
        self.refused_here: collections.Counter[str] = collections.Counter()
        self.conditional: collections.Counter[str] = collections.Counter()
        self.bytes_in: collections.Counter[str] = collections.Counter()
        self.bytes_out: collections.Counter[str] = collections.Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        self.cpu_at_reset = time.process_time()
        self.since = time.time()

    def snapshot(self, delay_ms: float) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            "refused_here": dict(self.refused_here),
            "conditional": dict(self.conditional),
            "bytes_in": dict(self.bytes_in),
            "bytes_out": dict(self.bytes_out),
            "max_in_flight": self.max_in_flight,
            "cpu_seconds": time.process_time() - self.cpu_at_reset,
            "seconds": time.time() - self.since,
            "delay_ms": delay_ms,
        }


class _Request:
    def __init__(self, method: str, target: str, version: str, headers: list[tuple[str, str]]):
        self.method = method
        self.target = target
        self.version = version
        self.headers = headers
        parts = urlsplit(target)
        self.path = unquote(parts.path)
        self.query = parse_qs(parts.query, keep_blank_values=True)
        self.body = b""

    def header(self, name: str) -> str | None:
        name = name.lower()
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None

    @property
    def is_bucket(self) -> bool:
        return self.path.strip("/").count("/") == 0

    @property
    def kind(self) -> str:
        if self.method == "GET" and self.is_bucket:
            return "LIST"
        return self.method

    @property
    def cls(self) -> str:
        if self.kind == "LIST":
            prefix = self.query.get("prefix", [""])[0]
            return prefix_class(f"{self.path.rstrip('/')}/{prefix}")
        return prefix_class(self.path)

    @property
    def conditional_create(self) -> bool:
        """A put-if-absent: a PUT of a whole object or a multipart completion, If-None-Match *."""
        if (self.header("if-none-match") or "").strip() != "*":
            return False
        if self.method == "PUT":
            return "partNumber" not in self.query
        return self.method == "POST" and "uploadId" in self.query

    @property
    def creates(self) -> bool:
        """A write that makes the object exist when it succeeds."""
        if self.method == "PUT":
            return not self.is_bucket and "partNumber" not in self.query
        return self.method == "POST" and "uploadId" in self.query


class _Backend:
    """Keep-alive connections to the backend, reused one request at a time."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise SystemExit(f"--backend must be an http:// URL with a host, got {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def connection(
        self, fresh: bool
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        while self._idle and not fresh:
            reader, writer = self._idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer, True
            writer.close()
        reader, writer = await asyncio.open_connection(self.host, self.port, limit=_HEAD_LIMIT)
        return reader, writer, False

    def give_back(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._idle.append((reader, writer))


class Proxy:
    def __init__(self, backend: str, delay_ms: float) -> None:
        self.backend = _Backend(backend)
        self.delay_s = delay_ms / 1000
        self.delay_ms = delay_ms
        self.stats = Stats()
        self._created: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}

    # -- one client connection ---------------------------------------------------------------

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read_request(reader, writer)
                if request is None:
                    return
                keep = await self._handle(request, writer)
                if not keep:
                    return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            return
        except asyncio.CancelledError:  # the proxy is stopping: its connections with it
            return
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, request: _Request, writer: asyncio.StreamWriter) -> bool:
        if request.path in (STATS_PATH, RESET_PATH):
            if request.path == RESET_PATH:
                self.stats.reset()
            body = json.dumps(self.stats.snapshot(self.delay_ms)).encode()
            await _answer(writer, 200, "OK", body, "application/json")
            return True
        stats = self.stats
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        cls = request.cls
        stats.bytes_in[cls] += len(request.body)
        try:
            if self.delay_s > 0:
                await asyncio.sleep(self.delay_s)
            if request.conditional_create:
                status, keep = await self._create_if_absent(request, writer, cls)
                stats.conditional[f"{status} {cls}"] += 1
            else:
                status, keep = await self._forward(request, writer, cls)
                self._remember(request, status)
        finally:
            stats.in_flight -= 1
        stats.requests[f"{request.kind} {status} {cls}"] += 1
        return keep and (request.header("connection") or "").lower() != "close"

    async def _create_if_absent(
        self, request: _Request, writer: asyncio.StreamWriter, cls: str
    ) -> tuple[int, bool]:
        key = request.path
        # Kept for good: dropping a released lock could let a woken waiter and a newcomer
        # holding a fresh lock forward the same key at once.
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if key in self._created:
                self.stats.refused_here[cls] += 1
                await _answer(writer, 412, "Precondition Failed", _precondition_failed(key))
                return 412, True
            status, keep = await self._forward(request, writer, cls)
            if 200 <= status < 300 or status == 412:
                self._created.add(key)
        return status, keep

    def _remember(self, request: _Request, status: int) -> None:
        if not 200 <= status < 300:
            return
        if request.creates:
            self._created.add(request.path)
        elif request.method == "DELETE" and "uploadId" not in request.query:
            self._created.discard(request.path)
        elif request.method == "POST" and "delete" in request.query:
            bucket = request.path.strip("/").split("/", 1)[0]
            for found in _DELETE_KEY.finditer(request.body):
                key = unescape(found.group(1).decode("utf-8", "replace"))
                self._created.discard(f"/{bucket}/{key}")

    # -- forwarding --------------------------------------------------------------------------

    async def _forward(
        self, request: _Request, writer: asyncio.StreamWriter, cls: str
    ) -> tuple[int, bool]:
        """Send the request to the backend and stream its answer back; (status, keep-alive)."""
        lines = [f"{request.method} {request.target} HTTP/1.1"]
        for name, value in request.headers:
            lowered = name.lower()
            if lowered in _HOP_BY_HOP or lowered == "expect":
                continue
            lines.append(f"{name}: {value}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        for attempt in range(2):
            try:
                breader, bwriter, reused = await self.backend.connection(fresh=attempt > 0)
            except OSError:
                await _answer(writer, 502, "Bad Gateway", _error("ServiceUnavailable", "backend"))
                return 502, True
            try:
                bwriter.write(head + request.body)
                await bwriter.drain()
                response_head = await breader.readuntil(b"\r\n\r\n")
            except (ConnectionError, asyncio.IncompleteReadError):
                bwriter.close()
                if reused:
                    continue  # the backend closed an idle connection: once more, on a new one
                await _answer(writer, 502, "Bad Gateway", _error("ServiceUnavailable", "backend"))
                return 502, True
            break
        else:  # pragma: no cover - the loop always breaks or returns
            raise AssertionError
        status_line, *header_lines = response_head[:-4].split(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        headers = [
            (n.strip().decode("latin-1"), v.strip().decode("latin-1"))
            for n, v in (line.split(b":", 1) for line in header_lines if b":" in line)
        ]

        def header(name: str) -> str:
            return next((v for n, v in headers if n.lower() == name), "")

        backend_keeps = header("connection").lower() != "close"
        out = [status_line]
        out += [f"{n}: {v}".encode("latin-1") for n, v in headers if n.lower() not in _HOP_BY_HOP]
        no_body = request.method == "HEAD" or status in (204, 304) or 100 <= status < 200
        chunked = "chunked" in header("transfer-encoding").lower()
        length = header("content-length")
        until_close = not no_body and not chunked and not length
        out.append(b"Connection: close" if until_close else b"Connection: keep-alive")
        writer.write(b"\r\n".join(out) + b"\r\n\r\n")
        sent = 0
        if no_body:
            pass
        elif chunked:
            while True:
                size_line = await breader.readuntil(b"\r\n")
                writer.write(size_line)
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while True:
                        trailer = await breader.readuntil(b"\r\n")
                        writer.write(trailer)
                        if trailer == b"\r\n":
                            break
                    break
                chunk = await breader.readexactly(size + 2)
                sent += size
                writer.write(chunk)
                await writer.drain()
        else:
            remaining = int(length) if length else -1
            while remaining != 0:
                chunk = await breader.read(65536 if remaining < 0 else min(65536, remaining))
                if not chunk:
                    if remaining > 0:
                        raise ConnectionError("the backend closed mid-body")
                    break
                sent += len(chunk)
                remaining -= len(chunk) if remaining > 0 else 0
                writer.write(chunk)
                await writer.drain()
        await writer.drain()
        self.stats.bytes_out[cls] += sent
        if backend_keeps and not until_close:
            self.backend.give_back(breader, bwriter)
        else:
            bwriter.close()
        return status, not until_close


async def _read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> _Request | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise
        return None
    lines = head[:-4].decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    headers = [
        (name.strip(), value.strip())
        for name, value in (line.split(":", 1) for line in lines[1:] if ":" in line)
    ]
    request = _Request(method, target, version, headers)
    if (request.header("expect") or "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await writer.drain()
    if "chunked" in (request.header("transfer-encoding") or "").lower():
        parts = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            parts.append(size_line)
            size = int(size_line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while True:
                    trailer = await reader.readuntil(b"\r\n")
                    parts.append(trailer)
                    if trailer == b"\r\n":
                        break
                break
            parts.append(await reader.readexactly(size + 2))
        request.body = b"".join(parts)
    else:
        length = int(request.header("content-length") or 0)
        request.body = await reader.readexactly(length) if length else b""
    return request


async def _answer(
    writer: asyncio.StreamWriter,
    status: int,
    reason: str,
    body: bytes,
    content_type: str = "application/xml",
) -> None:
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nx-amz-request-id: {uuid.uuid4().hex[:16].upper()}\r\n"
        f"Date: {time.strftime('%a, %d %b %Y %H:%M:%S GMT', time.gmtime())}\r\n"
        "Server: kstore-s3proxy\r\nConnection: keep-alive\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + body)
    await writer.drain()


def _error(code: str, message: str, extra: str = "") -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{message}</Message>{extra}<RequestId>{uuid.uuid4().hex[:16]}</RequestId>"
        "</Error>"
    ).encode()


def _precondition_failed(key: str) -> bytes:
    # As S3 words it, <Condition> included (s3fs reads it to raise FileExistsError).
    return _error(
        "PreconditionFailed",
        "At least one of the pre-conditions you specified did not hold",
        "<Condition>If-None-Match</Condition>",
    )


async def _main(backend: str, delay_ms: float, port: int) -> None:
    proxy = Proxy(backend, delay_ms)
    server = await asyncio.start_server(
        proxy.serve, "127.0.0.1", port, limit=_HEAD_LIMIT, backlog=1024
    )
    host, bound = server.sockets[0].getsockname()[:2]
    print(f"http://{host}:{bound}", flush=True)
    loop = asyncio.get_running_loop()
    closed = loop.create_future()

    def watch_stdin() -> None:  # ends the proxy when its parent goes, however it goes
        sys.stdin.read()
        loop.call_soon_threadsafe(closed.set_result, None)

    threading.Thread(target=watch_stdin, daemon=True).start()
    async with server:
        await closed


# -- the proxy as a child process, for benchmarks and tests -----------------------------------


class ProxyProcess:
    """The proxy in a child process of its own (a CPU of its own, not the clients' GIL)."""

    def __init__(self, backend: str, delay_ms: float = 20.0) -> None:
        self.backend = backend
        self.delay_ms = delay_ms
        self.url = ""
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> ProxyProcess:
        self._process = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--backend",
                self.backend,
                "--delay-ms",
                str(self.delay_ms),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"the S3 proxy did not start (its error is on stderr): {line!r}")
        self.url = line
        return self

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.url + STATS_PATH, timeout=10) as answer:
            result: dict[str, Any] = json.loads(answer.read())
        return result

    def reset(self) -> dict[str, Any]:
        request = urllib.request.Request(self.url + RESET_PATH, data=b"", method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            result: dict[str, Any] = json.loads(answer.read())
        return result

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None
        with contextlib.suppress(OSError):
            process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


def behind(server: Any, proxy: ProxyProcess) -> Any:
    """A ``tests.servers.S3Server`` for ``server``'s storage reached through ``proxy``: its
    clients and stores talk to the proxy; each new store is a fresh prefix of one bucket (a
    SeaweedFS bucket takes volumes of its own)."""
    from tests.servers import S3Server

    class Proxied(S3Server):
        def __init__(self) -> None:
            self.endpoint_url = proxy.url
            self._bucket: str | None = None

        def new_store_url(self, prefix: str = "store") -> tuple[str, dict[str, Any]]:
            if self._bucket is None:
                self._bucket = self.create_bucket()
            url = f"s3://{self._bucket}/{prefix}-{uuid.uuid4().hex[:12]}"
            return url, self.storage_options()

    return Proxied()


def difference(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """The counts of ``after`` less those of ``before`` (two stats snapshots)."""
    out: dict[str, Any] = {}
    for name in ("requests", "refused_here", "conditional", "bytes_in", "bytes_out"):
        counts = collections.Counter(after.get(name, {}))
        counts.subtract(before.get(name, {}))
        out[name] = {k: v for k, v in counts.items() if v}
    out["cpu_seconds"] = after["cpu_seconds"] - before["cpu_seconds"]
    out["seconds"] = after["seconds"] - before["seconds"]
    out["max_in_flight"] = after["max_in_flight"]
    return out


def totals(requests: dict[str, int]) -> dict[str, int]:
    """Counts keyed "METHOD STATUS CLASS" summed over what a key leaves out: "PUT",
    "PUT 412", "PUT _log", "PUT 412 _log", "* 412" (any method) and "*" (every request)."""
    out: collections.Counter[str] = collections.Counter()
    for key, count in requests.items():
        method, status, cls = key.split(" ")
        for name in (
            method,
            f"{method} {status}",
            f"{method} {cls}",
            f"{method} {status} {cls}",
            f"* {status}",
            "*",
        ):
            out[name] += count
    return dict(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", required=True, help="the S3 endpoint, http://host:port")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="wait before each request")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    args = parser.parse_args()
    if args.delay_ms < 0:
        raise SystemExit("--delay-ms must be at least 0")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args.backend, args.delay_ms, args.port))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
