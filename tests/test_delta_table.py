"""A topic as a Delta table (kstore.lakehouse, PROTOCOL.md 29): what ``deltalake`` reads equals
kstore's own read of the published range, for delete, compacted and typed topics; publication
is zero-copy and exactly-once across crashes and races; vacuum keeps what the table names.

Local disk always (both layouts where it matters); the essential tests again on SeaweedFS."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import kstore.lakehouse.publish as publish_module
import pyarrow as pa
import pytest
from kstore.cli.app import app
from kstore.compaction import merge_segments, run_compaction
from kstore.lakehouse import DeltaLogError, open_table, publish_table, read_snapshot, table_dir
from kstore.retention import run_retention, vacuum
from typer.testing import CliRunner

from kstore import Store
from kstore.errors import InvalidConfigurationError, StorageError
from kstore.producer import Producer
from kstore.segments import HEADERS_TYPE, TIMESTAMP_TYPE
from tests.commit_logs import commit_logs_fixture
from tests.commit_logs_extra import open_target, target_params
from tests.test_jobs_support import BACKENDS, Target, append, now_ms, open_store

DAY = 86_400_000
DELTA = {"table.format": "delta"}
COLUMNS = ["partition", "offset", "timestamp", "key", "value", "headers"]

commit_logs = commit_logs_fixture()


def kstore_rows(store: Store, topic: str, covered: dict[int, int]) -> pa.Table:
    """kstore's own read (Partition.read, verified) of every partition from its log start up to
    the offset the table covers, with the partition as a column."""
    tables = []
    for p, end in sorted(covered.items()):
        part = store.partition(topic, p)
        state = part.state()
        batches = list(part.read(state.start_offset, state=state, end_offset=end))
        if not batches:
            continue
        t = pa.Table.from_batches(batches)
        t = t.append_column("partition", pa.array([p] * t.num_rows, pa.int32()))
        tables.append(t)
    if not tables:
        return pa.table({c: [] for c in COLUMNS})
    return _normal(pa.concat_tables(tables))


def delta_rows(store: Store, topic: str, version: int | None = None) -> pa.Table:
    return _normal(open_table(store, topic, version).to_pyarrow_table())


def _normal(t: pa.Table) -> pa.Table:
    """The compared columns, in one order and one set of types (deltalake may return view or
    large types), sorted by (partition, offset)."""
    out = {}
    for name in COLUMNS:
        column = t.column(name)
        if name in ("key", "value") and pa.types.is_struct(column.type):
            out[name] = column
            continue
        target = {
            "partition": pa.int32(),
            "offset": pa.int64(),
            "timestamp": TIMESTAMP_TYPE,
            "headers": HEADERS_TYPE,
        }.get(name, column.type if name == "key" and pa.types.is_string(column.type) else None)
        if target is None:
            target = pa.binary()
        out[name] = column.cast(target) if column.type != target else column
    table = pa.table(out)
    return table.sort_by([("partition", "ascending"), ("offset", "ascending")])


def _covered(report: Any) -> dict[int, int]:
    return dict(report.covered)


def _all_files(store: Store) -> dict[str, int]:
    """Every file under the store root with its size (local disk)."""
    root = Path(store.storage.root)
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _fill(
    store: Store, topic: str, partitions: int, segments: int, ts: int, per: int = 4, pad: int = 0
) -> None:
    for p in range(partitions):
        part = store.partition(topic, p)
        for s in range(segments):
            append(
                part,
                [b"k%d" % ((s * per + i) % 7) for i in range(per)],
                [b"v-%d-%d-%d" % (p, s, i) + b"." * pad for i in range(per)],
                ts,
            )


# -- the table reads what kstore reads --------------------------------------------------------


@pytest.mark.parametrize("target", target_params(BACKENDS))
def test_delete_topic_after_merge_and_retention(
    target: tuple[str, int], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two partitions: in one topic log, or (commit.logs 3) each in its own."""
    where: Target = open_target(request, monkeypatch, target)
    store = open_store(where)
    store.create_topic("clicks", 2, {**DELTA, "retention.ms": DAY})
    old = now_ms() - 3 * DAY
    _fill(store, "clicks", 2, 4, old, per=50, pad=200)  # big enough to stay apart
    merge_segments(None, store, topics=["clicks"], verbose=False)  # publishes by itself
    _fill(store, "clicks", 2, 5, now_ms())
    merge_segments(None, store, topics=["clicks"], verbose=False)
    snapshot = read_snapshot(store.storage, table_dir(store.topic("clicks")))
    assert len(snapshot.files) == 4  # an old and a new Parquet segment per partition
    summary = run_retention(None, store, topics=["clicks"], verbose=False)
    assert summary.segments_removed == 2
    assert not summary.errors
    report = publish_table(store, "clicks")
    assert not report.committed  # retention's run published the removes already
    assert report.covered == {0: 220, 1: 220}
    expected = kstore_rows(store, "clicks", _covered(report))
    assert expected.num_rows == 2 * 20  # the old records went with retention
    assert delta_rows(store, "clicks").equals(expected)
    # The timestampType column comes from the topic's config.
    table = open_table(store, "clicks").to_pyarrow_table()
    assert set(table.column("timestampType").to_pylist()) == {0}


@pytest.mark.parametrize("target", BACKENDS)
def test_compacted_topic_reads_latest_value_per_key(
    target: str, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    config = {
        **DELTA,
        "cleanup.policy": "compact",
        "min.cleanable.dirty.ratio": 0.0,
        "delete.retention.ms": 0,
    }
    store.create_topic("users", 1, config)
    part = store.partition("users", 0)
    ts = now_ms() - DAY
    latest: dict[bytes, bytes | None] = {}
    for s in range(6):
        keys = [b"u%d" % ((s * 3 + i) % 5) for i in range(4)]
        values = [None if (s + i) % 5 == 0 else b"name-%d-%d" % (s, i) for i in range(4)]
        append(part, keys, values, ts)
        latest.update(zip(keys, values, strict=True))
    now = now_ms()
    run_compaction(None, store, topics=["users"], verbose=False, now_ms=now)
    # The tombstones' horizon (delete.retention.ms = 0) has passed: the next run drops them.
    run_compaction(None, store, topics=["users"], verbose=False, now_ms=now + 1000)
    report = publish_table(store, "users")
    rows = delta_rows(store, "users")
    assert rows.equals(kstore_rows(store, "users", _covered(report)))
    got = dict(zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True))
    assert got == {k: v for k, v in latest.items() if v is not None}
    assert rows.num_rows == len(got)  # one row per key, no tombstone


@pytest.mark.parametrize("target", BACKENDS)
def test_typed_topic_has_its_declared_fields(target: str, request: pytest.FixtureRequest) -> None:
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic(
        "orders",
        2,
        DELTA,
        value_schema="id BIGINT NOT NULL, amount DECIMAL(12,2), tags ARRAY<STRING>",
        key_schema="string",
    )
    producer = Producer(store=store, linger_ms=0)
    import decimal

    for i in range(30):
        producer.send(
            "orders",
            key=f"c{i % 4}",
            value={"id": i, "amount": decimal.Decimal(f"{i}.25"), "tags": ["a", str(i)]},
            headers=[("h", b"%d" % i)],
        )
        if i % 5 == 4:
            producer.flush()
    producer.close()
    merge_segments(None, store, topics=["orders"], verbose=False)
    report = publish_table(store, "orders", tail=True)
    assert sum(report.covered.values()) == 30
    table = open_table(store, "orders").to_pyarrow_table()
    value_type = table.schema.field("value").type
    assert [value_type.field(i).name for i in range(value_type.num_fields)] == [
        "id",
        "amount",
        "tags",
    ]
    expected = kstore_rows(store, "orders", _covered(report))
    got = _normal(table)
    assert got.column("key").to_pylist() == expected.column("key").to_pylist()
    assert got.column("value").to_pylist() == expected.column("value").to_pylist()
    assert got.column("headers").to_pylist() == expected.column("headers").to_pylist()
    assert got.drop_columns(["key", "value"]).equals(expected.drop_columns(["key", "value"]))


def test_typed_schema_evolution_and_refused_widening(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("o", 1, DELTA, value_schema="id BIGINT NOT NULL, n INT")
    producer = Producer(store=store, linger_ms=0)
    for i in range(3):
        producer.send("o", value={"id": i, "n": i})
        producer.flush()
    publish_table(store, "o", tail=True)
    open_table(store, "o").create_checkpoint()  # the next metaData is built from it
    producer.close()
    store.alter_topic_schema("o", "id BIGINT NOT NULL, n INT, extra STRING")
    producer = Producer(store=store, linger_ms=0)
    producer.send("o", value={"id": 9, "n": 9, "extra": "x"})
    producer.close()
    report = publish_table(store, "o", tail=True)
    assert report.committed
    values = open_table(store, "o").to_pyarrow_table().column("value").to_pylist()
    assert sorted(values, key=lambda v: v["id"]) == [
        {"id": 0, "n": 0, "extra": None},
        {"id": 1, "n": 1, "extra": None},
        {"id": 2, "n": 2, "extra": None},
        {"id": 9, "n": 9, "extra": "x"},
    ]
    store.alter_topic_schema("o", "id BIGINT NOT NULL, n BIGINT, extra STRING")
    with pytest.raises(DeltaLogError, match=r"field 'value.n' changed type from integer to long"):
        publish_table(store, "o")
    assert open_table(store, "o").version() == report.version


def test_tail_publication_reaches_the_last_stable_offset(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("t", 1, DELTA)
    part = store.partition("t", 0)
    append(part, [b"a"] * 200, [b"x" * 50] * 200, now_ms())  # dominant: merging leaves it
    append(part, [b"b"], [b"y"], now_ms())
    merge_segments(None, store, topics=["t"], verbose=False)
    report = publish_table(store, "t")
    assert report.covered == {0: 0}  # no Parquet segment from the log start
    report = publish_table(store, "t", tail=True)
    assert report.tail_segments == 2
    assert report.covered == {0: 201}
    assert delta_rows(store, "t").equals(kstore_rows(store, "t", {0: 201}))


# -- exactly-once ----------------------------------------------------------------------------------


@pytest.mark.parametrize("target", target_params(BACKENDS))
def test_crash_between_the_two_commits_is_repaired(
    target: tuple[str, int], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two partitions: in one topic log, or (commit.logs 3) each in its own: the repair
    publishes both, each up to its own end offset."""
    where: Target = open_target(request, monkeypatch, target)
    store = open_store(where)
    store.create_topic("t", 2, DELTA)
    _fill(store, "t", 2, 3, now_ms())
    merge_segments(None, store, topics=["t"], verbose=False)
    first = publish_table(store, "t")
    _fill(store, "t", 2, 3, now_ms())

    def crash(*args: Any, **kwargs: Any) -> int:
        raise SystemExit("crash before the Delta commit")

    real_commit = publish_module.commit

    monkeypatch.setattr(publish_module, "commit", crash)
    with pytest.raises(SystemExit):
        merge_segments(None, store, topics=["t"], verbose=False)
    # The crash's undo only: the topics of this test keep their commit.logs.
    monkeypatch.setattr(publish_module, "commit", real_commit)
    # kstore committed the merge; the table is still at the version before it.
    assert read_snapshot(store.storage, table_dir(store.topic("t"))).version == first.version
    repaired = publish_table(store, "t")
    assert repaired.committed
    assert repaired.version == first.version + 1
    rows = delta_rows(store, "t")
    assert rows.equals(kstore_rows(store, "t", _covered(repaired)))
    assert rows.num_rows == 2 * 24
    assert len(set(zip(*_keys(rows), strict=True))) == rows.num_rows
    assert _covered(repaired) == {p: store.partition("t", p).state().end_offset for p in (0, 1)}

    # A crash after the Delta commit landed (before anything else ran): nothing is redone.
    _fill(store, "t", 2, 3, now_ms())
    real = publish_module.commit

    def commit_then_crash(*args: Any, **kwargs: Any) -> int:
        real(*args, **kwargs)
        raise SystemExit("crash after the Delta commit")

    monkeypatch.setattr(publish_module, "commit", commit_then_crash)
    with pytest.raises(SystemExit):
        merge_segments(None, store, topics=["t"], verbose=False)
    monkeypatch.setattr(publish_module, "commit", real)
    again = publish_table(store, "t")
    assert not again.committed
    assert again.version == repaired.version + 1
    rows = delta_rows(store, "t")
    assert rows.equals(kstore_rows(store, "t", _covered(again)))
    assert rows.num_rows == 2 * 36
    assert _covered(again) == {0: 36, 1: 36}


def _keys(rows: pa.Table) -> tuple[list[Any], list[Any]]:
    return rows.column("partition").to_pylist(), rows.column("offset").to_pylist()


@pytest.mark.parametrize("landed", [True, False])
def test_a_commit_whose_answer_was_lost(
    local_store: Target, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    """The Delta commit's put-if-absent fails without an answer: the file decides (its txnId
    is this publisher's, or it is absent and the publisher tries again); never twice."""
    store = open_store(local_store)
    store.create_topic("t", 1, DELTA)
    _fill(store, "t", 1, 3, now_ms())
    publish_table(store, "t", tail=True)
    _fill(store, "t", 1, 3, now_ms())
    storage = store.storage
    real = storage.put_if_absent
    failures: list[str] = []

    def lost(rel: str, data: Any, **kwargs: Any) -> None:
        if "_delta_log/" in rel and not failures:
            failures.append(rel)
            if landed:
                real(rel, data, **kwargs)
            raise StorageError(f"conditional write of {rel!r} failed: connection reset")
        real(rel, data, **kwargs)

    monkeypatch.setattr(storage, "put_if_absent", lost)
    report = publish_table(store, "t", tail=True)
    assert failures
    assert report.committed
    assert report.version == 1
    assert report.attempts == (1 if landed else 2)
    log = {i.name for i in storage.list_dir(f"{table_dir(store.topic('t'))}/_delta_log")}
    assert log == {f"{v:020d}.json" for v in range(2)}
    assert delta_rows(store, "t").equals(kstore_rows(store, "t", _covered(report)))


def test_racing_publishers_commit_once(local_store: Target, commit_logs: int) -> None:
    store = open_store(local_store)
    store.create_topic("t", 3, DELTA)
    _fill(store, "t", 3, 3, now_ms())
    merge_segments(None, store, topics=["t"], verbose=False)
    _fill(store, "t", 3, 3, now_ms())
    merge_segments(None, store, topics=["t"], verbose=False)  # publishes: a table exists
    before = read_snapshot(store.storage, table_dir(store.topic("t"))).version
    _fill(store, "t", 3, 4, now_ms())
    # Merge without publishing, then four publishers race for the same change.
    store.alter_topic_config("t", {"table.format": "none"})
    merge_segments(None, store, topics=["t"], verbose=False)
    store.alter_topic_config("t", {"table.format": "delta"})
    start = threading.Barrier(4)
    reports: list[Any] = []

    def run() -> None:
        own = Store(*local_store)
        start.wait()
        reports.append(publish_table(own, "t"))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r.committed for r in reports) == 1
    assert {r.version for r in reports} == {before + 1}
    rows = delta_rows(store, "t")
    assert rows.equals(kstore_rows(store, "t", _covered(reports[0])))
    assert _covered(reports[0]) == dict.fromkeys(range(3), 40)  # 10 appends of 4 per partition


def test_a_publisher_behind_the_table_stands_down(local_store: Target) -> None:
    """A publisher whose kstore state is older than what the table covers (its txn says so)
    never moves the table back: it reads again."""
    store = open_store(local_store)
    store.create_topic("t", 1, DELTA)
    _fill(store, "t", 1, 3, now_ms())
    meta = store.topic("t")
    before = publish_module.kstore_view(store, meta)  # the Arrow segments only
    merge_segments(None, store, topics=["t"], verbose=False)  # publishes the merged file
    published = delta_rows(store, "t")
    assert published.num_rows == 12
    real = publish_module.kstore_view
    calls: list[int] = []

    def view(store_: Store, meta_: Any) -> Any:
        calls.append(1)
        return before if len(calls) == 1 else real(store_, meta_)

    publish_module.kstore_view = view  # type: ignore[assignment]
    try:
        report = publish_table(store, "t")
    finally:
        publish_module.kstore_view = real
    assert report.attempts == 2
    assert not report.committed
    assert delta_rows(store, "t").equals(published)


def test_publication_reads_a_checkpoint_deltalake_wrote(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("t", 1, DELTA)
    for _ in range(3):
        _fill(store, "t", 1, 3, now_ms())
        merge_segments(None, store, topics=["t"], verbose=False)
    table = open_table(store, "t")
    table.create_checkpoint()
    table.cleanup_metadata()
    snapshot = read_snapshot(store.storage, table_dir(store.topic("t")))
    assert snapshot.version == table.version()
    assert len(snapshot.removed) >= 1  # the checkpoint's tombstones, with their timestamps
    assert all(f.deletion_ms for f in snapshot.removed.values())
    _fill(store, "t", 1, 3, now_ms())
    merge_segments(None, store, topics=["t"], verbose=False)
    report = publish_table(store, "t")
    assert report.version == snapshot.version + 1
    assert delta_rows(store, "t").equals(kstore_rows(store, "t", _covered(report)))


def test_a_checkpoint_every_checkpoint_interval(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("t", 1, DELTA)
    _fill(store, "t", 1, 2, now_ms())
    publish_table(store, "t", tail=True)
    open_table(store, "t").alter.set_table_properties({"delta.checkpointInterval": "3"})
    reports = []
    for _ in range(2):
        _fill(store, "t", 1, 2, now_ms())
        reports.append(publish_table(store, "t", tail=True))
    assert [(r.version, r.checkpoint, r.checkpoint_error) for r in reports] == [
        (2, False, None),
        (3, True, None),
    ]
    log = {i.name for i in store.storage.list_dir(f"{table_dir(store.topic('t'))}/_delta_log")}
    assert f"{3:020d}.checkpoint.parquet" in log
    assert delta_rows(store, "t").equals(kstore_rows(store, "t", _covered(reports[-1])))


# -- zero-copy -------------------------------------------------------------------------------------


def test_publication_writes_only_its_delta_commit(local_store: Target, commit_logs: int) -> None:
    store = open_store(local_store)
    store.create_topic("t", 2, DELTA)
    store.alter_topic_config("t", {"table.format": "none"})
    _fill(store, "t", 2, 6, now_ms(), per=50)
    merge_segments(None, store, topics=["t"], verbose=False)
    store.alter_topic_config("t", {"table.format": "delta"})
    before = _all_files(store)
    report = publish_table(store, "t")
    after = _all_files(store)
    new = {path: size for path, size in after.items() if path not in before}
    log = f"{table_dir(store.topic('t'))}/_delta_log/"
    assert all(path.startswith(log) for path in new)
    assert {p: s for p, s in after.items() if p in before} == before  # nothing rewritten
    assert sum(new.values()) == report.bytes_written
    assert report.bytes_covered > 4 * report.bytes_written
    assert report.files_added == 2


@pytest.mark.s3
def test_publication_requests_on_seaweedfs(seaweed_store: Target) -> None:
    store = open_store(seaweed_store)
    store.create_topic("t", 2, {"table.format": "none"})
    _fill(store, "t", 2, 6, now_ms())
    merge_segments(None, store, topics=["t"], verbose=False)
    store.alter_topic_config("t", {"table.format": "delta"})
    with store.storage.count_requests() as counts:
        report = publish_table(store, "t")
    assert report.committed
    assert counts["PUT"] == 1  # the Delta commit: no data written
    assert delta_rows(store, "t").equals(kstore_rows(store, "t", _covered(report)))


# -- vacuum ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "layout"),
    [
        ("local_store", 3),
        pytest.param("seaweed_store", 3, marks=pytest.mark.s3),
    ],
)
def test_vacuum_keeps_what_a_retained_version_names(
    target: str, layout: int, request: pytest.FixtureRequest
) -> None:
    where: Target = request.getfixturevalue(target)
    store = open_store(where)
    store.create_topic("t", 1, {**DELTA, "file.delete.delay.ms": 10_000})
    part = store.partition("t", 0)
    _fill(store, "t", 1, 3, now_ms())
    merge_segments(None, store, topics=["t"], verbose=False)
    first = read_snapshot(store.storage, table_dir(store.topic("t")))
    directory = table_dir(store.topic("t"))
    named = [f"{directory}/{f.path}" for f in first.files.values()]
    assert len(named) == 1

    def present() -> bool:
        return store.storage.exists(named[0])

    # A merge whose publication did not happen: kstore removed the file the table names.
    _fill(store, "t", 1, 4, now_ms())
    store.alter_topic_config("t", {"table.format": "none"})
    merge_segments(None, store, topics=["t"], verbose=False)
    assert all(f"{directory}/0/{s.path}" not in named for s in part.state().segments)
    later = now_ms() + 60_000
    vacuum(None, store, topics=["t"], verbose=False, now_ms=later)
    assert present()
    assert delta_rows(store, "t").num_rows == 12  # the table's newest version still reads
    # Published: the table removes the file; time travel to the earlier version keeps it
    # for delta.deletedFileRetentionDuration (a week by default).
    store.alter_topic_config("t", {"table.format": "delta"})
    publish_table(store, "t")
    vacuum(None, store, topics=["t"], verbose=False, now_ms=later + DAY)
    assert present()
    assert delta_rows(store, "t", first.version).num_rows == 12
    # Past the retention the file goes, as Delta's own VACUUM would delete it.
    vacuum(None, store, topics=["t"], verbose=False, now_ms=later + 8 * DAY)
    assert not present()
    assert delta_rows(store, "t").num_rows == 28
    # kstore's vacuum never touches the Delta log, and verify finds nothing wrong.
    log = {i.name for i in store.storage.list_dir(f"{directory}/_delta_log")}
    assert {f"{v:020d}.json" for v in range(first.version + 2)} <= log
    if target == "local_store":
        result = CliRunner().invoke(app, ["verify", "t", "--store", where[0], "-o", "json"])
        assert result.exit_code == 0, result.stdout + result.stderr
        assert json.loads(result.stdout)["ok"] is True


def test_a_failed_publication_is_an_error_row_of_the_job(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("t", 1, DELTA)
    _fill(store, "t", 1, 3, now_ms())
    log = f"{table_dir(store.topic('t'))}/_delta_log"
    store.storage.put(f"{log}/{2:020d}.json", b"{}\n")  # versions 0 and 1 missing
    summary = merge_segments(None, store, topics=["t"], verbose=False)
    assert summary.count("committed") == 1  # kstore's merge is done all the same
    [row] = summary.errors
    assert (row.topic, row.operation) == ("t", "publish")
    assert "commit 0 is missing" in row.reason


# -- configuration and command line -------------------------------------------------------


def test_table_format_is_validated(local_store: Target) -> None:
    store = open_store(local_store)
    with pytest.raises(InvalidConfigurationError, match=r"'table.format'.*not one of none, delta"):
        store.create_topic("t", 1, {"table.format": "iceberg"})
    store.create_topic("t", 1)
    with pytest.raises(InvalidConfigurationError, match=r"table.format=none; set table.format"):
        publish_table(store, "t")


def test_describe_and_vacuum_hook_load_no_data_libraries() -> None:
    """``kstore topics describe`` and vacuum's hook import kstore.lakehouse: it must not load
    pyarrow or deltalake (the CLI's start-up time)."""
    code = (
        "import sys, kstore.lakehouse, kstore.store; "
        "print(sorted(m for m in ('pyarrow', 'deltalake', 'pandas') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cli_publish_and_describe(local_store: Target) -> None:
    store = open_store(local_store)
    store.create_topic("t", 1, DELTA)
    _fill(store, "t", 1, 2, now_ms())
    runner = CliRunner()
    args = ["--store", local_store[0]]
    out = runner.invoke(app, ["topics", "publish", "t", "--tail", "-o", "json", *args])
    assert out.exit_code == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["committed"]
    assert report["tail_segments"] == 2
    assert report["covered"] == {"0": 8}
    described = runner.invoke(app, ["topics", "describe", "t", "-o", "json", *args])
    table = json.loads(described.stdout)[0]["table"]
    assert table == {"format": "delta", "location": report["table"], "version": 0}
    text = runner.invoke(app, ["topics", "describe", "t", *args]).stdout
    assert f"Table: delta  Location: {report['table']}  Version: 0" in " ".join(text.split("\n"))
    again = runner.invoke(app, ["topics", "publish", "t", *args])
    assert again.exit_code == 0
    assert "up to date at version 0" in again.stderr + again.stdout
    bad = runner.invoke(app, ["topics", "publish", "nope", *args])
    assert bad.exit_code == 1
    assert "nope" in bad.stderr


@pytest.mark.spark
def test_a_merge_on_spark_publishes_from_the_driver(spark: Any, local_store: Target) -> None:
    """The jobs publish after their commits on Spark too (on the driver, once per topic)."""
    store = open_store(local_store)
    store.create_topic("clicks", 2, DELTA)
    _fill(store, "clicks", 2, 4, now_ms())
    summary = merge_segments(spark, store, topics=["clicks"], verbose=False)
    assert not summary.errors
    assert summary.count("committed") == 2
    report = publish_table(store, "clicks")
    assert not report.committed  # the job's own publication covered the merge
    assert delta_rows(store, "clicks").equals(kstore_rows(store, "clicks", _covered(report)))
