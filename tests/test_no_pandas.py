"""The record path does not import pandas: pyarrow imports it on the first pa.array,
pa.scalar or Array.to_numpy (about 0.3 s), which a producer's first delivery and a consumer's
first poll would pay. Each case runs in a fresh interpreter, where nothing has imported it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from kstore.segments import HEADERS_TYPE, binary_array, fixed_array, headers_array, numpy_values

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from kstore import Store
    from kstore.consumer import Consumer
    from kstore.producer import Producer

    store = Store(sys.argv[1])
    store.create_topic("t", 3)
    sent = []
    with Producer(store, acks="all") as producer:
        sent.append(producer.send("t", key=b"k", value=b"v", headers=[("h", b"1")]).get(timeout=30))
        # A tombstone without a key, at a given time: the null and timestamp paths.
        sent.append(producer.send("t", value=None, timestamp_ms=1_700_000_000_123).get(timeout=30))
        # A batch spread over the partitions.
        for i in range(200):
            producer.send("t", key=b"%d" % i, value=b"x")
        producer.flush()
    after_send = "pandas" in sys.modules
    with Consumer("t", store=store, auto_offset_reset="earliest", consumer_timeout_ms=300) as c:
        got = sorted(c, key=lambda r: r.timestamp)
    spread = sorted((r.partition, r.offset) for r in got if r.value == b"x")
    assert len(spread) == len(set(spread)) == 200, spread
    assert len({p for p, _ in spread}) == 3, spread
    got = [r for r in got if r.value != b"x"]
    print(json.dumps({
        "after_send": after_send,
        "after_poll": "pandas" in sys.modules,
        "sent": [[m.partition, m.offset] for m in sent],
        "got": [
            [r.partition, r.offset, r.key and r.key.decode(), r.value and r.value.decode(),
             r.serialized_key_size, r.serialized_value_size,
             [[k, v.decode()] for k, v in r.headers]]
            for r in got
        ],
        "given_time": got[0].timestamp,
    }))
    """
)


@pytest.mark.parametrize("backend", ["memory", "local"])
def test_producing_and_consuming_a_record_imports_no_pandas(backend: str, tmp_path: Path) -> None:
    url = f"memory://nopandas-{uuid.uuid4().hex}" if backend == "memory" else tmp_path.as_uri()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["after_send"] is False
    assert out["after_poll"] is False
    # And the records are what was sent.
    (keyed_p, keyed_o), (tomb_p, tomb_o) = out["sent"]
    assert out["given_time"] == 1_700_000_000_123
    assert sorted(map(tuple, out["got"])) == sorted(
        [(keyed_p, keyed_o, "k", "v", 1, 1, [["h", "1"]]), (tomb_p, tomb_o, None, None, -1, -1, [])]
    )


@pytest.mark.parametrize("type_", [pa.binary(), pa.large_binary()])
@pytest.mark.parametrize(
    "items",
    [[], [b""], [b"a", b"", b"bcd"], [None], [b"x", None, b"", None, b"yz"], [b"\x00" * 1000] * 3],
)
def test_binary_array_equals_pyarrows_converter(items: list[bytes | None], type_: Any) -> None:
    built = binary_array(items, type_)
    built.validate(full=True)
    assert built.equals(pa.array(items, type_))


def test_headers_array_equals_pyarrows_converter() -> None:
    rows = {0: [("a", b"1"), ("\u00e9", b"")], 2: [], 3: [("x", b"yz")]}
    built = headers_array(rows, 5)
    built.validate(full=True)
    expected = [
        [{"key": k, "value": v} for k, v in rows[i]] if i in rows else None for i in range(5)
    ]
    assert built.equals(pa.array(expected, HEADERS_TYPE))
    assert headers_array({0: [("k", b"v")]}, 1).equals(
        pa.array([[{"key": "k", "value": b"v"}]], HEADERS_TYPE)
    )


def test_fixed_width_helpers_round_trip_and_refuse_other_widths() -> None:
    values = np.arange(10, dtype=np.int64)
    array = fixed_array(values, pa.int64())
    assert array.to_pylist() == list(range(10))
    assert numpy_values(array.slice(3, 4), np.int64).tolist() == [3, 4, 5, 6]
    chunked = pa.chunked_array([array.slice(0, 2), array.slice(5, 2)])
    assert numpy_values(chunked, np.int64).tolist() == [0, 1, 5, 6]
    stamps = fixed_array(values, pa.timestamp("us", tz="UTC"))
    assert numpy_values(stamps, np.int64).tolist() == list(range(10))
    with pytest.raises(ValueError, match="cannot view"):
        fixed_array(values, pa.int32())
    with pytest.raises(ValueError, match="cannot view"):
        numpy_values(pa.array([1, None], pa.int64()), np.int64)
    with pytest.raises(ValueError, match="binary or large_binary"):
        binary_array([b"x"], pa.string())
