"""Failures between the client and the store, injected by a proxy on real HTTP: transient
ones are retried and never yield a wrong sample; permanent ones are one line; a corrupt
download is fetched once more, then refused; credentials never show."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from fastdata import ShardAwareDistributedSampler, ShardDataset, StorageError
from fastdata._storage import _backend
from fastdata.datasets import passthrough_collate
from fastdata.errors import ShardFormatError
from fastdata.shards import load_manifest
from tests.storage._proxy import FaultProxy
from tests.storage.conftest import upload_folder, write_set

SECRET = "fastdata-test-secret-key-do-not-log"


@pytest.fixture
def remote_set(bucket: str, tmp_path: Path) -> tuple[Path, str]:
    local = write_set(tmp_path / "set")
    return local, upload_folder(bucket, local, "faulty")


def _all_samples(dataset: ShardDataset) -> list[torch.Tensor]:
    indices = list(range(len(dataset)))[::-1]
    return list(dataset.__getitems__(indices))


@pytest.mark.parametrize("fault", ["drop", "503", "truncate", "corrupt"])
def test_a_fault_on_each_request_once_is_survived(
    remote_set: tuple[Path, str], tmp_path: Path, proxy: FaultProxy, fault: str,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    local, url = remote_set
    proxy.match = lambda method, path: method == "GET"  # the manifest too
    proxy.plan = [fault, None] * 6  # every other GET fails once
    with caplog.at_level(logging.DEBUG, logger="fastdata"):
        remote = ShardDataset(url, cache_dir=tmp_path / "cache")
        for got, expected in zip(_all_samples(remote), _all_samples(ShardDataset(local)),
                                 strict=True):  # fmt: skip
            assert torch.equal(got, expected)
    assert proxy.faults_sent[fault] >= 3
    assert SECRET not in caplog.text and "AKIAFASTDATATEST0000" not in caplog.text


# a small cache on purpose: the warning of a small cache is expected
@pytest.mark.filterwarnings("ignore:cache_limit .* holds 2 shards:UserWarning")
def test_latency_and_mixed_faults_under_workers_yield_the_right_samples(
    remote_set: tuple[Path, str], tmp_path: Path, proxy: FaultProxy
) -> None:
    local, url = remote_set
    proxy.latency_s = 0.02
    proxy.plan, proxy.repeat = ["drop", None, "503", "truncate", None, "corrupt", None], True
    # A damaged body is fetched once more; damaged twice, a shard is a ShardFormatError (the
    # next test). With two workers the cycle could hand one shard's retry a damage too.
    proxy.damage_once = True
    largest = max(info.num_bytes for info in load_manifest(local).shards)
    remote = ShardDataset(url, cache_dir=tmp_path / "cache", cache_limit=2 * largest)
    reference = ShardDataset(local)
    sampler = ShardAwareDistributedSampler(remote, num_replicas=1, rank=0, window_shards=1)
    loader = DataLoader(remote, batch_size=4, sampler=sampler, num_workers=2,
                        collate_fn=passthrough_collate, multiprocessing_context="fork")  # fmt: skip
    seen = []
    for images, labels in loader:
        assert torch.equal(images, reference.__getitems__(labels.tolist())[0])
        seen.extend(labels.tolist())
    assert sorted(seen) == list(range(len(reference)))
    assert sum(proxy.faults_sent.values()) >= 3


def test_a_corrupt_download_twice_is_a_shard_format_error(
    remote_set: tuple[Path, str], tmp_path: Path, proxy: FaultProxy
) -> None:
    _, url = remote_set
    proxy.plan, proxy.repeat = ["corrupt"], True  # every shard download is damaged
    remote = ShardDataset(url, cache_dir=tmp_path / "cache")
    with pytest.raises(ShardFormatError, match="does not match the manifest twice") as info:
        remote.__getitems__([0])
    assert "shard-00000.h5" in str(info.value) and "\n" not in str(info.value)
    assert proxy.gets[f"/{url.split('/')[2]}/faulty/shard-00000.h5"] == 2  # once more, no more
    assert not list((tmp_path / "cache").glob("*.h5"))  # nothing wrong was kept


def test_a_missing_bucket_is_one_line_without_credentials(
    bucket: str, tmp_path: Path, proxy: FaultProxy
) -> None:
    with pytest.raises(StorageError, match=r"^cannot read s3://no-such-bucket-x/set/index.json: "
                       r"no such bucket \(HTTP 404\)$") as info:  # fmt: skip
        ShardDataset("s3://no-such-bucket-x/set/", cache_dir=tmp_path / "c")
    assert SECRET not in str(info.value)


def test_a_missing_set_is_a_shard_format_error(bucket: str, tmp_path: Path) -> None:
    with pytest.raises(ShardFormatError, match="no shard manifest found"):
        ShardDataset(f"s3://{bucket}/nothing-here/", cache_dir=tmp_path / "c")


def test_a_store_slower_than_the_timeout_fails_after_the_retries(
    remote_set: tuple[Path, str], tmp_path: Path, proxy: FaultProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    _, url = remote_set
    monkeypatch.setenv("FASTDATA_STORAGE_TIMEOUT_S", "1")
    monkeypatch.setenv("FASTDATA_STORAGE_ATTEMPTS", "2")
    _backend._clients.clear()
    proxy.latency_s = 4.0
    with pytest.raises(StorageError, match=r"cannot read .*index\.json: .*timeout") as info:
        ShardDataset(url, cache_dir=tmp_path / "c")
    assert "\n" not in str(info.value)


def test_a_shard_body_is_checked_by_its_sha256_not_twice_by_the_client(
    remote_set: tuple[Path, str], tmp_path: Path, proxy: FaultProxy
) -> None:
    """The client skips its own CRC of a shard's body (the cache checks the SHA-256 the
    manifest records); the manifest, which nothing else checks, is still read with it."""
    _, url = remote_set
    proxy.plan, proxy.repeat = ["corrupt"], True  # every shard download is damaged
    remote = ShardDataset(url, cache_dir=tmp_path / "cache")
    with pytest.raises(ShardFormatError, match=r"twice \(SHA-256 [0-9a-f]{12}…, the manifest"):
        remote.__getitems__([0])
    proxy.match = lambda method, path: method == "GET" and path.endswith("index.json")
    proxy.plan, proxy.repeat = ["corrupt", None], False
    assert len(ShardDataset(url, cache_dir=tmp_path / "cache")) == len(remote)
    assert proxy.faults_sent["corrupt"] >= 3
