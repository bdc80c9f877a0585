"""Where to crop: the pure geometry every decoder backend shares.

Boxes are computed in full-resolution pixel coordinates from uniform random draws made up
front (``draws_per_sample`` per image), so every backend, thread and device picks the same
crop for the same seed and image. The sampling itself is the description's,
:class:`fastdata.ops.RandomResizedCrop`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from fastdata._crop import largest_centered_box, largest_centered_boxes, parse_size
from fastdata.ops import RandomResizedCrop, described

__all__ = [
    "Box",
    "center_box",
    "crop_box",
    "crop_boxes",
    "crop_description",
    "parse_size",
    "random_box",
]


class Box(NamedTuple):
    """A crop window in pixels: ``top``, ``left``, ``height``, ``width``."""

    top: int
    left: int
    height: int
    width: int


def crop_description(random_crop: object, size: tuple[int, int]) -> RandomResizedCrop | None:
    """A decoder's ``random_crop`` as the description it runs: ``True`` (the default
    :class:`fastdata.ops.RandomResizedCrop` of the decoder's size), ``False``/``None`` (no
    random crop), a :class:`fastdata.ops.RandomResizedCrop`, or an executor holding one as
    its ``op`` (:class:`fastdata.transforms.RandomResizedCrop`,
    :class:`fastdata.gpu.DeviceRandomResizedCrop`).

    Args:
        random_crop: What the decoder was given.
        size: The decoder's output ``(height, width)``.

    Raises:
        TypeError: Anything else.
        ValueError: A crop of another size than the decoder's.
    """
    if random_crop is True:
        return RandomResizedCrop(size)
    if random_crop is None or random_crop is False:
        return None
    crop = described(random_crop, RandomResizedCrop)
    if crop is None:
        raise TypeError(
            "random_crop must be a RandomResizedCrop (the transform, the device module or the "
            "description either holds as .op), a bool or None, got "
            f"{type(random_crop).__name__}"
        )
    if crop.size != size:
        raise ValueError(
            f"random_crop {crop!r} has size {crop.size} but the decoder outputs {size}; "
            "give both the same size"
        )
    return crop


def _one(boxes: np.ndarray) -> Box:
    top, left, height, width = boxes[0].tolist()
    return Box(top, left, height, width)


def center_box(source_hw: tuple[int, int], out_hw: tuple[int, int]) -> Box:
    """The largest centred box of the output's aspect ratio (resize-then-centre-crop)."""
    return Box(*largest_centered_box(source_hw, out_hw[1] / out_hw[0]))


def random_box(source_hw: tuple[int, int], crop: RandomResizedCrop, draws: np.ndarray) -> Box:
    """A random resized crop box of ``source_hw`` from ``crop.draws_per_sample`` uniforms in
    [0, 1) (see :meth:`fastdata.ops.RandomResizedCrop.boxes`)."""
    heights, widths = np.array([source_hw[0]]), np.array([source_hw[1]])
    return _one(crop.boxes(heights, widths, draws[None, :]))


def crop_boxes(
    sizes_hw: Sequence[tuple[int, int]] | np.ndarray,
    out_hw: tuple[int, int],
    crop: RandomResizedCrop | None,
    draws: np.ndarray,
) -> np.ndarray:
    """The boxes to cut from a batch of images of ``(height, width)`` ``sizes_hw``: random
    when ``crop`` is set (``draws`` is ``(B, crop.draws_per_sample)``), else the largest
    centred box of the output's aspect; ``(B, 4)`` int64."""
    sizes = np.asarray(sizes_hw, dtype=np.int64).reshape(-1, 2)
    heights, widths = sizes[:, 0], sizes[:, 1]
    if crop is None:
        aspect = out_hw[1] / out_hw[0]
        return largest_centered_boxes(heights, widths, (aspect, aspect))
    return crop.boxes(heights, widths, draws)


def crop_box(
    source_hw: tuple[int, int],
    out_hw: tuple[int, int],
    crop: RandomResizedCrop | None,
    draws: np.ndarray,
) -> Box:
    """:func:`crop_boxes` for one image."""
    return _one(crop_boxes([source_hw], out_hw, crop, draws[None, :]))
