"""The shard-aware sampler in a real process group: 2 CPU processes, gloo, loopback."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader

from fastdata.datasets import ShardDataset, passthrough_collate
from fastdata.datasets.distributed import ShardAwareDistributedSampler
from fastdata.shards import FieldSpec
from tests.datasets.conftest import gloo_group, write_shards

SIZES = [9, 4, 12, 7, 5, 8, 11]  # 56 samples: 28 per rank, 7 batches of 4
BATCH = 4


def _epoch(loader: DataLoader) -> list[int]:
    """One epoch with a collective per step, as DDP does: unequal lengths would hang."""
    seen = []
    for batch in loader:
        step = torch.ones(1)
        dist.all_reduce(step)
        seen.extend(batch.tolist())
    return seen


def _worker(rank: int, root: str, store: str) -> None:
    with gloo_group(rank, store):
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


def test_two_gloo_ranks_cover_the_dataset_once_per_epoch_and_resume(tmp_path: Path) -> None:
    labels = [{"label": i} for i in range(sum(SIZES))]  # label = global index
    write_shards(tmp_path, [FieldSpec("label", "array", "int64")], labels, SIZES)
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
