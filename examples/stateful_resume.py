"""Mid-epoch resume with torchdata's ``StatefulDataLoader`` (or fastdata's own loader).

Make a shard set first, e.g. ``python tools/make_sample_dataset.py sample --num-images 400``
then ``fastdata preprocess sample out/ --size 64``. Then::

    python examples/stateful_resume.py out/ --stop-after 5   # stops mid-epoch, saves the state
    python examples/stateful_resume.py out/ --resume         # finishes that epoch, then the rest

The loader's ``state_dict()`` is taken when a batch is handed to the loop, so it counts
exactly the samples the loop consumed, however many batches the worker processes had
prefetched; ``ShardAwareDistributedSampler.load_state_dict`` then skips exactly those. Under
``torchrun`` every rank saves and loads its own state the same way (one rank's state is
valid on all: every rank consumes the same count). ``--loader fastdata`` does the same with
``dataset.loader(...)`` (a ``ResumableDataLoader``), which needs no extra package.

Requires ``pip install torchdata`` (for ``--loader torchdata``, the default).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from fastdata.datasets import ShardAwareDistributedSampler, ShardDataset


def make_loader(kind: str, dataset: ShardDataset, sampler: Any, **kwargs: Any) -> Any:
    """A loader with ``state_dict()`` / ``load_state_dict()`` that count what was yielded."""
    if kind == "torchdata":
        from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: PLC0415  (optional)

        # fastdata batches pass DataLoader's default collate untouched
        return StatefulDataLoader(dataset, sampler=sampler, **kwargs)
    return dataset.loader(sampler=sampler, **kwargs)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards", help="a `fastdata preprocess` output folder")
    parser.add_argument("--loader", choices=("torchdata", "fastdata"), default="torchdata")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--stop-after", type=int, default=0, help="steps; then save and stop")
    parser.add_argument("--checkpoint", default="loader-state.pt")
    parser.add_argument("--resume", action="store_true", help="start from --checkpoint")
    parser.add_argument("--record", help="append the labels read to this file")
    args = parser.parse_args(argv)

    distributed = dist.is_available() and dist.is_initialized()
    world, rank = (dist.get_world_size(), dist.get_rank()) if distributed else (1, 0)
    dataset = ShardDataset(args.shards, fields=("image", "label"), num_threads=1)
    sampler = ShardAwareDistributedSampler(dataset, world, rank, seed=0)
    loader = make_loader(
        args.loader, dataset, sampler, batch_size=args.batch_size, num_workers=args.num_workers
    )
    checkpoint = Path(f"{args.checkpoint}.rank{rank}" if world > 1 else args.checkpoint)
    if args.resume:
        loader.load_state_dict(torch.load(checkpoint)["loader"])
    start_epoch = sampler.epoch  # the saved epoch after a resume

    steps = 0
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # the saved epoch: keeps the resumed position
        seen = 0
        for images, labels in loader:  # (B, 3, H, W) uint8, (B,) int64
            seen += len(images)  # a training step goes here
            if args.record:
                with open(args.record, "a") as file:
                    line = {"rank": rank, "epoch": epoch, "labels": labels.tolist()}
                    file.write(json.dumps(line) + "\n")
            steps += 1
            if steps == args.stop_after:
                torch.save({"loader": loader.state_dict()}, checkpoint)
                print(f"stopped in epoch {epoch} after {steps} steps; state in {checkpoint}")
                return
        print(f"epoch {epoch}: {seen} samples on rank {rank} of {world}")


if __name__ == "__main__":
    main()
