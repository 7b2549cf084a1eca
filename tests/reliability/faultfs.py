"""A fault-injecting fsspec filesystem, for reliability tests.

``FaultFileSystem`` (protocol ``faultfs``) wraps a real fsspec filesystem (``file``, ``memory``
or ``s3``) and, by rule, makes its operations:

- ``fail``: raise before anything happened (the write did not land);
- ``ambiguous``: do the operation, then raise (it landed, the caller is told it failed);
- ``delay``: sleep, then do it;
- ``truncate``: write only a prefix of the data, then raise (a torn write that is reported).

and can crash the process (``os._exit``) at a named point of the commit protocol:

- ``segment-written``: a segment file or a data object (layout 3) has landed, its commit has
  not been attempted;
- ``commit-landed``: a log version (``_log/<version>.json``, or ``_log.<k>/`` for topic log
  *k* of layout 3) has landed, the writer has not been told;
- ``checkpoint-write``: while a checkpoint or one of its sidecars (layout 3) is written (on a
  local target a partial temporary file is left behind, as a process dying inside ``write``
  would leave it);
- ``before-commit``: a log version is about to be written.

A crash rule with ``"action": "stop"`` pauses the process there instead (it sends itself
SIGSTOP and carries on once someone sends SIGCONT): a writer paused between its segment write
and its commit, for as long as the test wants. Such pauses are counted as ``pause:<point>``.

A ``Storage`` runs over it with the target's put-if-absent semantics through the hook of
``kstore/storage/fsspec_other.py``: the instance's ``kstore_atomic_create`` names the kind it
forwards to (``if-none-match`` for S3, ``link`` for the local disk, ``lock`` for memory), and its
``pipe_file(..., mode="create")`` keeps that kind's atomicity.

Everything is configured through storage options, so a ``Storage`` (and a ``Store``) over it
pickles and can be rebuilt in a subprocess from its URL and a JSON of its options::

    url, options = wrap_url("file:///tmp/ks", faults=[...], crashes=[...], seed=7)
    store = Store(url, options)

Truncation is only meaningful for files that are overwritten (``put``: hints, leases) or whose
writer is told the write failed and never uses it (segments); a torn *commit* file is permanent
corruption that readers must refuse (tested separately), since no supported backend ever lets
one appear. Every injection is appended, one line each, to ``events_path`` when given
(``O_APPEND`` survives ``kill -9`` of the writer), so a run can count faults across processes.
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import random
import re
import signal
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import fsspec
from fsspec.spec import AbstractFileSystem

from tests.reliability import jumps

PROTOCOL = "faultfs"
CRASH_EXIT_CODE = 86  # os._exit code of an injected crash
CAT_THREADS = 32  # reads of one cat() at once on S3, as kstore's own S3 path reads

# Operation names of rules, and the fsspec calls they stand for.
OPS = ("create", "put", "read", "list", "exists", "delete")
KINDS = ("fail", "ambiguous", "delay", "truncate")
CRASH_POINTS = ("segment-written", "commit-landed", "checkpoint-write", "before-commit")

# Layout 2 and 3 paths: partition logs and topic logs (``_log``, ``_log.<k>``), checkpoints
# and their sidecars, segment files and data objects.
_COMMIT = re.compile(r"/_log(\.\d+)?/\d{20}\.json$")
# Sidecars of topic logs at version 4 are compressed: ``.json.gz``.
_CHECKPOINT = re.compile(r"(/_log(\.\d+)?/\d{20}\.checkpoint\.json|/_sidecars/[^/]+\.json(\.gz)?)$")
_SEGMENT = re.compile(r"(/segments/[^/]+\.(arrow|parquet)|/_data/[^/]+\.kdat)$")
_MEMORY_LOCK = threading.Lock()


class InjectedFaultError(OSError):
    """The error an injected failure raises (an I/O error, never FileNotFoundError)."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EIO, message)


@dataclass
class Rule:
    op: str  # one of OPS, or "*"
    kind: str  # one of KINDS
    p: float = 1.0  # probability per matching operation
    path: str = ""  # regular expression searched in the path ("" matches all)
    times: int | None = None  # at most this many injections in this process
    delay_s: float = 0.05

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> Rule:
        rule = cls(**dict(spec))
        if rule.op not in OPS and rule.op != "*":
            raise ValueError(f"unknown fault op {rule.op!r}; known: {OPS}")
        if rule.kind not in KINDS:
            raise ValueError(f"unknown fault kind {rule.kind!r}; known: {KINDS}")
        return rule


@dataclass
class Crash:
    point: str  # one of CRASH_POINTS
    p: float = 0.0  # probability at each passage of the point
    at: int | None = None  # or: crash at exactly this passage (1-based)
    path: str = ""
    # "exit": os._exit (a crash); "stop": the process SIGSTOPs itself there (a pause, until
    # someone sends SIGCONT), then carries on.
    action: str = "exit"

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> Crash:
        crash = cls(**dict(spec))
        if crash.point not in CRASH_POINTS:
            raise ValueError(f"unknown crash point {crash.point!r}; known: {CRASH_POINTS}")
        if crash.action not in ("exit", "stop"):
            raise ValueError(f"unknown crash action {crash.action!r}; known: exit, stop")
        return crash


def wrap_url(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    faults: Sequence[Mapping[str, Any]] = (),
    crashes: Sequence[Mapping[str, Any]] = (),
    seed: int | None = None,
    events_path: str | None = None,
    clock_path: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """The ``(url, storage_options)`` of a store at ``url`` reached through the wrapper."""
    register()
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "file", os.path.abspath(url)
    target = scheme.lower()
    if target in ("file", "local"):
        target, root = "file", rest
    elif target in ("s3", "s3a"):
        target, root = "s3", rest
    elif target == "memory":
        root = rest
    else:
        raise ValueError(f"faultfs cannot wrap {scheme!r}")
    options: dict[str, Any] = {
        "target_protocol": target,
        "target_options": dict(storage_options or {}),
        "faults": [dict(f) for f in faults],
        "crashes": [dict(c) for c in crashes],
        "seed": seed,
        "events_path": events_path,
        "clock_path": clock_path,
    }
    return f"{PROTOCOL}:///{root.lstrip('/')}", options


def register() -> None:
    """Make ``faultfs://`` known to fsspec in this process (idempotent)."""
    fsspec.register_implementation(PROTOCOL, FaultFileSystem, clobber=True)


def read_events(path: str) -> list[dict[str, Any]]:
    """The injections recorded in an events file (every process's)."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a line cut by a crash of the machine (never of a process)
    return out


class FaultFileSystem(AbstractFileSystem):  # type: ignore[misc]
    protocol = PROTOCOL
    cachable = False  # every Storage gets its own instance: own rules, own counters
    # The class declares the hook; the instance says which kind it forwards to.
    kstore_atomic_create: ClassVar[str | None] = "forwarded"

    def __init__(
        self,
        target_protocol: str,
        target_options: Mapping[str, Any] | None = None,
        faults: Iterable[Mapping[str, Any]] = (),
        crashes: Iterable[Mapping[str, Any]] = (),
        seed: int | None = None,
        events_path: str | None = None,
        clock_path: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # Times the target reports, shifted by the run's jumps of time (tests/reliability/jumps.py).
        self.clock_path = clock_path
        options = dict(target_options or {})
        if target_protocol == "s3":
            # As Storage does for s3://: no listings cache, or tailing readers never see
            # versions other processes commit.
            options.setdefault("use_listings_cache", False)
        self.target_protocol = target_protocol
        self.target = fsspec.filesystem(target_protocol, **options)
        self.kstore_atomic_create = {"s3": "if-none-match", "file": "link", "memory": "lock"}[
            target_protocol
        ]
        self.rules = [Rule.of(f) for f in faults]
        self.crashes = [Crash.of(c) for c in crashes]
        self.rng = random.Random(seed)
        self.events_path = events_path
        self.injected: dict[str, int] = {}
        self._passages: dict[tuple[str, str], int] = {}
        self._durable_dirs: set[str] = set()
        self._lock = threading.Lock()
        self.enabled = True

    # -- rules ----------------------------------------------------------------------------------

    def _record(self, what: str, op: str, path: str) -> None:
        self.injected[what] = self.injected.get(what, 0) + 1
        if self.events_path:
            line = json.dumps({"what": what, "op": op, "path": path, "pid": os.getpid()}) + "\n"
            fd = os.open(self.events_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)

    def _pick(self, op: str, path: str) -> Rule | None:
        if not self.enabled:
            return None
        with self._lock:
            for rule in self.rules:
                if rule.op not in (op, "*") or (rule.path and not re.search(rule.path, path)):
                    continue
                if rule.kind == "truncate" and op not in ("create", "put"):
                    continue
                if rule.times is not None and rule.times <= 0:
                    continue
                if self.rng.random() >= rule.p:
                    continue
                if rule.times is not None:
                    rule.times -= 1
                self._record(rule.kind, op, path)
                return rule
        return None

    def _crash_point(self, point: str, path: str) -> bool:
        """True when the process must crash here; a ``stop`` rule pauses it here instead."""
        if not self.enabled:
            return False
        stop = False
        with self._lock:
            for crash in self.crashes:
                if crash.point != point or (crash.path and not re.search(crash.path, path)):
                    continue
                n = self._passages[(point, crash.action)] = (
                    self._passages.get((point, crash.action), 0) + 1
                )
                if (crash.at is not None and n == crash.at) or (
                    crash.at is None and self.rng.random() < crash.p
                ):
                    if crash.action == "stop":
                        self._record(f"pause:{point}", "create", path)
                        stop = True
                        break
                    self._record(f"crash:{point}", "create", path)
                    return True
        if stop:  # outside the lock: other threads of the process carry on until it lands
            os.kill(os.getpid(), signal.SIGSTOP)
        return False

    def _die(self) -> None:
        os._exit(CRASH_EXIT_CODE)

    def _run(self, op: str, path: str, call: Any) -> Any:
        rule = self._pick(op, path)
        if rule is None:
            return call()
        if rule.kind == "fail":
            raise InjectedFaultError(f"injected failure before {op} of {path}")
        if rule.kind == "delay":
            time.sleep(rule.delay_s)
            return call()
        # ambiguous
        call()
        raise InjectedFaultError(f"injected failure after {op} of {path} (it landed)")

    # -- paths ----------------------------------------------------------------------------------

    def _t(self, path: str) -> str:
        path = self._strip_protocol(path)
        if self.target_protocol in ("file", "memory"):
            return "/" + path.lstrip("/")
        return path.lstrip("/")

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        if path.startswith(f"{PROTOCOL}://"):
            path = path[len(PROTOCOL) + 3 :]
        return path.rstrip("/")

    # -- writes ---------------------------------------------------------------------------------

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        target = self._t(path)
        create = mode == "create"
        op = "create" if create else "put"
        if create and _COMMIT.search(target) and self._crash_point("before-commit", target):
            self._die()
        if create and _CHECKPOINT.search(target) and self._crash_point("checkpoint-write", target):
            if self.target_protocol == "file":  # what a process dying inside write() leaves
                tmp = os.path.join(os.path.dirname(target), f".tmp-{uuid.uuid4().hex}")
                os.makedirs(os.path.dirname(tmp), exist_ok=True)
                with open(tmp, "wb") as f:
                    f.write(value[: len(value) // 2])
            self._die()
        rule = self._pick(op, target)
        if rule is not None and rule.kind == "truncate":
            cut = bytes(value[: max(1, len(value) // 2)])
            self._write(target, cut, create=create)
            raise InjectedFaultError(
                f"injected torn write of {path} ({len(cut)} of {len(value)} bytes)"
            )
        if rule is not None and rule.kind == "fail":
            raise InjectedFaultError(f"injected failure before {op} of {path}")
        if rule is not None and rule.kind == "delay":
            time.sleep(rule.delay_s)
        self._write(target, bytes(value), create=create)
        if create and _SEGMENT.search(target) and self._crash_point("segment-written", target):
            self._die()
        if create and _COMMIT.search(target) and self._crash_point("commit-landed", target):
            self._die()
        if rule is not None and rule.kind == "ambiguous":
            raise InjectedFaultError(f"injected failure after {op} of {path} (it landed)")

    def _write(self, target: str, data: bytes, *, create: bool) -> None:
        if not create:
            if self.target_protocol == "file":  # readers see the old or the new file, never half
                directory = self._durable_dir(target)
                tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
                _write_synced(tmp, data)
                os.replace(tmp, target)
                _fsync_dir(directory)
            else:
                self.target.pipe_file(target, data)
            return
        if self.target_protocol == "s3":
            self.target.pipe_file(target, data, mode="create")
        elif self.target_protocol == "file":
            directory = self._durable_dir(target)
            tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
            _write_synced(tmp, data)
            try:
                os.link(tmp, target)  # atomic; EEXIST when another writer won
            finally:
                os.unlink(tmp)
            _fsync_dir(directory)
        else:
            with _MEMORY_LOCK:
                if self.target.exists(target):
                    raise FileExistsError(errno.EEXIST, "exists", target)
                self.target.pipe_file(target, data)

    def _durable_dir(self, target: str) -> str:
        """The directory of ``target``, created if missing, every level of it durable: local
        writes are as durable as kstore's own (fsync of the file and of each directory), so a
        simulated machine crash (tests/reliability/machine.py) loses nothing they wrote."""
        directory = os.path.dirname(target)
        if directory not in self._durable_dirs:
            os.makedirs(directory, exist_ok=True)
            level = directory
            while level not in self._durable_dirs and os.path.dirname(level) != level:
                _fsync_dir(os.path.dirname(level))
                self._durable_dirs.add(level)
                level = os.path.dirname(level)
        return directory

    def rm_file(self, path: str) -> None:
        target = self._t(path)
        self._run("delete", target, lambda: self.target.rm_file(target))

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        paths = [path] if isinstance(path, str) else list(path)
        for p in paths:
            target = self._t(p)
            self._run("delete", target, lambda t=target: self.target.rm(t, recursive=recursive))

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        self.target.makedirs(self._t(path), exist_ok=exist_ok)

    # -- reads ----------------------------------------------------------------------------------

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kw: Any
    ) -> Any:
        target = self._t(path)
        # One GET on S3, as kstore's own S3 path sends: s3fs's cat_file asks for the size first
        # (a HEAD) unless told to fetch in one piece, so every read through this wrapper cost
        # two requests.
        one_piece = {"max_concurrency": 1} if self.target_protocol == "s3" else {}
        return self._run(
            # By keyword: s3fs's cat_file takes version_id before start and end.
            "read",
            target,
            lambda: self.target.cat_file(target, start=start, end=end, **one_piece),
        )

    def cat(
        self, path: Any, recursive: bool = False, on_error: str = "raise", **kwargs: Any
    ) -> Any:
        paths = [path] if isinstance(path, str) else list(path)

        def one(p: str) -> bytes | None:
            try:
                data: bytes = self.cat_file(p)
                return data
            except FileNotFoundError:
                if on_error == "raise":
                    raise
            except Exception:
                if on_error != "return":
                    raise
            return None

        if self.target_protocol == "s3" and len(paths) > 1:
            # Concurrently, as kstore's own S3 path reads many files (a partition's commits,
            # a poll's segments); one at a time, a group member's first poll took seconds more.
            with concurrent.futures.ThreadPoolExecutor(min(len(paths), CAT_THREADS)) as pool:
                found = list(pool.map(one, paths))
        else:
            found = [one(p) for p in paths]
        out = {p: data for p, data in zip(paths, found, strict=True) if data is not None}
        return out[path] if isinstance(path, str) else out

    def exists(self, path: str, **kwargs: Any) -> bool:
        target = self._t(path)
        return bool(self._run("exists", target, lambda: self.target.exists(target)))

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        target = self._t(path)
        found: dict[str, Any] = self._run("exists", target, lambda: self.target.info(target))
        return self._jumped(found)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        target = self._t(path)
        items: list[Any] = self._run("list", target, lambda: self.target.ls(target, detail=True))
        if not detail:
            return [str(i["name"]) for i in items]
        return [self._jumped(item) for item in items]

    def _jumped(self, info: dict[str, Any]) -> dict[str, Any]:
        if self.clock_path is None:
            return info
        return jumps.shift_times(self.clock_path, info)

    def find(self, path: str, **kwargs: Any) -> Any:
        return self.target.find(self._t(path), **kwargs)

    def invalidate_cache(self, path: str | None = None) -> None:
        self.target.invalidate_cache(None if path is None else self._t(path))

    def counts(self) -> dict[str, int]:
        return dict(self.injected)


def _write_synced(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fault_counts(events: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Injections by kind (``fail``, ``ambiguous``, ``crash:commit-landed``, ...)."""
    out: dict[str, int] = {}
    for event in events:
        what = str(event.get("what"))
        out[what] = out.get(what, 0) + 1
    return dict(sorted(out.items()))


def wrapper_of(storage: Any) -> FaultFileSystem:
    """The FaultFileSystem under a Storage (to turn faults off or read its counters)."""
    fs = storage.fs
    if not isinstance(fs, FaultFileSystem):
        raise TypeError(f"{storage!r} does not run over faultfs")
    return fs
