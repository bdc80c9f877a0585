"""The S3 client's reads on real HTTP (moto's server, directly or behind the proxy)."""

from __future__ import annotations

import os

import pytest

from fastdata._storage import RemoteLocation, object_store, parse_location
from fastdata._storage._s3 import S3Store
from tests.storage._proxy import FaultProxy

_MIB = 1 << 20


def _store(bucket: str) -> S3Store:
    location = parse_location(f"s3://{bucket}/objects")
    assert isinstance(location, RemoteLocation)
    store = object_store(location)
    assert isinstance(store, S3Store)
    return store


def test_a_download_streams_through_a_buffer_that_fits_the_cpu_cache(bucket: str) -> None:
    """A shard's bytes go from the socket through the SHA-256 into the cache file in
    chunks small enough to stay in the CPU's cache between the three (chunks of several
    MiB went through memory each time: about 2.5x the CPU per download)."""
    store = _store(bucket)
    data = os.urandom(5 * _MIB + 123)
    store.write_bytes("objects/big.bin", data)
    sizes: list[int] = []
    received = bytearray()
    for chunk in store.stream("objects/big.bin"):
        sizes.append(len(chunk))
        received += chunk
    assert bytes(received) == data
    assert max(sizes) <= _MIB


@pytest.mark.parametrize("num_bytes", [0, 1, 256 << 10, 3 * _MIB + 7])
def test_a_streamed_object_arrives_whole_at_any_size(bucket: str, num_bytes: int) -> None:
    store = _store(bucket)
    data = os.urandom(num_bytes)
    store.write_bytes(f"objects/{num_bytes}.bin", data)
    assert b"".join(bytes(chunk) for chunk in store.stream(f"objects/{num_bytes}.bin")) == data


def test_clients_share_the_parsed_service_descriptions(bucket: str) -> None:
    """Every client of a process (and of the workers it forks) is made on one loader of
    botocore's service descriptions: parsed once, a client then costs about 0.01 s of CPU
    instead of 0.07-0.2 s (a DataLoader worker that downloads makes its own client)."""
    first = S3Store(bucket)
    second = S3Store(bucket)
    loader = first._client._loader
    assert second._client._loader is loader
    assert len(loader.search_paths) == len(set(loader.search_paths))
    assert second._client.head_bucket(Bucket=bucket)["ResponseMetadata"]["HTTPStatusCode"] == 200


def test_a_client_reads_the_environment_when_it_is_made(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sharing the loader shares no configuration: a client made after the environment
    changed uses the new one."""
    S3Store(bucket)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    assert S3Store(bucket)._client.meta.endpoint_url == "http://127.0.0.1:9"


def test_a_streamed_download_returns_its_connection_to_the_pool(
    bucket: str, proxy: FaultProxy
) -> None:
    """A body read to its end gives its connection back for the next request: one TCP
    connection for a row of downloads from a store that keeps connections open (each GET
    that closed its connection paid a new one: a handshake, behind a store's latency)."""
    data = os.urandom(_MIB + 5)
    store = _store(bucket)
    store.write_bytes("objects/shard.bin", data)
    proxy.keep_alive = True
    before = proxy.connections
    for _ in range(5):
        assert b"".join(bytes(chunk) for chunk in store.stream("objects/shard.bin")) == data
    assert proxy.gets["/" + bucket + "/objects/shard.bin"] == 5
    assert proxy.connections - before == 1
