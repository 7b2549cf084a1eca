"""Store URLs and storage options: what kstore reads of them itself, which URLs and options it
refuses, and how they are shown (credentials removed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kstore.errors import InvalidStoreError
from kstore.settings import Setting, Settings, boolean_text, integer

LOCAL_PROTOCOLS = ("file", "local")
S3_PROTOCOLS = ("s3", "s3a")
_SECRET_WORDS = ("secret", "password", "token", "key", "credential", "session")

# Storage options kstore reads itself; they never reach the filesystem (OPERATIONS.md,
# "Timeouts"). ``timeout_ms``: how long one storage call may wait for the server,
# its retries included. ``attempt_timeout_ms``: how long one attempt may wait to connect or for
# the next bytes of an answer before it is given up and retried.
TIMEOUT_OPTION = "timeout_ms"
ATTEMPT_TIMEOUT_OPTION = "attempt_timeout_ms"
# ``s3_direct_requests``: false sends every S3 request through s3fs (kstore.storage.s3direct
# says which requests go straight over HTTP otherwise, and when).
DIRECT_OPTION = "s3_direct_requests"
KSTORE_OPTIONS = (TIMEOUT_OPTION, ATTEMPT_TIMEOUT_OPTION, DIRECT_OPTION)
DEFAULT_TIMEOUT_MS = 30_000
DEFAULT_ATTEMPT_TIMEOUT_MS = 10_000
_MAX_TIMEOUT_MS = 24 * 3600 * 1000

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


# kstore's own storage options on the settings model (their messages name "storage option").
STORAGE_SETTINGS = Settings(
    "storage option",
    [
        Setting(
            TIMEOUT_OPTION,
            DEFAULT_TIMEOUT_MS,
            integer(1, _MAX_TIMEOUT_MS),
            "How long one storage call may wait for the server, its retries included (ms).",
        ),
        Setting(
            ATTEMPT_TIMEOUT_OPTION,
            DEFAULT_ATTEMPT_TIMEOUT_MS,
            integer(1, _MAX_TIMEOUT_MS),
            "How long one attempt may wait to connect or for the next bytes (ms).",
        ),
        Setting(
            DIRECT_OPTION,
            True,
            boolean_text,
            "Whether the data path's S3 GETs and PUTs go straight over HTTP (else via s3fs).",
        ),
    ],
    label=lambda name: f"storage option {name!r}",
    error=InvalidStoreError,
)


def timeout_option(options: Mapping[str, Any], name: str, default: int) -> int:
    """A timeout option in milliseconds: an integer (or a string of digits, as Spark and the
    environment give them) from 1 to one day."""
    value: int = STORAGE_SETTINGS.parse(name, options.get(name, default))
    return value


def flag_option(options: Mapping[str, Any], name: str, *, default: bool) -> bool:
    """A yes/no option: a boolean, or the strings true/false (as Spark and the environment
    give them)."""
    value: bool = STORAGE_SETTINGS.parse(name, options.get(name, default))
    return value


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
    if sep and scheme.lower() not in LOCAL_PROTOCOLS:
        return
    unknown = sorted(set(storage_options or {}) - set(LOCAL_STORAGE_OPTIONS), key=str)
    if unknown:
        raise InvalidStoreError(
            f"storage option {unknown[0]!r} means nothing to a store on the local disk "
            f"({redact_url(url)}); local stores take only {', '.join(LOCAL_STORAGE_OPTIONS)}"
        )
