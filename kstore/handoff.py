"""Files that writers of one log hand to each other: the pending flushes of a topic log
(PROTOCOL.md 30) and the pending requests of a group log (31). A writer that commits lists
their directory and reads the files whose outcome it does not know; this module is that
listing and reading, the same for both. What a file means, and how it is checked, is its
caller's (:mod:`kstore.commit_share`, :mod:`kstore.group_share`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from kstore.errors import StorageError
from kstore.storage import Storage

log = logging.getLogger("kstore.handoff")


@dataclass(frozen=True)
class HandedOver:
    """One file read from a hand-over directory, with the modification time its listing gave
    (ms since the epoch by the storage's clock; 0 where the storage gives none), which orders
    the files for every writer that lists the same ones."""

    name: str
    data: bytes
    listed_ms: int


def read_handed_over(
    storage: Storage,
    directory: str,
    *,
    wanted: Callable[[str], bool],
    max_age_ms: int,
    what: str,
) -> list[HandedOver]:
    """The files of ``directory`` whose names ``wanted`` accepts, read (GETs in parallel), in
    listing order. Files listed as older than ``max_age_ms`` by the local wall clock are left
    out: a crash left them, and vacuum deletes them. A file gone between the listing and its
    read (its writer or another committer deleted it: its outcome is known) is left out. A
    listing or reading that fails gives nothing, with a warning naming ``what``: the files'
    writers commit their own after their takeover time."""
    try:
        listed = storage.list_dir(directory)
    except StorageError as exc:
        log.warning("listing %s of %s failed: %s", what, directory, exc)
        return []
    now_ms = int(time.time() * 1000)
    times: dict[str, int] = {}
    for info in listed:
        if not wanted(info.name):
            continue
        if info.mtime_ms is not None and now_ms - info.mtime_ms > max_age_ms:
            continue  # left by a crash
        times[info.name] = info.mtime_ms if info.mtime_ms is not None else 0
    if not times:
        return []
    try:
        found = storage.read_many([f"{directory}/{name}" for name in times])
    except StorageError as exc:
        log.warning("reading %s of %s failed: %s", what, directory, exc)
        return []
    out: list[HandedOver] = []
    for name, listed_ms in times.items():
        data = found.get(f"{directory}/{name}")
        if data is not None:
            out.append(HandedOver(name, data, listed_ms))
    return out


__all__ = ["HandedOver", "read_handed_over"]
