"""A mid-epoch checkpoint of a remote set resumes with exactly the samples the uninterrupted
run would have seen, without downloading again what the cache holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastdata import ShardAwareDistributedSampler, ShardDataset
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
