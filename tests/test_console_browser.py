"""The console in a real browser: ``kstore --store URL ui`` started as a user starts it, every
page opened in headless Chromium (Debian's, driven by Playwright) against stores with data on
local disk and on SeaweedFS, and the figures shown checked against ``kstore topics describe``
and ``kstore groups describe``. A screenshot of each page is written to the test's directory,
and, for the local store, to ``$KSTORE_CONSOLE_SCREENSHOTS`` when set (docs/console/ holds the
committed ones).

Chromium comes from Debian's ``chromium`` package: ``make test`` installs it when it is missing
and the machine allows (root, apt). In CI a missing browser fails these tests; elsewhere they
are skipped, saying so.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kstore.cli.app import app
from typer.testing import CliRunner

from tests.console_data import EXPIRED, fill, join_member, open_transaction, order_timestamp

CHROMIUM = os.environ.get("KSTORE_CHROMIUM", "/usr/bin/chromium")
# Chromium on a machine with no network but loopback: no background connections, no GPU.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
STARTUP_S = 120


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        why = (
            f"no Chromium at {CHROMIUM}: `make test` installs Debian's chromium as root, or "
            "`apt-get install chromium`, or set KSTORE_CHROMIUM"
        )
        if os.environ.get("CI"):
            pytest.fail(why)  # never skipped in CI
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as driver:
        # Playwright gives each launch a fresh, empty profile (--user-data-dir) of its own.
        launched = driver.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            yield launched
        finally:
            launched.close()


@dataclass
class Running:
    url: str  # the console's
    store_args: list[str]
    process: subprocess.Popen[str]


def option_args(options: dict[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for key, value in options.items():
        if isinstance(value, dict):
            out += option_args(value, f"{prefix}{key}.")
        else:
            out += ["--option", f"{prefix}{key}={value}"]
    return out


def start_ui(store_args: list[str], *extra: str) -> Running:
    """``kstore --store URL ui --port 0 ...`` in a process of its own; its URL from the line
    it prints."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KSTORE_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "kstore.cli.app", *store_args, "ui", "--port", "0", *extra],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert process.stderr is not None
    began = time.monotonic()
    seen = []
    while time.monotonic() - began < STARTUP_S:
        line = process.stderr.readline()
        if not line:
            break
        seen.append(line)
        found = re.search(r"at (http://127\.0\.0\.1:\d+)/", line)
        if found:
            wait_ready(found.group(1), began)
            return Running(found.group(1), store_args, process)
    process.kill()
    raise AssertionError(f"kstore ui did not start: {''.join(seen)}")


def wait_ready(url: str, began: float) -> None:
    """Until /healthz says the first refresh has read the store."""
    import urllib.error
    import urllib.request

    while time.monotonic() - began < STARTUP_S:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=10) as answer:
                if answer.status == 200:
                    return
        except urllib.error.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url}: the console did not read the store in {STARTUP_S} s")


def stop_ui(running: Running, how: signal.Signals = signal.SIGINT) -> str:
    running.process.send_signal(how)
    try:
        _, err = running.process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        running.process.kill()
        raise
    assert running.process.returncode == 0, err
    return err


def cli_json(store_args: list[str], *args: str) -> Any:
    result = CliRunner().invoke(app, [*store_args, *args, "-o", "json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def shot(page: Any, tmp_path: Path, name: str, keep: bool = True) -> None:
    """A screenshot in the test's directory; also in $KSTORE_CONSOLE_SCREENSHOTS when set and
    ``keep`` (the committed ones are of a local store)."""
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    wanted = os.environ.get("KSTORE_CONSOLE_SCREENSHOTS")
    if wanted and keep:
        Path(wanted).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(wanted) / f"{name}.png"), full_page=True)


def pause(page: Any) -> None:
    """Tick the page's "pause reloading" box, so that it does not reload (every --refresh)
    while it is being read."""
    if page.locator("#paused").count():
        page.check("#paused")


def cell(page: Any, table: str, row: str, col: str) -> str:
    text: str = page.locator(f"#{table} tr{row} td[data-col='{col}']").inner_text()
    return text.strip()


@dataclass
class Filled:
    backend: str
    store_args: list[str]
    store: Any  # kstore.store.Store


@pytest.fixture(params=["local", pytest.param("seaweed", marks=pytest.mark.s3)])
def filled_store(request: pytest.FixtureRequest) -> Filled:
    url, options = request.getfixturevalue(f"{request.param}_store")
    filled = fill(url, options)
    return Filled(request.param, ["--store", url, *option_args(options)], filled.store)


def iso(ms: int | None) -> str:
    """A time as the pages show it: ISO 8601 in UTC, to the millisecond."""
    if ms is None:
        return "-"
    when = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def test_every_page_shows_the_cli_figures(
    browser: Any, filled_store: Filled, tmp_path: Path
) -> None:
    """Every page in Chromium, each figure against ``kstore topics describe``, ``groups
    describe`` and ``maintain status`` (JSON), the lag in seconds against the records'
    timestamps, and /metrics parsed by prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    store_args = filled_store.store_args
    shots = filled_store.backend == "local"  # the committed screenshots: a local store
    transaction = open_transaction(filled_store.store)
    member = join_member(filled_store.store)
    running = start_ui(store_args, "--refresh", "1s")
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        topics = {t["topic"]: t for t in cli_json(store_args, "topics", "describe")}
        groups = {g["group"]: g for g in cli_json(store_args, "groups", "describe", "--all-groups")}
        status = cli_json(store_args, "maintain", "status")
        assert sorted(topics) == ["events", "expiring", "lake", "orders", "payments"]
        assert sorted(groups) == ["billing", "readers"]

        answer = page.goto(running.url + "/")
        pause(page)
        assert answer.status == 200
        assert page.locator("#topic-count").inner_text() == str(len(topics))
        assert page.locator("#group-count").inner_text() == str(len(groups))
        assert page.locator("#topics tbody tr").count() == len(topics)
        for name, described in topics.items():
            row = f"[data-topic='{name}']"
            parts = described["partitions"]
            assert cell(page, "topics", row, "records") == str(sum(p["records"] for p in parts))
            assert cell(page, "topics", row, "partitions") == str(len(parts))
            assert cell(page, "topics", row, "segments") == str(sum(p["segments"] for p in parts))
        shot(page, tmp_path, "topics", shots)

        for name, described in topics.items():
            if name == "orders":
                page.goto(running.url + "/")
                pause(page)
                page.click("a[href='/topics/orders']")  # through the link, as a user
            else:
                page.goto(f"{running.url}/topics/{name}")
                pause(page)
            page.wait_for_selector("#partitions-table")
            pause(page)
            assert page.locator("#partitions-table tbody tr").count() == len(
                described["partitions"]
            )
            for p in described["partitions"]:
                row = f"[data-partition='{p['partition']}']"
                for key in ("log_start_offset", "log_end_offset", "records", "segments", "bytes"):
                    assert cell(page, "partitions-table", row, key) == str(p[key]), (name, key)
                assert cell(page, "partitions-table", row, "oldest") == iso(
                    p["oldest_timestamp_ms"]
                )
                assert cell(page, "partitions-table", row, "newest") == iso(
                    p["newest_timestamp_ms"]
                )
            assert page.locator("#config tbody tr").count() == len(described["config"])
            for entry in described["config"]:
                row = f"[data-config='{entry['name']}']"
                assert cell(page, "config", row, "value") == str(entry["value"]), entry
                source = "default" if entry["default"] else "topic"
                assert cell(page, "config", row, "source") == source, entry
            layout = filled_store.store.topic(name).layout
            assert page.locator("#layout").inner_text() == str(layout)
            table = described["table"]
            if table is None:
                assert page.locator("#delta").count() == 0
            else:
                assert page.locator("#delta code").inner_text() == table["location"]
                assert page.locator("#delta-version").inner_text() == str(table["version"])
            if name == "orders":
                shot(page, tmp_path, "topic", shots)
            if name == "lake":
                assert table is not None
                assert table["version"] == 0
                shot(page, tmp_path, "topic-delta", shots)

        # The record browser, through its form: partition 1 from offset 3, two records.
        page.goto(running.url + "/topics/orders")
        pause(page)
        page.select_option("#records-form select[name='partition']", "1")
        page.fill("#records-form input[name='offset']", "3")
        page.fill("#records-form input[name='limit']", "2")
        page.click("#records-form button[type='submit']")
        page.wait_for_selector("#records")
        pause(page)
        assert page.locator("#records tbody tr").count() == 2
        assert cell(page, "records", "[data-offset='3']", "key").startswith("k1-3")
        assert '"n": 3' in cell(page, "records", "[data-offset='3']", "value")
        assert "source" in cell(page, "records", "[data-offset='3']", "headers")
        assert iso(order_timestamp(1, 3)) in cell(page, "records", "[data-offset='3']", "timestamp")
        shot(page, tmp_path, "records", shots)
        # By time, shown as hex: the first record at or after offset 6's timestamp.
        page.fill("#records-form input[name='offset']", "")
        page.fill("#records-form input[name='timestamp']", iso(order_timestamp(1, 6)))
        page.fill("#records-form input[name='limit']", "1")
        page.select_option("#records-form select[name='format']", "hex")
        page.click("#records-form button[type='submit']")
        page.wait_for_selector("#records")
        pause(page)
        assert page.locator("#records tbody tr").count() == 1
        assert cell(page, "records", "[data-offset='6']", "key").startswith("6b 31 2d 36")  # k1-6
        page.goto(running.url + "/topics/payments/records?partition=0&offset=0")
        pause(page)
        assert cell(page, "records", "[data-offset='2']", "field:user") == "u2"
        assert cell(page, "records", "[data-offset='2']", "field:amount") == "3.0"
        shot(page, tmp_path, "records-typed", shots)

        page.goto(running.url + "/groups")
        pause(page)
        assert page.locator("#groups tbody tr").count() == len(groups)
        for name, described in groups.items():
            row = f"[data-group='{name}']"
            assert cell(page, "groups", row, "lag") == str(described["total_lag"])
            assert cell(page, "groups", row, "state") == described["state"]
            assert cell(page, "groups", row, "members") == str(len(described["members"]))
            assert cell(page, "groups", row, "uncommitted") == str(
                described["uncommitted_partitions"]
            )
        shot(page, tmp_path, "groups", shots)
        # Two refreshes at least, for the chart's line.
        page.wait_for_timeout(2500)
        for name, described in groups.items():
            page.goto(running.url + "/groups")
            pause(page)
            page.click(f"a[href='/groups/{name}']")
            page.wait_for_selector("#lag")
            pause(page)
            taken_ms = int(page.locator("#freshness").get_attribute("data-taken-ms") or 0)
            assert page.locator("#state").inner_text() == described["state"]
            assert page.locator("#total-lag").inner_text() == str(described["total_lag"])
            assert page.locator("#members-count").inner_text() == str(len(described["members"]))
            assert page.locator("#lag tbody tr").count() == len(described["partitions"])
            for p in described["partitions"]:
                row = f"[data-topic='{p['topic']}'][data-partition='{p['partition']}']"
                shown = "-" if p["current_offset"] is None else str(p["current_offset"])
                assert cell(page, "lag", row, "current_offset") == shown
                assert cell(page, "lag", row, "log_end_offset") == str(p["log_end_offset"])
                assert cell(page, "lag", row, "lag") == ("-" if p["lag"] is None else str(p["lag"]))
                assert cell(page, "lag", row, "consumer_id") == (p["member_id"] or "-")
                assert cell(page, "lag", row, "client_id") == (p["client_id"] or "-")
                seconds = page.locator(f"#lag tr{row} [data-seconds]").get_attribute("data-seconds")
                if p["lag"] is None:
                    assert seconds == ""
                elif p["lag"] == 0:
                    assert float(seconds or "nan") == 0.0
                else:  # the age of the next record to read, at the refresh shown
                    next_ts = order_timestamp(p["partition"], p["current_offset"])
                    assert float(seconds or "nan") == pytest.approx(
                        (taken_ms - next_ts) / 1000, abs=0.002
                    )
            assert page.locator("#members tbody tr").count() == len(described["members"])
            for m in described["members"]:
                row = f"[data-member='{m['member_id']}']"
                assert cell(page, "members", row, "client_id") == m["client_id"]
                owned = [
                    f"{p['topic']}:{p['partition']}"
                    for p in described["partitions"]
                    if p["member_id"] == m["member_id"]
                ]
                assert owned
                assert cell(page, "members", row, "assignment") == " ".join(owned)
            assert page.locator("#lag-chart polyline").count() >= 1
            if name == "billing":
                shot(page, tmp_path, "group", shots)
            else:
                shot(page, tmp_path, "group-members", shots)

        page.goto(running.url + "/maintenance")
        pause(page)
        for t in status["topics"]:
            for task in t["tasks"]:
                row = f"[data-topic='{t['topic']}'][data-task='{task['task']}']"
                run = task["last_run"] or {}
                assert cell(page, "tasks", row, "outcome") == run.get("outcome", "-"), row
                for key in ("records", "bytes", "segments", "files"):
                    assert cell(page, "tasks", row, key) == str(run.get(key, "-")), (row, key)
                assert cell(page, "tasks", row, "last_run") == iso(run.get("finished_ms"))
                assert cell(page, "tasks", row, "why") == task["reason"], row
                if task["due"]:
                    assert cell(page, "tasks", row, "next") == "due"
                elif task["next_ms"] is not None and task["next_ms"] > status["now_ms"]:
                    assert cell(page, "tasks", row, "next") == iso(task["next_ms"])
        row = "[data-topic='expiring'][data-task='retention']"
        assert cell(page, "tasks", row, "outcome") == "ok"
        assert cell(page, "tasks", row, "records") == str(EXPIRED)
        opened = [
            (t["topic"], p["partition"], o)
            for t in status["topics"]
            for p in t["partitions"]
            for o in p["open_transactions"]
        ]
        assert len(opened) == 1
        assert page.locator("#transactions tbody tr").count() == 1
        topic, partition, txn = opened[0]
        row = f"[data-topic='{topic}'][data-partition='{partition}']"
        assert cell(page, "transactions", row, "transaction") == txn["transaction"]
        assert cell(page, "transactions", row, "first_offset") == str(txn["first_offset"])
        producers = [
            (name, p, pid)
            for name in topics
            for p in range(len(topics[name]["partitions"]))
            for pid in filled_store.store.partition_state(name, p).producers
        ]
        assert producers
        assert page.locator("#producers tbody tr").count() == len(producers)
        for name, p, pid in producers:
            assert (
                page.locator(
                    f"#producers tr[data-topic='{name}'][data-partition='{p}'] "
                    f"td[data-col='producer_id']:text-is('{pid}')"
                ).count()
                == 1
            )
        shot(page, tmp_path, "maintenance", shots)

        answer = page.goto(running.url + "/topics/no-such-topic")
        pause(page)
        assert answer.status == 404
        assert (
            page.locator("#error")
            .inner_text()
            .startswith("topic 'no-such-topic' does not exist (as of ")
        )
        assert "Traceback" not in page.content()
        shot(page, tmp_path, "error", shots)
        answer = page.goto(running.url + "/topics/orders/records?partition=0&offset=99")
        pause(page)
        assert answer.status == 400
        assert "outside the live range [0, 10]" in page.locator("#error").inner_text()

        metrics = page.goto(running.url + "/metrics")
        assert metrics.status == 200
        found = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(metrics.text())
            for s in family.samples
        }
        for name, described in groups.items():
            for p in described["partitions"]:
                if p["lag"] is None:
                    continue
                labels = {
                    "cluster_name": store_args[1],
                    "group": name,
                    "topic": p["topic"],
                    "partition": str(p["partition"]),
                    "member_host": "",
                    "consumer_id": p["member_id"] or "",
                    "client_id": p["client_id"] or "",
                }
                key = ("kafka_consumergroup_group_lag", tuple(sorted(labels.items())))
                assert found[key] == p["lag"]
        for name, described in topics.items():
            for p in described["partitions"]:
                labels = {
                    "cluster_name": store_args[1],
                    "topic": name,
                    "partition": str(p["partition"]),
                }
                key = tuple(sorted(labels.items()))
                assert found[("kafka_partition_latest_offset", key)] == p["log_end_offset"]
                assert found[("kafka_partition_earliest_offset", key)] == p["log_start_offset"]
        page.close()
    finally:
        stop_ui(running)
        member.close()
        transaction.abort_transaction()
        transaction.close()


def test_writes_through_the_pages(
    browser: Any, local_store: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    url, options = local_store
    filled = fill(url, options)
    store_args = ["--store", url]
    running = start_ui(store_args, "--allow-writes")
    try:
        page = browser.new_page()
        page.goto(running.url + "/groups/billing")
        page.select_option("#reset-offsets select[name='topic']", "orders")
        page.select_option("#reset-offsets select[name='to']", "latest")
        page.click("#reset-offsets button[type='submit']")
        page.wait_for_selector("#confirm")
        assert "orders-0: -> 10" in page.locator("#plan").inner_text()
        shot(page, tmp_path, "reset-confirm")
        described = cli_json(store_args, "groups", "describe", "billing")
        assert described["partitions"][0]["current_offset"] == 4  # not before the confirmation
        page.click("#confirm-button")
        page.wait_for_selector("#done")
        described = cli_json(store_args, "groups", "describe", "billing")
        assert [p["current_offset"] for p in described["partitions"]] == [10, 10, 10]
        page.goto(running.url + "/groups/billing")
        assert page.locator("#total-lag").inner_text() == "0"

        # Delete records: orders-2 below offset 7, reviewed, then confirmed.
        page.goto(running.url + "/topics/orders")
        page.select_option("#delete-records select[name='partition']", "2")
        page.fill("#delete-records input[name='offset']", "7")
        page.click("#delete-records button[type='submit']")
        page.wait_for_selector("#confirm")
        assert "orders-2: log start offset 0 -> 7" in page.locator("#plan").inner_text()
        shot(page, tmp_path, "delete-confirm")
        assert filled.store.partition_state("orders", 2).start_offset == 0  # not yet
        page.click("#confirm-button")
        page.wait_for_selector("#done")
        assert "the log now starts at offset 7" in page.locator("#done").inner_text()
        (described,) = cli_json(store_args, "topics", "describe", "orders")
        assert described["partitions"][2]["log_start_offset"] == 7
        page.goto(running.url + "/topics/orders")
        row = "[data-partition='2']"
        assert cell(page, "partitions-table", row, "log_start_offset") == "7"
        page.close()
    finally:
        stop_ui(running)
    assert filled.store.partition_state("orders", 0).end_offset == 10


def test_read_only_console_offers_no_action(
    browser: Any, local_store: tuple[str, dict[str, Any]]
) -> None:
    url, options = local_store
    fill(url, options)
    running = start_ui(["--store", url])
    try:
        page = browser.new_page()
        page.goto(running.url + "/groups/billing")
        assert page.locator("#reset-offsets").count() == 0
        page.goto(running.url + "/topics/orders")
        assert page.locator("#delete-records").count() == 0
        assert "read-only" in page.locator("#store").inner_text()
        page.close()
    finally:
        stop_ui(running, signal.SIGTERM)  # as a service manager stops it: exit 0 too
