"""The maintenance service (kstore.maintenance, ``kstore maintain``): what the planner finds due
from each topic's config, leases and last-run records in ``_maintenance/``, maintainers racing,
``--once`` end to end and ``status``. The Spark form: tests/test_maintenance_spark.py."""

from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Any

import pytest
from kstore.cli.app import app
from kstore.maintenance import Settings, plan, run_due, run_item, status
from kstore.maintenance.coordination import LastRun, Records, directory
from kstore.maintenance.service import TaskRun
from typer.testing import CliRunner

from kstore import Store
from tests import layout2
from tests.commit_logs import commit_logs_fixture, create_topics_with
from tests.test_jobs_support import Target, append, now_ms, rows

HOUR = 3_600_000
T0 = 1_800_000_000_000  # a fixed clock for the planner tests
runner = CliRunner()
STORE_TASKS = ["abort-transactions", "purge-deleted-topics", "prune-logs"]
DAY = 24 * HOUR

commit_logs = commit_logs_fixture()


def _decisions(
    store: Store, now: int, settings: Settings | None = None
) -> dict[tuple[str | None, str], bool]:
    the_plan = plan(store, settings or Settings(), now)
    return {(t.topic, t.task): t.decision.due for t in the_plan.tasks}


@pytest.fixture
def store(local_store: Target) -> Store:
    return Store(*local_store)


# -- the planner -------------------------------------------------------------------------------


def test_planner_decides_from_each_topics_config(store: Store) -> None:
    store.create_topic("logs", 1, {"retention.ms": HOUR})
    store.create_topic("state", 1, {"cleanup.policy": "compact"})
    store.create_topic("lazy", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.9})
    # logs: one segment past retention.ms at T0 + 1h, one young
    append(store.partition("logs", 0), [b"a"], [b"1"], T0 - 10)
    append(store.partition("logs", 0), [b"b"], [b"2"], T0 + HOUR)
    # state: everything dirty (ratio 1.0 >= 0.5)
    append(store.partition("state", 0), [b"k", b"k"], [b"1", b"2"], T0)
    # lazy: compacted once, then a little dirt below its 0.9 ratio
    lazy = store.partition("lazy", 0)
    append(lazy, [b"k"] * 50, [b"x" * 100] * 50, T0)
    assert run_due(store, now_ms=T0 + 1, topics=["lazy"])  # compacts (and vacuums)
    append(lazy, [b"k"], [b"y"], T0)

    before = _decisions(store, T0 + HOUR - 20)  # nothing past retention yet
    assert before[("logs", "retention")] is False
    assert before[("logs", "compaction")] is False  # cleanup.policy=delete
    assert before[("state", "compaction")] is True
    assert before[("state", "retention")] is False  # cleanup.policy=compact
    assert before[("lazy", "compaction")] is False  # dirty ratio below 0.9
    assert before[("lazy", "vacuum")] is False  # ran just now
    assert before[("logs", "vacuum")] is True  # never ran
    assert before[("logs", "merge")] is False  # 2 segments < 8

    later = _decisions(store, T0 + HOUR + 1)
    assert later[("logs", "retention")] is True
    assert later[("lazy", "compaction")] is False

    # max.compaction.lag.ms makes the lazy topic due although its ratio is low.
    store.alter_topic_config("lazy", {"max.compaction.lag.ms": 60_000})
    assert _decisions(store, T0 + HOUR + 1)[("lazy", "compaction")] is True
    assert _decisions(store, T0 + 30_000)[("lazy", "compaction")] is False

    # Merging: due once a partition has merge_min_segments small segments.
    for i in range(3):
        append(store.partition("state", 0), [b"m"], [str(i).encode()], T0)
    assert _decisions(store, T0, Settings(merge_min_segments=4))[("state", "merge")] is True
    assert _decisions(store, T0, Settings(merge_min_segments=5))[("state", "merge")] is False


def test_a_failed_task_rests_one_interval_and_vacuum_has_its_own(store: Store) -> None:
    store.create_topic("logs", 1, {"retention.ms": HOUR})
    append(store.partition("logs", 0), [b"a"], [b"1"], T0)
    settings = Settings(interval_ms=60_000, vacuum_interval_ms=10 * 60_000)
    runs = run_due(store, settings, now_ms=T0)
    assert [(r.task, r.outcome) for r in runs if r.topic] == [("vacuum", "nothing")]
    assert [r.task for r in runs if r.topic is None] == STORE_TASKS
    append(store.partition("logs", 0), [b"b"], [b"2"], T0 + 10_000)
    # Past retention at T0 + 1h, but retention has no run yet: due at once.
    assert _decisions(store, T0 + HOUR + 1, settings)[("logs", "retention")] is True
    first = run_due(store, settings, now_ms=T0 + HOUR + 1)
    assert {r.task: r.outcome for r in first if r.topic} == {"retention": "ok", "vacuum": "ok"}
    assert first[0].records == 1
    assert first[0].segments == 1
    # The next segment passes retention 10 s later: a run that removed something never makes
    # the next one wait, so it is due at the next pass.
    assert _decisions(store, T0 + HOUR + 20_000, settings)[("logs", "retention")] is True
    # A run that failed is retried one interval after it started, not on every pass.
    records = Records(store.storage)
    newest = records.newest(records.listing("logs"), ["retention"])["retention"]
    lease = records.acquire(
        "logs", "retention", holder="x", now_ms=T0 + HOUR + 20_000, lease_ms=1, newest=newest
    )
    assert lease is not None
    failed = LastRun(T0 + HOUR + 20_000, T0 + HOUR + 21_000, "error", "StorageError: boom")
    failed.topic_id = store.topic("logs").topic_id
    assert records.finish(lease, failed, now_ms=T0 + HOUR + 21_000)
    rested = next(
        t for t in plan(store, settings, T0 + HOUR + 30_000).tasks if t.task == "retention"
    )
    assert not rested.decision.due
    assert rested.decision.next_ms == T0 + HOUR + 20_000 + 60_000
    assert "last run: error" in rested.decision.reason
    assert _decisions(store, T0 + HOUR + 80_000, settings)[("logs", "retention")] is True
    assert _decisions(store, T0 + HOUR + 30_000, settings)[("logs", "vacuum")] is False
    assert _decisions(store, T0 + HOUR + 1 + 10 * 60_000, settings)[("logs", "vacuum")] is True


# -- leases -------------------------------------------------------------------------------------


def test_an_expired_lease_is_taken_over_and_a_live_one_is_not(store: Store) -> None:
    store.create_topic("t", 1)
    records = Records(store.storage)
    dead = records.acquire("t", "vacuum", holder="dead", now_ms=T0, lease_ms=60_000, newest=None)
    assert dead is not None

    def newest() -> Any:
        return records.newest(records.listing("t"), ["vacuum"]).get("vacuum")

    assert (
        records.acquire(
            "t", "vacuum", holder="b", now_ms=T0 + 59_999, lease_ms=60_000, newest=newest()
        )
        is None
    )
    taken = records.acquire(
        "t", "vacuum", holder="b", now_ms=T0 + 60_001, lease_ms=60_000, newest=newest()
    )
    assert taken is not None
    assert taken.number == dead.number + 1
    # The dead holder wakes up: its record cannot be written after the taker's.
    assert not records.finish(
        dead, LastRun(T0, T0 + 70_000, "ok", holder="dead"), now_ms=T0 + 70_000
    )
    assert newest().holder == "b"
    assert newest().state == "running"
    # The planner shows it as running by the taker, and does not plan it.
    item = next(t for t in plan(store, Settings(), T0 + 61_000).tasks if t.task == "vacuum")
    assert item.held_by == "b"
    assert not item.decision.due


def test_a_released_lease_is_free_and_keeps_the_last_run(store: Store) -> None:
    store.create_topic("t", 1)
    records = Records(store.storage)
    first = records.acquire("t", "merge", holder="a", now_ms=T0, lease_ms=60_000, newest=None)
    assert first is not None
    assert records.finish(first, LastRun(T0, T0 + 5, "ok", records=3, holder="a"), now_ms=T0 + 5)
    again = records.acquire(
        "t",
        "merge",
        holder="a",
        now_ms=T0 + 10,
        lease_ms=60_000,
        newest=records.newest(records.listing("t"), ["merge"])["merge"],
    )
    assert again is not None
    assert records.release(again, now_ms=T0 + 11)
    latest = records.newest(records.listing("t"), ["merge"])["merge"]
    assert latest.state == "released"
    assert not latest.held_at(T0 + 12)
    assert latest.last_run is not None
    assert latest.last_run.records == 3


# A race: on SeaweedFS, not moto, whose conditional PUT is no arbiter (tests/servers.py).
@pytest.mark.parametrize(
    "target", ["local_store", pytest.param("seaweed_store", marks=pytest.mark.s3)]
)
def test_two_maintainers_racing_run_each_task_once(
    target: str, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    store = Store(*where)
    store.create_topic("a", 1, {"retention.ms": HOUR})
    append(store.partition("a", 0), [b"old"], [b"1"], T0 - 2 * HOUR)
    append(store.partition("a", 0), [b"new"], [b"2"], T0)
    # Both plan from the same state, then run every item at the same time.
    plans = [plan(Store(*where), Settings(), T0).due for _ in range(2)]
    assert len(plans[0]) == len(plans[1]) == 2 + len(STORE_TASKS)  # retention, vacuum
    results: list[list[TaskRun]] = [[], []]
    barrier = threading.Barrier(2)

    def maintainer(i: int) -> None:
        own = Store(*where)
        barrier.wait()
        for item in plans[i]:
            results[i].append(run_item(own, item, Settings(), holder=f"m{i}", fixed_now_ms=T0))

    threads = [threading.Thread(target=maintainer, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ran = Counter((r.topic, r.task) for rs in results for r in rs if r.outcome != "taken")
    assert ran == {("a", "retention"): 1, ("a", "vacuum"): 1, **{(None, t): 1 for t in STORE_TASKS}}
    # The loser of each item found it taken.
    assert sum(r.outcome == "taken" for rs in results for r in rs) == 2 + len(STORE_TASKS)
    assert [r[2] for r in rows(store.partition("a", 0))] == [b"2"]
    # And a third pass finds nothing due: the records say it ran.
    assert run_due(Store(*where), now_ms=T0 + 1) == []


# -- the command line ---------------------------------------------------------------------------


def _cli(where: Target, *args: str, code: int = 0) -> Any:
    result = runner.invoke(app, [*args, "--store", where[0]])
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    return result


@pytest.mark.parametrize("logs", [1, 3], ids=["logs1", "logs3"])
def test_maintain_once_retains_and_compacts(
    local_store: Target, logs: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Layout 3 with commit.logs 1 and 3 (tests/commit_logs.py): with 3, the two partitions
    of "logs" are in topic logs of their own."""
    create_topics_with(monkeypatch, logs)
    store = Store(*local_store)
    now = now_ms()
    store.create_topic("logs", 2, {"retention.ms": HOUR})
    store.create_topic("state", 1, {"cleanup.policy": "compact"})
    for p in range(2):
        append(store.partition("logs", p), [b"a", b"b"], [b"1", b"2"], now - 2 * HOUR)
        append(store.partition("logs", p), [b"c"], [b"3"], now - 60_000)
    state = store.partition("state", 0)
    append(state, [b"k1", b"k2"], [b"1", b"1"], now - 2 * HOUR)
    append(state, [b"k1", b"k1"], [b"2", b"3"], now - HOUR)

    out = _cli(local_store, "maintain", "--once").stdout
    assert "[maintain] retention logs: ok removed 4 records" in out
    assert "[maintain] compaction state: ok" in out
    assert "[maintain] vacuum logs:" in out
    fresh = Store(*local_store)
    for p in range(2):
        assert rows(fresh.partition("logs", p)) == [(2, b"c", b"3")]
    assert rows(fresh.partition("state", 0)) == [(1, b"k2", b"1"), (3, b"k1", b"3")]
    # A second pass at once finds nothing due.
    assert _cli(local_store, "maintain", "--once").stdout == ""
    # Topic listing ignores the service's directory.
    assert store.storage.list_dir(directory("logs"))
    assert fresh.list_topics() == ["logs", "state"]


def test_maintain_skips_a_layout2_topic_and_reports_it(local_store: Target) -> None:
    """A topic of layout 2 (read, never written by this version) is left alone and named with
    the upgrade that makes it maintainable; the service goes on with the other topics."""
    store = Store(*local_store)
    now = now_ms()
    layout2.create_topic(
        store, "old", 1, {"retention.ms": HOUR, "cleanup.policy": "compact,delete"}
    )
    layout2.append(store, "old", 0, layout2.records([b"1", b"2"], [b"k", b"k"]))
    before = store.partition_state("old", 0)
    store.create_topic("logs", 1, {"retention.ms": HOUR})
    append(store.partition("logs", 0), [b"a"], [b"1"], now - 2 * HOUR)
    append(store.partition("logs", 0), [b"b"], [b"2"], now)
    lines: list[str] = []
    runs = run_due(store, log=lines.append)
    assert {(r.topic, r.task) for r in runs if r.outcome == "ok"} >= {("logs", "retention")}
    assert not [r for r in runs if r.topic == "old"]
    [skipped] = [line for line in lines if line.startswith("[maintain] old:")]
    assert "layout 2" in skipped
    assert "`kstore topics upgrade old`" in skipped
    assert rows(Store(*local_store).partition("logs", 0)) == [(1, b"b", b"2")]
    after = Store(*local_store).partition_state("old", 0)
    assert (after.version, after.end_offset) == (before.version, before.end_offset)
    assert "`kstore topics upgrade old`" in plan(store, Settings(), now).errors["old"]


def test_status_text_and_json_agree(local_store: Target, commit_logs: int) -> None:
    store = Store(*local_store)
    now = now_ms()
    store.create_topic("logs", 1, {"retention.ms": HOUR})
    store.create_topic("state", 2, {"cleanup.policy": "compact"})
    append(store.partition("logs", 0), [b"a"], [b"1"], now - 2 * HOUR)
    append(store.partition("logs", 0), [b"b"], [b"2"], now)
    append(store.partition("state", 1), [b"k", b"k"], [b"1", b"2"], now)
    run_due(store, topics=["logs"])
    data = json.loads(_cli(local_store, "maintain", "status", "-o", "json").stdout)
    table = _cli(local_store, "maintain", "status").stdout
    lines = [line.split() for line in table.splitlines()]
    by_topic = {t["topic"]: t for t in data["topics"]}
    assert set(by_topic) == {"logs", "state"}
    retention = next(t for t in by_topic["logs"]["tasks"] if t["task"] == "retention")
    assert retention["last_run"]["outcome"] == "ok"
    assert retention["last_run"]["records"] == 1
    assert not retention["due"]
    row = next(line for line in lines if line[:2] == ["logs", "retention"])
    assert row[3:5] == ["ok", "1"]  # outcome, records removed
    compaction = next(t for t in by_topic["state"]["tasks"] if t["task"] == "compaction")
    assert compaction["due"]
    assert compaction["last_run"] is None
    assert next(line for line in lines if line[:2] == ["state", "compaction"])[2:4] == ["-", "-"]
    for part in by_topic["state"]["partitions"]:
        row = next(line for line in lines if line[:2] == ["state", str(part["partition"])])
        assert row[6] == f"{part['dirty_ratio']:.2f}"  # after BYTES ("0 B": two words)
    assert [p["dirty_ratio"] for p in by_topic["state"]["partitions"]] == [0.0, 1.0]
    # Per partition: the newest run that changed it and what it removed there.
    [changed] = by_topic["logs"]["partitions"][0]["last_runs"]
    assert (changed["task"], changed["records"], changed["segments"]) == ("retention", 1, 1)
    assert changed["finished_ms"] == retention["last_run"]["finished_ms"]
    assert by_topic["state"]["partitions"][1]["last_runs"] == []
    row = next(line for line in lines if line[:2] == ["logs", "0"])
    assert "retention" in row
    assert "-1 records," in " ".join(row)
    status_only = status(store, topics=["logs"])
    assert [t["topic"] for t in status_only["topics"]] == ["logs"]


def test_status_shows_an_open_transaction_and_its_age(local_store: Target) -> None:
    from kstore.producer import Producer

    store = Store(*local_store)
    store.create_topic("tx", 1)
    producer = Producer(store, transactional_id="tx-1")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send("tx", b"v", key=b"k", partition=0)
    producer.flush()
    try:
        data = status(store, now_ms=now_ms() + 5_000)
        opened = data["topics"][0]["partitions"][0]["open_transactions"]
        assert len(opened) == 1
        assert opened[0]["first_offset"] == 0
        assert opened[0]["age_ms"] >= 5_000
    finally:
        producer.abort_transaction()
        producer.close()


def test_bad_service_settings_are_one_line_errors(local_store: Target) -> None:
    Store(*local_store)
    err = _cli(local_store, "maintain", "--once", "--interval", "soon", code=2).stderr
    assert "--interval 'soon'" in err
    err = _cli(local_store, "maintain", "--once", "--merge-min-segments", "1", code=2).stderr
    assert "--merge-min-segments must be at least 2" in err
    with pytest.raises(ValueError, match="interval_ms must be an integer >= 1"):
        Settings(interval_ms=0)


def test_maintain_stops_cleanly_on_sigterm(local_store: Target) -> None:
    """The long-running form: a first pass at once, then SIGTERM ends it with status 0 and no
    lease left held."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    store = Store(*local_store)
    store.create_topic("logs", 1)
    kstore = str(Path(sys.executable).parent / "kstore")
    proc = subprocess.Popen(
        [kstore, "maintain", "--interval", "1h", "--store", local_store[0]],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first pass vacuums the new topic
        assert first.startswith("[maintain] vacuum logs: nothing"), first
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "SIGTERM: stopping after the current task" in out
    records = Records(store.storage)
    newest = records.newest(records.listing("logs"), ["vacuum"])["vacuum"]
    assert newest.state == "done"


def test_a_store_wide_task_plugs_in_with_its_own_lease_and_record(store: Store) -> None:
    """The hook for store-wide tasks: an IntervalTask of scope "store" around a library
    function runs once per interval, leased and recorded under _maintenance/store/."""
    from kstore.maintenance import TASKS, IntervalTask, RunContext

    store.create_topic("t", 1)
    store.storage.put("scratch/a", b"x")
    store.storage.put("scratch/b", b"y")

    def sweep(ctx: RunContext) -> dict[str, int]:
        names = [f"scratch/{i.name}" for i in ctx.store.storage.list_dir("scratch")]
        ctx.store.storage.delete(names)
        return {"files": len(names)}

    tasks = [*(t for t in TASKS if t.scope == "topic"), IntervalTask("sweep", "store", sweep)]
    settings = Settings(interval_ms=60_000)
    runs = run_due(store, settings, now_ms=T0, tasks=tasks)
    swept = [r for r in runs if r.task == "sweep"]
    assert [(r.topic, r.outcome, r.files) for r in swept] == [(None, "ok", 2)]
    assert store.storage.list_dir("scratch") == []
    assert [r.task for r in run_due(store, settings, now_ms=T0 + 29_999, tasks=tasks)] == []
    assert [r.task for r in run_due(store, settings, now_ms=T0 + 30_000, tasks=tasks)] == ["sweep"]
    records = Records(store.storage)
    newest = records.newest(records.listing(None), ["sweep"])["sweep"]
    assert newest.state == "done"
    assert newest.last_run is not None
    assert newest.last_run.outcome == "nothing"
    data = status(store, settings, now_ms=T0 + 60_001)
    # status lists the registry's tasks only
    assert [t["task"] for t in data["store_tasks"]] == STORE_TASKS


def test_a_store_wide_task_runs_at_every_pass_of_one_maintainer() -> None:
    """Passes are one interval apart, start to start; the task's last run began and ended
    some time into the previous pass. It is due again at the next pass (it used to be due a
    full interval after that run ended, so it ran every other pass: an abandoned transaction
    waited up to its timeout plus two intervals)."""
    from kstore.maintenance import TASKS
    from kstore.maintenance.coordination import LastRun

    task = next(t for t in TASKS if t.name == "abort-transactions")
    settings = Settings(interval_ms=2_000)
    last = LastRun(T0 + 300, T0 + 400, "nothing", "", 0, 0, 0, 0, "m", None)
    assert task.due(None, last, T0 + 2_000, settings).due  # the next pass
    assert not task.due(None, last, T0 + 1_000, settings).due  # another maintainer's pass


def test_the_service_survives_a_failed_pass(store: Store) -> None:
    """A pass that fails (here: its topic was deleted) is logged and the next pass runs."""
    from kstore.maintenance import Service

    store.create_topic("gone", 1)
    lines: list[str] = []

    def log(line: str) -> None:
        lines.append(line)
        if len(lines) == 2:
            service.stop()

    service = Service(store, Settings(interval_ms=1), topics=["gone"], log=log)
    store.delete_topic("gone")
    service.run_forever()
    assert len(lines) == 2
    assert all(
        line.startswith("[maintain] pass failed: UnknownTopicOrPartitionError") for line in lines
    )


def test_the_store_wide_tasks_finish_expired_transactions_purge_and_prune(
    local_store: Target,
) -> None:
    """The three store-wide tasks of the registry, run by the service: a transaction left open
    past its timeout is aborted (read_committed readers then pass it), a deleted topic's files
    go once its delay has passed, and a busy group's log is pruned."""
    from kstore.consumer import Consumer
    from kstore.groups import Group
    from kstore.layout import group_log_dir, topic_data_dir
    from kstore.producer import Producer
    from kstore.records import OffsetAndMetadata, TopicPartition

    store = Store(*local_store)
    store.create_topic("out", 1)
    abandoned = Producer(store, transactional_id="tx", transaction_timeout_ms=60_000)
    abandoned.begin_transaction()
    abandoned.send("out", value=b"never", partition=0)
    abandoned.flush()
    with Producer(store) as plain:
        plain.send("out", value=b"after", partition=0).get(timeout=30)
    gone_id = store.create_topic("gone", 1).topic_id
    store.delete_topic("gone")
    group = Group(store, "g")
    for offset in range(120):
        group.commit_offsets(
            {TopicPartition("out", 0): OffsetAndMetadata(offset)}, member_id=None, generation=-1
        )

    def committed_values() -> list[bytes | None]:
        with Consumer(
            "out",
            store=Store(*local_store),
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        ) as reader:
            got = reader.poll(timeout_ms=500)
        return [r.value for records in got.values() for r in records]

    assert committed_values() == []  # the open transaction holds the stable offset at 0
    # At once: nothing expired, the delay not passed, no log old enough.
    soon = {r.task: r.outcome for r in run_due(store, now_ms=now_ms() + 1) if r.topic is None}
    assert soon == dict.fromkeys(STORE_TASKS, "nothing")
    assert store.storage.exists(f"{topic_data_dir('gone', gone_id)}/_log")

    later = now_ms() + 31 * DAY  # past the timeout, the delay and the log retention (30 days)
    runs = {r.task: r for r in run_due(store, now_ms=later) if r.topic is None}
    assert {task: run.outcome for task, run in runs.items()} == dict.fromkeys(STORE_TASKS, "ok")
    assert "1 aborted" in runs["abort-transactions"].detail
    assert runs["purge-deleted-topics"].files == 1
    assert not store.storage.exists(f"{topic_data_dir('gone', gone_id)}/_log")
    assert committed_values() == [b"after"]
    # Below the group log's checkpoint at 100 goes now; a checkpoint of its newest version is
    # written, and everything below that goes a retention later.
    pruned = runs["prune-logs"].files
    runs = {r.task: r for r in run_due(store, now_ms=later + 31 * DAY) if r.topic is None}
    assert runs["prune-logs"].outcome == "ok"
    assert pruned + runs["prune-logs"].files >= 119
    assert len(store.storage.list_dir(group_log_dir("g"))) <= 3
    assert Group(store, "g").committed(TopicPartition("out", 0)) == OffsetAndMetadata(119)


def test_the_service_publishes_a_delta_topic_after_compacting_it(local_store: Target) -> None:
    """A topic with table.format=delta: the compaction the service runs publishes a Delta
    table version, which reads the compacted records."""
    from kstore.lakehouse import open_table

    store = Store(*local_store)
    now = now_ms()
    store.create_topic("state", 1, {"cleanup.policy": "compact", "table.format": "delta"})
    append(store.partition("state", 0), [b"k1", b"k2"], [b"1", b"1"], now - 2 * HOUR)
    append(store.partition("state", 0), [b"k1", b"k1"], [b"2", b"3"], now - HOUR)
    runs = {(r.topic, r.task): r.outcome for r in run_due(store)}
    assert runs[("state", "compaction")] == "ok"
    table = open_table(store, "state").to_pyarrow_table().sort_by("offset")
    assert table.column("key").to_pylist() == [b"k2", b"k1"]
    assert table.column("value").to_pylist() == [b"1", b"3"]


def test_a_run_longer_than_its_lease_keeps_it(store: Store) -> None:
    """The lease is renewed while its task runs: a second maintainer planning the same task
    in the middle of a run longer than the lease finds it taken, and the run is recorded."""
    import time

    from kstore.maintenance import IntervalTask

    store.create_topic("t", 1)
    started = threading.Event()

    def slow(ctx: Any) -> dict[str, int]:
        started.set()
        time.sleep(5.0)
        return {"files": 1}

    tasks = [IntervalTask("slow", "store", slow)]
    # Renewed every third of a lease: one of 300 ms ran out under the whole suite's load
    # (a renewal 370 ms late), so the lease here is a second, the run five.
    settings = Settings(lease_ms=1_000)
    [item] = plan(store, settings, now_ms(), tasks=tasks).due
    out: list[TaskRun] = []
    runner_thread = threading.Thread(
        target=lambda: out.append(run_item(store, item, settings, holder="a", tasks=tasks))
    )
    runner_thread.start()
    assert started.wait(10)
    time.sleep(3.0)  # three leases' length into the run
    other = Store(store.url, store.storage.storage_options)
    assert plan(other, settings, now_ms(), tasks=tasks).due == []  # held: nothing due
    stolen = run_item(other, item, settings, holder="b", tasks=tasks)
    assert stolen.outcome == "taken"
    runner_thread.join()
    assert [(r.outcome, r.files, r.detail) for r in out] == [("ok", 1, "")]


def test_the_records_of_a_deleted_topic_are_dropped(store: Store) -> None:
    store.create_topic("x", 1)
    store.create_topic("y", 1)
    run_due(store, now_ms=T0)  # vacuum runs on both: records under _maintenance/topics/
    assert store.storage.list_dir(directory("x"))
    store.delete_topic("x")
    runs = run_due(store, Settings(interval_ms=1), now_ms=T0 + 1)
    [purge] = [r for r in runs if r.task == "purge-deleted-topics"]
    assert (purge.outcome, purge.detail.endswith("records of 1 deleted topic(s) dropped")) == (
        "ok",
        True,
    )
    assert store.storage.list_dir(directory("x")) == []
    assert store.storage.list_dir(directory("y"))  # a live topic keeps its records
