"""CPU kernels of the detection geometry: :class:`RandomIoUCrop` (SSD's crop) and
:class:`Letterbox` (YOLO's resize-and-pad), images and masks moved by OpenCV, boxes by
:mod:`fastdata._boxes` from the same per-sample crop.

Each states its batch's geometry first (:meth:`geometry`: the crop of each sample in
input pixels and the output size), then cuts the pixels and maps the boxes through that
one geometry, so images, masks and boxes never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from typing import NamedTuple

import cv2
import numpy as np

from fastdata import ops
from fastdata._boxes import (
    DEFAULT_MIN_SIZE,
    DEFAULT_MIN_VISIBILITY,
    box_areas,
    place_box_batch,
    sanitize_boxes,
)
from fastdata._crop import parse_size
from fastdata._ops_boxes import IOU_OPTIONS, LETTERBOX_FILL
from fastdata._threads import parallel_for
from fastdata.transforms._base import Images, OpTransform
from fastdata.transforms._geometric import (
    MASK_INTERPOLATION,
    _check_interpolation,
    _output,
    _resize,
    _sizes,
)


class Geometry(NamedTuple):
    """One batch's geometry: where each sample's output comes from.

    Attributes:
        crops: ``(B, 4)`` float64 ``(top, left, height, width)`` in input pixels: the input
            region each output shows (past the image's edges where the output is padding).
        out_sizes: ``(B, 2)`` int64 output ``(height, width)`` of each sample.
    """

    crops: np.ndarray
    out_sizes: np.ndarray


def move_boxes(
    boxes: Sequence[np.ndarray],
    geometry: Geometry,
    min_size: float = DEFAULT_MIN_SIZE,
    min_visibility: float = DEFAULT_MIN_VISIBILITY,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Map each sample's boxes through its crop and output size, clip them to the output
    and drop them by :func:`fastdata._boxes.sanitize_boxes`'s rule.

    Args:
        boxes: ``B`` arrays ``(N_i, 4)`` xyxy in input pixels.
        geometry: The batch's :class:`Geometry`.
        min_size: Smallest clipped side kept, output pixels.
        min_visibility: Smallest kept fraction of a box's mapped area.

    Returns:
        ``(kept, keeps)``: ``B`` float32 ``(K_i, 4)`` boxes in output pixels, and the ``B``
        ``(N_i,)`` bool masks that chose them (to filter per-box fields alike).
    """
    sizes = np.asarray(geometry.out_sizes, np.int64).reshape(-1, 2)
    if len(sizes) and (sizes == sizes[0]).all():  # one output size: the batch in one pass
        out_size = (int(sizes[0, 0]), int(sizes[0, 1]))
        placed = place_box_batch(boxes, geometry.crops, out_size)
        counts = [len(rows) for rows in placed]
        flat = np.concatenate(placed) if placed else np.zeros((0, 4), np.float32)
        clipped, keep = sanitize_boxes(flat, out_size, min_size, min_visibility, box_areas(flat))
        splits = np.cumsum(counts)[:-1]
        keeps = np.split(keep, splits)
        pieces = np.split(clipped, splits)
        return [rows[mask] for rows, mask in zip(pieces, keeps, strict=True)], keeps
    kept: list[np.ndarray] = []
    keeps = []
    for k, sample in enumerate(boxes):
        out_size = (int(sizes[k, 0]), int(sizes[k, 1]))
        placed_one = place_box_batch([sample], geometry.crops[k : k + 1], out_size)[0]
        clipped, keep = sanitize_boxes(
            placed_one, out_size, min_size, min_visibility, box_areas(placed_one)
        )
        kept.append(clipped[keep])
        keeps.append(keep)
    return kept, keeps


def _no_boxes(count: int) -> list[np.ndarray]:
    return [np.zeros((0, 4), np.float32)] * count


class RandomIoUCrop(OpTransform):
    """Crop each image so that a box stays mostly inside (SSD's sampler, as
    ``torchvision.transforms.v2.RandomIoUCrop``), no resize: the CPU kernel of
    :class:`fastdata.ops.RandomIoUCrop`, which states the rule.

    Args:
        min_scale: Smallest side fraction of the crop.
        max_scale: Largest side fraction of the crop.
        min_aspect_ratio: Smallest crop width / height.
        max_aspect_ratio: Largest crop width / height.
        sampler_options: IoU thresholds to pick from (``1.0``: no crop).
        seed: See :class:`~fastdata.transforms.BatchTransform`.
        size: ``None`` (default): each crop as cut, a list; or an output ``(height,
            width)`` (one int: a square) each crop is resized to in the same pass (what
            ``Compose([RandomIoUCrop(), Resize(size)])`` gives, without the copy between).
        interpolation: With ``size``: ``None`` for the antialiased kernel, or an OpenCV
            ``INTER_*`` flag.

    Input ``(B, H, W, C)`` uint8 or a list of ``(H, W, C)`` uint8; output a list of
    ``(h_i, w_i, C)`` uint8 crops (contiguous copies), or ``(B, height, width, C)`` with
    ``size``; masks alike (nearest-neighbour). Its crops depend on the boxes
    (:meth:`geometry`); given none, each image counts as one without boxes.
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

    def geometry(
        self, heights: np.ndarray, widths: np.ndarray, boxes: Sequence[np.ndarray] | None = None
    ) -> Geometry:
        """This batch's crops, from this transform's draws (one draw per batch).

        Args:
            heights: ``(B,)`` image heights.
            widths: ``(B,)`` image widths.
            boxes: ``B`` arrays ``(N_i, 4)`` xyxy pixels, or ``None`` for none.
        """
        count = len(heights)
        draws = self.uniform(count, self.op.draws_per_sample)
        given = boxes if boxes is not None else _no_boxes(count)
        crops = self.op.crops(heights, widths, given, draws)
        out_sizes = crops[:, 2:].copy() if self.size is None else np.tile(self.size, (count, 1))
        return Geometry(crops.astype(np.float64), out_sizes.astype(np.int64))

    def apply_boxes(
        self,
        images: Images,
        masks: Sequence[Images],
        boxes: Sequence[np.ndarray],
        executor: Executor | None,
        tasks: int,
        *,
        out: np.ndarray | None = None,
    ) -> tuple[Images, list[Images], Geometry]:
        """Crop (and with ``size`` resize) images and masks from crops drawn for
        ``boxes`` (``B`` arrays ``(N_i, 4)`` xyxy pixels); returns them and the batch's
        :class:`Geometry`, which :func:`move_boxes` moves the boxes through."""
        heights, widths = _sizes(images)
        geometry = self.geometry(heights, widths, boxes)
        if self.size is None:
            cut, cut_masks = self.cut(images, masks, geometry, executor, tasks)
            return cut, cut_masks, geometry
        resized, resized_masks = self._cut_resized(images, masks, geometry, executor, tasks, out)
        return resized, resized_masks, geometry

    def apply_all(
        self,
        images: Images,
        masks: Sequence[Images],
        executor: Executor | None,
        tasks: int,
        out: np.ndarray | None = None,  # never given: writes_out is False
    ) -> tuple[Images, list[Images]]:
        moved, moved_masks, _ = self.apply_boxes(
            images, masks, _no_boxes(len(images)), executor, tasks, out=out
        )
        return moved, moved_masks

    def _cut_resized(  # noqa: PLR0917
        self,
        images: Images,
        masks: Sequence[Images],
        geometry: Geometry,
        executor: Executor | None,
        tasks: int,
        out: np.ndarray | None,
    ) -> tuple[Images, list[Images]]:
        """Each crop resized to ``size`` into ``out`` (or a new batch), masks alike."""
        out_h, out_w = self.size or (1, 1)  # set: only called with a size
        rows = geometry.crops.astype(np.int64).tolist()
        out = _output(images, out_h, out_w, out)
        mask_outs = [_output(mask, out_h, out_w) for mask in masks]

        def body(start: int, stop: int) -> None:
            for k in range(start, stop):
                top, left, height, width = rows[k]
                crop = images[k][top : top + height, left : left + width]
                _resize(crop, out_w, out_h, out[k], self.interpolation)
                for mask, mask_out in zip(masks, mask_outs, strict=True):
                    window = mask[k][top : top + height, left : left + width]
                    cv2.resize(
                        window, (out_w, out_h), dst=mask_out[k], interpolation=MASK_INTERPOLATION
                    )

        parallel_for(executor, len(images), body, tasks=tasks)
        return out, list(mask_outs)

    @staticmethod
    def cut(
        images: Images,
        masks: Sequence[Images],
        geometry: Geometry,
        executor: Executor | None,
        tasks: int,
    ) -> tuple[Images, list[Images]]:
        """Cut each sample's crop of ``geometry`` out of the images and masks."""
        rows = geometry.crops.astype(np.int64).tolist()
        batches = [images, *masks]
        outputs: list[list[np.ndarray]] = [[None] * len(images) for _ in batches]  # type: ignore[list-item]

        def body(start: int, stop: int) -> None:
            for k in range(start, stop):
                top, left, height, width = rows[k]
                for batch, output in zip(batches, outputs, strict=True):
                    output[k] = np.ascontiguousarray(
                        batch[k][top : top + height, left : left + width]
                    )

        parallel_for(executor, len(images), body, tasks=tasks)
        cut_masks: list[Images] = list(outputs[1:])
        return outputs[0], cut_masks


class Letterbox(OpTransform):
    """Resize each image by one factor to fit ``size``, centre it and pad the rest (YOLO's
    letterbox): the CPU kernel of :class:`fastdata.ops.Letterbox`.

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
        self.interpolation = interpolation

    @property
    def size(self) -> tuple[int, int]:
        """Output ``(height, width)``."""
        return self.op.size

    def geometry(
        self, heights: np.ndarray, widths: np.ndarray, boxes: Sequence[np.ndarray] | None = None
    ) -> Geometry:
        """This batch's layout (no draws; ``boxes`` are not needed)."""
        _, crops = self.op.layout(heights, widths)
        return Geometry(crops, np.tile(np.array(self.size, np.int64), (len(heights), 1)))

    def apply_all(
        self,
        images: Images,
        masks: Sequence[Images],
        executor: Executor | None,
        tasks: int,
        out: np.ndarray | None = None,
    ) -> tuple[Images, list[Images]]:
        heights, widths = _sizes(images)
        placements = self.op.layout(heights, widths)[0].tolist()
        out_h, out_w = self.size
        out = _output(images, out_h, out_w, out)
        mask_outs = [_output(mask, out_h, out_w) for mask in masks]
        channels = out.shape[3] if out.ndim == 4 else 1
        fill = self.op.fill * channels if len(self.op.fill) == 1 else self.op.fill
        if len(fill) != channels:
            raise ValueError(f"fill {self.op.fill} does not match images of {channels} channels")
        fill_value = np.array(fill, np.uint8)

        def body(start: int, stop: int) -> None:
            for k in range(start, stop):
                top, left, height, width = placements[k]
                _pad(out[k], placements[k], fill_value)
                _resize(
                    images[k],
                    width,
                    height,
                    out[k][top : top + height, left : left + width],
                    self.interpolation,
                )
                for mask, mask_out in zip(masks, mask_outs, strict=True):
                    _pad(mask_out[k], placements[k], np.uint8(0))
                    window = mask_out[k][top : top + height, left : left + width]
                    window[...] = cv2.resize(
                        mask[k], (width, height), interpolation=MASK_INTERPOLATION
                    )

        parallel_for(executor, len(images), body, tasks=tasks)
        return out, list(mask_outs)


def _pad(image: np.ndarray, placement: Sequence[int], fill: np.ndarray | np.uint8) -> None:
    """Fill the four bands of ``image`` around the window ``placement``, ``(top, left,
    height, width)``."""
    top, left, height, width = placement
    image[:top] = fill
    image[top + height :] = fill
    image[top : top + height, :left] = fill
    image[top : top + height, left + width :] = fill
