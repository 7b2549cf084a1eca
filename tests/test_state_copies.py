"""A partition state's copies share what they have not changed (kstore.manifest): every reader
and writer copies the state of each partition a commit changes, so a copy must not cost the
live segments or the removed files awaiting vacuum, and must never let one copy's changes show
in another."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kstore.errors import CorruptLogError
from kstore.manifest import PartitionState, Segment


def _add(n: int) -> dict[str, Any]:
    """The ``add`` body of segment ``n``: ten records from offset 10 n."""
    segment = Segment(
        path=f"segments/{n:020d}.arrow",
        base_offset=n * 10,
        last_offset=n * 10 + 9,
        record_count=10,
        min_timestamp_ms=1,
        max_timestamp_ms=2,
        size_bytes=100,
        checksum="x",
        format="arrow",
        sparse=False,
        created_ms=0,
    )
    body: dict[str, Any] = segment.to_action()["add"]
    return body


def _snapshot(state: PartitionState) -> tuple[list[str], dict[str, int]]:
    return [s.path for s in state.segments], dict(state.removed)


def test_a_copy_and_its_original_change_independently() -> None:
    original = PartitionState()
    for n in range(10):
        original.apply("add", _add(n))
    original.apply("tombstone", {"path": "segments/old.arrow", "deletionTimestamp": 5})
    copy = original.copy()
    before = _snapshot(original)
    copy.apply("remove", {"path": _add(3)["path"], "deletionTimestamp": 7})
    copy.apply("vacuumed", {"paths": ["segments/old.arrow"]})
    copy.apply("add", _add(10))
    assert _snapshot(original) == before
    assert _add(3)["path"] not in [s.path for s in copy.segments]
    assert copy.removed == {_add(3)["path"]: 7}
    # And the other way round: the original changing after the copy leaves the copy alone.
    mirror = _snapshot(copy)
    original.apply("remove", {"path": _add(5)["path"], "deletionTimestamp": 9})
    original.apply("add", _add(10))
    assert _snapshot(copy) == mirror
    assert original.removed == {"segments/old.arrow": 5, _add(5)["path"]: 9}
    # The checks replay makes still hold in each: a live path cannot be added twice, a path
    # that is not live cannot be removed.
    with pytest.raises(CorruptLogError, match="not a live segment"):
        copy.apply("remove", {"path": _add(3)["path"], "deletionTimestamp": 8})
    original.apply("remove", {"path": _add(0)["path"], "deletionTimestamp": 9})
    with pytest.raises(CorruptLogError, match="not a live segment"):
        original.apply("remove", {"path": _add(0)["path"], "deletionTimestamp": 9})


def test_copies_agree_with_a_plain_model_through_many_changes() -> None:
    """Random adds, removals, tombstones and vacuums on a tree of copies (past the point where
    a copy folds its changes into a new shared base), checked against plain dicts."""
    rng = random.Random(17)
    states: list[tuple[PartitionState, dict[str, int], dict[str, int], int]] = [
        (PartitionState(), {}, {}, 0)
    ]
    for step in range(3_000):
        i = rng.randrange(len(states))
        state, live, removed, next_n = states[i]
        if rng.random() < 0.1 and len(states) < 12:
            state = state.copy()
            live, removed = dict(live), dict(removed)
            states.append((state, live, removed, next_n))
            i = len(states) - 1
        choice = rng.random()
        if choice < 0.55 or not live:
            body = _add(next_n)
            state.apply("add", body)
            live[body["path"]] = next_n
            next_n += 1
        elif choice < 0.6 and (
            free := sorted({int(p[9:29]) for p in removed if p[9:29].isdigit()} - {*live.values()})
        ):
            n = rng.choice(free)
            # The offsets of a removed segment again, under a new path: an add before the
            # last live segment (a compaction's replacement).
            body = {**_add(n), "path": f"segments/again-{step}.arrow"}
            state.apply("add", body)
            live[body["path"]] = n
        elif choice < 0.85:
            path = rng.choice(sorted(live))
            state.apply("remove", {"path": path, "deletionTimestamp": step})
            del live[path]
            removed[path] = step
        elif removed:
            gone = rng.sample(sorted(removed), k=min(len(removed), rng.randint(1, 5)))
            state.apply("vacuumed", {"paths": gone})
            for path in gone:
                del removed[path]
        states[i] = (state, live, removed, next_n)
        for other, other_live, other_removed, _ in states:
            expected = sorted(other_live, key=lambda p: other_live[p])
            assert [s.path for s in other.segments] == expected
            assert other.removed == other_removed
            # What a reader near an offset uses instead of the whole list agrees with it.
            assert other.segment_count() == len(expected)
            last = other.last_segment
            assert (last.path if last else None) == (expected[-1] if expected else None)
            lo = rng.randrange(len(expected) + 1)
            hi = lo + rng.randrange(40)
            assert [s.path for s in other.segment_slice(lo, hi)] == expected[lo:hi]
            offset = rng.randrange(10 * next_n + 20)
            first = next(
                (k for k, p in enumerate(expected) if 10 * other_live[p] + 9 >= offset),
                len(expected),
            )
            assert other.segment_index_for(offset) == first
    # The path index agrees too: each live path refuses a second add, each removed one is gone.
    for state, live, removed, _ in states:
        for path in list(live)[:20]:
            n = live[path]
            with pytest.raises(CorruptLogError):
                state.apply("add", {**_add(n), "baseOffset": 10**9 + n, "lastOffset": 10**9 + n})
        for path in list(removed)[:20]:
            with pytest.raises(CorruptLogError, match="not a live segment"):
                state.apply("remove", {"path": path, "deletionTimestamp": 0})


def test_a_copy_of_a_view_does_not_share_what_the_state_changes_later() -> None:
    """A view shares everything with its state (read-only use of a published state); a copy
    made from the view and the state changing afterwards do not see each other's removals."""
    state = PartitionState()
    for n in range(5):
        state.apply("add", _add(n))
    copy = state.view().copy()
    state.apply("remove", {"path": _add(1)["path"], "deletionTimestamp": 3})
    copy.apply("remove", {"path": _add(2)["path"], "deletionTimestamp": 4})
    assert state.removed == {_add(1)["path"]: 3}
    assert copy.removed == {_add(2)["path"]: 4}
    assert [s.path for s in copy.segments] == [_add(n)["path"] for n in (0, 1, 3, 4)]


def test_a_copy_shares_the_live_segments_it_has_not_changed() -> None:
    """A copy costs a bounded tail of the live segments, not all of them, however many there
    are: thousands of appends, each on a fresh copy, as a writer's commits make them."""
    state = PartitionState()
    for n in range(5_000):
        state = state.copy()
        state.apply("add", _add(n))
    copy = state.copy()
    assert copy._base is state._base
    assert len(copy._tail) <= max(64, int(len(state._base) ** 0.5) + 1)
    assert [s.base_offset for s in copy.segments] == [10 * n for n in range(5_000)]
    copy.apply("add", _add(5_000))
    assert state.segment_count() == 5_000
    assert copy.segment_count() == 5_001
    # Lookups across the seam between the shared base and the tail.
    seam = len(copy._base)
    assert 0 < seam < 5_001
    assert copy._tail
    for k in (0, seam - 2, seam - 1, seam, seam + 1, 5_000):
        assert copy.segment_index_for(10 * k + 5) == k
        assert [s.base_offset for s in copy.segment_slice(k, k + 3)] == [
            10 * n for n in range(k, min(k + 3, 5_001))
        ]
    assert copy.segment_index_for(10 * 5_001) == 5_001


def test_a_state_no_copy_shares_takes_its_live_segments_in_place() -> None:
    """Replaying a checkpoint's adds into a fresh state puts them in its live index at once,
    without folding changes into new bases (which made opening a partition of 10,000 live
    segments cost a quarter more); once copied, neither side changes what they share, and each
    still refuses a live path twice and a removal of a path that is not live."""
    state = PartitionState()
    for n in range(2_000):
        state.apply("add", _add(n))
    live = state._live
    assert live._owned
    assert not live._added
    assert not live._dropped
    assert len(live._base) == 2_000
    shared = live._base
    copy = state.copy()
    assert copy._live._base is shared
    assert not copy._live._owned
    assert not live._owned
    copy.apply("remove", {"path": _add(7)["path"], "deletionTimestamp": 1})
    copy.apply("add", _add(2_000))
    state.apply("remove", {"path": _add(9)["path"], "deletionTimestamp": 2})
    assert len(shared) == 2_000
    assert _add(7)["path"] in shared
    assert _add(2_000)["path"] not in shared
    assert _add(7)["path"] not in copy._live
    assert _add(9)["path"] in copy._live
    assert _add(9)["path"] not in state._live
    assert _add(7)["path"] in state._live
    with pytest.raises(CorruptLogError, match="already a live segment"):
        state.apply("add", {**_add(7), "baseOffset": 30_000, "lastOffset": 30_009})
    with pytest.raises(CorruptLogError, match="not a live segment"):
        copy.apply("remove", {"path": _add(7)["path"], "deletionTimestamp": 3})
    # A fold gives a copy a base of its own, which it then changes in place.
    for n in range(2_001, 2_100):
        copy.apply("add", _add(n))
    assert copy._live._owned
    assert copy._live._base is not shared
    assert not copy._live._added
    copy.apply("add", _add(2_100))
    assert _add(2_100)["path"] in copy._live._base
    assert _add(2_100)["path"] not in shared
    assert _add(2_100)["path"] not in state._live


def _txn_state(state: PartitionState) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    return dict(state.txns), dict(state.open_transactions), dict(state.ended_transactions)


def test_copies_share_transaction_state_until_one_changes_it() -> None:
    """The transaction dicts (exactly-once application versions, open and ended transactions)
    are shared by copies until one changes them, on either side and through views: a marker,
    a transactional append or an application version on one never shows in another."""
    state = PartitionState()
    state.apply("add", {**_add(0), "transaction": "7:1"})
    state.apply("txn", {"appId": "app", "version": 3})
    copy = state.copy()
    assert copy.open_transactions is state.open_transactions  # shared while unchanged
    before = _txn_state(state)
    copy.apply(
        "txnMarker", {"producerId": "7", "version": 1, "epoch": 0, "commit": True, "timestamp": 1}
    )
    copy.apply("txn", {"appId": "app", "version": 4})
    assert _txn_state(state) == before == ({"app": 3}, {"7:1": 0}, {})
    assert _txn_state(copy) == ({"app": 4}, {}, {"7": 1})
    # The original changing afterwards leaves the copy alone, and a copy of a view too.
    mirror = _txn_state(copy)
    from_view = state.view().copy()
    state.apply("add", {**_add(1), "transaction": "8:2"})
    state.apply("txnEnded", {"producerId": "9", "version": 5})
    assert _txn_state(copy) == mirror
    assert _txn_state(from_view) == before
    assert _txn_state(state) == ({"app": 3}, {"7:1": 0, "8:2": 10}, {"9": 5})
    # An append with no transaction copies nothing.
    plain = state.copy()
    plain.apply("add", _add(2))
    assert plain.open_transactions is state.open_transactions


def test_a_producer_action_with_a_field_of_the_wrong_type_is_refused_by_name() -> None:
    """The producer action's fields are checked in one test when all are well typed; any that
    is not is named."""
    state = PartitionState()
    good = {
        "id": "p",
        "epoch": 0,
        "firstSequence": 0,
        "lastSequence": 4,
        "baseOffset": 0,
        "lastOffset": 4,
        "timestamp": 1,
    }
    state.apply("producer", good)
    entry = state.producers["p"]
    assert (entry.epoch, entry.first_sequence, entry.last_sequence) == (0, 0, 4)
    assert (entry.base_offset, entry.last_offset, entry.timestamp_ms) == (0, 4, 1)
    for field, bad in (("id", 5), ("epoch", "0"), ("lastSequence", True), ("lastOffset", None)):
        with pytest.raises(CorruptLogError, match=repr(field)):
            state.apply("producer", {**good, field: bad})
