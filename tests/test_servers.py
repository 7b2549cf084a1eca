"""The test S3 servers and store fixtures work, and conditional writes behave as recorded in
tests/servers.py (s3fs turns a 412 into FileExistsError on moto, but into OSError(EINVAL) on
SeaweedFS)."""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path
from typing import Any

import botocore.exceptions
import fsspec
import pytest

from tests.conftest import StoreTarget
from tests.servers import LOOPBACK, MotoServer, S3Server, SeaweedServer, is_precondition_failed

pytestmark = pytest.mark.s3


@pytest.fixture(params=["moto", "seaweed"])
def server(request: pytest.FixtureRequest) -> S3Server:
    result: S3Server = request.getfixturevalue(f"{request.param}_server")
    return result


def _fs(options: dict[str, Any]) -> Any:
    return fsspec.filesystem("s3", skip_instance_cache=True, **options)


def test_write_read_list_delete(server: S3Server) -> None:
    url, options = server.new_store_url()
    fs = _fs(options)
    root = url.removeprefix("s3://")
    fs.pipe_file(f"{root}/a/one.json", b'{"n": 1}')
    fs.pipe_file(f"{root}/a/two.json", b'{"n": 2}')
    assert fs.cat_file(f"{root}/a/one.json") == b'{"n": 1}'
    assert sorted(fs.ls(f"{root}/a", detail=False)) == [f"{root}/a/one.json", f"{root}/a/two.json"]
    with fsspec.open(f"{url}/a/two.json", "rb", **options) as f:
        assert f.read() == b'{"n": 2}'
    fs.rm(f"{root}/a/one.json")
    assert fs.ls(f"{root}/a", detail=False, refresh=True) == [f"{root}/a/two.json"]
    assert not fs.exists(f"{root}/a/one.json")


def test_store_urls_are_fresh_and_distinct(server: S3Server) -> None:
    url1, options = server.new_store_url()
    url2, _ = server.new_store_url()
    assert url1 != url2
    fs = _fs(options)
    fs.pipe_file(f"{url1.removeprefix('s3://')}/probe", b"x")
    assert not fs.exists(f"{url2.removeprefix('s3://')}/probe")  # nothing of url1 shows in url2


def test_pipe_file_create_refuses_an_existing_object(server: S3Server) -> None:
    url, options = server.new_store_url()
    fs = _fs(options)
    path = f"{url.removeprefix('s3://')}/_log/00000000000000000000.json"
    fs.pipe_file(path, b"first", mode="create")
    with pytest.raises(OSError) as info:
        fs.pipe_file(path, b"second", mode="create")
    assert is_precondition_failed(info.value)
    if isinstance(server, MotoServer):
        assert isinstance(info.value, FileExistsError)
    else:  # SeaweedFS's 412 body lacks <Condition>, so s3fs cannot tell it is If-None-Match.
        assert not isinstance(info.value, FileExistsError)
        assert info.value.errno == errno.EINVAL
        cause = info.value.__cause__
        assert isinstance(cause, botocore.exceptions.ClientError)
        assert cause.response["Error"]["Code"] == "PreconditionFailed"
        assert cause.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert fs.cat_file(path) == b"first"


def test_conditional_put_through_boto3(server: S3Server) -> None:
    bucket = server.create_bucket()
    client = server.client()
    put = client.put_object(Bucket=bucket, Key="k", Body=b"1", IfNoneMatch="*")
    for condition in ({"IfNoneMatch": "*"}, {"IfMatch": '"0123456789abcdef0123456789abcdef"'}):
        with pytest.raises(botocore.exceptions.ClientError) as info:
            client.put_object(Bucket=bucket, Key="k", Body=b"2", **condition)
        assert info.value.response["Error"]["Code"] == "PreconditionFailed"
        assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    client.put_object(Bucket=bucket, Key="k", Body=b"3", IfMatch=put["ETag"])
    assert client.get_object(Bucket=bucket, Key="k")["Body"].read() == b"3"


def test_if_match_passes_through_s3fs(server: S3Server) -> None:
    url, options = server.new_store_url()
    fs = _fs(options)
    path = f"{url.removeprefix('s3://')}/obj"
    fs.pipe_file(path, b"v1")
    etag = fs.info(path)["ETag"]
    with pytest.raises(OSError) as info:
        fs.pipe_file(path, b"v2", IfMatch='"0123456789abcdef0123456789abcdef"')
    assert is_precondition_failed(info.value)
    fs.pipe_file(path, b"v2", IfMatch=etag)
    assert fs.cat_file(path) == b"v2"


def test_any_store_round_trip(any_store: StoreTarget) -> None:
    fs, root = fsspec.core.url_to_fs(any_store.url, **any_store.storage_options)
    fs.makedirs(root, exist_ok=True)
    fs.pipe_file(f"{root}/x.bin", b"\x00\x01")
    assert fs.cat_file(f"{root}/x.bin") == b"\x00\x01"
    assert any_store.name in {"memory", "local", "moto", "seaweed"}


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex((LOOPBACK, port)) == 0


def test_seaweed_stop_kill_restart_keep_data(tmp_path: Path) -> None:
    server = SeaweedServer(tmp_path / "weed", startup_timeout=60)
    try:
        server.start()
        assert server.startup_seconds is not None
        url, options = server.new_store_url()
        path = f"{url.removeprefix('s3://')}/kept"
        _fs(options).pipe_file(path, b"durable", mode="create")
        endpoint = server.endpoint_url

        server.restart()  # graceful
        assert server.endpoint_url == endpoint
        assert _fs(options).cat_file(path) == b"durable"

        pid = server.pid
        assert pid is not None
        server.restart(crash=True)  # SIGKILL, then start on the same data
        assert server.pid != pid
        fs = _fs(options)
        assert fs.cat_file(path) == b"durable"
        with pytest.raises(OSError) as info:
            fs.pipe_file(path, b"again", mode="create")
        assert is_precondition_failed(info.value)
        last_pid = server.pid
    finally:
        server.close()
    assert not server.running
    assert last_pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(last_pid, 0)
    assert not _port_open(server.ports["s3"])
    assert not any(Path("/tmp").glob(f"seaweedfs-*-grpc-{server.ports['s3'] + 10000}.sock"))
