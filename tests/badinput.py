"""Helpers shared by the bad-input suites: store snapshots and the refusal check.

Every bad-input case asserts two things (invariant 8): the error names what is wrong, and the
store is byte for byte what it was before the call.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import pytest

from kstore import Store
from kstore.storage import Storage
from tests.conftest import StoreTarget

# Names that must never reach a path: traversal, separators, control characters, and the
# unicode tricks that make a name look like a legal one (homoglyphs, direction overrides,
# zero-width characters, decomposed accents, fullwidth dots and slashes).
MALICIOUS_NAMES: list[Any] = [
    "../etc",
    "..\\..\\x",
    "/etc/passwd",
    "C:\\x",
    "a/../../b",
    "x" * 250,
    "x" * 10_000,
    "nul\x00byte",
    "\x00",
    "tab\tname",
    "bell\x07",
    "\u202eevil",  # right-to-left override
    "abc\u200d",  # zero-width joiner
    "\ufeffbom",  # zero-width no-break space
    "caf\u00e9",  # NFC e-acute
    "cafe\u0301",  # NFD e + combining acute
    "a\uff0eb",  # fullwidth full stop
    "\uff0e\uff0e",  # fullwidth '..'
    "a\uff0fb",  # fullwidth solidus
    "\u2024\u2024",  # one dot leader twice, looks like '..'
    "t\u0435st",  # Cyrillic 'e'
    "\U0001f600",  # emoji
    "",
    ".",
    "..",
    "a b",
    "~user",
    "$HOME",
    "*",
]


def name_id(name: Any) -> str:
    return re.sub(r"[^0-9A-Za-z]", "_", repr(name))[:24]


@pytest.fixture(params=["memory", "local"])
def quick_store(request: pytest.FixtureRequest) -> StoreTarget:
    """memory and local stores only: for checks that happen before any storage I/O."""
    url, options = request.getfixturevalue(f"{request.param}_store_url")
    return StoreTarget(request.param, url, options)


@pytest.fixture
def mem_store(memory_store_url: tuple[str, dict[str, Any]]) -> StoreTarget:
    url, options = memory_store_url
    return StoreTarget("memory", url, options)


def open_store(target: StoreTarget, **kwargs: Any) -> Store:
    return Store(target.url, target.storage_options, **kwargs)


def snapshot(storage: Storage) -> dict[str, bytes]:
    """Every file under the store's root with its bytes."""
    root = storage.full_path("")
    if storage.local_root is not None:
        out = {}
        if not os.path.isdir(root):
            return out
        for directory, _, files in os.walk(root):
            for name in files:
                path = os.path.join(directory, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, root)] = f.read()
        return out
    storage.fs.invalidate_cache()
    if not storage.fs.exists(root):
        return {}
    return {path: storage.fs.cat_file(path) for path in storage.fs.find(root)}


def local_snapshot(root: str) -> dict[str, bytes]:
    out = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = f.read()
    return out


def refused(
    storage: Storage,
    call: Callable[[], object],
    error: type[BaseException] | tuple[type[BaseException], ...],
    *fragments: str,
) -> BaseException:
    """Run ``call``; it must raise ``error`` whose message contains every fragment, and the
    store must not change. Returns the exception."""
    before = snapshot(storage)
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert snapshot(storage) == before, "a refused call changed the store"
    return info.value
