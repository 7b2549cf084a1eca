"""Any fsspec filesystem kstore has no backend of its own for (and the base of ``memory``).

Such a filesystem has no known atomic create unless it declares one: a filesystem (typically a
wrapper around a built-in backend, such as the tests' fault-injecting one) whose
``kstore_atomic_create`` attribute names one of :data:`ATOMIC_CREATE_KINDS` promises that
``pipe_file(path, data, mode="create")`` is an atomic put-if-absent of that kind, raising
:class:`FileExistsError` (or an S3 412) when the path exists. Its ``ls`` must report
modification times (leases are judged by them). Without one, the facade refuses writes unless
the user opted in (``allow_unsafe_writes``), and put-if-absent is then check-then-write.
"""

from __future__ import annotations

import collections
import contextlib
import errno
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from kstore.errors import InvalidStoreError, StorageError
from kstore.storage.backend import (
    ATOMIC_CREATE_KINDS,
    FileInfo,
    info_of,
    pages_of,
    reason,
    require_body,
)
from kstore.storage.options import redact_url


class FsspecBackend:
    """A store root on an fsspec filesystem, through its synchronous API."""

    remote = True
    pages_are_requests = False
    range_run_limit: int | None = None
    writes_views = False
    counts_requests = False
    local_root: str | None = None

    def __init__(
        self,
        protocol: str,
        fs_cls: Any,
        root: str,
        display_url: str,
        options: dict[str, Any],
        user_options: Mapping[str, Any],
    ) -> None:
        self.protocol = protocol
        self.root = root
        self._fs_cls = fs_cls
        self._fs: Any = None
        self._display_url = display_url
        self._options = options  # what the filesystem is made with
        self._user_options = user_options  # as given: for messages

    @property
    def fs(self) -> Any:
        if self._fs is None:
            try:
                self._fs = self._fs_cls(**self._options)
            except TypeError as exc:
                raise InvalidStoreError(
                    f"store {self._display_url!r}: bad storage options "
                    f"{sorted(self._user_options)}: {exc}"
                ) from None
        return self._fs

    @property
    def atomic_create(self) -> str | None:
        """The put-if-absent kind the filesystem declares, or None. Looked up on the class
        first, so that a filesystem that declares none is not made to answer."""
        if getattr(self._fs_cls, "kstore_atomic_create", None) is None:
            return None
        kind = getattr(self.fs, "kstore_atomic_create", None)  # may depend on the instance
        return kind if kind in ATOMIC_CREATE_KINDS else None

    @property
    def endpoint(self) -> str:
        kwargs = self._user_options.get("client_kwargs")
        endpoint = self._user_options.get("endpoint_url")
        if isinstance(kwargs, Mapping):
            endpoint = kwargs.get("endpoint_url", endpoint)
        if isinstance(endpoint, str) and endpoint:
            return redact_url(endpoint)
        return self._default_service()

    def _default_service(self) -> str:
        return self.protocol

    def full_path(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

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
        data: bytes = self.fs.cat_file(self.full_path(rel))
        return data

    def read_many(self, rels: list[str]) -> dict[str, bytes]:
        paths = {self.full_path(rel): rel for rel in rels}
        try:
            found = self.fs.cat(list(paths), on_error="return")
        except Exception as exc:
            raise StorageError(
                f"reading {len(rels)} files from {self._display_url!r} failed: {reason(exc)}"
            ) from exc
        out = {}
        for path, rel in paths.items():
            data = found.get(path) if path in found else self._read_alone(path)
            if data is None or isinstance(data, FileNotFoundError):
                continue
            if isinstance(data, BaseException):
                raise StorageError(
                    f"reading {rel!r} from {self._display_url!r} failed: {reason(data)}"
                ) from data
            out[rel] = data
        return out

    def _read_alone(self, path: str) -> bytes | BaseException:
        """A file the filesystem left out of ``cat``'s answer, asked for alone."""
        try:
            data: bytes = self.fs.cat_file(path)
        except Exception as exc:
            return exc
        return data

    def read_ranges(self, rel: str, runs: list[tuple[int, int]]) -> list[bytes]:
        path = self.full_path(rel)
        return [bytes(self.fs.cat_file(path, start=s, end=e)) for s, e in runs]

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self.full_path(rel)))

    def list_dir(self, rel: str) -> list[FileInfo]:
        path = self.full_path(rel)
        try:
            self.fs.invalidate_cache(path)
            items = self.fs.ls(path, detail=True)
        except FileNotFoundError:
            return []
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"listing {rel!r} failed: {reason(exc)}") from exc
        return [info_of(str(item["name"]).rstrip("/").rsplit("/", 1)[-1], item) for item in items]

    def list_pages(self, rel: str, start_after: str, page_size: int) -> Iterator[list[FileInfo]]:
        return pages_of(self.list_dir(rel), start_after, page_size)

    def stat_many(self, rels: list[str]) -> dict[str, FileInfo]:
        out: dict[str, FileInfo] = {}
        for rel in rels:
            try:
                info = self.fs.info(self.full_path(rel))
            except FileNotFoundError:
                continue
            except Exception as exc:
                raise StorageError(f"inspecting {rel!r} failed: {reason(exc)}") from exc
            out[rel] = info_of(rel.rsplit("/", 1)[-1], info)
        return out

    # -- writes ------------------------------------------------------------------------------

    def put_if_absent(self, rel: str, data: bytes | memoryview, *, durable: bool) -> None:
        path = self.full_path(rel)
        if self.atomic_create is None:  # allow_unsafe_writes: check-then-write, single writer
            if self.fs.exists(path):
                raise FileExistsError(errno.EEXIST, "exists", rel)
            self.fs.pipe_file(path, data)
            return
        try:
            self.fs.pipe_file(path, data, mode="create")
        except (FileExistsError, StorageError):
            raise
        except Exception as exc:
            if is_precondition_failed(exc):
                raise FileExistsError(errno.EEXIST, "exists", rel) from exc
            raise StorageError(f"conditional write of {rel!r} failed: {reason(exc)}") from exc

    def put_new(self, rel: str, data: bytes | memoryview, *, durable: bool) -> None:
        require_body(data)
        self.put_if_absent(rel, data, durable=durable)

    def put(self, rel: str, data: bytes, *, durable: bool) -> None:
        try:
            self.fs.pipe_file(self.full_path(rel), data)
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"writing {rel!r} failed: {reason(exc)}") from exc

    def delete(self, rels: Sequence[str]) -> None:
        for rel in rels:
            path = self.full_path(rel)
            try:
                self.fs.rm_file(path)
            except FileNotFoundError:
                pass
            except StorageError:
                raise
            except Exception as exc:
                raise StorageError(f"deleting {path!r} failed: {reason(exc)}") from exc

    def delete_tree(self, rel: str) -> None:
        path = self.full_path(rel)
        try:
            self.fs.invalidate_cache(path)
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        except StorageError:
            raise
        except Exception as exc:
            raise StorageError(f"deleting {rel!r} failed: {reason(exc)}") from exc


def is_precondition_failed(exc: BaseException) -> bool:
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
