"""Crop-box and resize geometry: the pixel math behind :mod:`fastdata.ops`, which the
decoders, the CPU transforms, the GPU augmentations and offline preprocessing share.

Also the one parser of output sizes (:func:`parse_size`) they all accept.

One implementation of torchvision's random-resized-crop sampling, vectorised over a batch
and driven by uniform draws made by the caller (a NumPy or torch generator), so that every
backend that is given the same draws cuts the same boxes. Boxes are ``(B, 4)`` int64 rows
``(top, left, height, width)`` in pixels.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import numpy as np

ATTEMPTS = 10
# Per box: ATTEMPTS area draws, ATTEMPTS log-ratio draws, then top and left of the box.
DRAWS_PER_BOX = 2 * ATTEMPTS + 2


def parse_size(size: int | Sequence[int], name: str = "size") -> tuple[int, int]:
    """``(height, width)`` from an int (a square) or a pair of positive ints.

    Args:
        size: One int, or a ``(height, width)`` tuple or list.
        name: The argument's name, for the message.

    Raises:
        TypeError: ``size`` (or one of its items) is not an int; bools are refused.
        ValueError: Not exactly two sides, or a side below 1.
    """

    def is_int(value: object) -> bool:
        return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)

    if is_int(size):
        side = operator.index(size)  # type: ignore[arg-type]
        pair: tuple[int, ...] = (side, side)
    elif isinstance(size, tuple | list) and all(is_int(side) for side in size):
        pair = tuple(operator.index(side) for side in size)
    else:
        raise TypeError(f"{name} must be an int or a (height, width) pair of ints, got {size!r}")
    if len(pair) != 2 or min(pair) < 1:
        raise ValueError(f"{name} must be a positive int or (height, width), got {size!r}")
    return pair[0], pair[1]


def check_ranges(
    scale: Sequence[float], ratio: Sequence[float]
) -> tuple[tuple[float, float], tuple[float, float]]:
    """Validate random-resized-crop ranges and return them as float pairs.

    Args:
        scale: ``(low, high)`` area fraction, ``0 < low <= high <= 1``.
        ratio: ``(low, high)`` aspect ratio (width / height), ``0 < low <= high``.

    Raises:
        TypeError: ``scale`` or ``ratio`` is not a pair of real numbers.
        ValueError: A range is empty or out of bounds.
    """
    pairs = []
    for name, value in (("scale", scale), ("ratio", ratio)):
        if (
            not isinstance(value, tuple | list)
            or len(value) != 2
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        ):
            raise TypeError(f"{name} must be a (low, high) pair of numbers, got {value!r}")
        pairs.append((float(value[0]), float(value[1])))
    (scale_low, scale_high), (ratio_low, ratio_high) = pairs
    if not 0 < scale_low <= scale_high <= 1:
        raise ValueError(f"scale must satisfy 0 < low <= high <= 1, got {scale!r}")
    if not 0 < ratio_low <= ratio_high:
        raise ValueError(f"ratio must satisfy 0 < low <= high, got {ratio!r}")
    return pairs[0], pairs[1]


def shorter_side_size(height: int, width: int, side: int) -> tuple[int, int]:
    """``(height, width)`` once the shorter side is resized to ``side``: that side exact,
    the other truncated (torchvision's ``Resize(int)`` rounding)."""
    scale = side / min(height, width)
    if height <= width:
        return side, int(width * scale)
    return int(height * scale), side


def scaled_size(height: int, width: int, side: int, *, longer: bool) -> tuple[int, int]:
    """``(height, width)`` once the shorter (or longer) side is scaled to ``side``, the
    other rounded to the nearest pixel, at least 1 (offline preprocessing's rounding)."""
    if (height >= width) == longer:  # the height is the side that becomes ``side``
        return side, max(1, round(width * side / height))
    return max(1, round(height * side / width)), side


def centered_boxes(
    heights: np.ndarray,
    widths: np.ndarray,
    box_heights: np.ndarray | int,
    box_widths: np.ndarray | int,
) -> np.ndarray:
    """Boxes of the given sizes centred in images of the given sizes (``top = (H - h) // 2``).

    Image sizes are ``(B,)`` integer arrays, box sizes the same or scalars; returns
    ``(B, 4)`` int64.
    """
    heights, widths = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
    box_heights = np.broadcast_to(np.asarray(box_heights, np.int64), heights.shape)
    box_widths = np.broadcast_to(np.asarray(box_widths, np.int64), heights.shape)
    tops, lefts = (heights - box_heights) // 2, (widths - box_widths) // 2
    return np.stack([tops, lefts, box_heights, box_widths], axis=1)


def largest_centered_boxes(
    heights: np.ndarray, widths: np.ndarray, ratio: tuple[float, float]
) -> np.ndarray:
    """The largest centred box of each image whose aspect ratio is the image's clamped into
    ``ratio`` (a ``(r, r)`` ratio gives resize-then-centre-crop to that aspect).

    Args:
        heights: ``(B,)`` integer image heights.
        widths: ``(B,)`` integer image widths.
        ratio: ``(low, high)`` allowed width / height.

    Returns:
        ``(B, 4)`` int64 boxes ``(top, left, height, width)``, at least 1x1.
    """
    heights, widths = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
    aspect = widths / heights
    box_h = np.where(aspect < ratio[0], np.round(widths / ratio[0]), heights)
    box_w = np.where(aspect > ratio[1], np.round(heights * ratio[1]), widths)
    box_h = np.clip(box_h, 1, heights).astype(np.int64)
    box_w = np.clip(box_w, 1, widths).astype(np.int64)
    return centered_boxes(heights, widths, box_h, box_w)


def largest_centered_box(source_hw: tuple[int, int], aspect: float) -> tuple[int, int, int, int]:
    """:func:`largest_centered_boxes` of one image for one aspect ratio (width / height):
    the box ``(top, left, height, width)`` a resize-then-centre-crop to that aspect keeps."""
    heights, widths = np.array([source_hw[0]]), np.array([source_hw[1]])
    top, left, height, width = largest_centered_boxes(heights, widths, (aspect, aspect))[0].tolist()
    return top, left, height, width


def random_boxes(
    heights: np.ndarray,
    widths: np.ndarray,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    draws: np.ndarray,
) -> np.ndarray:
    """Random resized crop boxes, torchvision's rule vectorised over a batch.

    Each image tries up to ``ATTEMPTS`` (area fraction uniform in ``scale``, aspect ratio
    log-uniform in ``ratio``) samples and keeps the first that fits, placed uniformly; when
    none fits it falls back to :func:`largest_centered_boxes`.

    Args:
        heights: ``(B,)`` integer image heights.
        widths: ``(B,)`` integer image widths.
        scale: ``(low, high)`` area fraction (validated by :func:`check_ranges`).
        ratio: ``(low, high)`` width / height (validated by :func:`check_ranges`).
        draws: ``(B, DRAWS_PER_BOX)`` float64 uniforms in [0, 1).

    Returns:
        ``(B, 4)`` int64 boxes ``(top, left, height, width)`` inside their images.
    """
    heights, widths = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
    try_w, try_h = tried_sides(heights, widths, scale, ratio, draws)
    fits = (try_w > 0) & (try_h > 0) & (try_w <= widths[:, None]) & (try_h <= heights[:, None])
    rows, first = np.arange(len(heights)), np.argmax(fits, axis=1)
    box_h, box_w = try_h[rows, first], try_w[rows, first]
    top, left = placed(heights, widths, box_h, box_w, draws[:, -2:])
    boxes = np.stack([top, left, box_h, box_w], axis=1)
    missed = ~fits.any(axis=1)
    if missed.any():  # rare: most batches have no image without a fitting try
        boxes[missed] = largest_centered_boxes(heights[missed], widths[missed], ratio)
    return boxes


def tried_sides(
    heights: np.ndarray,
    widths: np.ndarray,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    draws: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``ATTEMPTS`` tries of torchvision's random boxes (random resized crop, random
    erasing): an area fraction uniform in ``scale`` (draws ``[:, :ATTEMPTS]``) and a ratio
    log-uniform in ``ratio`` (the next ``ATTEMPTS``), as rounded sides
    ``(sqrt(area * ratio), sqrt(area / ratio))``, each ``(B, ATTEMPTS)`` int64."""
    area = (heights * widths).astype(np.float64)[:, None]
    target = area * (scale[0] + (scale[1] - scale[0]) * draws[:, :ATTEMPTS])
    low, high = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(low + (high - low) * draws[:, ATTEMPTS : 2 * ATTEMPTS])
    along = np.round(np.sqrt(target * aspect)).astype(np.int64)
    across = np.round(np.sqrt(target / aspect)).astype(np.int64)
    return along, across


def placed(
    heights: np.ndarray, widths: np.ndarray, box_h: np.ndarray, box_w: np.ndarray, draws: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(top, left)`` int64 of boxes placed uniformly inside their images, from ``(B, 2)``
    uniforms."""
    # min(): a draw just below 1 times (n + 1) can round up to n + 1.
    top = np.minimum(np.floor(draws[:, 0] * (heights - box_h + 1)), heights - box_h)
    left = np.minimum(np.floor(draws[:, 1] * (widths - box_w + 1)), widths - box_w)
    return top.astype(np.int64), left.astype(np.int64)
