"""fsspec's in-process memory filesystem: tests and single-process use. Put-if-absent is a
check-then-write under a process-wide lock, which is atomic within the process only."""

from __future__ import annotations

import errno
import threading

from kstore.storage.fsspec_other import FsspecBackend

_MEMORY_LOCK = threading.Lock()


class MemoryBackend(FsspecBackend):
    """A store root in fsspec's memory filesystem (shared by the process's stores)."""

    remote = False

    @property
    def atomic_create(self) -> str | None:
        return "lock"

    @property
    def endpoint(self) -> str:
        return self._display_url

    def put_if_absent(self, rel: str, data: bytes | memoryview, *, durable: bool) -> None:
        path = self.full_path(rel)
        with _MEMORY_LOCK:
            if self.fs.exists(path):
                raise FileExistsError(errno.EEXIST, "exists", rel)
            self.fs.pipe_file(path, data)
