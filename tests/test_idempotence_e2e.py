"""Idempotent producers end to end: an append whose commit landed, though the producer was told
it failed and the log could not tell either, is retried by the producer; the partition's
producer entry recognises the retry, so the log holds every record exactly once (PROTOCOL 15)."""

from __future__ import annotations

from typing import Any

import pytest

import kstore
from kstore.producer import Producer
from tests.faults import Fault, FaultyStorage

# The log's own resolution of an unknown outcome reads the version back up to five times.
UNREADABLE_READ_BACKS = 5


@pytest.fixture(params=["memory", "local", "seaweed"])
def target(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    url, options = request.getfixturevalue(f"{request.param}_store")
    return url, options


def test_a_retried_ambiguous_append_lands_once(target: tuple[str, dict[str, Any]]) -> None:
    faulty = FaultyStorage(kstore.Storage(*target))
    store = kstore.Store.from_storage(faulty)
    store.create_topic("t")
    log_dir = store.partition("t", 0).log.directory + "/"
    expected = [b"%03d" % i for i in range(30)]
    with Producer(store, linger_ms=0, retry_backoff_ms=1, retry_backoff_max_ms=5) as producer:
        metas = [producer.send("t", value=v, partition=0).get(timeout=30) for v in expected[:10]]
        # The next append's commit lands but the producer is told it failed, and reading the
        # version back fails too: the log cannot resolve the outcome (CommitStateUnknownError),
        # so the producer sends the same batch again.
        faulty.add(
            Fault(
                "put_if_absent",
                when="after",
                times=1,
                match=lambda p: p.startswith(log_dir) and "checkpoint" not in p,
            )
        )
        faulty.add(
            Fault(
                "read",
                when="before",
                times=UNREADABLE_READ_BACKS,
                match=lambda p: (
                    p.startswith(log_dir) and faulty.injected.get("put_if_absent:after", 0) == 1
                ),
            )
        )
        ambiguous = [producer.send("t", value=v, partition=0) for v in expected[10:20]]
        metas += [f.get(timeout=30) for f in ambiguous]
        assert faulty.injected == {"put_if_absent:after": 1, "read:before": UNREADABLE_READ_BACKS}
        assert producer.metrics()["record-retry-total"] > 0  # the producer did retry
        faulty.clear()
        metas += [producer.send("t", value=v, partition=0).get(timeout=30) for v in expected[20:]]

    fresh = kstore.Store(*target, create=False)
    part = fresh.partition("t", 0)
    state = part.state()
    rows = [r for batch in part.read(state.start_offset, state=state) for r in batch.to_pylist()]
    assert [r["value"] for r in rows] == expected  # each record once, in order
    assert [r["offset"] for r in rows] == list(range(30))
    # Every future reports where its record is, the retried batch included.
    assert [m.offset for m in metas] == list(range(30))
