"""One :class:`kstore.Store` per store and process, shared by every task the process runs.

Spark reuses Python workers across tasks, so keeping the Store (its partition objects, their
cached manifest states and its segment cache) saves re-reading the store marker and manifests
on every task. The cache size is part of the key: batch reads use no segment cache (each
segment is read once, and a cache would make repeated scans look faster than they are),
streaming reads a small one (a micro-batch limit may cut a segment in two).
"""

from __future__ import annotations

import threading

from kstore.store import Store

from .options import StoreRef

BATCH_CACHE_BYTES = 0
STREAM_CACHE_BYTES = 64 * 1024 * 1024
_MAX_STORES = 16  # a limit on everything: a worker rarely talks to more than a few stores

_lock = threading.Lock()
_stores: dict[tuple[StoreRef, int], Store] = {}


def get_store(ref: StoreRef, cache_bytes: int = BATCH_CACHE_BYTES) -> Store:
    key = (ref, cache_bytes)
    with _lock:
        store = _stores.get(key)
    if store is not None:
        return store
    # create=False: a mistyped URL raises StoreNotFoundError rather than reading an empty store.
    store = Store(ref.url, ref.storage_options, create=False, segment_cache_bytes=cache_bytes)
    with _lock:
        if len(_stores) >= _MAX_STORES:
            _stores.pop(next(iter(_stores)))
        return _stores.setdefault(key, store)


def forget_stores() -> None:
    """Drop every cached store (tests that recreate a store at the same URL use this)."""
    with _lock:
        _stores.clear()
