"""What a storage backend is: the primitive operations on paths relative to a store root.

One implementation per kind of storage, each in its own module (``local``, ``s3``,
``memory``, ``fsspec_other``), chosen in one place (:func:`kstore.storage.factory.open_backend`).
The :class:`~kstore.storage.facade.Storage` facade is the only user; everything else reaches a
backend through it, and asks what differs between backends through the capabilities below,
never which backend it is.

Every operation takes a path relative to the store root and raises, when it fails:
``FileNotFoundError`` for an absent file (reads), ``FileExistsError`` for a refused create, a
:class:`~kstore.errors.KStoreError` when the backend names the failure itself (a deadline, a
missing bucket, a full disk), and any other exception otherwise, which the facade turns into a
:class:`~kstore.errors.StorageError` naming the path.
"""

from __future__ import annotations

import collections
import os
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

# The kinds of atomic put-if-absent (kstore.storage.facade): ``link`` (local disk),
# ``if-none-match`` (S3), ``lock`` (memory, within one process).
ATOMIC_CREATE_KINDS = ("link", "if-none-match", "lock")

# Concurrent GETs of one read_many or read_ranges (and HEADs of one stat_many).
READ_CONCURRENCY = 32


@dataclass(frozen=True)
class FileInfo:
    name: str  # base name within the listed directory
    size: int
    mtime_ms: int | None  # None when the backend does not report it


# Unique names come from a private generator seeded by the OS rather than from os.urandom: each
# urandom call is a system call, and on the producer's hot path every system call hands the GIL
# to send() and back. Reseeded in a forked child, so parent and child never share a sequence.
_NAMES = random.Random()
os.register_at_fork(after_in_child=_NAMES.seed)


def unique_id() -> str:
    """128 random bits as 32 hex digits: a name no other writer, process or host will pick."""
    return f"{_NAMES.getrandbits(128):032x}"


class Backend(Protocol):
    """One kind of storage under one store root."""

    @property
    def root(self) -> str:
        """The store root: an absolute local path, or ``bucket/prefix`` style for fsspec."""
        ...

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (made on first use; the local disk's only for tests)."""
        ...

    @property
    def remote(self) -> bool:
        """Files live on another server: each operation is a round trip, which concurrency
        can hide, and the server's clock is not this machine's (a file's modification time
        is the server's idea of now)."""
        ...

    @property
    def atomic_create(self) -> str | None:
        """How put-if-absent is atomic (one of :data:`ATOMIC_CREATE_KINDS`), or None."""
        ...

    @property
    def local_root(self) -> str | None:
        """The root as a path on this machine that other libraries can open, or None."""
        ...

    @property
    def pages_are_requests(self) -> bool:
        """Each page of :meth:`list_pages` is a request of its own, sent only when asked for
        (S3): a caller that stops early lists no further. Otherwise the listing is made whole
        and handed out in pages."""
        ...

    @property
    def range_run_limit(self) -> int | None:
        """The largest run of near byte ranges read together, or None (any size)."""
        ...

    @property
    def writes_views(self) -> bool:
        """Writes take a ``memoryview`` without copying it (else pass ``bytes``)."""
        ...

    @property
    def endpoint(self) -> str:
        """Where requests go, for messages (credentials removed)."""
        ...

    @property
    def counts_requests(self) -> bool:
        """:meth:`count_requests` counts the requests sent (S3); elsewhere it refuses."""
        ...

    def object_store_url(self, rel: str) -> str | None:
        """``rel``'s URL for another library's object-store client (deltalake's), or None
        where such a client opens the store by its own URL."""
        ...

    def object_store_options(self) -> dict[str, str]:
        """The options such a client needs (credentials, endpoint, region); {} if none."""
        ...

    def full_path(self, rel: str) -> str: ...

    def check_root(self) -> None:
        """After a file was not found: raise :class:`~kstore.errors.BucketNotFoundError` if
        the root's bucket does not exist; otherwise nothing."""
        ...

    def read(self, rel: str) -> bytes: ...

    def read_many(self, rels: list[str]) -> dict[str, bytes]:
        """Several whole files concurrently; absent ones left out, other failures raised as
        :class:`~kstore.errors.StorageError` naming the path."""
        ...

    def read_ranges(self, rel: str, runs: list[tuple[int, int]]) -> list[bytes]:
        """The bytes ``[start, end)`` of each run (short or empty past the end of file)."""
        ...

    def exists(self, rel: str) -> bool: ...

    def list_dir(self, rel: str) -> list[FileInfo]:
        """Direct children (files and sub-directories); [] when the directory is absent."""
        ...

    def list_pages(
        self, rel: str, start_after: str, page_size: int
    ) -> Iterator[list[FileInfo]]: ...

    def stat_many(self, rels: list[str]) -> dict[str, FileInfo]: ...

    def put_if_absent(self, rel: str, data: bytes | memoryview, *, durable: bool) -> None: ...

    def put_new(self, rel: str, data: bytes | memoryview, *, durable: bool) -> None:
        """Create a file under a fresh unique name (``FileExistsError`` if it exists)."""
        ...

    def put(self, rel: str, data: bytes, *, durable: bool) -> None: ...

    def delete(self, rels: Sequence[str]) -> None: ...

    def delete_tree(self, rel: str) -> None: ...

    def count_requests(self) -> AbstractContextManager[collections.Counter[str]]:
        """Count the requests sent while the block runs, by kind."""
        ...


def pages_of(
    listing: Iterable[FileInfo], start_after: str, page_size: int
) -> Iterator[list[FileInfo]]:
    """A whole listing as :meth:`Backend.list_pages` hands it out: the names after
    ``start_after``, in name order, ``page_size`` at a time."""
    entries = sorted((i for i in listing if i.name > start_after), key=lambda i: i.name)
    for begin in range(0, len(entries), page_size):
        yield entries[begin : begin + page_size]


def require_body(data: bytes | memoryview) -> None:
    """Refuse an empty body for a put-if-absent (S3 lets an empty one bypass the condition,
    so no backend takes one)."""
    if not data:
        raise ValueError("put_if_absent needs a non-empty body (empty bodies bypass If-None-Match)")


def reason(exc: BaseException) -> str:
    """An error's text, led by the S3 error code when there is one (s3fs's translated errors
    keep only the message: "SignatureDoesNotMatch" says more than its sentence)."""
    text = str(exc) or type(exc).__name__
    response = getattr(exc.__cause__, "response", None) or getattr(exc, "response", None)
    if isinstance(response, Mapping):
        code = (response.get("Error") or {}).get("Code")
        if isinstance(code, str) and code and code not in text:
            return f"{code}: {text}"
    return text


def to_ms(value: Any) -> int | None:
    """A modification time as fsspec filesystems report it, in milliseconds."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return int(value * 1000) if value < 10**11 else int(value)
    timestamp = getattr(value, "timestamp", None)
    if callable(timestamp):
        return int(timestamp() * 1000)
    return None


def info_of(name: str, item: Mapping[str, Any]) -> FileInfo:
    """A FileInfo from an fsspec ``ls``/``info`` entry."""
    mtime = item.get("LastModified") or item.get("mtime") or item.get("created")
    return FileInfo(name, int(item.get("size") or 0), to_ms(mtime))
