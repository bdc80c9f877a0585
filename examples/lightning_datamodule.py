"""Train with PyTorch Lightning on a fastdata shard set (one process or DDP).

Make a shard set first, e.g. ``python tools/make_sample_dataset.py sample --num-images 400``
then ``fastdata preprocess sample out/ --size 64``. Then::

    python examples/lightning_datamodule.py out/                             # one process
    python examples/lightning_datamodule.py out/ --devices 2 --strategy ddp  # 2 processes (gloo)
    python examples/lightning_datamodule.py out/ --max-steps 5 --checkpoint-every 3  # stop, then
    python examples/lightning_datamodule.py out/ --resume checkpoints/step=3.ckpt    # resume

What makes it correct:

- ``ShardAwareDistributedSampler`` is a ``DistributedSampler``, so Lightning's default
  ``use_distributed_sampler=True`` keeps it as it is (it does not add a second sharding).
- ``dataset.loader(...)`` is a ``ResumableDataLoader``: Lightning saves its
  ``state_dict()`` in every checkpoint, and a mid-epoch checkpoint resumes the epoch where
  it stopped (no sample repeated or skipped, worker processes or not).
- ``len(sampler)`` is the epoch's per-rank count, so later epochs are full after a resume.
- ``WholeEpochAfterEpochStartCheckpoint``: Lightning (2.x) writes the finished epoch's batch
  counters into a checkpoint saved at the start of the next epoch (``on_train_epoch_start``),
  and a run resumed from it ends that epoch after one batch, whatever the loader; the
  callback clears them when such a checkpoint is loaded, so the epoch is read whole.

Requires ``pip install lightning``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L  # noqa: N812  (Lightning's own spelling)
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from fastdata.datasets import ResumableDataLoader, ShardAwareDistributedSampler, ShardDataset


class ShardDataModule(L.LightningDataModule):
    """Training batches ``(B, 3, H, W) uint8, (B,) int64`` from a shard set."""

    def __init__(self, path: str, batch_size: int = 32, num_workers: int = 2) -> None:
        super().__init__()
        self.path = path
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.num_classes = len(ShardDataset(path, fields=("label",)).class_names)

    def setup(self, stage: str) -> None:
        self.train_set = ShardDataset(self.path, fields=("image", "label"), num_threads=1)

    def train_dataloader(self) -> ResumableDataLoader:
        trainer = self.trainer
        assert trainer is not None  # Lightning calls this with the trainer attached
        sampler = ShardAwareDistributedSampler(
            self.train_set, num_replicas=trainer.world_size, rank=trainer.global_rank, seed=0
        )
        return self.train_set.loader(
            batch_size=self.batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )


class WholeEpochAfterEpochStartCheckpoint(L.Callback):
    """Resume a checkpoint saved at the start of an epoch with that epoch whole.

    Saved in ``on_train_epoch_start`` (before the epoch's first batch), a checkpoint holds
    the batch counters of the epoch before, complete; Lightning resumed from it counts them
    as batches of the new epoch and ends it after one batch (the loader's state, which
    says that nothing of the new epoch was consumed, is right). On loading such a
    checkpoint this sets those counters to an epoch not started.
    """

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        fit = checkpoint.get("loops", {}).get("fit_loop")
        if not fit or "epoch_progress" not in fit or "epoch_loop.batch_progress" not in fit:
            return
        epochs = fit["epoch_progress"]["total"]
        # Lightning's own test for "restarted on epoch start": the epoch made ready, not started
        at_epoch_start = (
            epochs["started"] == epochs["ready"] - 1
            and epochs["processed"] == epochs["started"]
            and epochs["completed"] == epochs["processed"]
        )
        if at_epoch_start:
            batches = fit["epoch_loop.batch_progress"]
            batches["current"] = dict.fromkeys(batches["current"], 0)
            batches["is_last_batch"] = False


class TinyClassifier(L.LightningModule):
    """A linear classifier on 8x8-pooled images: just enough to train on CPU."""

    def __init__(self, num_classes: int, record: str | None = None) -> None:
        super().__init__()
        self.head = nn.Linear(3 * 8 * 8, num_classes)
        self.record = record
        self.seen = 0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        x = nn.functional.adaptive_avg_pool2d(images.float() / 255, 8).flatten(1)
        loss = nn.functional.cross_entropy(self.head(x), labels)
        self.seen += len(labels)
        if self.record:  # what this rank read, to check it: one JSON line per batch
            line = {
                "rank": self.global_rank,
                "epoch": self.current_epoch,
                "labels": labels.tolist(),
            }
            with open(self.record, "a") as file:
                file.write(json.dumps(line) + "\n")
        return loss

    def on_train_epoch_end(self) -> None:
        seen = torch.tensor([self.seen], dtype=torch.int64)
        gathered = self.all_gather(seen)
        assert isinstance(gathered, torch.Tensor)
        total = int(gathered.sum())
        if self.global_rank == 0:
            print(
                f"epoch {self.current_epoch}: {total} samples over {self.trainer.world_size} ranks"
            )
        self.seen = 0

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards", help="a `fastdata preprocess` output folder")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=-1, help="stop after this many steps")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--strategy", default="auto", help="e.g. ddp")
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--checkpoint-dir", default="checkpoints")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps; 0: never")
    parser.add_argument("--resume", help="a checkpoint to resume from (mid-epoch is fine)")
    parser.add_argument("--record", help="append the labels each rank read to this file")
    args = parser.parse_args(argv)

    data = ShardDataModule(args.shards, args.batch_size, args.num_workers)
    model = TinyClassifier(data.num_classes, record=args.record)
    callbacks: list[L.Callback] = [WholeEpochAfterEpochStartCheckpoint()]
    if args.checkpoint_every:
        callbacks.append(
            ModelCheckpoint(
                dirpath=Path(args.checkpoint_dir),
                filename="{step}",
                every_n_train_steps=args.checkpoint_every,
                save_top_k=-1,
            )
        )
    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=args.strategy,
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        callbacks=callbacks,
        enable_checkpointing=bool(args.checkpoint_every),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=data, ckpt_path=args.resume)


if __name__ == "__main__":
    main()
