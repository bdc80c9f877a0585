"""Where torchvision imports: the boxes fastdata's detection geometry gives equal, within
1 px, what ``torchvision.transforms.v2``'s functional ops make of ``tv_tensors.BoundingBoxes``
under the same crops and flips (skipped without torchvision; the NumPy painted-scene tests
in test_detection.py always run)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata.transforms import Geometry, Letterbox, RandomIoUCrop, move_boxes
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


def test_iou_crop_resize_flip_boxes_match_torchvision() -> None:
    _, boxes = object_masks(64, 120, 160, seed=4)
    count = len(boxes)
    geometry = RandomIoUCrop(seed=2).geometry(np.full(count, 120), np.full(count, 160), boxes)
    flips = np.random.default_rng(0).random(count) < 0.5
    kept, keeps = move_boxes(boxes, Geometry(geometry.crops, np.full((count, 2), SIZE)))
    compared = 0
    for k in range(count):
        ours = kept[k]
        if flips[k]:
            ours = np.stack([SIZE - ours[:, 2], ours[:, 1], SIZE - ours[:, 0], ours[:, 3]], 1)
        theirs = _torchvision_boxes(boxes[k], (120, 160), geometry.crops[k], bool(flips[k]))
        np.testing.assert_allclose(ours, theirs[keeps[k]], atol=1.0)
        compared += len(ours)
    assert compared >= 100


def test_letterbox_boxes_match_torchvision_resize_and_pad() -> None:
    _, boxes = object_masks(16, 60, 130, seed=5)
    letterbox = Letterbox(SIZE)
    placements, _ = letterbox.op.layout(np.full(16, 60), np.full(16, 130))
    kept, _ = move_boxes(boxes, letterbox.geometry(np.full(16, 60), np.full(16, 130)))
    for k in range(16):
        top, left, height, width = placements[k].tolist()
        wrapped = tv_tensors.BoundingBoxes(
            torch.from_numpy(boxes[k]), format="XYXY", canvas_size=(60, 130)
        )
        moved = v2.resize(wrapped, [height, width])
        moved = v2.pad(moved, [left, top, SIZE - width - left, SIZE - height - top])
        np.testing.assert_allclose(kept[k], moved.as_subclass(torch.Tensor).numpy(), atol=1.0)
