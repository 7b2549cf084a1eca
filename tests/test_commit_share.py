"""Shared commits (PROTOCOL.md 30): writers of one topic log share its commits. Many producers
on every backend; what a committer takes, merges, refuses and leaves; takeover; vacuum of what
a crash left; the version raise."""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import Any

import pyarrow as pa
import pytest
from kstore.retention import vacuum

from kstore import Store
from kstore.commit_share import CommitShare, _Own, resolve
from kstore.consumer import Consumer
from kstore.errors import ProducerFencedError, UnsupportedFormatVersionError
from kstore.layout import topic_data_dir
from kstore.log import CARRIED
from kstore.manifest import ProducerBatch
from kstore.pending import Flush, Part, encode_pending, pending_dir, pending_name
from kstore.producer import Producer
from kstore.segments import BINARY, encode_data_object
from tests.conftest import StoreTarget


def _read_all(
    store: Store, topic: str, expected: int, timeout: float = 30
) -> dict[tuple[int, int], bytes]:
    consumer = Consumer(topic, store=store, auto_offset_reset="earliest")
    got: dict[tuple[int, int], bytes] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                for r in records:
                    assert (r.partition, r.offset) not in got, "a record read twice"
                    got[(r.partition, r.offset)] = r.value
    finally:
        consumer.close()
    return got


def test_many_producers_share_commits_and_lose_nothing(any_store: StoreTarget) -> None:
    """Four producers (each with its own Store, as separate processes would be) write one
    topic log at once: they share commits (pending flushes, taken by a holder), and every
    acknowledged record is read exactly once at its acknowledged offset, offsets dense, each
    producer's records in send order per partition."""
    Store(any_store.url, any_store.storage_options).create_topic("t", 8)
    # The topic log's first commit carries no data (11.8), so it is never shared: made here,
    # as a topic is made before a fleet writes it.
    with Producer(Store(any_store.url, any_store.storage_options)) as first:
        first.send("t", b"first", partition=7).get(timeout=30)
    writers, per_writer = 4, 120
    # Flushes must overlap: on an object store a flush takes a few requests' time.
    pause = 0.02 if any_store.name in ("moto", "seaweed") else 0.002
    acked: dict[tuple[int, int], bytes] = {}
    metrics: list[dict[str, float]] = []
    lock = threading.Lock()

    def write(w: int) -> None:
        producer = Producer(
            Store(any_store.url, any_store.storage_options),
            acks="all",
            linger_ms=5,
            client_id=f"w{w}",
        )
        futures = []
        for i in range(per_writer):
            value = b"%d-%04d" % (w, i)
            futures.append((value, producer.send("t", value, key=b"k%d" % (i % 16))))
            time.sleep(pause)
        for value, future in futures:
            md = future.get(timeout=120)
            with lock:
                acked[(md.partition, md.offset)] = value
        producer.flush()
        metrics.append(producer.metrics())
        producer.close()

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert len(acked) == writers * per_writer
    store = Store(any_store.url, any_store.storage_options)
    got = _read_all(store, "t", len(acked) + 1)
    offsets_of: dict[int, list[int]] = collections.defaultdict(list)
    for p, offset in sorted(got):
        offsets_of[p].append(offset)
    assert all(offsets == list(range(len(offsets))) for offsets in offsets_of.values())
    assert got.pop((7, 0)) == b"first"
    assert got == acked
    by_partition: dict[int, list[int]] = collections.defaultdict(list)
    order: dict[tuple[int, int], list[int]] = collections.defaultdict(list)
    for (p, offset), value in sorted(got.items()):
        by_partition[p].append(offset)
        w, i = value.split(b"-")
        order[(p, int(w))].append(int(i))
    assert all(seq == sorted(seq) for seq in order.values())
    # They shared: some flushes were pending, and some writer took another's.
    assert sum(m["pending-flush-total"] for m in metrics) > 0
    assert sum(m["shared-flush-taken-total"] for m in metrics) > 0
    meta = store.topic("t")
    left = store.storage.list_dir(pending_dir(topic_data_dir("t", meta.topic_id), 0))
    assert not [f.name for f in left if f.name.endswith(".kfl")], "pending files left behind"


def test_racing_writers_write_no_pending_flush(local_store: tuple[str, dict[str, Any]]) -> None:
    url, _ = local_store
    Store(url).create_topic("t", 2)
    producers = [Producer(Store(url), shared_commits=False, linger_ms=1) for _ in range(2)]
    for n in range(40):
        for producer in producers:
            producer.send("t", b"%d" % n, key=b"k")
    for producer in producers:
        producer.flush()
        assert (
            producer.metrics()["pending-flush-total"] == 0
            if "pending-flush-total" in producer.metrics()
            else True
        )
        producer.close()
    meta = Store(url).topic("t")
    assert not os.path.exists(
        os.path.join(
            url.removeprefix("file://"), pending_dir(topic_data_dir("t", meta.topic_id), 0)
        )
    )


# -- a committer's round, flush by flush ------------------------------------------------------


def _pid(n: int) -> str:
    return f"{n:032x}"


def _flush(
    share: CommitShare,
    partitions: dict[int, tuple[str, int, int, int]],
    tag: str | None = None,
    writer: str | None = None,
    number: int = 0,
) -> Flush:
    """A flush of ``partitions``: p -> (producer id, epoch, first sequence, records)."""
    parts_in = []
    for p, (pid, _, first, n) in sorted(partitions.items()):
        table = pa.table(
            {
                "key": pa.array([b"k"] * n, pa.binary()),
                "value": pa.array(
                    [b"%s-%d" % (pid[-2:].encode(), first + i) for i in range(n)], pa.binary()
                ),
                "timestamp": pa.array([1_000_000 * (i + 1) for i in range(n)], pa.timestamp("us")),
            }
        )
        parts_in.append((p, table, BINARY))
    data, files = encode_data_object(parts_in, CARRIED)
    blob = data if isinstance(data, bytes) else memoryview(data).tobytes()
    parts = {
        p: Part(p, files[p], ProducerBatch(pid, epoch, first, first + n - 1), tag)
        for p, (pid, epoch, first, n) in partitions.items()
    }
    if writer is None:
        return share.new_flush(parts, blob, durable=True, compression="uncompressed")
    return Flush(writer, number, 0, blob, parts)


def _setup(
    url: str, partitions: int = 4, takeover_s: float = 0.05
) -> tuple[Store, CommitShare, str]:
    store = Store(url)
    store.create_topic("t", partitions)
    meta = store.topic("t")
    # The topic log's first commit (version 0) is always direct.
    with Producer(store) as producer:
        producer.send("t", b"first", partition=0).get(timeout=30)
    incarnation = topic_data_dir("t", meta.topic_id)
    share = CommitShare(
        store.topic_log("t", meta, 0),
        store.storage,
        incarnation_dir=incarnation,
        partitions=partitions,
        commit_logs=1,
        takeover_s=takeover_s,
        metrics={},
    )
    return store, share, incarnation


def _pending(store: Store, incarnation: str, flush: Flush, age_s: float = 0) -> str:
    path = f"{pending_dir(incarnation, 0)}/{flush.name}"
    store.storage.put_if_absent(path, encode_pending(flush))
    if age_s:
        full = store.storage.full_path(path)
        os.utime(full, (time.time() - age_s, time.time() - age_s))
    return path


def _round(share: CommitShare, own: Flush | None) -> _Own | None:
    owns = [] if own is None else [_Own(own, time.monotonic() + 60)]
    share._round(owns, voluntary=False, listing=True)
    share.wait_for_deletes()  # a round's DELETEs run on their own thread
    return owns[0] if owns else None


def _last_commit(store: Store) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    log = store.topic_log("t", store.topic("t"), 0)
    state = log.state()
    found = log.log.read_commit(state.version)
    assert found is not None
    return found


def test_a_round_merges_two_producers_into_one_range_per_partition(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    url, _ = local_store
    store, share, incarnation = _setup(url)
    other = _flush(share, {1: (_pid(2), 0, 0, 3), 2: (_pid(2), 0, 0, 2)}, writer=_pid(9))
    path = _pending(store, incarnation, other)
    own = _round(share, _flush(share, {1: (_pid(1), 0, 0, 4)}))
    assert own is not None
    assert own.outcomes[1] == (0, 0)
    info, actions = _last_commit(store)
    assert info["committer"] == share.writer_id
    adds = [b for name, b in actions if name == "add"]
    assert sorted(b["partition"] for b in adds) == [1, 2]  # one add per partition
    add1 = next(b for b in adds if b["partition"] == 1)
    assert (add1["baseOffset"], add1["lastOffset"], add1["records"]) == (0, 6, 7)
    producers = [
        (b["id"], b["baseOffset"], b["lastOffset"])
        for n, b in actions
        if n == "producer" and b["partition"] == 1
    ]
    assert producers == [(_pid(1), 0, 3), (_pid(2), 4, 6)]  # own flush first
    flushes = next(b for n, b in actions if n == "flushes")
    assert flushes["taken"] == [{"name": other.name, "partitions": [1, 2]}]
    assert not store.storage.exists(path)  # taken: deleted
    got = _read_all(store, "t", 1 + 7 + 2)
    assert [got[(1, o)] for o in range(7)] == [
        b"01-0",
        b"01-1",
        b"01-2",
        b"01-3",
        b"02-0",
        b"02-1",
        b"02-2",
    ]
    state = store.topic_log("t", store.topic("t"), 0).state()
    assert resolve(other, state) == {1: (4, 0), 2: (0, 0)}


def test_a_round_refuses_a_fenced_flush_drops_a_duplicate_and_defers_a_clash(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    url, _ = local_store
    store, share, incarnation = _setup(url)
    _round(share, _flush(share, {1: (_pid(5), 3, 0, 1), 2: (_pid(6), 0, 0, 2)}))
    zombie = _flush(share, {1: (_pid(5), 2, 0, 1)}, writer=_pid(10))  # epoch 2 < 3
    duplicate = _flush(share, {2: (_pid(6), 0, 0, 2)}, writer=_pid(11))
    tagged = _flush(share, {3: (_pid(7), 0, 0, 1)}, tag=f"{_pid(7)}:1", writer=_pid(12))
    untagged = _flush(share, {3: (_pid(8), 0, 0, 1)}, writer=_pid(13))
    paths = {f.name: _pending(store, incarnation, f) for f in (zombie, duplicate, tagged, untagged)}
    _round(share, None)
    _, actions = _last_commit(store)
    flushes = next(b for n, b in actions if n == "flushes")
    assert flushes["refused"] == [
        {"name": zombie.name, "partition": 1, "error": "ProducerFencedError"}
    ]
    taken = [t["name"] for t in flushes["taken"]]
    assert len(taken) == 1  # one tag per add
    assert taken[0] in (tagged.name, untagged.name)
    deferred = untagged if taken[0] == tagged.name else tagged
    assert store.storage.exists(paths[deferred.name])  # waits for the next round
    for name in (zombie.name, duplicate.name, taken[0]):
        assert not store.storage.exists(paths[name])
    state = store.topic_log("t", store.topic("t"), 0).state()
    assert isinstance(resolve(zombie, state)[1], ProducerFencedError)  # how the zombie learns
    _round(share, None)
    assert not store.storage.exists(paths[deferred.name])
    state = store.topic_log("t", store.topic("t"), 0).state()
    assert resolve(deferred, state)[3] is not None


def test_a_damaged_or_hour_old_pending_flush_is_not_taken(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    url, _ = local_store
    store, share, incarnation = _setup(url)
    good = _flush(share, {1: (_pid(2), 0, 0, 1)}, writer=_pid(20))
    old = _flush(share, {2: (_pid(3), 0, 0, 1)}, writer=_pid(21))
    damaged = f"{pending_dir(incarnation, 0)}/{pending_name(_pid(22), 0)}"
    store.storage.put_if_absent(damaged, b'{"flushInfo":{"writer":"x"}}\nnot json\n')
    _pending(store, incarnation, good)
    old_path = _pending(store, incarnation, old, age_s=2 * 3600)
    _round(share, None)
    _, actions = _last_commit(store)
    assert next(b for n, b in actions if n == "flushes")["taken"] == [
        {"name": good.name, "partitions": [1]}
    ]
    assert not store.storage.exists(damaged)  # refused whole, deleted: its writer commits it
    assert store.storage.exists(old_path)  # vacuum's, not a committer's
    # Vacuum deletes it past the orphan age, and nothing younger.
    young = _pending(store, incarnation, _flush(share, {3: (_pid(4), 0, 0, 1)}, writer=_pid(23)))
    vacuum(None, url, verbose=False, orphan_age_ms=600_000)
    assert not store.storage.exists(old_path)
    assert store.storage.exists(young)


def test_a_waiter_takes_over_when_the_holder_stops(local_store: tuple[str, dict[str, Any]]) -> None:
    """The holder named by the newest commit stops listing (crashed, paused): a waiter writes
    its pending flush, sees no commit for the takeover time, commits it itself and becomes the
    holder."""
    url, _ = local_store
    store, holder, incarnation = _setup(url)
    _round(holder, _flush(holder, {1: (_pid(2), 0, 0, 1)}))  # a listing commit names it
    holder.close()
    meta = store.topic("t")
    waiter_store = Store(url)
    waiter = CommitShare(
        waiter_store.topic_log("t", meta, 0),
        waiter_store.storage,
        incarnation_dir=incarnation,
        partitions=4,
        commit_logs=1,
        takeover_s=0.05,
        metrics={},
    )
    flush = _flush(waiter, {3: (_pid(3), 0, 0, 2)})
    outcomes = waiter.write(flush, time.monotonic() + 30)
    assert outcomes == {3: (0, 0)}
    assert waiter._metrics["pending-flush-total"] == 1
    assert waiter._metrics["shared-takeover-total"] == 1
    info, _ = _last_commit(store)
    assert info["committer"] == waiter.writer_id
    waiter.wait_for_deletes()  # it took over: it deletes its own file
    assert not store.storage.exists(f"{pending_dir(incarnation, 0)}/{flush.name}")
    waiter.close()


def _second_writer(url: str, incarnation: str, takeover_s: float) -> tuple[CommitShare, list[str]]:
    """Another writer of topic ``t``'s log 0 on a store of its own, and the paths it DELETEs."""
    other = Store(url)
    deleted: list[str] = []
    storage_delete = other.storage.delete

    def delete(rels: Any) -> None:
        deleted.extend(rels)
        storage_delete(rels)

    other.storage.delete = delete  # type: ignore[method-assign]
    share = CommitShare(
        other.topic_log("t", other.topic("t"), 0),
        other.storage,
        incarnation_dir=incarnation,
        partitions=4,
        commit_logs=1,
        takeover_s=takeover_s,
        metrics={},
    )
    return share, deleted


def test_a_waiter_behind_the_log_counts_commits_from_its_first_look(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    """A waiter whose state is versions behind the log (it last looked long ago) does not take
    over at its first look: the three commits of PROTOCOL.md 30.6 rule 2 count from what that
    look found. The holder's round takes its flush, and the holder, not the waiter, deletes
    the pending file."""
    url, _ = local_store
    store, holder, incarnation = _setup(url)
    waiter, deleted = _second_writer(url, incarnation, takeover_s=5.0)
    stale = waiter._log.state(refresh=False).version
    for n in range(5):  # the holder's listing commits: the waiter's state is 5 behind
        _round(holder, _flush(holder, {1: (_pid(2), 0, n, 1)}))
    assert store.topic_log("t", store.topic("t"), 0).state().version >= stale + 5
    holder._start_committing()  # its rounds list and take others' flushes from now on
    flush = _flush(waiter, {3: (_pid(3), 0, 0, 2)})
    outcomes = waiter._wait(_Own(flush, time.monotonic() + 30))
    assert outcomes == {3: (0, 0)}
    assert waiter._metrics["shared-takeover-total"] == 0  # counted from its first look
    info, actions = _last_commit(store)
    assert info["committer"] == holder.writer_id
    assert next(b for n, b in actions if n == "flushes")["taken"] == [
        {"name": flush.name, "partitions": [3]}
    ]
    holder.close()
    holder.wait_for_deletes()
    waiter.wait_for_deletes()
    path = f"{pending_dir(incarnation, 0)}/{flush.name}"
    assert not store.storage.exists(path)  # deleted by the holder that took it
    assert path not in deleted  # one DELETE a flush: the waiter sent none
    waiter.close()


def test_a_waiter_is_patient_with_a_slow_log_up_to_eight_takeover_times() -> None:
    """The wait before a takeover stretches to three average gaps between the versions a
    writer saw, at most 8 T, and an idle spell counts as a gap of at most 1 s."""
    from types import SimpleNamespace

    share = CommitShare.__new__(CommitShare)
    share._takeover_s, share._gap = 0.1, None
    share._seen_version, share._seen_at = -1, 0.0
    assert share._patience() == 0.1  # nothing seen yet: T
    share._observe(SimpleNamespace(version=10))  # type: ignore[arg-type]
    time.sleep(0.2)
    share._observe(SimpleNamespace(version=12))  # type: ignore[arg-type]
    assert share._gap is not None
    assert 0.09 <= share._gap <= 0.5  # 0.2 s (or more, on a loaded machine) over 2 versions
    assert 0.27 <= share._patience() <= 0.8
    share._gap = 0.01  # versions faster than T: T
    assert share._patience() == 0.1
    share._gap = 5.0  # a log very slow: at most 8 T
    assert share._patience() == pytest.approx(0.8)
    share._seen_at -= 30  # an idle spell of 30 s counts as 1 s
    share._gap = None
    share._observe(SimpleNamespace(version=13))  # type: ignore[arg-type]
    assert share._gap == pytest.approx(1.0, abs=0.01)


def test_the_listing_during_a_commit_leaves_out_what_it_takes_and_serves_the_next_round(
    local_store: tuple[str, dict[str, Any]],
) -> None:
    """A committer's next listing starts while its commit is built and written: it does not
    read again the flushes that commit takes, and a flush written before it is taken by the
    next round."""
    url, _ = local_store
    store, share, incarnation = _setup(url)
    first = _flush(share, {1: (_pid(2), 0, 0, 1)}, writer=_pid(30))
    _pending(store, incarnation, first)
    reads: list[list[str]] = []
    read_many = store.storage.read_many

    def counting(rels: list[str]) -> dict[str, bytes]:
        reads.append(list(rels))
        return read_many(rels)

    store.storage.read_many = counting  # type: ignore[method-assign]
    share._round([], voluntary=False, listing=True)  # takes first, lists ahead
    ahead = share._next_listing
    assert ahead is not None
    ahead.result(timeout=30)
    second = _flush(share, {2: (_pid(3), 0, 0, 1)}, writer=_pid(31))
    _pending(store, incarnation, second)
    assert not any(f"{pending_dir(incarnation, 0)}/{first.name}" in r for r in reads[1:])
    # The listing ahead ran before the second was written: the next round finds nothing in
    # it, and the round after that takes the second flush.
    share._round([], voluntary=False, listing=True, ahead=True)
    share._round([], voluntary=False, listing=True, ahead=True)
    state = store.topic_log("t", store.topic("t"), 0).state()
    assert resolve(first, state) == {1: (0, 0)}
    assert resolve(second, state) == {2: (0, 0)}
    share.close()


def test_topics_below_writer_version_8_are_written_solo_until_raised(
    local_store: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A topic log at 6/7 takes no pending flush; `kstore topics upgrade` raises it to 6/8 with
    producers running, after which they share; a writer of version 7 is then refused."""
    url, _ = local_store
    with monkeypatch.context() as patch:
        patch.setattr("kstore.topic_log.TOPIC_LOG_WRITER_VERSION", 7)
        patch.setattr("kstore.store.TOPIC_LOG_WRITER_VERSION", 7)
        Store(url).create_topic("t", 2)
        with Producer(Store(url)) as first:  # the topic log's version 0 sets its versions
            first.send("t", b"first", partition=0).get(timeout=30)
    store = Store(url)
    log = store.topic_log("t", store.topic("t"), 0)
    state = log.state()
    assert (state.min_reader_version, state.min_writer_version) == (6, 7)
    producers = [Producer(Store(url), linger_ms=1) for _ in range(3)]
    for n in range(30):
        for producer in producers:
            producer.send("t", b"%d" % n, key=b"k%d" % n)
    for producer in producers:
        producer.flush()
    assert all(p.metrics().get("pending-flush-total", 0) == 0 for p in producers)
    from kstore.upgrade import upgrade_topic

    upgrade_topic(store, "t")
    state = log.state()
    assert (state.min_reader_version, state.min_writer_version) == (6, 8)
    futures = []
    for n in range(200):
        for producer in producers:
            futures.append(producer.send("t", b"after-%d" % n, key=b"k%d" % n))
        time.sleep(0.001)
    for future in futures:
        future.get(timeout=60)
    for producer in producers:
        producer.close()
    assert len(_read_all(Store(url), "t", 1 + 90 + 600)) == 1 + 90 + 600
    monkeypatch.setattr("kstore.log.WRITER_VERSION", 7)
    with (
        pytest.raises(UnsupportedFormatVersionError, match="writer version 8"),
        Producer(Store(url), shared_commits=False) as old,  # as a version-7 writer
    ):
        old.send("t", b"old", partition=0).get(timeout=30)
