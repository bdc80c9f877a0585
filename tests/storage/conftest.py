"""A real S3-protocol server on 127.0.0.1 (moto's server mode) and a fault proxy in front
of it; tests reach both over HTTP through fastdata's own client, configured only through
the standard AWS environment variables."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastdata._storage import RemoteLocation, _backend, parse_location
from fastdata._storage._backend import object_store
from tests.conftest import write_image_shards
from tests.storage._proxy import FaultProxy

moto_server = pytest.importorskip("moto.server", reason="the test extra installs moto[server]")
boto3 = pytest.importorskip("boto3", reason="the [s3] extra installs boto3")

_buckets = itertools.count()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """``host:port`` of a moto S3 server for the whole session."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"{host}:{port}"
    server.stop()


def _environment(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFASTDATATEST0000")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "fastdata-test-secret-key-do-not-log")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("FASTDATA_STORAGE_TIMEOUT_S", "20")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    _backend._clients.clear()  # clients read the environment when created


@pytest.fixture
def proxy(s3_server: str) -> Iterator[FaultProxy]:
    fault_proxy = FaultProxy(s3_server)
    yield fault_proxy
    fault_proxy.close()


@pytest.fixture
def bucket(
    s3_server: str, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> str:
    """A new empty bucket; the environment points the client at it through ``proxy``, and
    the default cache folder into ``tmp_path``."""
    name = f"fastdata-test-{next(_buckets)}"
    client = boto3.client(
        "s3",
        endpoint_url=f"http://{s3_server}",
        aws_access_key_id="x",
        aws_secret_access_key="x",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=name)
    _environment(monkeypatch, proxy.url)
    monkeypatch.setenv("FASTDATA_CACHE_DIR", str(tmp_path / "default-cache"))
    return name


def write_set(root: Path, shard_sizes: tuple[int, ...] = (8, 8, 8, 8, 6), seed: int = 0) -> Path:
    """A shard set of ``(16, 16, 3)`` uint8 images and int64 labels (label = index)."""
    return write_image_shards(root, shard_sizes, seed=seed, class_names=["a"])


def upload_folder(bucket: str, folder: Path, prefix: str) -> str:
    """Upload every file of ``folder`` under ``s3://bucket/prefix/``; returns that URL."""
    location = parse_location(f"s3://{bucket}/{prefix}")
    assert isinstance(location, RemoteLocation)
    store = object_store(location)
    for path in sorted(folder.iterdir()):
        if path.is_file():
            store.upload(path, location.key(path.name))
    return location.url


def upload_tree(bucket: str, folder: Path, prefix: str) -> str:
    """Upload every file under ``folder`` (at any depth) as ``s3://bucket/prefix/<relative
    path>``; returns that URL."""
    location = parse_location(f"s3://{bucket}/{prefix}")
    assert isinstance(location, RemoteLocation)
    store = object_store(location)
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            store.upload(path, location.key(path.relative_to(folder).as_posix()))
    return location.url
