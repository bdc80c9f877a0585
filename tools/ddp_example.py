"""DDP loading with fastdata: ``torchrun --nproc-per-node 2 tools/ddp_example.py OUT``.

Each rank reads mostly its own shards (``ShardAwareDistributedSampler``), every rank runs
the same number of steps, and ``--ram`` holds the dataset once per node in shared memory
(``share_on_node``) instead of once per rank. Runs on CPU (gloo) or GPUs (nccl).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from fastdata.datasets import (
    RAMDataset,
    ShardAwareDistributedSampler,
    ShardDataset,
    passthrough_collate,
    share_on_node,
)
from fastdata.datasets.node_shared import shared_memory_usage


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards", help="a `fastdata preprocess` output folder")
    parser.add_argument("--ram", action="store_true", help="one RAMDataset per node")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    if args.ram:
        dataset = share_on_node(lambda: RAMDataset.from_shards(args.shards, show_progress=False))
        sampler = ShardAwareDistributedSampler(args.shards, seed=0)  # shard sizes from disk
    else:
        dataset = ShardDataset(args.shards)
        sampler = ShardAwareDistributedSampler(dataset, seed=0)
    loader = DataLoader(
        dataset, args.batch_size, sampler=sampler, num_workers=2, collate_fn=passthrough_collate
    )
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        seen = torch.zeros(1)
        for images, _labels in loader:  # (B, C, H, W) uint8
            seen += len(images)
        dist.all_reduce(seen)
        if rank == 0:
            print(f"epoch {epoch}: {int(seen)} samples over {dist.get_world_size()} ranks")
    if args.ram:
        # The builder rank wrote every page; the others map them (here their workers read).
        pss = shared_memory_usage()["pss_bytes"] / 2**20
        size = dataset.nbytes / 2**20
        print(f"rank {rank}: node-shared dataset of {size:.0f} MiB, {pss:.0f} MiB in this PSS")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
