"""Name rules. No name reaches a storage path without passing through here."""

from __future__ import annotations

import re

from kstore.errors import InvalidGroupIdError, InvalidTopicError

MAX_NAME_LENGTH = 249  # Kafka's limit for topic names
# Reserved in a topic incarnation's directory: the Delta log of the topic's table (PROTOCOL.md
# 29). No partition, topic log or data directory is named so, and kstore's readers, verify and
# vacuum never look inside it.
DELTA_LOG_DIR = "_delta_log"
_LEGAL = re.compile(r"[a-zA-Z0-9._-]+")


def _problem(name: object) -> str | None:
    if not isinstance(name, str):
        return f"must be a string, got {type(name).__name__}"
    if name == "":
        return "must not be empty"
    if name in (".", ".."):
        return "must not be '.' or '..'"
    if len(name) > MAX_NAME_LENGTH:
        return f"is {len(name)} characters long; the limit is {MAX_NAME_LENGTH}"
    if not _LEGAL.fullmatch(name):
        bad = sorted({c for c in name if not _LEGAL.fullmatch(c)})
        # ascii(): a homoglyph, a zero-width or a direction character shows as its escape,
        # so the message names the culprit unambiguously (a fullwidth full stop is not a '.').
        shown = ", ".join(ascii(c) for c in bad[:5])
        return f"contains illegal characters ({shown}); allowed are ASCII letters, digits, '.', '_' and '-'"
    return None


def validate_topic_name(name: object) -> str:
    """Return ``name`` if it is a legal topic name, else raise :class:`InvalidTopicError`."""
    problem = _problem(name)
    if problem is not None:
        raise InvalidTopicError(f"invalid topic name {_shown(name)}: {problem}")
    assert isinstance(name, str)
    return name


def validate_group_id(name: object) -> str:
    """Return ``name`` if it is a legal consumer group id, else raise :class:`InvalidGroupIdError`."""
    problem = _problem(name)
    if problem is not None:
        raise InvalidGroupIdError(f"invalid group id {_shown(name)}: {problem}")
    assert isinstance(name, str)
    return name


def _shown(name: object) -> str:
    text = repr(name)
    return text if len(text) <= 60 else text[:57] + "...'"
