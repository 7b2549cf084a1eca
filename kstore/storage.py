"""The one storage abstraction everything goes through.

Every backend offers the same small set of operations on paths relative to the store root:
``read`` (one GET on S3, never a HEAD first), ``read_many`` (absent files left out, any other
failure raised), ``read_ranges`` (byte ranges of one file, near ones fetched by one GET),
``put`` (overwrite; only for files with unique names or hints), ``put_if_absent`` (the commit
primitive), ``put_new`` (a file under a fresh unique name that nothing references yet:
segments; "exists" there is the write's own earlier attempt), ``exists``, ``list_dir``,
``delete`` and ``delete_tree``; ``list_pages`` (a directory in name order from a given name,
a page at a time, so that a caller can stop early) and ``stat_many`` (sizes and modification
times of named files).

On S3 every call runs on s3fs's event loop under a deadline (the storage options
``timeout_ms`` and ``attempt_timeout_ms``) and fails with :class:`StorageTimeoutError`
naming the endpoint when it passes; :meth:`Storage.count_requests` counts the requests sent.

``put_if_absent`` must be atomic: of two concurrent calls for one path exactly one succeeds and
the other raises :class:`FileExistsError`, and no reader ever sees a half-written file.

- local disk: write a temporary file, fsync it, ``os.link`` it to the final name (fails if the
  name exists), fsync the directory. ``O_EXCL`` create-then-write would expose a partial file.
- S3: a PUT with ``If-None-Match: *`` (s3fs ``pipe_file(mode="create")``); a 412 is
  ``FileExistsError``. The bodies are never empty (an empty body bypasses the condition).
- memory: a process-wide lock around check-then-write (tests and single-process use only).

Any other fsspec filesystem has no known atomic create; writing to it is refused with
:class:`UnsafeStorageError` unless the user opts in with ``allow_unsafe_writes=True``, or unless
the filesystem declares one: a filesystem (typically a wrapper around one of the above, such as
the tests' fault-injecting one) whose ``kstore_atomic_create`` attribute names one of the kinds
above promises that ``pipe_file(path, data, mode="create")`` is an atomic put-if-absent of that
kind, raising :class:`FileExistsError` (or an S3 412) when the path exists. Its ``ls`` must report
modification times (leases are judged by them).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import errno
import functools
import os
import random
import threading
import time
from collections.abc import (
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from kstore.errors import (
    BucketNotFoundError,
    DurabilityUnknownError,
    InvalidStoreError,
    KStoreError,
    StorageError,
    StorageNotWritableError,
    StorageTimeoutError,
    UnsafeStorageError,
)

if TYPE_CHECKING:
    from kstore.s3direct import DirectS3

_T = TypeVar("_T")

_LOCAL_PROTOCOLS = ("file", "local")
_S3_PROTOCOLS = ("s3", "s3a")
_MEMORY_LOCK = threading.Lock()
# The kinds a filesystem may declare in ``kstore_atomic_create`` (see the module docstring).
ATOMIC_CREATE_KINDS = ("link", "if-none-match", "lock")
_LocalWrite = Literal["link", "replace", "new"]
_SECRET_WORDS = ("secret", "password", "token", "key", "credential", "session")

# Storage options kstore reads itself; they never reach the filesystem (OPERATIONS.md,
# "Timeouts"). ``timeout_ms``: how long one storage call may wait for the server,
# its retries included. ``attempt_timeout_ms``: how long one attempt may wait to connect or for
# the next bytes of an answer before it is given up and retried.
TIMEOUT_OPTION = "timeout_ms"
ATTEMPT_TIMEOUT_OPTION = "attempt_timeout_ms"
# ``s3_direct_requests``: false sends every S3 request through s3fs (kstore.s3direct says
# which requests go straight over HTTP otherwise, and when).
DIRECT_OPTION = "s3_direct_requests"
DEFAULT_TIMEOUT_MS = 30_000
DEFAULT_ATTEMPT_TIMEOUT_MS = 10_000
_MAX_TIMEOUT_MS = 24 * 3600 * 1000
# A write may take one more second per MiB of body: a large upload on a slow link is not cut
# off by a deadline meant for a silent server.
_UPLOAD_BYTES_PER_S = 1 << 20
# A GET whose body breaks off is sent again, at most this many times in all.
_GET_ATTEMPTS = 3
# A body larger than this goes through s3fs, which uploads it in parts.
_DIRECT_PUT_MAX = 16 << 20
# Bytes of commit files a Storage keeps once read whole, for the ranges of their data.
_REMEMBERED_MAX_BYTES = 64 << 20
# Concurrent GETs of one read_many or read_ranges (and HEADs of one stat_many).
_READ_CONCURRENCY = 32
# Concurrent writes of one put_new_many (a checkpoint's sidecars, one per changed partition).
_WRITE_CONCURRENCY = 16
# Names per page of list_pages: S3's largest (each page is one LIST request).
LIST_PAGE_SIZE = 1000
# read_ranges fetches ranges this close together in one request: below this, a second
# request costs more (a round trip, and on S3 a GET's price) than the bytes between.
COALESCE_GAP = 64 << 10
# The largest run of ranges read together from a local file (read_ranges).
LOCAL_RUN_BYTES = 1 << 20
# The most one write() call hands the kernel. Measured on the 2-core VMs this project runs on:
# once a process had written some hundreds of MB, single calls of several MB went at about
# 350 MB/s (the disk's pace) where calls of 1 MiB kept page-cache speed, 2-4 GB/s; a call more
# per MiB costs microseconds (benchmarks/write_calls.py).
WRITE_CALL_BYTES = 1 << 20
# Request kinds of the S3 operations kstore sends (what count_requests reports).
_REQUEST_KINDS = {
    "GetObject": "GET",
    "PutObject": "PUT",
    "CreateMultipartUpload": "PUT",
    "UploadPart": "PUT",
    "CompleteMultipartUpload": "PUT",
    "HeadObject": "HEAD",
    "HeadBucket": "HEAD",
    "ListObjectsV2": "LIST",
    "ListObjects": "LIST",
    "ListObjectVersions": "LIST",
    "ListBuckets": "LIST",
    "DeleteObject": "DELETE",
    "DeleteObjects": "DELETE",
}

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

# Called, once per storage call, when that call has waited longer than ``_WAIT_REPORT_S``
# (the CLI tells people what it is waiting for). Set with :func:`set_wait_reporter`.
_wait_reporter: Callable[[str], None] | None = None
_WAIT_REPORT_S = 1.0


def set_wait_reporter(reporter: Callable[[str], None] | None, after_s: float = 1.0) -> None:
    """Have ``reporter(description)`` called when a call to a remote store has been waiting for
    more than ``after_s`` seconds, e.g. ``"s3://bucket/ks (listing 'topics')"``. It runs on the
    storage's I/O thread and must be quick; None turns reporting off."""
    global _wait_reporter, _WAIT_REPORT_S
    _wait_reporter, _WAIT_REPORT_S = reporter, after_s


# Unique names come from a private generator seeded by the OS rather than from os.urandom: each
# urandom call is a system call, and on the producer's hot path every system call hands the GIL
# to send() and back. Reseeded in a forked child, so parent and child never share a sequence.
_NAMES = random.Random()
os.register_at_fork(after_in_child=_NAMES.seed)


def unique_id() -> str:
    """128 random bits as 32 hex digits: a name no other writer, process or host will pick."""
    return f"{_NAMES.getrandbits(128):032x}"


@dataclass(frozen=True)
class FileInfo:
    name: str  # base name within the listed directory
    size: int
    mtime_ms: int | None  # None when the backend does not report it


def redact_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of storage options safe to print: every secret-looking value replaced."""
    shown: dict[str, Any] = {}
    for name, value in options.items():
        if isinstance(value, Mapping):
            shown[name] = redact_options(value)
        elif any(word in name.lower() for word in _SECRET_WORDS) and name.lower() not in (
            "endpoint_url",
            "region_name",
        ):
            shown[name] = "***"
        else:
            shown[name] = value
    return shown


def redact_url(url: str) -> str:
    """Remove credentials embedded in a URL (``s3://key:secret@bucket`` style)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    return f"{scheme}{sep}{authority}{slash}{path}"


def _timeout_option(options: Mapping[str, Any], name: str, default: int) -> int:
    """A timeout option in milliseconds: an integer (or a string of digits, as Spark and the
    environment give them) from 1 to one day."""
    value = options.get(name, default)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidStoreError(
            f"storage option {name!r} must be a whole number of milliseconds, got {value!r}"
        )
    if not 1 <= value <= _MAX_TIMEOUT_MS:
        raise InvalidStoreError(
            f"storage option {name!r} must be from 1 to {_MAX_TIMEOUT_MS} ms, got {value}"
        )
    return value


def _flag_option(options: Mapping[str, Any], name: str, *, default: bool) -> bool:
    """A yes/no option: a boolean, or the strings true/false (as Spark and the environment
    give them)."""
    value = options.get(name, default)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        value = value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise InvalidStoreError(f"storage option {name!r} must be true or false, got {value!r}")
    return value


# What a store on the local disk reads of its storage options; any other is a mistake (an S3
# option given to a local path, a typo) that would otherwise be ignored without a word.
LOCAL_STORAGE_OPTIONS = (TIMEOUT_OPTION, ATTEMPT_TIMEOUT_OPTION, "auto_mkdir")

# Filesystems fsspec knows that cannot hold a store: their URLs' host is not passed on (kstore
# keeps the path alone, as for a bucket), so every call failed naming no cause (ftp's with a
# traceback at exit); http(s) is read-only anyway.
_UNUSABLE_PROTOCOLS = {
    "http": "a web server cannot hold a store (read-only, no listing, no atomic create)",
    "https": "a web server cannot hold a store (read-only, no listing, no atomic create)",
    "ftp": "FTP offers no atomic create, and its URLs' host is not passed on",
    "sftp": "SFTP offers no atomic create, and its URLs' host is not passed on",
}


def check_store_url(url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Refuse, with :class:`InvalidStoreError` naming the cause, a store URL no store can live
    at (http(s)://, ftp://, sftp://) and a storage option a local store would ignore. Every
    store goes through it (:class:`Storage`); the CLI calls it before opening anything."""
    scheme, sep, _ = url.partition("://")
    why = _UNUSABLE_PROTOCOLS.get(scheme.lower()) if sep else None
    if why is not None:
        raise InvalidStoreError(
            f"store URL scheme {scheme + '://'!r}: {why}; use a local path, s3://bucket/prefix "
            "or memory://name"
        )
    if sep and scheme.lower() not in _LOCAL_PROTOCOLS:
        return
    unknown = sorted(set(storage_options or {}) - set(LOCAL_STORAGE_OPTIONS), key=str)
    if unknown:
        raise InvalidStoreError(
            f"storage option {unknown[0]!r} means nothing to a store on the local disk "
            f"({redact_url(url)}); local stores take only {', '.join(LOCAL_STORAGE_OPTIONS)}"
        )


class _NoAnswerError(Exception):
    """A deadline passed while waiting for the server (raised on the I/O loop)."""


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
        timeout_ms = _timeout_option(self.storage_options, TIMEOUT_OPTION, DEFAULT_TIMEOUT_MS)
        attempt_ms = _timeout_option(
            self.storage_options, ATTEMPT_TIMEOUT_OPTION, DEFAULT_ATTEMPT_TIMEOUT_MS
        )
        self.timeout_s = timeout_ms / 1000
        self.attempt_timeout_s = min(attempt_ms, timeout_ms) / 1000
        protocol, _, rest = self.url.partition("://")
        if not _:
            protocol, rest = "file", self.url  # a bare path means the local disk
        self.protocol = protocol.lower()
        self._fs_cls: Any = None
        if self.protocol not in _LOCAL_PROTOCOLS:
            # Imported here, not at module level: local stores never need fsspec, and it is
            # slow to import (the CLI's start-up time).
            import fsspec

            try:
                self._fs_cls = fsspec.get_filesystem_class(self.protocol)
            except (ValueError, ImportError) as exc:
                raise InvalidStoreError(
                    f"store URL {redact_url(url)!r}: unsupported filesystem {protocol!r} ({exc})"
                ) from None
        if self.protocol in _LOCAL_PROTOCOLS:
            self.root = os.path.abspath(os.path.expanduser(rest))
        else:
            self.root = rest.strip("/")
            if self.protocol in _S3_PROTOCOLS and not self.root:
                raise InvalidStoreError(f"store URL {redact_url(url)!r} names no bucket")
        self._fs: Any = None
        self._direct_allowed = self.protocol in _S3_PROTOCOLS and _flag_option(
            self.storage_options, DIRECT_OPTION, default=True
        )
        self._known_dirs: set[str] = set()
        self._durable_dirs: set[str] = set()
        # S3: until a call has found the bucket, a file not found or a write refused makes
        # one HEAD of the bucket, so that a missing bucket is named as such (_check_bucket).
        self._bucket_seen = not self.is_s3
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

    # -- capabilities ------------------------------------------------------------------------

    @property
    def is_local(self) -> bool:
        return self.protocol in _LOCAL_PROTOCOLS

    @property
    def is_remote(self) -> bool:
        """Files live on another server (an object store): each operation is a round trip,
        which concurrency can hide, and the server's clock is not this machine's."""
        return not self.is_local and self.protocol != "memory"

    @property
    def atomic_create(self) -> str | None:
        """How this backend makes put-if-absent atomic, or None when it cannot."""
        if self.is_local:
            return "link"
        if self.protocol in _S3_PROTOCOLS:
            return "if-none-match"
        if self.protocol == "memory":
            return "lock"
        return self.declared_atomic_create

    @property
    def declared_atomic_create(self) -> str | None:
        """The put-if-absent kind a filesystem of another protocol declares (a wrapper that
        forwards to one of the built-in kinds), or None."""
        if self.is_local or self.protocol in _S3_PROTOCOLS or self.protocol == "memory":
            return None
        declared = getattr(self._fs_cls, "kstore_atomic_create", None)
        if declared is None:
            return None
        kind = getattr(self.fs, "kstore_atomic_create", None)  # may depend on the instance
        return kind if kind in ATOMIC_CREATE_KINDS else None

    def check_writable(self) -> None:
        if self.atomic_create is None and not self.allow_unsafe_writes:
            raise UnsafeStorageError(
                f"filesystem {self.protocol!r} offers no atomic put-if-absent, so concurrent "
                "writers could overwrite each other's commits; pass allow_unsafe_writes=True "
                "only if a single writer ever writes to this store"
            )

    @property
    def is_s3(self) -> bool:
        """S3 through s3fs: calls run on its event loop under kstore's deadlines."""
        return self.protocol in _S3_PROTOCOLS

    @property
    def fs(self) -> Any:
        if self._fs is None and self._fs_cls is None:  # the local disk, reached through fsspec
            import fsspec

            self._fs_cls = fsspec.get_filesystem_class("file")
        if self._fs is None:
            options = {
                k: v
                for k, v in self.storage_options.items()
                if k not in (TIMEOUT_OPTION, ATTEMPT_TIMEOUT_OPTION, DIRECT_OPTION)
            }
            if self.is_s3:
                # No listings cache: s3fs answers reads and existence checks of files in a
                # directory it once listed from that listing, so a tailing reader would never
                # see the next log version another process commits.
                options.setdefault("use_listings_cache", False)
                # Each attempt gives up on a silent server after attempt_timeout_ms (botocore's
                # connect and read timeouts); the deadline of the whole call is kstore's.
                config = dict(options.get("config_kwargs") or {})
                config.setdefault("connect_timeout", self.attempt_timeout_s)
                config.setdefault("read_timeout", self.attempt_timeout_s)
                config.setdefault("retries", {"max_attempts": 3, "mode": "standard"})
                options["config_kwargs"] = config
            try:
                self._fs = self._fs_cls(**options)
            except TypeError as exc:
                raise InvalidStoreError(
                    f"store {redact_url(self.url)!r}: bad storage options "
                    f"{sorted(self.storage_options)}: {exc}"
                ) from None
        return self._fs

    @property
    def endpoint(self) -> str:
        """Where requests go, for messages: the endpoint URL (credentials removed), or the
        protocol's default service."""
        if not self.is_remote:
            return self.display_url
        kwargs = self.storage_options.get("client_kwargs")
        endpoint = self.storage_options.get("endpoint_url")
        if isinstance(kwargs, Mapping):
            endpoint = kwargs.get("endpoint_url", endpoint)
        if isinstance(endpoint, str) and endpoint:
            return redact_url(endpoint)
        return "AWS S3" if self.is_s3 else self.protocol

    # -- S3 calls: on s3fs's event loop, each bounded by the deadline -----------------------

    def _s3_call(
        self,
        what: str,
        rel: str,
        make: Callable[[], Awaitable[_T]],
        *,
        deadline_s: float | None = None,
        own_deadline: bool = False,
    ) -> _T:
        """Run ``make()`` on the filesystem's event loop. The whole call must end within
        ``deadline_s`` (the storage's deadline by default), unless ``own_deadline``: then
        ``make`` bounds its own waits (reads, :meth:`_s3_get`) and raises
        :class:`_NoAnswerError`. A call waiting longer than a second is reported
        (:func:`set_wait_reporter`)."""
        from fsspec.asyn import sync

        fs = self.fs
        limit = self.timeout_s if deadline_s is None else deadline_s
        description = f"{what} {rel!r}" if rel else what

        async def run() -> _T:
            import asyncio  # loaded by fsspec already; not at start-up for local stores

            loop = asyncio.get_running_loop()
            reporter = _wait_reporter
            report = (
                loop.call_later(_WAIT_REPORT_S, reporter, f"{self.display_url} ({description})")
                if reporter is not None
                else None
            )
            try:
                if own_deadline:
                    return await make()
                try:
                    async with asyncio.timeout(limit) as scope:
                        return await make()
                except TimeoutError:
                    if scope.expired():
                        raise _NoAnswerError from None
                    raise
            finally:
                if report is not None:
                    report.cancel()

        try:
            result: _T = sync(fs.loop, run)
        except _NoAnswerError:
            raise StorageTimeoutError(
                f"{description} in {self.display_url}: no answer from {self.endpoint} within "
                f"{limit:g} s (storage option {TIMEOUT_OPTION} sets this deadline)"
            ) from None
        return result

    async def _s3_get(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """One GET of a whole object, or of bytes [start, end): never a HEAD first (s3fs's
        ``cat_file`` sends one whenever its ``max_concurrency`` is above 1). Waiting for the
        answer (its retries included) is bounded by the deadline; the body then streams for as
        long as it keeps moving (each read is bounded by the attempt timeout), and a body that
        breaks off is fetched again, at most ``_GET_ATTEMPTS`` times in all."""
        import asyncio

        fs = self.fs
        bucket, key, version = fs.split_path(path)
        direct = None if version else await self._direct(bucket)
        if direct is not None:
            try:
                async with asyncio.timeout(self.timeout_s) as scope:
                    return await direct.get(bucket, key, start, end)
            except TimeoutError:
                if scope.expired():
                    raise _NoAnswerError from None
                raise
        extra: dict[str, Any] = {}
        if start is not None and end is not None:
            extra["Range"] = f"bytes={start}-{end - 1}"
        if version:
            extra["VersionId"] = version
        waited = 0.0
        for attempt in range(_GET_ATTEMPTS):
            began = time.monotonic()
            try:
                async with asyncio.timeout(max(self.timeout_s - waited, 0.001)) as scope:
                    response = await fs._call_s3("get_object", Bucket=bucket, Key=key, **extra)
            except TimeoutError:
                if scope.expired():
                    raise _NoAnswerError from None
                raise
            waited += time.monotonic() - began
            body = response["Body"]
            try:
                data: bytes = await body.read()
                return data
            except Exception:
                if attempt + 1 == _GET_ATTEMPTS:
                    raise
            finally:
                body.close()
        raise AssertionError("unreachable")  # pragma: no cover

    def _check_bucket(self) -> None:
        """S3, before any call has found the bucket: :class:`BucketNotFoundError` when it does
        not exist. Otherwise nothing (the bucket is there, or a HEAD cannot tell: no permission
        to ask, a failure), and the caller's own error stands. At most once per Storage that
        finds its bucket: one HEAD, on the first missing file or refused write only."""
        if self._bucket_seen:
            return
        bucket = self.root.split("/", 1)[0]
        try:
            self._s3_call(
                "checking the bucket", "", lambda: self.fs._call_s3("head_bucket", Bucket=bucket)
            )
        except FileNotFoundError:
            raise BucketNotFoundError(
                f"bucket {bucket!r} does not exist at {self.endpoint} (store {self.display_url}): "
                "create it first; kstore does not create buckets"
            ) from None
        except Exception:  # cannot tell: the caller's error is the one shown
            pass
        self._bucket_seen = True  # asked once, whatever the answer (a HEAD per miss would cost)

    def s3_client(self) -> Any:
        """The botocore client s3fs uses (for hooks on its events); S3 stores only."""
        if not self.is_s3:
            raise InvalidStoreError(f"store {self.display_url!r} is not on S3")
        from fsspec.asyn import sync

        fs = self.fs
        return sync(fs.loop, fs.set_session)

    def direct_requests(self) -> DirectS3 | None:
        """The direct requests (``kstore.s3direct``) of this store's bucket, or None when every
        request goes through s3fs (tests hook them to count requests or inject failures)."""
        if not self._direct_allowed:
            return None
        from fsspec.asyn import sync

        found: DirectS3 | None = sync(
            self.fs.loop, self._direct, self.fs.split_path(self.full_path("x"))[0]
        )
        return found

    async def _direct(self, bucket: str) -> DirectS3 | None:
        """The direct requests (``kstore.s3direct``) for ``bucket``, or None: through s3fs."""
        if not self._direct_allowed:
            return None
        from kstore.s3direct import direct_for

        fs = self.fs
        client = await fs.set_session()
        direct = direct_for(fs, client, self.attempt_timeout_s)
        return direct if direct is not None and direct.serves(bucket) else None

    async def _s3_put(self, path: str, data: bytes | memoryview, *, create: bool) -> None:
        """One PUT of a whole object (with ``If-None-Match: *`` when ``create``): direct when it
        can be, else s3fs's (which uploads a large body in parts)."""
        fs = self.fs
        bucket, key, version = fs.split_path(path)
        direct = None if version or len(data) > _DIRECT_PUT_MAX else await self._direct(bucket)
        if direct is None:
            if create:
                await fs._pipe_file(path, data, mode="create")
            else:
                await fs._pipe_file(path, data)
            return
        await direct.put(bucket, key, bytes(data), if_absent=create)
        fs.invalidate_cache(path)

    @contextlib.contextmanager
    def count_requests(self) -> Iterator[collections.Counter[str]]:
        """Count the requests sent to S3 while the block runs, by kind (``GET``, ``PUT``,
        ``HEAD``, ``LIST``, ``DELETE``; other operations by their name), every HTTP attempt
        included. The count covers the filesystem instance, which every Storage with the same
        options shares (fsspec caches instances), so run nothing else against it meanwhile."""
        counts: collections.Counter[str] = collections.Counter()
        lock = threading.Lock()

        def count(event_name: str, **_: Any) -> None:
            operation = event_name.rsplit(".", 1)[-1]
            with lock:
                counts[_REQUEST_KINDS.get(operation, operation)] += 1

        def count_direct(kind: str, _key: str) -> None:
            with lock:
                counts[kind] += 1

        events = self.s3_client().meta.events
        direct = self.direct_requests()
        events.register("before-send.s3", count)
        if direct is not None:
            direct.before_send.append(count_direct)
        try:
            yield counts
        finally:
            events.unregister("before-send.s3", count)
            if direct is not None:
                direct.before_send.remove(count_direct)

    def full_path(self, rel: str) -> str:
        if self.is_local:
            return os.path.join(self.root, *rel.split("/")) if rel else self.root
        return f"{self.root}/{rel}" if rel else self.root

    # -- reads -------------------------------------------------------------------------------

    def read(self, rel: str) -> bytes:
        """The whole file. Raises FileNotFoundError when absent; any other failure is a
        :class:`StorageError` naming the path."""
        path = self.full_path(rel)
        try:
            if self.is_local:
                with open(path, "rb") as f:
                    return f.read()
            if self.is_s3:
                found: bytes = self._s3_call(
                    "reading", rel, lambda: self._s3_get(path), own_deadline=True
                )
                self._bucket_seen = True
                return found
            data: bytes = self.fs.cat_file(path)
            return data
        except FileNotFoundError:
            self._check_bucket()  # S3: a missing bucket is named, not taken for a missing file
            raise
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(
                f"reading {rel!r} from {self.display_url!r} failed: {_reason(exc)}"
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
        if self.is_s3:
            return self._s3_call(
                f"reading {len(rels)} files",
                "",
                lambda: self._s3_read_many(rels),
                own_deadline=True,
            )
        paths = {self.full_path(rel): rel for rel in rels}
        try:
            found = self.fs.cat(list(paths), on_error="return")
        except Exception as exc:
            raise StorageError(
                f"reading {len(rels)} files from {self.display_url!r} failed: {_reason(exc)}"
            ) from exc
        out = {}
        for path, rel in paths.items():
            if path not in found:  # a filesystem that left it out: ask for it alone
                data = self.read_if_exists(rel)
                if data is not None:
                    out[rel] = data
                continue
            data = found[path]
            if isinstance(data, FileNotFoundError):
                continue
            if isinstance(data, BaseException):
                raise StorageError(
                    f"reading {rel!r} from {self.display_url!r} failed: {_reason(data)}"
                ) from data
            out[rel] = data
        return out

    async def _s3_read_many(self, rels: list[str]) -> dict[str, bytes]:
        """GETs of several objects, ``_READ_CONCURRENCY`` at a time; the first failure other
        than an absent object cancels the rest and is raised."""
        import asyncio

        gate = asyncio.Semaphore(_READ_CONCURRENCY)
        out: dict[str, bytes] = {}

        async def one(rel: str) -> None:
            async with gate:
                try:
                    out[rel] = await self._s3_get(self.full_path(rel))
                except FileNotFoundError:
                    pass
                except _NoAnswerError:
                    raise
                except Exception as exc:
                    raise StorageError(
                        f"reading {rel!r} from {self.display_url!r} failed: {_reason(exc)}"
                    ) from exc

        try:
            async with asyncio.TaskGroup() as group:
                for rel in rels:
                    group.create_task(one(rel))
        except BaseExceptionGroup as failures:
            raise failures.exceptions[0] from None
        return out

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
        runs = _coalesce(ranges, gap, LOCAL_RUN_BYTES if self.is_local else None)
        if not runs:
            return []
        path = self.full_path(rel)
        try:
            if self.is_local:
                fetched = _local_ranges(path, [(s, e) for s, e, _ in runs])
            elif self.is_s3:
                fetched = self._s3_call(
                    "reading",
                    rel,
                    lambda: self._s3_ranges(path, [(s, e) for s, e, _ in runs]),
                    own_deadline=True,
                )
            else:
                fetched = [bytes(self.fs.cat_file(path, start=s, end=e)) for s, e, _ in runs]
        except (FileNotFoundError, StorageError):
            raise
        except Exception as exc:
            raise StorageError(
                f"reading {rel!r} from {self.display_url!r} failed: {_reason(exc)}"
            ) from exc
        out: list[bytes] = [b""] * len(ranges)
        for (start, _, members), data in zip(runs, fetched, strict=True):
            for index in members:
                lo, hi = ranges[index]
                out[index] = data[lo - start : hi - start]
        return out

    async def _s3_ranges(self, path: str, runs: list[tuple[int, int]]) -> list[bytes]:
        import asyncio

        async def one(start: int, end: int) -> bytes:
            try:
                return await self._s3_get(path, start, end)
            except OSError as exc:
                if "InvalidRange" in _reason(exc) or "not satisfiable" in str(exc).lower():
                    return b""  # starts at or past the end of the object (416)
                raise

        gate = asyncio.Semaphore(_READ_CONCURRENCY)

        async def gated(start: int, end: int) -> bytes:
            async with gate:
                return await one(start, end)

        tasks: list[asyncio.Task[bytes]] = []
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(gated(s, e)) for s, e in runs if e > s]
        except BaseExceptionGroup as failures:
            raise failures.exceptions[0] from None
        results = iter(task.result() for task in tasks)
        return [next(results) if e > s else b"" for s, e in runs]

    def exists(self, rel: str) -> bool:
        path = self.full_path(rel)
        if self.is_local:
            return os.path.exists(path)
        try:
            if self.is_s3:
                return bool(self._s3_call("checking", rel, lambda: self.fs._exists(path)))
            return bool(self.fs.exists(path))
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"checking {rel!r} failed: {_reason(exc)}") from exc

    def list_dir(self, rel: str) -> list[FileInfo]:
        """Direct children of a directory (files and sub-directories); [] if it is absent."""
        path = self.full_path(rel)
        if self.is_local:
            try:
                entries = list(os.scandir(path))
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
        try:
            self.fs.invalidate_cache(path)
            if self.is_s3:
                items = self._s3_call(
                    "listing", rel, lambda: self._s3_list(path), own_deadline=True
                )
                self._bucket_seen = self._bucket_seen or bool(items)
            else:
                items = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            self._check_bucket()
            return []
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"listing {rel!r} failed: {_reason(exc)}") from exc
        out = []
        for item in items:
            name = str(item["name"]).rstrip("/").rsplit("/", 1)[-1]
            mtime = item.get("LastModified") or item.get("mtime") or item.get("created")
            out.append(FileInfo(name, int(item.get("size") or 0), _to_ms(mtime)))
        return out

    async def _s3_list(self, path: str, *, recursive: bool = False) -> list[dict[str, Any]]:
        """The entries directly below ``path`` (every file below it when ``recursive``), a
        LIST page at a time; the deadline bounds each page, so a directory of millions of
        files (an old partition log) can still be listed."""
        import asyncio

        fs = self.fs
        bucket, key, _ = fs.split_path(path)
        prefix = f"{key.rstrip('/')}/" if key else ""
        options = {} if recursive else {"Delimiter": "/"}
        pages = fs._list_pages("list_objects_v2", Bucket=bucket, Prefix=prefix, **options)
        items: list[dict[str, Any]] = []
        try:
            while True:
                try:
                    async with asyncio.timeout(self.timeout_s) as scope:
                        page = await anext(pages)
                except StopAsyncIteration:
                    return items
                except TimeoutError:
                    if scope.expired():
                        raise _NoAnswerError from None
                    raise
                for common in page.get("CommonPrefixes", []):
                    items.append({"name": f"{bucket}/{common['Prefix']}", "size": 0})
                for entry in page.get("Contents", []):
                    items.append(
                        {
                            "name": f"{bucket}/{entry['Key']}",
                            "size": entry.get("Size", 0),
                            "LastModified": entry.get("LastModified"),
                        }
                    )
        finally:
            await pages.aclose()

    def list_pages(
        self, rel: str, *, start_after: str = "", page_size: int = LIST_PAGE_SIZE
    ) -> Generator[list[FileInfo], None, None]:
        """The direct children of a directory whose names sort after ``start_after``, in
        ascending name order (by UTF-8 bytes, as S3 lists keys), a page of at most
        ``page_size`` at a time; nothing when the directory is absent.

        On S3 each page is one LIST request (``list_objects_v2`` with ``StartAfter``, then its
        continuation token), sent only when the caller asks for the next page: a caller that
        stops iterating lists no further. The deadline bounds each page. Local disk and memory
        are not billed per request: their whole listing, sorted and filtered the same way, is
        handed out in pages. Any other filesystem: the same, from its full listing."""
        if page_size < 1:
            raise ValueError(f"page_size must be at least 1, got {page_size}")
        if not self.is_s3:
            entries = sorted(
                (i for i in self.list_dir(rel) if i.name > start_after), key=lambda i: i.name
            )
            for begin in range(0, len(entries), page_size):
                yield entries[begin : begin + page_size]
            return
        path = self.full_path(rel)
        bucket, key, _ = self.fs.split_path(path)
        prefix = f"{key.rstrip('/')}/" if key else ""
        request: dict[str, Any] = {
            "Bucket": bucket,
            "Prefix": prefix,
            "Delimiter": "/",
            "MaxKeys": page_size,
        }
        if start_after:
            request["StartAfter"] = f"{prefix}{start_after}"
        while True:
            try:
                page = self._s3_call("listing", rel, functools.partial(self._s3_page, request))
            except FileNotFoundError:
                return  # no bucket: nothing below it
            except StorageError:
                raise
            except Exception as exc:
                raise StorageError(f"listing {rel!r} failed: {_reason(exc)}") from exc
            out = [
                FileInfo(common["Prefix"][len(prefix) :].rstrip("/"), 0, None)
                for common in page.get("CommonPrefixes", [])
            ]
            out.extend(
                FileInfo(
                    entry["Key"][len(prefix) :],
                    int(entry.get("Size") or 0),
                    _to_ms(entry.get("LastModified")),
                )
                for entry in page.get("Contents", [])
            )
            out.sort(key=lambda i: i.name)
            if out:
                yield out
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            request.pop("StartAfter", None)
            request["ContinuationToken"] = token

    async def _s3_page(self, request: dict[str, Any]) -> dict[str, Any]:
        page: dict[str, Any] = await self.fs._call_s3("list_objects_v2", **request)
        return page

    def stat_many(self, rels: list[str]) -> dict[str, FileInfo]:
        """Size and modification time of each existing file of ``rels`` (absent ones left
        out), by path; on S3 one HEAD per file, concurrently."""
        out: dict[str, FileInfo] = {}
        if not rels:
            return out
        if self.is_s3:
            try:
                heads = self._s3_call(
                    f"inspecting {len(rels)} file(s)", "", lambda: self._s3_heads(rels)
                )
            except StorageError:
                raise
            except Exception as exc:
                raise StorageError(f"inspecting {rels[0]!r} ... failed: {_reason(exc)}") from exc
            for rel, head in heads.items():
                out[rel] = FileInfo(
                    rel.rsplit("/", 1)[-1],
                    int(head.get("ContentLength") or 0),
                    _to_ms(head.get("LastModified")),
                )
            return out
        for rel in rels:
            path = self.full_path(rel)
            try:
                if self.is_local:
                    st = os.stat(path)
                    out[rel] = FileInfo(rel.rsplit("/", 1)[-1], st.st_size, int(st.st_mtime * 1000))
                    continue
                info = self.fs.info(path)
            except FileNotFoundError:
                continue
            except Exception as exc:
                raise StorageError(f"inspecting {rel!r} failed: {_reason(exc)}") from exc
            mtime = info.get("LastModified") or info.get("mtime") or info.get("created")
            out[rel] = FileInfo(rel.rsplit("/", 1)[-1], int(info.get("size") or 0), _to_ms(mtime))
        return out

    async def _s3_heads(self, rels: list[str]) -> dict[str, dict[str, Any]]:
        import asyncio

        fs = self.fs
        gate = asyncio.Semaphore(_READ_CONCURRENCY)
        found: dict[str, dict[str, Any]] = {}

        async def one(rel: str) -> None:
            bucket, key, _ = fs.split_path(self.full_path(rel))
            async with gate:
                try:
                    found[rel] = await fs._call_s3("head_object", Bucket=bucket, Key=key)
                except FileNotFoundError:
                    return

        await asyncio.gather(*(one(rel) for rel in rels))
        return found

    # -- writes ------------------------------------------------------------------------------

    def put_if_absent(self, rel: str, data: bytes | memoryview, *, durable: bool = True) -> None:
        """Create ``rel`` with ``data`` atomically; FileExistsError if it already exists.

        Any other failure raises :class:`StorageError`: the write may or may not have landed
        and the caller must read the path to find out.
        """
        self.check_writable()
        if not data:
            raise ValueError(
                "put_if_absent needs a non-empty body (empty bodies bypass If-None-Match)"
            )
        if self.is_local:
            self._local_put(rel, data, durable=durable, how="link")
        elif self.is_s3 or self.declared_atomic_create is not None:
            path = self.full_path(rel)
            try:
                if self.is_s3:
                    self._s3_call(
                        "writing",
                        rel,
                        lambda: self._s3_put(path, data, create=True),
                        deadline_s=self._write_deadline(len(data)),
                    )
                    self._bucket_seen = True
                else:
                    self.fs.pipe_file(path, data, mode="create")
            except FileExistsError:
                self._bucket_seen = True
                raise
            except StorageError:
                raise
            except Exception as exc:
                if _is_precondition_failed(exc):
                    raise FileExistsError(errno.EEXIST, "exists", rel) from exc
                if self.is_s3:
                    self._check_bucket()  # moto: NoSuchBucket; SeaweedFS: 403 AccessDenied
                raise StorageError(f"conditional write of {rel!r} failed: {_reason(exc)}") from exc
        elif self.protocol == "memory":
            path = self.full_path(rel)
            with _MEMORY_LOCK:
                if self.fs.exists(path):
                    raise FileExistsError(errno.EEXIST, "exists", rel)
                self.fs.pipe_file(path, data)
        else:  # allow_unsafe_writes: check-then-write, documented as single-writer only
            path = self.full_path(rel)
            if self.fs.exists(path):
                raise FileExistsError(errno.EEXIST, "exists", rel)
            self.fs.pipe_file(path, data)

    def put_new(self, rel: str, data: bytes | memoryview, *, durable: bool = True) -> None:
        """Create ``rel``, a path under a fresh unique name (:func:`unique_id`) that no state
        references until a later commit names it: a segment.

        On local disk the file is written in place (``O_EXCL``), with no temporary file and
        link: two system calls fewer per segment. An interrupted write leaves a partial file
        under its final name, which is an orphan like any segment never committed (PROTOCOL
        12.6). Elsewhere it is :meth:`put_if_absent`.

        The name is this write's alone, so "already exists" can only be this write's own
        earlier attempt (a client library that sent the PUT again after its answer was lost
        gets 412): the file is read back, and if it holds ``data`` the write has succeeded.
        Any other content there is a :class:`StorageError` (PROTOCOL 12.2).
        """
        try:
            if self.is_local:
                self.check_writable()
                self._local_put(rel, data, durable=durable, how="new")
            else:
                self.put_if_absent(rel, data, durable=durable)
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
        if self.is_local:
            self._local_put(rel, data, durable=durable, how="replace")
            return
        path = self.full_path(rel)
        try:
            if self.is_s3:
                self._s3_call(
                    "writing",
                    rel,
                    lambda: self._s3_put(path, data, create=False),
                    deadline_s=self._write_deadline(len(data)),
                )
                self._bucket_seen = True
            else:
                self.fs.pipe_file(path, data)
        except StorageError:
            raise
        except Exception as exc:
            if self.is_s3:
                self._check_bucket()
            raise StorageError(f"writing {rel!r} failed: {_reason(exc)}") from exc

    def _write_deadline(self, size: int) -> float:
        return self.timeout_s + size / _UPLOAD_BYTES_PER_S

    def delete(self, rels: Iterable[str]) -> None:
        """Delete files; files already gone are not an error."""
        self.check_writable()
        named = [(r, self.full_path(r)) for r in rels]
        if not named:
            return
        if self.is_local:
            for rel, path in named:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise self._write_error("deleting", rel, exc) from exc
            return
        for rel, path in named:
            try:
                if self.is_s3:
                    self._s3_call("deleting", rel, functools.partial(self.fs._rm_file, path))
                else:
                    self.fs.rm_file(path)
            except FileNotFoundError:
                pass
            except StorageError:
                raise
            except Exception as exc:
                raise StorageError(f"deleting {path!r} failed: {_reason(exc)}") from exc

    def delete_tree(self, rel: str) -> None:
        """Delete a directory and everything below it; absent is not an error."""
        self.check_writable()
        path = self.full_path(rel)
        if self.is_local:
            import shutil

            shutil.rmtree(path, ignore_errors=True)
            self._known_dirs = {d for d in self._known_dirs if not d.startswith(path)}
            self._durable_dirs = {d for d in self._durable_dirs if not d.startswith(path)}
            return
        try:
            self.fs.invalidate_cache(path)
            if self.is_s3:
                self._s3_delete_tree(rel, path)
            elif self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"deleting {rel!r} failed: {_reason(exc)}") from exc

    def _s3_delete_tree(self, rel: str, path: str) -> None:
        """List every file below ``path`` (a page at a time), delete them 1,000 to a request,
        then the directory entries; each request under its own deadline, so a large topic
        can be deleted."""
        listed = self._s3_call(
            "listing", rel, lambda: self._s3_list(path, recursive=True), own_deadline=True
        )
        files = [str(item["name"]) for item in listed]
        for start in range(0, len(files), 1000):
            batch = files[start : start + 1000]
            self._s3_call("deleting", rel, functools.partial(self._s3_delete_keys, batch))
        fs = self.fs
        for directory in _directory_entries(path, files):
            bucket, key, _ = fs.split_path(directory)
            if key:
                # SeaweedFS keeps a directory entry after the last file below it is deleted
                # (listings still show it and ``exists`` stays true); deleting the key
                # ``<dir>/`` removes it. On plain S3 no such keys exist: a no-op.
                entry = {"Bucket": bucket, "Key": key + "/"}
                self._s3_call(
                    "deleting", rel, functools.partial(fs._call_s3, "delete_object", **entry)
                )
        fs.invalidate_cache(path)

    async def _s3_delete_keys(self, paths: list[str]) -> None:
        fs = self.fs
        bucket = fs.split_path(paths[0])[0]
        objects = [{"Key": fs.split_path(p)[1]} for p in paths]
        out = await fs._call_s3(
            "delete_objects", Bucket=bucket, Delete={"Objects": objects, "Quiet": True}
        )
        errors = out.get("Errors") or []
        if errors:
            first = errors[0]
            raise StorageError(
                f"deleting {len(paths)} files: {len(errors)} not deleted, the first "
                f"{first.get('Key')!r}: {first.get('Code')} {first.get('Message', '')}".rstrip()
            )

    # -- local disk ----------------------------------------------------------------------------

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

    def _local_put(
        self, rel: str, data: bytes | memoryview, *, durable: bool, how: _LocalWrite
    ) -> None:
        """Write ``rel`` on local disk: ``link`` a temporary file to it (put-if-absent),
        ``replace`` it with one (put), or create it ``new`` in place (put_new)."""
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
                    f"{rel!r} was written but its directory could not be synced: {_reason(exc)}"
                ) from exc

    def _write_error(self, what: str, rel: str, exc: OSError) -> KStoreError:
        """A failed local write as an error naming the path and the cause: one the write cannot
        succeed after (a full disk, a read-only filesystem: :class:`StorageNotWritableError`,
        not retriable), else a :class:`StorageError`."""
        reason = _NOT_WRITABLE.get(exc.errno or 0)
        if reason is None:
            return StorageError(f"{what} {rel!r} failed: {_reason(exc)}")
        code = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        outcome = "; nothing was written" if what == "writing" else ""
        if exc.errno == errno.ENOSPC:
            outcome += " (free space, then try again)"
        return StorageNotWritableError(
            f"{what} {rel!r} in {self.display_url} failed: {reason} ({code}){outcome}",
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


def _is_precondition_failed(exc: BaseException) -> bool:
    """True for an S3 412 PreconditionFailed that s3fs did not map to FileExistsError.

    s3fs raises FileExistsError only when the error body names the ``If-None-Match``
    condition; SeaweedFS's 412 body does not, so s3fs raises ``OSError(EINVAL)`` whose cause is
    the botocore ``ClientError``. Without this, a lost commit race there looks like a storage
    failure (an ambiguous commit) instead of a plain conflict.
    """
    cause = exc.__cause__
    response = getattr(cause, "response", None)
    if isinstance(response, Mapping):
        error = response.get("Error") or {}
        meta = response.get("ResponseMetadata") or {}
        return bool(error.get("Code") == "PreconditionFailed" or meta.get("HTTPStatusCode") == 412)
    return False


def _coalesce(
    ranges: Sequence[tuple[int, int]], gap: int, limit: int | None = None
) -> list[tuple[int, int, list[int]]]:
    """Merge byte ranges into runs ``(start, end, indexes of the ranges inside)``: ranges that
    overlap or lie within ``gap`` bytes of each other share a run, while the run stays within
    ``limit`` bytes (None: any size)."""
    if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
        raise ValueError(f"read_ranges: gap must be a non-negative integer, got {gap!r}")
    for index, item in enumerate(ranges):
        ok = isinstance(item, tuple) and len(item) == 2
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
        if not ok or not 0 <= item[0] <= item[1]:
            raise ValueError(
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


def _local_ranges(path: str, runs: list[tuple[int, int]]) -> list[bytes]:
    with open(path, "rb") as f:
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


def _reason(exc: BaseException) -> str:
    """An error's text, led by the S3 error code when there is one (s3fs's translated errors
    keep only the message: "SignatureDoesNotMatch" says more than its sentence)."""
    text = str(exc) or type(exc).__name__
    response = getattr(exc.__cause__, "response", None) or getattr(exc, "response", None)
    if isinstance(response, Mapping):
        code = (response.get("Error") or {}).get("Code")
        if isinstance(code, str) and code and code not in text:
            return f"{code}: {text}"
    return text


def _directory_entries(path: str, files: list[str]) -> list[str]:
    """``path`` and every directory between it and ``files``, children before parents."""
    dirs = {path}
    for file in files:
        parent = file.rstrip("/").rsplit("/", 1)[0]
        while parent.startswith(path + "/"):
            dirs.add(parent)
            parent = parent.rsplit("/", 1)[0]
    return sorted(dirs, key=len, reverse=True)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _to_ms(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, int | float):
        return int(value * 1000) if value < 10**11 else int(value)
    timestamp = getattr(value, "timestamp", None)
    if callable(timestamp):
        return int(timestamp() * 1000)
    return None
