"""Detection geometry on the device: :class:`DeviceRandomIoUCrop` (SSD's crop, resized to
a fixed size so the batch stays one tensor) and :class:`DeviceLetterbox` (YOLO's
resize-and-pad), images, masks and boxes from one draw.

The draws are the host's (:class:`fastdata._draws.UniformDraws`, as for every executor),
copied to the device. Boxes collated padded (a ``(padded, counts)`` pair, or
:class:`~fastdata.gpu.PaddedBoxes`) stay there: the IoU crop's choice, the resampling grid
and the boxes are computed on the device, without a host sync. Boxes given as lists of
per-sample tensors are moved on the host by the CPU movers, as every device module does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from fastdata import _roles, ops
from fastdata._boxes import DEFAULT_MIN_SIZE, DEFAULT_MIN_VISIBILITY
from fastdata._crop import parse_size
from fastdata._fields import FieldBatch, Geometry, as_field_batch
from fastdata._ops_boxes import IOU_OPTIONS, LETTERBOX_FILL
from fastdata._transfer import copy_to_device
from fastdata.gpu._boxes import PaddedBoxes, as_padded, iou_crops, move_padded, repack
from fastdata.gpu.augment import _channels_last, _check_batches, _SeededModule, _spatial


def _affine(
    crops: torch.Tensor, height: int, width: int, out_size: tuple[int, int]
) -> torch.Tensor:
    """The ``grid_sample`` grid that shows each sample's region ``(top, left, h, w)``
    (input pixels, float, on the device) as an ``out_size`` output (``align_corners=False``)."""
    rows = crops.to(torch.float64)
    top, left, box_h, box_w = rows.unbind(dim=1)
    theta = torch.zeros(len(rows), 2, 3, dtype=torch.float64, device=rows.device)
    theta[:, 0, 0] = box_w / width
    theta[:, 0, 2] = (2 * left + box_w) / width - 1
    theta[:, 1, 1] = box_h / height
    theta[:, 1, 2] = (2 * top + box_h) / height - 1
    return F.affine_grid(theta.float(), [len(rows), 1, *out_size], align_corners=False)


def _resample(
    bchw: torch.Tensor, grid: torch.Tensor, mode: str, fill: torch.Tensor | None
) -> torch.Tensor:
    """``grid_sample`` in float32 (kept for float64), rounded back for integer dtypes;
    outside the input: ``fill`` (per channel), or the edge pixels when ``None``."""
    dtype = bchw.dtype
    work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
    source = bchw.to(work)
    if fill is not None:
        source = source - fill.to(work).view(1, -1, 1, 1)
    out = F.grid_sample(
        source,
        grid.to(work),
        mode=mode,
        padding_mode="border" if fill is None else "zeros",
        align_corners=False,
    )
    if fill is not None:
        out = out + fill.to(work).view(1, -1, 1, 1)
    if not dtype.is_floating_point:
        out = out.round_() if mode == "bilinear" else out
        info = torch.iinfo(dtype)
        out = out.clamp_(info.min, info.max)
    return out.to(dtype)


class _DeviceGeometry(_SeededModule):
    """Resamples images and masks to the regions of one batch (``(B, 4)`` on the device)."""

    size: tuple[int, int]

    def _warp(
        self,
        images: torch.Tensor,
        masks: list[torch.Tensor],
        regions: torch.Tensor,
        fill: torch.Tensor | None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        _check_batches(images, masks, self.layout)
        bchw = images.permute(0, 3, 1, 2) if self.layout == "HWC" else images
        height, width = bchw.shape[2:]
        grid = _affine(regions, height, width, self.size)
        out = _resample(bchw, grid, "bilinear", fill)
        if self.layout == "HWC":
            out = out.permute(0, 2, 3, 1).contiguous()
        elif _channels_last(images):
            out = out.contiguous(memory_format=torch.channels_last)
        moved = []
        for mask in masks:
            mask_bchw = mask.unsqueeze(1) if mask.dim() == 3 else mask
            if mask.dim() == 4 and self.layout == "HWC":
                mask_bchw = mask.permute(0, 3, 1, 2)
            zero = None if fill is None else torch.zeros(mask_bchw.shape[1], device=mask.device)
            out_mask = _resample(mask_bchw, grid, "nearest", zero)
            if mask.dim() == 3:
                out_mask = out_mask.squeeze(1)
            elif self.layout == "HWC":
                out_mask = out_mask.permute(0, 2, 3, 1).contiguous()
            moved.append(out_mask)
        return out, moved

    def _set_box_rule(self, min_size: float, min_visibility: float) -> None:
        if not min_size >= 0:
            raise ValueError(f"min_size must be >= 0 pixels, got {min_size!r}")
        if not 0 <= min_visibility <= 1:
            raise ValueError(f"min_visibility must be in [0, 1], got {min_visibility!r}")
        self.min_box_size, self.min_box_visibility = float(min_size), float(min_visibility)


class DeviceRandomIoUCrop(_DeviceGeometry):
    """SSD's crop of each sample, resized to ``size`` (bilinear, no antialiasing): the
    device kernel of :class:`fastdata.ops.RandomIoUCrop` (which states the rule) followed
    by a resize, so the batch stays one tensor. Boxes are placed, clipped and dropped by
    :func:`fastdata._boxes.sanitize_boxes`'s rule, with their box labels.

    Args:
        min_scale: Smallest side fraction of the crop.
        max_scale: Largest side fraction of the crop.
        min_aspect_ratio: Smallest crop width / height.
        max_aspect_ratio: Largest crop width / height.
        sampler_options: IoU thresholds to pick from (``1.0``: no crop).
        size: Output ``(height, width)`` (or one int); required.
        min_size: Smallest clipped box side kept, output pixels.
        min_visibility: Smallest kept fraction of a box's area.
        layout: ``"CHW"`` or ``"HWC"``.
        seed: Seed of the draws (see :class:`~fastdata.gpu.DeviceRandomResizedCrop`).

    Raises:
        TypeError, ValueError: An argument of the wrong type or out of range.
    """

    op_type = ops.RandomIoUCrop
    op: ops.RandomIoUCrop

    def __init__(
        self,
        min_scale: float = 0.3,
        max_scale: float = 1.0,
        min_aspect_ratio: float = 0.5,
        max_aspect_ratio: float = 2.0,
        sampler_options: Sequence[float] = IOU_OPTIONS,
        *,
        size: int | Sequence[int],
        min_size: float = DEFAULT_MIN_SIZE,
        min_visibility: float = DEFAULT_MIN_VISIBILITY,
        layout: str = "CHW",
        seed: int | None = None,
    ) -> None:
        op = ops.RandomIoUCrop(
            min_scale, max_scale, min_aspect_ratio, max_aspect_ratio, sampler_options
        )
        super().__init__(op, layout, seed)
        self.size = parse_size(size)
        self._set_box_rule(min_size, min_visibility)
        self._host_boxes: list[np.ndarray] | None = None

    def crops(self, images: torch.Tensor, boxes: PaddedBoxes | None) -> torch.Tensor:
        """This batch's crops ``(B, 4)`` int64 ``(top, left, height, width)`` on the
        images' device, from padded boxes there (draws once; no host sync)."""
        count = images.shape[0]
        height, width = _spatial(images, self.layout)
        draws = copy_to_device(torch.from_numpy(self._uniform(count)), images.device)
        if boxes is None:
            empty = torch.zeros((count, 0, 4), dtype=torch.float32, device=images.device)
            boxes = PaddedBoxes(empty, torch.zeros(count, 0, dtype=torch.bool, device=empty.device))
        op = self.op
        return iou_crops(
            torch.full((count,), height, device=images.device),
            torch.full((count,), width, device=images.device),
            boxes,
            draws,
            options=op.sampler_options,
            scale=(op.min_scale, op.max_scale),
            ratio=(op.min_aspect_ratio, op.max_aspect_ratio),
        )

    def _prepare(self, batch: FieldBatch) -> None:
        names = batch.names(_roles.BOXES)
        if not names:
            self._host_boxes = None
            return
        self._host_boxes = [
            np.asarray(
                rows.detach().cpu().numpy() if isinstance(rows, torch.Tensor) else rows,
                np.float32,
            ).reshape(-1, 4)
            for rows in batch.values[names[0]]
        ]

    def _move(
        self, images: torch.Tensor, masks: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], Geometry]:
        """Boxes as lists (read by :meth:`_prepare`): crops drawn on the host, where those
        boxes are moved."""
        count = images.shape[0]
        height, width = _spatial(images, self.layout)
        boxes = self._host_boxes or [np.zeros((0, 4), np.float32)] * count
        self._host_boxes = None
        draws = self._uniform(count)
        crops = self.op.crops(np.full(count, height), np.full(count, width), boxes, draws)
        regions = copy_to_device(torch.from_numpy(crops.astype(np.float64)), images.device)
        out, moved = self._warp(images, masks, regions, None)
        sizes = np.tile(np.array(self.size, np.int64), (count, 1))
        return out, moved, Geometry.of(crops, sizes)

    def forward(
        self,
        images: torch.Tensor | FieldBatch | Mapping[str, Any],
        masks: torch.Tensor | None = None,
        boxes: PaddedBoxes | None = None,
        roles: Mapping[str, str] | None = None,
    ) -> Any:
        """Crop and resize every sample.

        Args:
            images: 4-D batch in the module's layout (float or uint8), or a batch of
                fields with roles (a :class:`~fastdata.transforms.FieldBatch`, or a dict
                and ``roles``) whose boxes are padded pairs or lists of tensors.
            masks: Optional ``(B, H, W)`` or 4-D masks, moved nearest-neighbour.
            boxes: Optional :class:`~fastdata.gpu.PaddedBoxes` on the images' device.
            roles: The roles of a dict batch's fields.

        Returns:
            For a tensor: the images (``size``, same layout and dtype), then the masks and
            the boxes when given (clipped, dropped ones invalid). For a batch of fields: a
            :class:`~fastdata.transforms.FieldBatch`.
        """
        if isinstance(images, FieldBatch | Mapping):
            batch = as_field_batch(images, roles)
            names = batch.names(_roles.BOXES)
            if names and as_padded(batch.values[names[0]]) is None:
                return self._forward_fields(batch, None)  # lists: moved on the host
            return self._forward_padded(batch)
        _check_boxes(images, boxes)
        crops = self.crops(images, boxes)
        out, moved = self._warp(images, [] if masks is None else [masks], crops, None)
        result: list[Any] = [out, *moved]
        if boxes is not None:
            result.append(self._move_crops(boxes, crops))
        return result[0] if len(result) == 1 else tuple(result)

    def _move_crops(self, boxes: PaddedBoxes, crops: torch.Tensor) -> PaddedBoxes:
        count = crops.shape[0]
        sides = [torch.full((count,), side, device=crops.device) for side in self.size]
        sizes = torch.stack(sides, dim=1)  # filled there: no copy from the host
        return move_padded(
            boxes,
            crops=crops.to(torch.float64),
            offsets=torch.zeros_like(sizes),
            resized=sizes,
            out_size=self.size,
            flips=torch.zeros(count, dtype=torch.bool, device=crops.device),
            min_size=self.min_box_size,
            min_visibility=self.min_box_visibility,
        )

    def _forward_padded(self, batch: FieldBatch) -> FieldBatch:
        """Every box field padded on the device: crops drawn there from the first."""
        images = batch.names(_roles.IMAGE)
        if len(images) != 1:
            raise ValueError(f"{self!r} moves exactly one image field, got {images}")
        names = batch.names(_roles.BOXES)
        padded = [as_padded(batch.values[name]) for name in names]
        if any(item is None for item in padded):
            raise ValueError(f"{self!r}: give every boxes field padded, or every one as lists")
        image = batch.values[images[0]]
        crops = self.crops(image, padded[0] if padded else None)
        masks = batch.names(_roles.MASK)
        out, moved = self._warp(image, [batch.values[name] for name in masks], crops, None)
        values = dict(batch.values)
        values[images[0]] = out
        values.update(zip(masks, moved, strict=True))
        for name, item in zip(names, padded, strict=True):
            repack(values, batch.roles, name, self._move_crops(item, crops))  # type: ignore[arg-type]
        return FieldBatch(values, dict(batch.roles))


class DeviceLetterbox(_DeviceGeometry):
    """Resize each sample by one factor to fit ``size``, centre it and pad with ``fill``:
    the device kernel of :class:`fastdata.ops.Letterbox` (bilinear, no antialiasing;
    masks nearest, padded with 0). Boxes are scaled and shifted.

    Args:
        size: Output ``(height, width)``, or one int for a square.
        fill: Padding value (int or one per channel; default 114).
        layout: ``"CHW"`` or ``"HWC"``.
    """

    op_type = ops.Letterbox
    op: ops.Letterbox

    def __init__(
        self,
        size: int | Sequence[int],
        fill: int | Sequence[int] = LETTERBOX_FILL,
        *,
        layout: str = "CHW",
    ) -> None:
        super().__init__(ops.Letterbox(size, fill), layout, None)
        self.size = self.op.size

    def _move(
        self, images: torch.Tensor, masks: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], Geometry]:
        count = images.shape[0]
        height, width = _spatial(images, self.layout)
        channels = images.shape[3] if self.layout == "HWC" else images.shape[1]
        placements, regions = self.op.layout(np.full(count, height), np.full(count, width))
        fill = self.op.fill * channels if len(self.op.fill) == 1 else self.op.fill
        if len(fill) != channels:
            raise ValueError(f"fill {self.op.fill} does not match images of {channels} channels")
        fill_values = copy_to_device(torch.tensor(fill, dtype=torch.float32), images.device)
        device_regions = copy_to_device(torch.from_numpy(regions), images.device)
        out, moved = self._warp(images, masks, device_regions, fill_values)
        zeros = np.zeros(count, np.int64)
        whole = np.stack([zeros, zeros, np.full(count, height), np.full(count, width)], axis=1)
        sizes = np.tile(np.array(self.size, np.int64), (count, 1))
        geometry = Geometry.of(whole, placements[:, 2:], offsets=placements[:, :2], out_sizes=sizes)
        return out, moved, geometry

    def forward(
        self,
        images: torch.Tensor | FieldBatch | Mapping[str, Any],
        masks: torch.Tensor | None = None,
        boxes: PaddedBoxes | None = None,
        roles: Mapping[str, str] | None = None,
    ) -> Any:
        """Letterbox every sample; arguments and results as
        :meth:`DeviceRandomIoUCrop.forward`."""
        if isinstance(images, FieldBatch | Mapping):
            return self._forward_fields(images, roles)
        _check_boxes(images, boxes)
        out, moved, geometry = self._move(images, [] if masks is None else [masks])
        result: list[Any] = [out, *moved]
        if boxes is not None:
            result.append(self._move_padded(boxes, geometry))
        return result[0] if len(result) == 1 else tuple(result)


def _check_boxes(images: torch.Tensor, boxes: PaddedBoxes | None) -> None:
    if boxes is None:
        return
    if not isinstance(boxes, PaddedBoxes):
        raise TypeError(f"boxes must be a PaddedBoxes, got {type(boxes).__name__}")
    if boxes.boxes.shape[0] != images.shape[0] or boxes.boxes.device != images.device:
        raise ValueError(
            f"boxes of shape {tuple(boxes.boxes.shape)} on {boxes.boxes.device} do not match "
            f"images of shape {tuple(images.shape)} on {images.device}"
        )
