"""CPU executors of the detection geometry: :class:`RandomIoUCrop` (SSD's crop) and
:class:`Letterbox` (YOLO's resize-and-pad).

Both are geometric transforms: each draws one
:class:`~fastdata.transforms.Geometry` per batch and the movers move every field
by its role from it (images, masks nearest-neighbour, boxes clipped and dropped with
their labels), as for the other crops.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor

import numpy as np

from fastdata import _roles, ops
from fastdata._crop import parse_size
from fastdata._fields import FieldBatch, Geometry
from fastdata._ops_boxes import IOU_OPTIONS, LETTERBOX_FILL
from fastdata.transforms._geometric import GeometricTransform, _check_interpolation


def batch_boxes(batch: FieldBatch, count: int) -> list[np.ndarray]:
    """The first boxes field of ``batch`` as ``count`` NumPy ``(N_i, 4)`` arrays (none
    without a boxes field)."""
    names = batch.names(_roles.BOXES)
    if not names:
        return [np.zeros((0, 4), np.float32)] * count
    return [np.asarray(rows, np.float32).reshape(-1, 4) for rows in batch.values[names[0]]]


class RandomIoUCrop(GeometricTransform):
    """Crop each image so that a box stays mostly inside (SSD's sampler, as
    ``torchvision.transforms.v2.RandomIoUCrop``): the CPU executor of
    :class:`fastdata.ops.RandomIoUCrop`, which states the rule. The crop is drawn from the
    batch's boxes (its first field of role ``boxes``; none: any crop of a good shape).

    Args:
        min_scale: Smallest side fraction of the crop.
        max_scale: Largest side fraction of the crop.
        min_aspect_ratio: Smallest crop width / height.
        max_aspect_ratio: Largest crop width / height.
        sampler_options: IoU thresholds to pick from (``1.0``: no crop).
        seed: See :class:`~fastdata.transforms.BatchTransform`.
        size: ``None`` (default): each crop as cut, a list of ``(h_i, w_i, C)``; or an
            output ``(height, width)`` (one int: a square) every crop is resized to in the
            same pass, what ``Compose([RandomIoUCrop(), Resize(size)])`` gives without the
            copy between.
        interpolation: With ``size``: ``None`` for the antialiased kernel, or an OpenCV
            ``INTER_*`` flag.
    """

    op_type = ops.RandomIoUCrop
    op: ops.RandomIoUCrop

    def __init__(  # noqa: PLR0917 - torchvision's positional signature
        self,
        min_scale: float = 0.3,
        max_scale: float = 1.0,
        min_aspect_ratio: float = 0.5,
        max_aspect_ratio: float = 2.0,
        sampler_options: Sequence[float] = IOU_OPTIONS,
        seed: int | None = None,
        *,
        size: int | Sequence[int] | None = None,
        interpolation: int | None = None,
    ) -> None:
        op = ops.RandomIoUCrop(
            min_scale, max_scale, min_aspect_ratio, max_aspect_ratio, sampler_options
        )
        super().__init__(op, seed)
        self.size = None if size is None else parse_size(size)
        self.interpolation = _check_interpolation(interpolation)
        self.writes_out = self.size is not None

    def output_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        """``size`` when given, else ``None`` (each crop has its own)."""
        return self.size

    def crops(
        self, heights: np.ndarray, widths: np.ndarray, boxes: Sequence[np.ndarray]
    ) -> np.ndarray:
        """This batch's crops ``(B, 4)`` int64 ``(top, left, height, width)`` for images of
        ``(B,)`` heights and widths holding ``boxes`` (one draw per batch)."""
        draws = self.uniform(len(heights), self.op.draws_per_sample)
        return self.op.crops(heights, widths, boxes, draws)

    def geometry(self, heights: np.ndarray, widths: np.ndarray, batch: FieldBatch) -> Geometry:
        """The crops drawn for the batch's boxes, resized to ``size`` when given."""
        crops = self.crops(heights, widths, batch_boxes(batch, len(heights)))
        if self.size is None:
            return Geometry.of(crops, crops[:, 2:])
        return Geometry.of(crops, np.tile(np.array(self.size, np.int64), (len(crops), 1)))


class Letterbox(GeometricTransform):
    """Resize each image by one factor to fit ``size``, centre it and pad the rest (YOLO's
    letterbox): the CPU executor of :class:`fastdata.ops.Letterbox`. Boxes are scaled and
    shifted (none is dropped: nothing leaves the output).

    Args:
        size: Output ``(height, width)``, or one int for a square.
        fill: Padding of the images (int or one per channel; default 114); masks are
            padded with 0.
        interpolation: ``None`` (default): the antialiased kernel preprocessing uses, or
            an OpenCV ``INTER_*`` flag.

    Input ``(B, H, W, C)`` uint8 or a list of ``(H, W, C)`` uint8; output
    ``(B, height, width, C)`` uint8.
    """

    op_type = ops.Letterbox
    op: ops.Letterbox
    writes_out = True

    def __init__(
        self,
        size: int | Sequence[int],
        fill: int | Sequence[int] = LETTERBOX_FILL,
        interpolation: int | None = None,
    ) -> None:
        super().__init__(ops.Letterbox(size, fill))
        self.interpolation = _check_interpolation(interpolation)

    @property
    def size(self) -> tuple[int, int]:
        """Output ``(height, width)``."""
        return self.op.size

    @property
    def fill(self) -> tuple[int, ...]:
        """The images' padding value (one, or one per channel)."""
        return self.op.fill

    def geometry(self, heights: np.ndarray, widths: np.ndarray, batch: FieldBatch) -> Geometry:
        """Each image whole, resized to its placement and put at its offset."""
        placements, _ = self.op.layout(heights, widths)
        zeros = np.zeros(len(heights), np.int64)
        whole = np.stack([zeros, zeros, heights, widths], axis=1)
        sizes = np.tile(np.array(self.size, np.int64), (len(heights), 1))
        return Geometry.of(whole, placements[:, 2:], offsets=placements[:, :2], out_sizes=sizes)

    def apply_batch(
        self,
        batch: FieldBatch,
        executor: Executor | None = None,
        tasks: int = 1,
        out: np.ndarray | None = None,
    ) -> FieldBatch:
        """Move every field, then fill the images' padding with ``fill`` (the movers pad
        with 0, what masks keep)."""
        moved = super().apply_batch(batch, executor, tasks, out)
        names = moved.names(_roles.IMAGE)
        if not names or self.fill == (0,):
            return moved
        first = batch.values[names[0]]
        heights = np.array([image.shape[0] for image in first], np.int64)
        widths = np.array([image.shape[1] for image in first], np.int64)
        placements = self.op.layout(heights, widths)[0].tolist()
        for name in names:
            images = moved.values[name]
            channels = images[0].shape[2] if len(images) and images[0].ndim == 3 else 1
            fill = self.fill * channels if len(self.fill) == 1 else self.fill
            if len(fill) != channels:
                raise ValueError(f"fill {self.fill} does not match images of {channels} channels")
            value = np.array(fill, np.uint8)
            for image, (top, left, height, width) in zip(images, placements, strict=True):
                image[:top] = value
                image[top + height :] = value
                image[top : top + height, :left] = value
                image[top : top + height, left + width :] = value
        return moved
