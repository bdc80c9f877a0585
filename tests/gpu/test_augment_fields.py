"""Device augmentations on a batch of fields with roles (CPU device): boxes follow the same
draws as the pixels, and equal what the CPU transforms give from the same seed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata.gpu import DeviceRandomHorizontalFlip, DeviceRandomResizedCrop, Normalize
from fastdata.transforms import FieldBatch, RandomHorizontalFlip, RandomResizedCrop


def detection_batch(count: int = 6) -> dict[str, object]:
    rng = np.random.default_rng(0)
    images = torch.from_numpy(rng.integers(0, 256, (count, 3, 40, 50), dtype=np.uint8))
    boxes, labels = [], []
    for k in range(count):
        n = k % 3
        xy = rng.uniform(0, 30, (n, 2))
        boxes.append(torch.tensor(np.concatenate([xy, xy + 10], axis=1), dtype=torch.float32))
        labels.append(torch.arange(n, dtype=torch.int64))
    return {"image": images, "boxes": boxes, "labels": labels}


def test_flip_moves_boxes_by_hand() -> None:
    batch = detection_batch()
    moved = DeviceRandomHorizontalFlip(p=1.0)(batch)
    assert isinstance(moved, FieldBatch)
    assert torch.equal(moved["image"], batch["image"].flip(-1))  # type: ignore[union-attr]
    for before, after in zip(batch["boxes"], moved["boxes"], strict=True):  # type: ignore[call-overload]
        expected = before.numpy()[:, [2, 1, 0, 3]] * [-1, 1, -1, 1] + [50, 0, 50, 0]
        np.testing.assert_allclose(after.numpy(), expected, rtol=1e-6)
        assert after.dtype == torch.float32


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_device_and_cpu_crops_give_the_same_boxes(seed: int) -> None:
    batch = detection_batch()
    device = DeviceRandomResizedCrop(24, scale=(0.3, 1.0), seed=seed)(batch)
    cpu_batch = FieldBatch(
        {
            "image": batch["image"].permute(0, 2, 3, 1).contiguous().numpy(),  # type: ignore[union-attr]
            "boxes": [b.numpy() for b in batch["boxes"]],  # type: ignore[union-attr]
            "labels": [b.numpy() for b in batch["labels"]],  # type: ignore[union-attr]
        },
        {"image": "image", "boxes": "boxes", "labels": "box_labels"},
    )
    cpu = RandomResizedCrop(24, scale=(0.3, 1.0), seed=seed)(cpu_batch)
    assert tuple(device["image"].shape) == (6, 3, 24, 24)
    for got, want, got_labels, want_labels in zip(
        device["boxes"], cpu["boxes"], device["labels"], cpu["labels"], strict=True
    ):
        np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
        assert got_labels.tolist() == want_labels.tolist()


def test_flip_moves_masks_by_role_and_refuses_two_images() -> None:
    batch = detection_batch()
    masks = torch.arange(6 * 40 * 50, dtype=torch.int64).reshape(6, 40, 50).to(torch.uint8)
    moved = DeviceRandomHorizontalFlip(p=1.0, seed=0)({**batch, "mask": masks})
    assert torch.equal(moved["mask"], masks.flip(-1))
    with pytest.raises(ValueError, match="exactly one image field"):
        DeviceRandomHorizontalFlip()({"image": batch["image"], "image_2": batch["image"]})
    with pytest.raises(ValueError, match="exactly one image field"):
        DeviceRandomHorizontalFlip()({"x": batch["image"]}, roles={"x": "other"})
    flipped = RandomHorizontalFlip(p=1.0)(batch["image"].permute(0, 2, 3, 1).numpy().copy())  # type: ignore[union-attr]
    assert flipped.shape == (6, 40, 50, 3)


def test_normalize_takes_a_batch_of_fields() -> None:
    batch = detection_batch()
    out = Normalize([10.0, 20.0, 30.0], [2.0, 4.0, 5.0])(batch)
    images = batch["image"].numpy().astype(np.float32)  # type: ignore[union-attr]
    expected = (images - np.array([10, 20, 30]).reshape(1, 3, 1, 1)) / np.array([2, 4, 5]).reshape(
        1, 3, 1, 1
    )
    np.testing.assert_allclose(out["image"].numpy(), expected, rtol=1e-5, atol=1e-4)
    assert out["boxes"] is batch["boxes"]
