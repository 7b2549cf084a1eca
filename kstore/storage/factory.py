"""The one place that chooses a backend: from the store URL's protocol."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from kstore.errors import InvalidStoreError
from kstore.storage.backend import Backend
from kstore.storage.options import (
    DIRECT_OPTION,
    KSTORE_OPTIONS,
    LOCAL_PROTOCOLS,
    S3_PROTOCOLS,
    flag_option,
    redact_url,
)

# Protocols whose stores live in one process's memory: no other process (a Spark executor, a
# spark-submit job, a cluster) can reach them.
PROCESS_LOCAL_PROTOCOLS = frozenset({"memory"})


def is_process_local(url: str) -> bool:
    """Whether the store at ``url`` exists only inside this process (``memory://``)."""
    protocol, sep, _ = url.partition("://")
    return bool(sep) and protocol.lower() in PROCESS_LOCAL_PROTOCOLS


def open_backend(
    url: str,
    storage_options: Mapping[str, Any],
    *,
    timeout_s: float,
    attempt_timeout_s: float,
) -> tuple[str, Backend]:
    """(protocol, backend) of a store URL (trailing slashes already stripped): a bare path or
    ``file://`` is the local disk, ``s3://`` S3, ``memory://`` fsspec's memory, any other
    protocol fsspec knows that filesystem. No connection is made."""
    display_url = redact_url(url)
    protocol, sep, rest = url.partition("://")
    if not sep:
        protocol, rest = "file", url  # a bare path means the local disk
    protocol = protocol.lower()
    # Options kstore reads itself never reach the filesystem.
    options = {k: v for k, v in storage_options.items() if k not in KSTORE_OPTIONS}
    if protocol in LOCAL_PROTOCOLS:
        from kstore.storage.local import LocalBackend

        root = os.path.abspath(os.path.expanduser(rest))
        return protocol, LocalBackend(root, display_url, options)
    # Imported here, not at module level: local stores never need fsspec, and it is slow to
    # import (the CLI's start-up time).
    import fsspec

    try:
        fs_cls = fsspec.get_filesystem_class(protocol)
    except (ValueError, ImportError) as exc:
        raise InvalidStoreError(
            f"store URL {display_url!r}: unsupported filesystem {protocol!r} ({exc})"
        ) from None
    root = rest.strip("/")
    if protocol in S3_PROTOCOLS:
        from kstore.storage.s3 import S3Backend

        if not root:
            raise InvalidStoreError(f"store URL {display_url!r} names no bucket")
        direct = flag_option(storage_options, DIRECT_OPTION, default=True)
        # No listings cache: s3fs answers reads and existence checks of files in a directory
        # it once listed from that listing, so a tailing reader would never see the next log
        # version another process commits.
        options.setdefault("use_listings_cache", False)
        # Each attempt gives up on a silent server after attempt_timeout_ms (botocore's
        # connect and read timeouts); the deadline of the whole call is kstore's.
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("connect_timeout", attempt_timeout_s)
        config.setdefault("read_timeout", attempt_timeout_s)
        config.setdefault("retries", {"max_attempts": 3, "mode": "standard"})
        options["config_kwargs"] = config
        backend: Backend = S3Backend(
            protocol,
            fs_cls,
            root,
            display_url,
            options,
            storage_options,
            timeout_s=timeout_s,
            attempt_timeout_s=attempt_timeout_s,
            direct=direct,
        )
        return protocol, backend
    if protocol == "memory":
        from kstore.storage.memory import MemoryBackend

        return protocol, MemoryBackend(
            protocol, fs_cls, root, display_url, options, storage_options
        )
    from kstore.storage.fsspec_other import FsspecBackend

    return protocol, FsspecBackend(protocol, fs_cls, root, display_url, options, storage_options)
