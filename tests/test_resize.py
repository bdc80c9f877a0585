"""The antialiased resize kernel shared by preprocessing and the CPU transforms: within a
stated tolerance of PIL's antialiased bilinear resize on photos."""

from __future__ import annotations

import io
from typing import Any

import cv2
import numpy as np
import pytest
from PIL import Image

from fastdata._resize import resize_center_crop, resize_image

# Mean absolute difference from PIL's antialiased bilinear resize (a triangle filter as
# wide as the shrink), in levels of 255, per image; and the 99th percentile of the
# per-pixel difference. OpenCV's area resize is as far from it at 2x and more (2.8 mean on
# these photos at 3.1x): both antialias, with different filters.
MEAN_TOLERANCE = 3.0
P99_TOLERANCE = 16


def _photo(sample_tool: Any, index: int, size: tuple[int, int]) -> np.ndarray:
    data = sample_tool.make_image(0, index, size)
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def _pil(image: np.ndarray, width: int, height: int) -> np.ndarray:
    return np.asarray(Image.fromarray(image).resize((width, height), Image.Resampling.BILINEAR))


def _assert_close_to_pil(got: np.ndarray, image: np.ndarray) -> None:
    reference = _pil(image, got.shape[1], got.shape[0]).astype(np.int16)
    difference = np.abs(got.astype(np.int16) - reference)
    assert difference.mean() <= MEAN_TOLERANCE, difference.mean()
    assert np.percentile(difference, 99) <= P99_TOLERANCE
    # it antialiases: closer to PIL than bilinear sampling alone where the image shrinks
    if got.shape[0] < image.shape[0] and got.shape[1] < image.shape[1]:
        size = (got.shape[1], got.shape[0])
        aliased = cv2.resize(image, size, interpolation=cv2.INTER_LINEAR).astype(np.int16)
        assert difference.mean() < np.abs(aliased - reference).mean()


@pytest.mark.parametrize(
    ("size", "out_hw"),
    [
        ((500, 375), (256, 341)),  # Resize(256) of a landscape photo: 1.46x
        ((375, 500), (299, 224)),  # Resize(224) of a portrait photo: 1.67x
        ((500, 375), (120, 160)),  # over 2.75x: area averaging
        ((500, 375), (100, 400)),  # one axis shrinks, the other grows
        ((160, 120), (224, 299)),  # both grow: bilinear
    ],
)
def test_the_kernel_is_within_tolerance_of_pils_antialiased_resize(
    sample_tool: Any, size: tuple[int, int], out_hw: tuple[int, int]
) -> None:
    for index in range(4):
        photo = _photo(sample_tool, index, size)
        got = resize_image(photo, out_hw[1], out_hw[0])
        assert got.shape == (*out_hw, 3) and got.dtype == np.uint8
        _assert_close_to_pil(got, photo)


def test_a_crop_view_one_channel_and_out_are_kept(sample_tool: Any) -> None:
    photo = _photo(sample_tool, 0, (500, 375))
    crop = photo[20:300, 50:450]  # a strided view
    expected = resize_image(np.ascontiguousarray(crop), 224, 160)
    np.testing.assert_array_equal(resize_image(crop, 224, 160), expected)
    out = np.empty((160, 224, 3), np.uint8)
    assert resize_image(crop, 224, 160, out) is out
    np.testing.assert_array_equal(out, expected)
    grey = np.ascontiguousarray(photo[:, :, :1])
    one = resize_image(grey, 224, 160)
    assert one.shape == (160, 224, 1)
    np.testing.assert_array_equal(one[:, :, 0], resize_image(grey[:, :, 0], 224, 160))
    np.testing.assert_array_equal(resize_image(photo, 500, 375), photo)  # same size: a copy


@pytest.mark.parametrize(
    ("image_hw", "channels"),
    [((375, 500), 3), ((333, 517), 3), ((230, 230), 3), ((1200, 700), 3), ((100, 150), 3),
     ((511, 257), 1)],
)  # fmt: skip
@pytest.mark.parametrize(
    ("side", "crop"), [(256, (224, 224)), (224, (224, 224)), (300, (128, 200))]
)
def test_resize_center_crop_gives_the_pixels_of_resize_then_crop(
    image_hw: tuple[int, int], channels: int, side: int, crop: tuple[int, int]
) -> None:
    """The low-pass filter run only where the crop samples changes no pixel: shrinking by
    less than 2x (filtered), by more (area) and enlarging (bilinear)."""
    image = np.random.default_rng(sum(image_hw)).integers(0, 256, (*image_hw, channels), np.uint8)
    height, width = image_hw
    resized = (
        (side, round(width * side / height))
        if height <= width
        else (round(height * side / width), side)
    )
    if resized[0] < crop[0] or resized[1] < crop[1]:
        pytest.skip("crop larger than the resized image")
    box = ((resized[0] - crop[0]) // 2, (resized[1] - crop[1]) // 2, *crop)
    expected = resize_image(image, resized[1], resized[0])[
        box[0] : box[0] + crop[0], box[1] : box[1] + crop[1]
    ]
    out = np.empty((*crop, channels), np.uint8)
    np.testing.assert_array_equal(resize_center_crop(image, resized, box, out), expected)


def test_resize_256_of_a_photo_is_within_1_3_levels_of_pil(sample_tool: Any) -> None:
    """The eval path's usual shrink (500x375 to 341x256, 1.46x): the Gaussian's sigma, the
    shrink less one (times 0.9), keeps it at 1.13 levels of 255 from PIL on these photos."""
    means = []
    for index in range(6):
        photo = _photo(sample_tool, index, (500, 375))
        reference = _pil(photo, 341, 256).astype(np.int16)
        means.append(np.abs(resize_image(photo, 341, 256).astype(np.int16) - reference).mean())
    assert float(np.mean(means)) <= 1.3, means


def test_a_shrink_under_about_1_33x_skips_the_low_pass(
    sample_tool: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its outer taps would weigh under 1/256: no filter pass, plain bilinear sampling, and
    the crop path agrees."""
    import fastdata._resize as kernel  # noqa: PLC0415 - its filter pass is replaced

    def no_filter(*args: Any) -> None:
        raise AssertionError("the low-pass ran")

    monkeypatch.setattr(kernel, "_low_pass", no_filter)
    photo = _photo(sample_tool, 0, (500, 333))  # 333 to 256: 1.30x
    bilinear = cv2.resize(photo, (384, 256), interpolation=cv2.INTER_LINEAR)
    np.testing.assert_array_equal(resize_image(photo, 384, 256), bilinear)
    out = np.empty((224, 224, 3), np.uint8)
    resize_center_crop(photo, (256, 384), (16, 80, 224, 224), out)
    np.testing.assert_array_equal(out, bilinear[16:240, 80:304])
    monkeypatch.undo()
    filtered = _photo(sample_tool, 0, (500, 375))  # 375 to 256: 1.46x, filtered
    plain = cv2.resize(filtered, (341, 256), interpolation=cv2.INTER_LINEAR)
    assert not np.array_equal(resize_image(filtered, 341, 256), plain)


@pytest.mark.parametrize(
    ("size", "out_hw"),
    [
        ((500, 375), (168, 224)),  # 2.23x: a random crop of a photo resized to 224
        ((560, 400), (224, 224)),  # 2.50x by 1.79x
        ((600, 450), (180, 240)),  # 2.50x
    ],
)
def test_shrinks_from_2x_to_2_75x_are_low_passed_closer_to_pil_than_area(
    sample_tool: Any, size: tuple[int, int], out_hw: tuple[int, int]
) -> None:
    """Between 2x and 2.75x the 3-tap low-pass and bilinear sampling stay nearer PIL's
    antialiased resize than OpenCV's area averaging (which takes a slow generic path at
    these non-integer factors)."""
    for index in range(4):
        photo = _photo(sample_tool, index, size)
        got = resize_image(photo, out_hw[1], out_hw[0])
        _assert_close_to_pil(got, photo)
        reference = _pil(photo, out_hw[1], out_hw[0]).astype(np.int16)
        area = cv2.resize(photo, out_hw[::-1], interpolation=cv2.INTER_AREA).astype(np.int16)
        ours = np.abs(got.astype(np.int16) - reference).mean()
        assert ours < np.abs(area - reference).mean(), index


def test_whole_factors_from_2x_and_shrinks_from_2_75x_are_area_averaged(sample_tool: Any) -> None:
    photo = _photo(sample_tool, 0, (600, 450))
    for out_hw in [(225, 300), (150, 200), (225, 600), (150, 210), (160, 224)]:
        area = cv2.resize(photo, out_hw[::-1], interpolation=cv2.INTER_AREA)
        np.testing.assert_array_equal(resize_image(photo, out_hw[1], out_hw[0]), area)


def test_a_low_pass_along_rows_only_gives_the_one_tap_column_filters_values() -> None:
    """A shrink filtered along x only runs a centre-only 3-tap column kernel (OpenCV's
    1-tap column path is about twice as slow): the same bytes as the 1-tap kernel."""
    import fastdata._resize as kernel  # noqa: PLC0415 - its private filter is checked

    rng = np.random.default_rng(7)
    for trial in range(60):
        height, width = (int(side) for side in rng.integers(3, 200, 2))
        shape = (height, width) if trial % 2 else (height, width, 3)
        image = rng.integers(0, 256, shape, np.uint8)
        if trial % 3 == 0:  # smooth values: sums near a rounding tie
            image = cv2.GaussianBlur(image, (5, 5), 2)
        scale_x = float(rng.uniform(1.34, 2.74))
        taps = kernel._low_pass_taps(scale_x)
        expected = cv2.sepFilter2D(
            image, -1, taps, np.ones((1, 1), np.float32), borderType=cv2.BORDER_REFLECT_101
        )
        np.testing.assert_array_equal(kernel._low_pass(image, scale_x, 1.1, None), expected)


def test_shrinks_up_to_1_3x_are_known_unfiltered_without_making_the_gaussian() -> None:
    """The shortcut for small shrinks decides as the taps do, on both sides of it."""
    import fastdata._resize as kernel  # noqa: PLC0415 - its private decision is checked

    scales = np.concatenate([np.linspace(0.2, 1.4, 241), [kernel._NEVER_FILTERED_UP_TO]])
    for scale_x in scales.tolist():
        for scale_y in (0.5, 1.0, 1.2, 1.3, 1.34, 1.5):
            by_taps = (
                kernel._low_pass_taps(scale_x) is not kernel._IDENTITY_TAP
                or kernel._low_pass_taps(scale_y) is not kernel._IDENTITY_TAP
            )
            assert kernel._filters(scale_x, scale_y) == by_taps, (scale_x, scale_y)
