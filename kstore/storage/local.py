"""The local disk, reached directly (no fsspec): put-if-absent is a temporary file, fsynced,
``os.link``-ed to the final name (fails if the name exists), then the directory fsynced.
``O_EXCL`` create-then-write would expose a partial file."""

from __future__ import annotations

import collections
import contextlib
import errno
import os
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from kstore.errors import (
    DurabilityUnknownError,
    InvalidStoreError,
    KStoreError,
    StorageError,
    StorageNotWritableError,
)
from kstore.storage.backend import FileInfo, pages_of, reason, unique_id

# The largest run of ranges read together from a local file (read_ranges).
LOCAL_RUN_BYTES = 1 << 20
# The most one write() call hands the kernel. Measured on the 2-core VMs this project runs on:
# once a process had written some hundreds of MB, single calls of several MB went at about
# 350 MB/s (the disk's pace) where calls of 1 MiB kept page-cache speed, 2-4 GB/s; a call more
# per MiB costs microseconds (benchmarks/write_calls.py).
WRITE_CALL_BYTES = 1 << 20

# A local write that fails with one of these fails for a reason that repeating it cannot fix
# (StorageNotWritableError, not retriable): a full disk gives the same answer in a second as now,
# and minutes of retries would only hold the records back from being reported as not sent.
_NOT_WRITABLE = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "the filesystem is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}

_LocalWrite = Literal["link", "replace", "new"]


class LocalBackend:
    """A store root on the local disk."""

    remote = False
    atomic_create = "link"
    pages_are_requests = False
    range_run_limit: int | None = LOCAL_RUN_BYTES
    writes_views = True
    counts_requests = False

    def __init__(self, root: str, display_url: str, options: dict[str, Any]) -> None:
        self.root = root
        self._display_url = display_url
        self._options = options
        self._fs: Any = None
        self._known_dirs: set[str] = set()
        self._durable_dirs: set[str] = set()

    @property
    def local_root(self) -> str:
        return self.root

    @property
    def endpoint(self) -> str:
        return self._display_url

    @property
    def fs(self) -> Any:
        """fsspec's local filesystem (kstore never uses it; tests and tools may)."""
        if self._fs is None:
            import fsspec

            self._fs = fsspec.get_filesystem_class("file")(**self._options)
        return self._fs

    def full_path(self, rel: str) -> str:
        return os.path.join(self.root, *rel.split("/")) if rel else self.root

    def check_root(self) -> None:
        return None

    def object_store_url(self, rel: str) -> str | None:
        return None

    def object_store_options(self) -> dict[str, str]:
        return {}

    def count_requests(self) -> contextlib.AbstractContextManager[collections.Counter[str]]:
        raise InvalidStoreError(f"store {self._display_url!r} is not on S3")

    # -- reads -------------------------------------------------------------------------------

    def read(self, rel: str) -> bytes:
        with open(self.full_path(rel), "rb") as f:
            return f.read()

    def read_many(self, rels: list[str]) -> dict[str, bytes]:
        out = {}
        for rel in rels:
            try:
                out[rel] = self.read(rel)
            except FileNotFoundError:
                continue
            except Exception as exc:
                raise StorageError(
                    f"reading {rel!r} from {self._display_url!r} failed: {reason(exc)}"
                ) from exc
        return out

    def read_ranges(self, rel: str, runs: list[tuple[int, int]]) -> list[bytes]:
        with open(self.full_path(rel), "rb") as f:
            fd = f.fileno()
            out = []
            for start, end in runs:
                parts = []
                position = start
                while position < end:
                    chunk = os.pread(fd, end - position, position)
                    if not chunk:
                        break  # end of file
                    parts.append(chunk)
                    position += len(chunk)
                out.append(b"".join(parts))
            return out

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.full_path(rel))

    def list_dir(self, rel: str) -> list[FileInfo]:
        try:
            entries = list(os.scandir(self.full_path(rel)))
        except FileNotFoundError:
            return []
        out = []
        for entry in entries:
            try:
                st = entry.stat()
            except FileNotFoundError:
                continue  # deleted while listing
            out.append(FileInfo(entry.name, st.st_size, int(st.st_mtime * 1000)))
        return out

    def list_pages(self, rel: str, start_after: str, page_size: int) -> Iterator[list[FileInfo]]:
        return pages_of(self.list_dir(rel), start_after, page_size)

    def stat_many(self, rels: list[str]) -> dict[str, FileInfo]:
        out: dict[str, FileInfo] = {}
        for rel in rels:
            try:
                st = os.stat(self.full_path(rel))
            except FileNotFoundError:
                continue
            except Exception as exc:
                raise StorageError(f"inspecting {rel!r} failed: {reason(exc)}") from exc
            out[rel] = FileInfo(rel.rsplit("/", 1)[-1], st.st_size, int(st.st_mtime * 1000))
        return out

    # -- writes ------------------------------------------------------------------------------

    def put_if_absent(self, rel: str, data: bytes | memoryview, *, durable: bool) -> None:
        self._put(rel, data, durable=durable, how="link")

    def put_new(self, rel: str, data: bytes | memoryview, *, durable: bool) -> None:
        # Written in place (O_EXCL), with no temporary file and link: two system calls fewer
        # per segment. An interrupted write leaves a partial file under its final name, an
        # orphan like any segment never committed (PROTOCOL 12.6).
        self._put(rel, data, durable=durable, how="new")

    def put(self, rel: str, data: bytes, *, durable: bool) -> None:
        self._put(rel, data, durable=durable, how="replace")

    def delete(self, rels: Sequence[str]) -> None:
        for rel in rels:
            try:
                os.unlink(self.full_path(rel))
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise self._write_error("deleting", rel, exc) from exc

    def delete_tree(self, rel: str) -> None:
        import shutil

        path = self.full_path(rel)
        shutil.rmtree(path, ignore_errors=True)
        self._known_dirs = {d for d in self._known_dirs if not d.startswith(path)}
        self._durable_dirs = {d for d in self._durable_dirs if not d.startswith(path)}

    def _ensure_dir(self, directory: str, *, durable: bool) -> None:
        """Create ``directory`` (and missing parents). For a durable write, once per directory
        and process, fsync the parent of every level below the store root, so that no
        directory entry on the path of an acknowledged file can be lost (``makedirs`` may
        create several levels at once, and an earlier non-durable write may have made them)."""
        if directory in (self._durable_dirs if durable else self._known_dirs):
            return
        os.makedirs(directory, exist_ok=True)
        self._known_dirs.add(directory)
        if not durable:
            return
        level = directory
        while (
            level.startswith(self.root) and level != self.root and level not in self._durable_dirs
        ):
            _fsync_dir(os.path.dirname(level))
            self._durable_dirs.add(level)
            level = os.path.dirname(level)
        self._durable_dirs.add(directory)

    def _put(self, rel: str, data: bytes | memoryview, *, durable: bool, how: _LocalWrite) -> None:
        """Write ``rel``: ``link`` a temporary file to it (put-if-absent), ``replace`` it with
        one (put), or create it ``new`` in place (put_new)."""
        final = self.full_path(rel)
        directory = os.path.dirname(final)
        try:
            self._ensure_dir(directory, durable=durable)
        except OSError as exc:  # never FileExistsError: that says another writer won
            raise self._write_error("writing", rel, exc) from exc
        # Temp names start with '.' so listings (vacuum's orphan scan) can tell them apart.
        tmp = final if how == "new" else os.path.join(directory, f".tmp-{unique_id()}")
        try:
            _create_file(tmp, data, durable=durable)
            if how == "link":
                os.link(tmp, final)  # atomic; EEXIST when another writer won
                os.unlink(tmp)
            elif how == "replace":
                os.replace(tmp, final)
        except OSError as exc:
            if tmp != final:  # a file found at ``final`` is someone else's: never removed
                # Any failure, not only an absent file: on a read-only filesystem the unlink
                # fails as the write did, and must not replace the write's error.
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            if isinstance(exc, FileExistsError):
                raise
            raise self._write_error("writing", rel, exc) from exc
        if durable:
            try:
                _fsync_dir(directory)
            except OSError as exc:
                # The file is visible under its final name already: neither absent nor
                # durable. Callers must not take it for a plain failure (and write the same
                # thing again as new) nor for a durable success.
                raise DurabilityUnknownError(
                    f"{rel!r} was written but its directory could not be synced: {reason(exc)}"
                ) from exc

    def _write_error(self, what: str, rel: str, exc: OSError) -> KStoreError:
        """A failed local write as an error naming the path and the cause: one the write cannot
        succeed after (a full disk, a read-only filesystem: :class:`StorageNotWritableError`,
        not retriable), else a :class:`StorageError`."""
        why = _NOT_WRITABLE.get(exc.errno or 0)
        if why is None:
            return StorageError(f"{what} {rel!r} failed: {reason(exc)}")
        code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        outcome = "; nothing was written" if what == "writing" else ""
        if exc.errno == errno.ENOSPC:
            outcome += " (free space, then try again)"
        return StorageNotWritableError(
            f"{what} {rel!r} in {self._display_url} failed: {why} ({code}){outcome}",
            errno=exc.errno,
            path=rel,
        )


def _create_file(path: str, data: bytes | memoryview, *, durable: bool) -> None:
    """Create ``path`` (``O_EXCL``: FileExistsError if it exists) holding ``data``, fsynced when
    durable. A write that fails after the create removes the partial file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view[:WRITE_CALL_BYTES]) :]
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
