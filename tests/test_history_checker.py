"""The history checker of the reliability suites finds every kind of anomaly it claims to, in
hand-made histories, and passes a good one: it cannot silently pass a broken run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.reliability.history import ANOMALY_KINDS, Recorder, check, load_events

Event = dict[str, Any]


def ev(kind: str, t: float = 0.0, **fields: Any) -> Event:
    return {"ev": kind, "t": t, **fields}


def send(producer: str, seq: int, key: str | None = None, txn: str | None = None) -> Event:
    return ev(
        "send", producer=producer, seq=seq, topic="t", key=key, value=f"{producer}:{seq}", txn=txn
    )


def ack(producer: str, seq: int, partition: int, offset: int, t: float = 0.0) -> Event:
    return ev(
        "ack",
        t,
        producer=producer,
        seq=seq,
        topic="t",
        partition=partition,
        offset=offset,
        value=f"{producer}:{seq}",
    )


def read(
    vid: str,
    partition: int,
    offset: int,
    *,
    final: bool = False,
    iso: str = "rc",
    pass_: str = "c1",
    t: float = 10.0,
) -> Event:
    return ev(
        "read",
        t,
        reader="c",
        **{"pass": pass_},
        iso=iso,
        final=final,
        topic="t",
        partition=partition,
        offset=offset,
        value=vid,
    )


def bounds(partition: int, log_start: int, end: int) -> Event:
    return ev("bounds", topic="t", partition=partition, log_start=log_start, end=end)


def good_history(compacted: bool = False) -> list[Event]:
    """Producer a sends 0..3 to partition 0 (keys k0,k1,k0,k1); everything acknowledged, read
    live and found by the final scan."""
    events: list[Event] = [ev("topic", topic="t", compacted=compacted)]
    for seq in range(4):
        events += [send("a", seq, key=f"k{seq % 2}"), ack("a", seq, 0, seq)]
    events += [read(f"a:{i}", 0, i) for i in range(4)]
    events += [read(f"a:{i}", 0, i, final=True) for i in range(4)]
    events += [read(f"a:{i}", 0, i, final=True, iso="ru") for i in range(4)]
    events.append(bounds(0, 0, 4))
    return events


def group_join(member: str) -> dict[str, Any]:
    return {
        "join": {
            "memberId": member,
            "clientId": "c",
            "topics": ["t"],
            "assignors": ["range"],
            "sessionTimeoutMs": 10_000,
            "rebalanceTimeoutMs": 10_000,
            "time": 1,
        }
    }


def group_assign(generation: int, members: dict[str, list[list[Any]]]) -> dict[str, Any]:
    return {"assignment": {"generation": generation, "assignor": "range", "members": members}}


def group_offsets(member: str, generation: int, partition: int) -> dict[str, Any]:
    return {
        "offsets": {
            "memberId": member,
            "generation": generation,
            "time": 1,
            "offsets": [{"topic": "t", "partition": partition, "offset": 3}],
        }
    }


def group_log(*commits: list[dict[str, Any]]) -> list[Event]:
    return [
        ev("group_commit", group="g", version=v, actions=actions)
        for v, actions in enumerate(commits)
    ]


def kinds_of(events: list[Event]) -> set[str]:
    result = check(events)
    print(result.report())
    return result.kinds()


# --- a good history passes ----------------------------------------------------------------------


@pytest.mark.parametrize("compacted", [False, True])
def test_a_good_history_has_no_anomaly(compacted: bool) -> None:
    events = good_history(compacted) + group_log(
        [group_join("m1"), group_assign(1, {"m1": [["t", 0]]})],
        [group_offsets("m1", 1, 0)],
    )
    result = check(events)
    assert result.ok, result.report()
    assert result.summary.offset_commits_checked == 1
    assert result.summary.acked == 4


def test_retention_and_compaction_removals_are_not_losses() -> None:
    events = good_history(compacted=True)
    events = [e for e in events if not (e.get("final") and e["value"] in ("a:0", "a:1"))]
    events = [e for e in events if e["ev"] != "bounds"] + [bounds(0, 1, 4)]
    # a:0 is below the log start (retention); a:1 (key k1) has a later record a:3 (compaction)
    assert check(events).ok


# --- each anomaly kind is found ---------------------------------------------------------------


def test_lost_acknowledged_record() -> None:
    events = [e for e in good_history() if not (e.get("final") and e["value"] == "a:1")]
    assert kinds_of(events) == {"lost"}


def test_a_record_missing_from_a_compacted_topic_without_a_later_key_is_lost() -> None:
    events = [e for e in good_history(True) if not (e.get("final") and e["value"] == "a:3")]
    assert kinds_of(events) == {"lost", "compaction-lost-latest"}


def test_compaction_keeping_an_old_value_but_dropping_the_latest() -> None:
    events = good_history(True)
    # the final scan lost a:2 (latest of k0) but kept a:0
    events = [e for e in events if not (e.get("final") and e["value"] == "a:2")]
    assert "compaction-lost-latest" in kinds_of(events)


def test_two_records_at_one_offset() -> None:
    events = [*good_history(), send("b", 0), read("b:0", 0, 2, pass_="c2")]
    assert "offset-conflict" in kinds_of(events)


def test_final_scan_offsets_not_increasing() -> None:
    events = good_history()
    events += [read("a:0", 0, 0, final=True)]  # the scan repeats offset 0 at its end
    assert "offset-order" in kinds_of(events)


def test_a_pass_that_reads_a_record_twice() -> None:
    events = [*good_history(), read("a:2", 0, 2)]
    assert kinds_of(events) == {"read-went-back"}


def test_a_new_pass_may_read_again() -> None:
    events = [*good_history(), read("a:2", 0, 2, pass_="c2")]
    assert check(events).ok


def test_a_pass_that_skips_a_record_the_final_scan_holds() -> None:
    events = [
        e
        for e in good_history()
        if not (e["ev"] == "read" and not e.get("final") and e["value"] == "a:2")
    ]
    assert kinds_of(events) == {"skipped"}


def test_a_pass_may_skip_what_retention_removed_before_it_got_there() -> None:
    """The reader fell behind: retention removed offsets 1-2 (below the final log start), the
    reader went on from the log start. No record is lost or skipped."""
    events = [
        e
        for e in good_history()
        if not (e["ev"] == "read" and e["value"] in ("a:1", "a:2")) and e["ev"] != "bounds"
    ]
    events.append(bounds(0, 3, 4))
    assert check(events).ok, check(events).report()


def test_producer_order_broken() -> None:
    events = [ev("topic", topic="t", compacted=False)]
    events += [send("a", 0), ack("a", 0, 0, 1), send("a", 1), ack("a", 1, 0, 0)]
    events += [read("a:1", 0, 0, final=True), read("a:0", 0, 1, final=True), bounds(0, 0, 2)]
    assert kinds_of(events) == {"producer-order"}


def test_duplicate_record() -> None:
    events = [*good_history(), read("a:3", 0, 4, final=True), read("a:3", 0, 4, pass_="c2")]
    events = [e for e in events if e["ev"] != "bounds"] + [bounds(0, 0, 5)]
    assert kinds_of(events) == {"duplicate"}


def test_phantom_record() -> None:
    events = [*good_history(), read("zz:9", 0, 7, pass_="c9")]
    assert kinds_of(events) == {"phantom"}


def txn_history(
    outcome: str | None, *, read_at: float = 10.0, asked_at: float = 5.0
) -> list[Event]:
    events = [ev("topic", topic="t", compacted=False)]
    events += [send("x", 0, txn="x#1"), ack("x", 0, 1, 0), send("x", 1, txn="x#1")]
    events += [ack("x", 1, 1, 1)]
    if outcome is not None:
        events.append(ev("txn", asked_at, producer="x", txn="x#1", outcome="committing"))
        events.append(ev("txn", asked_at + 1, producer="x", txn="x#1", outcome=outcome))
    events.append(bounds(1, 0, 3))
    return events


def test_committed_transaction_is_fine() -> None:
    events = [
        *txn_history("commit"),
        read("x:0", 1, 0, final=True),
        read("x:1", 1, 1, final=True),
        read("x:0", 1, 0),
        read("x:1", 1, 1),
    ]
    assert check(events).ok


def test_aborted_transaction_seen_by_read_committed() -> None:
    events = [*txn_history("abort"), read("x:0", 1, 0)]
    assert kinds_of(events) == {"aborted-visible"}


def test_read_committed_seeing_a_transaction_before_its_commit() -> None:
    events = [
        *txn_history("commit", asked_at=20.0),
        read("x:0", 1, 0, final=True),
        read("x:1", 1, 1, final=True),
        read("x:0", 1, 0, t=10.0),
    ]
    assert kinds_of(events) == {"open-visible"}


def test_read_committed_seeing_a_transaction_never_committed() -> None:
    events = [*txn_history(None), read("x:0", 1, 0)]
    assert kinds_of(events) == {"open-visible"}


def test_committed_transaction_half_visible() -> None:
    events = [*txn_history("commit"), read("x:0", 1, 0, final=True)]
    assert kinds_of(events) == {"partial-transaction", "lost"}


def test_unknown_transaction_half_visible() -> None:
    events = [*txn_history(None), read("x:0", 1, 0, final=True)]
    # read by the final scan (which is read_committed) although never asked to commit
    assert "partial-transaction" in kinds_of(events)


def test_offset_commit_by_a_member_that_left() -> None:
    events = good_history() + group_log(
        [group_join("m1"), group_assign(1, {"m1": [["t", 0]]})],
        [{"leave": {"memberId": "m1", "reason": "r", "time": 1}}],
        [group_offsets("m1", 1, 0)],
    )
    assert kinds_of(events) == {"fenced-commit"}


def test_offset_commit_for_a_partition_that_moved() -> None:
    events = good_history() + group_log(
        [group_join("m1"), group_assign(1, {"m1": [["t", 0]]})],
        [group_join("m2"), group_assign(2, {"m1": [], "m2": [["t", 0]]})],
        [{"release": {"memberId": "m1", "partitions": [["t", 0]]}}],
        [group_offsets("m1", 1, 0)],  # m1 no longer owns t-0 and has released it
    )
    assert kinds_of(events) == {"fenced-commit"}


def test_offset_commit_during_hand_over_by_the_releasing_member_is_allowed() -> None:
    events = good_history() + group_log(
        [group_join("m1"), group_assign(1, {"m1": [["t", 0]]})],
        [group_join("m2"), group_assign(2, {"m1": [], "m2": [["t", 0]]})],
        [group_offsets("m1", 1, 0), {"release": {"memberId": "m1", "partitions": [["t", 0]]}}],
        [group_offsets("m2", 2, 0)],
    )
    assert check(events).ok


def test_offset_commit_from_a_future_generation() -> None:
    events = good_history() + group_log(
        [group_join("m1"), group_assign(1, {"m1": [["t", 0]]})],
        [group_offsets("m1", 5, 0)],
    )
    assert kinds_of(events) == {"fenced-commit"}


def test_zombie_commit_accepted() -> None:
    events = [*good_history(), ev("zombie_commit", group="g", member="m0", outcome="ok")]
    assert kinds_of(events) == {"zombie-commit-accepted"}
    events[-1]["outcome"] = "rejected"
    assert check(events).ok


def test_a_client_refused_a_corrupt_or_missing_file() -> None:
    error = "MissingSegmentError: topics/t/x/0/segments/1-a.arrow is missing"
    events = [*good_history(), ev("error", who="c1", error=error)]
    assert kinds_of(events) == {"corruption-seen"}
    events[-1]["error"] = "StorageError: injected failure before read of x"
    assert check(events).ok


def tombstone_history(*, dropped: bool, keep_old: bool) -> list[Event]:
    """The good compacted history, then a:4, a tombstone of k0 at offset 4 (the latest of k0);
    compaction removed a:0 and a:2, the earlier records of k0, unless ``keep_old``; and the
    tombstone itself when ``dropped``."""
    events = good_history(compacted=True)
    events = [e for e in events if e["ev"] != "bounds"] + [bounds(0, 0, 5)]
    events += [{**send("a", 4, key="k0"), "tombstone": True}, ack("a", 4, 0, 4)]
    events.append({**read("a:4", 0, 4, final=True), "tombstone": True})
    removed = {"a:0", "a:2"} if not keep_old else set()
    if dropped:
        removed.add("a:4")
    return [e for e in events if not (e.get("final") and e["value"] in removed)]


def test_a_tombstone_removed_with_the_records_of_its_key_is_no_loss() -> None:
    assert check(tombstone_history(dropped=False, keep_old=False)).ok
    assert check(tombstone_history(dropped=True, keep_old=False)).ok


def test_a_tombstone_removed_while_an_older_record_of_its_key_stays() -> None:
    events = tombstone_history(dropped=True, keep_old=True)
    assert kinds_of(events) == {"tombstone-resurrected"}
    # While the tombstone is there, the older records may still be (not yet cleaned).
    assert check(tombstone_history(dropped=False, keep_old=True)).ok


def test_a_record_that_is_not_a_tombstone_is_still_the_latest_to_keep() -> None:
    events = tombstone_history(dropped=True, keep_old=False)
    events = [{**e, "tombstone": False} if e.get("value") == "a:4" else e for e in events]
    assert "compaction-lost-latest" in kinds_of(events)


def copy_history(*, copied: list[str], caught_up: bool) -> list[Event]:
    events = good_history()
    events.append(ev("topic", topic="c", compacted=False, derived=True))
    for i, vid in enumerate(copied):
        events.append({**read(vid, 0, i, final=True), "topic": "c"})
    events.append(bounds(0, 0, len(copied)) | {"topic": "c"})
    if caught_up:
        events.append(ev("copy_complete", source="t", target="c"))
    return events


def test_a_copy_that_caught_up_must_hold_every_source_record() -> None:
    assert check(copy_history(copied=["a:0", "a:1", "a:2", "a:3"], caught_up=True)).ok
    events = copy_history(copied=["a:0", "a:1", "a:3"], caught_up=True)
    assert kinds_of(events) == {"copy-incomplete"}
    assert "a:2" in check(events).report()
    # A copy that was stopped before catching up is only checked for duplicates.
    assert check(copy_history(copied=["a:0", "a:1"], caught_up=False)).ok


def test_every_kind_is_covered_by_a_test_here() -> None:
    source = Path(__file__).read_text()
    for kind in ANOMALY_KINDS:
        assert f'"{kind}"' in source.replace(f'"{kind}" in ANOMALY_KINDS', ""), kind


def test_report_prints_the_evidence() -> None:
    events = [e for e in good_history() if not (e.get("final") and e["value"] == "a:1")]
    report = check(events).report()
    assert "1 anomalies" in report
    assert "[lost]" in report
    assert '"value": "a:1"' in report


def test_recorder_round_trip(tmp_path: Path) -> None:
    record = Recorder(str(tmp_path / "h" / "p1.jsonl"))
    for e in good_history():
        fields = {k: v for k, v in e.items() if k not in ("ev", "t")}
        record(e["ev"], **fields)
    record.close()
    (tmp_path / "h" / "p2.jsonl").write_text('{"ev": "read", "cut sh')  # a line cut by a kill
    events = load_events(str(tmp_path / "h"))
    assert len(events) == len(good_history())
    assert check(events).ok
