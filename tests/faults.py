"""Fault injection at the storage boundary, for tests.

``FaultyStorage`` wraps a real :class:`kstore.storage.Storage` and, by rule, fails operations
before they happen (the write did not land) or after they happen (the write landed but the
caller is told it failed: the ambiguous case), or delays them.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kstore.errors import StorageError
from kstore.storage import Storage


@dataclass
class Fault:
    op: str  # "put_if_absent", "put_new" (segments), "put", "read", ...
    when: str = "before"  # "before": nothing happens; "after": it happened, but we say it failed
    probability: float = 1.0
    times: int | None = None  # at most this many injections (None: unlimited)
    match: Callable[[str], bool] = field(default=lambda path: True)
    delay_s: float = 0.0


class FaultyStorage(Storage):
    """A Storage whose operations fail according to the installed faults."""

    def __init__(self, inner: Storage, seed: int | None = None) -> None:
        super().__init__(
            inner.url, inner.storage_options, allow_unsafe_writes=inner.allow_unsafe_writes
        )
        self._faults: list[Fault] = []
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.injected: dict[str, int] = {}

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def _pick(self, op: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.op != op or not fault.match(path):
                    continue
                if fault.times is not None and fault.times <= 0:
                    continue
                if self._rng.random() >= fault.probability:
                    continue
                if fault.times is not None:
                    fault.times -= 1
                key = f"{op}:{fault.when}"
                self.injected[key] = self.injected.get(key, 0) + 1
                return fault
        return None

    def _run(self, op: str, path: str, call: Callable[[], Any]) -> Any:
        fault = self._pick(op, path)
        if fault is None:
            return call()
        if fault.delay_s:
            time.sleep(fault.delay_s)
        if fault.when == "before":
            raise StorageError(f"injected failure before {op} {path}")
        if fault.when == "after":
            call()
            raise StorageError(f"injected failure after {op} {path} (it landed)")
        return call()  # "delay" only

    def put_if_absent(self, rel: str, data: bytes, *, durable: bool = True) -> None:
        self._run(
            "put_if_absent",
            rel,
            lambda: super(FaultyStorage, self).put_if_absent(rel, data, durable=durable),
        )

    def put_new(self, rel: str, data: bytes | memoryview, *, durable: bool = True) -> None:
        self._run(
            "put_new",
            rel,
            lambda: super(FaultyStorage, self).put_new(rel, data, durable=durable),
        )

    def put(self, rel: str, data: bytes, *, durable: bool = True) -> None:
        self._run("put", rel, lambda: super(FaultyStorage, self).put(rel, data, durable=durable))

    def read(self, rel: str) -> bytes:
        result: bytes = self._run("read", rel, lambda: super(FaultyStorage, self).read(rel))
        return result
