"""Buffers for OpenCV's split and merge that it writes through the cache: the layout that
keeps it off its streaming (non-temporal) stores, and the pixels it writes there."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from fastdata._planes import cached_interleaved, cached_planes


@pytest.mark.parametrize(("count", "channels", "height", "width"), [(5, 3, 7, 9), (2, 4, 224, 224)])
def test_split_planes_start_at_different_vector_offsets(
    count: int, channels: int, height: int, width: int
) -> None:
    planes = cached_planes(count, channels, height, width)
    assert planes.shape == (count, channels, height, width)
    images = np.random.default_rng(0).integers(0, 256, (count, height, width, channels), np.uint8)
    for k in range(count):
        offsets = {plane.ctypes.data % 64 for plane in planes[k]}
        # OpenCV streams past the cache when every plane has the same offset (for any
        # vector width up to 64 bytes)
        assert len({offset % 16 for offset in offsets}) == channels
        assert all(plane.flags.c_contiguous for plane in planes[k])
        cv2.split(images[k], list(planes[k]))
    assert np.array_equal(planes, images.transpose(0, 3, 1, 2))


@pytest.mark.parametrize("channels", [2, 3, 4])
def test_merge_destination_is_off_every_pixel_alignment(channels: int) -> None:
    out = cached_interleaved(5, 6, channels)
    assert out.shape == (5, 6, channels) and out.flags.c_contiguous
    assert out.ctypes.data % 64 % channels != 0  # no whole pixel reaches a vector boundary
    planes = list(np.random.default_rng(1).integers(0, 256, (channels, 5, 6), np.uint8))
    cv2.merge(planes, dst=out)
    assert np.array_equal(out, np.stack(planes, axis=-1))
