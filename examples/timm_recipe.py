"""Train with timm's ImageNet augmentation recipe on a fastdata shard set.

RandomResizedCrop + flip + RandAugment (``rand-m9-mstd0.5``) + RandomErasing 0.25 run on
uint8 batches in the DataLoader's workers (``--augment-on cpu``) or on the device after
the copy (``--augment-on device``); MixUp/CutMix with soft labels mix each collated batch
and normalize it in the same call (``mix(images, labels, normalize=normalize)``); the loss
is cross-entropy against the soft labels (timm's ``SoftTargetCrossEntropy``).

Make a shard set first, e.g. ``python tools/make_sample_dataset.py sample --num-images 400``
then ``fastdata preprocess sample out/ --size 64``. Then::

    python examples/timm_recipe.py out/ --image-size 56 --epochs 2
    python examples/timm_recipe.py out/ --augment-on device    # uses CUDA when there is one
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import torch
from torch import nn

from fastdata.datasets import ShardDataset
from fastdata.gpu import (
    DeviceCutMix,
    DeviceMixUp,
    DeviceRandAugment,
    DeviceRandomErasing,
    Normalize,
    to_device,
)
from fastdata.transforms import (
    Compose,
    CutMix,
    MixUp,
    RandAugment,
    RandomChoice,
    RandomErasing,
    RandomHorizontalFlip,
    RandomResizedCrop,
)


def main(argv: Sequence[str] | None = None) -> list[float]:
    """Train; returns the mean loss of each epoch."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shards", help="a `fastdata preprocess` output folder")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=56)
    parser.add_argument("--augment-on", choices=("cpu", "device"), default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    randaugment = RandAugment(num_ops=2, magnitude=9, magnitude_std=0.5)
    erasing = RandomErasing(p=0.25)
    steps = [RandomResizedCrop(args.image_size), RandomHorizontalFlip()]
    if args.augment_on == "cpu":
        steps += [randaugment, erasing]  # in the workers, on uint8 batches
    dataset = ShardDataset(args.shards, fields=("image", "label"), transform=Compose(steps))
    num_classes = len(dataset.class_names)
    loader = dataset.loader(
        batch_size=args.batch_size, shuffle=True, num_workers=args.num_workers, drop_last=True
    )
    on_device = nn.Sequential(
        DeviceRandAugment.from_op(randaugment.op), DeviceRandomErasing.from_op(erasing.op)
    )
    # the transforms mix batches wherever they are; the device modules are the same kernel
    mixup, cutmix = (DeviceMixUp, DeviceCutMix) if args.augment_on == "device" else (MixUp, CutMix)
    mix = RandomChoice(
        [mixup(alpha=0.8, num_classes=num_classes), cutmix(alpha=1.0, num_classes=num_classes)]
    )
    normalize = Normalize(mean=[124, 116, 104], std=[58, 57, 57]).to(device)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, num_classes),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    losses = []
    for epoch in range(args.epochs):
        total, batches = 0.0, 0
        for batch, labels in to_device(loader, device):  # (B, 3, S, S) uint8, (B,) int64
            if args.augment_on == "device":
                batch = on_device(batch)  # noqa: PLW2901 - uint8 in, uint8 out
            # mixed and normalized in one call: float32 images, (B, classes) soft labels
            images, soft_labels = mix(batch, labels, normalize=normalize)
            logits = model(images)
            loss = torch.sum(-soft_labels * torch.log_softmax(logits, dim=1), dim=1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
        losses.append(total / max(batches, 1))
        print(f"epoch {epoch}: {batches} batches, mean loss {losses[-1]:.4f}")
    return losses


if __name__ == "__main__":
    main()
