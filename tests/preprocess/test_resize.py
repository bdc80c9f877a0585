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


# What preprocessing stores, against a reference: PIL's full decode (accurate DCT, fancy
# upsampling) of the same JPEG, its centred square, PIL's antialiased bilinear resize.
# Measured on 24 generated photos of ImageNet-like sizes (~500x375, quality 75-95), in
# levels of 255: at S = 224 (shrinks of 1.5-2.2x) a mean absolute difference of 0.78 over
# all pixels, the worst image 3.1, a pixel's difference at its 99th percentile at most 14;
# at S = 112 (3-4.5x: a DCT-scaled decode, then area averaging) 1.4, worst image 4.3,
# 99th percentile at most 24. The README quotes these figures; the bounds leave a margin.
STORED_MEAN = {224: 1.0, 112: 1.6}
STORED_WORST_IMAGE = {224: 3.5, 112: 5.0}
STORED_P99 = {224: 16, 112: 28}


@pytest.mark.parametrize("side", [224, 112])
def test_stored_pixels_against_a_full_pil_decode_and_antialiased_resize(
    tmp_path: Any, sample_tool: Any, side: int
) -> None:
    from fastdata import ShardDataset  # noqa: PLC0415 - only this test reads shards
    from fastdata.preprocess import PreprocessOptions, preprocess  # noqa: PLC0415

    folder = tmp_path / "images" / "class_0"
    folder.mkdir(parents=True)
    encoded = [sample_tool.make_image(0, index) for index in range(24)]
    for index, data in enumerate(encoded):
        (folder / f"{index:03d}.jpg").write_bytes(data)
    options = PreprocessOptions(sizes=(side,))
    preprocess(tmp_path / "images", tmp_path / "out", options, workers=1, show_progress=False)
    dataset = ShardDataset(tmp_path / "out", layout="HWC")
    means = []
    for index, data in enumerate(encoded):
        stored = dataset[index][0].numpy().astype(np.int16)
        with Image.open(io.BytesIO(data)) as opened:
            full = opened.convert("RGB")
        shorter = min(full.size)
        left, top = (full.width - shorter) // 2, (full.height - shorter) // 2
        square = full.crop((left, top, left + shorter, top + shorter))
        reference = square.resize((side, side), Image.Resampling.BILINEAR)
        difference = np.abs(stored - np.asarray(reference, np.int16))
        assert np.percentile(difference, 99) <= STORED_P99[side]
        means.append(float(difference.mean()))
    assert float(np.mean(means)) <= STORED_MEAN[side], np.mean(means)
    assert max(means) <= STORED_WORST_IMAGE[side], max(means)
