"""GETs and PUTs of S3 objects sent straight over HTTP, signed with botocore's SigV4 signer.

A read or write through s3fs goes through botocore's whole request pipeline: endpoint rules
resolved per call, the user-agent string rebuilt, every header copied through several
dictionaries, the response parsed by a generic model. Measured here on SeaweedFS over
loopback, that costs about 1.7 ms of CPU per GET, three times what the same GET costs sent
this way (0.6 ms), and on a small machine shared by a producer, a consumer and the store, CPU
per request is what bounds latency. So the requests of the data path (a GET of a whole object
or a byte range, a PUT, a PUT with ``If-None-Match: *``) are sent here, and everything else
(listings, deletes, multipart uploads) stays with s3fs.

Nothing is configured twice: the endpoint, region and credentials (refreshed as botocore
refreshes them) are s3fs's own client's. The direct path is used only where it sends exactly
the request s3fs would: a filesystem with extra request arguments (requester pays, server-side
encryption, ACLs), version awareness, or an endpoint that needs botocore's rules (accelerate,
dual-stack, FIPS, virtual-hosted addressing on a custom endpoint, AWS buckets whose names are
not DNS labels) keeps s3fs for everything, and so does a store with the storage option
``s3_direct_requests`` set to false.

Failures read as s3fs's do: an absent object is ``FileNotFoundError``, a refused condition
``FileExistsError``, a refused signature or permission ``PermissionError``, anything else an
``OSError`` naming the HTTP status and S3's error code; never a credential. An attempt that
gets no answer (each waits at most the attempt timeout to connect or for the next bytes) is sent
again until the caller's deadline; a server that refuses connections fails after three
attempts, and the answers botocore's standard retry mode retries (500, 502, 503, 504,
throttling) are retried, three attempts in all. A create (``If-None-Match: *``) refused after
one of its attempts went unanswered reads the object back: holding exactly its bytes, it was
that attempt's, and the create succeeded.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import hashlib
import logging
import os
import random
import re
import threading
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

log = logging.getLogger(__name__)

_ATTEMPTS = 3
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_RETRY_CODES = frozenset({"SlowDown", "Throttling", "RequestTimeout", "InternalError"})
_BACKOFF_S = 0.05
_DNS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")
_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")


class _WriteOfALostRequest(logging.Filter):
    """Drops asyncio's report of aiohttp's body-writing task failing on a connection the server
    closed (a storage restart, a dropped connection): the request itself failed and was
    retried or raised, and the report only repeats that as a stray traceback on stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (
            exc is not None
            and type(exc).__name__ == "ClientConnectionResetError"
            and "write_bytes" in record.getMessage()
        )


class DirectS3:
    """The direct requests of one s3fs filesystem instance (shared by every Storage that uses
    it). Its coroutines run on that filesystem's event loop."""

    def __init__(
        self,
        client: Any,
        base_url: Callable[[str], str | None],
        region: str,
        attempt_timeout_s: float,
        loop: Any,
        *,
        anonymous: bool = False,
    ) -> None:
        self._client = client
        self._anonymous = anonymous
        self._base_url = base_url
        self.loop = loop
        self._region = region
        self._attempt_timeout_s = attempt_timeout_s
        self._session: Any = None
        # Called with the method ("GET", "PUT") and key before each attempt is sent: to count
        # requests (Storage.count_requests), or, in tests, to refuse one by raising OSError.
        self.before_send: list[Callable[[str, str], None]] = []
        # Called with the method, key and HTTP status of each answer; one that returns True
        # makes the answer count as lost on the way (tests: a PUT that landed unacknowledged).
        self.after_answer: list[Callable[[str, str, int], bool]] = []

    # -- set-up ----------------------------------------------------------------------------

    def serves(self, bucket: str) -> bool:
        """Whether requests to ``bucket`` can go this way (else through s3fs)."""
        return self._base_url(bucket) is not None

    @staticmethod
    def base_url_for(client: Any, fs: Any) -> Callable[[str], str | None] | None:
        """bucket -> the URL of its root (None for a bucket only botocore's rules can place),
        or None when only botocore's rules can say for any bucket."""
        if getattr(fs, "req_kw", None) or getattr(fs, "s3_additional_kwargs", None):
            return None
        if getattr(fs, "version_aware", False):
            return None
        config = client.meta.config
        s3 = dict(getattr(config, "s3", None) or {})
        if any(s3.get(k) for k in ("use_accelerate_endpoint", "use_dualstack_endpoint")):
            return None
        if getattr(config, "use_fips_endpoint", False) or getattr(
            config, "use_dualstack_endpoint", False
        ):
            return None
        endpoint = str(client.meta.endpoint_url or "").rstrip("/")
        region = client.meta.region_name or "us-east-1"
        host = endpoint.split("://", 1)[-1].split("/", 1)[0].lower()
        if host.endswith(".amazonaws.com") or host == "amazonaws.com":
            if s3.get("addressing_style") == "path" or not endpoint.startswith("https://"):
                return None

            def virtual(bucket: str) -> str | None:
                if not _DNS_BUCKET.match(bucket):
                    return None  # dots, or not a DNS label: botocore knows what to do
                return f"https://{bucket}.s3.{region}.amazonaws.com"

            return virtual
        if s3.get("addressing_style") == "virtual" or not endpoint:
            return None
        return lambda bucket: f"{endpoint}/{quote(bucket, safe='')}"

    async def _http(self) -> Any:
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(
                    total=None,
                    sock_connect=self._attempt_timeout_s,
                    sock_read=self._attempt_timeout_s,
                ),
                auto_decompress=False,
            )
            _SESSIONS.add(self)
            asyncio_log = logging.getLogger("asyncio")
            if not any(isinstance(f, _WriteOfALostRequest) for f in asyncio_log.filters):
                asyncio_log.addFilter(_WriteOfALostRequest())
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    # -- requests --------------------------------------------------------------------------

    async def get(self, bucket: str, key: str, start: int | None, end: int | None) -> bytes:
        headers = {"x-amz-content-sha256": _EMPTY_SHA256}
        if start is not None and end is not None:
            headers["Range"] = f"bytes={start}-{end - 1}"
        return await self._send("GET", bucket, key, headers, b"")

    async def put(self, bucket: str, key: str, data: bytes, *, if_absent: bool) -> None:
        headers = {
            "x-amz-content-sha256": hashlib.sha256(data).hexdigest(),
            "Content-Length": str(len(data)),
        }
        if if_absent:
            headers["If-None-Match"] = "*"
        await self._send("PUT", bucket, key, headers, data)

    async def _landed_earlier(self, bucket: str, key: str, body: bytes) -> bool:
        """Whether a create refused after one of its attempts went unanswered was made by that
        attempt: the object holds exactly ``body``. Otherwise, or when it cannot be read, the
        refusal stands (another writer made it, or it is gone again)."""
        try:
            found = await self.get(bucket, key, None, None)
        except (FileNotFoundError, OSError):
            return False
        return found == body

    async def _send(
        self, method: str, bucket: str, key: str, headers: dict[str, str], body: bytes
    ) -> bytes:
        """Send until answered. An attempt without an answer (a timeout, a dropped connection)
        is sent again until the caller's deadline cancels this; one the server cannot be
        reached for at all fails after ``_ATTEMPTS``; an error answer is retried as botocore's
        standard mode retries it."""
        import aiohttp
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from yarl import URL

        root = self._base_url(bucket)
        if root is None:
            raise ValueError(f"bucket {bucket!r} is not served by direct requests")
        url = f"{root}/{quote(key, safe='/~')}"
        session = await self._http()
        refused = answered = 0
        unanswered = False  # an attempt went without an answer: it may have landed
        while True:
            request = AWSRequest(method=method, url=url, headers=dict(headers), data=body)
            if not self._anonymous:
                credentials = self._client._get_credentials()
                if credentials is None:
                    from botocore.exceptions import NoCredentialsError

                    raise NoCredentialsError  # as botocore says it
                frozen = await credentials.get_frozen_credentials()
                S3SigV4Auth(frozen, "s3", self._region).add_auth(request)
            for hook in list(self.before_send):
                hook(method, key)
            status = 0
            try:
                async with session.request(
                    method, URL(url, encoded=True), headers=dict(request.headers.items()), data=body
                ) as response:
                    status = response.status
                    payload: bytes = await response.read()
            except aiohttp.ClientConnectorError as exc:
                refused += 1
                if refused == _ATTEMPTS:
                    raise OSError(f"{method} failed: cannot connect ({exc.os_error})") from None
            except (aiohttp.ClientError, TimeoutError, OSError):
                pass  # no answer: sent again
            else:
                if any(hook(method, key, status) for hook in list(self.after_answer)):
                    status = 0  # the answer was lost on the way
            if status == 0:
                unanswered = True
                await asyncio.sleep(_BACKOFF_S * random.random())
                continue
            if status < 300:
                return payload
            found = _CODE.search(payload)
            code = found.group(1).decode("ascii", "replace") if found else ""
            if status == 404:
                raise FileNotFoundError(key)
            if status == 412:
                if (
                    unanswered
                    and method == "PUT"
                    and headers.get("If-None-Match") == "*"
                    and await self._landed_earlier(bucket, key, body)
                ):
                    return b""
                raise FileExistsError(key)
            if status == 416:
                return b""  # a range starting at or past the end
            answered += 1
            if (status in _RETRY_STATUS or code in _RETRY_CODES) and answered < _ATTEMPTS:
                await asyncio.sleep(_BACKOFF_S * 2**answered * random.random())
                continue
            if status == 403:
                raise PermissionError(f"{method} refused (HTTP 403 {code or 'Forbidden'})")
            raise OSError(f"{method} failed: HTTP {status} {code}".rstrip())


_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_BY_FS: weakref.WeakKeyDictionary[Any, DirectS3 | None] = weakref.WeakKeyDictionary()
_BY_FS_LOCK = threading.Lock()
_SESSIONS: weakref.WeakSet[DirectS3] = weakref.WeakSet()


def direct_for(fs: Any, client: Any, attempt_timeout_s: float) -> DirectS3 | None:
    """The direct requests of ``fs`` (whose botocore client is ``client``), or None when its
    requests must go through s3fs."""
    with _BY_FS_LOCK:
        if fs in _BY_FS:
            return _BY_FS[fs]
    try:
        base = DirectS3.base_url_for(client, fs)
        direct = (
            None
            if base is None
            else DirectS3(
                client,
                base,
                client.meta.region_name or "us-east-1",
                attempt_timeout_s,
                fs.loop,
                anonymous=bool(getattr(fs, "anon", False)),
            )
        )
    except Exception:  # anything unexpected in a client's set-up: s3fs does it all
        log.debug("S3 requests go through s3fs", exc_info=True)
        direct = None
    with _BY_FS_LOCK:
        return _BY_FS.setdefault(fs, direct)


def _forget_after_fork() -> None:
    # A forked child cannot use its parent's sessions (their event loop is the parent's).
    global _BY_FS_LOCK
    _BY_FS.clear()
    _SESSIONS.clear()
    _BY_FS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


@atexit.register
def _close_sessions() -> None:
    """Close the HTTP sessions on their loops (aiohttp warns of one left open at exit)."""
    for direct in list(_SESSIONS):
        loop = getattr(direct, "loop", None)
        if loop is None or not loop.is_running():
            continue
        with contextlib.suppress(Exception):  # exiting: nothing more to do
            asyncio.run_coroutine_threadsafe(direct.close(), loop).result(timeout=2)
