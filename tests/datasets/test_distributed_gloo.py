"""The shard-aware sampler in a real process group: 2 CPU processes, gloo, loopback."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from fastdata.datasets import ShardDataset, passthrough_collate
from fastdata.datasets.distributed import ShardAwareDistributedSampler
from fastdata.shards import FieldSpec, Manifest, ShardWriter, save_manifest

SIZES = [9, 4, 12, 7, 5, 8, 11]  # 56 samples: 28 per rank, 7 batches of 4
BATCH = 4


def _write_shards(root: Path, sizes: list[int]) -> None:
    fields = [FieldSpec("label", "array", "int64")]
    shards, start = [], 0
    for number, count in enumerate(sizes):
        with ShardWriter(root / f"shard-{number:05d}.h5", fields) as writer:
            for i in range(start, start + count):
                writer.append({"label": i})
            shards.append(writer.close())
        start += count
    save_manifest(root, Manifest(fields=fields, shards=shards))


def _epoch(loader: DataLoader) -> list[int]:
    """One epoch with a collective per step, as DDP does: unequal lengths would hang."""
    seen = []
    for batch in loader:
        step = torch.ones(1)
        dist.all_reduce(step)
        seen.extend(batch.tolist())
    return seen


def _worker(rank: int, root: str, store: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=60),
    )
    try:
        dataset = ShardDataset(root, fields=("label",))  # labels = global indices
        sampler = ShardAwareDistributedSampler(dataset, seed=7)  # world from the process group
        loader = DataLoader(dataset, BATCH, sampler=sampler, collate_fn=passthrough_collate)
        result: dict[str, object] = {"batches": len(loader)}
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            result[f"epoch{epoch}"] = _epoch(loader)
        # stop after 3 batches of epoch 2, save, resume in a fresh sampler
        sampler.set_epoch(2)
        head: list[int] = []
        for step, batch in enumerate(loader):
            head.extend(batch.tolist())
            if step == 2:
                break
        state = sampler.state_dict(num_consumed=3 * BATCH)
        resumed = ShardAwareDistributedSampler(dataset, seed=7)
        resumed.load_state_dict(json.loads(json.dumps(state)))
        resumed.set_epoch(2)
        tail = _epoch(DataLoader(dataset, BATCH, sampler=resumed, collate_fn=passthrough_collate))
        result["epoch2"] = head + tail
        gathered: list[object] = [None, None]
        dist.all_gather_object(gathered, result)
        if rank == 0:
            Path(root, "result.json").write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_cover_the_dataset_once_per_epoch_and_resume(tmp_path: Path) -> None:
    _write_shards(tmp_path, SIZES)
    mp.spawn(_worker, args=(str(tmp_path), str(tmp_path / "store")), nprocs=2, join=True)
    ranks = json.loads((tmp_path / "result.json").read_text())
    assert ranks[0]["batches"] == ranks[1]["batches"] == 7
    for epoch in ("epoch0", "epoch1", "epoch2"):
        union = ranks[0][epoch] + ranks[1][epoch]
        assert sorted(union) == list(range(sum(SIZES))), epoch  # exactly once, 56 = 2 x 28
    assert ranks[0]["epoch0"] != ranks[0]["epoch1"]  # reshuffled per epoch
    # the mid-epoch resume gives the order of an uninterrupted epoch 2
    for rank in (0, 1):
        sampler = ShardAwareDistributedSampler(SIZES, 2, rank, seed=7)
        sampler.set_epoch(2)
        assert ranks[rank]["epoch2"] == sampler.rank_indices().tolist()
