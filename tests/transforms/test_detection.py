"""The CPU detection geometry (RandomIoUCrop, Letterbox): images, masks and boxes moved
from one draw, checked on painted scenes with NumPy (tests/detection_scenes.py)."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata import ops
from fastdata.transforms import (
    Geometry,
    Letterbox,
    RandomHorizontalFlip,
    RandomIoUCrop,
    Resize,
    move_boxes,
)
from tests.detection_scenes import (
    check_painted,
    kept_object_share,
    object_masks,
    painted_scenes,
)

SIZE = 96


def cpu_detection(
    images: np.ndarray, masks: list[np.ndarray], boxes: list[np.ndarray], seed: int
) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray], list[np.ndarray], np.ndarray]:
    """RandomIoUCrop + Resize((SIZE, SIZE)) + RandomHorizontalFlip on the CPU executors;
    boxes through the crop's geometry, the flips read from a twin flip of the same seed."""
    count, height, width = images.shape[:3]
    crop = RandomIoUCrop(seed=seed)
    geometry = crop.geometry(np.full(count, height), np.full(count, width), boxes)
    cut, cut_masks = crop.cut(images, masks, geometry, None, 1)
    resized, resized_masks = Resize((SIZE, SIZE)).apply_all(cut, cut_masks, None, 1)
    flipped, flipped_masks = RandomHorizontalFlip(seed=seed + 1).apply_all(
        resized, resized_masks, None, 1
    )
    twin = RandomHorizontalFlip(seed=seed + 1)
    flips = twin.op.flips(twin.uniform(count, 1))
    sized = Geometry(geometry.crops, np.full((count, 2), SIZE))
    kept, keeps = move_boxes(boxes, sized)
    for k in np.flatnonzero(flips):
        kept[k] = np.stack(
            [SIZE - kept[k][:, 2], kept[k][:, 1], SIZE - kept[k][:, 0], kept[k][:, 3]], 1
        )
    return np.asarray(flipped), list(flipped_masks), kept, keeps, geometry.crops


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_painted_boxes_follow_their_colour_through_iou_crop_resize_and_flip(seed: int) -> None:
    images, boxes = painted_scenes(24, 120, 160, seed)
    out, _, kept, keeps, crops = cpu_detection(images, [], boxes, seed)
    judged = 0
    for k in range(len(images)):
        ids = np.flatnonzero(keeps[k])
        scale = SIZE * SIZE / (crops[k, 2] * crops[k, 3])
        areas = (boxes[k][:, 2] - boxes[k][:, 0]) * (boxes[k][:, 3] - boxes[k][:, 1]) * scale
        judged += check_painted(out[k], kept[k], ids, np.arange(len(boxes[k])), areas)
    assert judged >= 30


def test_kept_boxes_cover_95_percent_of_visible_object_pixels() -> None:
    masks, boxes = object_masks(64, 120, 160, seed=3)
    images = np.repeat(masks[..., None] * 200, 3, axis=-1)
    visible = covered = 0
    for seed in range(3):
        _, moved_masks, kept, _, _ = cpu_detection(images, [masks], boxes, seed)
        for mask, sample_boxes in zip(moved_masks[0], kept, strict=True):
            seen, inside = kept_object_share(mask, sample_boxes)
            visible, covered = visible + seen, covered + inside
    assert visible > 0 and covered / visible >= 0.95


def test_iou_crop_keeps_a_box_above_the_drawn_threshold() -> None:
    _images, boxes = painted_scenes(40, 120, 160, 5)
    crop = RandomIoUCrop(sampler_options=(0.3,), seed=4)
    geometry = crop.geometry(np.full(40, 120), np.full(40, 160), boxes)
    cropped = 0
    for rows, (top, left, height, width) in zip(boxes, geometry.crops, strict=True):
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
    # same seed, same crops; from_op gives the same executor
    again = RandomIoUCrop.from_op(ops.RandomIoUCrop(), seed=1)(images)
    assert [a.shape for a in again] == [a.shape for a in out]


def test_letterbox_pads_with_fill_and_boxes_follow() -> None:
    images, boxes = painted_scenes(8, 60, 120, 9)
    letterbox = Letterbox(SIZE)
    out, (masks,) = letterbox.apply_all(images, [images[..., 1].copy()], None, 1)
    assert out.shape == (8, SIZE, SIZE, 3)
    # 60x120 -> 48x96 at top 24: bands of 114 above and below, masks padded with 0
    assert (out[:, :24] == 114).all() and (out[:, 72:] == 114).all()
    assert (masks[:, :24] == 0).all() and (masks[:, 72:] == 0).all()
    kept, keeps = move_boxes(boxes, letterbox.geometry(np.full(8, 60), np.full(8, 120)))
    for k in range(8):
        assert keeps[k].all()  # nothing leaves a letterbox
        np.testing.assert_allclose(kept[k], boxes[k] * 0.8 + [0, 24, 0, 24], atol=1e-4)
        check_painted(out[k], kept[k], np.arange(len(kept[k])), np.arange(len(kept[k])))
    with pytest.raises(ValueError, match="fill"):
        Letterbox(SIZE, fill=(1, 2)).apply_all(images, [], None, 1)


def test_iou_crop_with_a_size_resizes_in_the_same_pass() -> None:
    images, boxes = painted_scenes(12, 120, 160, 21)
    masks = images[..., 2].copy()
    fused = RandomIoUCrop(seed=8, size=SIZE)
    assert fused.output_size((120, 160)) == (SIZE, SIZE) and fused.writes_out
    out, (out_masks,), geometry = fused.apply_boxes(images, [masks], boxes, None, 1)
    cut, (cut_masks,), cut_geometry = RandomIoUCrop(seed=8).apply_boxes(
        images, [masks], boxes, None, 1
    )
    np.testing.assert_array_equal(geometry.crops, cut_geometry.crops)
    resized, (resized_masks,) = Resize((SIZE, SIZE)).apply_all(cut, [cut_masks], None, 1)
    np.testing.assert_array_equal(out, resized)
    np.testing.assert_array_equal(out_masks, resized_masks)
    assert (geometry.out_sizes == SIZE).all()
    assert (cut_geometry.out_sizes == cut_geometry.crops[:, 2:]).all()
