"""The Spark sink's write intents (spark_ext/pending.py, PROTOCOL.md 23): a task records the
segment file it is about to write before writing it, so a worker killed anywhere after the
write leaves a file its job's cleanup finds. The sink's task path, without Spark scheduling."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from kstore.spark_ext import pending
from kstore.spark_ext.options import parse_write_options
from kstore.spark_ext.pending import FileLike
from kstore.spark_ext.writer import TaskSink, clean_up

from kstore.segments import encode_segment, new_segment_name
from kstore.store import Store
from tests.test_spark_support import open_store, records, segment_files, source_options

pytestmark = [
    pytest.mark.spark,
    pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
]

JOB = pending.stream_job("query-1", 7)


class WorkerKilled(BaseException):
    """The Python worker dying: no handler of the task runs after it."""


def task_sink(store: Store, target: Any) -> TaskSink:
    options = parse_write_options(source_options(target, topic="t"), streaming=True)

    def on_written(files: list[FileLike]) -> None:
        pending.record(store, JOB, "0-attempt", files)

    return TaskSink(
        options, store, {"key": "key", "value": "value"}, seed="s", task=0, on_written=on_written
    )


def batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"key": [b"k1", b"k2"], "value": [b"v1", b"v2"]})


def kill_at_put(store: Store, monkeypatch: pytest.MonkeyPatch, *, after: bool) -> None:
    """The worker dies at a segment file's put: before it, or right after it landed."""
    real_put_new = store.storage.put_new

    def put_new(rel: str, data: Any, **kwargs: Any) -> None:
        if "/segments/" in rel and not after:
            raise WorkerKilled
        real_put_new(rel, data, **kwargs)
        if "/segments/" in rel:
            raise WorkerKilled

    monkeypatch.setattr(store.storage, "put_new", put_new)


def test_a_worker_killed_right_after_a_segment_write_leaves_a_file_its_intent_names(
    local_store_url: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 1)
    sink = task_sink(store, local_store_url)
    kill_at_put(store, monkeypatch, after=True)
    sink.add(batch())
    with pytest.raises(WorkerKilled):
        sink.finish()
    monkeypatch.undo()  # the task's own cleanup (discard) never runs: its process is gone
    present, live = segment_files(store, "t")
    assert len(present) == 1
    assert live == set()
    assert {f"{f.partition}/{f.path}" for f in pending.recorded(store, JOB)} == present
    # The driver's commit or abort of the job (here: of its replay) deletes it.
    clean_up(store, JOB, [], aborted=False)
    assert segment_files(store, "t") == (set(), set())
    assert pending.recorded(store, JOB) == []


def test_an_intent_naming_a_file_never_written_is_cleaned_up(
    local_store_url: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 1)
    sink = task_sink(store, local_store_url)
    kill_at_put(store, monkeypatch, after=False)
    sink.add(batch())
    with pytest.raises(WorkerKilled):
        sink.finish()
    monkeypatch.undo()
    (named,) = pending.recorded(store, JOB)
    assert not store.storage.exists(named.storage_path())  # named, never written
    clean_up(store, JOB, [], aborted=True)
    assert pending.recorded(store, JOB) == []


def test_a_task_failing_at_its_write_deletes_the_file_it_was_writing(
    local_store_url: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A put that landed but answered with an error: the task's discard deletes the file."""
    store = open_store(local_store_url)
    store.create_topic("t", 1)
    sink = task_sink(store, local_store_url)
    real_put_new = store.storage.put_new

    def put_new(rel: str, data: Any, **kwargs: Any) -> None:
        real_put_new(rel, data, **kwargs)
        raise OSError("connection reset after the upload")

    monkeypatch.setattr(store.storage, "put_new", put_new)
    sink.add(batch())
    with pytest.raises(OSError, match="connection reset"):
        sink.finish()
    assert len(segment_files(store, "t")[0]) == 1
    sink.discard()
    assert segment_files(store, "t") == (set(), set())


def test_a_segment_is_written_under_the_name_chosen_for_it(local_store_url: Any) -> None:
    store = open_store(local_store_url)
    store.create_topic("t", 1)
    part = store.partition("t", 0)
    name = new_segment_name("arrow")
    assert part.write_segment(records([b"v"]), durable=False, name=name).path == name
    assert store.storage.exists(f"{part.directory}/{name}")
    with pytest.raises(ValueError, match=r"segment name '../x.arrow' is not a new arrow segment"):
        encode_segment(records([b"v"]), name="../x.arrow")
    with pytest.raises(ValueError, match="is not a new parquet segment's name"):
        encode_segment(records([b"v"]), fmt="parquet", name=name)


def test_a_task_cancelled_by_a_streaming_abort_that_writes_late_is_cleaned_up_by_the_replay(
    local_store_url: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark does not wait for the tasks it cancels: one may record and write its file while the
    driver's abort cleans up. The abort keeps the micro-batch's intents, so the replay's
    commit deletes that file (an abort that deleted them left it to the orphan scan)."""
    from kstore.spark_ext.writer import KStoreStreamWriter

    store = open_store(local_store_url)
    store.create_topic("t", 1)
    options = source_options(local_store_url, topic="t")
    options["txnAppId"] = "query-1"
    writer = KStoreStreamWriter(
        parse_write_options(options, streaming=True), {"key": "key", "value": "value"}
    )
    real_recorded = pending.recorded

    def late_task(*args: Any, **kwargs: Any) -> list[Any]:
        found = real_recorded(*args, **kwargs)
        # Between the abort's reading of the intents and its end, the cancelled task records
        # and writes its file.
        sink = task_sink(store, local_store_url)
        sink.add(batch())
        sink.finish()
        return found

    monkeypatch.setattr(pending, "recorded", late_task)
    writer.abort([], 7)
    monkeypatch.undo()
    present, live = segment_files(store, "t")
    assert len(present) == 1
    assert live == set()
    # The replay of micro-batch 7 commits nothing of that attempt and deletes its file.
    writer.commit([], 7)
    assert segment_files(store, "t") == (set(), set())
    assert pending.recorded(store, JOB) == []
