"""The console (kstore.console): the snapshot's figures against the library's, the metrics
parsed as Prometheus parses them, the HTTP endpoints (status codes, bad names, unknown
topics and groups, offsets out of range, a corrupt log, a store that stops answering), the
write actions behind --allow-writes, and no credential in a page, a log line or a label."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kstore.cli.common import error_message
from kstore.console import Snapshots, build, open_coalescing_store
from kstore.console.server import ConsoleServer, serve_in_thread
from kstore.console.snapshot import lag_seconds
from prometheus_client.parser import text_string_to_metric_families

from kstore.groups import describe_group
from kstore.store import Store
from tests.console_data import (
    EXPIRED,
    Filled,
    fill,
    join_member,
    open_transaction,
    order_timestamp,
)


@pytest.fixture
def filled(tmp_path: Path) -> Filled:
    return fill((tmp_path / "store").as_uri(), {})


def snapshots_of(filled: Filled, **kwargs: Any) -> Snapshots:
    return Snapshots(
        open_coalescing_store(filled.store.url, filled.store.storage.storage_options),
        clock=lambda: filled.now_ms,
        **kwargs,
    )


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, parsed by prometheus_client's own parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in found, f"no sample {name}{labels}"
    return found[key]


# -- the snapshot ---------------------------------------------------------------------------------


def test_snapshot_equals_the_library(filled: Filled) -> None:
    snap = snapshots_of(filled).refresh()
    assert snap is not None
    store = filled.store
    assert (
        sorted(snap.topics)
        == store.list_topics()
        == ["events", "expiring", "lake", "orders", "payments"]
    )
    for name, facts in snap.topics.items():
        assert facts.error is None
        assert facts.description == store.describe_topic(name)
    assert sorted(snap.groups) == ["billing"]
    desc = describe_group(store, "billing")
    facts = snap.groups["billing"]
    assert facts.description is not None
    assert facts.description.partitions == desc.partitions
    assert [(p.topic, p.partition, p.current_offset, p.lag) for p in facts.partitions] == [
        ("orders", 0, 4, 6),
        ("orders", 1, 10, 0),
        ("orders", 2, None, None),
    ]
    # The next record orders-0 reads is offset 4, written at order_timestamp(0, 4).
    assert facts.partitions[0].lag_seconds == (filled.now_ms - order_timestamp(0, 4)) / 1000
    assert facts.partitions[1].lag_seconds == 0.0
    assert facts.partitions[2].lag_seconds is None
    assert facts.max_lag == 6


def test_maintenance_run_shown(filled: Filled) -> None:
    snap = snapshots_of(filled).refresh()
    assert snap is not None
    assert snap.maintenance is not None
    (expiring,) = [t for t in snap.maintenance["topics"] if t["topic"] == "expiring"]
    (retention,) = [t for t in expiring["tasks"] if t["task"] == "retention"]
    assert retention["last_run"]["outcome"] == "ok"
    assert retention["last_run"]["records"] == EXPIRED
    assert snap.topics["expiring"].description is not None
    assert snap.topics["expiring"].description.partitions[0].log_start_offset == EXPIRED


def test_lag_seconds_from_the_manifest(filled: Filled) -> None:
    store = filled.store
    state = store.partition_state("orders", 0)
    now = filled.now_ms
    assert lag_seconds(state, None, now) is None
    assert lag_seconds(state, 10, now) == 0.0  # caught up
    assert lag_seconds(state, 99, now) == 0.0  # past the end: nothing to read
    assert lag_seconds(state, 0, now) == (now - order_timestamp(0, 0)) / 1000
    assert lag_seconds(state, 9, now) == (now - order_timestamp(0, 9)) / 1000
    assert (
        lag_seconds(state, 0, order_timestamp(0, 0) - 5000) == 0.0
    )  # a clock behind: not negative


def test_a_refresh_reads_each_path_once_and_pages_read_nothing(filled: Filled) -> None:
    """The coalescing storage: a refresh sends each distinct read once, so that its calls do
    not grow with the number of partitions a group reads; pages and scrapes send none."""
    server = build(filled.store.url, {}, port=0, refresh_s=3600)
    try:
        snapshots = server.console.snapshots
        storage = snapshots.store.storage
        first = snapshots.refresh()
        second = snapshots.refresh()
        assert first is not None
        assert second is not None
        # The second refresh polls: the topic list, each topic's metadata log and topic log,
        # the Delta topic's table log, the group list, the group's log (loaded anew: its
        # checkpoint pointer, a listing, its two commits, a look for the next) and its
        # leases; the maintenance records only every minute.
        topics = len(second.topics)
        assert second.storage_calls == 1 + 2 * topics + 1 + 1 + 5 + 1
        assert first.storage_calls > second.storage_calls + topics  # maintenance read once
        serve_in_thread(server)
        sent = storage.sent
        reached = sum(storage.reached.values())  # every call, from any thread
        for path in (
            "/",
            "/groups",
            "/groups/billing",
            "/maintenance",
            "/metrics",
            "/topics/orders",
        ):
            for _ in range(5):
                assert get(server, path)[0] == 200
        assert storage.sent == sent
        assert sum(storage.reached.values()) == reached
    finally:
        server.stop()


def test_delta_table_as_topics_describe_shows_it(filled: Filled) -> None:
    from kstore.cli.app import app
    from typer.testing import CliRunner

    snap = snapshots_of(filled).refresh()
    assert snap is not None
    result = CliRunner().invoke(
        app, ["--store", filled.store.url, "topics", "describe", "lake", "-o", "json"]
    )
    assert result.exit_code == 0, result.stderr
    (described,) = json.loads(result.stdout)
    assert snap.topics["lake"].table == described["table"]
    assert described["table"]["version"] == 0  # published once by fill()
    assert snap.topics["orders"].table is None


def test_maintenance_state_read_at_its_own_pace(filled: Filled) -> None:
    now = [filled.now_ms]
    snapshots = Snapshots(
        open_coalescing_store(filled.store.url, {}),
        refresh_s=5,
        maintenance_refresh_s=60,
        clock=lambda: now[0],
    )
    first = snapshots.refresh()
    now[0] += 30_000
    second = snapshots.refresh()
    now[0] += 31_000
    third = snapshots.refresh()
    assert first is not None
    assert second is not None
    assert third is not None
    assert first.maintenance_ms == second.maintenance_ms == filled.now_ms
    assert second.maintenance is first.maintenance
    assert third.maintenance_ms == filled.now_ms + 61_000


def test_a_corrupt_topic_log_is_one_message(filled: Filled, tmp_path: Path) -> None:
    meta = filled.store.topic("events")
    root = tmp_path / "store" / "topics" / "events" / meta.topic_id / "_log"
    newest = sorted(root.glob("*.json"))[-1]
    newest.write_bytes(b"{ this is not a commit")
    snap = snapshots_of(filled, explain=error_message).refresh()  # as kstore ui explains
    assert snap is not None
    events = snap.topics["events"]
    assert events.description is None
    assert events.error is not None
    assert "kstore topics recover events" in events.error
    assert snap.topics["orders"].error is None  # the others are still shown
    server = build(filled.store.url, {}, port=0, refresh_s=3600, explain=error_message)
    server.console.snapshots.refresh()
    serve_in_thread(server)
    try:
        status, body, _ = get(server, "/topics/events")
        listed = get(server, "/")[1]
    finally:
        server.stop()
    assert status == 200
    assert "kstore topics recover events" in error_of(body)
    assert "Traceback" not in body
    assert "data-topic='orders'" in listed
    assert "data-topic='events'" in listed


def next_commit(log_dir: Path) -> Path:
    """The path of the next version of a log (a commit no one has written yet)."""
    versions = [int(p.name[:20]) for p in log_dir.glob("*.json") if p.name[:20].isdigit()]
    return log_dir / f"{max(versions) + 1:020d}.json"


def test_a_corrupt_group_log_is_one_message(filled: Filled, tmp_path: Path) -> None:
    """A group whose next commit is garbage: the refresh still succeeds, the group is listed
    with its error, its page is that one message, its metric says unreadable, and the rest of
    the store is shown as usual (kstore.groups.list_groups raises for the whole store)."""
    server = build(filled.store.url, {}, port=0, refresh_s=3600, explain=error_message)
    try:
        assert server.console.snapshots.refresh() is not None
        corrupt = next_commit(tmp_path / "store" / "groups" / "billing" / "_log")
        corrupt.write_bytes(b"{ corrupt")
        assert server.console.snapshots.refresh() is not None
        serve_in_thread(server)
        status, body, _ = get(server, "/groups/billing")
        listed = get(server, "/groups")[1]
        overview = get(server, "/")[1]
        found = samples(get(server, "/metrics")[1])
    finally:
        server.stop()
    assert status == 200
    assert f"groups/billing/_log/{corrupt.name}: truncated" in error_of(body)
    assert "Traceback" not in body
    assert "id='lag'" not in body
    assert "data-group='billing'" in listed
    assert "truncated" in listed
    assert "id='stale'" not in overview  # the store itself was read
    assert "data-topic='orders'" in overview
    assert value(found, "kstore_consumergroup_readable", group="billing") == 0
    assert value(found, "kstore_up") == 1


def test_a_corrupt_topic_log_on_the_records_page(filled: Filled, tmp_path: Path) -> None:
    """The topic's next commit turns to garbage under a running console: the record browser
    (which reads the store itself) answers one message naming the recovery, with status 500,
    and the topic's page says the same after the next refresh."""
    server = build(filled.store.url, {}, port=0, refresh_s=3600, explain=error_message)
    try:
        assert server.console.snapshots.refresh() is not None
        serve_in_thread(server)
        assert get(server, "/topics/events/records?partition=0&offset=0")[0] == 200
        meta = filled.store.topic("events")
        log = tmp_path / "store" / "topics" / "events" / meta.topic_id / "_log"
        next_commit(log).write_bytes(b"{ corrupt")
        status, body, _ = get(server, "/topics/events/records?partition=0&offset=0")
        assert status == 500
        assert "kstore topics recover events" in error_of(body)
        assert "Traceback" not in body
        assert server.console.snapshots.refresh() is not None
        status, body, _ = get(server, "/topics/events")
        assert status == 200
        assert "kstore topics recover events" in error_of(body)
        assert get(server, "/topics/orders/records?partition=0&offset=0")[0] == 200
    finally:
        server.stop()


def test_a_live_member_and_its_assignment(filled: Filled) -> None:
    """A group with a consumer in it: the page lists the member, its client id and
    assignment, and the partition's consumer, as describe_group has them; the metrics
    count it and label its partition's lag with its consumer id."""
    member = join_member(filled.store)
    try:
        server = build(filled.store.url, {}, port=0, refresh_s=3600, cluster_name="test")
        try:
            server.console.snapshots.refresh()
            serve_in_thread(server)
            page = get(server, "/groups/readers")[1]
            found = samples(get(server, "/metrics")[1])
        finally:
            server.stop()
        desc = describe_group(filled.store, "readers")
    finally:
        member.close()
    (live,) = desc.members
    assert desc.state == "Stable"
    assert f"data-member='{live.member_id}'" in page
    assert "console-test-reader" in page
    assert "events:0" in page
    assert "<b id='state'>Stable</b>" in page
    assert "<b id='members-count'>1</b>" in page
    assert value(found, "kafka_consumergroup_members", consumergroup="readers") == 1
    labels = {
        "cluster_name": "test",
        "group": "readers",
        "topic": "events",
        "partition": "0",
        "member_host": "",
        "consumer_id": live.member_id,
        "client_id": "console-test-reader",
    }
    assert value(found, "kafka_consumergroup_group_lag", **labels) == 0
    simple = {"cluster_name": "test", "group": "readers", "is_simple_consumer": "false"}
    assert value(found, "kafka_consumergroup_group_max_lag", **simple) == 0


def test_lag_over_the_last_hour(filled: Filled) -> None:
    """One sample per refresh, an hour of them kept: the group page draws the total lag in
    records and the highest lag in seconds over them."""
    now = [filled.now_ms]
    server = build(filled.store.url, {}, port=0, refresh_s=3600)
    try:
        snapshots = server.console.snapshots
        snapshots.clock = lambda: now[0]
        snapshots.refresh()
        serve_in_thread(server)
        assert "collecting (1 sample so far" in get(server, "/groups/billing")[1]
        for step in (60_000, 60_000, 3_600_000 - 60_000):
            now[0] += step
            snapshots.refresh()
        history = snapshots.group_history("billing")
        page = get(server, "/groups/billing")[1]
    finally:
        server.stop()
    # The first sample is over an hour old at the last refresh: dropped.
    assert [s.taken_ms - filled.now_ms for s in history] == [60_000, 120_000, 3_660_000]
    assert [s.lag for s in history] == [6, 6, 6]
    age = (filled.now_ms - order_timestamp(0, 4)) / 1000
    assert [s.lag_seconds for s in history] == [age + 60, age + 120, age + 3660]
    for series in ("records", "seconds"):
        start = page.index(f"data-series='{series}'")
        points = page[page.index("points='", start) + 8 : page.index("'/>", start)]
        assert len(points.split()) == 3, series
    assert "highest 6 records" in page
    assert "3 samples" in page


# -- metrics --------------------------------------------------------------------------------------


def test_metrics_values(filled: Filled) -> None:
    server = build(filled.store.url, {}, port=0, refresh_s=3600, cluster_name="test")
    try:
        server.console.snapshots.clock = lambda: filled.now_ms
        server.console.snapshots.refresh()
        serve_in_thread(server)
        status, body, headers = get(server, "/metrics")
    finally:
        server.stop()
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    found = samples(body)
    desc = filled.store.describe_topic("orders")
    for p in desc.partitions:
        labels = {"cluster_name": "test", "topic": "orders", "partition": str(p.partition)}
        assert value(found, "kafka_partition_latest_offset", **labels) == p.log_end_offset
        assert value(found, "kafka_partition_earliest_offset", **labels) == p.log_start_offset
        tp = {"topic": "orders", "partition": str(p.partition)}
        assert value(found, "kstore_partition_records", **tp) == p.records
        assert value(found, "kstore_partition_bytes", **tp) == p.size_bytes
        assert value(found, "kstore_partition_segments", **tp) == p.segments
        assert value(found, "kafka_topic_partition_current_offset", **tp) == p.log_end_offset
    assert value(found, "kafka_topic_partitions", topic="orders") == 3
    member = {
        "cluster_name": "test",
        "group": "billing",
        "topic": "orders",
        "member_host": "",
        "consumer_id": "",
        "client_id": "",
    }
    assert value(found, "kafka_consumergroup_group_lag", partition="0", **member) == 6
    assert value(found, "kafka_consumergroup_group_lag", partition="1", **member) == 0
    assert value(found, "kafka_consumergroup_group_offset", partition="0", **member) == 4
    assert value(found, "kafka_consumergroup_group_lag_seconds", partition="0", **member) == (
        (filled.now_ms - order_timestamp(0, 4)) / 1000
    )
    # No committed offset on orders-2: no series, as kafka-lag-exporter.
    assert (
        "kafka_consumergroup_group_lag",
        tuple(sorted({**member, "partition": "2"}.items())),
    ) not in found
    group = {"cluster_name": "test", "group": "billing", "is_simple_consumer": "true"}
    assert value(found, "kafka_consumergroup_group_max_lag", **group) == 6
    assert value(found, "kafka_consumergroup_group_max_lag_seconds", **group) == 35.0
    assert (
        value(found, "kafka_consumergroup_group_sum_lag", cluster_name="test", group="billing") == 6
    )
    assert (
        value(
            found,
            "kafka_consumergroup_group_topic_sum_lag",
            cluster_name="test",
            group="billing",
            topic="orders",
        )
        == 6
    )
    assert (
        value(
            found, "kafka_consumergroup_lag", consumergroup="billing", topic="orders", partition="0"
        )
        == 6
    )
    assert value(found, "kafka_consumergroup_members", consumergroup="billing") == 0
    assert value(found, "kstore_consumergroup_uncommitted_partitions", group="billing") == 1
    run = {"topic": "expiring", "task": "retention"}
    assert value(found, "kstore_maintenance_last_run_removed_records", **run) == EXPIRED
    last = value(found, "kstore_maintenance_last_run_timestamp_seconds", outcome="ok", **run)
    assert last > 0
    assert value(found, "kstore_up") == 1
    assert value(found, "kstore_refreshes_total", result="ok") == 1


def test_open_transaction_in_metrics_and_page(filled: Filled) -> None:
    producer = open_transaction(filled.store)
    try:
        server = build(filled.store.url, {}, port=0, refresh_s=3600)
        try:
            server.console.snapshots.refresh()
            serve_in_thread(server)
            found = samples(get(server, "/metrics")[1])
            page = get(server, "/maintenance")[1]
        finally:
            server.stop()
    finally:
        producer.abort_transaction()
        producer.close()
    assert value(found, "kstore_partition_open_transactions", topic="events", partition="0") == 1
    age = value(
        found, "kstore_partition_oldest_open_transaction_age_seconds", topic="events", partition="0"
    )
    assert 0 < age < 600  # opened by this test, moments ago
    assert value(found, "kstore_partition_open_transactions", topic="orders", partition="0") == 0
    assert "id='transactions'" in page
    assert producer.producer_id in page


# -- HTTP -----------------------------------------------------------------------------------------


def get(server: ConsoleServer, path: str) -> tuple[int, str, Any]:
    try:
        with urllib.request.urlopen(server.url + path, timeout=60) as answer:
            return answer.status, answer.read().decode(), answer.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), exc.headers


def post(server: ConsoleServer, path: str, form: dict[str, str]) -> tuple[int, str]:
    data = urllib.parse.urlencode(form).encode()
    try:
        with urllib.request.urlopen(server.url + path, data=data, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def console(filled: Filled) -> Iterator[ConsoleServer]:
    server = build(filled.store.url, {}, port=0, refresh_s=3600)
    server.console.snapshots.refresh()
    serve_in_thread(server)
    yield server
    server.stop()


def error_of(body: str) -> str:
    start = body.index("id='error'>") + len("id='error'>")
    return body[start : body.index("</p>", start)]


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/topics/nope", 404, "topic &#x27;nope&#x27; does not exist"),
        ("/groups/nope", 404, "consumer group &#x27;nope&#x27; does not exist"),
        ("/topics/bad%20name", 400, "invalid topic name"),
        ("/topics/..", 400, "must not be"),
        ("/topics/a%2F..%2Fb", 400, "invalid topic name"),
        ("/groups/" + "g" * 250, 400, "the limit is 249"),
        ("/topics/orders/records?partition=9", 404, "has partitions 0..2; 9 does not exist"),
        ("/topics/orders/records?partition=0&offset=99", 400, "outside the live range [0, 10]"),
        (
            "/topics/expiring/records?partition=0&offset=0",
            400,
            f"outside the live range [{EXPIRED}, {EXPIRED}]",
        ),
        ("/topics/orders/records?partition=x", 400, "partition must be an integer"),
        ("/topics/orders/records?limit=0", 400, "limit must be at least 1"),
        ("/topics/orders/records?limit=100000", 400, "limit must be in [1, 500]"),
        ("/topics/orders/records?format=xml", 400, "format must be one of"),
        ("/topics/orders/records?timestamp=yesterday", 400, "timestamp must be an ISO 8601 time"),
        ("/topics/orders/records?timestamp=99999999999999999999", 400, "to the end of 9999"),
        ("/topics/orders/records?timestamp=-5", 400, "timestamp must be from 1970"),
        ("/topics/orders/records?offset=-1", 400, "offset must be at least 0"),
        ("/groups/billing/reset-offsets", 404, "no page at"),  # actions are POSTs only
        ("/topics/orders/delete-records", 404, "no page at"),
        ("/nothing/here", 404, "no page at"),
    ],
)
def test_bad_requests_get_one_message(
    console: ConsoleServer, path: str, status: int, message: str
) -> None:
    got, body, _ = get(console, path)
    assert got == status
    assert message in error_of(body)
    assert "Traceback" not in body


def test_pages_answer(console: ConsoleServer) -> None:
    for path in ("/", "/groups", "/groups/billing", "/maintenance", "/topics/orders", "/healthz"):
        assert get(console, path)[0] == 200, path
    assert get(console, "/topics")[0] == 200  # redirected to /


def test_other_host_names_refused(console: ConsoleServer) -> None:
    """DNS rebinding: a page of another site whose name now points at 127.0.0.1."""
    port = console.server_address[1]
    for host, status in (
        (f"evil.example:{port}", 403),
        (f"localhost:{port}", 200),
        (f"127.0.0.1:{port}", 200),
    ):
        request = urllib.request.Request(console.url + "/", headers={"Host": host})
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                got, body = answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            got, body = exc.code, exc.read().decode()
        assert ("answers to" in body) == (status == 403), host
        assert got == status, host


def test_records_page(console: ConsoleServer) -> None:
    status, body, _ = get(console, "/topics/orders/records?partition=1&offset=3&limit=2")
    assert status == 200
    assert "data-offset='3'" in body
    assert "data-offset='4'" in body
    assert "data-offset='5'" not in body
    assert "k1-3" in body
    assert "&quot;n&quot;: 3" in body
    assert "source" in body
    assert "ff 03" in body
    hexed = get(console, "/topics/events/records?partition=0&offset=0&format=hex")[1]
    assert "00 fe ff 10" in hexed
    assert "70 6c 61 69 6e" in hexed
    # format=text: the value as written, not re-indented; format=json on a value that is not
    # JSON says so; format=hex: keys, values and headers as bytes.
    text = get(console, "/topics/orders/records?partition=1&offset=3&limit=1&format=text")[1]
    assert "{&quot;n&quot;: 3, &quot;p&quot;: 1}</pre><div class='muted'>text, " in text
    not_json = get(console, "/topics/events/records?partition=0&offset=1&format=json")[1]
    assert "plain text</pre><div class='muted'>text (not JSON), 10 B" in not_json
    assert "ff 00</pre><div class='muted'>hex" in not_json  # a key that is not UTF-8
    hex_headers = get(console, "/topics/orders/records?partition=1&offset=3&limit=1&format=hex")[1]
    assert "<b>source</b>: <pre>74 65 73 74</pre>" in hex_headers
    typed = get(console, "/topics/payments/records?partition=0&offset=0")[1]
    assert "data-col='field:user'" in typed
    assert "u3" in typed
    assert "4.5" in typed
    newest = get(console, "/topics/orders/records?partition=2&limit=3")[1]
    assert "data-offset='7'" in newest
    assert "data-offset='9'" in newest
    assert "data-offset='6'" not in newest
    by_time = get(
        console, f"/topics/orders/records?partition=0&timestamp={order_timestamp(0, 6)}&limit=1"
    )[1]
    assert "data-offset='6'" in by_time
    assert "data-offset='7'" not in by_time


def request(server: ConsoleServer, method: str, path: str, data: bytes = b"") -> tuple[int, str]:
    made = urllib.request.Request(server.url + path, data=data, method=method)
    try:
        with urllib.request.urlopen(made, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_read_only_by_default(console: ConsoleServer, filled: Filled) -> None:
    """Without --allow-writes: no form on any page, every POST refused (even with the form
    token and the confirmation), the other methods refused, and the store unchanged."""
    offsets = describe_group(filled.store, "billing").partitions
    for path in ("/groups/billing", "/topics/orders"):
        page = get(console, path)[1]
        assert "reset-offsets" not in page
        assert "delete-records" not in page
        assert console.console.frame.csrf not in page
    token = console.console.frame.csrf  # even the right token changes nothing
    for path, form in (
        ("/topics/orders/delete-records", {"partition": "0", "offset": "5"}),
        ("/groups/billing/reset-offsets", {"topic": "orders", "to": "latest", "value": ""}),
    ):
        for extra in ({}, {"confirm": "yes"}, {"confirm": "yes", "csrf": token}):
            status, body = post(console, path, {**form, **extra})
            assert status == 403, (path, extra)
            assert "this console is read-only: start it with --allow-writes" in error_of(body)
        for method in ("PUT", "DELETE", "PATCH"):
            status, body = request(console, method, path, b"confirm=yes")
            assert status == 405, (method, path)
            assert f"{method} is not served here" in error_of(body)
    assert filled.store.partition_state("orders", 0).start_offset == 0
    assert describe_group(filled.store, "billing").partitions == offsets


def test_writes_need_the_form_token_and_a_confirmation(filled: Filled) -> None:
    server = build(filled.store.url, {}, port=0, refresh_s=3600, allow_writes=True)
    server.console.snapshots.refresh()
    serve_in_thread(server)
    try:
        token = server.console.frame.csrf
        assert token in get(server, "/topics/orders")[1]
        status, body = post(
            server,
            "/topics/orders/delete-records",
            {"partition": "0", "offset": "5", "confirm": "yes"},
        )
        assert status == 403
        assert "stale" in body
        status, body = post(
            server,
            "/topics/orders/delete-records",
            {"partition": "0", "offset": "5", "csrf": token},
        )
        assert status == 200
        assert "log start offset 0 -&gt; 5" in body
        assert "id='confirm'" in body
        assert filled.store.partition_state("orders", 0).start_offset == 0  # not yet
        status, body = post(
            server,
            "/topics/orders/delete-records",
            {"partition": "0", "offset": "99", "csrf": token},
        )
        assert status == 400
        assert "outside the live range" in body
        status, body = post(
            server,
            "/topics/orders/delete-records",
            {"partition": "0", "offset": "5", "csrf": token, "confirm": "yes"},
        )
        assert status == 200
        assert "starts at offset 5" in body
        assert filled.store.partition_state("orders", 0).start_offset == 5
        # Reset: a dry run first, then the commit.
        form = {"topic": "orders", "to": "earliest", "value": "", "csrf": token}
        status, body = post(server, "/groups/billing/reset-offsets", form)
        assert status == 200
        assert "orders-0: -&gt; 5" in body
        assert describe_group(filled.store, "billing").partitions[0].current_offset == 4
        status, body = post(server, "/groups/billing/reset-offsets", {**form, "confirm": "yes"})
        assert status == 200
        offsets = {
            (p.topic, p.partition): p.current_offset
            for p in describe_group(filled.store, "billing").partitions
        }
        assert offsets == {("orders", 0): 5, ("orders", 1): 0, ("orders", 2): 0}
        status, body = post(server, "/groups/billing/reset-offsets", {**form, "to": "sideways"})
        assert status == 400
        assert "to must be" in body
        status, body = post(server, "/groups/nope/reset-offsets", form)
        assert status == 404
        # A group with a live member: refused, as kstore groups reset-offsets refuses it.
        member = join_member(filled.store)
        try:
            server.console.snapshots.refresh()
            before = describe_group(filled.store, "readers").partitions
            status, body = post(
                server,
                "/groups/readers/reset-offsets",
                {"topic": "events", "to": "earliest", "value": "", "csrf": token, "confirm": "yes"},
            )
            assert status == 400
            assert "member" in error_of(body)
            assert describe_group(filled.store, "readers").partitions == before
        finally:
            member.close()
    finally:
        server.stop()


def test_store_without_store_refused(tmp_path: Path) -> None:
    from kstore.errors import StoreNotFoundError

    with pytest.raises(StoreNotFoundError):
        build((tmp_path / "empty").as_uri(), {}, port=0)


@pytest.mark.s3
def test_store_that_stops_answering(tmp_path: Path) -> None:
    """SeaweedFS stopped under a running console: the pages keep the last figures with one
    warning, a first read gives a 503 page, /healthz says so, and kstore_up drops to 0."""
    from tests.servers import SeaweedServer

    server_s3 = SeaweedServer(tmp_path / "weed")
    server_s3.start()
    try:
        url, options = server_s3.new_store_url()
        options = {**options, "timeout_ms": 3000, "attempt_timeout_ms": 1000}
        Store(url, options, create=True).create_topic("t", 1)
        live = build(url, options, port=0, refresh_s=3600)
        cold = build(url, options, port=0, refresh_s=3600)
        serve_in_thread(live)
        serve_in_thread(cold)
        try:
            assert live.console.snapshots.refresh() is not None
            server_s3.stop()
            assert live.console.snapshots.refresh() is None
            assert cold.console.snapshots.refresh() is None
            status, body, _ = get(live, "/")
            assert status == 200
            assert "id='stale'" in body
            assert "could not be read" in body
            assert "data-topic='t'" in body
            assert get(live, "/healthz")[0] == 503
            assert value(samples(get(live, "/metrics")[1]), "kstore_up") == 0
            status, body, _ = get(cold, "/groups")
            assert status == 503
            assert "the store could not be read" in error_of(body)
            assert "Traceback" not in body
            # The record browser reads the store itself: one message, 503.
            status, body, _ = get(live, "/topics/t/records?partition=0&offset=0")
            assert status == 503
            assert "Traceback" not in body
            assert error_of(body)
        finally:
            live.stop()
            cold.stop()
    finally:
        server_s3.close()


@pytest.mark.s3
def test_no_credential_in_pages_metrics_or_log(seaweed_server: Any) -> None:
    """A secret storage option and a URL's embedded credentials never appear in a page,
    the metrics or the request log (SeaweedFS accepts any key)."""
    from kstore.cli.common import Redactor, secrets_of_options

    url, options = seaweed_server.new_store_url()
    secret = "s3cr3t-" + os.urandom(6).hex()
    options = {**options, "secret": secret}
    Store(url, options, create=True).create_topic("t", 1)
    lines: list[str] = []
    redact = Redactor(secrets_of_options(options))
    server = build(url, options, port=0, refresh_s=3600, redact=redact, log=lines.append)
    server.console.snapshots.refresh()
    serve_in_thread(server)
    try:
        bodies = [
            get(server, p)[1]
            for p in ("/", "/topics/t", "/maintenance", "/metrics", f"/topics/{secret}")
        ]
        bodies.append(get(server, "/topics/t/records?offset=" + secret)[1])
    finally:
        server.stop()
    assert lines, "requests were logged"
    for text in [*bodies, *lines]:
        assert secret not in text
    # Storage requests by kind, counted on S3: this console's refresh listed and read.
    kinds = {
        labels[0][1]: n
        for (name, labels), n in samples(bodies[3]).items()
        if name == "kstore_storage_requests_total"
    }
    assert kinds["LIST"] > 0
    assert kinds["GET"] > 0


# -- bounded cost: many clients, one refresh per interval -----------------------------------------


@pytest.fixture(params=["local", pytest.param("seaweed", marks=pytest.mark.s3)])
def any_filled(request: pytest.FixtureRequest) -> Filled:
    url, options = request.getfixturevalue(f"{request.param}_store")
    return fill(url, options)


PAGES = (
    "/",
    "/groups",
    "/groups/billing",
    "/maintenance",
    "/metrics",
    "/topics/orders",
    "/topics/lake",
    "/healthz",
)


def hammer(server: ConsoleServer, seconds: float, clients: int = 8) -> int:
    """``clients`` threads loading every page and /metrics as fast as they can for
    ``seconds``: the number of answers, each checked to be 200."""
    import threading
    import time

    deadline = time.monotonic() + seconds
    served = [0] * clients
    failed: list[str] = []

    def client(i: int) -> None:
        while time.monotonic() < deadline and not failed:
            path = PAGES[served[i] % len(PAGES)]
            status = get(server, path)[0]
            if status != 200:
                failed.append(f"{path}: {status}")
            served[i] += 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failed, failed
    return sum(served)


def test_concurrent_clients_cost_one_refresh_per_interval(any_filled: Filled) -> None:
    """Eight clients loading pages and scraping at once: with no refresh due the store sees
    no request at all (counted at the console's storage, and on S3 by the S3 client); with
    the refresh thread at 0.5 s, every path (each topic log, group log, listing) is read at
    most once per refresh, and on S3 the requests are those of the refreshes alone."""
    from kstore.console import CoalescingStorage

    filled = any_filled
    server = build(filled.store.url, filled.store.storage.storage_options, port=0, refresh_s=0.5)
    snapshots = server.console.snapshots
    storage = snapshots.store.storage
    assert isinstance(storage, CoalescingStorage)
    on_s3 = storage.counts_requests
    try:
        assert snapshots.refresh() is not None  # the first: every log from its checkpoint
        with storage.count_requests() if on_s3 else _no_counter() as one_refresh:
            assert snapshots.refresh() is not None
        serve_in_thread(server)
        before = sum(storage.reached.values())
        with storage.count_requests() if on_s3 else _no_counter() as s3:
            served = hammer(server, 1.5)
        assert served >= 8 * len(PAGES)
        assert sum(storage.reached.values()) == before
        assert sum(s3.values()) == 0

        storage.reached.clear()
        done = snapshots.refreshes + snapshots.failures
        with storage.count_requests() if on_s3 else _no_counter() as s3:
            snapshots.start()
            served = hammer(server, 3.0)
            snapshots.stop()
        refreshes = snapshots.refreshes + snapshots.failures - done
        assert snapshots.failures == 0
        assert refreshes >= 2
        assert served >= refreshes * len(PAGES)
        read = dict(storage.reached)
        for topic in ("orders", "events", "payments", "expiring", "lake"):
            topic_id = filled.store.topic(topic).topic_id
            log = f"topics/{topic}/{topic_id}/_log/"
            assert any(path.startswith(log) for _, path in read), f"{topic}'s log was not read"
        assert ("list_dir", "groups/billing/_log") in read
        over = {key: n for key, n in read.items() if n > refreshes}
        assert not over, f"read more than once per refresh ({refreshes} refreshes): {over}"
        if on_s3:
            assert sum(one_refresh.values()) > 0
            assert sum(s3.values()) <= refreshes * sum(one_refresh.values())
    finally:
        server.stop()


@contextlib.contextmanager
def _no_counter() -> Iterator[collections.Counter[str]]:
    yield collections.Counter()


def test_the_documented_alerts_name_served_metrics(filled: Filled) -> None:
    """Every metric docs/OPERATIONS.md's scrape config and alert rules name is one /metrics
    serves (with an open transaction and a maintenance run, so that each has samples)."""
    import re

    text = (Path(__file__).parent.parent / "docs" / "OPERATIONS.md").read_text()
    section = text[text.index("### The web console and Prometheus") :]
    scrape, rules = re.findall(r"```yaml\n(.*?)```", section, re.S)[:2]
    assert "scrape_configs:" in scrape
    exprs = re.findall(r"^\s*expr: (.*)$", rules, re.M)
    assert len(exprs) == 4
    named = {name for expr in exprs for name in re.findall(r"\b(?:kafka|kstore)_[a-z_]+", expr)}
    assert "kafka_consumergroup_group_max_lag_seconds" in named
    producer = open_transaction(filled.store)
    try:
        server = build(filled.store.url, {}, port=0, refresh_s=3600)
        try:
            server.console.snapshots.refresh()
            serve_in_thread(server)
            served = {name for name, _ in samples(get(server, "/metrics")[1])}
        finally:
            server.stop()
    finally:
        producer.abort_transaction()
        producer.close()
    assert named <= served, named - served
