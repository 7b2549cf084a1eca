"""Layout-3 tests run with ``commit.logs`` 1 and 3 (issue 45), parametrised, not copied.

While a test runs with ``commit.logs`` N, every layout-3 topic it creates without a
``commit.logs`` of its own is created with N (``Store.create_topic`` is wrapped for the test):
the value is in the topic's metadata, so other processes (Spark's Python workers, a test's
worker processes, the CLI) see the same topic. With N = 3 and more partitions than logs, a
flush spans several topic logs and each log holds several partitions: where acknowledgements,
markers and shared commits can pair a partition with the wrong log or offset.

Two ways in:

- the ``commit_logs`` fixture (``commit_logs = commit_logs_fixture()`` at module level), for
  tests on one backend: the test runs once per value and gets it;
- :func:`backend_params` for a module's backend fixture, which then calls
  :func:`create_topics_with`: (backend, commit.logs) pairs, 1 and 3 on the fast backends
  (memory, local disk), 1 alone on the S3 ones unless the fixture is for tests about
  concurrency (the suite's time: a SeaweedFS test costs a few times a local one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from kstore import Store
from tests.conftest import StoreTarget

COMMIT_LOGS = (1, 3)
FAST_BACKENDS = ("memory", "local")
ALL_BACKENDS = ("memory", "local", "moto", "seaweed")
S3_MARKS = {"moto": pytest.mark.s3, "seaweed": pytest.mark.s3}
# conftest.py's fixture of each backend: (url, storage_options).
_URL_FIXTURES = {
    "memory": "memory_store_url",
    "local": "local_store_url",
    "moto": "moto_bucket_url",
    "seaweed": "seaweed_bucket_url",
}


@dataclass(frozen=True)
class LogsTarget(StoreTarget):
    """A backend to run a test on, and the commit.logs its layout-3 topics get."""

    commit_logs: int = 1


def create_topics_with(monkeypatch: pytest.MonkeyPatch, commit_logs: int) -> None:
    """Layout-3 topics created while the test runs get ``commit.logs`` = ``commit_logs``
    unless their config names one."""
    if commit_logs == 1:
        return  # the default: created exactly as the test says
    create = Store.create_topic

    def create_topic(
        self: Store,
        name: str,
        partitions: int = 1,
        config: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        if kwargs.get("layout", 3) == 3 and "commit.logs" not in (config or {}):
            config = {**(config or {}), "commit.logs": commit_logs}
        return create(self, name, partitions, config, **kwargs)

    monkeypatch.setattr(Store, "create_topic", create_topic)


def commit_logs_fixture() -> Any:
    """A fixture (assign it to the name ``commit_logs`` in a test module) that runs each test
    asking for it with commit.logs 1 and 3, and returns the value."""

    @pytest.fixture(params=COMMIT_LOGS, ids=[f"logs{n}" for n in COMMIT_LOGS])
    def commit_logs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
        value = int(request.param)
        create_topics_with(monkeypatch, value)
        return value

    return commit_logs


def backend_params(
    backends: Iterable[str],
    *,
    all_logs: Iterable[str] = FAST_BACKENDS,
    marks: Mapping[str, Any] | None = None,
) -> list[Any]:
    """``(backend, commit_logs)`` parameters: each backend with commit.logs 1, and those of
    ``all_logs`` with 3 too; ``marks``: backend -> marks of its parameters."""
    wide = set(all_logs)
    out: list[Any] = []
    for backend in backends:
        for logs in COMMIT_LOGS if backend in wide else COMMIT_LOGS[:1]:
            out.append(
                pytest.param(
                    (backend, logs),
                    id=f"{backend}-logs{logs}",
                    marks=(marks or {}).get(backend, ()),
                )
            )
    return out


def logs_target(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> LogsTarget:
    """The body of a backend fixture parametrised by :func:`backend_params`."""
    backend, logs = request.param
    url, options = request.getfixturevalue(_URL_FIXTURES[backend])
    create_topics_with(monkeypatch, logs)
    return LogsTarget(backend, url, options, logs)
