"""The console's pages: server-rendered HTML, every value escaped, one small script (reload every
refresh interval unless a form is being filled in). Tables carry ``data-*`` attributes naming
each row and cell, for scripts and the browser tests."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

if TYPE_CHECKING:
    from .browse import RecordPage, Shown
    from .snapshot import GroupFacts, LagSample, Snapshot, TopicFacts


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def iso(ms: int | float | None) -> str:
    if ms is None:
        return "-"
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    if value < 172_800:
        return f"{value / 3600:.1f} h"
    return f"{value / 86_400:.1f} d"


def topic_href(topic: str) -> str:
    return f"/topics/{quote(topic, safe='')}"


def group_href(group: str) -> str:
    return f"/groups/{quote(group, safe='')}"


@dataclass(frozen=True)
class Frame:
    """What every page shares: the store shown, the refresh, whether writes are allowed."""

    store: str  # redacted URL
    refresh_s: float
    allow_writes: bool
    csrf: str


_STYLE = """
body{font-family:system-ui,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1d2b3a;color:#fff;padding:.6rem 1.2rem;display:flex;gap:1.5rem;align-items:baseline}
header a{color:#cfe3ff;text-decoration:none}header a.brand{color:#fff;font-weight:700}
header .store{margin-left:auto;font-size:.85rem;color:#aab8c8}
main{padding:1rem 1.2rem}h1{font-size:1.3rem}h2{font-size:1.05rem;margin-top:1.6rem}
table{border-collapse:collapse;background:#fff;margin:.4rem 0;font-size:.88rem}
th,td{border:1px solid #dde2e8;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#eef1f5}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{margin:0;white-space:pre-wrap;word-break:break-all;max-width:48rem;font-size:.82rem}
.error{background:#fdecea;border:1px solid #f5c2bd;padding:.6rem .8rem;color:#8a1c13}
.warn{background:#fff6e0;border:1px solid #f0d68a;padding:.5rem .8rem}
.muted{color:#6b7785;font-size:.85rem}.facts span{margin-right:1.2rem}
form.inline{display:inline}fieldset{background:#fff;border:1px solid #dde2e8}
.lag{color:#b3261e;font-weight:600}
"""

_SCRIPT = """
(function(){var s=%s;if(!s)return;var dirty=false;
document.addEventListener('input',function(){dirty=true});
setInterval(function(){var a=document.activeElement;
if(dirty||(a&&a.form)||document.getElementById('paused')&&document.getElementById('paused').checked)return;
location.reload()},s*1000)})();
"""


def page(frame: Frame, title: str, body: str, *, reload: bool = True, status_line: str = "") -> str:
    refresh = frame.refresh_s if reload else 0
    writes = "writes allowed" if frame.allow_writes else "read-only"
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)} - kstore</title><style>{_STYLE}</style></head><body>"
        "<header><a class='brand' href='/'>kstore</a><a href='/'>Topics</a>"
        "<a href='/groups'>Consumer groups</a><a href='/maintenance'>Maintenance</a>"
        "<a href='/metrics'>Metrics</a>"
        f"<span class='store' id='store'>{esc(frame.store)} · {writes}</span></header>"
        f"<main>{status_line}{body}</main>"
        f"<script>{_SCRIPT % (int(refresh) if refresh >= 1 else (1 if refresh else 0))}</script>"
        "</body></html>"
    )


def error_page(frame: Frame, status: int, message: str) -> str:
    body = f"<h1>{esc(_REASONS.get(status, 'Error'))}</h1><p class='error' id='error'>{esc(message)}</p>"
    # A store not read yet, or not answering: the page looks again by itself.
    return page(frame, _REASONS.get(status, "Error"), body, reload=status == 503)


_REASONS = {
    400: "Bad request",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    414: "URL too long",
    500: "Error",
    501: "Not implemented",
    503: "Store unavailable",
}


def freshness(frame: Frame, snap: Snapshot, failure: tuple[str, int] | None) -> str:
    """The line above every page's data: when it was read, and the newest refresh's error."""
    line = (
        f"<p class='muted' id='freshness' data-taken-ms='{snap.taken_ms}'>Read at "
        f"{esc(iso(snap.taken_ms))} in "
        f"{snap.elapsed_s:.2f} s; read again every {frame.refresh_s:g} s. "
        "<label><input type='checkbox' id='paused'> pause reloading</label></p>"
    )
    if failure is not None:
        message, when = failure
        line = (
            f"<p class='warn' id='stale'>The store could not be read at {esc(iso(when))}: "
            f"{esc(message)}. Showing what was read at {esc(iso(snap.taken_ms))}.</p>" + line
        )
    return line


def table(
    headers: Sequence[tuple[str, str]],
    rows: Iterable[tuple[Mapping[str, str], Sequence[tuple[str, str, bool]]]],
    *,
    id_: str,
    empty: str = "None.",
) -> str:
    """``headers``: (column key, title); each row: its data attributes and its cells as
    (column key, HTML already escaped, numeric)."""
    body = []
    for attrs, cells in rows:
        attr = "".join(f" data-{esc(k)}='{esc(v)}'" for k, v in attrs.items())
        tds = "".join(
            f"<td data-col='{esc(key)}'{' class=n' if numeric else ''}>{cell}</td>"
            for key, cell, numeric in cells
        )
        body.append(f"<tr{attr}>{tds}</tr>")
    if not body:
        return f"<p class='muted' id='{esc(id_)}'>{esc(empty)}</p>"
    head = "".join(f"<th data-col='{esc(k)}'>{esc(t)}</th>" for k, t in headers)
    return f"<table id='{esc(id_)}'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _num(value: int | None) -> str:
    return "-" if value is None else str(value)


# -- overview: topics ---------------------------------------------------------------------------


def topics_page(frame: Frame, snap: Snapshot, failure: tuple[str, int] | None) -> str:
    rows = []
    for name, facts in sorted(snap.topics.items()):
        link = f"<a href='{esc(topic_href(name))}'>{esc(name)}</a>"
        if facts.description is None:
            rows.append(
                (
                    {"topic": name},
                    [
                        ("topic", link, False),
                        ("error", f"<span class='error'>{esc(facts.error)}</span>", False),
                    ],
                )
            )
            continue
        parts = facts.description.partitions
        meta = facts.description.metadata
        rows.append(
            (
                {"topic": name},
                [
                    ("topic", link, False),
                    ("partitions", str(meta.partitions), True),
                    ("records", str(sum(p.records for p in parts)), True),
                    ("bytes", esc(human_bytes(sum(p.size_bytes for p in parts))), True),
                    ("segments", str(sum(p.segments for p in parts)), True),
                    ("cleanup_policy", esc(meta.effective_config.get("cleanup.policy")), False),
                    ("typed", "yes" if meta.typed else "no", False),
                ],
            )
        )
    body = (
        f"<h1>Topics</h1><p class='facts'><span>Store id: <b id='store-id'>{esc(snap.store_id)}</b></span>"
        f"<span>Topics: <b id='topic-count'>{len(snap.topics)}</b></span>"
        f"<span>Consumer groups: <b id='group-count'>{len(snap.groups)}</b></span></p>"
        + table(
            [
                ("topic", "Topic"),
                ("partitions", "Partitions"),
                ("records", "Records"),
                ("bytes", "Size"),
                ("segments", "Segments"),
                ("cleanup_policy", "cleanup.policy"),
                ("typed", "Typed"),
            ],
            rows,
            id_="topics",
            empty="No topics.",
        )
    )
    return page(frame, "Topics", body, status_line=freshness(frame, snap, failure))


# -- one topic ------------------------------------------------------------------------------------


def topic_page(
    frame: Frame, snap: Snapshot, failure: tuple[str, int] | None, facts: TopicFacts
) -> str:
    status = freshness(frame, snap, failure)
    name = facts.name
    if facts.description is None:
        body = f"<h1>Topic {esc(name)}</h1><p class='error' id='error'>{esc(facts.error)}</p>"
        return page(frame, name, body, status_line=status)
    desc = facts.description
    meta = desc.metadata
    parts = desc.partitions
    schema = meta.schema
    facts_html = (
        "<p class='facts'>"
        f"<span>Topic id: <b>{esc(meta.topic_id)}</b></span>"
        f"<span>Partitions: <b id='partitions'>{meta.partitions}</b></span>"
        f"<span>Records: <b id='records'>{sum(p.records for p in parts)}</b></span>"
        f"<span>Size: <b>{esc(human_bytes(sum(p.size_bytes for p in parts)))}</b></span>"
        f"<span>Layout: <b id='layout'>{meta.layout}</b></span>"
        f"<span>Created: <b>{esc(iso(meta.created_ms))}</b></span></p>"
    )
    if schema is not None:
        facts_html += (
            f"<p id='schema'>Schema version {schema.id}: key "
            f"<code>{esc(schema.key_declared or 'binary')}</code>, value <code>{esc(schema.ddl())}</code></p>"
        )
    if facts.table is not None:
        version = facts.table["version"]
        facts_html += (
            f"<p id='delta'>Delta table at <code>{esc(facts.table['location'])}</code>, version "
            f"<b id='delta-version'>{esc(version if version >= 0 else 'none yet')}</b></p>"
        )
    part_rows = [
        (
            {"partition": str(p.partition)},
            [
                ("partition", str(p.partition), True),
                ("log_start_offset", str(p.log_start_offset), True),
                ("log_end_offset", str(p.log_end_offset), True),
                ("records", str(p.records), True),
                ("segments", str(p.segments), True),
                ("bytes", str(p.size_bytes), True),
                ("oldest", esc(iso(p.oldest_timestamp_ms)), False),
                ("newest", esc(iso(p.newest_timestamp_ms)), False),
                ("producers", str(len(facts.producers.get(p.partition, ()))), True),
                (
                    "browse",
                    f"<a href='{esc(topic_href(name))}/records?partition={p.partition}'>records</a>",
                    False,
                ),
            ],
        )
        for p in parts
    ]
    config_rows = [
        (
            {"config": key},
            [
                ("name", esc(key), False),
                ("value", esc(value), False),
                ("source", "default" if is_default else "topic", False),
            ],
        )
        for key, value, is_default in desc.config_entries()
    ]
    body = (
        f"<h1>Topic {esc(name)}</h1>"
        + facts_html
        + "<h2>Partitions</h2>"
        + table(
            [
                ("partition", "Partition"),
                ("log_start_offset", "Log start"),
                ("log_end_offset", "Log end"),
                ("records", "Records"),
                ("segments", "Segments"),
                ("bytes", "Bytes"),
                ("oldest", "Oldest record"),
                ("newest", "Newest record"),
                ("producers", "Producers"),
                ("browse", ""),
            ],
            part_rows,
            id_="partitions-table",
        )
        + _records_form(name, meta.partitions, None)
        + "<h2>Config</h2>"
        + table(
            [("name", "Name"), ("value", "Value"), ("source", "Source")], config_rows, id_="config"
        )
    )
    if frame.allow_writes:
        body += _delete_records_form(frame, name, meta.partitions)
    return page(frame, name, body, status_line=status)


def _records_form(topic: str, partitions: int, current: Mapping[str, str] | None) -> str:
    current = current or {}
    options = "".join(
        f"<option value='{p}'{' selected' if current.get('partition') == str(p) else ''}>{p}</option>"
        for p in range(partitions)
    )
    forms = "".join(
        f"<option value='{f}'{' selected' if current.get('format', 'auto') == f else ''}>{f}</option>"
        for f in ("auto", "text", "json", "hex")
    )
    return (
        f"<form id='records-form' method='get' action='{esc(topic_href(topic))}/records'>"
        f"<fieldset><legend>Browse records</legend>"
        f"<label>Partition <select name='partition'>{options}</select></label> "
        f"<label>Offset <input name='offset' size='10' value='{esc(current.get('offset', ''))}'></label> "
        f"<label>or time <input name='timestamp' size='22' placeholder='2026-01-01T00:00:00Z' "
        f"value='{esc(current.get('timestamp', ''))}'></label> "
        f"<label>Records <input name='limit' size='4' value='{esc(current.get('limit', '50'))}'></label> "
        f"<label>Show as <select name='format'>{forms}</select></label> "
        "<button type='submit'>Show</button></fieldset></form>"
    )


def _delete_records_form(frame: Frame, topic: str, partitions: int) -> str:
    options = "".join(f"<option value='{p}'>{p}</option>" for p in range(partitions))
    return (
        f"<h2>Delete records</h2><form id='delete-records' method='post' "
        f"action='{esc(topic_href(topic))}/delete-records'>"
        f"<input type='hidden' name='csrf' value='{esc(frame.csrf)}'>"
        f"<label>Partition <select name='partition'>{options}</select></label> "
        "<label>before offset <input name='offset' size='10'></label> "
        "<button type='submit'>Review</button> <span class='muted'>moves the log start offset "
        "up (Kafka's DeleteRecords); you confirm on the next page</span></form>"
    )


# -- records ---------------------------------------------------------------------------------------


def _shown(value: Shown) -> str:
    if value.text is None:
        return "<span class='muted'>null</span>"
    note = (
        f"<div class='muted'>{esc(value.form)}, {value.size} B{', cut' if value.cut else ''}</div>"
    )
    return f"<pre>{esc(value.text)}</pre>{note}"


def records_page(frame: Frame, result: RecordPage, asked: Mapping[str, str]) -> str:
    columns: list[tuple[str, str]] = [
        ("offset", "Offset"),
        ("timestamp", "Timestamp"),
        ("key", "Key"),
    ]
    if result.typed:
        columns += [(f"field:{c}", c) for c in result.columns]
    else:
        columns.append(("value", "Value"))
    columns.append(("headers", "Headers"))
    rows = []
    for r in result.rows:
        cells: list[tuple[str, str, bool]] = [
            ("offset", str(r.offset), True),
            (
                "timestamp",
                f"{esc(iso(r.timestamp_ms))}<div class='muted'>{esc(r.timestamp_type)}</div>",
                False,
            ),
            ("key", _shown(r.key), False),
        ]
        if result.typed and r.fields is not None:
            cells += [
                (f"field:{c}", f"<pre>{esc(r.fields.get(c))}</pre>", False) for c in result.columns
            ]
        else:
            cells.append(("value", _shown(r.value), False))
        headers = "".join(f"<div><b>{esc(k)}</b>: {_shown(v)}</div>" for k, v in r.headers) or "-"
        cells.append(("headers", headers, False))
        rows.append(({"offset": str(r.offset)}, cells))
    nav = []
    limit = max(
        1,
        len(result.rows),
        int(asked.get("limit") or 0) if str(asked.get("limit", "")).isdigit() else 0,
    )
    if result.first > result.start_offset:
        back = dict(asked)
        back.pop("timestamp", None)
        back["offset"] = str(max(result.start_offset, result.first - limit))
        nav.append(
            f"<a id='previous' href='{esc(topic_href(result.topic))}/records?{esc(urlencode(back))}'>previous records</a>"
        )
    if result.next_offset is not None:
        more = dict(asked)
        more.pop("timestamp", None)
        more["offset"] = str(result.next_offset)
        nav.append(
            f"<a id='next' href='{esc(topic_href(result.topic))}/records?{esc(urlencode(more))}'>next records</a>"
        )
    body = (
        f"<h1>Records of <a href='{esc(topic_href(result.topic))}'>{esc(result.topic)}</a>"
        f"-{result.partition}</h1>"
        f"<p class='facts'><span>Log start offset: <b id='log-start'>{result.start_offset}</b></span>"
        f"<span>Log end offset: <b id='log-end'>{result.end_offset}</b></span>"
        f"<span>From offset: <b id='from-offset'>{result.first}</b></span>"
        f"<span>Shown: <b id='shown'>{len(result.rows)}</b></span></p>"
        + _records_form(result.topic, result.partitions, asked)
        + table(columns, rows, id_="records", empty="No records in this range.")
        + " ".join(nav)
    )
    return page(frame, f"{result.topic}-{result.partition}", body, reload=False)


# -- groups ------------------------------------------------------------------------------------------


def groups_page(frame: Frame, snap: Snapshot, failure: tuple[str, int] | None) -> str:
    rows = []
    for name, facts in sorted(snap.groups.items()):
        link = f"<a href='{esc(group_href(name))}'>{esc(name)}</a>"
        desc = facts.description
        if desc is None:
            rows.append(
                (
                    {"group": name},
                    [
                        ("group", link, False),
                        ("error", f"<span class='error'>{esc(facts.error)}</span>", False),
                    ],
                )
            )
            continue
        rows.append(
            (
                {"group": name},
                [
                    ("group", link, False),
                    ("state", esc(desc.state), False),
                    ("members", str(len(desc.members)), True),
                    ("generation", str(desc.generation), True),
                    ("lag", str(desc.total_lag), True),
                    ("max_lag_seconds", esc(seconds(facts.max_lag_seconds)), True),
                    ("uncommitted", str(desc.uncommitted), True),
                ],
            )
        )
    body = "<h1>Consumer groups</h1>" + table(
        [
            ("group", "Group"),
            ("state", "State"),
            ("members", "Members"),
            ("generation", "Generation"),
            ("lag", "Lag (records)"),
            ("max_lag_seconds", "Max lag (time)"),
            ("uncommitted", "No committed offset"),
        ],
        rows,
        id_="groups",
        empty="No consumer groups.",
    )
    return page(frame, "Consumer groups", body, status_line=freshness(frame, snap, failure))


def lag_chart(samples: Sequence[LagSample], *, width: int = 640, height: int = 160) -> str:
    """The group's lag over the samples kept (an hour at most), as SVG: its total lag in
    records (blue, left scale) and its highest lag in seconds (orange, right scale)."""
    if len(samples) < 2:
        return (
            "<p class='muted' id='lag-chart'>Lag over the last hour: collecting "
            f"({len(samples)} sample so far; one per refresh).</p>"
        )
    t0, t1 = samples[0].taken_ms, samples[-1].taken_ms
    highest = max(s.lag for s in samples)
    highest_s = max(s.lag_seconds for s in samples)
    top = max(1, highest)  # the scales: a line of zeros lies on the axis
    top_s = max(1.0, highest_s)
    span = max(1, t1 - t0)
    pad = 30

    def line(values: Sequence[float], high: float) -> str:
        return " ".join(
            f"{pad + (s.taken_ms - t0) / span * (width - 2 * pad):.1f},"
            f"{height - pad - v / high * (height - 2 * pad):.1f}"
            for s, v in zip(samples, values, strict=True)
        )

    records = line([s.lag for s in samples], top)
    ages = line([s.lag_seconds for s in samples], top_s)
    return (
        f"<figure id='lag-chart'><svg width='{width}' height='{height}' role='img' "
        f"aria-label='lag over time' style='background:#fff;border:1px solid #dde2e8'>"
        f"<polyline data-series='records' fill='none' stroke='#2563c9' stroke-width='2' "
        f"points='{records}'/>"
        f"<polyline data-series='seconds' fill='none' stroke='#d9822b' stroke-width='2' "
        f"stroke-dasharray='5,3' points='{ages}'/>"
        f"<text x='4' y='{pad - 8}' font-size='11' fill='#2563c9'>highest {highest} records</text>"
        f"<text x='{width - 160}' y='{pad - 8}' font-size='11' fill='#d9822b'>"
        f"highest {esc(seconds(highest_s))}</text>"
        f"<text x='4' y='{height - 8}' font-size='11'>{esc(iso(t0))}</text>"
        f"<text x='{width - 200}' y='{height - 8}' font-size='11'>{esc(iso(t1))}</text>"
        f"</svg><figcaption class='muted'>Total lag in records (solid, left) and the highest "
        f"lag in time (dashed, right), {len(samples)} samples (one per refresh, kept for an "
        "hour while the console runs)</figcaption></figure>"
    )


def group_page(
    frame: Frame,
    snap: Snapshot,
    failure: tuple[str, int] | None,
    facts: GroupFacts,
    history: Sequence[LagSample],
) -> str:
    status = freshness(frame, snap, failure)
    name = facts.group_id
    desc = facts.description
    if desc is None:
        body = f"<h1>Group {esc(name)}</h1><p class='error' id='error'>{esc(facts.error)}</p>"
        return page(frame, name, body, status_line=status)
    assigned: dict[str, list[str]] = {}
    for p in desc.partitions:
        if p.member_id is not None:
            assigned.setdefault(p.member_id, []).append(f"{p.topic}:{p.partition}")
    member_rows = [
        (
            {"member": m.member_id},
            [
                ("member_id", esc(m.member_id), False),
                ("client_id", esc(m.client_id), False),
                ("instance_id", esc(m.instance_id or "-"), False),
                ("topics", esc(", ".join(m.topics)), False),
                ("assignment", esc(" ".join(assigned.get(m.member_id, [])) or "-"), False),
            ],
        )
        for m in desc.members
    ]
    lag_rows = [
        (
            {"topic": p.topic, "partition": str(p.partition)},
            [
                ("topic", f"<a href='{esc(topic_href(p.topic))}'>{esc(p.topic)}</a>", False),
                ("partition", str(p.partition), True),
                ("current_offset", _num(p.current_offset), True),
                ("log_end_offset", str(p.log_end_offset), True),
                ("lag", f"<span class='{'lag' if p.lag else ''}'>{_num(p.lag)}</span>", True),
                (
                    "lag_seconds",
                    f"<span data-seconds='{'' if p.lag_seconds is None else f'{p.lag_seconds:.3f}'}'>"
                    f"{esc(seconds(p.lag_seconds))}</span>",
                    True,
                ),
                ("consumer_id", esc(p.member_id or "-"), False),
                ("client_id", esc(p.client_id or "-"), False),
            ],
        )
        for p in facts.partitions
    ]
    body = (
        f"<h1>Group {esc(name)}</h1><p class='facts'>"
        f"<span>State: <b id='state'>{esc(desc.state)}</b></span>"
        f"<span>Generation: <b>{desc.generation}</b></span>"
        f"<span>Assignor: <b>{esc(desc.assignor or '-')}</b></span>"
        f"<span>Members: <b id='members-count'>{len(desc.members)}</b></span>"
        f"<span>Lag: <b id='total-lag'>{desc.total_lag}</b> records</span>"
        f"<span>Max lag: <b id='max-lag-seconds'>{esc(seconds(facts.max_lag_seconds))}</b></span></p>"
        + lag_chart(history)
        + "<h2>Members</h2>"
        + table(
            [
                ("member_id", "Member id"),
                ("client_id", "Client id"),
                ("instance_id", "Instance id"),
                ("topics", "Topics"),
                ("assignment", "Assignment"),
            ],
            member_rows,
            id_="members",
            empty="No live members.",
        )
        + "<h2>Offsets and lag</h2>"
        + table(
            [
                ("topic", "Topic"),
                ("partition", "Partition"),
                ("current_offset", "Current offset"),
                ("log_end_offset", "Log end offset"),
                ("lag", "Lag"),
                ("lag_seconds", "Lag (time)"),
                ("consumer_id", "Consumer id"),
                ("client_id", "Client id"),
            ],
            lag_rows,
            id_="lag",
            empty="The group reads no partition.",
        )
    )
    if frame.allow_writes:
        body += _reset_form(frame, name, sorted({p.topic for p in desc.partitions}))
    return page(frame, name, body, status_line=status)


def _reset_form(frame: Frame, group: str, topics: list[str]) -> str:
    options = "<option value=''>all topics the group reads</option>" + "".join(
        f"<option value='{esc(t)}'>{esc(t)}</option>" for t in topics
    )
    return (
        f"<h2>Reset offsets</h2><form id='reset-offsets' method='post' action='{esc(group_href(group))}/reset-offsets'>"
        f"<input type='hidden' name='csrf' value='{esc(frame.csrf)}'>"
        f"<label>Topic <select name='topic'>{options}</select></label> "
        "<label>to <select name='to'><option>earliest</option><option>latest</option>"
        "<option value='offset'>offset</option><option value='datetime'>datetime</option>"
        "<option value='shift'>shift by</option></select></label> "
        "<label>value <input name='value' size='22'></label> "
        "<button type='submit'>Review</button> <span class='muted'>only while the group has no live "
        "members; you confirm on the next page</span></form>"
    )


def confirm_page(
    frame: Frame, title: str, action: str, fields: Mapping[str, str], lines: Sequence[str]
) -> str:
    hidden = "".join(
        f"<input type='hidden' name='{esc(k)}' value='{esc(v)}'>" for k, v in fields.items()
    )
    items = "".join(f"<li>{esc(line)}</li>" for line in lines) or "<li>Nothing would change.</li>"
    body = (
        f"<h1>{esc(title)}</h1><p>This will change the store:</p><ul id='plan'>{items}</ul>"
        f"<form id='confirm' method='post' action='{esc(action)}'>{hidden}"
        f"<input type='hidden' name='csrf' value='{esc(frame.csrf)}'>"
        "<input type='hidden' name='confirm' value='yes'>"
        "<button type='submit' id='confirm-button'>Confirm</button> <a href='javascript:history.back()'>Cancel</a></form>"
    )
    return page(frame, title, body, reload=False)


def done_page(frame: Frame, title: str, lines: Sequence[str], back: str) -> str:
    items = "".join(f"<li>{esc(line)}</li>" for line in lines)
    body = f"<h1>{esc(title)}</h1><ul id='done'>{items}</ul><p><a href='{esc(back)}'>Back</a></p>"
    return page(frame, title, body, reload=False)


# -- maintenance ----------------------------------------------------------------------------------


def maintenance_page(frame: Frame, snap: Snapshot, failure: tuple[str, int] | None) -> str:
    status = freshness(frame, snap, failure)
    data = snap.maintenance
    if data is None:
        body = f"<h1>Maintenance</h1><p class='error' id='error'>{esc(snap.maintenance_error)}</p>"
        return page(frame, "Maintenance", body, status_line=status)
    now = int(data["now_ms"])
    task_rows: list[tuple[Mapping[str, str], Sequence[tuple[str, str, bool]]]] = []
    listed: list[tuple[str, dict[str, Any]]] = [
        (t["topic"], task) for t in data["topics"] for task in t["tasks"]
    ]
    listed += [("(store)", task) for task in data["store_tasks"]]
    for topic, task in listed:
        run = task["last_run"] or {}
        when = (
            "due"
            if task["due"]
            else (
                "-"
                if task["next_ms"] is None
                else ("now" if task["next_ms"] <= now else iso(task["next_ms"]))
            )
        )
        task_rows.append(
            (
                {"topic": topic, "task": task["task"]},
                [
                    ("topic", esc(topic), False),
                    ("task", esc(task["task"]), False),
                    ("last_run", esc(iso(run.get("finished_ms"))), False),
                    ("outcome", esc(run.get("outcome", "-")), False),
                    ("records", _num(run.get("records")), True),
                    ("bytes", _num(run.get("bytes")), True),
                    ("segments", _num(run.get("segments")), True),
                    ("files", _num(run.get("files")), True),
                    ("next", esc(when), False),
                    ("why", esc(task["reason"]), False),
                    ("running_by", esc(task["running_by"] or "-"), False),
                ],
            )
        )
    part_rows = []
    for t in data["topics"]:
        facts = snap.topics.get(t["topic"])
        for p in t["partitions"]:
            ages = [o["age_ms"] for o in p["open_transactions"] if o["age_ms"] is not None]
            producers = facts.producers.get(p["partition"], ()) if facts is not None else ()
            part_rows.append(
                (
                    {"topic": t["topic"], "partition": str(p["partition"])},
                    [
                        ("topic", esc(t["topic"]), False),
                        ("partition", str(p["partition"]), True),
                        ("segments", str(p["segments"]), True),
                        ("bytes", str(p["bytes"]), True),
                        ("log_start_offset", str(p["log_start_offset"]), True),
                        ("dirty_ratio", f"{p['dirty_ratio']:.2f}", True),
                        ("open_transactions", str(len(p["open_transactions"])), True),
                        (
                            "oldest_transaction_age",
                            esc(seconds(max(ages) / 1000) if ages else "-"),
                            True,
                        ),
                        ("producers", str(len(producers)), True),
                    ],
                )
            )
    txn_rows = [
        (
            {"topic": t["topic"], "partition": str(p["partition"])},
            [
                ("topic", esc(t["topic"]), False),
                ("partition", str(p["partition"]), True),
                ("transaction", esc(o["transaction"]), False),
                ("first_offset", str(o["first_offset"]), True),
                ("age", esc(seconds(None if o["age_ms"] is None else o["age_ms"] / 1000)), True),
            ],
        )
        for t in data["topics"]
        for p in t["partitions"]
        for o in p["open_transactions"]
    ]
    producer_rows = [
        (
            {"topic": name, "partition": str(p)},
            [
                ("topic", esc(name), False),
                ("partition", str(p), True),
                ("producer_id", esc(e.producer_id), False),
                ("epoch", str(e.epoch), True),
                ("last_sequence", str(e.last_sequence), True),
                ("last_offset", str(e.last_offset), True),
                ("last_write", esc(iso(e.timestamp_ms)), False),
            ],
        )
        for name, facts in sorted(snap.topics.items())
        for p, entries in sorted(facts.producers.items())
        for e in entries
    ]
    errors = "".join(
        f"<p class='error'>{esc(topic)}: not read: {esc(why)}</p>"
        for topic, why in sorted(data["errors"].items())
    )
    read = (
        f"<p class='muted' id='maintenance-read'>Maintenance state read at "
        f"{esc(iso(snap.maintenance_ms))} (at most once a minute: a listing per topic).</p>"
    )
    body = (
        "<h1>Maintenance</h1>"
        + read
        + errors
        + "<h2>Tasks: last run and next</h2>"
        + table(
            [
                ("topic", "Topic"),
                ("task", "Task"),
                ("last_run", "Last run"),
                ("outcome", "Outcome"),
                ("records", "Records removed"),
                ("bytes", "Bytes removed"),
                ("segments", "Segments removed"),
                ("files", "Files deleted"),
                ("next", "Next"),
                ("why", "Why"),
                ("running_by", "Running by"),
            ],
            task_rows,
            id_="tasks",
            empty="No topics.",
        )
        + "<h2>Partitions</h2>"
        + table(
            [
                ("topic", "Topic"),
                ("partition", "Partition"),
                ("segments", "Segments"),
                ("bytes", "Bytes"),
                ("log_start_offset", "Log start"),
                ("dirty_ratio", "Dirty ratio"),
                ("open_transactions", "Open transactions"),
                ("oldest_transaction_age", "Oldest transaction"),
                ("producers", "Producers"),
            ],
            part_rows,
            id_="maintenance-partitions",
        )
        + "<h2>Open transactions</h2>"
        + table(
            [
                ("topic", "Topic"),
                ("partition", "Partition"),
                ("transaction", "Transaction"),
                ("first_offset", "First offset"),
                ("age", "Age"),
            ],
            txn_rows,
            id_="transactions",
            empty="No open transactions.",
        )
        + "<h2>Producers</h2>"
        + table(
            [
                ("topic", "Topic"),
                ("partition", "Partition"),
                ("producer_id", "Producer id"),
                ("epoch", "Epoch"),
                ("last_sequence", "Last sequence"),
                ("last_offset", "Last offset"),
                ("last_write", "Last write"),
            ],
            producer_rows,
            id_="producers",
            empty="No producers recorded.",
        )
    )
    return page(frame, "Maintenance", body, status_line=status)
