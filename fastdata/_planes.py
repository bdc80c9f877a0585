"""Buffers for OpenCV's ``split`` and ``merge`` of interleaved uint8 images that they write
through the cache.

OpenCV's split and merge write with non-temporal stores, which bypass the cache, when
every destination starts at the same offset from a SIMD vector boundary (they then align
the loop and stream: cv::hal's ``vecsplit_`` and ``vecmerge_``). The planes go out to
memory and the step that reads them next (a lookup, a histogram) waits for them: about
twice the time of a split and three lookups on a 224 x 224 photo. Destinations at
different offsets are written through the cache.
"""

from __future__ import annotations

import numpy as np

# The widest SIMD vector OpenCV's kernels use, in bytes (AVX-512).
_VECTOR_BYTES = 64


def cached_planes(count: int, channels: int, height: int, width: int) -> np.ndarray:
    """Uninitialised ``(count, channels, height, width)`` uint8 whose planes (each
    contiguous) ``cv2.split`` writes through the cache: each plane starts one byte further
    past a vector boundary than the one before."""
    plane = -(-height * width // _VECTOR_BYTES) * _VECTOR_BYTES + 1
    raw = np.empty(count * channels * plane + _VECTOR_BYTES, np.uint8)
    start = -raw.ctypes.data % _VECTOR_BYTES
    strides = (channels * plane, plane, width, 1)
    return np.ndarray((count, channels, height, width), np.uint8, raw, start, strides)


def cached_interleaved(height: int, width: int, channels: int) -> np.ndarray:
    """Uninitialised C-contiguous ``(height, width, channels)`` uint8 that ``cv2.merge``
    writes through the cache: it starts one byte past a vector boundary, an offset no
    whole pixel of 2 to 4 channels aligns."""
    size = height * width * channels
    raw = np.empty(size + 2 * _VECTOR_BYTES, np.uint8)
    start = -raw.ctypes.data % _VECTOR_BYTES + 1
    return raw[start : start + size].reshape(height, width, channels)
