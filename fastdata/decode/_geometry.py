"""Where to crop and how far to shrink: the pure geometry every decoder backend shares.

Boxes are computed in full-resolution pixel coordinates from uniform random draws made up
front (``DRAWS_PER_IMAGE`` per image), so every backend, thread and device picks the same
crop for the same seed and image.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

_ATTEMPTS = 10
# Two draws (area, log-ratio) per attempt, then two for the position of the box.
DRAWS_PER_IMAGE = 2 * _ATTEMPTS + 2


class Box(NamedTuple):
    """A crop window in pixels: ``top``, ``left``, ``height``, ``width``."""

    top: int
    left: int
    height: int
    width: int


@dataclass(frozen=True)
class RandomResizedCrop:
    """Random resized crop parameters (the Inception / torchvision recipe).

    Attributes:
        scale: Range of the crop's area as a fraction of the image's area.
        ratio: Range of the crop's aspect ratio (width / height), sampled log-uniformly.
    """

    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)

    def __post_init__(self) -> None:
        low, high = self.scale
        if not 0 < low <= high <= 1:
            raise ValueError(f"scale must satisfy 0 < low <= high <= 1, got {self.scale!r}")
        low, high = self.ratio
        if not 0 < low <= high:
            raise ValueError(f"ratio must satisfy 0 < low <= high, got {self.ratio!r}")


def parse_size(size: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    """``(height, width)`` from an int (square) or a pair; raises on anything else."""
    if isinstance(size, bool):
        raise TypeError(f"size must be an int or an (height, width) pair, got {size!r}")
    if isinstance(size, int):
        pair: tuple[int, ...] = (size, size)
    elif isinstance(size, tuple | list) and all(
        isinstance(s, int) and not isinstance(s, bool) for s in size
    ):
        pair = tuple(size)
    else:
        raise TypeError(f"size must be an int or an (height, width) pair, got {size!r}")
    if len(pair) != 2 or min(pair) < 1:
        raise ValueError(f"size must be one or two positive ints, got {size!r}")
    return pair[0], pair[1]


def center_box(source_hw: tuple[int, int], out_hw: tuple[int, int]) -> Box:
    """The largest centred box of the output's aspect ratio (resize-then-centre-crop)."""
    height, width = source_hw
    out_h, out_w = out_hw
    if height * out_w > width * out_h:  # source is taller than the output: trim rows
        box_h, box_w = max(1, round(width * out_h / out_w)), width
    else:
        box_h, box_w = height, max(1, round(height * out_w / out_h))
    return Box((height - box_h) // 2, (width - box_w) // 2, box_h, box_w)


def random_box(source_hw: tuple[int, int], crop: RandomResizedCrop, draws: np.ndarray) -> Box:
    """A random resized crop box of ``source_hw`` from ``DRAWS_PER_IMAGE`` uniforms in [0, 1).

    Tries up to ten (area, aspect ratio) samples; if none fits, falls back to the largest
    centred box with the aspect ratio clamped into ``crop.ratio``.
    """
    height, width = source_hw
    area = height * width
    log_low, log_high = math.log(crop.ratio[0]), math.log(crop.ratio[1])
    for attempt in range(_ATTEMPTS):
        u_area, u_ratio = draws[2 * attempt], draws[2 * attempt + 1]
        target_area = area * (crop.scale[0] + u_area * (crop.scale[1] - crop.scale[0]))
        aspect = math.exp(log_low + u_ratio * (log_high - log_low))
        box_w = round(math.sqrt(target_area * aspect))
        box_h = round(math.sqrt(target_area / aspect))
        if 0 < box_w <= width and 0 < box_h <= height:
            top = min(int(draws[-2] * (height - box_h + 1)), height - box_h)
            left = min(int(draws[-1] * (width - box_w + 1)), width - box_w)
            return Box(top, left, box_h, box_w)
    aspect = width / height
    if aspect < crop.ratio[0]:
        box_w, box_h = width, max(1, round(width / crop.ratio[0]))
    elif aspect > crop.ratio[1]:
        box_h, box_w = height, max(1, round(height * crop.ratio[1]))
    else:
        box_h, box_w = height, width
    return Box((height - box_h) // 2, (width - box_w) // 2, box_h, box_w)


def crop_box(
    source_hw: tuple[int, int],
    out_hw: tuple[int, int],
    crop: RandomResizedCrop | None,
    draws: np.ndarray,
) -> Box:
    """The box to cut from an image of ``source_hw``: random when ``crop`` is set, else centred."""
    if crop is None:
        return center_box(source_hw, out_hw)
    return random_box(source_hw, crop, draws)


def reduction_min_side(source_hw: tuple[int, int], box: Box, out_hw: tuple[int, int]) -> int | None:
    """The ``min_side`` to ask the reduced-size JPEG decode for, so that ``box`` still
    covers at least ``out_hw`` pixels once decoded (``None``: decode at full size).

    Reduced decoding (1/2, 1/4, 1/8) only pays when the box is at least twice the output.
    """
    factor = 1
    for candidate in (2, 4, 8):
        if box.height // candidate >= out_hw[0] and box.width // candidate >= out_hw[1]:
            factor = candidate
    if factor == 1:
        return None
    return -(-min(source_hw) // factor)
