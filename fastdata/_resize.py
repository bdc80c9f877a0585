"""The one antialiased resize kernel of uint8 images: preprocessing and the CPU
transforms (``Resize``, ``RandomResizedCrop``) use it.

An axis that shrinks (what is left after a JPEG's reduced-size decode, the usual
``Resize(256)`` of a photo, a random crop of a photo resized to 224) gets a 3-tap Gaussian
low-pass whose sigma is 0.9 times the shrink less one (OpenCV's separable float filter,
faster than its bit-exact ``GaussianBlur``; skipped under ~1.33x, where it would move
pixels by about a level), then bilinear sampling; a shrink of 2.75x or more, or of a whole
factor from 2x on both axes, is area-averaged; an image that grows is sampled bilinearly.
Chosen by measurement (``benchmarks/bench_resize.py``; the figures are in
docs/benchmarks.md): OpenCV's ``INTER_AREA`` takes a slow generic path at non-integer
factors (2-3x the low-pass and bilinear at 2-2.75x, which is also closer to PIL there),
plain ``INTER_LINEAR`` aliases, and PIL's antialiased bilinear is slower still. Its pixels
differ from PIL's antialiased bilinear resize by 1.1 levels of 255 on average (mean
absolute difference) at ``Resize(256)`` of 500x375 photos, and within 3 levels at every
tested factor (``tests/test_resize.py``).
"""

from __future__ import annotations

import functools
import threading

import cv2
import numpy as np

_SIGMA_PER_EXTRA_SCALE = 0.9
# From this shrink the 3-tap low-pass no longer keeps up with PIL's wider filter: area
# averaging is closer (below it, about 2.9x on photos, the low-pass is closer and 2-3x
# cheaper than OpenCV's area resize at a non-integer factor).
_AREA_FROM_SCALE = 2.75
# Whole factors from this on both axes take OpenCV's fast area path (several times the
# low-pass's speed).
_WHOLE_AREA_FROM_SCALE = 2
_IDENTITY_TAP = np.ones((1, 1), np.float32)
# A column kernel that keeps each row: the same values as _IDENTITY_TAP, but OpenCV's
# separable filter with a 1-tap column kernel takes a path about twice as slow.
_CENTRE_TAP = np.array([[0.0], [1.0], [0.0]], np.float32)
# Below this weight of each outer tap (shrinks under ~1.33x) the filter would move a pixel
# by at most about a level of 255: it is skipped, and the axis is sampled bilinearly.
_SMALLEST_OUTER_TAP = 1 / 256
# Shrinks up to this one have outer taps under that weight (the bound is at ~1.334x): no
# filter, decided without making the Gaussian (the taps' cache, keyed by the shrink, misses
# for nearly every random crop).
_NEVER_FILTERED_UP_TO = 1.3
_scratch = threading.local()  # per thread: the filtered source of resize_center_crop


@functools.lru_cache(maxsize=256)  # per image size; the arrays are read, never written
def _low_pass_taps(scale: float) -> np.ndarray:
    """The 3-tap Gaussian of an axis that shrinks by ``scale`` (1 tap when it does not, or
    by so little that the outer taps weigh under :data:`_SMALLEST_OUTER_TAP`)."""
    if scale <= 1:
        return _IDENTITY_TAP
    taps = cv2.getGaussianKernel(3, _SIGMA_PER_EXTRA_SCALE * (scale - 1), cv2.CV_32F)
    return _IDENTITY_TAP if taps[0, 0] < _SMALLEST_OUTER_TAP else taps


def _filters(scale_x: float, scale_y: float) -> bool:
    """Whether a shrink by ``(scale_x, scale_y)`` (under 2x) is low-pass filtered."""
    if max(scale_x, scale_y) <= _NEVER_FILTERED_UP_TO:  # most crops: no Gaussian to make
        return False
    return (
        _low_pass_taps(scale_x) is not _IDENTITY_TAP or _low_pass_taps(scale_y) is not _IDENTITY_TAP
    )


def _area_averaged(height: int, width: int, out_height: int, out_width: int) -> bool:
    """Whether ``(height, width)`` resized to ``(out_height, out_width)`` is area-averaged:
    a shrink by :data:`_AREA_FROM_SCALE` or more on an axis, or by whole factors of at
    least :data:`_WHOLE_AREA_FROM_SCALE` on both."""
    scale_x, scale_y = width / out_width, height / out_height
    if max(scale_x, scale_y) >= _AREA_FROM_SCALE:
        return True
    # (a remainder of 0 also means the axis does not grow)
    return (
        max(scale_x, scale_y) >= _WHOLE_AREA_FROM_SCALE
        and width % out_width == 0
        and height % out_height == 0
    )


def _low_pass(
    source: np.ndarray, scale_x: float, scale_y: float, dst: np.ndarray | None
) -> np.ndarray:
    """``source`` (2-D, or 3-D with channels) filtered by the low-pass of the shrinks."""
    taps_y = _low_pass_taps(scale_y)
    return cv2.sepFilter2D(
        source,
        -1,
        _low_pass_taps(scale_x),
        _CENTRE_TAP if taps_y is _IDENTITY_TAP else taps_y,
        dst=dst,
        borderType=cv2.BORDER_REFLECT_101,
    )


def _scratch_like(image: np.ndarray) -> np.ndarray:
    """A per-thread uint8 buffer of ``image``'s shape (reused: its contents are stale)."""
    buffer: np.ndarray | None = getattr(_scratch, "buffer", None)
    size = image.size
    if buffer is None or buffer.size < size:
        buffer = np.empty(max(size, 1 << 20), np.uint8)
        _scratch.buffer = buffer
    return buffer[:size].reshape(image.shape)


def _plane(image: np.ndarray) -> np.ndarray:
    """``(H, W, 1)`` as ``(H, W)`` (OpenCV drops a single channel axis), else as is."""
    return image[:, :, 0] if image.ndim == 3 and image.shape[2] == 1 else image


def resize_image(
    image: np.ndarray, width: int, height: int, out: np.ndarray | None = None
) -> np.ndarray:
    """Antialiased resize of ``(H, W[, C])`` uint8 ``image`` to ``(height, width[, C])``.

    Args:
        image: The image; any strides (a crop view is fine).
        width: Output width.
        height: Output height.
        out: Where to write the result (``(height, width[, C])`` uint8, C-contiguous), or
            ``None`` for a new array.

    Returns:
        ``out``, or the new array, with ``image``'s number of axes.
    """
    h, w = image.shape[:2]
    scale_x, scale_y = w / width, h / height
    source, dst = _plane(image), None if out is None else _plane(out)
    if _area_averaged(h, w, height, width):
        interpolation = cv2.INTER_AREA
    else:
        interpolation = cv2.INTER_LINEAR
        if _filters(scale_x, scale_y):
            source = _low_pass(source, scale_x, scale_y, None)
    if (h, w) == (height, width):
        resized = source
        if dst is not None:
            dst[...] = resized
    else:
        resized = cv2.resize(source, (width, height), dst=dst, interpolation=interpolation)
    if out is not None:
        return out
    return resized[..., None] if image.ndim == 3 and resized.ndim == 2 else resized


def resize_center_crop(
    image: np.ndarray,
    resized_hw: tuple[int, int],
    box: tuple[int, int, int, int],
    out: np.ndarray,
) -> np.ndarray:
    """``resize_image(image, width, height)[top : top + h, left : left + w]`` written into
    ``out``, the same pixels, with the low-pass filter run only on the source pixels the
    box samples (plus the filter's and the bilinear neighbour's margin): the pixels outside
    them reach only resized pixels outside the box, which are dropped.

    Args:
        image: ``(H, W, C)`` uint8, any strides.
        resized_hw: The ``(height, width)`` the whole image is resized to.
        box: ``(top, left, height, width)`` inside the resized image.
        out: ``(height, width, C)`` uint8, C-contiguous (a row of a batch).

    Returns:
        ``out``.
    """
    h, w = image.shape[:2]
    resized_h, resized_w = resized_hw
    top, left, box_h, box_w = box
    scale_y, scale_x = h / resized_h, w / resized_w
    source = image
    if not _area_averaged(h, w, resized_h, resized_w) and _filters(scale_x, scale_y):
        # cv2.resize samples source row (i + 0.5) * scale - 0.5 and the next one; the
        # 3-tap filter reads one more on each side
        first_y = max(int((top + 0.5) * scale_y - 0.5) - 2, 0)
        last_y = min(int((top + box_h - 0.5) * scale_y - 0.5) + 3, h)
        first_x = max(int((left + 0.5) * scale_x - 0.5) - 2, 0)
        last_x = min(int((left + box_w - 0.5) * scale_x - 0.5) + 3, w)
        source = _scratch_like(image)  # outside the region: never sampled for the box
        # filtered straight into the region of `source` (OpenCV writes into the view)
        _low_pass(
            _plane(image[first_y:last_y, first_x:last_x]),
            scale_x,
            scale_y,
            _plane(source[first_y:last_y, first_x:last_x]),
        )
        resized = cv2.resize(_plane(source), (resized_w, resized_h), interpolation=cv2.INTER_LINEAR)
    else:
        resized = resize_image(image, resized_w, resized_h)
    if resized.ndim == 2:
        resized = resized[..., None]
    out[...] = resized[top : top + box_h, left : left + box_w]
    return out
