"""Train with Hugging Face Accelerate on a fastdata shard set (one process or several).

Make a shard set first, e.g. ``python tools/make_sample_dataset.py sample --num-images 400``
then ``fastdata preprocess sample out/ --size 64``. Then::

    python examples/accelerate_training.py out/                                   # one process
    accelerate launch --cpu --num_processes 2 examples/accelerate_training.py out/  # two
    torchrun --nproc-per-node 2 examples/accelerate_training.py out/              # also two

What makes it correct: ``accelerator.prepare`` gets the model and the optimizer, not the
DataLoader. ``prepare(dataloader)`` would shard the batches a second time (each process
would see half of its share); ``ShardAwareDistributedSampler`` already gives each process
its share, reading mostly its own shards, and refuses to be sharded again. Batches are
moved to ``accelerator.device`` by hand. The loader's ``state_dict()`` (a
``ResumableDataLoader``) is registered for ``accelerator.save_state`` /
``load_state``, which resume mid-epoch exactly.

Requires ``pip install accelerate``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

import torch
from accelerate import Accelerator
from torch import nn

from fastdata.datasets import ShardAwareDistributedSampler, ShardDataset


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards", help="a `fastdata preprocess` output folder")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--stop-after", type=int, default=0, help="steps; then save the state")
    parser.add_argument("--state-dir", default="accelerate-state")
    parser.add_argument("--resume", action="store_true", help="load the state from --state-dir")
    parser.add_argument("--record", help="append the labels each process read to this file")
    args = parser.parse_args(argv)

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    dataset = ShardDataset(args.shards, fields=("image", "label"), num_threads=1)
    sampler = ShardAwareDistributedSampler(
        dataset, accelerator.num_processes, accelerator.process_index, seed=0
    )
    loader = dataset.loader(
        batch_size=args.batch_size, sampler=sampler, num_workers=args.num_workers
    )
    model = nn.Linear(3 * 8 * 8, len(dataset.class_names))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = accelerator.prepare(model, optimizer)  # not the loader
    accelerator.register_for_checkpointing(loader)  # saved by save_state, per process
    if args.resume:
        accelerator.load_state(args.state_dir)
    start_epoch = sampler.epoch

    steps = 0
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # keeps a resumed epoch's position
        seen = torch.zeros(1, device=accelerator.device)
        for batch_images, batch_labels in loader:  # (B, 3, H, W) uint8, (B,) int64
            images = batch_images.to(accelerator.device, non_blocking=True)
            labels = batch_labels.to(accelerator.device, non_blocking=True)
            x = nn.functional.adaptive_avg_pool2d(images.float() / 255, 8).flatten(1)
            loss = nn.functional.cross_entropy(model(x), labels)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            seen += len(labels)
            if args.record:
                line = {"rank": accelerator.process_index, "epoch": epoch}
                with open(args.record, "a") as file:
                    file.write(json.dumps({**line, "labels": labels.tolist()}) + "\n")
            steps += 1
            if steps == args.stop_after:
                accelerator.save_state(args.state_dir)
                accelerator.print(f"stopped after {steps} steps; state in {args.state_dir}")
                return
        total = int(accelerator.reduce(seen, reduction="sum").item())
        accelerator.print(
            f"epoch {epoch}: {total} samples over {accelerator.num_processes} processes"
        )
    accelerator.end_training()


if __name__ == "__main__":
    main()
