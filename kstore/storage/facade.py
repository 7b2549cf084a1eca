"""The one storage abstraction everything goes through: :class:`Storage`, over one backend.

Every backend offers the same small set of operations on paths relative to the store root:
``read`` (one GET on S3, never a HEAD first), ``read_many`` (absent files left out, any other
failure raised), ``read_ranges`` (byte ranges of one file, near ones fetched by one GET),
``put`` (overwrite; only for files with unique names or hints), ``put_if_absent`` (the commit
primitive), ``put_new`` (a file under a fresh unique name that nothing references yet:
segments; "exists" there is the write's own earlier attempt), ``exists``, ``list_dir``,
``delete`` and ``delete_tree``; ``list_pages`` (a directory in name order from a given name,
a page at a time, so that a caller can stop early) and ``stat_many`` (sizes and modification
times of named files).

``put_if_absent`` must be atomic: of two concurrent calls for one path exactly one succeeds and
the other raises :class:`FileExistsError`, and no reader ever sees a half-written file. Each
backend says how (:attr:`Storage.atomic_create`): ``link`` on local disk
(:mod:`kstore.storage.local`), ``if-none-match`` on S3 (:mod:`kstore.storage.s3`), ``lock`` in
memory (:mod:`kstore.storage.memory`). Any other fsspec filesystem
(:mod:`kstore.storage.fsspec_other`) has none unless it declares one; writing to it is refused
with :class:`UnsafeStorageError` unless the user opts in with ``allow_unsafe_writes=True``.

The facade holds what is the same on every backend: the URL and options (and so pickling),
the deadlines configured, argument checks, the commit files remembered for their ranges, the
coalescing of byte ranges, the check of a segment's own earlier write, and the mapping of any
other failure to :class:`StorageError` naming the path. It never asks which backend it is on;
what differs is a capability of the backend.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import threading
from collections.abc import Generator, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from kstore.errors import (
    InvalidArgumentError,
    InvalidStoreError,
    StorageError,
    UnsafeStorageError,
)
from kstore.storage.backend import FileInfo, reason, require_body
from kstore.storage.options import (
    ATTEMPT_TIMEOUT_OPTION,
    DEFAULT_ATTEMPT_TIMEOUT_MS,
    DEFAULT_TIMEOUT_MS,
    TIMEOUT_OPTION,
    check_store_url,
    redact_url,
    timeout_option,
)

if TYPE_CHECKING:
    from kstore.storage.s3 import S3Backend
    from kstore.storage.s3direct import DirectS3

# Bytes of commit files a Storage keeps once read whole, for the ranges of their data.
_REMEMBERED_MAX_BYTES = 64 << 20
# Concurrent writes of one put_new_many (a checkpoint's sidecars, one per changed partition).
_WRITE_CONCURRENCY = 16
# Names per page of list_pages: S3's largest (each page is one LIST request).
LIST_PAGE_SIZE = 1000
# read_ranges fetches ranges this close together in one request: below this, a second
# request costs more (a round trip, and on S3 a GET's price) than the bytes between.
COALESCE_GAP = 64 << 10


class Storage:
    """A store root on some filesystem. Picklable: Spark ships it to executors."""

    def __init__(
        self,
        url: str,
        storage_options: Mapping[str, Any] | None = None,
        *,
        allow_unsafe_writes: bool = False,
    ) -> None:
        if not isinstance(url, str) or not url.strip():
            raise InvalidStoreError(f"store URL must be a non-empty string, got {url!r}")
        if storage_options is not None and not isinstance(storage_options, Mapping):
            raise InvalidStoreError(
                f"storage_options must be a mapping, got {type(storage_options).__name__}"
            )
        check_store_url(url, storage_options)
        scheme, sep, rest = url.partition("://")
        # Strip trailing slashes from the path only: "s3://" must stay a URL (with no bucket).
        self.url = f"{scheme}{sep}{rest.rstrip('/')}" if sep else (url.rstrip("/") or url)
        self.storage_options: dict[str, Any] = dict(storage_options or {})
        self.allow_unsafe_writes = allow_unsafe_writes
        timeout_ms = timeout_option(self.storage_options, TIMEOUT_OPTION, DEFAULT_TIMEOUT_MS)
        attempt_ms = timeout_option(
            self.storage_options, ATTEMPT_TIMEOUT_OPTION, DEFAULT_ATTEMPT_TIMEOUT_MS
        )
        self.timeout_s = timeout_ms / 1000
        self.attempt_timeout_s = min(attempt_ms, timeout_ms) / 1000
        from kstore.storage.factory import open_backend

        self.protocol, self.backend = open_backend(
            self.url,
            self.storage_options,
            timeout_s=self.timeout_s,
            attempt_timeout_s=self.attempt_timeout_s,
        )
        self.root = self.backend.root
        # Commit files that carry data, as a reader read them whole (Storage.remember).
        self._remembered: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._remembered_bytes = 0
        self._remembered_lock = threading.Lock()

    # -- pickling: ship the address and options, never a live connection ----------------------

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "storage_options": self.storage_options,
            "allow_unsafe_writes": self.allow_unsafe_writes,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["url"], state["storage_options"], allow_unsafe_writes=state["allow_unsafe_writes"]
        )

    def __repr__(self) -> str:
        return f"Storage({self.display_url!r})"

    @functools.cached_property
    def display_url(self) -> str:
        """The URL with any embedded credentials removed: the only form put in messages
        (made once: a reader names every range it decodes with it)."""
        return redact_url(self.url)

    # -- capabilities: what differs between backends -----------------------------------------

    @property
    def is_remote(self) -> bool:
        """Files live on another server (an object store): each operation is a round trip,
        which concurrency can hide, and the server's clock is not this machine's."""
        return self.backend.remote

    @property
    def local_root(self) -> str | None:
        """The store root as a path on this machine that other libraries (deltalake) can open,
        or None when the store is not on the local disk."""
        return self.backend.local_root

    @property
    def pages_are_requests(self) -> bool:
        """Each page of :meth:`list_pages` is a request, sent only when asked for: a caller
        that needs only the first names of a large directory should page; elsewhere one
        :meth:`list_dir` costs the same."""
        return self.backend.pages_are_requests

    @property
    def writes_views(self) -> bool:
        """Writes take a ``memoryview`` as it is; elsewhere pass ``bytes`` (a view would be
        copied anyway)."""
        return self.backend.writes_views

    @property
    def counts_requests(self) -> bool:
        """:meth:`count_requests` can count this store's requests (S3)."""
        return self.backend.counts_requests

    def object_store_url(self, rel: str) -> str | None:
        """``rel``'s URL for another library's object-store client (deltalake's: ``s3://``),
        or None where such a client opens the store by its own URL (or cannot reach it)."""
        return self.backend.object_store_url(rel)

    def object_store_options(self) -> dict[str, str]:
        """The options such a client needs for this store (credentials, endpoint, region),
        from the storage options; {} where it needs none."""
        return self.backend.object_store_options()

    @property
    def atomic_create(self) -> str | None:
        """How this backend makes put-if-absent atomic, or None when it cannot."""
        return self.backend.atomic_create

    def check_writable(self) -> None:
        if self.atomic_create is None and not self.allow_unsafe_writes:
            raise UnsafeStorageError(
                f"filesystem {self.protocol!r} offers no atomic put-if-absent, so concurrent "
                "writers could overwrite each other's commits; pass allow_unsafe_writes=True "
                "only if a single writer ever writes to this store"
            )

    @property
    def fs(self) -> Any:
        """The backend's fsspec filesystem (for tests and tools: kstore itself goes through
        the backend)."""
        return self.backend.fs

    @property
    def endpoint(self) -> str:
        """Where requests go, for messages: the endpoint URL (credentials removed), or the
        protocol's default service."""
        return self.backend.endpoint

    # -- S3's own hooks (tests and benchmarks) -----------------------------------------------

    def _s3(self) -> S3Backend:
        from kstore.storage.s3 import S3Backend

        if not isinstance(self.backend, S3Backend):
            raise InvalidStoreError(f"store {self.display_url!r} is not on S3")
        return self.backend

    def s3_client(self) -> Any:
        """The botocore client s3fs uses (for hooks on its events); S3 stores only."""
        return self._s3().client()

    def direct_requests(self) -> DirectS3 | None:
        """The direct requests (``kstore.storage.s3direct``) of this store's bucket, or None
        when every request goes through s3fs (tests hook them to count requests or inject
        failures); S3 stores only."""
        return self._s3().direct_requests()

    def count_requests(self) -> AbstractContextManager[collections.Counter[str]]:
        """Count the requests sent to S3 while the block runs, by kind (``GET``, ``PUT``,
        ``HEAD``, ``LIST``, ``DELETE``; other operations by their name), every HTTP attempt
        included. The count covers the filesystem instance, which every Storage with the same
        options shares (fsspec caches instances), so run nothing else against it meanwhile.
        :class:`InvalidStoreError` on a store not on S3."""
        return self.backend.count_requests()

    def full_path(self, rel: str) -> str:
        return self.backend.full_path(rel)

    # -- reads -------------------------------------------------------------------------------

    def read(self, rel: str) -> bytes:
        """The whole file. Raises FileNotFoundError when absent; any other failure is a
        :class:`StorageError` naming the path."""
        try:
            return self.backend.read(rel)
        except FileNotFoundError:
            self.backend.check_root()  # a missing bucket is named, not taken for a missing file
            raise
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(
                f"reading {rel!r} from {self.display_url!r} failed: {reason(exc)}"
            ) from exc

    def read_if_exists(self, rel: str) -> bytes | None:
        try:
            return self.read(rel)
        except FileNotFoundError:
            return None

    def read_many(self, rels: list[str]) -> dict[str, bytes]:
        """Several whole files at once (concurrently on an object store). Absent files
        (FileNotFoundError) are left out of the result; any other failure raises
        :class:`StorageError` naming the path: a file that could not be read is not absent."""
        if len(rels) == 1 or not self.is_remote:
            out = {}
            for rel in rels:
                data = self.read_if_exists(rel)
                if data is not None:
                    out[rel] = data
            return out
        if not rels:
            return {}
        return self.backend.read_many(rels)

    def remember(self, rel: str, data: bytes) -> None:
        """Keep a file just read whole whose ranges are about to be read (a commit that carries
        its data, PROTOCOL.md 11.8): :meth:`read_ranges` of it then costs no request. Only
        for files never changed once written; the oldest are forgotten past a bound."""
        if len(data) > _REMEMBERED_MAX_BYTES // 4:
            return
        with self._remembered_lock:
            if rel in self._remembered:
                return
            self._remembered[rel] = data
            self._remembered_bytes += len(data)
            while self._remembered_bytes > _REMEMBERED_MAX_BYTES:
                _, old = self._remembered.popitem(last=False)
                self._remembered_bytes -= len(old)

    def remembers(self, rel: str) -> bool:
        """Whether :meth:`remember` holds ``rel``: its ranges cost no request."""
        with self._remembered_lock:
            return rel in self._remembered

    def read_ranges(
        self, rel: str, ranges: Sequence[tuple[int, int]], *, gap: int = COALESCE_GAP
    ) -> list[bytes]:
        """Byte ranges ``[start, end)`` of one file, in the order asked. Ranges that overlap,
        touch or lie within ``gap`` bytes of each other are fetched together: one GET on S3
        (one read on local disk) per merged run, the runs concurrently. Bytes past the end of
        the file are not returned (a range may come back short or empty). Raises
        FileNotFoundError when the file is absent. A file :meth:`remember` holds is read from
        memory."""
        with self._remembered_lock:
            whole = self._remembered.get(rel)
        if whole is not None:
            return [whole[lo:hi] for lo, hi in ranges]
        # A run's ranges are copied out of it. On an object store that is the price of one
        # request instead of several; on local disk a read costs a system call, and a large
        # range is read into a buffer of its own rather than copied twice.
        runs = _coalesce(ranges, gap, self.backend.range_run_limit)
        if not runs:
            return []
        try:
            fetched = self.backend.read_ranges(rel, [(s, e) for s, e, _ in runs])
        except (FileNotFoundError, StorageError):
            raise
        except Exception as exc:
            raise StorageError(
                f"reading {rel!r} from {self.display_url!r} failed: {reason(exc)}"
            ) from exc
        out: list[bytes] = [b""] * len(ranges)
        for (start, _, members), data in zip(runs, fetched, strict=True):
            for index in members:
                lo, hi = ranges[index]
                out[index] = data[lo - start : hi - start]
        return out

    def exists(self, rel: str) -> bool:
        try:
            return self.backend.exists(rel)
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"checking {rel!r} failed: {reason(exc)}") from exc

    def list_dir(self, rel: str) -> list[FileInfo]:
        """Direct children of a directory (files and sub-directories); [] if it is absent."""
        return self.backend.list_dir(rel)

    def list_pages(
        self, rel: str, *, start_after: str = "", page_size: int = LIST_PAGE_SIZE
    ) -> Generator[list[FileInfo], None, None]:
        """The direct children of a directory whose names sort after ``start_after``, in
        ascending name order (by UTF-8 bytes, as S3 lists keys), a page of at most
        ``page_size`` at a time; nothing when the directory is absent.

        Where :attr:`pages_are_requests` (S3), each page is one LIST request, sent only when
        the caller asks for the next page: a caller that stops iterating lists no further.
        Elsewhere the whole listing, sorted and filtered the same way, is handed out in
        pages."""
        if page_size < 1:
            raise InvalidArgumentError(f"page_size must be at least 1, got {page_size}")
        yield from self.backend.list_pages(rel, start_after, page_size)

    def stat_many(self, rels: list[str]) -> dict[str, FileInfo]:
        """Size and modification time of each existing file of ``rels`` (absent ones left
        out), by path; on S3 one HEAD per file, concurrently."""
        if not rels:
            return {}
        return self.backend.stat_many(rels)

    # -- writes ------------------------------------------------------------------------------

    def put_if_absent(self, rel: str, data: bytes | memoryview, *, durable: bool = True) -> None:
        """Create ``rel`` with ``data`` atomically; FileExistsError if it already exists.

        Any other failure raises :class:`StorageError`: the write may or may not have landed
        and the caller must read the path to find out.
        """
        self.check_writable()
        require_body(data)
        self.backend.put_if_absent(rel, data, durable=durable)

    def put_new(self, rel: str, data: bytes | memoryview, *, durable: bool = True) -> None:
        """Create ``rel``, a path under a fresh unique name (:func:`unique_id`) that no state
        references until a later commit names it: a segment.

        On local disk the file is written in place (``O_EXCL``), with no temporary file and
        link (:meth:`kstore.storage.local.LocalBackend.put_new`). Elsewhere it is
        :meth:`put_if_absent`.

        The name is this write's alone, so "already exists" can only be this write's own
        earlier attempt (a client library that sent the PUT again after its answer was lost
        gets 412): the file is read back, and if it holds ``data`` the write has succeeded.
        Any other content there is a :class:`StorageError` (PROTOCOL 12.2).
        """
        try:
            self.check_writable()
            self.backend.put_new(rel, data, durable=durable)
        except FileExistsError:
            self._check_own_write(rel, data)

    def put_new_many(self, files: dict[str, bytes], *, durable: bool = True) -> None:
        """:meth:`put_new` of several files, ``_WRITE_CONCURRENCY`` at a time: one round trip
        or so on an object store where one after another cost one each (a checkpoint of a
        topic log writes a sidecar per changed partition). Every write is waited for; the
        first failure is then raised (the others may have landed: new names that nothing
        references, orphans as any unreferenced file, PROTOCOL 12.6)."""
        if len(files) <= 1:
            for rel, data in files.items():
                self.put_new(rel, data, durable=durable)
            return
        workers = min(_WRITE_CONCURRENCY, len(files))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            writes = [
                pool.submit(self.put_new, rel, data, durable=durable) for rel, data in files.items()
            ]
            concurrent.futures.wait(writes)
        for write in writes:
            write.result()

    def _check_own_write(self, rel: str, data: bytes | memoryview) -> None:
        """``rel`` was reported as existing after a write of ``data`` to it: succeed if it
        holds exactly ``data``."""
        try:
            found = self.read(rel)
        except FileNotFoundError:
            raise StorageError(
                f"writing {rel!r}: the storage reported it as existing, but it cannot be read"
            ) from None
        if found != data:
            raise StorageError(
                f"writing {rel!r}: a file of that unique name already exists with other "
                f"content ({len(found)} bytes, {len(data)} written)"
            )

    def put(self, rel: str, data: bytes, *, durable: bool = True) -> None:
        """Write ``rel`` whole, replacing any previous file. Readers see old or new, never half."""
        self.check_writable()
        self.backend.put(rel, data, durable=durable)

    def delete(self, rels: Iterable[str]) -> None:
        """Delete files; files already gone are not an error."""
        self.check_writable()
        named = list(rels)
        if named:
            self.backend.delete(named)

    def delete_tree(self, rel: str) -> None:
        """Delete a directory and everything below it; absent is not an error."""
        self.check_writable()
        self.backend.delete_tree(rel)


def _coalesce(
    ranges: Sequence[tuple[int, int]], gap: int, limit: int | None = None
) -> list[tuple[int, int, list[int]]]:
    """Merge byte ranges into runs ``(start, end, indexes of the ranges inside)``: ranges that
    overlap or lie within ``gap`` bytes of each other share a run, while the run stays within
    ``limit`` bytes (None: any size)."""
    if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
        raise InvalidArgumentError(f"read_ranges: gap must be a non-negative integer, got {gap!r}")
    for index, item in enumerate(ranges):
        ok = isinstance(item, tuple) and len(item) == 2
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
        if not ok or not 0 <= item[0] <= item[1]:
            raise InvalidArgumentError(
                f"read_ranges: range {index} is {item!r}; expected (start, end) with "
                "0 <= start <= end"
            )
    runs: list[tuple[int, int, list[int]]] = []
    for index in sorted(range(len(ranges)), key=lambda i: ranges[i]):
        start, end = ranges[index]
        if (
            runs
            and start <= runs[-1][1] + gap
            and (limit is None or max(runs[-1][1], end) - runs[-1][0] <= limit)
        ):
            first, last, members = runs[-1]
            runs[-1] = (first, max(last, end), [*members, index])
        else:
            runs.append((start, end, [index]))
    return runs
