"""Per-batch uint8 transforms, pixel-exact against NumPy (and OpenCV for resizes)."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import cv2
import numpy as np
import pytest
import torch

from fastdata._images import stack_images
from fastdata._resize import resize_image
from fastdata.preprocess._transforms import resize_to
from fastdata.transforms import (
    CenterCrop,
    Compose,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)


@pytest.fixture
def batch() -> np.ndarray:
    return np.random.default_rng(1).integers(0, 256, (6, 20, 16, 3), dtype=np.uint8)


def test_center_crop_matches_numpy(batch: np.ndarray) -> None:
    out = CenterCrop((10, 8))(batch.copy())
    np.testing.assert_array_equal(out, batch[:, 5:15, 4:12])
    listed = CenterCrop(4)([batch[0], batch[1][:18]])
    np.testing.assert_array_equal(listed, np.stack([batch[0][8:12, 6:10], batch[1][7:11, 6:10]]))


def test_flip_matches_numpy(batch: np.ndarray) -> None:
    np.testing.assert_array_equal(RandomHorizontalFlip(p=1.0)(batch.copy()), batch[:, :, ::-1])
    np.testing.assert_array_equal(RandomHorizontalFlip(p=0.0)(batch.copy()), batch)
    flipped = RandomHorizontalFlip(seed=0)(batch.copy())
    mirrored = [np.array_equal(f, b[:, ::-1]) for f, b in zip(flipped, batch, strict=True)]
    kept = [np.array_equal(f, b) for f, b in zip(flipped, batch, strict=True)]
    assert all(m or k for m, k in zip(mirrored, kept, strict=True)) and any(mirrored) and any(kept)


def test_full_area_crop_is_a_plain_resize(batch: np.ndarray) -> None:
    square = batch[:, :16, :16]
    out = RandomResizedCrop(8, scale=(1.0, 1.0), ratio=(1.0, 1.0))(square)
    expected = np.stack(
        [cv2.resize(image, (8, 8), interpolation=cv2.INTER_LINEAR) for image in square]
    )
    np.testing.assert_array_equal(out, expected)


def test_random_resized_crop_boxes_fit_and_are_seeded(batch: np.ndarray) -> None:
    crop = RandomResizedCrop(8, seed=3)
    heights = np.array([20, 5, 300, 7])
    widths = np.array([16, 90, 30, 7])
    boxes = crop.boxes(heights, widths)
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (h > 0).all() and (w > 0).all()
    assert (top + h <= heights).all() and (left + w <= widths).all()
    again = RandomResizedCrop(8, seed=3).boxes(heights, widths)
    np.testing.assert_array_equal(boxes, again)
    pool = ThreadPoolExecutor(2)
    out = RandomResizedCrop(8, seed=3)(batch, pool, 3)
    np.testing.assert_array_equal(out, RandomResizedCrop(8, seed=3)(batch))
    assert out.shape == (6, 8, 8, 3)


def test_tensor_batches_stay_tensors(batch: np.ndarray) -> None:
    tensor = torch.from_numpy(batch).permute(0, 3, 1, 2).contiguous()
    out = Compose([Resize((10, 8)), CenterCrop(6), RandomHorizontalFlip(p=1.0)])(tensor)
    assert isinstance(out, torch.Tensor) and out.shape == (6, 3, 6, 6)
    resized = np.stack([cv2.resize(b, (8, 10), interpolation=cv2.INTER_AREA) for b in batch])
    np.testing.assert_array_equal(out.permute(0, 2, 3, 1).numpy(), resized[:, 2:8, 1:7][:, :, ::-1])


def test_resize_shorter_side(batch: np.ndarray) -> None:
    out = Resize(8)([batch[0], batch[1][:16]])
    assert isinstance(out, list) and [o.shape for o in out] == [(10, 8, 3), (8, 8, 3)]
    assert Resize(8).min_input_side == 8
    assert Compose([Resize(8), CenterCrop(8)]).min_input_side == 8


def test_errors(batch: np.ndarray) -> None:
    with pytest.raises(
        ValueError, match=r"size must be a positive int or \(height, width\), got 0"
    ):
        CenterCrop(0)
    with pytest.raises(ValueError, match="scale must satisfy 0 < low <= high <= 1"):
        RandomResizedCrop(8, scale=(0.5, 2.0))
    with pytest.raises(ValueError, match="ratio must satisfy"):
        RandomResizedCrop(8, ratio=(2.0, 1.0))
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\], got 2"):
        RandomHorizontalFlip(p=2)
    with pytest.raises(TypeError, match="seed must be an int or None"):
        RandomHorizontalFlip(seed="1")  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=r"CenterCrop size \(30, 30\) is larger than an image of 20x16"
    ):
        CenterCrop(30)(batch)
    with pytest.raises(TypeError, match="Compose takes batch transforms"):
        Compose([lambda x: x])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="cannot batch images of different sizes"):
        stack_images([np.zeros((2, 2, 3), np.uint8), np.zeros((3, 2, 3), np.uint8)])
    with pytest.raises(ValueError, match=r"images must be a \(B, C, H, W\) uint8 tensor"):
        CenterCrop(2)(torch.zeros(2, 3, 4, 4))
    with pytest.raises(ValueError, match=r"images must be a .* uint8 array"):
        CenterCrop(2)(batch.astype(np.float32))
    with pytest.raises(TypeError, match="images must be a uint8 tensor, array or list"):
        CenterCrop(2)("image")  # type: ignore[arg-type]


def test_seeded_transform_pickles_and_reseeds(batch: np.ndarray) -> None:
    crop = RandomResizedCrop(8, seed=11)
    first = crop(batch)
    clone = pickle.loads(pickle.dumps(crop))  # as into a spawned worker
    np.testing.assert_array_equal(clone(batch), first)


@pytest.mark.parametrize(
    "make",
    [
        lambda: RandomHorizontalFlip(p=1.0),
        lambda: CenterCrop(6),
        lambda: RandomResizedCrop(6, seed=0),
        lambda: Resize(8),
    ],
    ids=["flip", "center_crop", "random_resized_crop", "resize"],
)
def test_planar_tensors_and_strided_arrays(batch: np.ndarray, make: Callable[[], Any]) -> None:
    # A contiguous (B, C, H, W) tensor is a strided view once channels-last; the in-place
    # flip used to hand OpenCV that view as its destination and fail.
    expected = make()(batch.copy())
    planar = torch.from_numpy(batch).permute(0, 3, 1, 2).contiguous()
    np.testing.assert_array_equal(make()(planar).permute(0, 2, 3, 1).numpy(), expected)
    strided = np.ascontiguousarray(batch[:, :, ::-1])[:, :, ::-1]  # negative strides
    np.testing.assert_array_equal(make()(strided), expected)
    masks = torch.from_numpy(batch[..., 0].copy()).transpose(1, 2).contiguous().transpose(1, 2)
    _, moved = make()(planar, masks=masks)
    np.testing.assert_array_equal(moved.numpy(), make()(batch.copy(), masks=batch[..., 0])[1])


def _photo_like(height: int, width: int) -> np.ndarray:
    """Smooth content with fine detail: what aliasing and antialiasing tell apart."""
    rng = np.random.default_rng(5)
    yy, xx = np.mgrid[0:height, 0:width]
    stripes = 127 + 100 * np.sin(xx * 1.3 + yy * 0.4)
    noise = rng.normal(0, 20, (height, width, 3))
    return np.clip(stripes[..., None] + noise, 0, 255).astype(np.uint8)


def test_resize_uses_the_antialiased_kernel_preprocessing_uses() -> None:
    images = [_photo_like(75, 100), _photo_like(100, 75)]
    out = Resize(51)(images)  # 1.47x: the low-pass + bilinear range
    expected = [resize_to(images[0], 68, 51), resize_to(images[1], 51, 68)]
    for got, want in zip(out, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    same_size = Resize((51, 68))(np.stack([images[0], images[0]]))
    np.testing.assert_array_equal(same_size[1], expected[0])
    area = Resize((51, 68), interpolation=cv2.INTER_AREA)(images[:1])
    np.testing.assert_array_equal(
        area[0], cv2.resize(images[0], (68, 51), interpolation=cv2.INTER_AREA)
    )


def test_random_resized_crop_antialiases_with_the_shared_kernel() -> None:
    images = np.stack([_photo_like(90, 120)] * 4)
    boxes = RandomResizedCrop(32, seed=11).boxes(np.full(4, 90), np.full(4, 120))
    out = RandomResizedCrop(32, seed=11)(images)
    for k, (top, left, height, width) in enumerate(boxes.tolist()):
        crop = images[k][top : top + height, left : left + width]
        np.testing.assert_array_equal(out[k], resize_image(crop, 32, 32))


@pytest.mark.parametrize("transform", [Resize, RandomResizedCrop])
def test_interpolation_must_be_none_or_an_opencv_flag(transform: Callable[..., Any]) -> None:
    with pytest.raises(TypeError, match=r"interpolation must be None .* got 'area'"):
        transform(8, interpolation="area")


def _fields(seed: int) -> dict[str, Any]:
    """A batch of images, masks, boxes and box labels (random, some boxes past the edge)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (6, 40, 36, 3), np.uint8)
    boxes, labels = [], []
    for count in rng.integers(0, 5, 6).tolist():
        corners = rng.uniform(-4, 40, (count, 2, 2)).astype(np.float32)
        boxes.append(np.concatenate([corners.min(axis=1), corners.max(axis=1)], axis=1))
        labels.append(rng.integers(0, 9, count))
    masks = rng.integers(0, 4, (6, 40, 36), np.uint8)
    return {"image": images, "mask": masks, "boxes": boxes, "labels": labels}


@pytest.mark.parametrize(
    "first",
    [
        lambda seed: RandomResizedCrop(24, seed=seed),
        lambda seed: RandomResizedCrop((20, 30), scale=(0.3, 1.0), seed=seed),
        lambda seed: CenterCrop((30, 26)),
        lambda seed: Resize((52, 44)),
    ],
)
def test_a_flip_after_a_geometric_step_folds_into_it_with_the_same_result(
    first: Callable[[int], Any],
) -> None:
    """Compose runs a geometric transform and the flip after it as one geometry (each
    flip made right after its sample's resize): the same images, masks, boxes and box
    labels as the two steps one after the other, from the same draws, with or without
    the memory to write into; a second flip runs as a step of its own."""
    for seed in range(12):
        folded = Compose([first(seed), RandomHorizontalFlip(seed=seed + 50)])
        assert len(folded._steps) == 1
        expected = RandomHorizontalFlip(seed=seed + 50)(first(seed)(_fields(seed)))
        got = folded(_fields(seed))
        for name in ("image", "mask"):
            np.testing.assert_array_equal(got[name], expected[name])
        for name in ("boxes", "labels"):
            for got_rows, expected_rows in zip(got[name], expected[name], strict=True):
                np.testing.assert_array_equal(got_rows, expected_rows)
        if folded.writes_out:  # a dataset hands it the batch's memory
            fields = _fields(seed)
            out = np.empty_like(np.asarray(got["image"]))
            images, masks = Compose([first(seed), RandomHorizontalFlip(seed=seed + 50)]).apply_all(
                fields["image"], [fields["mask"]], None, 1, out=out
            )
            assert images is out
            np.testing.assert_array_equal(out, expected["image"])
            np.testing.assert_array_equal(masks[0], expected["mask"])
        twice = Compose([first(seed), RandomHorizontalFlip(seed=seed + 60), RandomHorizontalFlip()])
        assert len(twice._steps) == 2
        images = _fields(seed)["image"]
        torch.manual_seed(seed)
        in_twice = twice(images.copy())
        torch.manual_seed(seed)
        one_by_one = images.copy()
        for step in (first(seed), RandomHorizontalFlip(seed=seed + 60), RandomHorizontalFlip()):
            one_by_one = step(one_by_one)
        np.testing.assert_array_equal(in_twice, one_by_one)


def test_steps_that_do_not_fold_run_one_after_the_other() -> None:
    assert len(Compose([RandomHorizontalFlip(), RandomResizedCrop(24)])._steps) == 2
    assert len(Compose([RandomHorizontalFlip(), RandomHorizontalFlip()])._steps) == 2
    strict_flip = RandomHorizontalFlip()
    strict_flip.min_box_size = 4.0  # it would drop boxes the crop keeps: not folded
    assert len(Compose([RandomResizedCrop(24), strict_flip])._steps) == 2
    folded = Compose([RandomResizedCrop(24), RandomHorizontalFlip()])
    assert len(folded.transforms) == 2 and " then " in repr(folded._steps[0])
    assert folded.output_size((40, 36)) == (24, 24) and folded.writes_out


def test_a_folded_step_follows_settings_changed_after_compose() -> None:
    """The crop's kernel and box settings changed once the Compose is built still apply;
    a flip made stricter than the crop then runs as its own step (the same result as the
    two steps)."""
    crop, flip = RandomResizedCrop(24, seed=1), RandomHorizontalFlip(seed=2)
    folded = Compose([crop, flip])
    crop.interpolation = cv2.INTER_NEAREST
    reference = RandomResizedCrop(24, interpolation=cv2.INTER_NEAREST, seed=1)
    want = RandomHorizontalFlip(seed=2)(reference(_fields(3)))
    np.testing.assert_array_equal(folded(_fields(3))["image"], want["image"])
    crop, flip = RandomResizedCrop(24, seed=1), RandomHorizontalFlip(seed=2)
    folded = Compose([crop, flip])
    flip.min_box_size = 6.0
    strict = RandomHorizontalFlip(seed=2)
    strict.min_box_size = 6.0
    cropped = RandomResizedCrop(24, seed=1)(_fields(3))
    cropped_boxes = sum(map(len, cropped["boxes"]))
    want = strict(cropped)
    got = folded(_fields(3))
    np.testing.assert_array_equal(got["image"], want["image"])
    assert sum(map(len, got["boxes"])) < cropped_boxes  # the flip's rule dropped some
    for got_rows, want_rows in zip(got["boxes"], want["boxes"], strict=True):
        np.testing.assert_array_equal(got_rows, want_rows)
