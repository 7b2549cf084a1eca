"""The web console (``kstore ui``) and the Prometheus exporter (``/metrics``, also served by
``kstore maintain --metrics-port``): topics, partitions, consumer groups and their lag, the
maintenance service's state, from one snapshot of the store refreshed at most once per interval.

- snapshot.py: the refreshed snapshot (the library's describe, group and maintenance answers,
  lag in seconds), with each storage read sent at most once per refresh;
- metrics.py: the snapshot as Prometheus metrics (kafka-lag-exporter's and kafka_exporter's
  names where Kafka has them);
- browse.py: a page of a partition's records, shown as text, JSON or hex;
- pages.py: the HTML pages; server.py: the HTTP server, its routes, errors and write actions.

Python::

    from kstore.console import serve
    server = serve("file:///data/ks", {}, port=8080)     # pages and /metrics, until stop()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .metrics import StoreCollector, registry_for
from .server import Console, ConsoleServer, make_server, serve_in_thread
from .snapshot import (
    CoalescingStorage,
    RunCounts,
    Snapshot,
    Snapshots,
    open_coalescing_store,
    request_counter,
)

__all__ = [
    "CoalescingStorage",
    "Console",
    "ConsoleServer",
    "RunCounts",
    "Snapshot",
    "Snapshots",
    "StoreCollector",
    "build",
    "make_server",
    "open_coalescing_store",
    "serve",
]


def serve(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    refresh_s: float = 5.0,
    allow_writes: bool = False,
    cluster_name: str | None = None,
    redact: Callable[[str], str] = lambda text: text,
    explain: Callable[[BaseException], str] | None = None,
    log: Callable[[str], None] | None = None,
    maintenance_settings: Any = None,
    in_thread: bool = True,
) -> ConsoleServer:
    """Open the store, bind ``host``:``port`` and start the refresh thread; with
    ``in_thread`` serve in a thread of its own too. ``server.stop()`` ends it all."""
    server = build(
        url,
        storage_options,
        host=host,
        port=port,
        refresh_s=refresh_s,
        allow_writes=allow_writes,
        cluster_name=cluster_name,
        redact=redact,
        explain=explain,
        log=log,
        maintenance_settings=maintenance_settings,
    )
    server.console.snapshots.start()
    if in_thread:
        serve_in_thread(server)
    return server


def build(
    url: str,
    storage_options: Mapping[str, Any] | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    refresh_s: float = 5.0,
    allow_writes: bool = False,
    cluster_name: str | None = None,
    redact: Callable[[str], str] = lambda text: text,
    explain: Callable[[BaseException], str] | None = None,
    log: Callable[[str], None] | None = None,
    maintenance_settings: Any = None,
    maintenance_refresh_s: float | None = None,
) -> ConsoleServer:
    """The console of a store, bound but neither refreshing nor serving yet."""
    from kstore.storage import redact_url

    store = open_coalescing_store(url, dict(storage_options or {}))
    snapshots = Snapshots(
        store,
        refresh_s=refresh_s,
        maintenance_settings=maintenance_settings,
        maintenance_refresh_s=maintenance_refresh_s,
        explain=explain,
    )
    shown = redact_url(url)
    counting = request_counter(store)
    requests = counting.__enter__() if store.storage.counts_requests else None
    collector = StoreCollector(
        snapshots, cluster_name=cluster_name or shown, requests=requests, redact=redact
    )
    console = Console(
        snapshots,
        registry_for([collector]),
        store_shown=shown,
        allow_writes=allow_writes,
        redact=redact,
        explain=explain,
    )
    console.on_close.append(lambda: counting.__exit__(None, None, None))
    try:
        return make_server(console, host, port, log=log)
    except BaseException:
        console.close()
        raise
