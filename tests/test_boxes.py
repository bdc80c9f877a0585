"""Box geometry (fastdata._boxes) against painted-pixel references computed with NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from fastdata._boxes import (
    as_boxes,
    box_areas,
    check_boxes,
    clip_to_image,
    place_box_batch,
    place_boxes,
    sanitize_boxes,
)


def painted_extent(mask: np.ndarray) -> tuple[float, float, float, float] | None:
    """xyxy extent of the True pixels of a 2-D mask, in pixel-edge coordinates."""
    rows = np.flatnonzero(mask.any(axis=1))
    cols = np.flatnonzero(mask.any(axis=0))
    if len(rows) == 0:
        return None
    return float(cols[0]), float(rows[0]), float(cols[-1] + 1), float(rows[-1] + 1)


def nearest_crop_resize(
    image: np.ndarray, crop: tuple[float, float, float, float], out_size: tuple[int, int]
) -> np.ndarray:
    """Sample pixel centres of the output in the input (nearest neighbour); outside -> False."""
    top, left, height, width = crop
    out_h, out_w = out_size
    ys = top + (np.arange(out_h) + 0.5) * height / out_h
    xs = left + (np.arange(out_w) + 0.5) * width / out_w
    rows = np.floor(ys).astype(int)
    cols = np.floor(xs).astype(int)
    inside = (rows[:, None] >= 0) & (rows[:, None] < image.shape[0])
    inside = inside & (cols[None, :] >= 0) & (cols[None, :] < image.shape[1])
    out = image[np.clip(rows, 0, image.shape[0] - 1)][:, np.clip(cols, 0, image.shape[1] - 1)]
    return out & inside


@pytest.mark.parametrize("flip", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_place_boxes_matches_painted_rectangles(seed: int, flip: bool) -> None:
    rng = np.random.default_rng(seed)
    height, width = 96, 128
    x1, y1 = rng.integers(0, 60, 2)
    box = np.array([[x1, y1, x1 + rng.integers(10, 60), y1 + rng.integers(10, 30)]], np.float32)
    painted = np.zeros((height, width), bool)
    painted[int(box[0, 1]) : int(box[0, 3]), int(box[0, 0]) : int(box[0, 2])] = True
    crop = (float(rng.uniform(-10, 20)), float(rng.uniform(-10, 30)), 70.0, 90.0)
    out_size = (140, 150)
    out = nearest_crop_resize(painted, crop, out_size)
    if flip:
        out = out[:, ::-1]
    placed = place_boxes(box, crop, out_size, flip=flip)
    clipped, keep = sanitize_boxes(placed, out_size, min_size=1.0, min_visibility=0.0)
    extent = painted_extent(out)
    if extent is None:
        assert not keep[0]
        return
    assert keep[0]
    # Nearest sampling puts an edge within one output pixel (plus the scale's rounding).
    np.testing.assert_allclose(clipped[0], extent, atol=2.5)


def test_place_boxes_hand_computed() -> None:
    boxes = np.array([[10, 20, 30, 60]], np.float32)
    # crop top=20, left=10, 40x40 -> 80x80 (scale 2), then mirrored over width 80.
    placed = place_boxes(boxes, (20.0, 10.0, 40.0, 40.0), (80, 80), flip=True)
    np.testing.assert_allclose(placed, [[40.0, 0.0, 80.0, 80.0]])
    assert placed.dtype == np.float32


def test_place_boxes_letterbox_is_a_crop_past_the_image() -> None:
    # 100 (H) x 200 (W) image letterboxed to 640: scale 3.2, 160 px of pad above.
    boxes = np.array([[0, 0, 200, 100], [50, 25, 100, 75]], np.float32)
    placed = place_boxes(boxes, (-50.0, 0.0, 200.0, 200.0), (640, 640))
    np.testing.assert_allclose(placed, [[0, 160, 640, 480], [160, 240, 320, 400]], rtol=1e-6)


def test_place_box_batch_matches_per_sample() -> None:
    rng = np.random.default_rng(3)
    boxes = [rng.uniform(0, 50, (n, 4)).astype(np.float32) for n in (3, 0, 5, 1)]
    boxes = [np.concatenate([b[:, :2], b[:, :2] + 10], axis=1) for b in boxes]
    crops = rng.uniform(1, 40, (4, 4))
    flips = np.array([True, False, False, True])
    batch = place_box_batch(boxes, crops, (64, 48), flips)
    assert [len(b) for b in batch] == [3, 0, 5, 1]
    for item, sample_boxes, crop, flip in zip(batch, boxes, crops, flips, strict=True):
        np.testing.assert_allclose(
            item, place_boxes(sample_boxes, crop, (64, 48), bool(flip)), rtol=1e-5
        )
    assert place_box_batch([np.zeros((0, 4))], [[0, 0, 4, 4]], (8, 8))[0].shape == (0, 4)


def test_sanitize_rule_drops_by_visibility_not_by_centre() -> None:
    out_size = (100, 100)
    boxes = np.array(
        [
            [-60, 10, 40, 50],  # centre outside (x=-10), 40 % visible: kept
            [-95, 10, 5, 50],  # 5 % visible: dropped
            [10, 10, 10.5, 50],  # half a pixel wide: dropped by min_size
            [20, 20, 40, 40],  # inside: kept unchanged
            [np.nan, 0, 5, 5],  # NaN: dropped
            [200, 0, 300, 10],  # fully outside: dropped
        ],
        np.float32,
    )
    clipped, keep = sanitize_boxes(boxes, out_size)
    assert keep.tolist() == [True, False, False, True, False, False]
    np.testing.assert_allclose(clipped[0], [0, 10, 40, 50])
    np.testing.assert_allclose(clipped[3], [20, 20, 40, 40])
    assert clipped.dtype == np.float32


def test_sanitize_areas_before_tracks_earlier_clipping() -> None:
    boxes = np.array([[0, 0, 10, 10]], np.float32)
    _, keep = sanitize_boxes(boxes, (100, 100), min_visibility=0.5, areas_before=[400.0])
    assert not keep[0]  # 100 of 400 px visible
    _, keep = sanitize_boxes(boxes, (100, 100), min_visibility=0.2, areas_before=[400.0])
    assert keep[0]


def test_default_rule_keeps_95_percent_of_visible_object_pixels() -> None:
    rng = np.random.default_rng(0)
    size = 64
    covered = visible = 0.0
    for _ in range(300):
        x1, y1 = rng.uniform(-40, size, 2)
        w, h = rng.uniform(2, 50, 2)
        box = np.array([[x1, y1, x1 + w, y1 + h]], np.float32)
        _, keep = sanitize_boxes(box, (size, size))
        pixels = float(box_areas(clip_to_image(box, (size, size)))[0])
        visible += pixels
        covered += pixels if keep[0] else 0.0
    assert covered >= 0.95 * visible


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"min_size": -1.0}, "min_size"),
        ({"min_visibility": 1.5}, "min_visibility"),
        ({"areas_before": [1.0, 2.0]}, "areas_before"),
    ],
)
def test_sanitize_refuses_bad_arguments(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        sanitize_boxes(np.zeros((1, 4)), (10, 10), **kwargs)  # type: ignore[arg-type]


def test_place_boxes_refuses_bad_shapes_and_sizes() -> None:
    with pytest.raises(ValueError, match=r"shape \(N, 4\)"):
        place_boxes(np.zeros((3, 5)), (0, 0, 1, 1), (4, 4))
    with pytest.raises(ValueError, match="positive"):
        place_boxes(np.zeros((1, 4)), (0, 0, 0, 1), (4, 4))
    assert as_boxes([]).shape == (0, 4)


@pytest.mark.parametrize(
    ("boxes", "match"),
    [
        ([[0, 0, np.nan, 4]], "NaN"),
        ([[5, 0, 2, 4]], "negative size"),
        ([[0, 0, 40, 4]], "outside"),
        ([[-3, 0, 4, 4]], "outside"),
        ([[0, 0, 4]], "shape"),
    ],
)
def test_check_boxes_names_the_problem(boxes: list[list[float]], match: str) -> None:
    reason = check_boxes(np.asarray(boxes, np.float32), (10, 20))
    assert reason is not None and match in reason


def test_check_boxes_accepts_edges_and_empty() -> None:
    assert check_boxes(np.array([[0, 0, 20, 10], [0, 0, 20.5, 10.4]], np.float32), (10, 20)) is None
    assert check_boxes(np.zeros((0, 4), np.float32), (10, 20)) is None
