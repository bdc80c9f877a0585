"""A mid-epoch checkpoint of a remote set resumes with exactly the samples the uninterrupted
run would have seen, without downloading again what the cache holds."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from torch.utils.data import DataLoader

from fastdata import ShardAwareDistributedSampler, ShardDataset
from fastdata._storage._files import CachedFiles
from fastdata.datasets import passthrough_collate
from fastdata.datasets._loader import ResumableDataLoader
from tests.storage._proxy import FaultProxy
from tests.storage.conftest import upload_folder, write_set


def _loader(dataset: ShardDataset, num_workers: int):  # type: ignore[no-untyped-def]
    sampler = ShardAwareDistributedSampler(dataset, num_replicas=1, rank=0, seed=7, window_shards=2)
    sampler.set_epoch(1)
    context = "fork" if num_workers else None
    return dataset.loader(batch_size=3, sampler=sampler, num_workers=num_workers,
                          multiprocessing_context=context)  # fmt: skip


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_mid_epoch_resume_is_exact_and_downloads_nothing_cached(
    bucket: str, tmp_path: Path, proxy: FaultProxy, num_workers: int
) -> None:
    local = write_set(tmp_path / "set")
    url = upload_folder(bucket, local, "resume")
    cache = tmp_path / "cache"
    uninterrupted = [labels.tolist() for _, labels in _loader(ShardDataset(local), num_workers)]

    first = _loader(ShardDataset(url, cache_dir=cache), num_workers)
    taken = []
    for step, (_, labels) in enumerate(first):
        taken.append(labels.tolist())
        if step == 4:
            state = first.state_dict()
            break
    del first
    cached = {p.name for p in cache.glob("*.h5")}
    gets_before = sum(n for p, n in proxy.gets.items() if p.endswith(".h5"))

    resumed = _loader(ShardDataset(url, cache_dir=cache), num_workers)
    resumed.load_state_dict(state)
    rest = [labels.tolist() for _, labels in resumed]
    assert taken + rest == uninterrupted
    assert cached  # the first run had shards in the cache; none of them came again
    downloaded_again = sum(n for p, n in proxy.gets.items() if p.endswith(".h5")) - gets_before
    assert downloaded_again <= 5 - len(cached)


@pytest.mark.parametrize("kind", ["dataset.loader", "DataLoader"])
def test_downloads_start_before_the_workers_and_each_shard_comes_once(
    bucket: str, tmp_path: Path, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """``set_epoch`` starts the epoch's read-ahead (the loader's iteration too), before the
    loader starts its worker processes: the shards the order reads first are downloading
    while they start. The iteration takes that read-ahead over: every shard downloaded
    once, the samples those of the local set, in its order."""
    local = write_set(tmp_path / "set")
    url = upload_folder(bucket, local, "early")
    expected = [labels.tolist() for _, labels in _loader(ShardDataset(local), 2)]
    asked: list[str] = []  # shards asked for ahead of their use: held or not
    prefetch, warm = CachedFiles.prefetch, CachedFiles.warm

    def counted(self: CachedFiles, file: str, num_bytes: int, sha256: str) -> None:
        asked.append(file)
        prefetch(self, file, num_bytes, sha256)

    def counted_warm(self: CachedFiles, file: str, num_bytes: int, sha256: str) -> None:
        asked.append(file)
        warm(self, file, num_bytes, sha256)

    asked_when_workers_start: list[list[str]] = []
    owner = ResumableDataLoader if kind == "dataset.loader" else DataLoader
    get_iterator = owner._get_iterator

    def starting_workers(self: DataLoader) -> Any:
        asked_when_workers_start.append(list(asked))
        return get_iterator(self)

    monkeypatch.setattr(CachedFiles, "prefetch", counted)
    monkeypatch.setattr(CachedFiles, "warm", counted_warm)
    monkeypatch.setattr(owner, "_get_iterator", starting_workers)
    dataset = ShardDataset(url, cache_dir=tmp_path / "cache")
    if kind == "dataset.loader":
        loader = _loader(dataset, 2)
        sampler = loader.sampler
    else:
        sampler = ShardAwareDistributedSampler(
            dataset, num_replicas=1, rank=0, seed=7, window_shards=2
        )
        sampler.set_epoch(1)
        loader = DataLoader(dataset, batch_size=3, sampler=sampler, num_workers=2,
                            multiprocessing_context="fork",
                            collate_fn=passthrough_collate)  # fmt: skip
    first_shard = dataset.store.reader.locate(np.asarray(sampler.rank_indices()[:1]))[0]
    got = [labels.tolist() for _, labels in loader]
    assert got == expected
    assert len(asked_when_workers_start) == 1
    early = asked_when_workers_start[0]
    assert dataset.manifest.shards[int(first_shard[0])].file in early
    assert len(early) == len(set(asked)) == 5  # the window covers the set: all, once
    assert sorted(n for p, n in proxy.gets.items() if p.endswith(".h5")) == [1] * 5


def test_a_started_read_ahead_is_dropped_when_the_order_changes(
    bucket: str, tmp_path: Path, proxy: FaultProxy
) -> None:
    """A read-ahead started for one epoch is let go when another epoch is chosen before the
    iteration: the iteration yields the new epoch's order, and nothing stays held."""
    local = write_set(tmp_path / "set")
    url = upload_folder(bucket, local, "dropped")
    expected = [labels.tolist() for _, labels in _loader(ShardDataset(local), 0)]
    dataset = ShardDataset(url, cache_dir=tmp_path / "cache")
    loader = _loader(dataset, 0)  # set_epoch(1): started
    loader.sampler.set_epoch(5)
    loader.sampler.set_epoch(1)
    assert [labels.tolist() for _, labels in loader] == expected
    files = dataset.store.reader.files
    assert isinstance(files, CachedFiles)
    assert files._prefetching == {}  # every prefetch released


def test_a_sampler_started_and_never_iterated_holds_no_shard(
    bucket: str, tmp_path: Path, proxy: FaultProxy
) -> None:
    """``set_epoch`` starts downloading the epoch's first shards without holding them: a
    sampler never iterated (a loader built and left aside, a framework that calls
    ``set_epoch`` on every sampler) keeps nothing in the cache from eviction. Its
    iteration then holds them, and downloads none of them again."""
    local = write_set(tmp_path / "set")
    url = upload_folder(bucket, local, "idle")
    expected = [labels.tolist() for _, labels in _loader(ShardDataset(local), 0)]
    cache = tmp_path / "cache"
    dataset = ShardDataset(url, cache_dir=cache)
    loader = _loader(dataset, 0)  # set_epoch(1): the read-ahead started
    files = dataset.store.reader.files
    assert isinstance(files, CachedFiles) and files._pool is not None
    files._pool.shutdown(wait=True)  # its downloads are done, and what follows them
    files._pool = None
    shards = sorted(cache.glob("*.h5"))
    assert len(shards) == 5
    for path in shards:  # no process holds a shared lock on it: the cache may evict it
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert files._prefetching == {}
    assert [labels.tolist() for _, labels in loader] == expected
    assert sorted(n for p, n in proxy.gets.items() if p.endswith(".h5")) == [1] * 5
