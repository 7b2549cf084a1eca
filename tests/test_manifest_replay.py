"""Replaying a partition manifest: the work it does grows linearly with the live segments
(counted, not timed), and the add/remove rules keep their meaning (duplicates, removal by
path, re-adding a removed path, empty segments sharing an offset)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import kstore.manifest as manifest
from kstore.errors import CorruptLogError
from kstore.log import Action, Log, encode_commit, version_file
from kstore.manifest import PartitionState, Segment
from kstore.storage import Storage


class CountingSegment(Segment):
    """A segment that counts reads of its fields: a per-segment scan of the live segments
    (what made opening a partition quadratic) reads a field of every segment it passes."""

    reads = 0

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("__"):
            CountingSegment.reads += 1
        return super().__getattribute__(name)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> type[CountingSegment]:
    monkeypatch.setattr(manifest, "Segment", CountingSegment)
    CountingSegment.reads = 0
    return CountingSegment


def add(path: str, base: int, last: int, **extra: Any) -> Action:
    body = {
        "path": f"segments/{path}.arrow",
        "baseOffset": base,
        "lastOffset": last,
        "records": last - base + 1,
        "minTimestamp": 0,
        "maxTimestamp": base,
        "size": 100,
        "checksum": "crc32c:00000000",
        "format": "arrow",
        "sparse": False,
        "createdTime": 0,
        **extra,
    }
    return {"add": body}


def remove(path: str) -> Action:
    return {"remove": {"path": f"segments/{path}.arrow", "deletionTimestamp": 7}}


def replay(state: PartitionState, actions: list[Action]) -> PartitionState:
    for action in actions:
        ((name, body),) = action.items()
        state.apply(name, body)
    return state


def paths(state: PartitionState) -> list[str]:
    return [s.path.removeprefix("segments/").removesuffix(".arrow") for s in state.segments]


def memory_log() -> Log[PartitionState]:
    return Log(Storage(f"memory://replay-{uuid.uuid4().hex}"), "p/_log", PartitionState)


N = 2_000
# Replay reads a few dozen fields of each segment it adds or removes, plus a binary search;
# a scan of the live segments per action reads N/2 per segment on average (1,000 here).
MAX_READS_PER_SEGMENT = 100


def test_opening_a_checkpoint_reads_each_segment_a_bounded_number_of_times(
    counting: type[CountingSegment],
) -> None:
    log = memory_log()
    state = replay(PartitionState(), [add(f"s{i}", i, i) for i in range(N)])
    state.version = 100
    log.write_checkpoint(state)
    counting.reads = 0
    loaded = log.load()
    assert loaded.version == 100
    assert len(loaded.segments) == N
    assert loaded.end_offset == N
    assert counting.reads <= MAX_READS_PER_SEGMENT * N, counting.reads


def test_replaying_adds_and_removes_reads_each_segment_a_bounded_number_of_times(
    counting: type[CountingSegment],
) -> None:
    """Commits as appends, retention (removes at the front) and compaction (removes and an
    add in the middle) make them, replayed from version 0."""
    log = memory_log()
    commits: list[list[Action]] = [[{"protocol": {"minReaderVersion": 1, "minWriterVersion": 1}}]]
    commits += [[add(f"s{i}", i, i)] for i in range(N)]
    commits.append([remove(f"s{i}") for i in range(N // 4)])  # retention
    for i in range(N // 2, N, 4):  # compaction: four segments become one, in the middle
        commits.append(
            [*(remove(f"s{j}") for j in range(i, i + 4)), add(f"c{i}", i, i + 3, sparse=True)]
        )
    for version, actions in enumerate(commits):
        log.storage.put(f"p/_log/{version_file(version)}", encode_commit(actions, {}))
    counting.reads = 0
    state = log.load()
    assert state.version == len(commits) - 1
    assert len(state.segments) == N // 4 + N // 8
    assert counting.reads <= MAX_READS_PER_SEGMENT * len(commits), counting.reads
    # Time travel replays the same commits.
    counting.reads = 0
    assert paths(log.load_version(len(commits) - 1)) == paths(state)
    assert counting.reads <= MAX_READS_PER_SEGMENT * len(commits), counting.reads


def test_time_travel_copies_no_state_per_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of the state per replayed commit costs the live segments each time."""
    copies = 0
    real_copy = PartitionState.copy

    def counting_copy(self: PartitionState) -> PartitionState:
        nonlocal copies
        copies += 1
        return real_copy(self)

    monkeypatch.setattr(PartitionState, "copy", counting_copy)
    log = memory_log()
    for version in range(50):
        log.storage.put(
            f"p/_log/{version_file(version)}",
            encode_commit([add(f"s{version}", version, version)], {}),
        )
    state = log.load_version(49)
    assert state.version == 49
    assert len(state.segments) == 50
    assert copies <= 1


def test_a_path_is_live_at_most_once_and_removed_only_when_live() -> None:
    state = replay(PartitionState(), [add("a", 0, 9), add("b", 10, 19)])
    with pytest.raises(CorruptLogError, match="the path is already a live segment"):
        state.copy().apply("add", add("a", 20, 29)["add"])
    with pytest.raises(CorruptLogError, match="overlaps a live segment"):
        state.copy().apply("add", add("c", 15, 25)["add"])
    with pytest.raises(CorruptLogError, match="not a live segment"):
        state.copy().apply("remove", remove("zzz")["remove"])
    # Removed, the path is free again: remove twice fails, re-adding works.
    gone = replay(state.copy(), [remove("a")])
    assert paths(gone) == ["b"]
    assert gone.removed == {"segments/a.arrow": 7}
    with pytest.raises(CorruptLogError, match="not a live segment"):
        gone.copy().apply("remove", remove("a")["remove"])
    back = replay(gone.copy(), [add("a", 20, 29)])
    assert paths(back) == ["b", "a"]
    assert back.removed == {}
    assert back.end_offset == 30
    # Each copy keeps its own segments.
    assert paths(state) == ["a", "b"]
    assert paths(gone) == ["b"]


def test_removal_by_path_among_empty_segments_at_one_offset() -> None:
    """An empty segment (lastOffset = baseOffset - 1) shares its base offset with others:
    removing one by path removes that one, whatever its place among them."""
    state = replay(
        PartitionState(),
        [add("x", 0, 4), add("e1", 5, 4), add("e2", 5, 4), add("y", 5, 9), add("e3", 10, 9)],
    )
    assert paths(state) == ["x", "e1", "e2", "y", "e3"]
    for name, left in [("e2", ["x", "e1", "y", "e3"]), ("y", ["x", "e1", "e3"])]:
        replay(state, [remove(name)])
        assert paths(state) == left
    replay(state, [add("z", 5, 9)])  # the range y left is free again
    assert paths(state) == ["x", "e1", "z", "e3"]
    assert [state.segment_index_for(o) for o in (0, 5, 9, 10)] == [0, 2, 2, 4]


def test_segments_added_out_of_order_are_kept_sorted() -> None:
    state = replay(PartitionState(), [add("a", 0, 9), add("c", 20, 29), add("b", 10, 19)])
    assert paths(state) == ["a", "b", "c"]
    replay(state, [remove("a"), remove("b"), add("ab", 0, 19, sparse=True)])
    assert paths(state) == ["ab", "c"]
    assert state.segments_for_time(15) == 1  # the time index follows the changes
    with pytest.raises(CorruptLogError, match="overlaps"):
        state.copy().apply("add", add("d", 25, 35)["add"])


def test_assigned_segments_are_indexed_by_path() -> None:
    state = PartitionState()
    state.segments = [
        Segment(f"segments/{i}", i, i, 1, 0, 0, 1, "crc32c:0", "arrow", False, 0) for i in range(3)
    ]
    state.end_offset = 3
    state.apply("remove", {"path": "segments/1", "deletionTimestamp": 1})
    assert [s.path for s in state.segments] == ["segments/0", "segments/2"]
    with pytest.raises(CorruptLogError, match="already a live segment"):
        state.apply("add", {**add("x", 3, 3)["add"], "path": "segments/2"})


def test_checkpoint_round_trip_keeps_the_segments() -> None:
    actions: list[Action] = [add(f"s{i}", i * 10, i * 10 + 9) for i in range(20)]
    actions += [remove(f"s{i}") for i in range(0, 20, 3)]
    state = replay(PartitionState(), actions)
    rebuilt = replay(PartitionState(), state.checkpoint_actions())
    assert rebuilt.segments == state.segments
    assert rebuilt.removed == state.removed
    assert rebuilt.end_offset == state.end_offset
