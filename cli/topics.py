"""``kstore topics``: what kafka-topics and kafka-configs do for topics."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from kstore.cli.common import UsageError, human_bytes, ms_to_iso
from kstore.cli.options import shared
from kstore.cli.output import Column, TextOutput

from kstore.settings import is_int

if TYPE_CHECKING:
    from kstore.store import Store, TopicDescription, TopicMetadata

app = typer.Typer(
    name="topics",
    help="Create, list, describe, alter and delete topics (kafka-topics, kafka-configs).",
    epilog="Examples:\n\n  kstore topics create orders --partitions 3\n\n  kstore topics describe orders",
    no_args_is_help=True,
)

TopicArg = Annotated[str, typer.Argument(metavar="TOPIC", help="Topic name.", show_default=False)]
ValueSchemaOpt = Annotated[
    str | None,
    typer.Option(
        "--value-schema",
        metavar="SCHEMA",
        help="Make a typed topic: the value schema as DDL ('id BIGINT NOT NULL, name STRING') "
        "or Spark JSON; @FILE reads it from a file.",
        show_default=False,
    ),
]
KeySchemaOpt = Annotated[
    str | None,
    typer.Option(
        "--key-schema",
        metavar="TYPE",
        help="Type the key (with --value-schema): string, long, integer, short, double, float "
        "or binary.",
        show_default=False,
    ),
]


def _schema_text(value: str, what: str) -> str:
    """A schema option's text; ``@path`` reads the file."""
    if not value.startswith("@"):
        return value
    try:
        with open(value[1:], encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise UsageError(f"{what}: cannot read {value[1:]!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{what}: {value[1:]!r} is not UTF-8 text") from None


def _schema_json(meta: TopicMetadata) -> dict[str, Any] | None:
    schema = meta.schema
    if schema is None:
        return None
    return {
        "id": schema.id,
        "created_ms": schema.created_ms,
        "key": schema.key_declared or "binary",
        "value": schema.ddl(),
        "value_json": schema.value_declared,
    }


def _parse_configs(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"{what} expects NAME=VALUE, got {item!r}")
        out[name.strip()] = value.strip()
    return out


def _metadata_json(meta: TopicMetadata) -> dict[str, Any]:
    return {
        "topic": meta.name,
        "topic_id": meta.topic_id,
        "partitions": meta.partitions,
        "config": dict(meta.config),
        "created_ms": meta.created_ms,
        "schema": _schema_json(meta),
    }


@app.command(
    epilog="Examples:\n\n"
    "  kstore topics create orders --partitions 3 --store s3://bucket/ks\n\n"
    "  kstore topics create users -c cleanup.policy=compact -c retention.ms=-1\n\n"
    "  kstore topics create users --value-schema 'id BIGINT NOT NULL, name STRING' "
    "--key-schema long\n\n"
    "Creates the store itself (its marker file) when the URL holds none yet.",
)
def create(
    ctx: typer.Context,
    topic: TopicArg,
    partitions: Annotated[
        int, typer.Option("--partitions", "-p", min=1, help="Number of partitions.")
    ] = 1,
    config: Annotated[
        list[str] | None,
        typer.Option(
            "--config",
            "-c",
            metavar="NAME=VALUE",
            help="A topic config (retention.ms, cleanup.policy, ...); repeatable.",
        ),
    ] = None,
    if_not_exists: Annotated[
        bool, typer.Option("--if-not-exists", help="Succeed without change when the topic exists.")
    ] = False,
    value_schema: ValueSchemaOpt = None,
    key_schema: KeySchemaOpt = None,
) -> None:
    """Create a topic (and the store, if the URL holds none yet).

    With --value-schema the topic is typed: values are records of the declared fields,
    validated when written and stored column by column.
    """
    from kstore.errors import TopicAlreadyExistsError

    configs = _parse_configs(config, "--config")
    if key_schema is not None and value_schema is None:
        raise UsageError("--key-schema needs --value-schema: only typed topics have typed keys")
    declared = _schema_text(value_schema, "--value-schema") if value_schema is not None else None
    handle = shared(ctx).open_store(create=True)
    try:
        meta = handle.create_topic(
            topic, partitions, configs, value_schema=declared, key_schema=key_schema
        )
        created = True
    except TopicAlreadyExistsError:
        if not if_not_exists:
            raise
        meta = handle.topic(topic)
        created = False
    out = shared(ctx).output
    out.record({**_metadata_json(meta), "created": created})
    if created:
        typed = f" typed {meta.schema.ddl()}" if meta.schema is not None else ""
        out.message(f"Created{typed} topic {meta.name!r} with {meta.partitions} partition(s).")
    else:
        out.message(f"Topic {meta.name!r} already exists; nothing changed.")


@app.command(
    "list",
    epilog="Examples:\n\n  kstore topics list --store file:///data/ks\n\n"
    "  kstore topics list -o json | jq -r '.[].topic'",
)
def list_(
    ctx: typer.Context,
    pattern: Annotated[
        str | None,
        typer.Argument(
            metavar="PATTERN",
            help="Only the topics whose whole name matches this regular expression "
            "(as Kafka's --list --topic).",
            show_default=False,
        ),
    ] = None,
    names_only: Annotated[
        bool, typer.Option("--names-only", help="One topic name a line (as Kafka's --list).")
    ] = False,
) -> None:
    """List the topics of the store, with their partition counts."""
    import re

    from kstore.errors import KStoreError

    try:
        matcher = re.compile(pattern) if pattern is not None else None
    except re.error as exc:
        raise UsageError(f"PATTERN {pattern!r} is not a regular expression: {exc}") from None
    handle = shared(ctx).open_store()
    out = shared(ctx).output
    names = [n for n in handle.list_topics() if matcher is None or matcher.fullmatch(n)]
    if names_only:
        out.record(names, view=lambda text: text.lines(names))
        return
    rows: list[dict[str, Any]] = []
    for name in names:
        try:
            meta = handle.topic(name)
            rows.append(
                {
                    "topic": name,
                    "partitions": meta.partitions,
                    "cleanup.policy": meta.effective_config["cleanup.policy"],
                }
            )
        except KStoreError as exc:  # listed so that the problem is visible, not hidden
            rows.append(
                {"topic": name, "partitions": None, "cleanup.policy": None, "error": str(exc)}
            )
    out.table(
        rows,
        [
            Column("TOPIC", "topic"),
            Column("PARTITIONS", "partitions", right=True),
            Column(
                "CLEANUP.POLICY", lambda row: row["cleanup.policy"] or f"error: {row.get('error')}"
            ),
        ],
        empty="No topics.",
    )


def _describe_json(desc: TopicDescription, table: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = desc.metadata
    return {
        **_metadata_json(meta),
        "partitions": [
            {
                "partition": p.partition,
                "log_start_offset": p.log_start_offset,
                "log_end_offset": p.log_end_offset,
                "records": p.records,
                "segments": p.segments,
                "bytes": p.size_bytes,
                "oldest_timestamp_ms": p.oldest_timestamp_ms,
                "newest_timestamp_ms": p.newest_timestamp_ms,
            }
            for p in desc.partitions
        ],
        "config": [
            {"name": name, "value": value, "default": is_default}
            for name, value, is_default in desc.config_entries()
        ],
        "table": table,
    }


@app.command(
    epilog="Examples:\n\n  kstore topics describe orders\n\n"
    "  kstore topics describe            (every topic)\n\n"
    "  kstore topics describe orders -o json | jq '.[0].partitions'",
)
def describe(
    ctx: typer.Context,
    topics: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="TOPIC", help="Topics to describe (default: all).", show_default=False
        ),
    ] = None,
) -> None:
    """Show topics: offsets, records, segments, bytes and timestamps per partition, and config.

    Per partition: log start and end offsets, records, segments, bytes, oldest and newest
    timestamps; then every topic config, marking the values that are defaults.
    """
    handle = shared(ctx).open_store()
    names = topics or handle.list_topics()
    descriptions = [handle.describe_topic(name) for name in names]
    tables = {d.name: _table_of(handle, d.metadata) for d in descriptions}

    def view(text: TextOutput) -> None:
        if not descriptions:
            text.message("No topics.")
        for index, desc in enumerate(descriptions):
            if index:
                text.line("")
            _print_description(text, desc, tables[desc.name])

    shared(ctx).output.record([_describe_json(d, tables[d.name]) for d in descriptions], view)


def _print_description(
    text: TextOutput, desc: TopicDescription, published: dict[str, Any] | None
) -> None:
    meta = desc.metadata
    parts = desc.partitions
    total_records = sum(p.records for p in parts)
    total_bytes = sum(p.size_bytes for p in parts)
    title = (
        f"Topic: {meta.name}  TopicId: {meta.topic_id}  Partitions: {meta.partitions}  "
        f"Records: {total_records}  Size: {human_bytes(total_bytes)}  "
        f"Created: {ms_to_iso(meta.created_ms)}"
    )
    text.line(title)
    schema = meta.schema
    if schema is not None:
        text.line(
            f"Schema: version {schema.id}  Key: {schema.key_declared or 'binary'}  "
            f"Value: {schema.ddl()}"
        )
    text.table(
        parts,
        [
            Column("PARTITION", "partition", right=True),
            Column("LOG-START", "log_start_offset", right=True),
            Column("LOG-END", "log_end_offset", right=True),
            Column("RECORDS", "records", right=True),
            Column("SEGMENTS", "segments", right=True),
            Column("BYTES", "size_bytes", right=True),
            Column("OLDEST", lambda p: ms_to_iso(p.oldest_timestamp_ms)),
            Column("NEWEST", lambda p: ms_to_iso(p.newest_timestamp_ms)),
        ],
    )
    if published is not None:
        version = published["version"]
        text.line(
            f"Table: delta  Location: {published['location']}  Version: "
            f"{version if version >= 0 else 'none yet'}"
        )
    text.table(
        desc.config_entries(),
        [
            Column("CONFIG", 0),
            Column("VALUE", 1),
            Column("SOURCE", lambda entry: "default" if entry[2] else "topic"),
        ],
    )


def _table_of(handle: Store, meta: TopicMetadata) -> dict[str, Any] | None:
    """A topic with table.format=delta (or a table from an earlier setting): its Delta table's
    location and newest version (PROTOCOL.md 29); None for a topic without a table."""
    from kstore.lakehouse import enabled, newest_version, table_url

    version = newest_version(handle, meta)
    if not enabled(meta.effective_config) and version < 0:
        return None
    return {"format": "delta", "location": table_url(handle, meta), "version": version}


@app.command(
    epilog="Examples:\n\n  kstore topics publish orders\n\n"
    "  kstore topics publish orders --tail -o json\n\n"
    "Needs table.format=delta on the topic (kstore topics alter orders --set "
    "table.format=delta). Safe to run at any time and again: it completes what an "
    "interrupted publication left undone and never adds a file twice.",
)
def publish(
    ctx: typer.Context,
    topic: TopicArg,
    tail: Annotated[
        bool,
        typer.Option(
            "--tail",
            help="First rewrite the log's tail (every segment below the last stable offset "
            "that is not Parquet yet) into Parquet, so the table reaches the last stable offset.",
        ),
    ] = False,
) -> None:
    """Publish a topic's Parquet segments as a new version of its Delta table, by reference.

    The table lives in the topic's directory (its _delta_log/ beside the partitions); any
    Delta reader opens it there. Merging, compaction and retention publish by themselves.
    """
    from kstore.lakehouse import publish_table

    report = publish_table(shared(ctx).open_store(), topic, tail=tail)
    out = shared(ctx).output
    out.record(report.to_json())
    if report.tail_segments:
        out.message(f"Rewrote {report.tail_segments} tail segment(s) into Parquet.")
    if report.committed:
        out.message(
            f"Published version {report.version} of {report.table}: "
            f"+{report.files_added} -{report.files_removed} file(s), "
            f"{human_bytes(report.bytes_covered)} by reference, "
            f"{human_bytes(report.bytes_written)} written."
        )
    else:
        out.message(f"Table {report.table} is up to date at version {report.version}.")
    if report.checkpoint_error:
        out.message(f"The Delta checkpoint due at this version failed: {report.checkpoint_error}")
    covered = ", ".join(f"{p}: {end}" for p, end in sorted(report.covered.items()))
    out.message(
        f"Covers {report.files} file(s), {report.records} record(s); offsets below {covered}."
    )


@app.command(
    epilog="Examples:\n\n"
    "  kstore topics alter orders --set retention.ms=86400000 --set cleanup.policy=delete,compact\n\n"
    "  kstore topics alter orders --delete retention.ms      (back to the default)\n\n"
    "Kafka's spellings --add-config and --delete-config work too.",
)
def alter(
    ctx: typer.Context,
    topic: TopicArg,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set", "--add-config", metavar="NAME=VALUE", help="Set a topic config; repeatable."
        ),
    ] = None,
    delete: Annotated[
        list[str] | None,
        typer.Option(
            "--delete",
            "--delete-config",
            metavar="NAME",
            help="Return a config to its default; repeatable.",
        ),
    ] = None,
) -> None:
    """Change a topic's config: set values, or return them to their defaults, in one commit."""
    updates = _parse_configs(set_, "--set")
    removals = [name.strip() for name in delete or []]
    if not updates and not removals:
        raise UsageError("nothing to change: give --set NAME=VALUE and/or --delete NAME")
    both = sorted(set(updates) & set(removals))
    if both:
        raise UsageError(f"config {both[0]!r} is both set and deleted")
    meta = shared(ctx).open_store().alter_topic_config(topic, updates, removals)
    out = shared(ctx).output
    out.record(_metadata_json(meta))
    changes = [f"{k}={v}" for k, v in updates.items()] + [f"{k} (default)" for k in removals]
    out.message(f"Altered topic {topic!r}: {', '.join(changes)}.")


@app.command(
    epilog="Examples:\n\n  kstore topics delete orders\n\n"
    "  kstore topics delete old-1 old-2 --if-exists --yes",
)
def delete(
    ctx: typer.Context,
    topics: Annotated[
        list[str], typer.Argument(metavar="TOPIC...", help="Topics to delete.", show_default=False)
    ],
    if_exists: Annotated[
        bool, typer.Option("--if-exists", help="Skip topics that do not exist.")
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask for confirmation on a terminal.")
    ] = False,
) -> None:
    """Delete topics: gone at once for new lookups and closed to writers; their files stay
    readable for file.delete.delay.ms, then `kstore vacuum` removes them."""
    from kstore.errors import UnknownTopicOrPartitionError

    handle = shared(ctx).open_store()
    out = shared(ctx).output
    if not yes and sys.stdin.isatty() and sys.stderr.isatty():
        typer.confirm(
            f"Delete topic(s) {', '.join(topics)} and all their records?", abort=True, err=True
        )
    results: list[dict[str, Any]] = []
    for name in topics:
        try:
            delay = int(handle.topic(name).effective_config["file.delete.delay.ms"])
            handle.delete_topic(name)
            results.append({"topic": name, "deleted": True})
            out.message(
                f"Deleted topic {name!r}; its files stay readable for {delay} ms "
                "(file.delete.delay.ms), then `kstore vacuum` removes them."
            )
        except UnknownTopicOrPartitionError:
            if not if_exists:
                raise
            results.append({"topic": name, "deleted": False})
            out.message(f"Topic {name!r} does not exist; skipped.")
    out.record(results)


@app.command(
    "add-partitions",
    epilog="Examples:\n\n  kstore topics add-partitions orders --partitions 6\n\n"
    "The count is the new total, as in kafka-topics --alter --partitions; it can only grow.",
)
def add_partitions(
    ctx: typer.Context,
    topic: TopicArg,
    partitions: Annotated[
        int, typer.Option("--partitions", "-p", help="The new total partition count.")
    ],
) -> None:
    """Grow a topic to more partitions (never fewer)."""
    handle = shared(ctx).open_store()
    before = handle.topic(topic).partitions
    meta = handle.add_partitions(topic, partitions)
    out = shared(ctx).output
    out.record({**_metadata_json(meta), "previous_partitions": before})
    out.message(f"Topic {topic!r} now has {meta.partitions} partitions (was {before}).")


@app.command(
    "alter-schema",
    epilog="Examples:\n\n"
    "  kstore topics alter-schema users --value-schema 'id BIGINT NOT NULL, name STRING, "
    "email STRING'\n\n"
    "Allowed: adding nullable fields (also inside structs), widening numbers (byte, short, "
    "int, long; int and float to double; wider decimals), dropping NOT NULL. Anything else is "
    "refused, naming the field, and changes nothing.",
)
def alter_schema(
    ctx: typer.Context,
    topic: TopicArg,
    value_schema: Annotated[
        str,
        typer.Option(
            "--value-schema",
            metavar="SCHEMA",
            help="The new value schema, whole (DDL or Spark JSON; @FILE reads a file).",
            show_default=False,
        ),
    ],
    key_schema: KeySchemaOpt = None,
) -> None:
    """Evolve a typed topic's schema; records already written read with the new one."""
    declared = _schema_text(value_schema, "--value-schema")
    meta = shared(ctx).open_store().alter_topic_schema(topic, declared, key_schema)
    out = shared(ctx).output
    out.record(_metadata_json(meta))
    schema = meta.schema
    assert schema is not None
    out.message(f"Topic {topic!r} schema is now version {schema.id}: {schema.ddl()}")


@app.command(
    "schema",
    epilog="Examples:\n\n  kstore topics schema users\n\n"
    "  kstore topics schema users -o json | jq -r '.[-1].value'",
)
def schema_history(
    ctx: typer.Context,
    topic: TopicArg,
) -> None:
    """Show a typed topic's schema history: version, time, key type and value schema (DDL)."""
    from kstore.schema import describe as describe_history

    meta = shared(ctx).open_store().topic(topic)
    rows = [
        {
            "id": row["id"],
            "created_ms": row["createdTime"],
            "key": row["key"],
            "value": row["value"],
        }
        for row in describe_history(meta.schema_history)
    ]
    shared(ctx).output.table(
        rows,
        [
            Column("VERSION", "id", right=True),
            Column("CREATED", lambda row: ms_to_iso(row["created_ms"])),
            Column("KEY", "key"),
            Column("VALUE", "value"),
        ],
        empty=f"Topic {topic!r} is a binary (untyped) topic: it has no schema.",
    )


_STEP_WORDS = {
    "sealed": {"done": "sealed", "already": "was sealed", "planned": "to seal"},
    "adopted": {"done": "adopted", "already": "was adopted", "planned": "to adopt"},
}


@app.command(
    "upgrade",
    epilog="Examples:\n\n  kstore topics upgrade orders --dry-run\n\n"
    "  kstore topics upgrade orders\n\n"
    "Safe to run again: a run that stopped half-way is finished by the next one. A topic "
    "already in layout 3 whose logs are below reader version 6 and writer version 7 has them "
    "raised (incremental checkpoints; vacuum finds old checkpoint sidecars without listing the "
    "log; producers carry small flushes in the commit, one PUT instead of two; a checkpoint "
    "writes one sidecar file, not one per changed partition); one there is left alone. Readers "
    "older than version 6 cannot read the topic afterwards, and writers older than version 7 "
    "cannot write it.",
)
def upgrade(
    ctx: typer.Context,
    topic: TopicArg,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would be done; change nothing.")
    ] = False,
) -> None:
    """Move a topic from layout 2 (a log per partition) to layout 3 (shared topic logs).

    Seals every partition log, adopts each partition's state (segments by reference, nothing
    copied; open transactions and producer sequences carried) into the topic logs, then
    switches the topic's metadata to layout 3. A layout-3 topic whose logs are below reader
    version 6 and writer version 7 gets them raised there (incremental checkpoints, old
    checkpoint sidecars that vacuum finds without listing the log, data carried in commits,
    one sidecar file per checkpoint).
    """
    from kstore.upgrade import upgrade_topic

    report = upgrade_topic(shared(ctx).open_store(), topic, dry_run=dry_run)
    shared(ctx).output.record(
        report.to_json(), view=lambda text: _show_upgrade(text, topic, report, dry_run=dry_run)
    )


def _show_upgrade(text: TextOutput, topic: str, report: Any, *, dry_run: bool) -> None:
    if report.layout_before == 3:
        _layout3_versions(text, topic, report, dry_run=dry_run)
        return
    # LOG: the topic log that adopts the partition.
    text.table(
        report.partitions,
        [
            Column("PARTITION", "partition", right=True),
            Column("LOG", "topic_log", right=True),
            Column("LOG-END", "end_offset", right=True),
            Column("SEGMENTS", "segments", right=True),
            Column("OPEN-TXN", "open_transactions", right=True),
            Column("PRODUCERS", "producers", right=True),
            Column("SEAL", lambda p: _STEP_WORDS["sealed"][p.sealed]),
            Column("ADOPTION", lambda p: _STEP_WORDS["adopted"][p.adopted]),
        ],
    )
    logs = {"done": "written", "already": "already there", "planned": "would be written"}
    for index, step in report.topic_logs:
        name = "_log" if index == 0 else f"_log.{index}"
        text.message(f"Topic log {index} ({name}): {logs[step]}.")
    layout = {"done": "switched", "already": "already switched", "planned": "would switch"}
    text.message(f"Metadata: {layout[report.metadata]} to layout 3.")
    if dry_run:
        pending = report.metadata == "planned" or any(
            "planned" in (p.sealed, p.adopted) for p in report.partitions
        )
        what = "would be upgraded to layout 3" if pending else "needs no change"
        text.message(f"Dry run: topic {topic!r} {what}; nothing was changed.")
    elif report.changed:
        text.message(f"Upgraded topic {topic!r} to layout 3.")
    else:
        text.message(f"Topic {topic!r} was upgraded to layout 3 already; nothing changed.")


def _layout3_versions(text: TextOutput, topic: str, report: Any, *, dry_run: bool) -> None:
    """A layout-3 topic: its topic logs and metadata log raised to the versions of new topic
    logs, or found there."""
    from kstore.topic_log import TOPIC_LOG_VERSION, TOPIC_LOG_WRITER_VERSION

    versions = f"reader version {TOPIC_LOG_VERSION}, writer version {TOPIC_LOG_WRITER_VERSION}"
    words = {"done": "raised to", "already": "already at", "planned": "would be raised to"}
    for index, step in report.topic_logs:
        name = "_log" if index == 0 else f"_log.{index}"
        text.message(f"Topic log {index} ({name}): {words[step]} {versions}.")
    text.message(f"Metadata: {words[report.metadata]} {versions}.")
    if dry_run:
        pending = "planned" in (report.metadata, *(step for _, step in report.topic_logs))
        what = "would be raised" if pending else "needs no change"
        text.message(f"Dry run: topic {topic!r} {what}; nothing was changed.")
    elif report.changed:
        text.message(f"Topic {topic!r} is in layout 3; its logs are now at {versions}.")
    else:
        text.message(f"Topic {topic!r} is in layout 3 already, at {versions}; nothing to do.")


@app.command(
    "recover",
    epilog="Examples:\n\n  kstore topics recover orders              (a dry run: what it would do)\n\n"
    "  kstore topics recover orders --apply\n\n"
    "  kstore topics recover orders -o json\n\n"
    "For a topic whose log has a damaged, cut or missing commit file (readers and writers "
    "fail with 'corrupt', 'truncated' or 'the log has a gap'). Stop the topic's producers, "
    "consumers and maintenance first. Nothing is deleted: every file replaced or moved is "
    "copied first into the topic's _recovery/ folder, with a report.",
)
def recover(
    ctx: typer.Context,
    topic: TopicArg,
    apply: Annotated[
        bool,
        typer.Option(
            "--apply",
            "--execute",
            help="Do the recovery (default: a dry run that prints what it would do and lose).",
        ),
    ] = False,
) -> None:
    """Recover a topic whose log has a damaged or missing commit file (PROTOCOL.md 17.7).

    Every version after the damaged one is kept with its records at their offsets: a damaged
    or missing version is replaced by an empty RECOVER commit, a later version that no longer
    applies is rewritten without what does not, a corrupt checkpoint is moved aside. Prints
    each change, and the records lost (partition, offsets, count). A dry run unless --apply.
    """
    from kstore.recovery import recover_topic

    report = recover_topic(shared(ctx).open_store(), topic, apply=apply)
    shared(ctx).output.record(
        report.to_json(), view=lambda text: _show_recovery(text, topic, report, apply=apply)
    )


def _show_recovery(text: TextOutput, topic: str, report: Any, *, apply: bool) -> None:
    from kstore.recovery import describe

    text.lines(describe(report))
    if not report.needed:
        text.message(f"Topic {topic!r}: every log loads; nothing to recover.")
        return
    lost = report.lost
    records = [item.records for item in lost]
    known = sum(r for r in records if r is not None)
    summary = (
        f"{len(lost)} range(s) of records lost"
        + (f", {known} record(s) known" if known else "")
        + (", some of unknown size" if None in records else "")
        if lost
        else "no record known to be lost"
    )
    if not apply:
        text.message(
            f"Dry run: nothing was changed ({summary}). Stop the topic's producers, consumers "
            f"and maintenance, then run `kstore topics recover {topic} --apply`."
        )
        return
    text.message(
        f"Recovered topic {topic!r} ({summary}); the originals and the report are in "
        f"{report.folder}/. Producers and consumers may start again."
    )


def _offsets_json(path: str) -> list[tuple[str, int, int]]:
    """kafka-delete-records' --offset-json-file: {"partitions": [{"topic", "partition",
    "offset"}, ...], "version": 1}."""
    import json

    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as exc:
        raise UsageError(
            f"--offset-json-file: cannot read {path!r}: {exc.strerror or exc}"
        ) from None
    except ValueError as exc:
        raise UsageError(f"--offset-json-file: {path!r} is not JSON: {exc}") from None
    items = data.get("partitions") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise UsageError(f'--offset-json-file: {path!r} has no "partitions" list')
    out: list[tuple[str, int, int]] = []
    for item in items:
        ok = isinstance(item, dict) and isinstance(item.get("topic"), str)
        numbers = [item.get(k) for k in ("partition", "offset")] if ok else []
        if not ok or not all(is_int(n) for n in numbers):
            raise UsageError(
                f'--offset-json-file: expected {{"topic": str, "partition": int, '
                f'"offset": int}}, got {json.dumps(item)}'
            )
        out.append((item["topic"], item["partition"], item["offset"]))
    return out


def delete_records(
    ctx: typer.Context,
    topic: Annotated[
        str | None,
        typer.Argument(metavar="TOPIC", help="Topic (or --offset-json-file).", show_default=False),
    ] = None,
    offset: Annotated[
        int | None,
        typer.Option(
            "--offset",
            metavar="OFFSET",
            min=-1,
            help="Delete the records below this offset; -1 for every record (the end offset).",
        ),
    ] = None,
    partition: Annotated[
        list[int] | None,
        typer.Option(
            "--partition", "-p", min=0, help="Only this partition; repeatable (default: all)."
        ),
    ] = None,
    offset_json_file: Annotated[
        str | None,
        typer.Option(
            "--offset-json-file",
            metavar="PATH",
            help='Kafka\'s form: {"partitions": [{"topic": "t", "partition": 0, "offset": 42}], '
            '"version": 1}.',
        ),
    ] = None,
) -> None:
    """Delete the records below an offset (kafka-delete-records): the log start offset moves
    up at once for every reader; retention removes the files later."""
    if offset_json_file is not None and (topic is not None or offset is not None or partition):
        raise UsageError("give --offset-json-file alone, or TOPIC with --offset")
    if offset_json_file is None and (topic is None or offset is None):
        raise UsageError("give TOPIC and --offset, or --offset-json-file")
    plan = _offsets_json(offset_json_file) if offset_json_file is not None else []
    handle = shared(ctx).open_store()
    if topic is not None and offset is not None:
        meta = handle.topic(topic)
        for p in sorted(set(partition or range(meta.partitions))):
            plan.append((topic, p, offset))
    rows = []
    for name, p, target in plan:
        meta = handle.topic(name)
        if not 0 <= p < meta.partitions:
            raise UsageError(f"topic {name!r} has no partition {p} (0..{meta.partitions - 1})")
        start = handle.partition(name, p, meta).delete_records(target)
        rows.append({"topic": name, "partition": p, "log_start_offset": start})
    shared(ctx).output.table(
        rows,
        [
            Column("TOPIC", "topic"),
            Column("PARTITION", "partition", right=True),
            Column("LOW-WATERMARK", "log_start_offset", right=True),
        ],
    )
