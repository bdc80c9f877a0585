"""What each rank of the multi-rank cache tests runs, in a process ``mp.spawn`` started
(kept apart from the test module, so that a rank imports no S3 server)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

from fastdata import ShardAwareDistributedSampler, ShardDataset
from tests.datasets.conftest import gloo_group


def build_and_read(rank: int, url: str, caches: list[tuple[str, int]], out: str) -> None:
    """Join a 2-rank gloo group, build the set with this rank's ``(cache_dir,
    cache_limit)`` and the sampler over it, serve two epochs; write what happened to
    ``out/rank<r>.json`` (or the error the sampler raised)."""
    cache_dir, cache_limit = caches[rank]
    result: dict[str, object] = {}
    with gloo_group(rank, str(Path(out) / "rendezvous")):
        dataset = ShardDataset(url, cache_dir=cache_dir, cache_limit=cache_limit)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                sampler = ShardAwareDistributedSampler(dataset, seed=3)
            except ValueError as error:
                result["error"] = str(error)
        result["warnings"] = [str(warning.message) for warning in caught]
        if "error" not in result:
            room = dataset.cache_room
            result["window_shards"] = sampler.window_shards
            result["room_bytes"] = None if room is None else room.limit_bytes
            for epoch in (0, 1):
                sampler.set_epoch(epoch)
                loader = dataset.loader(batch_size=8, sampler=sampler, num_workers=0)
                result[f"epoch{epoch}"] = [
                    label for _, labels in loader for label in labels.tolist()
                ]
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
