"""Idempotent producers end to end: an append whose commit landed, though the producer was told
it failed and the log could not tell either, is retried by the producer; the partition's
producer entry recognises the retry, so the log holds every record exactly once (PROTOCOL 15)."""

from __future__ import annotations

from typing import Any

import pytest

import kstore
from kstore.producer import Producer
from tests.commit_logs import backend_params, logs_target
from tests.faults import Fault, FaultyStorage

# The log's own resolution of an unknown outcome reads the version back up to five times.
UNREADABLE_READ_BACKS = 5


@pytest.fixture(params=backend_params(["memory", "local", "seaweed"]))
def target(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, dict[str, Any]]:
    """Every backend; its layout-3 topics with commit.logs 1, and 3 too on memory and local
    disk (tests/commit_logs.py)."""
    chosen = logs_target(request, monkeypatch)
    return chosen.url, chosen.storage_options


def test_a_retried_ambiguous_append_lands_once(target: tuple[str, dict[str, Any]]) -> None:
    """Partition 0's ambiguous append is retried and lands once; partition 1, written beside it
    (in the same topic log, or with commit.logs 3 in another), lands once too, and every future
    reports where its record is."""
    faulty = FaultyStorage(kstore.Storage(*target))
    store = kstore.Store.from_storage(faulty)
    store.create_topic("t", 2)
    log_dir = store.partition("t", 0).log.directory + "/"
    expected = [b"%03d" % i for i in range(30)]
    beside = [b"p1-%03d" % i for i in range(25)]
    with Producer(store, linger_ms=0, retry_backoff_ms=1, retry_backoff_max_ms=5) as producer:
        metas = [producer.send("t", value=v, partition=0).get(timeout=30) for v in expected[:10]]
        others = [producer.send("t", value=v, partition=1).get(timeout=30) for v in beside[:5]]
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
        ambiguous, next_to_it = [], []
        for v, w in zip(expected[10:20], beside[5:15], strict=True):
            ambiguous.append(producer.send("t", value=v, partition=0))
            next_to_it.append(producer.send("t", value=w, partition=1))
        metas += [f.get(timeout=30) for f in ambiguous]
        others += [f.get(timeout=30) for f in next_to_it]
        assert faulty.injected == {"put_if_absent:after": 1, "read:before": UNREADABLE_READ_BACKS}
        assert producer.metrics()["record-retry-total"] > 0  # the producer did retry
        faulty.clear()
        metas += [producer.send("t", value=v, partition=0).get(timeout=30) for v in expected[20:]]
        others += [producer.send("t", value=v, partition=1).get(timeout=30) for v in beside[15:]]

    fresh = kstore.Store(*target, create=False)
    for p, values, futures in ((0, expected, metas), (1, beside, others)):
        part = fresh.partition("t", p)
        state = part.state()
        rows = [r for b in part.read(state.start_offset, state=state) for r in b.to_pylist()]
        assert [r["value"] for r in rows] == values  # each record once, in order
        assert [r["offset"] for r in rows] == list(range(len(values)))
        # Every future reports where its record is, the retried batch included.
        assert [(m.partition, m.offset) for m in futures] == [(p, o) for o in range(len(values))]
