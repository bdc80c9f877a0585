"""The timm recipe written as the docs show it: RAMDataset / ShardDataset of JPEG files
with RandomResizedCrop + flip + RandAugment + RandomErasing on the dataset's threads and
in DataLoader workers, then MixUp/CutMix on the collated batch, on the CPU and through
the device modules."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from fastdata.datasets import RAMDataset, passthrough_collate
from fastdata.gpu import DeviceRandAugment, DeviceRandomErasing
from fastdata.transforms import (
    ColorJitter,
    Compose,
    CutMix,
    MixUp,
    RandAugment,
    RandomChoice,
    RandomErasing,
    RandomHorizontalFlip,
    RandomResizedCrop,
    TrivialAugmentWide,
)


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[int]]:
    root = tmp_path_factory.mktemp("recipe")
    rng = np.random.default_rng(0)
    paths, labels = [], []
    for index in range(24):
        height, width = int(rng.integers(40, 90)), int(rng.integers(40, 90))
        yy, xx = np.mgrid[0:height, 0:width]
        image = np.stack([xx * 3, yy * 3, (xx + yy) * 2], axis=-1) + rng.normal(0, 20, (1, 1, 3))
        path = root / f"{index:03d}.jpg"
        cv2.imwrite(str(path), np.clip(image, 0, 255).astype(np.uint8))
        paths.append(path)
        labels.append(index % 10)
    return paths, labels


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_timm_recipe_as_documented(
    jpegs: tuple[list[Path], list[int]], num_workers: int
) -> None:
    paths, labels = jpegs
    tf = Compose(
        [
            RandomResizedCrop(32),
            RandomHorizontalFlip(),
            RandAugment(num_ops=2, magnitude=9, magnitude_std=0.5),
            RandomErasing(p=0.25),
        ]
    )
    ds = RAMDataset(paths, labels, transform=tf, show_progress=False)
    loader = DataLoader(
        ds, batch_size=8, num_workers=num_workers, collate_fn=passthrough_collate, shuffle=True
    )
    mix = RandomChoice([MixUp(alpha=0.8, num_classes=10), CutMix(alpha=1.0, num_classes=10)])
    seen = 0
    for images, batch_labels in loader:
        assert images.shape == (8, 3, 32, 32) and images.dtype == torch.uint8
        mixed, soft_labels = mix(images, batch_labels)
        assert mixed.shape == images.shape and soft_labels.shape == (8, 10)
        assert torch.allclose(soft_labels.sum(dim=1), torch.ones(8))
        seen += len(images)
    assert seen == 24  # every sample, none skipped


def test_the_same_ops_as_device_modules(jpegs: tuple[list[Path], list[int]]) -> None:
    paths, labels = jpegs
    augment = RandAugment(num_ops=2, magnitude=9, magnitude_std=0.5, seed=1)
    erase = RandomErasing(p=0.25, seed=2)
    ds = RAMDataset(
        paths, labels, transform=Compose([RandomResizedCrop(32, seed=0)]), show_progress=False
    )
    images, _ = ds.__getitems__(list(range(8)))
    on_cpu = Compose([augment, erase])(images.clone())
    device_augment = DeviceRandAugment.from_op(augment.op, seed=1)
    device_erase = DeviceRandomErasing.from_op(erase.op, seed=2)
    on_device = device_erase(device_augment(images))
    assert (on_device.int() - on_cpu.int()).abs().max() <= 1
    other = Compose([TrivialAugmentWide(), ColorJitter(0.4, 0.4, 0.4)])(images.clone())
    assert other.shape == images.shape
