"""Reading a shard set from a real S3-protocol server: the same batches as the local set,
through a bounded, verified cache shared by the processes of a node."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from fastdata import RAMDataset, ShardAwareDistributedSampler, ShardDataset
from fastdata.datasets import passthrough_collate
from tests.storage._proxy import FaultProxy
from tests.storage.conftest import upload_folder, write_set


@pytest.fixture
def remote_set(bucket: str, tmp_path: Path) -> tuple[Path, str]:
    """The same shard set on disk and in the bucket: ``(folder, url)``."""
    local = write_set(tmp_path / "set")
    return local, upload_folder(bucket, local, "sets/small")


def _batches(dataset: ShardDataset | RAMDataset, num_workers: int = 0) -> list[list[torch.Tensor]]:
    sampler = ShardAwareDistributedSampler(dataset, num_replicas=1, rank=0, seed=3, window_shards=2)
    loader = DataLoader(
        dataset,
        batch_size=5,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=passthrough_collate,
        multiprocessing_context="fork" if num_workers else None,
    )
    return [list(batch) for batch in loader]


def _same(left: list[list[torch.Tensor]], right: list[list[torch.Tensor]]) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_are_those_of_the_local_set(
    remote_set: tuple[Path, str], tmp_path: Path, proxy: FaultProxy, num_workers: int
) -> None:
    local, url = remote_set
    remote = ShardDataset(url, cache_dir=tmp_path / "cache", cache_limit="1GB")
    _same(_batches(remote, num_workers), _batches(ShardDataset(local), num_workers))
    shard_gets = {path: n for path, n in proxy.gets.items() if path.endswith(".h5")}
    assert len(shard_gets) == 5 and set(shard_gets.values()) == {1}  # one download each
    again = ShardDataset(url, cache_dir=tmp_path / "cache")  # a later run: all cached
    _same(_batches(again, num_workers), _batches(ShardDataset(local), num_workers))
    assert sum(n for path, n in proxy.gets.items() if path.endswith(".h5")) == 5


def test_ram_dataset_from_a_remote_set(remote_set: tuple[Path, str], tmp_path: Path) -> None:
    local, url = remote_set
    remote = RAMDataset.from_shards(url, cache_dir=tmp_path / "c", show_progress=False)
    _same(_batches(remote), _batches(RAMDataset.from_shards(local, show_progress=False)))


def test_ram_dataset_larger_than_the_cache_downloads_each_shard_once(
    remote_set: tuple[Path, str], tmp_path: Path, proxy: FaultProxy
) -> None:
    local, url = remote_set
    largest = max(path.stat().st_size for path in local.glob("*.h5"))
    remote = RAMDataset.from_shards(
        url, cache_dir=tmp_path / "c", cache_limit=largest, show_progress=False
    )
    _same(_batches(remote), _batches(RAMDataset.from_shards(local, show_progress=False)))
    shard_gets = {path: n for path, n in proxy.gets.items() if path.endswith(".h5")}
    assert len(shard_gets) == 5 and set(shard_gets.values()) == {1}
