"""Boxes on the device: the torch twins of :mod:`fastdata._boxes` (place, clip, drop) and
of :mod:`fastdata._iou_crop`'s IoU crop rule, batched and free of host syncs.

A batch's boxes travel as :class:`PaddedBoxes`: ``(B, max_N, 4)`` float32 xyxy plus a
``(B, max_N)`` bool ``valid`` mask, on the images' device. A dropped box is marked
invalid rather than removed, so every per-box field padded the same way (labels, crowd
flags) stays aligned without a gather, and no step needs the new counts on the host (a
list of tensors would: its lengths are host ints, and cutting it per sample launches a
kernel per sample). :func:`compact` moves the valid boxes first once, when a model wants
``counts``; :meth:`PaddedBoxes.to_list` gives per-sample tensors (one sync).

The arithmetic follows the NumPy modules operation for operation in float64, so the same
draws give the same crops and, within float32 rounding, the same boxes on every executor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from fastdata._boxes import DEFAULT_MIN_SIZE, DEFAULT_MIN_VISIBILITY
from fastdata._iou_crop import DRAWS_PER_IOU_CROP, DRAWS_PER_IOU_TRIAL, IOU_TRIALS
from fastdata._transfer import copy_to_device


class PaddedBoxes(NamedTuple):
    """A batch's boxes, padded.

    Attributes:
        boxes: ``(B, max_N, 4)`` float32 xyxy in pixels (padding rows are arbitrary).
        valid: ``(B, max_N)`` bool: which rows are boxes.
    """

    boxes: torch.Tensor
    valid: torch.Tensor

    @property
    def counts(self) -> torch.Tensor:
        """``(B,)`` int64 valid boxes per sample (on the device)."""
        return self.valid.sum(dim=1)

    @classmethod
    def from_list(
        cls, boxes: Sequence[torch.Tensor | np.ndarray], device: torch.device | str | None = None
    ) -> PaddedBoxes:
        """Pad ``B`` arrays ``(N_i, 4)`` (tensors or NumPy) into one batch on ``device``."""
        tensors = [torch.as_tensor(item, dtype=torch.float32).reshape(-1, 4) for item in boxes]
        longest = max((len(item) for item in tensors), default=0)
        padded = torch.zeros(len(tensors), longest, 4, dtype=torch.float32)
        valid = torch.zeros(len(tensors), longest, dtype=torch.bool)
        for k, item in enumerate(tensors):
            padded[k, : len(item)] = item.cpu()
            valid[k, : len(item)] = True
        target = torch.device(device) if device is not None else torch.device("cpu")
        return cls(copy_to_device(padded, target), copy_to_device(valid, target))

    def to_list(self) -> list[torch.Tensor]:
        """The valid boxes of each sample, ``B`` tensors ``(K_i, 4)`` (syncs once)."""
        return [rows[keep] for rows, keep in zip(self.boxes, self.valid, strict=True)]


def compact(
    padded: PaddedBoxes, *fields: torch.Tensor
) -> tuple[PaddedBoxes, torch.Tensor, tuple[torch.Tensor, ...]]:
    """Move each sample's valid boxes (and the same rows of ``fields``, each ``(B, max_N,
    ...)``) to the front, in their order: ``(boxes, counts, fields)``, no host sync."""
    order = torch.argsort((~padded.valid).to(torch.int8), dim=1, stable=True)
    boxes = torch.gather(padded.boxes, 1, order[..., None].expand(-1, -1, 4))
    valid = torch.gather(padded.valid, 1, order)
    moved = tuple(
        torch.gather(
            field, 1, order.view(*order.shape, *([1] * (field.dim() - 2))).expand_as(field)
        )
        for field in fields
    )
    return PaddedBoxes(boxes, valid), valid.sum(dim=1), moved


def place(
    padded: PaddedBoxes, crops: torch.Tensor, out_size: tuple[int, int], flips: torch.Tensor | None
) -> PaddedBoxes:
    """Map boxes through each sample's crop ``(B, 4)`` ``(top, left, height, width)``
    (input pixels, float), a resize to ``out_size`` and optional ``(B,)`` bool flips;
    not clipped (:func:`fastdata._boxes.place_box_batch`)."""
    rows = crops.to(torch.float64)[:, None, :]
    out_h, out_w = float(out_size[0]), float(out_size[1])
    boxes = padded.boxes.to(torch.float64)
    scale_x, scale_y = out_w / rows[..., 3], out_h / rows[..., 2]
    x1 = (boxes[..., 0] - rows[..., 1]) * scale_x
    x2 = (boxes[..., 2] - rows[..., 1]) * scale_x
    y1 = (boxes[..., 1] - rows[..., 0]) * scale_y
    y2 = (boxes[..., 3] - rows[..., 0]) * scale_y
    if flips is not None:
        mirrored = flips.to(torch.bool)[:, None]
        x1, x2 = torch.where(mirrored, out_w - x2, x1), torch.where(mirrored, out_w - x1, x2)
    return PaddedBoxes(torch.stack([x1, y1, x2, y2], dim=-1).to(torch.float32), padded.valid)


def flip(padded: PaddedBoxes, width: int, flips: torch.Tensor) -> PaddedBoxes:
    """Mirror the boxes of the ``(B,)`` bool ``flips`` samples in images ``width`` wide."""
    boxes = padded.boxes
    mirrored = torch.stack(
        [width - boxes[..., 2], boxes[..., 1], width - boxes[..., 0], boxes[..., 3]], -1
    )
    return PaddedBoxes(
        torch.where(flips.to(torch.bool)[:, None, None], mirrored, boxes), padded.valid
    )


def sanitize(
    padded: PaddedBoxes,
    out_size: tuple[int, int],
    min_size: float = DEFAULT_MIN_SIZE,
    min_visibility: float = DEFAULT_MIN_VISIBILITY,
) -> PaddedBoxes:
    """Clip to ``[0, W] x [0, H]`` and mark invalid the boxes
    :func:`fastdata._boxes.sanitize_boxes` drops (areas before clipping: the boxes' own)."""
    boxes = padded.boxes
    out_h, out_w = float(out_size[0]), float(out_size[1])
    widths = (boxes[..., 2] - boxes[..., 0]).clamp(min=0)
    heights = (boxes[..., 3] - boxes[..., 1]).clamp(min=0)
    mapped = widths * heights
    finite = torch.isfinite(boxes).all(dim=-1)
    x1, y1, x2, y2 = torch.nan_to_num(boxes).clamp(min=0).unbind(dim=-1)
    clipped = torch.stack(
        [x1.clamp(max=out_w), y1.clamp(max=out_h), x2.clamp(max=out_w), y2.clamp(max=out_h)], -1
    )
    clipped_w = clipped[..., 2] - clipped[..., 0]
    clipped_h = clipped[..., 3] - clipped[..., 1]
    keep = (
        padded.valid
        & finite
        & (clipped_w >= min_size)
        & (clipped_h >= min_size)
        & (clipped_w > 0)
        & (clipped_h > 0)
        & (clipped_w * clipped_h >= min_visibility * mapped)
    )
    return PaddedBoxes(clipped, keep)


def iou_crops(
    heights: torch.Tensor,
    widths: torch.Tensor,
    padded: PaddedBoxes,
    draws: torch.Tensor,
    *,
    options: tuple[float, ...],
    scale: tuple[float, float],
    ratio: tuple[float, float],
) -> torch.Tensor:
    """:func:`fastdata._iou_crop.iou_crops` on the device for padded boxes: ``(B, 4)``
    int64 crops ``(top, left, height, width)`` from ``(B, DRAWS_PER_IOU_CROP)`` float64
    draws, same rule, same arithmetic."""
    count = len(draws)
    if draws.shape != (count, DRAWS_PER_IOU_CROP):
        raise ValueError(f"draws must be ({count}, {DRAWS_PER_IOU_CROP}), got {tuple(draws.shape)}")
    picks = torch.clamp((draws[:, 0] * len(options)).to(torch.int64), max=len(options) - 1)
    option_values = copy_to_device(torch.tensor(options, dtype=torch.float64), draws.device)
    thresholds = option_values[picks]
    heights = heights.to(torch.int64)[:, None]
    widths = widths.to(torch.int64)[:, None]
    trials = draws[:, 1:].reshape(count, IOU_TRIALS, DRAWS_PER_IOU_TRIAL)
    low, high = scale
    crop_w = (widths * (low + (high - low) * trials[..., 0])).to(torch.int64)
    crop_h = (heights * (low + (high - low) * trials[..., 1])).to(torch.int64)
    left = ((widths - crop_w) * trials[..., 2]).to(torch.int64)
    top = ((heights - crop_h) * trials[..., 3]).to(torch.int64)
    aspect = crop_w / crop_h.clamp(min=1)
    shaped = (crop_w > 0) & (crop_h > 0) & (aspect >= ratio[0]) & (aspect <= ratio[1])
    # (B, N, T): every box against every trial of its sample
    boxes = padded.boxes.to(torch.float64)[:, :, None, :]
    top_f, left_f = top[:, None].to(torch.float64), left[:, None].to(torch.float64)
    bottom, right = top_f + crop_h[:, None], left_f + crop_w[:, None]
    x1, y1, x2, y2 = boxes.unbind(dim=-1)
    centre_x, centre_y = (x1 + x2) / 2, (y1 + y2) / 2
    inside = (centre_x > left_f) & (centre_x < right) & (centre_y > top_f) & (centre_y < bottom)
    inside &= padded.valid[:, :, None]
    overlap = (torch.minimum(x2, right) - torch.maximum(x1, left_f)).clamp(min=0) * (
        torch.minimum(y2, bottom) - torch.maximum(y1, top_f)
    ).clamp(min=0)
    union = (x2 - x1) * (y2 - y1) + (crop_h * crop_w)[:, None].to(torch.float64) - overlap
    iou = torch.where(inside, overlap / union.clamp(min=1e-12), torch.full_like(overlap, -1.0))
    best = iou.amax(dim=1) if iou.shape[1] else torch.full_like(aspect, -1.0)
    empty = ~padded.valid.any(dim=1, keepdim=True)
    good = shaped & (empty | ((best >= 0) & (best >= thresholds[:, None])))
    good &= (thresholds < 1.0)[:, None]
    first = torch.argmax(good.to(torch.int8), dim=1)
    rows = torch.arange(count, device=draws.device)
    chosen = torch.stack([top, left, crop_h, crop_w], dim=-1)[rows, first]
    whole = torch.stack([torch.zeros_like(heights), torch.zeros_like(widths), heights, widths], -1)
    return torch.where(good.any(dim=1, keepdim=True), chosen, whole[:, 0])


def as_padded(value: object) -> PaddedBoxes | None:
    """A field's value as :class:`PaddedBoxes` when it is one, or a ``(padded, counts)``
    pair of tensors (what ``ragged="padded"`` collates): ``(B, max_N, 4)`` and ``(B,)``;
    else ``None`` (a list of per-sample tensors, moved on the host)."""
    if isinstance(value, PaddedBoxes):
        return value
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(item, torch.Tensor) for item in value)
        and value[0].dim() == 3
        and value[0].shape[-1] == 4
        and value[1].dim() == 1
    ):
        padded, counts = value
        rows = torch.arange(padded.shape[1], device=padded.device)
        return PaddedBoxes(padded, rows[None, :] < counts[:, None])
    return None


def move_padded(
    padded: PaddedBoxes,
    *,
    crops: torch.Tensor,
    offsets: torch.Tensor,
    resized: torch.Tensor,
    out_size: tuple[int, int],
    flips: torch.Tensor,
    min_size: float = DEFAULT_MIN_SIZE,
    min_visibility: float = DEFAULT_MIN_VISIBILITY,
) -> PaddedBoxes:
    """The device twin of :func:`fastdata._fields.move_boxes`: map through
    ``crops`` (``(B, 4)`` float input region the whole canvas shows, as
    ``Geometry.box_crops``), clip to the resized image placed at ``offsets`` (``(B, 2)``
    top, left) with sides ``resized`` (``(B, 2)``), drop by the rule, flip the canvas
    where ``flips``; every part on the boxes' device."""
    placed = place(padded, crops, out_size, None)
    shift = offsets.to(torch.float32).flip(1).repeat(1, 2)[:, None, :]  # (left, top) twice
    local = PaddedBoxes(placed.boxes - shift, placed.valid)
    boxes = local.boxes
    widths = (boxes[..., 2] - boxes[..., 0]).clamp(min=0)
    heights = (boxes[..., 3] - boxes[..., 1]).clamp(min=0)
    mapped = widths * heights
    limits = resized.to(torch.float32).flip(1).repeat(1, 2)[:, None, :]  # (w, h) twice
    clipped = torch.minimum(torch.nan_to_num(boxes).clamp(min=0), limits)
    clipped_w = clipped[..., 2] - clipped[..., 0]
    clipped_h = clipped[..., 3] - clipped[..., 1]
    keep = (
        padded.valid
        & torch.isfinite(boxes).all(dim=-1)
        & (clipped_w >= min_size)
        & (clipped_h >= min_size)
        & (clipped_w > 0)
        & (clipped_h > 0)
        & (clipped_w * clipped_h >= min_visibility * mapped)
    )
    canvas = clipped + shift
    moved = flip(PaddedBoxes(canvas, keep), out_size[1], flips.to(canvas.device))
    return moved


def repack(values: dict[str, object], roles: dict[str, str], name: str, moved: PaddedBoxes) -> None:
    """Write the moved boxes of field ``name`` back in its form, valid rows first, and move
    the rows of its padded companions (``box_labels`` and per-box ``other`` fields given
    as ``(padded, counts)`` pairs of the same ``(B, max_N)``) alike; counts stay on the
    device."""
    given = values[name]
    companions = [
        other
        for other, value in values.items()
        if other != name
        and roles.get(other) in ("box_labels", "other")
        and isinstance(value, tuple)
        and len(value) == 2
        and isinstance(value[0], torch.Tensor)
        and value[0].shape[:2] == moved.boxes.shape[:2]
    ]
    fields = [values[other][0] for other in companions]  # type: ignore[index]
    packed, counts, moved_fields = compact(moved, *fields)
    values[name] = packed if isinstance(given, PaddedBoxes) else (packed.boxes, counts)
    for other, field in zip(companions, moved_fields, strict=True):
        values[other] = (field, counts)
