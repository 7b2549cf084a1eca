"""Every example runs, and shows what it claims."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_delivery_semantics(tmp_path: Path) -> None:
    results = load("delivery_semantics").main(tmp_path.as_uri())
    orders = {b"shipped order-%d" % i for i in range(300)}
    most, least, exactly = (
        results["at-most-once"],
        results["at-least-once"],
        results["exactly-once"],
    )
    assert set(most) < orders
    assert max(most.values()) == 1
    assert set(least) == orders
    assert max(least.values()) == 2
    assert set(exactly) == orders
    assert max(exactly.values()) == 1


def test_basics(tmp_path: Path) -> None:
    seen = load("basics").main(tmp_path.as_uri())
    assert sorted(v for _, _, v in seen) == sorted(f"hello {i}" for i in range(10))


def test_keyed_ordering(tmp_path: Path) -> None:
    by_key = load("keyed_ordering").main(tmp_path.as_uri())
    assert len(by_key) == 20
    assert sum(len(v) for v in by_key.values()) == 600


def test_consumer_group(tmp_path: Path) -> None:
    read = load("consumer_group").main(tmp_path.as_uri())
    assert sum(read.values()) == 600  # each record read by exactly one member
    assert all(count > 0 for count in read.values())  # the three members shared the work


def test_s3_configuration(seaweed_server: Any) -> None:
    bucket = seaweed_server.create_bucket()
    assert load("s3_seaweedfs").main(seaweed_server.endpoint_url, bucket) == 100
