"""The CPU detection geometry (RandomIoUCrop, Letterbox) in the batch convention: images,
masks, boxes and their labels moved from one draw, checked on painted scenes with NumPy
(tests/detection_scenes.py)."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata import ops
from fastdata.transforms import (
    Compose,
    FieldBatch,
    Letterbox,
    RandomHorizontalFlip,
    RandomIoUCrop,
    Resize,
)
from tests.detection_scenes import (
    check_painted,
    kept_object_share,
    object_masks,
    painted_scenes,
)

SIZE = 96


def detection_batch(
    images: np.ndarray, boxes: list[np.ndarray], masks: np.ndarray | None = None
) -> FieldBatch:
    """Images, boxes and, as box labels, each box's index in its sample (its colour)."""
    values = {
        "image": images,
        "boxes": boxes,
        "labels": [np.arange(len(rows), dtype=np.int64) for rows in boxes],
    }
    roles = {"image": "image", "boxes": "boxes", "labels": "box_labels"}
    if masks is not None:
        values["mask"], roles["mask"] = masks, "mask"
    return FieldBatch(values, roles)


def cpu_detection(
    images: np.ndarray, boxes: list[np.ndarray], seed: int, masks: np.ndarray | None = None
) -> tuple[FieldBatch, np.ndarray]:
    """RandomIoUCrop + Resize((SIZE, SIZE)) + RandomHorizontalFlip, and the crops (from a
    twin crop of the same seed)."""
    count, height, width = images.shape[:3]
    pipeline = Compose(
        [RandomIoUCrop(seed=seed), Resize((SIZE, SIZE)), RandomHorizontalFlip(seed=seed + 1)]
    )
    moved = pipeline.apply_batch(detection_batch(images, boxes, masks))
    crops = RandomIoUCrop(seed=seed).crops(np.full(count, height), np.full(count, width), boxes)
    return moved, crops


def mapped_areas(boxes: np.ndarray, crop: np.ndarray) -> np.ndarray:
    """Box areas scaled from a crop to SIZE x SIZE."""
    sides = boxes[:, 2:] - boxes[:, :2]
    return sides[:, 0] * sides[:, 1] * SIZE * SIZE / (crop[2] * crop[3])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_painted_boxes_follow_their_colour_through_iou_crop_resize_and_flip(seed: int) -> None:
    images, boxes = painted_scenes(24, 120, 160, seed)
    moved, crops = cpu_detection(images, boxes, seed)
    out = np.asarray(moved["image"])
    judged = 0
    for k in range(len(images)):
        areas = mapped_areas(boxes[k], crops[k])
        ids = moved["labels"][k]
        judged += check_painted(out[k], moved["boxes"][k], ids, np.arange(len(boxes[k])), areas)
    assert judged >= 30


def test_kept_boxes_cover_95_percent_of_visible_object_pixels() -> None:
    masks, boxes = object_masks(64, 120, 160, seed=3)
    images = np.repeat(masks[..., None] * 200, 3, axis=-1)
    visible = covered = 0
    for seed in range(3):
        moved, _ = cpu_detection(images, boxes, seed, masks=masks)
        for mask, sample_boxes in zip(moved["mask"], moved["boxes"], strict=True):
            seen, inside = kept_object_share(mask, sample_boxes)
            visible, covered = visible + seen, covered + inside
    assert visible > 0 and covered / visible >= 0.95


def test_iou_crop_keeps_a_box_above_the_drawn_threshold() -> None:
    _images, boxes = painted_scenes(40, 120, 160, 5)
    crop = RandomIoUCrop(sampler_options=(0.3,), seed=4)
    crops = crop.crops(np.full(40, 120), np.full(40, 160), boxes)
    cropped = 0
    for rows, (top, left, height, width) in zip(boxes, crops, strict=True):
        if (height, width) == (120, 160):
            continue
        cropped += 1
        x1, y1 = np.maximum(rows[:, 0], left), np.maximum(rows[:, 1], top)
        x2, y2 = np.minimum(rows[:, 2], left + width), np.minimum(rows[:, 3], top + height)
        overlap = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
        areas = (rows[:, 2] - rows[:, 0]) * (rows[:, 3] - rows[:, 1])
        assert (overlap / (areas + width * height - overlap)).max() >= 0.3
    assert cropped >= 10


def test_iou_crop_cuts_images_and_masks_alike_and_declares_itself() -> None:
    images, _boxes = painted_scenes(6, 60, 80, 7)
    crop = RandomIoUCrop(seed=1)
    assert crop.op == ops.RandomIoUCrop() and not crop.in_place and not crop.keeps_size
    assert crop.output_size((60, 80)) is None
    out, masks = crop(images, masks=images[..., 0].copy())
    assert isinstance(out, list) and len(out) == 6
    for image, mask in zip(out, masks, strict=True):
        np.testing.assert_array_equal(image[..., 0], mask)
    again = RandomIoUCrop.from_op(ops.RandomIoUCrop(), seed=1)(images)
    assert [a.shape for a in again] == [a.shape for a in out]


def test_iou_crop_with_a_size_resizes_in_the_same_pass() -> None:
    images, boxes = painted_scenes(12, 120, 160, 21)
    masks = images[..., 2].copy()
    fused = RandomIoUCrop(seed=8, size=SIZE)
    assert fused.output_size((120, 160)) == (SIZE, SIZE) and fused.writes_out
    one_pass = fused.apply_batch(detection_batch(images, boxes, masks))
    two_steps = Compose([RandomIoUCrop(seed=8), Resize((SIZE, SIZE))]).apply_batch(
        detection_batch(images, boxes, masks)
    )
    for name in ("image", "mask"):
        np.testing.assert_array_equal(one_pass[name], two_steps[name])
    for name in ("boxes", "labels"):
        for ours, theirs in zip(one_pass[name], two_steps[name], strict=True):
            np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_letterbox_pads_with_fill_and_boxes_follow() -> None:
    images, boxes = painted_scenes(8, 60, 120, 9)
    moved = Letterbox(SIZE).apply_batch(detection_batch(images, boxes, images[..., 1].copy()))
    out, masks = np.asarray(moved["image"]), np.asarray(moved["mask"])
    assert out.shape == (8, SIZE, SIZE, 3)
    # 60x120 -> 48x96 at top 24: bands of 114 above and below, masks padded with 0
    assert (out[:, :24] == 114).all() and (out[:, 72:] == 114).all()
    assert (masks[:, :24] == 0).all() and (masks[:, 72:] == 0).all()
    for k in range(8):
        np.testing.assert_array_equal(moved["labels"][k], np.arange(len(boxes[k])))
        np.testing.assert_allclose(moved["boxes"][k], boxes[k] * 0.8 + [0, 24, 0, 24], atol=1e-4)
        ids = np.arange(len(boxes[k]))
        check_painted(out[k], moved["boxes"][k], ids, ids)
    with pytest.raises(ValueError, match="fill"):
        Letterbox(SIZE, fill=(1, 2)).apply_all(images, [], None, 1)
