"""The read and write paths of layout 3 at their cost per flush: the consumer's fetch buffer
(polls capped by max_poll_records hand out what one fetch read), the decoding of a dense range
straight from its IPC stream, and a delivery's data object uploaded while the previous
delivery's commit lands."""

from __future__ import annotations

import itertools
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

import kstore
from kstore import segments
from kstore.consumer import Consumer
from kstore.consumer.fetcher import Fetcher
from kstore.consumer.pacing import Pacer
from kstore.errors import CorruptRecordError
from kstore.layout import topic_data_dir
from kstore.log import encode_commit
from kstore.producer import Producer
from kstore.records import TopicPartition
from kstore.segments import (
    BINARY,
    COMPRESSIONS,
    TIMESTAMP_TYPE,
    Layout,
    _decode_dense_arrow,
    conform,
    decode_segment,
    encode_data_object,
    encode_segment,
)

BACKENDS = ["memory", "local", "seaweed"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest) -> Iterator[kstore.Store]:
    url, options = request.getfixturevalue(f"{request.param}_store")
    return kstore.Store(url, options)


def _fill(store: kstore.Store, topic: str, partitions: int, per_partition: int) -> None:
    store.create_topic(topic, partitions=partitions)
    with Producer(store, linger_ms=5) as producer:
        for i in range(per_partition):
            for p in range(partitions):
                producer.send(topic, value=b"%d-%d" % (p, i), partition=p)


class _Reads:
    """Counts the reads a storage is asked for (every kind a fetch can make; a read that
    makes others counts once)."""

    def __init__(self, storage: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        self._depth = threading.local()
        for name in ("read", "read_if_exists", "read_many", "read_ranges"):
            original = getattr(storage, name)

            def counted(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                depth = getattr(self._depth, "value", 0)
                if depth == 0:
                    self.count += 1
                self._depth.value = depth + 1
                try:
                    return _original(*args, **kwargs)
                finally:
                    self._depth.value = depth

            monkeypatch.setattr(storage, name, counted)


def test_polls_capped_by_max_poll_records_drain_one_fetch(
    store: kstore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(store, "t", 8, 250)  # 2,000 records
    consumer = Consumer(
        "t", store=store, auto_offset_reset="earliest", max_poll_records=300, fetch_max_wait_ms=5
    )
    try:
        first = consumer.poll(timeout_ms=2_000)
        assert sum(len(v) for v in first.values()) == 300
        reads = _Reads(store.storage, monkeypatch)
        got = {tp: [r.offset for r in records] for tp, records in first.items()}
        for _ in range(5):  # 300 at a time: what the first fetch read, without the storage
            batch = consumer.poll(timeout_ms=0)
            assert sum(len(v) for v in batch.values()) == 300
            for tp, records in batch.items():
                got.setdefault(tp, []).extend(r.offset for r in records)
        assert reads.count == 0
        rest = consumer.poll(timeout_ms=0)
        assert sum(len(v) for v in rest.values()) == 200
        assert reads.count == 0
        for tp, records in rest.items():
            got.setdefault(tp, []).extend(r.offset for r in records)
        # Every record once, each partition in order from 0.
        assert {tp.partition: offsets for tp, offsets in got.items()} == {
            p: list(range(250)) for p in range(8)
        }
        assert consumer.poll(timeout_ms=0) == {}
        assert reads.count > 0  # an empty buffer fetches again
    finally:
        consumer.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fetch_larger_than_the_segment_cache_decodes_each_segment_once(
    backend: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer whose fetch may take more than the segment cache holds fetches ahead no
    more than half the cache (across partitions, and within one): what it decoded ahead is
    still there when the read reaches it, so every segment is read and decoded once, and
    every record comes back once, in order."""
    import kstore.partition as partition_module

    url, options = request.getfixturevalue(f"{backend}_store")
    cache_bytes = 64 << 10
    store = kstore.Store(url, options, segment_cache_bytes=cache_bytes)
    partitions, rows = 4, 8
    store.create_topic("t", partitions=partitions)
    producer = Producer(store, acks=1)
    sent = 0

    def deliver(count: int) -> None:
        nonlocal sent
        for _ in range(count):  # one data object a delivery: a range per partition
            n = rows * partitions
            keys = [b"k%d" % (sent + i) for i in range(n)]
            values = [b"%06d" % (sent + i) + b"x" * 2000 for i in range(n)]
            producer.send_batch("t", pa.table({"key": keys, "value": values})).get()
            sent += n

    consumer = Consumer(
        "t",
        store=store,
        auto_offset_reset="earliest",
        max_poll_records=100_000,
        fetch_max_bytes=1 << 30,
        max_partition_fetch_bytes=1 << 30,
        fetch_max_wait_ms=5,
    )
    got: dict[int, list[int]] = {}

    def poll_all() -> None:
        while sum(len(v) for v in got.values()) < sent:
            polled = consumer.poll(timeout_ms=2_000)
            assert polled, "the consumer stopped short of the records written"
            for tp, records in polled.items():
                got.setdefault(tp.partition, []).extend(r.offset for r in records)

    try:
        deliver(1)
        poll_all()  # every partition has a position: the next fetch plans them all at once
        before = sum(len(store.partition("t", p).state().segments) for p in range(partitions))
        deliver(12)
        states = [store.partition("t", p).state() for p in range(partitions)]
        segments = sum(len(state.segments) for state in states) - before
        assert segments == 12 * partitions
        assert sum(s.size_bytes for state in states for s in state.segments) > 4 * cache_bytes
        decoded: list[str] = []
        real_decode = partition_module.decode_segment

        def counted(data: Any, **kwargs: Any) -> pa.Table:
            decoded.append(kwargs["where"])
            return real_decode(data, **kwargs)

        monkeypatch.setattr(partition_module, "decode_segment", counted)
        poll_all()
    finally:
        consumer.close()
        producer.close()
    assert got == {p: list(range(len(got[p]))) for p in range(partitions)}
    assert len(decoded) == segments
    assert len(set(decoded)) == segments  # each range of each data object, once


def test_a_seek_drops_what_the_buffer_held_and_a_pause_keeps_it(store: kstore.Store) -> None:
    _fill(store, "t", 2, 100)
    tp0, tp1 = TopicPartition("t", 0), TopicPartition("t", 1)
    consumer = Consumer(store=store, auto_offset_reset="earliest", max_poll_records=10)
    try:
        consumer.assign([tp0, tp1])
        first = consumer.poll(timeout_ms=2_000)
        assert sum(len(v) for v in first.values()) == 10
        consumer.seek(tp0, 70)
        consumer.pause(tp1)
        after = consumer.poll(timeout_ms=1_000)
        assert set(after) == {tp0}
        assert [r.offset for r in after[tp0]] == list(range(70, 80))
        position1 = consumer.position(tp1)
        consumer.resume(tp1)
        seen1: list[int] = []
        while len(seen1) < 100 - position1:
            batch = consumer.poll(timeout_ms=1_000)
            assert batch, "records of the resumed partition never came"
            seen1.extend(r.offset for r in batch.get(tp1, []))
        assert seen1 == list(range(position1, 100))
    finally:
        consumer.close()


def test_a_position_moves_only_with_what_a_poll_returns(store: kstore.Store) -> None:
    _fill(store, "t", 4, 50)
    consumer = Consumer(
        "t", store=store, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False
    )
    try:
        got = consumer.poll(timeout_ms=2_000, max_records=5)
        assert sum(len(v) for v in got.values()) == 5
        (tp,) = got  # one partition served; the fetch read all four
        consumer.commit()
        committed = {p: consumer.committed(TopicPartition("t", p)) for p in range(4)}
        assert committed[tp.partition] == 5
        assert [p for p, offset in committed.items() if offset is not None] == [tp.partition]
        again = consumer.poll(timeout_ms=0, max_records=1_000, update_offsets=False)
        assert sum(len(v) for v in again.values()) == 195
        # Positions stayed, so the next poll returns the same records again.
        same = consumer.poll(timeout_ms=1_000, max_records=1_000)
        assert {t: [r.offset for r in v] for t, v in same.items()} == {
            t: [r.offset for r in v] for t, v in again.items()
        }
    finally:
        consumer.close()


def test_a_fetch_skips_caught_up_partitions_until_a_commit_touches_them_or_a_seek(
    store: kstore.Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A partition a fetch found caught up is not looked at again (its position, its state's
    ends) while its topic log holds the same state of it and its position has not moved: a
    poll of many partitions costs what the partitions a commit touched cost."""
    _fill(store, "t", 32, 2)
    tps = [TopicPartition("t", p) for p in range(32)]
    looked: list[TopicPartition] = []
    original = Fetcher.position_for

    def position_for(self: Fetcher, tp: TopicPartition, state: Any) -> int:
        looked.append(tp)
        return original(self, tp, state)

    monkeypatch.setattr(Fetcher, "position_for", position_for)
    # The topic's metadata is looked at again after METADATA_RECHECK_S, and then every
    # partition is planned: on a machine slow enough for this test to pass a second between
    # two polls, that would be seen as a look at a caught-up partition.
    import kstore.consumer.fetcher as fetcher_module

    monkeypatch.setattr(fetcher_module, "METADATA_RECHECK_S", 3600.0)
    consumer = Consumer(store=store, auto_offset_reset="earliest")
    try:
        consumer.assign(tps)
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 64 and time.monotonic() < deadline:
            seen += sum(len(v) for v in consumer.poll(timeout_ms=200).values())
        assert seen == 64
        assert consumer.poll(timeout_ms=0) == {}  # a fetch finds every partition caught up
        looked.clear()
        for _ in range(5):
            assert consumer.poll(timeout_ms=20) == {}
        assert looked == []
        with Producer(store) as producer:
            producer.send("t", value=b"new", partition=5)
        got: dict[TopicPartition, Any] = {}
        while not got and time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=200)
        assert {tp: [r.value for r in v] for tp, v in got.items()} == {tps[5]: [b"new"]}
        assert set(looked) == {tps[5]}
        # A seek moves a caught-up partition's position: it is read again from there.
        consumer.seek(tps[7], 0)
        again: dict[TopicPartition, Any] = {}
        while not again and time.monotonic() < deadline:
            again = consumer.poll(timeout_ms=200)
        assert {tp: [r.offset for r in v] for tp, v in again.items()} == {tps[7]: [0, 1]}
    finally:
        consumer.close()


def _records(n: int) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([b"k%d" % i for i in range(n)], pa.binary()),
            "value": pa.array([b"v%d" % i if i % 5 else None for i in range(n)], pa.binary()),
            "timestamp": pa.array([1_700_000_000_000_000 + i for i in range(n)], TIMESTAMP_TYPE),
            "headers": pa.array(
                [[{"key": "h", "value": b"x"}] if i % 3 == 0 else None for i in range(n)],
                BINARY.record_schema.field("headers").type,
            ),
        }
    )


@pytest.mark.parametrize("compression", sorted(COMPRESSIONS))
def test_a_dense_range_decodes_from_its_stream_as_the_general_path_does(compression: str) -> None:
    buf, _, described = encode_segment(_records(7), compression=compression)
    data = buf.to_pybytes()
    fast = _decode_dense_arrow(data, BINARY, 40, 7)
    assert fast is not None  # the fast path took it
    general = decode_segment(
        data,
        where="t",
        expected_checksum=described.checksum,
        fmt="arrow",
        sparse=False,
        base_offset=40,
        record_count=7,
        columns=["key", "value", "timestamp", "headers", "offset"],  # forces the general path
    )
    assert fast.equals(general)
    assert fast.column("offset").to_pylist() == list(range(40, 47))


def test_the_fast_decode_reads_a_range_of_several_batches_whole() -> None:
    """A range this project writes holds one batch; a file of several (a writer that kept a
    table's chunks) is read message by message, every batch, in order."""
    table = pa.concat_tables([_records(2), _records(3)])
    assert table.column("key").num_chunks == 2
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, BINARY.record_schema) as writer:
        writer.write_table(table)
    data = sink.getvalue().to_pybytes()
    assert len(pa.ipc.open_file(pa.py_buffer(data)).read_all().to_batches()) == 2
    fast = _decode_dense_arrow(data, BINARY, 10, 5)
    assert fast is not None
    assert fast.column("key").to_pylist() == table.column("key").to_pylist()
    assert fast.column("offset").to_pylist() == list(range(10, 15))
    assert _decode_dense_arrow(data, BINARY, 10, 4) is None  # the count covers every batch


def test_the_fast_decode_leaves_anything_unusual_to_the_general_path() -> None:
    buf, _, described = encode_segment(_records(3))
    data = buf.to_pybytes()
    assert _decode_dense_arrow(data, BINARY, 0, 4) is None  # a record count it does not hold
    other = pa.schema([pa.field("value", pa.binary())])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, other) as writer:
        writer.write_table(pa.table({"value": pa.array([b"x"], pa.binary())}, schema=other))
    foreign = sink.getvalue().to_pybytes()
    assert _decode_dense_arrow(foreign, BINARY, 0, 1) is None
    with pytest.raises(CorruptRecordError, match="unexpected segment schema"):
        decode_segment(
            foreign,
            where="t-0",
            expected_checksum=None,
            fmt="arrow",
            sparse=False,
            base_offset=0,
            record_count=1,
        )
    with pytest.raises(CorruptRecordError, match="holds 3 records, the manifest says 4"):
        decode_segment(
            data,
            where="t-0",
            expected_checksum=described.checksum,
            fmt="arrow",
            sparse=False,
            base_offset=0,
            record_count=4,
        )


def test_a_delivery_uploads_its_data_while_the_previous_commit_lands(
    moto_store: tuple[str, dict[str, Any]],
) -> None:
    """On an object store, a delivery the sender takes while the previous one's commit lands
    (here a full batch, batch_size 1: a sender that has fallen behind; a few records sent
    meanwhile wait for that write instead and go out together, test_producer) uploads its data
    meanwhile: only commits keep their order. On a local disk the sender finishes a small
    delivery before starting the next (test_producer)."""
    url, options = moto_store
    store = kstore.Store(url, options)
    meta = store.create_topic("t", partitions=4)
    incarnation = topic_data_dir("t", meta.topic_id)
    storage = store.storage
    events: list[str] = []
    lock = threading.Lock()
    commit_started = threading.Event()
    original_put_new, original_put_if_absent = storage.put_new, storage.put_if_absent

    def put_new(rel: str, data: Any, **kwargs: Any) -> None:
        if rel.startswith(f"{incarnation}/_data/"):
            with lock:
                events.append("data")
        original_put_new(rel, data, **kwargs)

    def put_if_absent(rel: str, data: Any, **kwargs: Any) -> None:
        commit = rel.startswith(f"{incarnation}/_log/") and ".checkpoint." not in rel
        if commit:
            with lock:
                events.append("commit-start")
            commit_started.set()
            time.sleep(0.3)  # a slow commit: the next delivery must not wait to upload
        original_put_if_absent(rel, data, **kwargs)
        if commit:
            with lock:
                events.append("commit-end")

    storage.put_new = put_new  # type: ignore[method-assign]
    storage.put_if_absent = put_if_absent  # type: ignore[method-assign]
    with Producer(store, linger_ms=0, batch_size=1) as producer:
        first = producer.send("t", value=b"a", partition=0)
        assert commit_started.wait(5)
        second = producer.send("t", value=b"b", partition=1)
        first.get(timeout=10)
        second.get(timeout=10)
    # The second data object was written before the first commit ended.
    assert events[:4] == ["data", "commit-start", "data", "commit-end"], events
    assert events.count("data") == 2


def test_a_tailing_reader_on_an_object_store_looks_about_once_per_flush(
    moto_store: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer that flushes every 200 ms, and a consumer whose polls may wait 500 ms between
    looks: having learnt the gap between flushes, the consumer asks for the next version
    shortly before it is due, where a backoff from half a millisecond asked about ten times."""
    url, options = moto_store
    kstore.Store(url, options).create_topic("t", partitions=4)
    writer, reader = kstore.Store(url, options), kstore.Store(url, options)
    consumer = Consumer(
        "t", store=reader, auto_offset_reset="latest", fetch_max_wait_ms=500, max_poll_records=10
    )
    consumer.poll(timeout_ms=0)
    stop = threading.Event()

    def produce() -> None:
        with Producer(writer, linger_ms=0) as producer:
            i = 0
            while not stop.is_set():
                producer.send("t", value=b"%d" % i, partition=i % 4)
                producer.flush()
                i += 1
                time.sleep(0.2)

    thread = threading.Thread(target=produce)
    thread.start()
    try:
        received = 0
        while received < 5:  # the reader learns the gap
            received += sum(len(v) for v in consumer.poll(timeout_ms=1_000).values())
        reads = _Reads(reader.storage, monkeypatch)
        received = 0
        started = time.monotonic()
        while received < 15:
            received += sum(len(v) for v in consumer.poll(timeout_ms=1_000).values())
        flushes = (time.monotonic() - started) / 0.2
    finally:
        stop.set()
        thread.join()
        consumer.close()
    # Per flush: the next version, the look that finds none after it, the range; a few more
    # when a flush comes late.
    assert reads.count / received < 5, (reads.count, received, flushes)


class _Clock:
    """kstore.log's ``time`` with a monotonic clock the test moves (the rest is the real one)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


class _SleepClock(_Clock):
    """A clock whose sleeps move it, and that records them (the consumer's ``time``)."""

    def __init__(self) -> None:
        super().__init__()
        self.sleeps: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


class _TailedLog:
    """A log on moto tailed by a reader whose monotonic clock the test moves: the test's
    commits to it, and how many versions each of the reader's requests asked for."""

    def __init__(
        self,
        moto_store: tuple[str, dict[str, Any]],
        monkeypatch: pytest.MonkeyPatch,
        directory: str,
    ) -> None:
        import kstore.log as log_module
        from kstore.log import Log, LogState

        self.storage = kstore.Store(*moto_store).storage
        self.clock = _Clock()
        monkeypatch.setattr(log_module, "time", self.clock)
        monkeypatch.setattr(log_module, "clock", self.clock)  # states' confirmation times
        self.directory = directory
        self.reader: Log[LogState] = Log(self.storage, directory, LogState)
        self.rounds: list[int] = []
        self.newest = -1
        original = self.storage.read_many

        def counted(rels: list[str]) -> dict[str, bytes]:
            self.rounds.append(len(rels))
            return original(rels)

        monkeypatch.setattr(self.storage, "read_many", counted)

    def step(self, state: Any, commits: int, seconds: float) -> Any:
        """``commits`` land, the reader's clock moves ``seconds``, and it looks (tailing)."""
        self.commit(commits)
        self.clock.now += seconds
        return self.reader.update(state, tail=True)

    def commit(self, count: int) -> None:
        for _ in range(count):
            self.newest += 1
            self.storage.put_if_absent(
                f"{self.directory}/{self.newest:020d}.json",
                encode_commit(
                    [{"test": {"n": self.newest}}], {"timestamp": 1, "operation": "TEST"}
                ),
            )


def test_a_look_that_finds_nothing_looks_again_after_a_share_of_the_arrival_gap(
    moto_store: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On an object store every look is a GET: a reader whose records come every 200 ms and
    whose look found nothing looks again after 10 ms, then 20, 40 (5% of the gap, doubling),
    where backing off from half a millisecond sent six GETs in the first 32 ms of a late flush.
    On the local disk a look costs microseconds, and it still starts at half a millisecond."""
    for url, options, first in ((*moto_store, 0.01), (None, None, 0.0005)):
        store = kstore.Store(url, options) if url else kstore.Store(tempfile.mkdtemp())
        pacer, clock = _learnt_pacer(store, monkeypatch, max_wait_ms=500)
        clock.now += 2.0  # the next records were due long ago, none found lately: no wait
        looks = 0

        def fetch() -> dict[Any, Any]:
            nonlocal looks
            looks += 1
            return {}

        assert pacer.run(100, fetch, _no_duties, _nothing_buffered) == {}
        assert clock.sleeps[:3] == [first, 2 * first, 4 * first], clock.sleeps
        assert looks >= 3


def test_a_tailing_reader_fetches_the_versions_due_and_the_next_in_one_round(
    moto_store: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader that has seen a version every 50 ms and looks 150 ms later asks for the three
    versions due and the one after them at once: one round trip that finds what is new and
    confirms it is the newest. Asked one by one, that was four round trips (three finds, one
    miss), a round trip of latency per version."""
    from kstore.log import Log, LogState

    tailed = _TailedLog(moto_store, monkeypatch, "tail-test/_log")
    storage, clock, reader, rounds, commit = (
        tailed.storage,
        tailed.clock,
        tailed.reader,
        tailed.rounds,
        tailed.commit,
    )

    state = reader.update(LogState(), tail=True)
    for _ in range(4):  # the reader learns a version every 50 ms
        commit(1)
        clock.now += 0.05
        state = reader.update(state, tail=True)
    assert state.version == tailed.newest
    commit(3)  # three land while the reader is away
    clock.now += 0.15
    rounds.clear()
    state = reader.update(state, tail=True)
    assert state.version == tailed.newest
    assert rounds == [4], rounds  # the three due and the next, in one round trip
    # Keeping up, one version due at each look: it is returned at once, one GET a version (a
    # look about when the version was due does not ask past it: that GET would find nothing).
    rounds.clear()
    for _ in range(3):
        state = tailed.step(state, 1, 0.05)
        assert state.version == tailed.newest
    assert rounds == [1, 1, 1], rounds
    # Far behind without knowing it (40 land at once): the look takes the version due; the
    # poll after it, at once, finds the next one well before one was due, so the one after
    # asks past it, finds everything it asks for and widens until it finds the end.
    commit(40)
    clock.now += 0.05
    rounds.clear()
    state = reader.update(state, tail=True)
    assert state.version == tailed.newest - 39
    for _ in range(2):
        clock.now += 0.001
        state = reader.update(state, tail=True)
    assert state.version == tailed.newest
    assert len(rounds) <= 8, rounds
    assert sum(rounds) < 40 + 32, rounds
    # A look that finds nothing; the next, moments later, asks for the next version alone
    # and returns it without a second round trip: one GET each.
    clock.now += 0.04
    rounds.clear()
    assert reader.update(state, tail=True) is state
    commit(1)
    clock.now += 0.005
    state = reader.update(state, tail=True)
    assert state.version == tailed.newest
    assert rounds == [1, 1], rounds
    # An early look that finds what it asks for: the next look asks past it (here one found,
    # one missed).
    commit(2)
    clock.now += 0.005
    rounds.clear()
    state = reader.update(state, tail=True)
    assert state.version == tailed.newest - 1
    clock.now += 0.005
    state = reader.update(state, tail=True)
    assert state.version == tailed.newest
    assert rounds == [1, 2], rounds
    # An idle topic: every look is one GET, however long it has been quiet.
    rounds.clear()
    for _ in range(5):
        clock.now += 0.5
        assert reader.update(state, tail=True) is state
    assert rounds == [1] * 5, rounds
    # A reader that is not tailing (a writer about to commit) starts with one version.
    commit(1)
    rounds.clear()
    assert Log(storage, tailed.directory, LogState).update(state).version == tailed.newest
    assert rounds == [1, 1], rounds


def _held_checkpoints(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Topic-log checkpoints that wait for ``release`` once ``started`` is set."""
    from kstore.topic_log import TopicLogFiles

    release, started = threading.Event(), threading.Event()
    real = TopicLogFiles.write_checkpoint

    def slow_checkpoint(self: Any, state: Any) -> None:
        started.set()
        assert release.wait(30)
        real(self, state)

    monkeypatch.setattr(TopicLogFiles, "write_checkpoint", slow_checkpoint)
    return started, release


def test_an_acknowledgement_does_not_wait_for_the_checkpoint_its_commit_made_due(
    memory_store: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint a producer's commit makes due is written in the background: the send is
    acknowledged while it is still being written, and flush() waits for it. Of the ones that
    fall due meanwhile, the newest is written after it (13.1)."""
    url, options = memory_store
    store = kstore.Store(url, options)
    store.create_topic("t", partitions=2, config={"checkpoint.interval": "5"})
    started, release = _held_checkpoints(monkeypatch)
    log_dir = f"{topic_data_dir('t', store.topic('t').topic_id)}/_log"

    def checkpoints() -> set[int]:
        names = (i.name for i in store.storage.list_dir(log_dir))
        return {int(n.split(".")[0]) for n in names if n.endswith(".checkpoint.json")}

    with Producer(store, linger_ms=0) as producer:
        for i in range(6):  # versions 0..5: one commit each
            producer.send("t", value=b"%d" % i, partition=i % 2).get(timeout=10)
        assert started.wait(10)  # the checkpoint of version 5 is being written...
        for i in range(10):  # ...and these land, versions 6..15 (10 and 15 fall due)
            producer.send("t", value=b"after %d" % i, partition=0).get(timeout=10)
        assert checkpoints() == set()
        release.set()
        producer.flush()
        assert checkpoints() == {5, 15}  # 15 took the place of 10, which waited behind 5


def test_a_forked_child_does_not_wait_for_its_parents_background_checkpoints(
    memory_store: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child forked while its parent writes a checkpoint in the background has no such thread:
    waiting for checkpoints there must not hang on the parent's."""
    import os

    from kstore.log import wait_for_checkpoints

    url, options = memory_store
    store = kstore.Store(url, options)
    store.create_topic("t", partitions=1, config={"checkpoint.interval": "2"})
    started, release = _held_checkpoints(monkeypatch)
    with Producer(store, linger_ms=0) as producer:
        for i in range(3):
            producer.send("t", value=b"%d" % i).get(timeout=10)
        assert started.wait(10)
        assert not wait_for_checkpoints(0.1)  # the parent's is still being written
        pid = os.fork()
        if pid == 0:  # the child
            os._exit(0 if wait_for_checkpoints(5) else 1)
        _, status = os.waitpid(pid, 0)
        release.set()
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_tailing_reader_whose_looks_are_slower_than_the_versions_learns_it_and_keeps_up(
    moto_store: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two versions land between every two looks, at the pace the reader looks: a look that
    asks for the version due alone finds it, as if it were keeping up. Within a few finds a
    look asks past it, finds it behind, and from then on its looks ask past the version due
    (and widen): it stays at most a few versions behind instead of falling further behind at
    every look."""
    from kstore.log import LogState

    tailed = _TailedLog(moto_store, monkeypatch, "slow-look-test/_log")
    clock, reader, rounds, commit = tailed.clock, tailed.reader, tailed.rounds, tailed.commit

    state = reader.update(LogState(), tail=True)
    for _ in range(6):  # one version a look: the reader learns a gap of 50 ms
        commit(1)
        clock.now += 0.05
        state = reader.update(state, tail=True)
    assert state.version == tailed.newest
    lags = []
    for _ in range(16):  # now two a look
        commit(2)
        clock.now += 0.05
        state = reader.update(state, tail=True)
        lags.append(tailed.newest - state.version)
    assert max(lags) <= 4, lags
    assert lags[-4:] == [0, 0, 0, 0], lags
    assert any(n >= 2 for n in rounds), rounds


def _no_duties() -> None:
    pass


def _nothing_buffered() -> bool:
    return False


def _learnt_pacer(
    store: kstore.Store, monkeypatch: pytest.MonkeyPatch, *, max_wait_ms: int
) -> tuple[Pacer, _SleepClock]:
    """The pacer of a consumer of ``store`` whose ``time`` is a _SleepClock, having found
    records twice, 200 ms apart: it expects the next 160 ms from now."""
    import kstore.consumer.pacing as pacing_module

    clock = _SleepClock()
    monkeypatch.setattr(pacing_module, "time", clock)
    pacer = Pacer(remote=store.storage.is_remote, max_wait_ms=max_wait_ms)
    pacer.note_arrival()
    clock.now += 0.2
    pacer.note_arrival()
    return pacer, clock


def test_a_reader_that_knows_its_writers_rhythms_looks_when_the_next_commit_is_due(
    moto_store: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a writer's next commit due in 40 ms, a poll waits that long before its first look
    (not 80% of the average gap), and after a look that finds nothing while a commit is due
    later (another writer's) it waits for that one, not a backoff step; once a commit is late,
    the backoff from 5% of the gap resumes."""

    class TailedLog:
        def __init__(self, dues: list[float | None]) -> None:
            self.dues = dues

        def next_due(self) -> float | None:
            return self.dues.pop(0) if self.dues else -0.001

    # 160 ms: what the average gap alone would say.
    pacer, clock = _learnt_pacer(kstore.Store(*moto_store), monkeypatch, max_wait_ms=500)
    # Due in 40 ms; after that look missed, another writer's in 30 ms; then late.
    pacer.tailing([TailedLog([0.04, 0.03])])
    looks = 0

    def fetch() -> dict[Any, Any]:
        nonlocal looks
        looks += 1
        return {}

    assert pacer.run(100, fetch, _no_duties, _nothing_buffered) == {}
    assert clock.sleeps[:4] == [0.04, 0.03, 0.01, 0.02], clock.sleeps
    assert looks >= 3


def test_writers_in_rhythm_whose_commits_fall_due_together_are_asked_for_without_the_next(
    moto_store: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two producers flushing in step: the rhythms say two commits are due, and the look asks
    for those two alone. Asking for the one after as well cost a GET that found nothing at
    every look (half a GET per version). Every few finds a look still asks past them."""
    from kstore.log import LogState

    tailed = _TailedLog(moto_store, monkeypatch, "rhythm-test/_log")
    reader, rounds = tailed.reader, tailed.rounds

    class InStep:
        """Two writers in rhythm, both due at every look."""

        def due_count(self, now: float) -> int:
            return 2

        def note(self, *args: Any, **kwargs: Any) -> None: ...

        def forget_overdue(self, now: float) -> None: ...

    state = reader.update(LogState(), tail=True)
    for _ in range(4):  # the reader learns the gap between versions
        state = tailed.step(state, 1, 0.05)
    monkeypatch.setattr(reader, "rhythms", InStep())
    rounds.clear()
    for _ in range(6):
        state = tailed.step(state, 2, 0.1)
        assert state.version == tailed.newest
    assert rounds == [2] * 6, rounds
    # After enough finds without a look past them, one asks past them and confirms.
    for _ in range(16):
        state = tailed.step(state, 2, 0.1)
        assert state.version == tailed.newest
    assert 3 in rounds, rounds


def test_short_polls_over_a_quiet_topic_back_off_as_one_long_poll_does(
    moto_store: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop of 20 ms polls over a topic where nothing comes: the backoff after a look that
    found nothing carries from one poll to the next, up to ``fetch_max_wait_ms``, so a second
    of such polls makes about a dozen looks (GETs on an object store). Each poll starting its
    backoff again from 5% of the gap made two or three looks per poll, over a hundred. Records
    that arrive, or a seek, bring the next look back at once."""
    pacer, clock = _learnt_pacer(kstore.Store(*moto_store), monkeypatch, max_wait_ms=100)
    clock.now += 0.2  # the next records were due
    looks: list[float] = []
    found = False

    def fetch() -> dict[Any, Any]:
        looks.append(clock.now)
        return {"records": 1} if found else {}

    def poll(timeout_ms: float) -> dict[Any, Any]:
        return pacer.run(timeout_ms, fetch, _no_duties, _nothing_buffered)

    start = clock.now
    while clock.now - start < 1.0:
        assert poll(20) == {}
    assert 8 <= len(looks) <= 15, len(looks)
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(looks)]
    assert gaps[-3:] == [0.1, 0.1, 0.1], gaps  # backed off to fetch_max_wait_ms
    # A seek (what a fetch reads changed): the next poll looks at once.
    pacer.look_soon()
    before = len(looks)
    poll(0)
    assert len(looks) == before + 1
    # Records found: the next miss backs off from the start again.
    found = True
    assert poll(20)
    pacer.note_arrival()
    found = False
    looks.clear()
    clock.now += 0.3  # the next records are due (at 80% of the gap, now 360 ms)
    poll(20)
    assert len(looks) >= 2, looks


def _writer_file(table: pa.Table, schema: pa.Schema) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.RecordBatchFileWriter(sink, schema) as writer:
        writer.write_table(table, max_chunksize=table.num_rows)
    return sink.getvalue().to_pybytes()


def test_a_data_object_frames_its_ranges_as_the_ipc_writer_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A data object's ranges are framed by hand once the IPC writer's framing is learned for
    a schema (segments._IpcFileFrame): every range is the writer's file byte for byte, for
    binary and typed records, headers, large values and several chunks; a framing the frame
    cannot reproduce leaves the writer writing; a compressed range is the writer's, and a small
    one is written uncompressed."""
    monkeypatch.setattr(segments, "_IPC_FRAMES", {})
    typed = Layout(
        key=pa.string(),
        value=pa.struct([pa.field("n", pa.int64()), pa.field("tags", pa.list_(pa.string()))]),
        schema_id=3,
    )

    def records(layout: Layout, n: int, size: int, headers: bool = False) -> pa.Table:
        binary = layout.schema_id == 0
        table = pa.table(
            {
                "key": [f"k{i}".encode() if binary else f"k{i}" for i in range(n)],
                "value": [
                    b"v" * size if binary else {"n": i, "tags": ["a"] * (i % 3)} for i in range(n)
                ],
                "headers": [
                    [{"key": "h", "value": b"x" * i}] if headers else None for i in range(n)
                ],
            }
        )
        return conform(table, layout.record_schema)

    split = pa.concat_tables([records(BINARY, 2, 10), records(BINARY, 3, 20)])
    assert split.column("key").num_chunks == 2
    for layout in (BINARY, typed):
        tables = [
            records(layout, 1, 5),
            records(layout, 7, 100, headers=True),
            records(layout, 300, 1000),
            records(layout, 4, 0),
        ]
        if layout is BINARY:
            tables.append(split)
        for _ in range(2):  # the first files learn and check the framing; the rest use it
            data, files = encode_data_object(
                [(p, t, layout) for p, t in enumerate(tables)], "_data/x.kdat"
            )
            for p, table in enumerate(tables):
                start, length = files[p].byte_range or (0, 0)
                expected = _writer_file(table.combine_chunks(), layout.record_schema)
                assert bytes(memoryview(data)[start : start + length]) == expected
        frame = segments._IPC_FRAMES[id(layout.record_schema)]
        assert frame is not None
        assert frame.checked
    # Compressed: the writer's own file, also with a learned frame; a range under
    # COMPRESS_MIN_BYTES of buffers is written uncompressed (PROTOCOL.md 11.4).
    big, small = tables[2], tables[1]
    assert big.nbytes >= segments.COMPRESS_MIN_BYTES > small.nbytes
    data, files = encode_data_object([(0, big, typed)], "_data/x.kdat", compression="zstd")
    assert bytes(data) == _writer_file_compressed(big, typed.record_schema)
    assert bytes(data) != _writer_file(big, typed.record_schema)
    data, files = encode_data_object([(0, small, typed)], "_data/x.kdat", compression="zstd")
    assert bytes(data) == _writer_file(small, typed.record_schema)
    # A frame that does not reproduce the writer is dropped for good: the writer writes.
    monkeypatch.setattr(segments, "_IPC_FRAMES", {})
    monkeypatch.setattr(segments, "_END_OF_STREAM", b"\xff\xff\xff\xff\x00\x00\x00\x01")
    small = records(BINARY, 2, 3)
    for _ in range(3):
        data, _ = encode_data_object([(0, small, BINARY)], "_data/x.kdat")
        assert bytes(data) == _writer_file(small, BINARY.record_schema)
    assert segments._IPC_FRAMES[id(BINARY.record_schema)] is None


def test_a_data_object_writes_its_large_ranges_in_place_as_the_ipc_writer_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A range of more than FRAMED_MAX_ROWS records and FRAMED_MAX_BYTES is encoded by the
    IPC writer straight into the data object's buffer, alone or among framed ones (a few large
    records are framed): each range is still the writer's file byte for byte, its checksum is
    of those bytes, and the ranges tile the object exactly. Were the writer to write less than
    it counted, the object is refused, never padded with whatever the buffer held."""

    def binary(n: int, size: int) -> pa.Table:
        return conform(
            pa.table({"key": [b"k%d" % i for i in range(n)], "value": [b"v" * size] * n}),
            BINARY.record_schema,
        )

    typed = Layout(key=pa.string(), value=pa.struct([pa.field("n", pa.int64())]), schema_id=3)
    n = 20_000
    many_typed = conform(
        pa.table({"key": [f"k{i}" for i in range(n)], "value": [{"n": i} for i in range(n)]}),
        typed.record_schema,
    )
    few_typed = conform(
        pa.table({"key": ["a", "b"], "value": [{"n": 1}, {"n": 2}]}), typed.record_schema
    )
    small, big, few_large = binary(3, 10), binary(400, 1000), binary(50, 30_000)
    limit = segments.FRAMED_MAX_BYTES
    for table in (big, few_large, many_typed):
        assert segments._ipc_body_exceeds(table, limit)
    assert big.num_rows > segments.FRAMED_MAX_ROWS >= few_large.num_rows
    # Conformed, a few records share the producer's large null headers: their buffers pass
    # the limit, their IPC bytes do not.
    assert small.get_total_buffer_size() > limit
    assert not segments._ipc_body_exceeds(small, limit)
    cases = [
        [(0, big, BINARY)],
        [(0, small, BINARY), (1, big, BINARY), (2, small, BINARY), (3, few_large, BINARY)],
        [(5, many_typed, typed), (9, few_typed, typed)],
    ]
    for parts in cases:
        data, files = encode_data_object(parts, "_data/x.kdat")
        position = 0
        for partition, table, layout in parts:
            start, length = files[partition].byte_range or (0, 0)
            assert start == position
            piece = bytes(memoryview(data)[start : start + length])
            assert piece == _writer_file(table, layout.record_schema)
            assert files[partition].checksum == segments.checksum(piece)
            assert files[partition].size_bytes == length
            position += length
        assert position == len(data)

    real_write = segments._write_ipc_file

    def short_write(sink: pa.NativeFile, *args: Any) -> None:
        if isinstance(sink, pa.FixedSizeBufferWriter):
            sink.write(b"\0" * 8)  # far less than the file counted
            return
        real_write(sink, *args)

    monkeypatch.setattr(segments, "_write_ipc_file", short_write)
    with pytest.raises(AssertionError, match="wrote 8 bytes of"):
        encode_data_object([(0, small, BINARY), (1, big, BINARY)], "_data/x.kdat")


def _writer_file_compressed(table: pa.Table, schema: pa.Schema) -> bytes:
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.RecordBatchFileWriter(sink, schema, options=options) as writer:
        writer.write_table(table, max_chunksize=table.num_rows)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("carried", [True, False])
def test_a_prefetch_reads_carried_ranges_from_the_commits_it_holds_and_only_the_rest_at_once(
    moto_store: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch, carried: bool
) -> None:
    """A tailing reader's ranges are mostly in commits that carry their data (PROTOCOL.md
    11.8), which the log kept when it read them: read from memory, in the reader's thread, with
    no request and no thread started. Ranges of data objects are read at once, one thread per
    object. Either way every record arrives once, in order."""
    from kstore.storage import Storage

    url, options = moto_store
    store = kstore.Store(url, options)
    config = {} if carried else {"commit.inline.bytes": 0}
    store.create_topic("t", partitions=4, config=config)
    tps = [TopicPartition("t", p) for p in range(4)]
    producer = Producer(store, linger_ms=0)
    producer.send("t", value=b"first", partition=0).get(timeout=30)  # a topic log's first
    # commit writes a data object whatever the topic's configuration.
    # The reader's own Store, as in another process: it learns the commits by reading them.
    reader = kstore.Store(url, options, create=False)
    consumer = Consumer(store=reader, auto_offset_reset="earliest", fetch_max_wait_ms=0)
    reads: list[tuple[str, bool, int]] = []
    real = Storage.read_ranges

    def read_ranges(self: Storage, rel: str, ranges: Any, **kwargs: Any) -> list[bytes]:
        remembered = self.remembers(rel)
        with self.count_requests() as counts:
            out = real(self, rel, ranges, **kwargs)
        on_own_thread = threading.current_thread() is not threading.main_thread()
        reads.append((rel, on_own_thread, sum(counts.values()) if not remembered else -1))
        assert not (remembered and counts), counts
        return out

    try:
        consumer.assign(tps)
        first: list[bytes] = []
        deadline = time.monotonic() + 30
        while not first and time.monotonic() < deadline:
            first = [r.value for rs in consumer.poll(timeout_ms=200).values() for r in rs]
        assert first == [b"first"]
        with producer:
            for flush in range(3):  # three flushes, three commits touching every partition
                for p in range(4):
                    producer.send("t", value=b"%d-%d" % (flush, p), partition=p)
                producer.flush()
        monkeypatch.setattr(Storage, "read_ranges", read_ranges)
        got: dict[int, list[bytes]] = {p: [] for p in range(4)}
        while sum(map(len, got.values())) < 12 and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                got[tp.partition].extend(r.value for r in records)
    finally:
        consumer.close()
        producer.close()
    assert got == {p: [b"%d-%d" % (f, p) for f in range(3)] for p in range(4)}
    objects = {rel for rel, _, _ in reads}
    assert len(objects) == 3, reads  # the three flushes' commits or data objects
    if carried:
        assert all("/_log/" in rel and not threaded for rel, threaded, _ in reads), reads
        assert all(requests == -1 for _, _, requests in reads), reads  # from memory
    else:
        assert all("/_data/" in rel and threaded for rel, threaded, _ in reads), reads


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_a_small_segment_file_is_written_uncompressed_and_a_large_one_compressed(
    codec: str,
) -> None:
    """Layout 2's whole segment files follow the same rule as data object ranges (PROTOCOL.md
    11.4): compressed from COMPRESS_MIN_BYTES of buffers, uncompressed below; both decode."""

    def table(n: int) -> pa.Table:
        return conform(
            pa.table({"key": [b"k%d" % i for i in range(n)], "value": [b"v" * 200] * n}),
            BINARY.record_schema,
        )

    for n, compressed in ((2, False), (200, True)):
        records = table(n)
        assert (records.nbytes >= segments.COMPRESS_MIN_BYTES) is compressed
        data, _, described = encode_segment(records, compression=codec)
        plain, _, _ = encode_segment(records, compression="uncompressed")
        assert (bytes(data) != bytes(plain)) is compressed
        assert (len(data) < len(plain)) is compressed
        decoded = decode_segment(
            bytes(data),
            where="test",
            expected_checksum=described.checksum,
            fmt="arrow",
            sparse=False,
            base_offset=0,
            record_count=n,
        )
        assert decoded.column("value").to_pylist() == [b"v" * 200] * n
