"""Every example runs, and shows what it claims."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

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
