"""S3 through s3fs, with the data path's requests sent directly (:mod:`kstore.storage.s3direct`).

Every call runs on s3fs's event loop under a deadline (the storage options ``timeout_ms`` and
``attempt_timeout_ms``) and fails with :class:`StorageTimeoutError` naming the endpoint when it
passes. Put-if-absent is a PUT with ``If-None-Match: *``; every 412 is "exists". The bodies are
never empty (an empty body bypasses the condition: the facade refuses one).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import functools
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from kstore.errors import BucketNotFoundError, StorageError, StorageTimeoutError
from kstore.storage.backend import READ_CONCURRENCY, FileInfo, reason, to_ms
from kstore.storage.fsspec_other import FsspecBackend, is_precondition_failed
from kstore.storage.options import TIMEOUT_OPTION

if TYPE_CHECKING:
    from kstore.storage.s3direct import DirectS3

_T = TypeVar("_T")

# A write may take one more second per MiB of body: a large upload on a slow link is not cut
# off by a deadline meant for a silent server.
_UPLOAD_BYTES_PER_S = 1 << 20
# A GET whose body breaks off is sent again, at most this many times in all.
_GET_ATTEMPTS = 3
# A body larger than this goes through s3fs, which uploads it in parts.
_DIRECT_PUT_MAX = 16 << 20
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


class _NoAnswerError(Exception):
    """A deadline passed while waiting for the server (raised on the I/O loop)."""


class S3Backend(FsspecBackend):
    """A store root ``bucket/prefix`` on S3."""

    remote = True
    pages_are_requests = True
    counts_requests = True

    def __init__(
        self,
        protocol: str,
        fs_cls: Any,
        root: str,
        display_url: str,
        options: dict[str, Any],
        user_options: Mapping[str, Any],
        *,
        timeout_s: float,
        attempt_timeout_s: float,
        direct: bool,
    ) -> None:
        super().__init__(protocol, fs_cls, root, display_url, options, user_options)
        self.timeout_s = timeout_s
        self.attempt_timeout_s = attempt_timeout_s
        self._direct_allowed = direct
        # Until a call has found the bucket, a file not found or a write refused makes one HEAD
        # of the bucket, so that a missing bucket is named as such (check_root).
        self._bucket_seen = False

    @property
    def atomic_create(self) -> str | None:
        return "if-none-match"

    def _default_service(self) -> str:
        return "AWS S3"

    def object_store_url(self, rel: str) -> str | None:
        return f"s3://{self.root}/{rel}"

    def object_store_options(self) -> dict[str, str]:
        """The AWS options of object_store (delta-rs, Polars, DuckDB's delta extension), from
        the s3fs options: credentials, endpoint and region."""
        options = self._user_options
        client = dict(options.get("client_kwargs") or {})
        endpoint = options.get("endpoint_url") or client.get("endpoint_url")
        region = options.get("region_name") or client.get("region_name")
        pairs = {
            "AWS_ACCESS_KEY_ID": options.get("key"),
            "AWS_SECRET_ACCESS_KEY": options.get("secret"),
            "AWS_SESSION_TOKEN": options.get("token"),
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_REGION": region or "us-east-1",
        }
        out = {k: str(v) for k, v in pairs.items() if v}
        if endpoint and str(endpoint).startswith("http://"):
            out["AWS_ALLOW_HTTP"] = "true"
        return out

    # -- calls: on s3fs's event loop, each bounded by the deadline ---------------------------

    def _call(
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
        ``make`` bounds its own waits (reads, :meth:`_get`) and raises
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
                loop.call_later(_WAIT_REPORT_S, reporter, f"{self._display_url} ({description})")
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
                f"{description} in {self._display_url}: no answer from {self.endpoint} within "
                f"{limit:g} s (storage option {TIMEOUT_OPTION} sets this deadline)"
            ) from None
        return result

    async def _get(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
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

    def check_root(self) -> None:
        """Before any call has found the bucket: :class:`BucketNotFoundError` when it does not
        exist. Otherwise nothing (the bucket is there, or a HEAD cannot tell: no permission to
        ask, a failure), and the caller's own error stands. At most once per backend that finds
        its bucket: one HEAD, on the first missing file or refused write only."""
        if self._bucket_seen:
            return
        bucket = self.root.split("/", 1)[0]
        try:
            self._call(
                "checking the bucket", "", lambda: self.fs._call_s3("head_bucket", Bucket=bucket)
            )
        except FileNotFoundError:
            raise BucketNotFoundError(
                f"bucket {bucket!r} does not exist at {self.endpoint} "
                f"(store {self._display_url}): create it first; kstore does not create buckets"
            ) from None
        except Exception:  # cannot tell: the caller's error is the one shown
            pass
        self._bucket_seen = True  # asked once, whatever the answer (a HEAD per miss would cost)

    def client(self) -> Any:
        """The botocore client s3fs uses (for hooks on its events)."""
        from fsspec.asyn import sync

        fs = self.fs
        return sync(fs.loop, fs.set_session)

    def direct_requests(self) -> DirectS3 | None:
        """The direct requests of this store's bucket, or None when every request goes through
        s3fs."""
        if not self._direct_allowed:
            return None
        from fsspec.asyn import sync

        found: DirectS3 | None = sync(
            self.fs.loop, self._direct, self.fs.split_path(self.full_path("x"))[0]
        )
        return found

    async def _direct(self, bucket: str) -> DirectS3 | None:
        """The direct requests for ``bucket``, or None: through s3fs."""
        if not self._direct_allowed:
            return None
        from kstore.storage.s3direct import direct_for

        fs = self.fs
        client = await fs.set_session()
        direct = direct_for(fs, client, self.attempt_timeout_s)
        return direct if direct is not None and direct.serves(bucket) else None

    async def _put(self, path: str, data: bytes | memoryview, *, create: bool) -> None:
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
        counts: collections.Counter[str] = collections.Counter()
        lock = threading.Lock()

        def count(event_name: str, **_: Any) -> None:
            operation = event_name.rsplit(".", 1)[-1]
            with lock:
                counts[_REQUEST_KINDS.get(operation, operation)] += 1

        def count_direct(kind: str, _key: str) -> None:
            with lock:
                counts[kind] += 1

        events = self.client().meta.events
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

    # -- reads -------------------------------------------------------------------------------

    def read(self, rel: str) -> bytes:
        path = self.full_path(rel)
        found: bytes = self._call("reading", rel, lambda: self._get(path), own_deadline=True)
        self._bucket_seen = True
        return found

    def read_many(self, rels: list[str]) -> dict[str, bytes]:
        return self._call(
            f"reading {len(rels)} files", "", lambda: self._read_many(rels), own_deadline=True
        )

    async def _read_many(self, rels: list[str]) -> dict[str, bytes]:
        """GETs of several objects, ``READ_CONCURRENCY`` at a time; the first failure other
        than an absent object cancels the rest and is raised."""
        import asyncio

        gate = asyncio.Semaphore(READ_CONCURRENCY)
        out: dict[str, bytes] = {}

        async def one(rel: str) -> None:
            async with gate:
                try:
                    out[rel] = await self._get(self.full_path(rel))
                except FileNotFoundError:
                    pass
                except _NoAnswerError:
                    raise
                except Exception as exc:
                    raise StorageError(
                        f"reading {rel!r} from {self._display_url!r} failed: {reason(exc)}"
                    ) from exc

        try:
            async with asyncio.TaskGroup() as group:
                for rel in rels:
                    group.create_task(one(rel))
        except BaseExceptionGroup as failures:
            raise failures.exceptions[0] from None
        return out

    def read_ranges(self, rel: str, runs: list[tuple[int, int]]) -> list[bytes]:
        path = self.full_path(rel)
        return self._call("reading", rel, lambda: self._ranges(path, runs), own_deadline=True)

    async def _ranges(self, path: str, runs: list[tuple[int, int]]) -> list[bytes]:
        import asyncio

        async def one(start: int, end: int) -> bytes:
            try:
                return await self._get(path, start, end)
            except OSError as exc:
                if "InvalidRange" in reason(exc) or "not satisfiable" in str(exc).lower():
                    return b""  # starts at or past the end of the object (416)
                raise

        gate = asyncio.Semaphore(READ_CONCURRENCY)

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
        return bool(self._call("checking", rel, lambda: self.fs._exists(path)))

    def list_dir(self, rel: str) -> list[FileInfo]:
        path = self.full_path(rel)
        try:
            self.fs.invalidate_cache(path)
            items = self._call("listing", rel, lambda: self._list(path), own_deadline=True)
            self._bucket_seen = self._bucket_seen or bool(items)
        except FileNotFoundError:
            self.check_root()
            return []
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"listing {rel!r} failed: {reason(exc)}") from exc
        out = []
        for item in items:
            name = str(item["name"]).rstrip("/").rsplit("/", 1)[-1]
            out.append(FileInfo(name, int(item.get("size") or 0), to_ms(item.get("LastModified"))))
        return out

    async def _list(self, path: str, *, recursive: bool = False) -> list[dict[str, Any]]:
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

    def list_pages(self, rel: str, start_after: str, page_size: int) -> Iterator[list[FileInfo]]:
        """One LIST request (``list_objects_v2`` with ``StartAfter``, then its continuation
        token) per page, sent only when the caller asks for the next page. The deadline bounds
        each page."""
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
                page = self._call("listing", rel, functools.partial(self._page, request))
            except FileNotFoundError:
                return  # no bucket: nothing below it
            except StorageError:
                raise
            except Exception as exc:
                raise StorageError(f"listing {rel!r} failed: {reason(exc)}") from exc
            out = [
                FileInfo(common["Prefix"][len(prefix) :].rstrip("/"), 0, None)
                for common in page.get("CommonPrefixes", [])
            ]
            out.extend(
                FileInfo(
                    entry["Key"][len(prefix) :],
                    int(entry.get("Size") or 0),
                    to_ms(entry.get("LastModified")),
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

    async def _page(self, request: dict[str, Any]) -> dict[str, Any]:
        page: dict[str, Any] = await self.fs._call_s3("list_objects_v2", **request)
        return page

    def stat_many(self, rels: list[str]) -> dict[str, FileInfo]:
        """One HEAD per file, concurrently."""
        try:
            heads = self._call(f"inspecting {len(rels)} file(s)", "", lambda: self._heads(rels))
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"inspecting {rels[0]!r} ... failed: {reason(exc)}") from exc
        return {
            rel: FileInfo(
                rel.rsplit("/", 1)[-1],
                int(head.get("ContentLength") or 0),
                to_ms(head.get("LastModified")),
            )
            for rel, head in heads.items()
        }

    async def _heads(self, rels: list[str]) -> dict[str, dict[str, Any]]:
        import asyncio

        fs = self.fs
        gate = asyncio.Semaphore(READ_CONCURRENCY)
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

    def put_if_absent(self, rel: str, data: bytes | memoryview, *, durable: bool) -> None:
        try:
            self._write(rel, data, create=True)
        except FileExistsError:
            self._bucket_seen = True
            raise
        except StorageError:
            raise
        except Exception as exc:
            if is_precondition_failed(exc):
                raise FileExistsError(errno.EEXIST, "exists", rel) from exc
            self.check_root()  # moto: NoSuchBucket; SeaweedFS: 403 AccessDenied
            raise StorageError(f"conditional write of {rel!r} failed: {reason(exc)}") from exc

    def put(self, rel: str, data: bytes, *, durable: bool) -> None:
        try:
            self._write(rel, data, create=False)
        except StorageError:
            raise
        except Exception as exc:
            self.check_root()
            raise StorageError(f"writing {rel!r} failed: {reason(exc)}") from exc

    def _write(self, rel: str, data: bytes | memoryview, *, create: bool) -> None:
        path = self.full_path(rel)
        self._call(
            "writing",
            rel,
            lambda: self._put(path, data, create=create),
            deadline_s=self.timeout_s + len(data) / _UPLOAD_BYTES_PER_S,
        )
        self._bucket_seen = True

    def delete(self, rels: Sequence[str]) -> None:
        for rel in rels:
            path = self.full_path(rel)
            try:
                self._call("deleting", rel, functools.partial(self.fs._rm_file, path))
            except FileNotFoundError:
                pass
            except StorageError:
                raise
            except Exception as exc:
                raise StorageError(f"deleting {path!r} failed: {reason(exc)}") from exc

    def delete_tree(self, rel: str) -> None:
        """List every file below ``rel`` (a page at a time), delete them 1,000 to a request,
        then the directory entries; each request under its own deadline, so a large topic
        can be deleted."""
        path = self.full_path(rel)
        try:
            self.fs.invalidate_cache(path)
            self._delete_tree(rel, path)
        except FileNotFoundError:
            pass
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"deleting {rel!r} failed: {reason(exc)}") from exc

    def _delete_tree(self, rel: str, path: str) -> None:
        listed = self._call(
            "listing", rel, lambda: self._list(path, recursive=True), own_deadline=True
        )
        files = [str(item["name"]) for item in listed]
        for start in range(0, len(files), 1000):
            batch = files[start : start + 1000]
            self._call("deleting", rel, functools.partial(self._delete_keys, batch))
        fs = self.fs
        for directory in _directory_entries(path, files):
            bucket, key, _ = fs.split_path(directory)
            if key:
                # SeaweedFS keeps a directory entry after the last file below it is deleted
                # (listings still show it and ``exists`` stays true); deleting the key
                # ``<dir>/`` removes it. On plain S3 no such keys exist: a no-op.
                entry = {"Bucket": bucket, "Key": key + "/"}
                self._call(
                    "deleting", rel, functools.partial(fs._call_s3, "delete_object", **entry)
                )
        fs.invalidate_cache(path)

    async def _delete_keys(self, paths: list[str]) -> None:
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


def _directory_entries(path: str, files: list[str]) -> list[str]:
    """``path`` and every directory between it and ``files``, children before parents."""
    dirs = {path}
    for file in files:
        parent = file.rstrip("/").rsplit("/", 1)[0]
        while parent.startswith(path + "/"):
            dirs.add(parent)
            parent = parent.rsplit("/", 1)[0]
    return sorted(dirs, key=len, reverse=True)
