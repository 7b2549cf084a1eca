"""The S3 proxy of the benchmarks (benchmarks/s3proxy.py) in front of SeaweedFS: put-if-absent
decided in the proxy (the first write of a key wins, later ones get 412 without reaching the
backend), requests counted by method, status and prefix class, the delay applied, and the S3
API that s3fs, botocore and kstore use passed through unchanged.

What reaches the backend is seen by a second proxy between the first and SeaweedFS (no delay,
counting only): client -> proxy under test -> counting proxy -> SeaweedFS."""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import http.client
import os
import time
import uuid
import zlib
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import botocore.exceptions
import pytest

from benchmarks.s3proxy import ProxyProcess, behind, difference, prefix_class, totals
from kstore import Store
from kstore.consumer import Consumer
from kstore.producer import Producer
from tests.servers import SeaweedServer, is_precondition_failed

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def counting(seaweed_server: SeaweedServer) -> Iterator[ProxyProcess]:
    """What reaches SeaweedFS: a proxy with no delay, counting."""
    with ProxyProcess(seaweed_server.endpoint_url, delay_ms=0) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def proxy(counting: ProxyProcess) -> Iterator[ProxyProcess]:
    with ProxyProcess(counting.url, delay_ms=0) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def server(proxy: ProxyProcess) -> Any:
    return behind(None, proxy)


@pytest.fixture
def bucket(server: Any) -> str:
    name: str = server.create_bucket()
    return name


def _put_if_absent(client: Any, bucket: str, key: str, body: bytes) -> int:
    try:
        client.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
    except botocore.exceptions.ClientError as exc:
        status: int = exc.response["ResponseMetadata"]["HTTPStatusCode"]
        return status
    return 200


def test_the_first_conditional_put_wins_and_later_ones_are_refused_here(
    server: Any, proxy: ProxyProcess, counting: ProxyProcess, bucket: str
) -> None:
    client = server.client(max_attempts=1)
    key = "t/_log/00000000000000000001.json"
    seen, reached = proxy.stats(), counting.stats()
    assert _put_if_absent(client, bucket, key, b"first") == 200
    assert _put_if_absent(client, bucket, key, b"second") == 412
    assert _put_if_absent(client, bucket, key, b"third") == 412
    assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == b"first"
    here = difference(proxy.stats(), seen)
    backend = difference(counting.stats(), reached)
    assert here["requests"] == {"PUT 200 _log": 1, "PUT 412 _log": 2, "GET 200 _log": 1}
    assert here["refused_here"] == {"_log": 2}
    assert here["conditional"] == {"200 _log": 1, "412 _log": 2}
    # Only the winner went on: the backend saw one PUT and the GET.
    assert backend["requests"] == {"PUT 200 _log": 1, "GET 200 _log": 1}


def test_a_refusal_reads_as_s3s_through_s3fs(server: Any, bucket: str) -> None:
    fs = server.filesystem()
    path = f"{bucket}/_log/00000000000000000000.json"
    fs.pipe_file(path, b"one", mode="create")
    with pytest.raises(FileExistsError) as info:  # <Condition> in the body, as S3 writes it
        fs.pipe_file(path, b"two", mode="create")
    assert is_precondition_failed(info.value)


def test_a_key_that_existed_before_the_proxy_saw_it_is_refused_by_the_backend(
    seaweed_server: SeaweedServer, server: Any, proxy: ProxyProcess, bucket: str
) -> None:
    seaweed_server.client().put_object(Bucket=bucket, Key="old/_log/1.json", Body=b"direct")
    client = server.client(max_attempts=1)
    seen = proxy.stats()
    assert _put_if_absent(client, bucket, "old/_log/1.json", b"late") == 412
    assert _put_if_absent(client, bucket, "old/_log/1.json", b"later") == 412
    here = difference(proxy.stats(), seen)
    assert here["refused_here"] == {"_log": 1}  # the first 412 was the backend's
    assert client.get_object(Bucket=bucket, Key="old/_log/1.json")["Body"].read() == b"direct"


def test_racing_conditional_puts_one_winner_one_forward(
    server: Any, proxy: ProxyProcess, counting: ProxyProcess, bucket: str
) -> None:
    clients = [server.client(max_attempts=1) for _ in range(8)]
    for round_no in range(5):
        key = f"race/_log/{round_no:020d}.json"
        reached = counting.stats()
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            statuses = list(
                pool.map(
                    _put_if_absent,
                    clients,
                    [bucket] * 8,
                    [key] * 8,
                    [b"writer %d" % n for n in range(8)],
                )
            )
        assert sorted(statuses) == [200] + [412] * 7
        winner = statuses.index(200)
        body = clients[0].get_object(Bucket=bucket, Key=key)["Body"].read()
        assert body == b"writer %d" % winner
        backend = totals(difference(counting.stats(), reached)["requests"])
        assert backend.get("PUT", 0) == 1


def test_a_deleted_key_can_be_created_again(server: Any, bucket: str) -> None:
    client = server.client(max_attempts=1)
    fs = server.filesystem()
    assert _put_if_absent(client, bucket, "d/one", b"1") == 200
    client.delete_object(Bucket=bucket, Key="d/one")
    assert _put_if_absent(client, bucket, "d/one", b"2") == 200
    # A multi-object delete (s3fs's rm of several files) forgets each key it names.
    assert _put_if_absent(client, bucket, "d/two & <three>", b"3") == 200
    fs.rm([f"{bucket}/d/one", f"{bucket}/d/two & <three>"])
    assert _put_if_absent(client, bucket, "d/one", b"4") == 200
    assert _put_if_absent(client, bucket, "d/two & <three>", b"5") == 200
    assert _put_if_absent(client, bucket, "d/one", b"6") == 412
    # An unconditional PUT makes the key exist too.
    client.put_object(Bucket=bucket, Key="d/plain", Body=b"7")
    assert _put_if_absent(client, bucket, "d/plain", b"8") == 412


def test_requests_are_counted_by_method_status_and_class(
    server: Any, proxy: ProxyProcess, bucket: str
) -> None:
    client = server.client(max_attempts=1)
    seen = proxy.stats()
    for key in (
        "s/topics/t/_log/1.json",
        "s/topics/t/_log.3/1.json",
        "s/topics/t/_flushes/a-1.kfl",
        "s/topics/t/_data/x.arrow",
        "s/topics/t/_sidecars/s.parquet",
        "s/groups/g/_log/1.json",
        "s/groups/g/_flushes/a-1.kfl",
        "s/topics/t/meta.json",
    ):
        client.put_object(Bucket=bucket, Key=key, Body=b"x" * 10)
    client.head_object(Bucket=bucket, Key="s/topics/t/_data/x.arrow")
    with pytest.raises(botocore.exceptions.ClientError):
        client.get_object(Bucket=bucket, Key="s/topics/t/_log/missing.json")
    client.list_objects_v2(Bucket=bucket, Prefix="s/topics/t/_log/")
    client.delete_object(Bucket=bucket, Key="s/topics/t/meta.json")
    here = difference(proxy.stats(), seen)
    assert here["requests"] == {
        "PUT 200 _log": 2,
        "PUT 200 _flushes": 1,
        "PUT 200 _data": 1,
        "PUT 200 _sidecars": 1,
        "PUT 200 groups": 2,
        "PUT 200 other": 1,
        "HEAD 200 _data": 1,
        "GET 404 _log": 1,
        "LIST 200 _log": 1,
        "DELETE 204 other": 1,
    }
    assert here["bytes_in"]["_log"] == 20
    assert totals(here["requests"])["PUT"] == 8


def test_prefix_classes() -> None:
    assert prefix_class("/b/store/topics/t-1/_log/00000000000000000001.json") == "_log"
    assert prefix_class("/b/store/topics/t-1/_log.2/00000000000000000001.json") == "_log"
    assert prefix_class("/b/store/topics/t-1/_flushes.1/x.kfl") == "_flushes"
    assert prefix_class("/b/store/groups/g/_log/1.json") == "groups"
    assert prefix_class("/b/store/topics/t/_data/p0/x.arrow") == "_data"
    assert prefix_class("/b/_log") == "other"  # an object named _log, in no such folder
    assert prefix_class("/b") == "other"


def test_the_delay_holds_every_request(seaweed_server: SeaweedServer) -> None:
    # A lower bound, not a speed: each request waits at least the delay, refusals too.
    with ProxyProcess(seaweed_server.endpoint_url, delay_ms=150) as slow:
        server = behind(None, slow)
        bucket = server.create_bucket()
        client = server.client(max_attempts=1)
        for body in (b"a", b"b"):
            started = time.monotonic()
            _put_if_absent(client, bucket, "k", body)
            assert time.monotonic() - started >= 0.149
        stats = slow.stats()
        assert stats["delay_ms"] == 150
        assert stats["refused_here"] == {"other": 1}


def test_bodies_headers_and_ranges_pass_through(server: Any, bucket: str) -> None:
    client = server.client(max_attempts=1)
    data = os.urandom(300_000)
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    client.put_object(Bucket=bucket, Key="p/obj", Body=data, ContentMD5=md5)
    with pytest.raises(botocore.exceptions.ClientError) as info:  # checked by the backend
        client.put_object(
            Bucket=bucket, Key="p/bad", Body=data, ContentMD5=base64.b64encode(b"0" * 16).decode()
        )
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    got = client.get_object(Bucket=bucket, Key="p/obj", Range="bytes=1000-1999")
    assert got["Body"].read() == data[1000:2000]
    assert got["ContentRange"] == f"bytes 1000-1999/{len(data)}"
    assert client.head_object(Bucket=bucket, Key="p/obj")["ContentLength"] == len(data)

    # An aws-chunked body (what botocore sends over TLS for a streaming upload, with its
    # checksum in a trailer), itself sent in HTTP chunks: both framings pass as they came.
    encoded = b"%x\r\n%s\r\n0\r\nx-amz-checksum-crc32:%s\r\n\r\n" % (
        len(data),
        data,
        base64.b64encode(zlib.crc32(data).to_bytes(4, "big")),
    )
    connection = http.client.HTTPConnection(urlsplit(server.endpoint_url).netloc, timeout=30)
    connection.putrequest("PUT", f"/{bucket}/p/chunked")
    for name, value in {
        "Transfer-Encoding": "chunked",
        "Content-Encoding": "aws-chunked",
        "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "x-amz-decoded-content-length": str(len(data)),
        "x-amz-trailer": "x-amz-checksum-crc32",
    }.items():
        connection.putheader(name, value)
    connection.endheaders()
    for start in range(0, len(encoded), 65536):
        piece = encoded[start : start + 65536]
        connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
    connection.send(b"0\r\n\r\n")
    answer = connection.getresponse()
    assert answer.status == 200, answer.read()
    connection.close()
    assert client.get_object(Bucket=bucket, Key="p/chunked")["Body"].read() == data
    fs = server.filesystem()
    assert fs.cat_file(f"{bucket}/p/obj", start=299_990) == data[299_990:]
    assert sorted(fs.ls(f"{bucket}/p", detail=False)) == [
        f"{bucket}/p/chunked",
        f"{bucket}/p/obj",
    ]


def test_a_multipart_upload_and_a_streamed_read(server: Any, bucket: str) -> None:
    fs = server.filesystem()
    data = os.urandom(11 * 2**20)
    with fs.open(f"{bucket}/m/big", "wb", block_size=5 * 2**20) as out:  # three parts
        for start in range(0, len(data), 2**20):
            out.write(data[start : start + 2**20])
    assert fs.info(f"{bucket}/m/big")["size"] == len(data)
    assert fs.cat_file(f"{bucket}/m/big") == data
    with fs.open(f"{bucket}/m/big", "rb", block_size=2**20) as src:
        src.seek(7 * 2**20 + 5)
        assert src.read(100) == data[7 * 2**20 + 5 : 7 * 2**20 + 105]


def test_kstore_produces_and_consumes_through_it(
    server: Any, proxy: ProxyProcess, counting: ProxyProcess
) -> None:
    url, options = server.new_store_url("e2e")
    store = Store(url, options)
    store.create_topic("t", partitions=4)
    seen = proxy.stats()
    with Producer(store, acks="all", linger_ms=5) as producer:
        for i in range(300):
            producer.send("t", b"v%d" % i, b"k%d" % i)
        producer.flush()
        commits = producer.metrics()["commit-total"]
    consumer = Consumer("t", store=Store(url, options), auto_offset_reset="earliest")
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < 300 and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            values.extend(r.value for r in records)
    consumer.close()
    assert sorted(values) == sorted(b"v%d" % i for i in range(300))
    here = totals(difference(proxy.stats(), seen)["requests"])
    assert here.get("PUT 200 _log", 0) + here.get("PUT 201 _log", 0) >= commits >= 1
    assert not any(k.startswith("* 5") for k in here)  # nothing the proxy broke


def test_a_bad_backend_is_named() -> None:
    with pytest.raises(RuntimeError, match="did not start"):
        ProxyProcess(f"ftp://{uuid.uuid4().hex}").start()
