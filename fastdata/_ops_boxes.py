"""Detection geometry descriptions (re-exported by :mod:`fastdata.ops`): the SSD-style
:class:`RandomIoUCrop` and the YOLO-style :class:`Letterbox`.

Both state the crop each sample takes in input pixels, ``(top, left, height, width)``, the
form every executor cuts images with and :func:`fastdata._boxes.place_boxes` maps boxes
through, so images, masks and boxes move from one draw.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fastdata._crop import parse_size
from fastdata._iou_crop import DRAWS_PER_IOU_CROP, iou_crops, letterbox_layout
from fastdata._operation import Operation
from fastdata._ops_steps import check_fill, check_range, frozen_set, is_number

# torchvision's (and SSD's) thresholds; 1.0: keep the whole image.
IOU_OPTIONS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
# YOLO's letterbox grey.
LETTERBOX_FILL = 114


@dataclass(frozen=True, init=False)
class RandomIoUCrop(Operation):
    """Crop each image so that a box stays mostly inside (SSD's sampler, as
    ``torchvision.transforms.v2.RandomIoUCrop``), no resize.

    Per sample one draw picks a minimum IoU from ``sampler_options`` (``1.0``: no crop);
    then up to 40 trials each draw a width and a height (fractions uniform in
    ``min_scale .. max_scale`` of the image's) and a place; the first trial whose aspect
    ratio lies in ``min_aspect_ratio .. max_aspect_ratio`` and that holds the centre of a
    box overlapping it with an IoU of at least the threshold is the crop. When none
    qualifies the image is kept whole (torchvision draws again without bound); an image
    without boxes takes its first trial of a good shape. Boxes are then clipped to the
    crop and dropped by :func:`fastdata._boxes.sanitize_boxes`'s rule (visible area and
    size), not by where their centre fell.

    Args:
        min_scale: Smallest side fraction, in ``(0, 1]``.
        max_scale: Largest side fraction, in ``[min_scale, 1]``.
        min_aspect_ratio: Smallest crop width / height, ``> 0``.
        max_aspect_ratio: Largest crop width / height, ``>= min_aspect_ratio``.
        sampler_options: IoU thresholds to pick from, each ``>= 0`` (``>= 1``: no crop).

    Raises:
        TypeError: A number or the options of the wrong type.
        ValueError: A range empty or out of bounds, or no options.
    """

    min_scale: float
    max_scale: float
    min_aspect_ratio: float
    max_aspect_ratio: float
    sampler_options: tuple[float, ...]

    draws_per_sample: ClassVar[int] = DRAWS_PER_IOU_CROP
    reads_only: ClassVar[bool] = True
    keeps_size: ClassVar[bool] = False
    needs_boxes: ClassVar[bool] = True  # its crops depend on the samples' boxes

    def __init__(
        self,
        min_scale: float = 0.3,
        max_scale: float = 1.0,
        min_aspect_ratio: float = 0.5,
        max_aspect_ratio: float = 2.0,
        sampler_options: Sequence[float] = IOU_OPTIONS,
    ) -> None:
        scale = check_range((min_scale, max_scale), "min_scale, max_scale", 0.0, 1.0)
        if scale[0] <= 0:
            raise ValueError(f"min_scale must be in (0, 1], got {min_scale!r}")
        aspect = check_range(
            (min_aspect_ratio, max_aspect_ratio), "min_aspect_ratio, max_aspect_ratio", 0, math.inf
        )
        if aspect[0] <= 0:
            raise ValueError(f"min_aspect_ratio must be > 0, got {min_aspect_ratio!r}")
        if not isinstance(sampler_options, tuple | list) or not all(
            is_number(option) for option in sampler_options
        ):
            raise TypeError(
                f"sampler_options must be a sequence of numbers, got {sampler_options!r}"
            )
        if not sampler_options or min(sampler_options) < 0:
            raise ValueError(
                f"sampler_options must be one or more IoU thresholds >= 0, got {sampler_options!r}"
            )
        frozen_set(
            self,
            min_scale=scale[0],
            max_scale=scale[1],
            min_aspect_ratio=aspect[0],
            max_aspect_ratio=aspect[1],
            sampler_options=tuple(float(option) for option in sampler_options),
        )

    def output_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        """``None``: each sample's crop has its own size."""
        return None

    def crops(
        self,
        heights: np.ndarray,
        widths: np.ndarray,
        boxes: Sequence[np.ndarray],
        draws: np.ndarray,
    ) -> np.ndarray:
        """The crop of each image of ``(B,)`` heights and widths holding ``boxes`` (``B``
        arrays ``(N_i, 4)`` xyxy pixels) from ``(B, draws_per_sample)`` uniforms:
        ``(B, 4)`` int64 ``(top, left, height, width)``."""
        return iou_crops(
            heights,
            widths,
            boxes,
            options=self.sampler_options,
            scale=(self.min_scale, self.max_scale),
            ratio=(self.min_aspect_ratio, self.max_aspect_ratio),
            draws=draws,
        )


@dataclass(frozen=True, init=False)
class Letterbox(Operation):
    """Resize each image by one factor so that it fits ``size`` (the longer side, relative
    to the output's, fills it), centre it and pad the rest with ``fill`` (YOLO's
    letterbox; masks are padded with 0).

    The resized sides are the input's times the factor, rounded to the nearest pixel;
    the image sits at ``top = (height - h) // 2``, ``left = (width - w) // 2``.

    Args:
        size: Output ``(height, width)``, or one int for a square.
        fill: Padding value, one int for every channel or one per channel (default 114,
            YOLO's grey).

    Raises:
        TypeError: ``size`` or ``fill`` of the wrong type.
        ValueError: A side below 1, or a fill outside [0, 255].
    """

    size: tuple[int, int]
    fill: tuple[int, ...]

    reads_only: ClassVar[bool] = True
    keeps_size: ClassVar[bool] = False

    def __init__(
        self, size: int | Sequence[int], fill: int | Sequence[int] = LETTERBOX_FILL
    ) -> None:
        frozen_set(self, size=parse_size(size), fill=check_fill(fill))

    def output_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        """``size``."""
        return self.size

    def layout(self, heights: np.ndarray, widths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where images of ``(B,)`` heights and widths land: ``(B, 4)`` int64 placements in
        output pixels and ``(B, 4)`` float64 crops in input pixels (see
        :func:`fastdata._iou_crop.letterbox_layout`)."""
        return letterbox_layout(heights, widths, self.size)
