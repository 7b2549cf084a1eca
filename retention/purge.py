"""Removal of deleted topics' files once their ``file.delete.delay.ms`` has passed
(PROTOCOL.md 17.3).

Deleting a topic seals its logs and makes it invisible at once, but leaves its files readable,
so that a reader in the middle of a read finishes. :func:`purge_deleted_topics` deletes the
data directory of every deleted incarnation whose delay has passed since the deletion, judged
by the storage's clock (the modification time of the topic log's ``delete`` commit, or the
deletion time it records when later). The maintenance service and ``kstore vacuum`` call it.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from kstore.config import MIN_FILE_DELETE_DELAY_MS, SPECS
from kstore.layout import TOPICS, topic_data_dir, topic_log_dir
from kstore.log import version_file
from kstore.names import validate_topic_name
from kstore.store import Store

from .vacuum import StorageClock, topic_directory_names

_TOPIC_ID = re.compile(r"[0-9a-f]{32}")
_DEFAULT_DELAY_MS = int(SPECS["file.delete.delay.ms"].default)


@dataclass(frozen=True)
class DeletedIncarnation:
    """One deleted topic incarnation whose files are (or were) still in storage."""

    topic: str
    topic_id: str
    directory: str  # relative to the store's root
    deleted_ms: int  # when the deletion was committed (storage clock when known)
    due_ms: int  # from when its files may go


@dataclass
class PurgeReport:
    """What :func:`purge_deleted_topics` removed (or, in a dry run, would remove), and the
    deleted incarnations whose delay has not passed yet."""

    dry_run: bool
    now_ms: int | None = None  # the storage's clock at the last topic looked at
    removed: list[DeletedIncarnation] = field(default_factory=list)
    waiting: list[DeletedIncarnation] = field(default_factory=list)

    @property
    def directories(self) -> list[str]:
        return [d.directory for d in self.removed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "removed": [asdict(d) for d in self.removed],
            "waiting": [asdict(d) for d in self.waiting],
        }

    def format(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        lines = [
            f"deleted topics: {verb} {len(self.removed)}, waiting for file.delete.delay.ms "
            f"{len(self.waiting)}"
        ]
        lines += [f"  {verb} {d.topic} (id {d.topic_id})" for d in self.removed]
        lines += [
            f"  waiting {d.topic} (id {d.topic_id}) until {d.due_ms} ms" for d in self.waiting
        ]
        return "\n".join(lines)


def purge_deleted_topics(
    store: Store,
    now_ms: int | None = None,
    *,
    topics: list[str] | None = None,
    dry_run: bool = False,
) -> PurgeReport:
    """Delete the files of every deleted topic incarnation (of ``topics``, or of every topic
    name in the store) whose ``file.delete.delay.ms`` has passed. ``now_ms`` fixes the clock
    (tests); otherwise the storage's clock decides. A dry run deletes nothing and reports what
    would go."""
    storage = store.storage
    if topics is None:
        names = topic_directory_names(storage)
    else:
        names = [validate_topic_name(n) for n in topics]
    report = PurgeReport(dry_run)
    for name in sorted(names):
        # The state first (cached by a long-lived store): most topics were never deleted, and
        # cost no clock probe or listing. An incarnation deleted after this read waits for the
        # next purge; one in the listing below is judged by this state's record of its delete.
        state = store.topic_state(name)
        if state.version < 0 or not state.deletions:
            continue
        now, entries = StorageClock(storage, f"{TOPICS}/{name}", now_ms, dry_run=dry_run).list()
        report.now_ms = now
        current = None if state.deleted or state.metadata is None else state.metadata.get("id")
        candidates = [
            e.name
            for e in entries
            if _TOPIC_ID.fullmatch(e.name) and e.name != current and e.name in state.deletions
        ]
        if not candidates:
            continue
        committed = {i.name: i.mtime_ms for i in storage.list_dir(topic_log_dir(name))}
        for topic_id in candidates:
            body = state.deletions[topic_id]
            deleted = _int(body.get("deletedTime"), 0)
            version = body.get("version")
            if isinstance(version, int) and not isinstance(version, bool):
                # The storage's record of the commit; a later writer's clock only keeps longer.
                deleted = max(deleted, committed.get(version_file(version)) or 0)
            delay = max(
                _int(body.get("fileDeleteDelayMs"), _DEFAULT_DELAY_MS), MIN_FILE_DELETE_DELAY_MS
            )
            entry = DeletedIncarnation(
                name, topic_id, topic_data_dir(name, topic_id), deleted, deleted + delay
            )
            if now >= entry.due_ms:
                if not dry_run:
                    storage.delete_tree(entry.directory)
                report.removed.append(entry)
            else:
                report.waiting.append(entry)
    return report


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
