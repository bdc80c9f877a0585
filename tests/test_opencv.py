from __future__ import annotations

import cv2
import numpy as np
import pytest

from fastdata._opencv import decode_image, jpeg_size, reduction_for
from fastdata.errors import DecodeError


def _jpeg(height: int, width: int, quality: int = 95) -> tuple[np.ndarray, bytes]:
    yy, xx = np.mgrid[0:height, 0:width]
    rgb = np.stack([xx % 256, yy % 256, (xx + yy) % 256], axis=-1).astype(np.uint8)
    ok, enc = cv2.imencode(
        ".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    assert ok
    return rgb, enc.tobytes()


def test_jpeg_size_reads_header() -> None:
    _, data = _jpeg(375, 500)
    assert jpeg_size(data) == (375, 500)
    assert jpeg_size(np.frombuffer(data, np.uint8)) == (375, 500)
    assert jpeg_size(b"\x89PNG....") is None
    assert jpeg_size(data[:3]) is None


@pytest.mark.parametrize(
    ("hw", "min_side", "factor"),
    [((375, 500), 224, 1), ((375, 500), 180, 2), ((1000, 800), 101, 4), ((4000, 3000), 100, 8),
     ((375, 500), None, 1), (None, 10, 1)],
)  # fmt: skip
def test_reduction_keeps_min_side(
    hw: tuple[int, int] | None, min_side: int | None, factor: int
) -> None:
    assert reduction_for(hw, min_side) == factor


def test_decode_is_rgb_and_reduced() -> None:
    rgb, data = _jpeg(400, 600)
    full = decode_image(data)
    assert full.shape == (400, 600, 3) and full.dtype == np.uint8
    assert np.abs(full.astype(int) - rgb).mean() < 3  # RGB order, JPEG-close
    reduced = decode_image(data, min_side=100)
    assert reduced.shape == (100, 150, 3)
    assert decode_image(data, grayscale=True).shape == (400, 600)


@pytest.mark.parametrize("bad", [b"", b"not an image", "truncated"])
def test_decode_errors_name_the_source(bad: bytes | str) -> None:
    data = _jpeg(64, 64)[1][:200] if bad == "truncated" else bad
    assert isinstance(data, bytes)
    with pytest.raises(DecodeError, match=r"photo\.jpg"):
        decode_image(data, source="photo.jpg")
