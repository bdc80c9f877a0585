"""Detection geometry on the device: :class:`DeviceRandomIoUCrop` (SSD's crop, resized to
a fixed size so the batch stays one tensor) and :class:`DeviceLetterbox` (YOLO's
resize-and-pad), images, masks and boxes from one draw.

The draws are the host's (:class:`fastdata._draws.UniformDraws`, as for every executor),
copied to the device; the IoU crop's choice, the resampling grid and the boxes are then
computed there from the padded boxes (:class:`~fastdata.gpu._boxes.PaddedBoxes`), so a
batch is transformed without a host sync.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F  # noqa: N812

from fastdata import ops
from fastdata._boxes import DEFAULT_MIN_SIZE, DEFAULT_MIN_VISIBILITY
from fastdata._crop import parse_size
from fastdata._ops_boxes import IOU_OPTIONS, LETTERBOX_FILL
from fastdata._transfer import copy_to_device
from fastdata.gpu._boxes import PaddedBoxes, iou_crops, place, sanitize
from fastdata.gpu.augment import _channels_last, _check_batch, _SeededModule

Moved = torch.Tensor | tuple[torch.Tensor | PaddedBoxes, ...]


def _affine(
    crops: torch.Tensor, height: int, width: int, out_size: tuple[int, int]
) -> torch.Tensor:
    """The ``grid_sample`` grid that shows each sample's crop ``(top, left, h, w)`` (input
    pixels, float, on the device) as an ``out_size`` output (``align_corners=False``)."""
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
    """Runs one batch's crops (``(B, 4)`` on the device) on images, masks and boxes."""

    size: tuple[int, int]
    min_size: float
    min_visibility: float

    def _move(
        self,
        images: torch.Tensor,
        masks: torch.Tensor | None,
        boxes: PaddedBoxes | None,
        crops: torch.Tensor,
        fill: torch.Tensor | None,
    ) -> Moved:
        bchw = images.permute(0, 3, 1, 2) if self.layout == "HWC" else images
        height, width = bchw.shape[2:]
        grid = _affine(crops, height, width, self.size)
        out = _resample(bchw, grid, "bilinear", fill)
        if self.layout == "HWC":
            out = out.permute(0, 2, 3, 1).contiguous()
        elif _channels_last(images):
            out = out.contiguous(memory_format=torch.channels_last)
        moved: list[torch.Tensor | PaddedBoxes] = [out]
        if masks is not None:
            mask_bchw = masks.unsqueeze(1) if masks.dim() == 3 else masks
            if masks.dim() == 4 and self.layout == "HWC":
                mask_bchw = masks.permute(0, 3, 1, 2)
            zero = None if fill is None else torch.zeros(mask_bchw.shape[1], device=masks.device)
            out_masks = _resample(mask_bchw, grid, "nearest", zero)
            if masks.dim() == 3:
                out_masks = out_masks.squeeze(1)
            elif self.layout == "HWC":
                out_masks = out_masks.permute(0, 2, 3, 1).contiguous()
            moved.append(out_masks)
        if boxes is not None:
            placed = place(boxes, crops, self.size, None)
            moved.append(sanitize(placed, self.size, self.min_size, self.min_visibility))
        return moved[0] if len(moved) == 1 else tuple(moved)


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


class DeviceRandomIoUCrop(_DeviceGeometry):
    """SSD's crop of each sample, resized to ``size`` (bilinear, no antialiasing): the
    device kernel of :class:`fastdata.ops.RandomIoUCrop` (which states the rule) followed
    by a resize, so the batch stays one tensor. Boxes are placed, clipped and dropped by
    :func:`fastdata._boxes.sanitize_boxes`'s rule, on the device.

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
        self.min_size, self.min_visibility = float(min_size), float(min_visibility)

    def crops(self, images: torch.Tensor, boxes: PaddedBoxes | None) -> torch.Tensor:
        """This batch's crops ``(B, 4)`` int64 ``(top, left, height, width)`` on the
        images' device (draws once)."""
        count = images.shape[0]
        height, width = (images.shape[1:3]) if self.layout == "HWC" else images.shape[2:4]
        draws = copy_to_device(torch.from_numpy(self._uniform(count)), images.device)
        if boxes is None:
            empty = images.new_zeros((count, 0, 4), dtype=torch.float32)
            boxes = PaddedBoxes(
                empty, torch.zeros(count, 0, dtype=torch.bool, device=images.device)
            )
        full_h = torch.full((count,), int(height), device=images.device)
        full_w = torch.full((count,), int(width), device=images.device)
        op = self.op
        return iou_crops(
            full_h,
            full_w,
            boxes,
            draws,
            options=op.sampler_options,
            scale=(op.min_scale, op.max_scale),
            ratio=(op.min_aspect_ratio, op.max_aspect_ratio),
        )

    def forward(
        self,
        images: torch.Tensor,
        masks: torch.Tensor | None = None,
        boxes: PaddedBoxes | None = None,
    ) -> Moved:
        """Crop and resize every sample.

        Args:
            images: 4-D batch in the module's layout, float or uint8.
            masks: Optional ``(B, H, W)`` or 4-D masks, moved nearest-neighbour.
            boxes: Optional :class:`~fastdata.gpu.PaddedBoxes` on the images' device.

        Returns:
            The images (``size``, same layout and dtype), then the masks and the boxes
            when given (boxes clipped, dropped ones marked invalid).
        """
        _check_batch(images, masks, self.layout)
        _check_boxes(images, boxes)
        return self._move(images, masks, boxes, self.crops(images, boxes), None)


class DeviceLetterbox(_DeviceGeometry):
    """Resize each sample by one factor to fit ``size``, centre it and pad with ``fill``:
    the device kernel of :class:`fastdata.ops.Letterbox` (bilinear, no antialiasing;
    masks nearest, padded with 0).

    Args:
        size: Output ``(height, width)``, or one int for a square.
        fill: Padding value (int or one per channel; default 114).
        min_size: Smallest clipped box side kept, output pixels.
        min_visibility: Smallest kept fraction of a box's area.
        layout: ``"CHW"`` or ``"HWC"``.
    """

    op_type = ops.Letterbox
    op: ops.Letterbox

    def __init__(
        self,
        size: int | Sequence[int],
        fill: int | Sequence[int] = LETTERBOX_FILL,
        *,
        min_size: float = DEFAULT_MIN_SIZE,
        min_visibility: float = DEFAULT_MIN_VISIBILITY,
        layout: str = "CHW",
    ) -> None:
        super().__init__(ops.Letterbox(size, fill), layout, None)
        self.size = self.op.size
        self.min_size, self.min_visibility = float(min_size), float(min_visibility)

    def forward(
        self,
        images: torch.Tensor,
        masks: torch.Tensor | None = None,
        boxes: PaddedBoxes | None = None,
    ) -> Moved:
        """Letterbox every sample; returns as :meth:`DeviceRandomIoUCrop.forward`."""
        _check_batch(images, masks, self.layout)
        _check_boxes(images, boxes)
        count = images.shape[0]
        height, width = (images.shape[1:3]) if self.layout == "HWC" else images.shape[2:4]
        channels = images.shape[3] if self.layout == "HWC" else images.shape[1]
        _, crop_rows = self.op.layout(
            torch.full((count,), int(height)).numpy(), torch.full((count,), int(width)).numpy()
        )
        crops = copy_to_device(torch.from_numpy(crop_rows), images.device)
        fill = self.op.fill * channels if len(self.op.fill) == 1 else self.op.fill
        if len(fill) != channels:
            raise ValueError(f"fill {self.op.fill} does not match images of {channels} channels")
        fill_values = torch.tensor(fill, dtype=torch.float32, device=images.device)
        return self._move(images, masks, boxes, crops, fill_values)
