"""Storage: one facade (:class:`Storage`) over one backend per kind of storage.

- :mod:`~kstore.storage.backend`: the :class:`Backend` protocol (the primitive operations and
  the capabilities that differ), :class:`FileInfo`, :func:`unique_id`;
- :mod:`~kstore.storage.local`, :mod:`~kstore.storage.s3` (with :mod:`~kstore.storage.s3direct`,
  the data path's direct requests), :mod:`~kstore.storage.memory`,
  :mod:`~kstore.storage.fsspec_other`: one backend each;
- :mod:`~kstore.storage.factory`: the one place a backend is chosen, from the store URL;
- :mod:`~kstore.storage.options`: store URLs and the storage options kstore reads itself;
- :mod:`~kstore.storage.facade`: :class:`Storage`, what every other module uses.
"""

from kstore.storage.backend import ATOMIC_CREATE_KINDS, Backend, FileInfo, unique_id
from kstore.storage.facade import COALESCE_GAP, LIST_PAGE_SIZE, Storage
from kstore.storage.factory import is_process_local
from kstore.storage.local import LOCAL_RUN_BYTES, WRITE_CALL_BYTES
from kstore.storage.options import (
    ATTEMPT_TIMEOUT_OPTION,
    DEFAULT_ATTEMPT_TIMEOUT_MS,
    DEFAULT_TIMEOUT_MS,
    DIRECT_OPTION,
    LOCAL_STORAGE_OPTIONS,
    TIMEOUT_OPTION,
    check_store_url,
    redact_options,
    redact_url,
)
from kstore.storage.s3 import set_wait_reporter

__all__ = [
    "ATOMIC_CREATE_KINDS",
    "ATTEMPT_TIMEOUT_OPTION",
    "COALESCE_GAP",
    "DEFAULT_ATTEMPT_TIMEOUT_MS",
    "DEFAULT_TIMEOUT_MS",
    "DIRECT_OPTION",
    "LIST_PAGE_SIZE",
    "LOCAL_RUN_BYTES",
    "LOCAL_STORAGE_OPTIONS",
    "TIMEOUT_OPTION",
    "WRITE_CALL_BYTES",
    "Backend",
    "FileInfo",
    "Storage",
    "check_store_url",
    "is_process_local",
    "redact_options",
    "redact_url",
    "set_wait_reporter",
    "unique_id",
]
