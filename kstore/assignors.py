"""Partition assignors: given live members and their subscriptions, who reads what.

Pure functions of their inputs, so every member that computes an assignment for the same
group state computes the same one; the group log decides which computation is published.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kstore.errors import InvalidConfigurationError
from kstore.records import TopicPartition

Assignment = dict[str, list[TopicPartition]]


def range_assign(
    members: Mapping[str, Sequence[str]],
    partitions: Mapping[str, int],
    previous: Assignment | None = None,
) -> Assignment:
    """Kafka's RangeAssignor: per topic, contiguous ranges to the sorted subscribers."""
    out: Assignment = {m: [] for m in members}
    for topic in sorted(partitions):
        subscribers = sorted(m for m, topics in members.items() if topic in topics)
        if not subscribers:
            continue
        count = partitions[topic]
        per, extra = divmod(count, len(subscribers))
        start = 0
        for i, member in enumerate(subscribers):
            size = per + (1 if i < extra else 0)
            out[member].extend(TopicPartition(topic, p) for p in range(start, start + size))
            start += size
    return out


def roundrobin_assign(
    members: Mapping[str, Sequence[str]],
    partitions: Mapping[str, int],
    previous: Assignment | None = None,
) -> Assignment:
    """Kafka's RoundRobinAssignor: all partitions dealt in turn to the sorted subscribers."""
    out: Assignment = {m: [] for m in members}
    ordered = sorted(members)
    i = 0
    for topic in sorted(partitions):
        for p in range(partitions[topic]):
            for _ in range(len(ordered)):
                member = ordered[i % len(ordered)]
                i += 1
                if topic in members[member]:
                    out[member].append(TopicPartition(topic, p))
                    break
    return out


def sticky_assign(
    members: Mapping[str, Sequence[str]],
    partitions: Mapping[str, int],
    previous: Assignment | None = None,
) -> Assignment:
    """Balanced like round robin, but a partition stays with its previous owner whenever that
    owner is still live, still subscribed, and not over its fair share (Kafka's
    StickyAssignor), so a rebalance moves as few partitions as possible."""
    all_parts = [TopicPartition(t, p) for t in sorted(partitions) for p in range(partitions[t])]
    eligible = {
        tp: sorted(m for m, topics in members.items() if tp.topic in topics) for tp in all_parts
    }
    out: Assignment = {m: [] for m in members}
    if not members:
        return out
    total = sum(1 for tp in all_parts if eligible[tp])
    # Fair shares: everyone gets floor(total/n); the first `extra` members (by id) may hold one more.
    per, extra = divmod(total, len(members))
    limit = {m: per + (1 if i < extra else 0) for i, m in enumerate(sorted(members))}
    taken: set[TopicPartition] = set()
    for member in sorted(previous or {}):
        if member not in members:
            continue
        for tp in sorted((previous or {})[member]):
            if (
                tp in eligible
                and member in eligible[tp]
                and tp not in taken
                and len(out[member]) < limit[member]
            ):
                out[member].append(tp)
                taken.add(tp)
    for tp in all_parts:
        if tp in taken or not eligible[tp]:
            continue
        owner = min(eligible[tp], key=lambda m: (len(out[m]) >= limit[m], len(out[m]), m))
        out[owner].append(tp)
        taken.add(tp)
    for member in out:
        out[member].sort()
    return out


ASSIGNORS = {"range": range_assign, "roundrobin": roundrobin_assign, "sticky": sticky_assign}


def check_assignors(names: Sequence[str]) -> list[str]:
    if isinstance(names, str):
        names = [names]
    chosen = []
    for name in names:
        if name not in ASSIGNORS:
            raise InvalidConfigurationError(
                f"unknown partition assignment strategy {name!r}; use {', '.join(ASSIGNORS)}"
            )
        chosen.append(name)
    if not chosen:
        raise InvalidConfigurationError(
            "partition_assignment_strategy must name at least one assignor"
        )
    return chosen
