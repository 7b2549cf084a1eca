"""The console in a real browser: ``kstore --store URL ui`` started as a user starts it, every
page opened in headless Chromium (Debian's, driven by Playwright) against stores with data on
local disk and on SeaweedFS, and the figures shown checked against ``kstore topics describe``
and ``kstore groups describe``. A screenshot of each page is written to the test's directory,
and to ``$KSTORE_CONSOLE_SCREENSHOTS`` when set (docs/console/ holds the committed ones).

Chromium comes from Debian's ``chromium`` package: ``make test`` installs it when it is missing
and the machine allows (root, apt). In CI a missing browser fails these tests; elsewhere they
are skipped, saying so.
"""

from __future__ import annotations

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

from tests.console_data import EXPIRED, fill

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


def shot(page: Any, tmp_path: Path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)
    wanted = os.environ.get("KSTORE_CONSOLE_SCREENSHOTS")
    if wanted:
        Path(wanted).mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(Path(wanted) / f"{name}.png"), full_page=True)


def cell(page: Any, table: str, row: str, col: str) -> str:
    text: str = page.locator(f"#{table} tr{row} td[data-col='{col}']").inner_text()
    return text.strip()


@pytest.fixture(params=["local", pytest.param("seaweed", marks=pytest.mark.s3)])
def store_args(request: pytest.FixtureRequest) -> list[str]:
    url, options = request.getfixturevalue(f"{request.param}_store")
    fill(url, options)
    return ["--store", url, *option_args(options)]


def test_every_page_shows_the_cli_figures(
    browser: Any, store_args: list[str], tmp_path: Path
) -> None:
    running = start_ui(store_args, "--refresh", "1s")
    try:
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        topics = {t["topic"]: t for t in cli_json(store_args, "topics", "describe")}
        groups = {g["group"]: g for g in cli_json(store_args, "groups", "describe", "--all-groups")}

        answer = page.goto(running.url + "/")
        assert answer.status == 200
        assert page.locator("#topic-count").inner_text() == str(len(topics))
        for name, described in topics.items():
            row = f"[data-topic='{name}']"
            records = sum(p["records"] for p in described["partitions"])
            assert cell(page, "topics", row, "records") == str(records)
            assert cell(page, "topics", row, "partitions") == str(len(described["partitions"]))
            segments = sum(p["segments"] for p in described["partitions"])
            assert cell(page, "topics", row, "segments") == str(segments)
        shot(page, tmp_path, "topics")

        page.click("a[href='/topics/orders']")
        page.wait_for_selector("#partitions-table")
        for p in topics["orders"]["partitions"]:
            row = f"[data-partition='{p['partition']}']"
            for col, key in (
                ("log_start_offset", "log_start_offset"),
                ("log_end_offset", "log_end_offset"),
                ("records", "records"),
                ("segments", "segments"),
                ("bytes", "bytes"),
            ):
                assert cell(page, "partitions-table", row, col) == str(p[key]), (col, p)
        assert page.locator("#config tbody tr").count() == len(topics["orders"]["config"])
        shot(page, tmp_path, "topic")

        # The record browser, through its form: partition 1 from offset 3, two records.
        page.select_option("#records-form select[name='partition']", "1")
        page.fill("#records-form input[name='offset']", "3")
        page.fill("#records-form input[name='limit']", "2")
        page.click("#records-form button[type='submit']")
        page.wait_for_selector("#records")
        assert page.locator("#records tbody tr").count() == 2
        assert cell(page, "records", "[data-offset='3']", "key").startswith("k1-3")
        assert '"n": 3' in cell(page, "records", "[data-offset='3']", "value")
        assert "source" in cell(page, "records", "[data-offset='3']", "headers")
        shot(page, tmp_path, "records")
        page.goto(running.url + "/topics/payments/records?partition=0&offset=0")
        assert cell(page, "records", "[data-offset='2']", "field:user") == "u2"
        assert cell(page, "records", "[data-offset='2']", "field:amount") == "3.0"
        shot(page, tmp_path, "records-typed")

        page.goto(running.url + "/groups")
        assert cell(page, "groups", "[data-group='billing']", "lag") == str(
            groups["billing"]["total_lag"]
        )
        shot(page, tmp_path, "groups")
        # Two refreshes at least, for the chart's line.
        page.wait_for_timeout(2500)
        page.click("a[href='/groups/billing']")
        page.wait_for_selector("#lag")
        for p in groups["billing"]["partitions"]:
            row = f"[data-topic='{p['topic']}'][data-partition='{p['partition']}']"
            shown = "-" if p["current_offset"] is None else str(p["current_offset"])
            assert cell(page, "lag", row, "current_offset") == shown
            assert cell(page, "lag", row, "log_end_offset") == str(p["log_end_offset"])
            assert cell(page, "lag", row, "lag") == ("-" if p["lag"] is None else str(p["lag"]))
        assert page.locator("#total-lag").inner_text() == str(groups["billing"]["total_lag"])
        assert page.locator("#lag-chart polyline").count() == 1
        shot(page, tmp_path, "group")

        page.goto(running.url + "/maintenance")
        row = "[data-topic='expiring'][data-task='retention']"
        assert cell(page, "tasks", row, "outcome") == "ok"
        assert cell(page, "tasks", row, "records") == str(EXPIRED)
        shot(page, tmp_path, "maintenance")

        answer = page.goto(running.url + "/topics/no-such-topic")
        assert answer.status == 404
        assert "does not exist" in page.locator("#error").inner_text()
        shot(page, tmp_path, "error")

        metrics = page.goto(running.url + "/metrics")
        assert metrics.status == 200
        assert "kafka_consumergroup_group_lag{" in page.content()
        page.close()
    finally:
        stop_ui(running)


def test_offset_reset_through_the_pages(
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
