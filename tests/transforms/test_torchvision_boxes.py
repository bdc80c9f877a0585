"""Where torchvision imports: the boxes fastdata's detection geometry gives equal, within
1 px, what ``torchvision.transforms.v2``'s functional ops make of ``tv_tensors.BoundingBoxes``
under the same crops and flips (skipped without torchvision; the NumPy painted-scene tests
in test_detection.py always run)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata.transforms import FieldBatch, Letterbox, RandomIoUCrop
from tests.detection_scenes import object_masks

tv_tensors = pytest.importorskip(
    "torchvision.tv_tensors", reason="torchvision does not import here (see shared/tools)"
)
v2 = pytest.importorskip("torchvision.transforms.v2.functional")

SIZE = 96


def _torchvision_boxes(
    boxes: np.ndarray, canvas: tuple[int, int], crop: np.ndarray, flip: bool
) -> np.ndarray:
    top, left, height, width = (int(value) for value in crop)
    wrapped = tv_tensors.BoundingBoxes(torch.from_numpy(boxes), format="XYXY", canvas_size=canvas)
    moved = v2.crop(wrapped, top, left, height, width)
    moved = v2.resize(moved, [SIZE, SIZE])
    if flip:
        moved = v2.horizontal_flip(moved)
    return moved.as_subclass(torch.Tensor).numpy()


def _targets(boxes: list[np.ndarray]) -> FieldBatch:
    labels = [np.arange(len(rows)) for rows in boxes]
    return FieldBatch(
        {"boxes": boxes, "labels": labels}, {"boxes": "boxes", "labels": "box_labels"}
    )


def test_iou_crop_resize_flip_boxes_match_torchvision() -> None:
    _, boxes = object_masks(64, 120, 160, seed=4)
    count = len(boxes)
    transform = RandomIoUCrop(seed=2, size=SIZE)
    crops = RandomIoUCrop(seed=2).crops(np.full(count, 120), np.full(count, 160), boxes)
    images = np.zeros((count, 120, 160, 3), np.uint8)
    batch = _targets(boxes)
    batch.values["image"], batch.roles["image"] = images, "image"
    moved = transform.apply_batch(batch)
    flips = np.random.default_rng(0).random(count) < 0.5
    compared = 0
    for k in range(count):
        ours = moved["boxes"][k]
        if flips[k]:
            ours = np.stack([SIZE - ours[:, 2], ours[:, 1], SIZE - ours[:, 0], ours[:, 3]], 1)
        theirs = _torchvision_boxes(boxes[k], (120, 160), crops[k], bool(flips[k]))
        np.testing.assert_allclose(ours, theirs[moved["labels"][k]], atol=1.0)
        compared += len(ours)
    assert compared >= 100


def test_letterbox_boxes_match_torchvision_resize_and_pad() -> None:
    _, boxes = object_masks(16, 60, 130, seed=5)
    letterbox = Letterbox(SIZE)
    placements, _ = letterbox.op.layout(np.full(16, 60), np.full(16, 130))
    batch = _targets(boxes)
    batch.values["image"], batch.roles["image"] = np.zeros((16, 60, 130, 3), np.uint8), "image"
    moved = letterbox.apply_batch(batch)
    for k in range(16):
        top, left, height, width = placements[k].tolist()
        wrapped = tv_tensors.BoundingBoxes(
            torch.from_numpy(boxes[k]), format="XYXY", canvas_size=(60, 130)
        )
        resized = v2.resize(wrapped, [height, width])
        padded = v2.pad(resized, [left, top, SIZE - width - left, SIZE - height - top])
        theirs = padded.as_subclass(torch.Tensor).numpy()
        np.testing.assert_allclose(moved["boxes"][k], theirs[moved["labels"][k]], atol=1.0)
