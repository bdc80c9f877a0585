"""Where to crop and how far to shrink: the pure geometry every decoder backend shares.

Boxes are computed in full-resolution pixel coordinates from uniform random draws made up
front (``DRAWS_PER_BOX`` per image), so every backend, thread and device picks the same
crop for the same seed and image. The sampling itself lives in :mod:`fastdata._crop`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from fastdata._crop import check_ranges, largest_centered_boxes, parse_size, random_boxes

__all__ = [
    "Box",
    "RandomResizedCrop",
    "center_box",
    "crop_box",
    "crop_boxes",
    "crop_parameters",
    "parse_size",
    "random_box",
    "reduction_factors",
]


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
        check_ranges(self.scale, self.ratio)


def crop_parameters(random_crop: object, size: tuple[int, int]) -> RandomResizedCrop | None:
    """A decoder's ``random_crop`` as parameters: ``True`` (the defaults), ``False``/``None``
    (no random crop), a :class:`RandomResizedCrop`, or the same crop described for another
    executor (:class:`fastdata.transforms.RandomResizedCrop`,
    :class:`fastdata.gpu.DeviceRandomResizedCrop`): its ``scale`` and ``ratio``, its
    ``size`` being the decoder's.

    Args:
        random_crop: What the decoder was given.
        size: The decoder's output ``(height, width)``.

    Raises:
        TypeError: Anything else.
        ValueError: A crop description of another size than the decoder's.
    """
    if random_crop is True:
        return RandomResizedCrop()
    if random_crop is None or random_crop is False:
        return None
    if isinstance(random_crop, RandomResizedCrop):
        return random_crop
    scale, ratio = getattr(random_crop, "scale", None), getattr(random_crop, "ratio", None)
    crop_size = getattr(random_crop, "size", None)
    if scale is None or ratio is None or not isinstance(crop_size, tuple):
        raise TypeError(
            "random_crop must be a RandomResizedCrop, a bool or None, "
            f"got {type(random_crop).__name__}"
        )
    if crop_size != size:
        raise ValueError(
            f"random_crop {random_crop!r} has size {crop_size} but the decoder outputs {size}; "
            "give both the same size"
        )
    return RandomResizedCrop(tuple(scale), tuple(ratio))


def _one(boxes: np.ndarray) -> Box:
    top, left, height, width = boxes[0].tolist()
    return Box(top, left, height, width)


def center_box(source_hw: tuple[int, int], out_hw: tuple[int, int]) -> Box:
    """The largest centred box of the output's aspect ratio (resize-then-centre-crop)."""
    aspect = out_hw[1] / out_hw[0]
    return _one(
        largest_centered_boxes(np.array([source_hw[0]]), np.array([source_hw[1]]), (aspect, aspect))
    )


def random_box(source_hw: tuple[int, int], crop: RandomResizedCrop, draws: np.ndarray) -> Box:
    """A random resized crop box of ``source_hw`` from ``DRAWS_PER_BOX`` uniforms in [0, 1)
    (see :func:`fastdata._crop.random_boxes`)."""
    heights, widths = np.array([source_hw[0]]), np.array([source_hw[1]])
    return _one(random_boxes(heights, widths, crop.scale, crop.ratio, draws[None, :]))


def crop_boxes(
    sizes_hw: Sequence[tuple[int, int]] | np.ndarray,
    out_hw: tuple[int, int],
    crop: RandomResizedCrop | None,
    draws: np.ndarray,
) -> np.ndarray:
    """The boxes to cut from a batch of images of ``(height, width)`` ``sizes_hw``: random
    when ``crop`` is set (``draws`` is ``(B, DRAWS_PER_BOX)``), else centred; ``(B, 4)``
    int64."""
    sizes = np.asarray(sizes_hw, dtype=np.int64).reshape(-1, 2)
    heights, widths = sizes[:, 0], sizes[:, 1]
    if crop is None:
        aspect = out_hw[1] / out_hw[0]
        return largest_centered_boxes(heights, widths, (aspect, aspect))
    return random_boxes(heights, widths, crop.scale, crop.ratio, draws)


def crop_box(
    source_hw: tuple[int, int],
    out_hw: tuple[int, int],
    crop: RandomResizedCrop | None,
    draws: np.ndarray,
) -> Box:
    """:func:`crop_boxes` for one image."""
    return _one(crop_boxes([source_hw], out_hw, crop, draws[None, :]))


def reduction_factors(boxes: np.ndarray, out_hw: tuple[int, int]) -> np.ndarray:
    """Per ``(B, 4)`` box, the JPEG scale denominator (1, 2, 4 or 8) to decode at so that
    the box still covers at least ``out_hw`` pixels: ``(B,)`` int64.

    Reduced decoding (1/2, 1/4, 1/8) only pays when the box is at least twice the output.
    """
    factors = np.ones(len(boxes), dtype=np.int64)
    for candidate in (2, 4, 8):
        fits = (boxes[:, 2] // candidate >= out_hw[0]) & (boxes[:, 3] // candidate >= out_hw[1])
        factors[fits] = candidate
    return factors
