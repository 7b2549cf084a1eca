"""Vacuum lists a log only as far as the work to do (PROTOCOL.md 22.5).

Each fixture is a log built in two phases a few seconds apart on the storage's own clock: an
old phase (versions, checkpoints every ``EVERY`` versions, a removal, a ``.tmp-`` leftover)
and a retained phase (removals and many versions), then vacuum runs with its clock set to the
log retention after the boundary between them. So on every backend, S3 (moto) included, the
storage's modification times decide what is old, as in service.

The files vacuum deletes are compared with a reference: the algorithm that lists the whole log
directory (what vacuum did before), kept here. The number of LIST requests (pages of
``PAGE`` names) on the log directory must not change when the retained versions double.
"""

from __future__ import annotations

import datetime
import importlib
import math
import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kstore.retention import run_retention, vacuum
from kstore.retention.vacuum import TopicRemovalState

from kstore import Store
from kstore.layout import topic_data_dir
from kstore.log import (
    LAST_CHECKPOINT,
    Log,
    checkpoint_file,
    encode_commit,
    parse_log_file_name,
    version_file,
)
from kstore.producer import Producer
from kstore.storage import FileInfo, Storage
from kstore.topic_log import SIDECARS, TopicLogFiles
from tests.test_jobs_support import Target, now_ms, rows

# The module (``kstore.retention.vacuum`` the attribute is the job function).
vacuum_module = importlib.import_module("kstore.retention.vacuum")

PAGE = 100  # names per LIST page in these tests (vacuum's LOG_PAGE_SIZE)
EVERY = 50  # a checkpoint every this many versions in the old phase
OLD = 300  # versions of the old phase
DAY = 24 * 3_600_000
RETENTION = 30 * DAY  # the log retention these tests give vacuum (its default is 2 days)
ORPHAN_AGE = 3_600_000  # vacuum's default orphan age
BACKENDS = ["memory", "local", pytest.param("moto", marks=pytest.mark.s3)]
# (backend, layout): layout 3, the only one vacuum writes (a layout-2 topic is refused until
# it is upgraded); on moto each of these runs takes one to two minutes of HTTP round trips.
KINDS_AND_LAYOUTS = [
    *[(kind, 3) for kind in ("memory", "local")],
    pytest.param("moto", 3, marks=pytest.mark.s3),
]


def new_target(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Target:
    """A fresh, empty store of ``kind``."""
    if kind == "memory":
        return f"memory://kstore-test-{uuid.uuid4().hex}/store", {}
    if kind == "local":
        return (tmp_path / uuid.uuid4().hex).as_uri(), {}
    server = request.getfixturevalue(f"{kind}_server")  # moto or seaweed
    url, options = server.new_store_url()
    return url, options


@dataclass
class Fixture:
    where: Target
    layout: int
    log_dir: str  # the partition log (layout 2) or topic log 0 (layout 3)
    data_root: str  # where removed paths live: the partition (2) or incarnation (3) directory
    boundary_ms: int  # every file of the old phase is older, every other file younger
    last_old_checkpoint: int
    removals: list[int]  # versions of the commits that removed files

    @property
    def now(self) -> int:
        """Vacuum's clock: the old phase is past the log retention, the rest is not."""
        return self.boundary_ms + RETENTION

    def store(self) -> Store:
        return Store(*self.where)

    def log(self, storage: Storage) -> Log[Any]:
        return TopicLogFiles(storage, self.log_dir, TopicRemovalState, checkpoint_interval=100_000)


def _log_and_dirs(store: Store, layout: int) -> tuple[Log[Any], str, str]:
    meta = store.topic("t")
    topic_log = store.topic_logs("t", meta)[0]
    return topic_log.log, topic_log.directory, topic_data_dir("t", meta.topic_id)


def produce_and_remove(where: Target, records: int = 2) -> int:
    """Records into partition 0, then all of them removed (DeleteRecords, then retention):
    returns the version of the commit that removed their files."""
    store = Store(*where)
    with Producer(store) as producer:
        for i in range(records):
            producer.send("t", value=b"v%d" % i, key=b"k", partition=0)
            producer.flush()
    store.partition("t", 0).delete_records(-1)
    run_retention(None, *where, verbose=False)
    part = Store(*where).partition("t", 0)
    state = part.state()
    assert state.segments == []
    assert state.removed
    return state.version


def pad(storage: Storage, log: Log[Any], count: int, *, checkpoints: bool) -> int:
    """``count`` commits that change nothing (and, with ``checkpoints``, a checkpoint every
    ``EVERY`` versions and at the last one); returns the last version."""
    state = log.load()
    first = state.version + 1
    body = encode_commit([], {"timestamp": now_ms(), "operation": "PAD"})
    paths = [f"{log.directory}/{version_file(v)}" for v in range(first, first + count)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda p: storage.put_if_absent(p, body, durable=False), paths))
    last = first + count - 1
    if checkpoints:
        for v in range(first, last + 1):
            if v % EVERY == 0 or v == last:
                copy = state.copy()
                copy.stamp(v)
                log.write_checkpoint(copy)
    return last


def wait_past_a_second() -> int:
    """Sleep so that the files written before and after differ by more than S3's 1 s time
    resolution; returns a time strictly between them."""
    time.sleep(1.2)
    middle = now_ms()
    time.sleep(1.2)
    return middle


def build(
    where: Target, layout: int, retained: int, config: dict[str, Any] | None = None
) -> Fixture:
    store = Store(*where)
    store.create_topic(
        "t",
        1,
        {"checkpoint.interval": 100_000, "file.delete.delay.ms": RETENTION, **(config or {})},
        layout=layout,
    )
    storage = store.storage
    # Old phase: a removal, many versions with checkpoints, and a temporary file.
    removals = [produce_and_remove(where)]
    log, log_dir, data_root = _log_and_dirs(Store(*where), layout)
    last_old = pad(storage, log, OLD, checkpoints=True)
    storage.put(f"{log_dir}/.tmp-{uuid.uuid4().hex}", b"cut short")
    boundary = wait_past_a_second()
    # Retained phase: removals (after the old phase's last checkpoint: their commits say
    # when) amid many versions, and a young temporary file (still past the orphan age then).
    removals.append(produce_and_remove(where))
    log, _, _ = _log_and_dirs(Store(*where), layout)
    pad(storage, log, retained // 2, checkpoints=False)
    removals.append(produce_and_remove(where))
    log, _, _ = _log_and_dirs(Store(*where), layout)
    pad(storage, log, retained - retained // 2, checkpoints=False)
    storage.put(f"{log_dir}/.tmp-{uuid.uuid4().hex}", b"cut short")
    if layout == 3:
        # Sidecars of the old phase's checkpoints made young: the sidecar step (which lists
        # the 10,000 versions past K when a sidecar written within them before K is older than
        # the log retention) is not what these tests measure.
        sidecars = f"{data_root}/{SIDECARS}"
        for info in storage.list_dir(sidecars):
            path = f"{sidecars}/{info.name}"
            storage.put(path, storage.read(path))
    return Fixture(where, layout, log_dir, data_root, boundary, last_old, removals)


# -- the reference: the whole log directory listed, as vacuum did before -------------------------


def reference(fx: Fixture, delay_ms: int) -> tuple[int | None, set[str]]:
    """(K, the files vacuum must delete) by the full-listing algorithm."""
    storage = Storage(*fx.where)
    now = fx.now
    listing = storage.list_dir(fx.log_dir)
    times: dict[tuple[int, bool], int | None] = {}
    for info in listing:
        parsed = parse_log_file_name(info.name)
        if parsed is not None:
            times[parsed] = info.mtime_ms
    old_checkpoints = [
        v for (v, cp), t in times.items() if cp and t is not None and now - t > RETENTION
    ]
    keep_from = max(old_checkpoints) if old_checkpoints else None
    doomed = {
        f"{fx.log_dir}/{info.name}"
        for info in listing
        if (parsed := parse_log_file_name(info.name)) is not None
        and keep_from is not None
        and parsed[0] < keep_from
    }
    doomed |= {
        f"{fx.log_dir}/{info.name}"
        for info in listing
        if info.name.startswith(".tmp-")
        and info.mtime_ms is not None
        and now - info.mtime_ms > ORPHAN_AGE
    }
    oldest = min(v for v, _ in times)

    def at(version: int) -> int | None:
        for key in ((version, False), (version, True)):
            if times.get(key) is not None:
                return times[key]
        return 0 if version < oldest else None

    state = fx.log(storage).load()
    removed = {p: state.removal_version(0, p) for p in state.partitions[0].removed}
    for path, version in removed.items():
        when = at(version)
        location = f"{fx.data_root}/{path}"
        if when is not None and now - when >= delay_ms and storage.exists(location):
            doomed.add(location)
    return keep_from, doomed


# -- counting LIST requests on the log directory ---------------------------------------------------


class ListCounter:
    """LIST requests on one directory, as S3 would bill them: a page of ``PAGE`` names each
    (a full listing of n names: ceil(n / PAGE) pages)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, directory: str) -> None:
        self.directory = directory
        self.pages = 0
        self.inside = False
        list_dir, list_pages = Storage.list_dir, Storage.list_pages
        counter = self

        def counted_dir(storage: Storage, rel: str) -> list[FileInfo]:
            found = list_dir(storage, rel)
            if rel == counter.directory and not counter.inside:
                counter.pages += max(1, math.ceil(len(found) / PAGE))
            return found

        def counted_pages(storage: Storage, rel: str, **kwargs: Any) -> Iterator[list[FileInfo]]:
            if rel != counter.directory:
                yield from list_pages(storage, rel, **kwargs)
                return
            pages, any_page = list_pages(storage, rel, **kwargs), False
            while True:
                counter.inside = True  # the full listing local disk and memory page through
                try:
                    page = next(pages)
                except StopIteration:
                    break
                finally:
                    counter.inside = False
                counter.pages += 1
                any_page = True
                yield page
            if not any_page:
                counter.pages += 1

        monkeypatch.setattr(Storage, "list_dir", counted_dir)
        monkeypatch.setattr(Storage, "list_pages", counted_pages)


# On S3 (moto) every request is an HTTP round trip: the logs there are a quarter of the size,
# with pages a quarter as long, so that they span as many pages (what the tests count).
S3_SCALE = 4


@pytest.fixture(autouse=True)
def small_pages(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("kind") == "moto":
        module = importlib.import_module(__name__)
        for name in ("PAGE", "EVERY", "OLD"):
            monkeypatch.setattr(module, name, getattr(module, name) // S3_SCALE)
    monkeypatch.setattr(vacuum_module, "LOG_PAGE_SIZE", PAGE)


def retained_sizes(kind: str) -> tuple[int, int]:
    """The retained phase's versions, and twice as many: six and twelve pages on moto (half as
    many as elsewhere, as each costs a round trip), ten and twenty elsewhere."""
    return (75, 150) if kind == "moto" else (500, 1000)


def log_names(fx: Fixture) -> set[str]:
    return {i.name for i in Storage(*fx.where).list_dir(fx.log_dir)}


@pytest.mark.parametrize(("kind", "layout"), KINDS_AND_LAYOUTS)
def test_lists_do_not_grow_with_the_retained_versions_and_delete_what_the_full_listing_does(
    kind: str,
    layout: int,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pages: list[int] = []
    s3_lists: list[int] = []
    # Fewer on moto (S3_SCALE): the doubling is what counts.
    for retained in retained_sizes(kind):
        fx = build(new_target(kind, request, tmp_path), layout, retained)
        keep_from, expected = reference(fx, RETENTION)
        assert keep_from == fx.last_old_checkpoint
        # The old phase's removal is due, the retained phase's are not.
        assert any(f.startswith(f"{fx.data_root}/") and "/_log" not in f for f in expected)
        with monkeypatch.context() as patch:
            counter = ListCounter(patch, fx.log_dir)
            dry = vacuum(
                None,
                *fx.where,
                verbose=False,
                log_retention_ms=RETENTION,
                dry_run=True,
                now_ms=fx.now,
            )
        assert set(dry.files) == expected
        assert dry.count("dry-run") == 1
        storage = fx.store().storage
        with monkeypatch.context() as patch:
            counter = ListCounter(patch, fx.log_dir)
            if kind == "moto":
                with storage.count_requests() as counts:
                    done = vacuum(
                        None, *fx.where, verbose=False, log_retention_ms=RETENTION, now_ms=fx.now
                    )
                s3_lists.append(counts["LIST"])
            else:
                done = vacuum(
                    None, *fx.where, verbose=False, log_retention_ms=RETENTION, now_ms=fx.now
                )
        pages.append(counter.pages)
        assert set(done.files) == expected
        names = log_names(fx)
        assert not any(f"{fx.log_dir}/{n}" in expected for n in names)
        assert checkpoint_file(fx.last_old_checkpoint) in names
        hint = storage.read(f"{fx.log_dir}/{LAST_CHECKPOINT}")
        assert int(hint.split(b":")[1].strip(b" }")) >= fx.last_old_checkpoint
        # Every record had been removed; the log still reads.
        assert rows(fx.store().partition("t", 0)) == []
    # The old approach lists ceil((OLD + retained) / PAGE) pages and more; this one the same
    # few pages however many versions are retained.
    assert pages[0] == pages[1], pages
    assert pages[0] <= (OLD + OLD // EVERY) // PAGE + 2, pages
    if s3_lists:
        assert s3_lists[0] == s3_lists[1], s3_lists


@pytest.mark.parametrize(("kind", "layout"), KINDS_AND_LAYOUTS)
def test_removal_times_gate_deletion_whether_looked_up_or_listed(
    kind: str,
    layout: int,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The retained phase's removals are due under a shorter file.delete.delay.ms: their times
    are learnt by HEADs (few versions) or, when a listing costs less, by listing from the
    oldest of them; both agree with the full listing. In layout 3 the removed files are data
    objects: a commit carrying its data (PROTOCOL.md 11.8) in the retained phase is part of
    the log, kept whatever its removals."""
    fx = build(
        new_target(kind, request, tmp_path),
        layout,
        retained_sizes(kind)[0],
        {"commit.inline.bytes": 0},
    )
    store = fx.store()
    # Due 1 s after the boundary: the retained phase's removals (recorded 1.2 s or more after
    # it) are not, ...
    store.alter_topic_config("t", {"file.delete.delay.ms": RETENTION - 1000})
    _, expected = reference(fx, RETENTION - 1000)
    assert vacuum(
        None, *fx.where, verbose=False, log_retention_ms=RETENTION, dry_run=True, now_ms=fx.now
    ).files == sorted(expected)
    # ... with an hour, every removal is due.
    store.alter_topic_config("t", {"file.delete.delay.ms": 3_600_000})
    _, everything = reference(fx, 3_600_000)
    assert everything > expected
    pages: list[int] = []
    for heads_per_list in (vacuum_module.HEADS_PER_LIST, 0):  # 0: always list
        with monkeypatch.context() as patch:
            patch.setattr(vacuum_module, "HEADS_PER_LIST", heads_per_list)
            counter = ListCounter(patch, fx.log_dir)
            dry = vacuum(
                None,
                *fx.where,
                verbose=False,
                log_retention_ms=RETENTION,
                dry_run=True,
                now_ms=fx.now,
            )
        assert set(dry.files) == everything
        pages.append(counter.pages)
    # The removal deep in the retained phase (the one near the boundary is in the listing of
    # the log's start): one HEAD, or one more page listed from its version.
    assert pages[1] == pages[0] + 1, pages
    done = vacuum(None, *fx.where, verbose=False, log_retention_ms=RETENTION, now_ms=fx.now)
    assert set(done.files) == everything
    state = fx.log(store.storage).load()
    removed = state.partitions[0].removed
    assert not removed


def set_mtime(storage: Storage, rel: str, ms: int) -> None:
    path = storage.full_path(rel)
    if storage.local_root is not None:
        os.utime(path, (ms / 1000, ms / 1000))
        return
    entry = storage.fs.store[storage.fs._strip_protocol(path)]
    entry.created = entry.modified = datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


@pytest.mark.parametrize("layout", [3])
@pytest.mark.parametrize("kind", ["memory", "local"])  # modification times set by hand
def test_a_checkpoint_past_the_listing_older_than_the_commits_before_it_only_keeps_more(
    kind: str, layout: int, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Storage times out of version order (a checkpoint of a retained version recorded as
    if before the boundary): the full listing takes it for K and would delete retained
    versions; vacuum, which stops listing at the first retained commit, keeps K and every
    later file, and deletes only files the full listing would."""
    fx = build(new_target(kind, request, tmp_path), layout, 1000)
    storage = fx.store().storage
    log = fx.log(storage)
    state = log.load()
    late = state.version - 10  # far past the first retained page
    copy = state.copy()
    copy.stamp(late)
    data = encode_commit(copy.checkpoint_actions(), {"checkpointVersion": late, "timestamp": 0})
    storage.put_if_absent(f"{fx.log_dir}/{checkpoint_file(late)}", data)
    set_mtime(storage, f"{fx.log_dir}/{checkpoint_file(late)}", fx.boundary_ms - 5000)
    full_k, full = reference(fx, RETENTION)
    assert full_k == late  # the full listing would delete 1,000 retained versions
    before = log_names(fx)
    done = vacuum(None, *fx.where, verbose=False, log_retention_ms=RETENTION, now_ms=fx.now)
    deleted = set(done.files)
    assert deleted < full
    after = log_names(fx)
    kept_from = fx.last_old_checkpoint
    assert checkpoint_file(kept_from) in after
    for name in before:
        parsed = parse_log_file_name(name)
        if parsed is not None and parsed[0] >= kept_from:
            assert name in after, name
    assert rows(Store(*fx.where).partition("t", 0)) == []
    assert Store(*fx.where).partition("t", 0).state().version >= state.version  # + vacuumed


@pytest.mark.parametrize("kind", [*BACKENDS, pytest.param("seaweed", marks=pytest.mark.s3)])
def test_list_pages_starts_after_a_name_and_stops_when_asked(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    storage = Storage(*new_target(kind, request, tmp_path))
    names = [version_file(v) for v in range(250)] + [".tmp-x", LAST_CHECKPOINT]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda n: storage.put(f"d/{n}", b"x", durable=False), names))
    storage.put("d/sub/file", b"x")
    storage.put("dx/file", b"x")
    every = [n for page in storage.list_pages("d", page_size=PAGE) for n in (i.name for i in page)]
    assert every == sorted([*names, "sub"])  # "." before digits, "_" and letters after
    assert every[0] == ".tmp-x"
    after = [
        i.name
        for page in storage.list_pages("d", start_after=version_file(199), page_size=PAGE)
        for i in page
    ]
    assert after == [version_file(v) for v in range(200, 250)] + [LAST_CHECKPOINT, "sub"]
    pages = storage.list_pages("d", page_size=PAGE)
    first = next(pages)
    pages.close()
    assert [i.name for i in first] == sorted(names)[:PAGE]
    assert all(i.mtime_ms is not None for i in first)
    assert list(storage.list_pages("absent", page_size=PAGE)) == []
    found = storage.stat_many([f"d/{version_file(3)}", "d/none.json"])
    assert list(found) == [f"d/{version_file(3)}"]
    assert found[f"d/{version_file(3)}"].size == 1
    if kind in ("moto", "seaweed"):
        with storage.count_requests() as counts:
            pages = storage.list_pages("d", page_size=PAGE)
            next(pages)
            next(pages)
            pages.close()
        assert counts["LIST"] == 2


# -- log pruning (PROTOCOL.md 17.6) lists a log's start the same way ------------------------------


def prune_reference(storage: Storage, log_dir: str, now: int) -> tuple[set[str], bool]:
    """(the files pruning deletes, whether it writes a checkpoint) from the whole listing."""
    listing = storage.list_dir(log_dir)
    parsed = [(p, i) for i in listing if (p := parse_log_file_name(i.name)) is not None]
    old_checkpoints = [
        v for (v, cp), i in parsed if cp and i.mtime_ms is not None and now - i.mtime_ms > RETENTION
    ]
    keep_from = max(old_checkpoints) if old_checkpoints else None
    doomed = {
        f"{log_dir}/{i.name}" for (v, _), i in parsed if keep_from is not None and v < keep_from
    }
    doomed |= {
        f"{log_dir}/{i.name}"
        for i in listing
        if i.name.startswith(".tmp-") and i.mtime_ms is not None and now - i.mtime_ms > RETENTION
    }
    newest_checkpoint = max((v for (v, cp), _ in parsed if cp), default=-1)
    newest_commit = max((v for (v, cp), _ in parsed if not cp), default=-1)
    checkpoint = any(
        not cp
        and newest_checkpoint < v < newest_commit
        and i.mtime_ms is not None
        and now - i.mtime_ms > RETENTION
        for (v, cp), i in parsed
    )
    return doomed, checkpoint


@pytest.mark.parametrize("retained_checkpoints", [True, False])
@pytest.mark.parametrize("kind", BACKENDS)
def test_log_pruning_lists_a_log_as_far_as_its_old_versions(
    kind: str,
    retained_checkpoints: bool,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A topic metadata log: old versions with checkpoints, then old commits after the last old
    checkpoint, then retained versions (with checkpoints: no new checkpoint is needed, and the
    listing stops at the first retained one; without: the log is listed to its end, and a
    checkpoint is written, as the whole listing decides)."""
    from kstore.retention import prune_logs

    pages: list[int] = []
    for retained in retained_sizes(kind):
        where = new_target(kind, request, tmp_path)
        store = Store(*where)
        store.create_topic("t", 1)
        log = store._topic_log("t")
        storage = store.storage
        pad(storage, log, OLD, checkpoints=True)
        pad(storage, log, 30, checkpoints=False)  # old commits after the last old checkpoint
        storage.put(f"{log.directory}/.tmp-{uuid.uuid4().hex}", b"cut short")
        boundary = wait_past_a_second()
        pad(storage, log, retained, checkpoints=retained_checkpoints)
        now = boundary + RETENTION
        expected, checkpoint = prune_reference(storage, log.directory, now)
        assert checkpoint is not retained_checkpoints
        with monkeypatch.context() as patch:
            counter = ListCounter(patch, log.directory)
            dry = prune_logs(Store(*where), RETENTION, now_ms=now, dry_run=True)
        (entry,) = [e for e in dry.logs if e.kind == "topic"]
        assert set(entry.files) == expected
        assert (entry.checkpoint is not None) is checkpoint
        pages.append(counter.pages)
        done = prune_logs(Store(*where), RETENTION, now_ms=now)
        assert set(done.files) >= expected
        assert Store(*where).topic("t").partitions == 1
    if retained_checkpoints:
        assert pages[0] == pages[1], pages
    else:  # listed to its end, as it needs a checkpoint
        assert pages[1] > pages[0], pages
