"""The detection geometry's draw rules (SSD IoU crop, letterbox) against scalar NumPy
references written from the documented rule, one sample at a time."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata import ops
from fastdata._iou_crop import DRAWS_PER_IOU_CROP, IOU_TRIALS


def _reference_crop(
    height: int, width: int, boxes: np.ndarray, op: ops.RandomIoUCrop, draws: np.ndarray
) -> tuple[int, int, int, int]:
    """The documented rule, one trial at a time in plain Python."""
    options = op.sampler_options
    threshold = options[min(int(draws[0] * len(options)), len(options) - 1)]
    if threshold >= 1.0:
        return 0, 0, height, width
    for trial in range(IOU_TRIALS):
        u_w, u_h, u_left, u_top = draws[1 + 4 * trial : 5 + 4 * trial]
        crop_w = int(width * (op.min_scale + (op.max_scale - op.min_scale) * u_w))
        crop_h = int(height * (op.min_scale + (op.max_scale - op.min_scale) * u_h))
        if crop_w <= 0 or crop_h <= 0:
            continue
        if not op.min_aspect_ratio <= crop_w / crop_h <= op.max_aspect_ratio:
            continue
        left, top = int((width - crop_w) * u_left), int((height - crop_h) * u_top)
        if len(boxes) == 0:
            return top, left, crop_h, crop_w
        best = -1.0
        for x1, y1, x2, y2 in boxes.tolist():
            cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
            if not (left < cx < left + crop_w and top < cy < top + crop_h):
                continue
            ix = max(0.0, min(x2, left + crop_w) - max(x1, left))
            iy = max(0.0, min(y2, top + crop_h) - max(y1, top))
            union = (x2 - x1) * (y2 - y1) + crop_w * crop_h - ix * iy
            best = max(best, ix * iy / union)
        if best >= 0 and best >= threshold:
            return top, left, crop_h, crop_w
    return 0, 0, height, width


def _random_boxes(rng: np.random.Generator, height: int, width: int, count: int) -> np.ndarray:
    corners = rng.uniform(0, 1, (count, 2)) * [width - 2, height - 2]
    sides = rng.uniform(0.05, 0.6, (count, 2)) * [width, height]
    far = np.minimum(corners + sides, [width, height])
    return np.concatenate([corners, far], axis=1).astype(np.float32)


def test_iou_crops_follow_the_documented_rule_sample_by_sample() -> None:
    rng = np.random.default_rng(0)
    op = ops.RandomIoUCrop()
    count = 300
    heights = rng.integers(20, 400, count)
    widths = rng.integers(20, 400, count)
    boxes = [
        _random_boxes(rng, int(h), int(w), int(n))
        for h, w, n in zip(heights, widths, rng.integers(0, 9, count), strict=True)
    ]
    draws = rng.random((count, op.draws_per_sample))
    crops = op.crops(heights, widths, boxes, draws)
    assert crops.shape == (count, 4) and crops.dtype == np.int64
    expected = [
        _reference_crop(int(h), int(w), b, op, d)
        for h, w, b, d in zip(heights, widths, boxes, draws, strict=True)
    ]
    np.testing.assert_array_equal(crops, np.array(expected))
    whole = (crops[:, 2] == heights) & (crops[:, 3] == widths)
    assert 0.1 < whole.mean() < 0.6  # "no crop" drawn a seventh of the time, plus misses
    tops, lefts, sides_h, sides_w = crops.T
    assert (tops >= 0).all() and (lefts >= 0).all()
    assert (tops + sides_h <= heights).all() and (lefts + sides_w <= widths).all()


def test_no_crop_option_and_images_without_boxes() -> None:
    op = ops.RandomIoUCrop(sampler_options=(1.0,))
    draws = np.random.default_rng(1).random((3, DRAWS_PER_IOU_CROP))
    heights, widths = np.array([50, 60, 70]), np.array([80, 40, 70])
    boxes = [np.array([[0, 0, 10, 10]], np.float32)] * 3
    crops = op.crops(heights, widths, boxes, draws)
    np.testing.assert_array_equal(crops, np.stack([[0] * 3, [0] * 3, heights, widths], 1))
    # without boxes, any shaped trial: the first one
    empty = [np.zeros((0, 4), np.float32)] * 3
    cropping = ops.RandomIoUCrop(min_scale=0.5, max_scale=0.5, sampler_options=(0.5,))
    got = cropping.crops(heights, widths, empty, draws)
    np.testing.assert_array_equal(got[:, 2:], np.stack([heights // 2, widths // 2], 1))


def test_a_threshold_no_trial_meets_keeps_the_whole_image() -> None:
    op = ops.RandomIoUCrop(min_scale=0.3, max_scale=0.4, sampler_options=(0.9,))
    boxes = [np.array([[0, 0, 100, 100]], np.float32)]  # a crop of <= 40% sides: IoU < 0.2
    draws = np.random.default_rng(2).random((1, DRAWS_PER_IOU_CROP))
    np.testing.assert_array_equal(
        op.crops(np.array([100]), np.array([100]), boxes, draws), [[0, 0, 100, 100]]
    )


def test_iou_crop_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match="min_scale"):
        ops.RandomIoUCrop(min_scale=0.0)
    with pytest.raises(ValueError, match="min_scale, max_scale"):
        ops.RandomIoUCrop(min_scale=0.8, max_scale=0.5)
    with pytest.raises(ValueError, match="min_aspect_ratio"):
        ops.RandomIoUCrop(min_aspect_ratio=0.0)
    with pytest.raises(TypeError, match="sampler_options"):
        ops.RandomIoUCrop(sampler_options="0.5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sampler_options"):
        ops.RandomIoUCrop(sampler_options=(-0.1, 0.5))
    with pytest.raises(ValueError, match="draws"):
        ops.RandomIoUCrop().crops(np.array([4]), np.array([4]), [], np.zeros((1, 5)))
    assert ops.RandomIoUCrop(sampler_options=[0, 1]) == ops.RandomIoUCrop(sampler_options=(0, 1))
    assert ops.RandomIoUCrop().output_size((10, 20)) is None


def test_letterbox_layout_and_crops() -> None:
    op = ops.Letterbox(64)
    assert op.fill == (114,) and op.output_size(None) == (64, 64)
    placements, crops = op.layout(np.array([100, 64, 30]), np.array([200, 64, 31]))
    # 100x200 -> 32x64 centred vertically; 64x64 unchanged; 30x31 -> 62x64
    np.testing.assert_array_equal(placements, [[16, 0, 32, 64], [0, 0, 64, 64], [1, 0, 62, 64]])
    # the input region the 64x64 output shows: 16 output rows of padding above the image
    np.testing.assert_allclose(crops[0], [-50.0, 0.0, 200.0, 200.0])
    np.testing.assert_allclose(crops[1], [0.0, 0.0, 64.0, 64.0])
    # a point maps through (x - left) * W_out / width: the image's corners land on the
    # placement's corners
    for (top, left, height, width), (c_top, c_left, c_h, c_w), (h, w) in zip(
        placements, crops, [(100, 200), (64, 64), (30, 31)], strict=True
    ):
        assert (0 - c_top) * 64 / c_h == pytest.approx(top)
        assert (h - c_top) * 64 / c_h == pytest.approx(top + height)
        assert (w - c_left) * 64 / c_w == pytest.approx(left + width)
    with pytest.raises(ValueError, match="fill"):
        ops.Letterbox(8, fill=300)
    with pytest.raises(TypeError, match="size"):
        ops.Letterbox(8.5)  # type: ignore[arg-type]
