"""A capped cache that cannot hold the shards a shuffled order keeps in use: the sampler
shuffles fewer shards together, so that every shard is downloaded once an epoch, every
sample comes once, the limit holds and a mid-epoch resume is exact."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch

from fastdata import ShardAwareDistributedSampler, ShardDataset
from fastdata.shards import load_manifest
from tests.storage._proxy import FaultProxy
from tests.storage.conftest import upload_folder, write_set
from tests.storage.test_cache import UsageWatcher, persistent_loader

# 16 shards of 16 samples. A batch of 4 with 2 workers (2 batches each in flight) reads at
# most about 20 samples behind the sampler: less than two shards.
_SHARDS = (16,) * 16
_NUM_SAMPLES = sum(_SHARDS)


def _shard_gets(proxy: FaultProxy) -> dict[str, int]:
    return {path: n for path, n in proxy.gets.items() if path.endswith(".h5")}


def _capped_set(bucket: str, tmp_path: Path, prefix: str, shards: int) -> tuple[Path, str, int]:
    """The local set, its URL, and a limit that holds ``shards`` of its largest shards."""
    local = write_set(tmp_path / "set", _SHARDS)
    url = upload_folder(bucket, local, prefix)
    largest = max(info.num_bytes for info in load_manifest(local).shards)
    return local, url, shards * largest


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_cache_below_the_order_window_downloads_each_shard_once_an_epoch(
    bucket: str, tmp_path: Path, proxy: FaultProxy, num_workers: int
) -> None:
    """A cache of 4 shards, a sampler asked to shuffle 4 together (9 in use: 4 where it
    hands samples out, 4 where the loader reads them, one spare): it shuffles 1 instead,
    says so once, and no shard is evicted while the epoch still reads it."""
    local, url, limit = _capped_set(bucket, tmp_path, "small-window", 4)
    reference = ShardDataset(local)
    cache = tmp_path / "cache"
    watcher = UsageWatcher(cache)
    dataset = ShardDataset(url, cache_dir=cache, cache_limit=limit)
    with pytest.warns(UserWarning) as caught:
        sampler = ShardAwareDistributedSampler(dataset, num_replicas=1, rank=0, seed=2)
    assert [str(w.message) for w in caught] == [
        f"cache_limit ({limit} bytes) holds 4 shards of the set: the sampler shuffles 1 "
        "shard together instead of window_shards=4, so that the cache holds the 3 its "
        "order keeps in use (those shuffled together where the sampler hands samples out, "
        "again where the loader reads them, and one spare) and no shard is downloaded "
        f"twice an epoch; allow {limit // 4 * 9} bytes to shuffle 4 together"
    ]
    assert sampler.window_shards == 1
    as_if_asked = ShardAwareDistributedSampler(reference, 1, 0, seed=2, window_shards=1)
    assert sampler.rank_indices(3).tolist() == as_if_asked.rank_indices(3).tolist()
    loader = persistent_loader(dataset, sampler, num_workers)
    for epoch in range(2):
        proxy.gets.clear()
        sampler.set_epoch(epoch)
        seen: list[int] = []
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the cache holds what the order keeps in use
            for images, labels in loader:
                assert torch.equal(images, reference.__getitems__(labels.tolist())[0])
                assert watcher.sample() <= limit
                seen.extend(labels.tolist())
        assert sorted(seen) == list(range(_NUM_SAMPLES))
        shard_gets = _shard_gets(proxy)
        assert max(shard_gets.values(), default=0) <= 1, (epoch, shard_gets)
        assert len(shard_gets) >= len(_SHARDS) - 4  # the cache holds 4: the rest came again
    assert 0 < watcher.stop() <= limit


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_mid_epoch_resume_through_a_small_cache_is_exact(
    bucket: str, tmp_path: Path, proxy: FaultProxy, num_workers: int
) -> None:
    """The order the cache allows is a function of the set and its limit: a run stopped
    mid-epoch and resumed in a new process (a new dataset, the same limit) serves exactly
    the samples of the uninterrupted run, each shard downloaded at most once."""
    _, url, limit = _capped_set(bucket, tmp_path, "small-resume", 4)

    def loader(cache: Path):  # type: ignore[no-untyped-def]
        dataset = ShardDataset(url, cache_dir=cache, cache_limit=limit)
        with pytest.warns(UserWarning, match="the sampler shuffles 1 shard together"):
            sampler = ShardAwareDistributedSampler(dataset, num_replicas=1, rank=0, seed=5)
        sampler.set_epoch(1)
        context = "fork" if num_workers else None
        return dataset.loader(batch_size=4, sampler=sampler, num_workers=num_workers,
                              multiprocessing_context=context)  # fmt: skip

    uninterrupted = [labels.tolist() for _, labels in loader(tmp_path / "cache-whole")]
    first = loader(tmp_path / "cache")
    taken = []
    for step, (_, labels) in enumerate(first):
        taken.append(labels.tolist())
        if step == 13:  # in the 4th shard of the order
            state = first.state_dict()
            break
    del first
    proxy.gets.clear()
    resumed = loader(tmp_path / "cache")
    resumed.load_state_dict(state)
    rest = [labels.tolist() for _, labels in resumed]
    assert taken + rest == uninterrupted
    assert sorted(label for batch in taken + rest for label in batch) == list(range(_NUM_SAMPLES))
    assert max(_shard_gets(proxy).values(), default=0) <= 1, _shard_gets(proxy)


def test_a_state_saved_with_a_smaller_cache_names_the_limit(bucket: str, tmp_path: Path) -> None:
    """A state saved under a cache that shrank the window does not load into a sampler
    that shuffles more shards together (its order differs): the message says why."""
    local, url, limit = _capped_set(bucket, tmp_path, "small-state", 4)
    capped = ShardDataset(url, cache_dir=tmp_path / "cache", cache_limit=limit)
    with pytest.warns(UserWarning, match="shuffles 1 shard together"):
        saved = ShardAwareDistributedSampler(capped, num_replicas=1, rank=0).state_dict(3)
    roomy = ShardDataset(url, cache_dir=tmp_path / "cache", cache_limit=2 * limit)
    with pytest.warns(UserWarning, match="shuffles 3 shards together"):
        sampler = ShardAwareDistributedSampler(roomy, num_replicas=1, rank=0)
    expected = (
        r"saved with window_shards=1, this sampler has window_shards=3 \(its cache_limit "
        r"lets it shuffle 3 shards together of the 4 asked for: resume with the cache_limit "
        r"of the saved run\)"
    )
    with pytest.raises(ValueError, match=expected):
        sampler.load_state_dict(saved)
    same = ShardDataset(url, cache_dir=tmp_path / "cache", cache_limit=limit)
    with pytest.warns(UserWarning, match="shuffles 1 shard together"):
        ShardAwareDistributedSampler(same, num_replicas=1, rank=0).load_state_dict(saved)
    # the order is that of one shard shuffled at a time, wherever the set is
    ShardAwareDistributedSampler(local, 1, 0, window_shards=1).load_state_dict(saved)
