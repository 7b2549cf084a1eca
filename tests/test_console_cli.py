"""``kstore ui`` and ``kstore maintain --metrics-port`` on the command line: their options, their
refusals, and the maintainer's own metrics scraped while it runs."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kstore.cli.app import app
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from tests.console_data import fill

runner = CliRunner()


def test_ui_help_lists_its_options() -> None:
    result = runner.invoke(app, ["ui", "--help"])
    assert result.exit_code == 0
    for option in ("--port", "--host", "--refresh", "--allow-writes", "--cluster-name", "--store"):
        assert option in result.stdout


def test_ui_refusals(tmp_path: Path) -> None:
    url = (tmp_path / "store").as_uri()
    fill(url, {})
    result = runner.invoke(app, ["--store", url, "ui", "--refresh", "1ms"])
    assert result.exit_code == 2
    assert "--refresh must be at least 500ms" in result.stderr
    result = runner.invoke(app, ["--store", url, "ui", "--refresh", "soon"])
    assert result.exit_code == 2
    assert "is not a duration" in result.stderr
    result = runner.invoke(app, ["--store", (tmp_path / "none").as_uri(), "ui", "--port", "0"])
    assert result.exit_code == 1
    assert "error:" in result.stderr
    assert "Traceback" not in result.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["--store", url, "ui", "--port", str(port)])
    assert result.exit_code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr


def test_maintain_serves_its_metrics(tmp_path: Path) -> None:
    """A maintainer with --metrics-port: the store's metrics and its own task runs."""
    url = (tmp_path / "store").as_uri()
    fill(url, {})
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kstore.cli.app",
            "--store",
            url,
            "maintain",
            "--interval",
            "1s",
            "--metrics-port",
            "0",
            "--metrics-refresh",
            "1s",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        found = re.search(r"metrics at (http://127\.0\.0\.1:\d+/metrics)", line)
        assert found, line
        runs: dict[tuple[str, str], float] = {}
        lag = None
        began = time.monotonic()
        while time.monotonic() - began < 120 and (not runs or lag is None):
            try:
                with urllib.request.urlopen(found.group(1), timeout=10) as answer:
                    text = answer.read().decode()
            except urllib.error.URLError:
                time.sleep(0.2)
                continue
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == "kstore_maintenance_runs_total":
                        runs[(sample.labels["task"], sample.labels["outcome"])] = sample.value
                    if sample.name == "kafka_consumergroup_group_sum_lag":
                        lag = sample.value
            time.sleep(0.2)
        assert lag == 6
        assert runs, "the maintainer's runs were counted"
        assert all(
            outcome in ("ok", "nothing", "conflict", "error", "taken") for _, outcome in runs
        )
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err


@pytest.mark.s3
def test_no_credential_from_kstore_ui(seaweed_server: Any) -> None:
    """``kstore ui`` started as a user starts it, with an S3 secret among its --option's
    (SeaweedFS takes any): the secret is in no page (error pages echoing it included), no
    metric and no line the process wrote."""
    from tests.test_console_browser import option_args, start_ui, stop_ui

    url, options = seaweed_server.new_store_url()
    secret = "s3cr3t-" + os.urandom(8).hex()
    options = {**options, "secret": secret}
    fill(url, options)
    store_args = ["--store", url, *option_args(options)]
    running = start_ui(store_args)
    bodies = []
    try:
        for path in (
            "/",
            "/topics/orders",
            "/topics/orders/records?partition=0&offset=0",
            "/groups",
            "/groups/billing",
            "/maintenance",
            "/metrics",
            f"/topics/{secret}",
            f"/groups/{secret}",
            f"/topics/orders/records?offset={secret}",
            f"/topics/orders/records?timestamp={secret}",
            f"/{secret}",
        ):
            try:
                with urllib.request.urlopen(running.url + path, timeout=60) as answer:
                    bodies.append(answer.read().decode())
            except urllib.error.HTTPError as exc:
                bodies.append(exc.read().decode())
    finally:
        err = stop_ui(running)
    # The maintainer's exporter, with the same options: its scrape and what it writes.
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kstore.cli.app",
            *store_args,
            "maintain",
            "--interval",
            "1s",
            "--metrics-port",
            "0",
            "--metrics-refresh",
            "1s",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stderr is not None
        # The line that says where, read up to it (whatever came before it is kept and
        # checked with the rest); a process that ends without it shows what it wrote.
        before: list[str] = []
        found = None
        while found is None and (line := process.stderr.readline()):
            before.append(line)
            found = re.search(r"metrics at (http://127\.0\.0\.1:\d+/metrics)", line)
        assert found, "".join(before)
        scraped = ""
        began = time.monotonic()
        while "kafka_consumergroup_group_lag{" not in scraped and time.monotonic() - began < 60:
            time.sleep(0.3)
            with urllib.request.urlopen(found.group(1), timeout=10) as answer:
                scraped = answer.read().decode()
    finally:
        process.send_signal(signal.SIGTERM)
        out, maintainer_err = process.communicate(timeout=60)
    assert process.returncode == 0, maintainer_err
    assert "kafka_consumergroup_group_lag{" in scraped
    bodies += [scraped, out, "".join(before) + maintainer_err]
    assert len(bodies) == 15
    assert "kafka_consumergroup_group_lag{" in bodies[6]
    assert "kstore_storage_requests_total{" in bodies[6]
    assert "GET /topics/" in err  # the request log is on stderr
    for text in [*bodies, err]:
        assert secret not in text


def test_ui_takes_the_store_from_a_config_file(tmp_path: Path) -> None:
    """``kstore --config-file F ui``: the store named in the file, as every command takes it."""
    from tests.test_console_browser import start_ui, stop_ui

    url = (tmp_path / "store").as_uri()
    fill(url, {})
    config = tmp_path / "kstore.toml"
    config.write_text(f'store = "{url}"\n')
    running = start_ui(["--config-file", str(config)])
    try:
        with urllib.request.urlopen(running.url + "/", timeout=60) as answer:
            page = answer.read().decode()
    finally:
        stop_ui(running)
    assert "data-topic='orders'" in page
    assert url in page  # the store shown in the header
