"""``kstore groups``: what kafka-consumer-groups does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from kstore.cli.common import UsageError
from kstore.cli.options import shared
from kstore.cli.output import Column, TextOutput
from kstore.cli.timeparse import parse_datetime_ms, parse_duration_ms

if TYPE_CHECKING:
    from kstore.groups import GroupDescription
    from kstore.records import TopicPartition
    from kstore.store import Store

app = typer.Typer(
    name="groups",
    help="List, describe, reset the offsets of, and delete consumer groups (kafka-consumer-groups).",
    epilog="Examples:\n\n  kstore groups describe billing\n\n"
    "  kstore groups reset-offsets billing --topic orders --to-earliest --execute",
    no_args_is_help=True,
)

GroupArg = Annotated[
    str, typer.Argument(metavar="GROUP", help="Consumer group id.", show_default=False)
]


def _group_status(store: Store, group_id: str) -> dict[str, Any]:
    from kstore.groups import Group

    group = Group(store, group_id)
    state = group.state()
    live = group.live_members(state)
    status = "Dead" if state.version < 0 or state.deleted else ("Stable" if live else "Empty")
    return {
        "group": group_id,
        "state": status,
        "members": len(live),
        "generation": state.generation,
    }


@app.command(
    "list",
    epilog="Examples:\n\n  kstore groups list\n\n  kstore groups list -o json | jq -r '.[].group'",
)
def list_(
    ctx: typer.Context,
) -> None:
    """List the consumer groups, with their state and number of live members."""
    from kstore.errors import KStoreError
    from kstore.groups import list_groups

    handle = shared(ctx).open_store()
    rows = []
    for name in list_groups(handle):
        try:
            rows.append(_group_status(handle, name))
        except KStoreError as exc:  # listed, so that the problem is visible rather than hidden
            rows.append(
                {
                    "group": name,
                    "state": "Unreadable",
                    "members": None,
                    "generation": None,
                    "error": str(exc),
                }
            )
    shared(ctx).output.table(
        rows,
        [
            Column("GROUP", "group"),
            Column("STATE", "state"),
            Column("MEMBERS", "members", right=True),
            Column("GENERATION", "generation", right=True),
        ],
        empty="No consumer groups.",
    )


def _require_group(store: Store, group_id: str) -> None:
    from kstore.errors import KStoreError
    from kstore.groups import Group

    if not Group(store, group_id).exists():
        raise KStoreError(f"consumer group {group_id!r} does not exist")


def _assignment_of(desc: GroupDescription) -> dict[str, list[TopicPartition]]:
    from kstore.records import TopicPartition

    out: dict[str, list[TopicPartition]] = {m.member_id: [] for m in desc.members}
    for row in desc.partitions:
        if row.member_id is not None:
            out.setdefault(row.member_id, []).append(TopicPartition(row.topic, row.partition))
    return out


def _format_assignment(parts: list[TopicPartition]) -> str:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(parts):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return " ".join(f"{t}:{','.join(map(str, ps))}" for t, ps in by_topic.items()) or "-"


@app.command(
    epilog="Examples:\n\n  kstore groups describe billing\n\n"
    "  kstore groups describe billing -o json | jq '.partitions[] | select(.lag > 0)'",
)
def describe(
    ctx: typer.Context,
    group: Annotated[
        str | None,
        typer.Argument(
            metavar="GROUP", help="Consumer group id (or --all-groups).", show_default=False
        ),
    ] = None,
    all_groups: Annotated[
        bool, typer.Option("--all-groups", help="Describe every group of the store.")
    ] = False,
    members_only: Annotated[
        bool,
        typer.Option("--members", help="Only the members and their assignment, no offsets."),
    ] = False,
) -> None:
    """Members and their assignment, then per partition CURRENT-OFFSET, LOG-END-OFFSET and LAG.

    Every partition of the topics the group reads is listed; one with no committed offset
    shows '-' for CURRENT-OFFSET and LAG.
    """
    from kstore.groups import list_groups

    if all_groups == (group is not None):
        raise UsageError("give a GROUP or --all-groups (not both)")
    handle = shared(ctx).open_store()
    if group is not None:
        _require_group(handle, group)
        names = [group]
    else:
        names = list_groups(handle)
    described = [_describe_one(handle, name, members_only) for name in names]

    def view(text: TextOutput) -> None:
        if not described:
            text.message("No groups.")
        for desc, _ in described:
            _show_group(text, desc, members_only=members_only)

    data = [document for _, document in described]
    shared(ctx).output.record(data[0] if group is not None else data, view)


def _describe_one(
    handle: Store, group: str, members_only: bool
) -> tuple[GroupDescription, dict[str, Any]]:
    """The group's description, and as JSON."""
    from kstore.groups import describe_group

    desc = describe_group(handle, group)
    assignment = _assignment_of(desc)
    data: dict[str, Any] = {
        "group": desc.group_id,
        "state": desc.state,
        "generation": desc.generation,
        "assignor": desc.assignor,
        "total_lag": desc.total_lag,
        "uncommitted_partitions": desc.uncommitted,
        "members": [
            {
                "member_id": m.member_id,
                "client_id": m.client_id,
                "instance_id": m.instance_id,
                "topics": list(m.topics),
                "assignment": [
                    [tp.topic, tp.partition] for tp in sorted(assignment.get(m.member_id, []))
                ],
            }
            for m in desc.members
        ],
    }
    if not members_only:
        data["partitions"] = [
            {
                "topic": p.topic,
                "partition": p.partition,
                "current_offset": p.current_offset,
                "log_end_offset": p.log_end_offset,
                "lag": p.lag,
                "member_id": p.member_id,
                "client_id": p.client_id,
                "metadata": p.metadata,
            }
            for p in desc.partitions
        ]
    return desc, data


def _show_group(text: TextOutput, desc: GroupDescription, *, members_only: bool) -> None:
    assignment = _assignment_of(desc)
    title = (
        f"Group: {desc.group_id}  State: {desc.state}  Generation: {desc.generation}  "
        f"Assignor: {desc.assignor or '-'}  Members: {len(desc.members)}  Lag: {desc.total_lag}"
        + (f"  No committed offset: {desc.uncommitted} partition(s)" if desc.uncommitted else "")
    )
    text.line(title)
    members: list[tuple[str, str | None, str | None, list[TopicPartition] | None]] = [
        (m.member_id, m.client_id, m.instance_id, assignment.get(m.member_id, []))
        for m in desc.members
    ] or [("(no live members)", None, None, None)]
    text.table(
        members,
        [
            Column("MEMBER-ID", 0),
            Column("CLIENT-ID", 1),
            Column("INSTANCE-ID", 2),
            Column("#PARTITIONS", lambda m: None if m[3] is None else len(m[3]), right=True),
            Column("ASSIGNMENT", lambda m: None if m[3] is None else _format_assignment(m[3])),
        ],
    )
    if members_only:
        return
    text.table(
        desc.partitions,
        [
            Column("TOPIC", "topic"),
            Column("PARTITION", "partition", right=True),
            Column("CURRENT-OFFSET", "current_offset", right=True),
            Column("LOG-END-OFFSET", "log_end_offset", right=True),
            Column("LAG", "lag", right=True),
            Column("CONSUMER-ID", "member_id"),
            Column("CLIENT-ID", "client_id"),
        ],
    )


def _parse_topic_specs(specs: list[str]) -> list[tuple[str, list[int] | None]]:
    out: list[tuple[str, list[int] | None]] = []
    for spec in specs:
        name, sep, parts = spec.partition(":")
        if not name:
            raise UsageError(f"--topic {spec!r}: expected TOPIC or TOPIC:PARTITION,PARTITION,...")
        if not sep:
            out.append((name, None))
            continue
        try:
            numbers = sorted({int(p) for p in parts.split(",") if p.strip()})
        except ValueError:
            raise UsageError(f"--topic {spec!r}: partitions must be integers") from None
        if not numbers or any(n < 0 for n in numbers):
            raise UsageError(f"--topic {spec!r}: expected non-negative partition numbers")
        out.append((name, numbers))
    return out


@app.command(
    "reset-offsets",
    epilog="Examples:\n\n"
    "  kstore groups reset-offsets billing --topic orders --to-earliest            (dry run)\n\n"
    "  kstore groups reset-offsets billing --topic orders:0,1 --to-offset 42 --execute\n\n"
    "  kstore groups reset-offsets billing --all-topics --to-datetime 2026-11-21T10:00:00Z --execute\n\n"
    "  kstore groups reset-offsets billing --topic orders --by-duration PT1H --execute\n\n"
    "  kstore groups reset-offsets billing --topic orders --shift-by -100 --execute\n\n"
    "A dry run by default; refused while the group has live members. New offsets are clamped "
    "to each partition's log start and end.",
)
def reset_offsets(
    ctx: typer.Context,
    group: GroupArg,
    topic: Annotated[
        list[str] | None,
        typer.Option(
            "--topic",
            "-t",
            metavar="TOPIC[:P,P...]",
            help="Topic to reset, optionally only some partitions; repeatable.",
        ),
    ] = None,
    all_topics: Annotated[
        bool,
        typer.Option(
            "--all-topics", help="Every topic the group has offsets or an assignment for."
        ),
    ] = False,
    to_earliest: Annotated[
        bool, typer.Option("--to-earliest", help="To the log start offset.")
    ] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest", help="To the log end offset.")] = False,
    to_offset: Annotated[
        int | None, typer.Option("--to-offset", metavar="OFFSET", min=0, help="To this offset.")
    ] = None,
    to_datetime: Annotated[
        str | None,
        typer.Option(
            "--to-datetime",
            metavar="TIME",
            help="To the first offset at or after this time (ISO 8601, epoch ms, or '2h' ago).",
        ),
    ] = None,
    shift_by: Annotated[
        int | None,
        typer.Option(
            "--shift-by", metavar="N", help="Move the current offset by N (may be negative)."
        ),
    ] = None,
    by_duration: Annotated[
        str | None,
        typer.Option(
            "--by-duration",
            metavar="DURATION",
            help="To the first offset at or after now minus DURATION (PT1H, 90m, 2d).",
        ),
    ] = None,
    execute: Annotated[bool, typer.Option("--execute", help="Apply the new offsets.")] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only show them (the default).")
    ] = False,
) -> None:
    """Compute new committed offsets for a group and, with --execute, commit them."""
    from kstore.groups import Group
    from kstore.groups import reset_offsets as compute
    from kstore.records import OffsetAndMetadata

    chosen = [
        name
        for name, given in (
            ("--to-earliest", to_earliest),
            ("--to-latest", to_latest),
            ("--to-offset", to_offset is not None),
            ("--to-datetime", to_datetime is not None),
            ("--shift-by", shift_by is not None),
            ("--by-duration", by_duration is not None),
        )
        if given
    ]
    if len(chosen) != 1:
        raise UsageError(
            "choose exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, "
            f"--shift-by, --by-duration (got {', '.join(chosen) or 'none'})"
        )
    if execute and dry_run:
        raise UsageError("--execute and --dry-run exclude each other")
    if bool(topic) == all_topics:
        raise UsageError("give --topic TOPIC (repeatable) or --all-topics")
    datetime_ms = duration_ms = None
    try:
        if to_datetime is not None:
            datetime_ms = parse_datetime_ms(to_datetime)
        if by_duration is not None:
            duration_ms = parse_duration_ms(by_duration)
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    handle = shared(ctx).open_store()
    state = Group(handle, group).state()
    if all_topics:
        names = sorted(
            {tp.topic for tp in state.offsets}
            | {tp.topic for parts in state.assignment.values() for tp in parts}
        )
        if not names:
            raise UsageError(
                f"group {group!r} has no offsets or assignment: name topics with --topic"
            )
        specs: list[tuple[str, list[int] | None]] = [(name, None) for name in names]
    else:
        specs = _parse_topic_specs(topic or [])
    plan: dict[TopicPartition, int] = {}
    for name, partitions in specs:
        meta = handle.topic(name)
        if partitions is not None and partitions[-1] >= meta.partitions:
            from kstore.errors import UnknownTopicOrPartitionError

            raise UnknownTopicOrPartitionError(
                f"topic {name!r} has partitions 0..{meta.partitions - 1}; {partitions[-1]} does not exist"
            )
        plan.update(
            compute(
                handle,
                group,
                [name],
                to_earliest=to_earliest,
                to_latest=to_latest,
                to_offset=to_offset,
                to_datetime_ms=datetime_ms,
                shift_by=shift_by,
                by_duration_ms=duration_ms,
                partitions=partitions,
                execute=False,
            )
        )
    if execute and plan:
        # One commit for every topic: it is refused if a member joined since the plan was made.
        Group(handle, group).commit_offsets(
            {tp: OffsetAndMetadata(offset, "reset") for tp, offset in plan.items()},
            member_id=None,
            generation=-1,
        )
    rows = []
    for tp, new in sorted(plan.items()):
        current = state.offsets.get(tp)
        rows.append(
            {
                "topic": tp.topic,
                "partition": tp.partition,
                "current_offset": current.offset if current is not None else None,
                "new_offset": new,
            }
        )

    def view(text: TextOutput) -> None:
        text.table(
            rows,
            [
                Column("GROUP", lambda row: group),
                Column("TOPIC", "topic"),
                Column("PARTITION", "partition", right=True),
                Column("CURRENT-OFFSET", "current_offset", right=True),
                Column("NEW-OFFSET", "new_offset", right=True),
            ],
        )
        if execute:
            text.message(f"Committed the new offsets of group {group!r}.")
        else:
            text.message("Dry run: nothing was changed. Add --execute to commit these offsets.")

    shared(ctx).output.record({"group": group, "executed": execute, "offsets": rows}, view)


@app.command(
    epilog="Examples:\n\n  kstore groups upgrade billing --dry-run\n\n  kstore groups upgrade billing",
)
def upgrade(
    ctx: typer.Context,
    group: GroupArg,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the log's versions; change nothing.")
    ] = False,
) -> None:
    """Raise a group log to writer version 8, where members share commits (run while members
    run; members of older kstore versions are refused by the log afterwards)."""
    from kstore.groups import GROUP_LOG_WRITER_VERSION, upgrade_group

    reader, writer = upgrade_group(shared(ctx).open_store(), group, dry_run=dry_run)
    current = writer >= GROUP_LOG_WRITER_VERSION
    after = writer if current or dry_run else GROUP_LOG_WRITER_VERSION

    def view(text: TextOutput) -> None:
        if current:
            text.message(f"Group {group!r} is at writer version {writer} already; nothing changed.")
        elif dry_run:
            text.message(
                f"Group {group!r} is at {reader}/{writer}; it would be raised to "
                f"{reader}/{GROUP_LOG_WRITER_VERSION}. Dry run: nothing was changed."
            )
        else:
            text.message(
                f"Group {group!r} raised from {reader}/{writer} to "
                f"{reader}/{GROUP_LOG_WRITER_VERSION}: its members now share commits."
            )

    shared(ctx).output.record(
        {
            "group": group,
            "dryRun": dry_run,
            "minReaderVersion": reader,
            "minWriterVersionBefore": writer,
            "minWriterVersion": after,
        },
        view,
    )


@app.command(
    epilog="Examples:\n\n  kstore groups delete billing\n\n  kstore groups delete old-1 old-2",
)
def delete(
    ctx: typer.Context,
    groups: Annotated[
        list[str], typer.Argument(metavar="GROUP...", help="Groups to delete.", show_default=False)
    ],
) -> None:
    """Delete consumer groups and their committed offsets (refused while members are live)."""
    from kstore.groups import delete_group

    handle = shared(ctx).open_store()
    out = shared(ctx).output
    for name in groups:
        delete_group(handle, name)
        out.message(f"Deleted consumer group {name!r}.")
    out.record([{"group": name, "deleted": True} for name in groups])


@app.command(
    "delete-offsets",
    epilog="Examples:\n\n"
    "  kstore groups delete-offsets billing --topic orders\n\n"
    "  kstore groups delete-offsets billing --topic orders:0,1\n\n"
    "Refused for a topic a live member of the group subscribes to.",
)
def delete_offsets(
    ctx: typer.Context,
    group: GroupArg,
    topic: Annotated[
        list[str],
        typer.Option(
            "--topic",
            "-t",
            metavar="TOPIC[:P,P...]",
            help="Topic whose committed offsets to forget, optionally only some partitions; "
            "repeatable.",
        ),
    ],
) -> None:
    """Forget a group's committed offsets of some topics or partitions (kafka-consumer-groups
    --delete-offsets)."""
    from kstore.groups import Group
    from kstore.records import TopicPartition

    specs = _parse_topic_specs(topic)
    handle = shared(ctx).open_store()
    _require_group(handle, group)
    target = Group(handle, group)
    committed = target.state().offsets
    wanted: list[TopicPartition] = []
    for name, parts in specs:
        if parts is None:  # the whole topic: every partition with an offset
            wanted.extend(tp for tp in committed if tp.topic == name)
        else:
            wanted.extend(TopicPartition(name, p) for p in parts)
    deleted = target.delete_offsets(wanted)
    shared(ctx).output.table(
        [{"topic": tp.topic, "partition": tp.partition} for tp in deleted],
        [
            Column("TOPIC", "topic"),
            Column("PARTITION", "partition", right=True),
            Column("STATUS", lambda row: "deleted"),
        ],
        empty=f"Group {group!r} had no committed offset there; nothing changed.",
    )
