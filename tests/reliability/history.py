"""Histories of what clients did, and a checker of DESIGN.md §4's invariants 1-7 over them.

Producers record what they sent and what they were told (``send``, ``ack``, ``nack``, ``txn``);
consumers record what they read (``read``, one event per record, with a ``pass``: one continuous
reading of a partition by one consumer, which must never go back); the end of a run records a
final scan of every partition (reads with ``final`` set, and a ``bounds`` event), the topics'
cleanup rules (``topic``) and every version of every consumer-group log (``group_commit``).
Every event is one JSON object; :class:`Recorder` appends them as JSON lines (one file per
process, written with ``O_APPEND`` so a ``kill -9`` loses at most the event being written).

Each record's value is its value id ``"<producer>:<seq>"``, unique in a run, so every read can be
traced to the send that made it.

:func:`check` returns every :class:`Anomaly`, each with the events that prove it:

=====================  ======================================================================
kind                   what it means (invariant)
=====================  ======================================================================
lost                   an acknowledged record is not at its offset in the final scan, and
                       neither retention (below the log start) nor compaction (a later record
                       of its key) may have removed it (1)
offset-conflict        two different records were seen or acknowledged at one offset (2)
offset-order           the final scan's offsets are not strictly increasing (2)
read-went-back         one pass read an offset at or below one it had already read (2, 3)
skipped                a ``read_committed`` pass read two offsets of a partition in turn but
                       not a committed record between them that the final scan holds (a record
                       retention removed first is below the final log start, so no skip) (1, 3)
producer-order         one producer's records to one partition are out of send order (2)
duplicate              one sent record is at two offsets (4)
phantom                a record was read that no producer sent
aborted-visible        ``read_committed`` returned a record of an aborted transaction (3)
open-visible           ``read_committed`` returned a record of a transaction before its producer
                       asked to commit it, or one whose transaction never committed (3)
partial-transaction    part of a transaction's appended records are visible after it ended (3)
compaction-lost-latest the latest record of a key in a compacted topic is gone (5)
fenced-commit          a group log holds an offset commit its member was not allowed to make
                       (not a member, a newer generation, or a partition it did not own) (7)
zombie-commit-accepted a member known to be expelled was told its offset commit succeeded (7)
corruption-seen        a client or job was refused a file as corrupt or missing (a half-written
                       commit or segment, or a file deleted under a reader) (3, 6)
tombstone-resurrected  in a compacted topic, a key's latest record is a tombstone that
                       compaction removed, yet an earlier record of the key is still there (5)
copy-incomplete        a copy that was let catch up (a ``copy_complete`` event) lacks a record
                       its source topic holds in the final scan
=====================  ======================================================================

A tombstone (``send`` with ``tombstone`` set; a null value) carries its value id in a header;
readers record that id as the ``value`` of the read, with ``tombstone`` set. A compacted topic
may drop a tombstone that is the latest record of its key (after ``delete.retention.ms``),
so its absence is no loss, but then no earlier record of the key may remain.

Clients record their errors (``error`` events, ``"<ErrorType>: <message>"``); those that are
expected under injected faults (``StorageError``, conflicts, fencing, commit failures) are not
anomalies, but a refusal of a file as corrupt or missing is.
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Event = dict[str, Any]
TP = tuple[str, int]
# Event times come from the real wall clock even in a process whose ``time.time`` is skewed
# (bound at import, before a worker shifts its clock): the checker compares them across
# processes.
_wall_clock = time.time

ANOMALY_KINDS = (
    "lost",
    "offset-conflict",
    "offset-order",
    "read-went-back",
    "skipped",
    "producer-order",
    "duplicate",
    "phantom",
    "aborted-visible",
    "open-visible",
    "partial-transaction",
    "compaction-lost-latest",
    "fenced-commit",
    "zombie-commit-accepted",
    "corruption-seen",
    "tombstone-resurrected",
    "copy-incomplete",
)
# Errors that mean a reader met a half-written, corrupt or prematurely deleted file.
CORRUPTION_ERRORS = (
    "CorruptLogError",
    "MissingSegmentError",
    "CorruptRecordError",
    "UnsupportedFormatVersionError",
)


def value_id(producer: str, seq: int) -> str:
    return f"{producer}:{seq}"


class Recorder:
    """Appends events to a JSON-lines file; thread-safe; survives ``kill -9`` of its process
    (each event is one ``write`` to a file opened with ``O_APPEND``)."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def __call__(self, ev: str, **fields: Any) -> None:
        event = {"ev": ev, "t": _wall_clock(), **fields}
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def load_events(directory: str) -> list[Event]:
    """Every event of every ``*.jsonl`` file in ``directory`` (a line cut short is skipped)."""
    events: list[Event] = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            for line in f:
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue
    return events


@dataclass
class Anomaly:
    kind: str
    message: str
    evidence: list[Event] = field(default_factory=list)

    def __str__(self) -> str:
        shown = "\n".join(f"      {json.dumps(e, sort_keys=True)}" for e in self.evidence[:8])
        more = f"\n      ... {len(self.evidence) - 8} more" if len(self.evidence) > 8 else ""
        return f"[{self.kind}] {self.message}\n    evidence:\n{shown}{more}"


@dataclass
class Summary:
    sent: int = 0
    acked: int = 0
    reads: int = 0
    final_records: int = 0
    transactions: dict[str, int] = field(default_factory=dict)
    group_versions: int = 0
    offset_commits_checked: int = 0


@dataclass
class Result:
    anomalies: list[Anomaly]
    summary: Summary

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def kinds(self) -> set[str]:
        return {a.kind for a in self.anomalies}

    def report(self) -> str:
        s = self.summary
        head = (
            f"history: {s.sent} sent, {s.acked} acknowledged, {s.reads} reads, "
            f"{s.final_records} records in the final scan, transactions {s.transactions}, "
            f"{s.group_versions} group-log versions ({s.offset_commits_checked} offset commits "
            f"checked); {len(self.anomalies)} anomalies"
        )
        return "\n".join([head, *(str(a) for a in self.anomalies)])


def check(events: Iterable[Event]) -> Result:
    """Every anomaly in a history (see the module docstring)."""
    return _Checker(list(events)).run()


class _Checker:
    def __init__(self, events: list[Event]) -> None:
        self.events = events
        self.anomalies: list[Anomaly] = []
        self.summary = Summary()
        by: dict[str, list[Event]] = defaultdict(list)
        for e in events:
            by[str(e.get("ev"))].append(e)
        self.by = by
        self.sends: dict[str, Event] = {e["value"]: e for e in by["send"]}
        self.acks: dict[str, Event] = {}
        for e in by["ack"]:
            self.acks.setdefault(e["value"], e)
        self.txn_outcome: dict[str, str] = {}
        self.txn_commit_asked: dict[str, float] = {}
        for e in by["txn"]:
            if e["outcome"] == "committing":
                self.txn_commit_asked.setdefault(e["txn"], float(e["t"]))
            else:
                self.txn_outcome[e["txn"]] = e["outcome"]
        self.topics: dict[str, Event] = {e["topic"]: e for e in by["topic"]}
        self.bounds: dict[TP, Event] = {(e["topic"], int(e["partition"])): e for e in by["bounds"]}
        self.final = [e for e in by["read"] if e.get("final")]
        self.final_rc = [e for e in self.final if e.get("iso") == "rc"]
        self.live = [e for e in by["read"] if not e.get("final")]

    def add(self, kind: str, message: str, evidence: Sequence[Event]) -> None:
        self.anomalies.append(Anomaly(kind, message, list(evidence)))

    def txn_of(self, vid: str) -> str | None:
        send = self.sends.get(vid)
        return None if send is None else send.get("txn")

    def must_exist(self, vid: str) -> bool:
        """Acknowledged, and (for a transaction) its transaction acknowledged as committed."""
        if vid not in self.acks:
            return False
        txn = self.txn_of(vid)
        return txn is None or self.txn_outcome.get(txn) == "commit"

    def compacted(self, topic: str) -> bool:
        return bool(self.topics.get(topic, {}).get("compacted"))

    # -- the checks ----------------------------------------------------------------------------

    def run(self) -> Result:
        s = self.summary
        s.sent, s.acked = len(self.sends), len(self.acks)
        s.reads, s.final_records = len(self.live), len(self.final_rc)
        outcomes: dict[str, int] = defaultdict(int)
        for txn in {e["txn"] for e in self.by["txn"]} | {
            e["txn"] for e in self.by["send"] if e.get("txn")
        }:
            outcomes[self.txn_outcome.get(txn, "unknown")] += 1
        s.transactions = dict(sorted(outcomes.items()))
        self.check_offsets()
        self.check_passes()
        self.check_skips()
        self.check_final_order()
        self.check_lost()
        self.check_producer_order()
        self.check_transactions()
        self.check_compaction()
        self.check_group_logs()
        self.check_zombies()
        self.check_errors()
        self.check_copies()
        return Result(self.anomalies, self.summary)

    def observations(self) -> Iterator[Event]:
        """Every event that places a record at an offset: acknowledgements and reads."""
        yield from self.by["ack"]
        yield from self.by["read"]

    def check_offsets(self) -> None:
        at: dict[tuple[str, int, int], dict[str, Event]] = defaultdict(dict)
        where: dict[str, dict[tuple[str, int, int], Event]] = defaultdict(dict)
        for e in self.observations():
            vid = e["value"]
            if vid is not None and vid not in self.sends:
                if e["ev"] == "read":
                    self.add("phantom", f"read a record no producer sent: {vid!r}", [e])
                continue
            key = (e["topic"], int(e["partition"]), int(e["offset"]))
            at[key].setdefault(vid, e)
            where[vid].setdefault(key, e)
        for (topic, p, offset), seen in sorted(at.items()):
            if len(seen) > 1:
                self.add(
                    "offset-conflict",
                    f"{topic}-{p} offset {offset} holds {len(seen)} different records "
                    f"{sorted(seen)}",
                    list(seen.values()),
                )
        for vid, all_places in where.items():
            per_topic: dict[str, dict[tuple[str, int, int], Event]] = defaultdict(dict)
            for place, e in all_places.items():
                per_topic[place[0]][place] = e  # a copy into another topic is no duplicate
            for places in per_topic.values():
                if len(places) <= 1:
                    continue
                self.add(
                    "duplicate",
                    f"record {vid} is at {len(places)} offsets {sorted(places)}",
                    [self.sends[vid], *places.values()],
                )

    def check_passes(self) -> None:
        last: dict[tuple[str, str, int], Event] = {}
        for e in self.live:
            key = (str(e["pass"]), e["topic"], int(e["partition"]))
            before = last.get(key)
            if before is not None and int(e["offset"]) <= int(before["offset"]):
                self.add(
                    "read-went-back",
                    f"pass {e['pass']} read {e['topic']}-{e['partition']} offset {e['offset']} "
                    f"after offset {before['offset']}",
                    [before, e],
                )
            last[key] = e

    def check_skips(self) -> None:
        """A pass reads every committed record between two it read in turn: offsets are
        given out in order, a read_committed reader stops before an open transaction, and
        what retention or compaction removes is gone for good, so a record the final scan
        still holds between them was there to read."""
        final: dict[TP, list[int]] = defaultdict(list)
        for e in self.final_rc:
            final[(e["topic"], int(e["partition"]))].append(int(e["offset"]))
        for offsets in final.values():
            offsets.sort()
        last: dict[tuple[str, str, int], Event] = {}
        for e in self.live:
            if e.get("iso") != "rc":
                continue
            tp = (e["topic"], int(e["partition"]))
            key = (str(e["pass"]), *tp)
            before = last.get(key)
            last[key] = e
            if before is None or int(e["offset"]) <= int(before["offset"]):
                continue  # a first read, or one check_passes reports
            offsets = final.get(tp, [])
            i = bisect.bisect_right(offsets, int(before["offset"]))
            if i < len(offsets) and offsets[i] < int(e["offset"]):
                self.add(
                    "skipped",
                    f"pass {e['pass']} read {tp[0]}-{tp[1]} offset {e['offset']} right after "
                    f"offset {before['offset']}, skipping offset {offsets[i]}, which the final "
                    "scan holds",
                    [before, e],
                )

    def check_final_order(self) -> None:
        for iso in ("rc", "ru"):
            last: dict[TP, Event] = {}
            for e in self.final:
                if e.get("iso") != iso:
                    continue
                tp = (e["topic"], int(e["partition"]))
                before = last.get(tp)
                if before is not None and int(e["offset"]) <= int(before["offset"]):
                    self.add(
                        "offset-order",
                        f"final scan of {tp[0]}-{tp[1]}: offset {e['offset']} after "
                        f"{before['offset']}",
                        [before, e],
                    )
                last[tp] = e

    def final_at(self) -> dict[tuple[str, int, int], Event]:
        return {(e["topic"], int(e["partition"]), int(e["offset"])): e for e in self.final_rc}

    def later_of_key(self) -> dict[tuple[str, int, str], int]:
        """(topic, partition, key) -> the highest offset known to hold a record of that key
        that is committed (acknowledged or in the final scan)."""
        latest: dict[tuple[str, int, str], int] = {}
        for e in [*self.acks.values(), *self.final_rc]:
            if e["ev"] == "ack" and not self.must_exist(e["value"]):
                continue
            key = self.sends.get(e["value"], {}).get("key")
            if key is None:
                continue
            k = (e["topic"], int(e["partition"]), key)
            latest[k] = max(latest.get(k, -1), int(e["offset"]))
        return latest

    def removable(self, e: Event, latest: Mapping[tuple[str, int, str], int]) -> str | None:
        """Why the record of ack or read event ``e`` may be absent from the final scan."""
        tp = (e["topic"], int(e["partition"]))
        bounds = self.bounds.get(tp)
        if bounds is None:
            return "no final scan of its partition"
        if int(e["offset"]) < int(bounds["log_start"]):
            return "below the log start (retention)"
        key = self.sends.get(e["value"], {}).get("key")
        if (
            self.compacted(tp[0])
            and key is not None
            and latest.get((tp[0], tp[1], key), -1) > int(e["offset"])
        ):
            return "a later record of its key (compaction)"
        if self.compacted(tp[0]) and self.sends.get(e["value"], {}).get("tombstone"):
            return "a tombstone (compaction drops it after delete.retention.ms)"
        return None

    def check_lost(self) -> None:
        final = self.final_at()
        latest = self.later_of_key()
        for vid, ack in sorted(self.acks.items()):
            if not self.must_exist(vid):
                continue
            key = (ack["topic"], int(ack["partition"]), int(ack["offset"]))
            if key in final or self.removable(ack, latest):
                continue
            self.add(
                "lost",
                f"acknowledged record {vid} is not at {key[0]}-{key[1]} offset {key[2]} "
                f"(log start {self.bounds[key[:2]]['log_start']}, end {self.bounds[key[:2]]['end']})",
                [self.sends[vid], ack],
            )

    def check_producer_order(self) -> None:
        streams: dict[tuple[str, str, int], list[tuple[int, int, Event]]] = defaultdict(list)
        for vid, ack in self.acks.items():
            send = self.sends[vid]
            streams[(send["producer"], ack["topic"], int(ack["partition"]))].append(
                (int(send["seq"]), int(ack["offset"]), ack)
            )
        for e in self.final_rc:
            send = self.sends.get(e["value"])
            if send is not None and e["value"] not in self.acks:
                streams[(send["producer"], e["topic"], int(e["partition"]))].append(
                    (int(send["seq"]), int(e["offset"]), e)
                )
        for (producer, topic, p), items in streams.items():
            if self.topics.get(topic, {}).get("derived"):
                continue  # a copy made by a job keeps no producer's order
            items.sort(key=lambda i: i[0])
            for (s1, o1, e1), (s2, o2, e2) in itertools.pairwise(items):
                if o2 <= o1:
                    self.add(
                        "producer-order",
                        f"producer {producer} to {topic}-{p}: send {s2} is at offset {o2}, "
                        f"before send {s1} at offset {o1}",
                        [e1, e2],
                    )

    def check_transactions(self) -> None:
        final_vids = {e["value"] for e in self.final_rc}
        latest = self.later_of_key()
        for e in self.by["read"]:
            if e.get("iso") != "rc":
                continue
            txn = self.txn_of(e["value"])
            if txn is None:
                continue
            outcome = self.txn_outcome.get(txn, "unknown")
            asked = self.txn_commit_asked.get(txn)
            if outcome == "abort":
                self.add(
                    "aborted-visible",
                    f"read_committed returned {e['value']} of aborted transaction {txn}",
                    [self.sends[e["value"]], e],
                )
            elif asked is None or float(e["t"]) < asked:
                self.add(
                    "open-visible",
                    f"read_committed returned {e['value']} of transaction {txn} "
                    + (
                        "whose commit was never asked for"
                        if asked is None
                        else f"{float(asked) - float(e['t']):.3f} s before its commit was asked for"
                    ),
                    [self.sends[e["value"]], e],
                )
            elif (
                outcome != "commit"
                and e["value"] not in final_vids
                and not self.removable(e, latest)
            ):
                self.add(
                    "open-visible",
                    f"read_committed returned {e['value']} of transaction {txn} (outcome "
                    f"{outcome}), which the final scan does not hold",
                    [self.sends[e["value"]], e],
                )
        by_txn: dict[str, list[str]] = defaultdict(list)
        for vid, send in self.sends.items():
            if send.get("txn") and vid in self.acks:
                by_txn[send["txn"]].append(vid)
        for txn, vids in by_txn.items():
            visible = [v for v in vids if v in final_vids]
            missing = [
                v for v in vids if v not in final_vids and not self.removable(self.acks[v], latest)
            ]
            if visible and missing:
                self.add(
                    "partial-transaction",
                    f"transaction {txn} ({self.txn_outcome.get(txn, 'unknown')}): "
                    f"{len(visible)} of its appended records are visible, {len(missing)} are not "
                    f"(e.g. {missing[:3]})",
                    [self.acks[v] for v in missing[:4]] + [self.acks[v] for v in visible[:4]],
                )

    def check_compaction(self) -> None:
        final = self.final_at()
        latest: dict[tuple[str, int, str], Event] = {}
        for vid, ack in self.acks.items():
            key = self.sends[vid].get("key")
            if key is None or not self.compacted(ack["topic"]) or not self.must_exist(vid):
                continue
            k = (ack["topic"], int(ack["partition"]), key)
            if k not in latest or int(ack["offset"]) > int(latest[k]["offset"]):
                latest[k] = ack
        for e in self.final_rc:
            key = self.sends.get(e["value"], {}).get("key")
            if key is None or not self.compacted(e["topic"]):
                continue
            k = (e["topic"], int(e["partition"]), key)
            if k not in latest or int(e["offset"]) > int(latest[k]["offset"]):
                latest[k] = e
        final_of_key: dict[tuple[str, int, str], list[Event]] = defaultdict(list)
        for e in self.final_rc:
            key = self.sends.get(e["value"], {}).get("key")
            if key is not None and self.compacted(e["topic"]):
                final_of_key[(e["topic"], int(e["partition"]), key)].append(e)
        for (topic, p, key), e in sorted(latest.items()):
            bounds = self.bounds.get((topic, p))
            if bounds is None or int(e["offset"]) < int(bounds["log_start"]):
                continue
            if (topic, p, int(e["offset"])) in final:
                continue
            if self.sends.get(e["value"], {}).get("tombstone"):
                older = [o for o in final_of_key[(topic, p, key)] if o["offset"] < e["offset"]]
                if older:
                    self.add(
                        "tombstone-resurrected",
                        f"{topic}-{p} key {key!r}: its latest record, tombstone {e['value']} at "
                        f"offset {e['offset']}, was removed but {len(older)} earlier record(s) "
                        f"remain (e.g. {older[0]['value']} at offset {older[0]['offset']})",
                        [e, *older[:4]],
                    )
            else:
                self.add(
                    "compaction-lost-latest",
                    f"{topic}-{p} key {key!r}: its latest record {e['value']} at offset "
                    f"{e['offset']} is gone",
                    [e, bounds],
                )

    def check_copies(self) -> None:
        """A copy let catch up with its source holds every record of the source's final
        scan (its completeness; duplicates and phantoms are checked with every topic)."""
        for done in self.by["copy_complete"]:
            source, target = done["source"], done["target"]
            copied = {e["value"] for e in self.final_rc if e["topic"] == target}
            missing = [
                e for e in self.final_rc if e["topic"] == source and e["value"] not in copied
            ]
            if missing:
                self.add(
                    "copy-incomplete",
                    f"{target}, a copy of {source} that caught up, lacks {len(missing)} of the "
                    f"source's records (e.g. {[e['value'] for e in missing[:3]]})",
                    [done, *missing[:6]],
                )

    def check_group_logs(self) -> None:
        from kstore.groups import GroupState
        from kstore.records import TopicPartition

        logs: dict[str, dict[int, Event]] = defaultdict(dict)
        for e in self.by["group_commit"]:
            logs[e["group"]][int(e["version"])] = e
        # A group log whose early versions were pruned (a run with jumps of time) starts from
        # its oldest kept checkpoint: the state to check the later versions against.
        bases = {e["group"]: e for e in self.by["group_base"]}
        for group, versions in sorted(logs.items()):
            state = GroupState()
            if group in bases:
                for action in bases[group]["actions"]:
                    name, body = next(iter(action.items()))
                    state.apply(name, body)
            for version in sorted(versions):
                self.summary.group_versions += 1
                e = versions[version]
                for action in e["actions"]:
                    name, body = next(iter(action.items()))
                    if name != "offsets" or body.get("memberId") == "admin":
                        continue
                    self.summary.offset_commits_checked += 1
                    member, generation = str(body["memberId"]), int(body["generation"])
                    committed = {
                        TopicPartition(str(i["topic"]), int(i["partition"]))
                        for i in body["offsets"]
                    }
                    releasing = {tp for tp, m in state.pending_release.items() if m == member}
                    awaiting = {tp for tp, m in state.pending_release.items() if m != member}
                    allowed = (set(state.assignment.get(member, [])) - awaiting) | releasing
                    why = None
                    if member not in state.members:
                        why = "it was not a member"
                    elif generation > state.generation:
                        why = f"its generation {generation} is newer than {state.generation}"
                    elif committed - allowed:
                        foreign = sorted(committed - allowed)
                        why = f"it did not own {[f'{t}-{p}' for t, p in foreign]}"
                    if why:
                        self.add(
                            "fenced-commit",
                            f"group {group} version {version}: offset commit by {member} "
                            f"accepted although {why} (generation {state.generation})",
                            [e],
                        )
                for action in e["actions"]:
                    name, body = next(iter(action.items()))
                    state.apply(name, body)
                state.version = version

    def check_zombies(self) -> None:
        for e in self.by["zombie_commit"]:
            if e["outcome"] == "ok":
                self.add(
                    "zombie-commit-accepted",
                    f"group {e['group']}: member {e['member']}, expelled, was told its offset "
                    "commit succeeded",
                    [e],
                )

    def check_errors(self) -> None:
        for e in self.by["error"]:
            error = str(e.get("error", ""))
            if error.split(":", 1)[0].strip() in CORRUPTION_ERRORS:
                self.add(
                    "corruption-seen",
                    f"{e.get('who', '?')} was refused a file: {error[:300]}",
                    [e],
                )
