"""The offline downscale: close to an area resize of a full PIL decode, and deterministic."""

from __future__ import annotations

import io
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image

from fastdata.preprocess._transforms import shrink, transform

# Same budget as the decoder tests: mean absolute difference <= 3 levels of 255.
MEAN_TOLERANCE = 3.0


def _photo(sample_tool: Any, index: int, size: tuple[int, int]) -> np.ndarray:
    data = sample_tool.make_image(0, index, size)
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.mark.parametrize(
    ("size", "side"), [((500, 375), 224), ((375, 500), 256), ((480, 360), 300), ((450, 338), 224)]
)
def test_shrink_is_within_budget_of_pil_decode_and_area_resize(
    sample_tool: Any, size: tuple[int, int], side: int
) -> None:
    for index in range(4):
        photo = _photo(sample_tool, index, size)
        h, w = photo.shape[:2]
        new_h, new_w = (side, round(w * side / h)) if h <= w else (round(h * side / w), side)
        got = shrink(photo, new_w, new_h)
        assert got.shape == (new_h, new_w, 3) and got.dtype == np.uint8
        area = cv2.resize(photo, (new_w, new_h), interpolation=cv2.INTER_AREA)
        pil = np.asarray(Image.fromarray(photo).resize((new_w, new_h), Image.Resampling.BILINEAR))
        got16 = got.astype(np.int16)
        assert np.abs(got16 - area).mean() <= MEAN_TOLERANCE
        assert np.abs(got16 - pil).mean() <= MEAN_TOLERANCE
        # antialiased: closer to the area resize than plain bilinear sampling, which aliases
        plain = cv2.resize(photo, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
        assert np.abs(got16 - area).mean() <= np.abs(plain.astype(np.int16) - area).mean()


def test_shrink_handles_one_axis_gray_and_large_factors() -> None:
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (90, 120, 3), dtype=np.uint8)
    assert shrink(image, 120, 60).shape == (60, 120, 3)  # height only
    assert shrink(image, 30, 20).shape == (20, 30, 3)  # 4x: area resize
    np.testing.assert_array_equal(
        shrink(image, 30, 30), cv2.resize(image, (30, 30), interpolation=cv2.INTER_AREA)
    )
    gray = transform(image[..., :1].copy(), 64, "shorter")
    assert gray.shape == (64, 64, 1) and gray.flags.c_contiguous
    np.testing.assert_array_equal(shrink(image, 100, 70), shrink(image.copy(), 100, 70))


@pytest.mark.parametrize(
    ("size", "side"), [((500, 375), 224), ((333, 500), 256), ((500, 500), 160)]
)
def test_shorter_mode_is_the_centred_square_scaled(
    sample_tool: Any, size: tuple[int, int], side: int
) -> None:
    """``shorter`` keeps the centred square and scales it to S x S (one scale for both axes):
    within the budget of PIL decode + centre crop + area resize, the reference the decoder
    tests use for crops too."""
    for index in range(3):
        photo = _photo(sample_tool, index, size)
        h, w = photo.shape[:2]
        short = min(h, w)
        top, left = (h - short) // 2, (w - short) // 2
        square = photo[top : top + short, left : left + short]
        expected = cv2.resize(square, (side, side), interpolation=cv2.INTER_AREA)
        got = transform(photo, side, "shorter")
        assert got.shape == (side, side, 3) and got.flags.c_contiguous
        assert np.abs(got.astype(np.int16) - expected).mean() <= MEAN_TOLERANCE
