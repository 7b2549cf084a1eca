"""tests/commit_logs.py for tests parametrised by the name of a backend's fixture
(``@pytest.mark.parametrize("target", ["memory_store", "local_store", ...])``, then
``request.getfixturevalue(target)``), as the job, maintenance and Delta tests are (issue 45).

- :func:`target_params` turns such a list into ``(fixture name, commit.logs)`` parameters:
  every target with commit.logs 1, and the fast ones (memory, local disk) with 3 too; the
  marks of a ``pytest.param`` target (``pytest.mark.s3``) are kept;
- :func:`open_target` is the test's ``request.getfixturevalue(target)``: it returns the
  fixture's value and has the layout-3 topics the test creates get that commit.logs
  (:func:`tests.commit_logs.create_topics_with`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from tests.commit_logs import COMMIT_LOGS, create_topics_with

FAST_TARGETS = ("memory_store", "local_store")


def target_params(targets: Iterable[Any], *, all_logs: Iterable[str] = FAST_TARGETS) -> list[Any]:
    """``(fixture name, commit_logs)`` parameters: each target with commit.logs 1, and those
    of ``all_logs`` with 3 too. A target is a fixture name or a ``pytest.param`` of one."""
    wide = set(all_logs)
    out: list[Any] = []
    for target in targets:
        if isinstance(target, str):
            name, marks = target, ()
        else:
            (name,) = target.values
            marks = target.marks
        for logs in COMMIT_LOGS if name in wide else COMMIT_LOGS[:1]:
            out.append(pytest.param((name, logs), id=f"{name}-logs{logs}", marks=marks))
    return out


def open_target(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, target: tuple[str, int]
) -> Any:
    """The value of the fixture ``target`` names; its layout-3 topics get its commit.logs."""
    name, logs = target
    value = request.getfixturevalue(name)
    create_topics_with(monkeypatch, logs)
    return value
