"""Transaction timeouts (PROTOCOL.md 20.6): an unfinished transaction older than its producer's
``transaction_timeout_ms`` is finished as a new instance of its transactional id would finish it:
fenced with a new epoch, then aborted (or rolled forward when its commit decision had landed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from kstore.retention import abort_expired_transactions

import kstore
from kstore import transaction_manager
from kstore.errors import ProducerFencedError
from kstore.groups import Group
from kstore.layout import producer_log_dir, topic_data_dir
from kstore.log import Log, parse_log_file_name
from kstore.producer import Producer
from kstore.records import TopicPartition
from kstore.transactions import TransactionLogState
from tests.test_transactions import read as read_records

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_MS = 2_000
# File times on local disk come from the kernel's coarse clock, a few ms behind time.time().
SLACK_MS = 50


def _ms() -> int:
    return int(time.time() * 1000)


def read(store: kstore.Store, topic: str, isolation: str = "read_committed") -> list[bytes]:
    return [r.value for r in read_records(store, topic, isolation) if r.value is not None]


def _open_transaction(
    store: kstore.Store, timeout_ms: int = TIMEOUT_MS
) -> tuple[Producer, int, int]:
    """A topic with a record before and after an abandoned transaction's records; returns the
    abandoned producer and the wall-clock window in which its transaction started."""
    store.create_topic("out", partitions=2)
    with Producer(store) as plain:
        plain.send("out", value=b"before", partition=0).get(timeout=30)
    abandoned = Producer(store, transactional_id="tx", transaction_timeout_ms=timeout_ms)
    abandoned.begin_transaction()
    t0 = _ms()
    abandoned.send("out", value=b"t0", partition=0)
    abandoned.send("out", value=b"t1", partition=1)
    abandoned.flush()
    t1 = _ms()
    with Producer(store) as plain:
        plain.send("out", value=b"after", partition=0).get(timeout=30)
    return abandoned, t0, t1


def _marker_logs(store: kstore.Store) -> list[str]:
    data = topic_data_dir("out", store.topic("out").topic_id)
    return [f"{data}/_log"]


def _commits(store: kstore.Store, directory: str) -> int:
    names = (parse_log_file_name(i.name) for i in store.storage.list_dir(directory))
    return sum(1 for parsed in names if parsed is not None and not parsed[1])


@pytest.fixture(params=["memory", "local"])
def store(request: pytest.FixtureRequest) -> kstore.Store:
    url, options = request.getfixturevalue(f"{request.param}_store")
    return kstore.Store(url, options)


@pytest.fixture
def mem(memory_store: Any) -> kstore.Store:
    """A memory store only, for tests whose backend does not matter."""
    return kstore.Store(*memory_store)


def test_an_abandoned_transaction_is_aborted_after_its_timeout_and_not_before(
    store: kstore.Store,
) -> None:
    abandoned, t0, t1 = _open_transaction(store)
    assert read(store, "out") == [b"before"]  # the open transaction holds the LSO

    early = abort_expired_transactions(store, now_ms=t0 - SLACK_MS + TIMEOUT_MS)
    assert (early.open, early.expired) == (1, [])
    assert read(store, "out") == [b"before"]

    dry = abort_expired_transactions(store, now_ms=t1 + TIMEOUT_MS + SLACK_MS, dry_run=True)
    assert [e.outcome for e in dry.expired] == ["would abort"]
    assert read(store, "out") == [b"before"]  # a dry run changes nothing

    logs = _marker_logs(store)
    before = {d: _commits(store, d) for d in logs}
    report = abort_expired_transactions(store, now_ms=t1 + TIMEOUT_MS + SLACK_MS)
    # One marker commit: the topic log's, for both partitions.
    assert {d: _commits(store, d) - before[d] for d in logs} == dict.fromkeys(logs, 1)
    [item] = report.expired
    assert (item.transactional_id, item.version, item.outcome) == ("tx", 0, "aborted")
    assert item.partitions == [("out", 0), ("out", 1)]
    assert (item.epoch, item.fenced_epoch, item.timeout_ms) == (0, 1, TIMEOUT_MS)
    # read_committed readers advance past it; the aborted records are gone for everyone.
    assert read(store, "out") == [b"before", b"after"]
    assert sorted(read(store, "out", "read_uncommitted")) == [b"after", b"before"]
    for p in (0, 1):
        state = store.partition("out", p).state()
        assert state.open_transactions == {}
        assert state.last_stable_offset == state.end_offset
    again = abort_expired_transactions(store, now_ms=t1 + TIMEOUT_MS + SLACK_MS)
    assert (again.open, again.expired) == (0, [])  # nothing left to do

    # The abandoned instance is fenced, in the producer log and in the partitions.
    with pytest.raises(ProducerFencedError):
        abandoned.send("out", value=b"zombie", partition=0).get(timeout=30)
    with pytest.raises(ProducerFencedError):
        abandoned.commit_transaction()
    abandoned.close()
    # A new instance of the transactional id works.
    with Producer(store, transactional_id="tx") as successor:
        successor.begin_transaction()
        successor.send("out", value=b"next", partition=1)
        successor.commit_transaction()
    assert sorted(read(store, "out")) == [b"after", b"before", b"next"]


def test_only_transactions_of_the_topics_asked_for(mem: kstore.Store) -> None:
    _, _, t1 = _open_transaction(mem)
    mem.create_topic("other")
    later = t1 + TIMEOUT_MS + SLACK_MS
    assert abort_expired_transactions(mem, ["other"], now_ms=later).expired == []
    assert read(mem, "out") == [b"before"]
    assert [e.outcome for e in abort_expired_transactions(mem, ["out"], now_ms=later).expired] == [
        "aborted"
    ]
    assert read(mem, "out") == [b"before", b"after"]


@pytest.mark.parametrize("with_offsets", [False, True], ids=["decision", "group-decision"])
def test_a_decided_transaction_is_rolled_forward(mem: kstore.Store, with_offsets: bool) -> None:
    mem.create_topic("out")
    dead = Producer(mem, transactional_id="tx", transaction_timeout_ms=TIMEOUT_MS)
    dead.begin_transaction()
    dead.send("out", value=b"decided")
    if with_offsets:
        dead.send_offsets_to_transaction({TopicPartition("in", 0): 7}, "g")

    def crash(*args: Any, **kwargs: Any) -> None:
        raise SystemExit("the process dies after the decision, before the markers")

    # The transaction's end starts with its markers: the process dies before them.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(transaction_manager, "end_transaction", crash)
        with pytest.raises(SystemExit):
            dead.commit_transaction()
    decided = _ms()
    assert read(mem, "out") == []
    later = decided + TIMEOUT_MS + SLACK_MS
    dry = abort_expired_transactions(mem, now_ms=later, dry_run=True)
    assert [(e.decided, e.outcome) for e in dry.expired] == [("commit", "would commit")]
    report = abort_expired_transactions(mem, now_ms=later)
    assert [(e.decided, e.outcome, e.fenced_epoch) for e in report.expired] == [
        ("commit", "committed", None)  # decided: finished as its own epoch, not fenced
    ]
    assert read(mem, "out") == [b"decided"]
    if with_offsets:
        assert Group(mem, "g").committed(TopicPartition("in", 0)) is not None


KILLED_PRODUCER = """
import sys, time
import kstore
from kstore.producer import Producer
store = kstore.Store(sys.argv[1])
producer = Producer(store, transactional_id="tx", transaction_timeout_ms=int(sys.argv[2]))
producer.begin_transaction()
for p in (0, 1):
    producer.send("out", value=b"killed-%d" % p, partition=p)
producer.flush()
print("ready", flush=True)
time.sleep(600)
"""


def test_a_transaction_left_by_a_killed_producer_is_aborted(local_store: Any) -> None:
    url, _ = local_store
    store = kstore.Store(url)
    store.create_topic("out", partitions=2)
    t0 = _ms()
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_PRODUCER, url, str(TIMEOUT_MS)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.stdout is not None:
            proc.stdout.close()
    t1 = _ms()
    assert read(store, "out", "read_uncommitted") != []
    assert abort_expired_transactions(store, now_ms=t0 - SLACK_MS + TIMEOUT_MS).expired == []
    [item] = abort_expired_transactions(store, now_ms=t1 + TIMEOUT_MS + SLACK_MS).expired
    assert item.outcome == "aborted"
    assert read(store, "out", "read_uncommitted") == []
    with Producer(store) as plain:
        plain.send("out", value=b"later", partition=0).get(timeout=30)
    assert read(store, "out") == [b"later"]


@pytest.mark.parametrize("with_offsets", [False, True], ids=["decision", "group-decision"])
def test_abort_racing_the_producers_commit_loses_and_duplicates_nothing(
    store: kstore.Store, with_offsets: bool
) -> None:
    """Each round, the producer commits while a maintainer aborts the (already expired)
    transaction. The outcome may be either, but it is one: a commit reported as done is
    visible, a transaction refused by the fence is gone, and with consumer offsets the records
    are visible exactly when the offsets were committed."""
    store.create_topic("out", partitions=2)
    store.create_topic("in")
    group = Group(store, "g")
    rounds, outcomes = 8, []
    expected: list[bytes] = []
    for n in range(rounds):
        producer = Producer(store, transactional_id="tx", transaction_timeout_ms=1)
        producer.begin_transaction()
        values = [b"r%d-%d" % (n, i) for i in range(3)]
        for i, value in enumerate(values):
            producer.send("out", value=value, partition=i % 2)
        if with_offsets:
            producer.send_offsets_to_transaction({TopicPartition("in", 0): n + 1}, "g")
        producer.flush()
        barrier = threading.Barrier(2)
        reports: list[Any] = []

        def abort(barrier: threading.Barrier = barrier, reports: list[Any] = reports) -> None:
            barrier.wait()
            reports.append(abort_expired_transactions(store, now_ms=_ms() + 60_000))

        thread = threading.Thread(target=abort)
        thread.start()
        barrier.wait()
        try:
            producer.commit_transaction()
            committed = True
        except ProducerFencedError:
            committed = False
        thread.join(timeout=60)
        producer.close()
        if with_offsets:
            offset = group.committed(TopicPartition("in", 0))
            landed = offset is not None and offset.offset == n + 1
            assert landed or not committed  # a commit reported done has its offsets
            committed = landed
        if committed:
            expected.extend(values)
        outcomes.append((committed, [e.outcome for e in reports[0].expired]))
        got = read(store, "out")
        assert sorted(got) == sorted(expected), (n, outcomes)  # none lost, none duplicated
        for p in (0, 1):
            state = store.partition("out", p).state()
            assert state.last_stable_offset == state.end_offset, outcomes


def test_a_moto_store(moto_store: Any) -> None:
    url, options = moto_store
    store = kstore.Store(url, options)
    timeout = 60_000
    _, t0, t1 = _open_transaction(store, timeout)
    # The storage's clock (a probe file): the transaction is seconds old, its timeout a minute.
    report = abort_expired_transactions(store)
    assert (report.open, report.expired) == (1, [])
    # S3 records times to the second.
    assert abort_expired_transactions(store, now_ms=t0 - 1_000 + timeout).expired == []
    [item] = abort_expired_transactions(store, now_ms=t1 + 1_000 + timeout).expired
    assert item.outcome == "aborted"
    assert read(store, "out") == [b"before", b"after"]
    assert store.storage.list_dir("producers") != []  # no probe left behind, only the log
    assert all(not i.name.startswith(".probe-") for i in store.storage.list_dir("producers"))


def test_the_start_time_survives_a_checkpoint(mem: kstore.Store) -> None:
    """Replayed from a checkpoint, a transaction's age counts from the checkpoint's version
    (its start or later), never from an earlier version of the log."""
    mem.create_topic("out")
    producer = Producer(mem, transactional_id="tx", transaction_timeout_ms=TIMEOUT_MS)
    time.sleep(0.3)  # version 0 (the new epoch) is older than the transaction
    producer.begin_transaction()
    started = _ms()
    producer.send("out", value=b"x")
    producer.flush()
    log = Log(mem.storage, producer_log_dir("tx"), TransactionLogState, checkpoint_interval=50)
    state = log.load()
    log.write_checkpoint(state)
    fresh = Log(mem.storage, producer_log_dir("tx"), TransactionLogState).load()
    assert fresh.current is not None
    assert fresh.current.started_in == state.version > 0
    assert abort_expired_transactions(mem, now_ms=started - SLACK_MS + TIMEOUT_MS).expired == []
    producer.close()


def test_bad_arguments_are_refused(mem: kstore.Store) -> None:
    with pytest.raises(kstore.errors.InvalidConfigurationError, match="now_ms"):
        abort_expired_transactions(mem, now_ms=-1)
    with pytest.raises(kstore.errors.InvalidTopicError):
        abort_expired_transactions(mem, ["bad/name"])


def test_the_command(local_store: Any) -> None:
    import json

    from kstore.cli.app import app
    from typer.testing import CliRunner

    url, _ = local_store
    store = kstore.Store(url)
    store.create_topic("out")
    producer = Producer(store, transactional_id="tx", transaction_timeout_ms=1)
    producer.begin_transaction()
    producer.send("out", value=b"x")
    producer.flush()
    time.sleep(0.05)  # past its 1 ms timeout by this machine's clock, the local store's
    runner = CliRunner()
    dry = runner.invoke(app, ["transactions", "abort-expired", "--dry-run", "--store", url])
    assert dry.exit_code == 0, dry.output
    assert dry.stdout == (
        "transaction timeouts: 1 producer log(s), 1 open transaction(s), 1 expired "
        "(dry run: nothing changed)\n"
    )
    done = runner.invoke(
        app, ["transactions", "abort-expired", "out", "-o", "json", "--store", url]
    )
    assert done.exit_code == 0, done.output
    [item] = json.loads(done.stdout)["expired"]
    assert (item["transactional_id"], item["outcome"], item["partitions"]) == (
        "tx",
        "aborted",
        [["out", 0]],
    )
    assert read(store, "out", "read_uncommitted") == []
    bad = runner.invoke(app, ["transactions", "abort-expired", "bad/topic", "--store", url])
    assert bad.exit_code != 0
    producer.close()
