"""Batch augmentation on the device: random horizontal flip and random resized crop, the
device kernels of :class:`fastdata.ops.RandomHorizontalFlip` and
:class:`fastdata.ops.RandomResizedCrop`.

For pipelines whose CPU side is the bottleneck: the random parameters are drawn on the
host (:class:`fastdata._draws.UniformDraws`, the CPU transforms' and decoders' scheme) and
turned into flips and boxes by the description, so a seed gives the same boxes and flips
on every device and in every executor; then the whole batch is transformed by a few
device kernels. Masks given along with the images get
the same flips and crops (nearest-neighbour).

Called on a :class:`~fastdata.transforms.FieldBatch` (or a dict of fields with ``roles``),
a module moves every field by its role from one draw: the image field and every mask on
the device, boxes (lists of ``(N_i, 4)`` tensors) and any other role with a mover through
the one box geometry of :mod:`fastdata.transforms` (clipped, and dropped with their box
labels by the same rule as on the CPU), returned on the boxes' device. Boxes collated
padded (``ragged="padded"``: a ``(padded, counts)`` pair, or a
:class:`~fastdata.gpu.PaddedBoxes`) are moved on the device by the same rule instead,
without a host sync, their padded box labels alongside (kept rows first, new counts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from fastdata import _roles, ops
from fastdata._boxes import DEFAULT_MIN_SIZE, DEFAULT_MIN_VISIBILITY
from fastdata._draws import UniformDraws
from fastdata._fields import (
    FieldBatch,
    Geometry,
    apply_geometry,
    as_field_batch,
    moved_roles,
)
from fastdata._layout import check_layout
from fastdata._transfer import upload
from fastdata.gpu._boxes import PaddedBoxes, as_padded, move_padded, repack


def _channels_last(images: torch.Tensor) -> bool:
    """A (B, C, H, W) batch laid out channels-last in memory (and not trivially both ways)."""
    return images.is_contiguous(memory_format=torch.channels_last) and not (
        images.is_contiguous() and images.shape[1] > 1
    )


def _check_batches(images: torch.Tensor, masks: list[torch.Tensor], layout: str) -> None:
    """:func:`_check_batch` of the images, then of each mask batch against them."""
    _check_batch(images, None, layout)
    for mask in masks:
        _check_batch(images, mask, layout)


def _check_batch(images: torch.Tensor, masks: torch.Tensor | None, layout: str) -> None:
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        got = tuple(images.shape) if isinstance(images, torch.Tensor) else type(images).__name__
        raise ValueError(f"images must be a 4-D tensor in layout {layout}, got {got}")
    if masks is None:
        return
    spatial = images.shape[1:3] if layout == "HWC" else images.shape[2:4]
    mask_spatial = masks.shape[1:3] if masks.dim() == 3 or layout == "HWC" else masks.shape[2:4]
    if masks.dim() not in (3, 4) or masks.shape[0] != images.shape[0] or mask_spatial != spatial:
        raise ValueError(
            f"masks of shape {tuple(masks.shape)} do not match images of shape "
            f"{tuple(images.shape)} (layout {layout}): need (B, H, W) or 4-D in the same layout"
        )


def _spatial(images: torch.Tensor, layout: str) -> tuple[int, int]:
    """``(height, width)`` of a 4-D batch in ``layout``."""
    shape = images.shape[1:3] if layout == "HWC" else images.shape[2:4]
    return int(shape[0]), int(shape[1])


def _host(item: Any) -> np.ndarray:
    """A target row array on the host, as NumPy."""
    if isinstance(item, torch.Tensor):
        return item.detach().cpu().numpy()
    return np.asarray(item)


def _device(item: Any) -> torch.device:
    return item.device if isinstance(item, torch.Tensor) else torch.device("cpu")


class _SeededModule(nn.Module, ops.Executor):
    """Holds the module's description (``op``) and its draws:
    :class:`fastdata._draws.UniformDraws`, the scheme the CPU transforms and the decoders
    use, so one seed gives the same boxes and flips in all."""

    interpolation: int | None = None  # the host movers' kernel (unused: pixels move here)
    # Boxes are dropped below this clipped side (pixels) or visible fraction, as on the CPU.
    min_box_size: float = DEFAULT_MIN_SIZE
    min_box_visibility: float = DEFAULT_MIN_VISIBILITY

    def _move(
        self, images: torch.Tensor, masks: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], Geometry]:
        """Move images and masks by one draw; return them and the draw's geometry."""
        raise NotImplementedError

    def _forward_fields(
        self, batch: FieldBatch | Mapping[str, Any], roles: Mapping[str, str] | None
    ) -> FieldBatch:
        """:meth:`forward` on a batch of fields with roles (see the module docstring)."""
        batch = as_field_batch(batch, roles)
        images = batch.names(_roles.IMAGE)
        if len(images) != 1:
            raise ValueError(f"{self!r} moves exactly one image field, got {images}")
        masks = batch.names(_roles.MASK)
        self._prepare(batch)
        moved_images, moved_masks, geometry = self._move(
            batch.values[images[0]], [batch.values[name] for name in masks]
        )
        values = dict(batch.values)
        values[images[0]] = moved_images
        values.update(zip(masks, moved_masks, strict=True))
        for name in batch.names(_roles.BOXES):
            padded = as_padded(batch.values[name])
            if padded is not None:  # padded on the device: moved there, no host sync
                repack(values, batch.roles, name, self._move_padded(padded, geometry))
        targets = [
            name
            for name in batch
            if batch.role(name) not in (_roles.IMAGE, _roles.MASK)
            and isinstance(batch.values[name], list)
            and (
                batch.role(name) in moved_roles()
                or batch.role(name) in (_roles.BOX_LABELS, _roles.OTHER)
            )
        ]
        if targets:
            host = FieldBatch(
                {name: [_host(item) for item in batch.values[name]] for name in targets},
                {name: batch.role(name) for name in targets},
            )
            moved = apply_geometry(self, host, geometry)
            for name in targets:
                values[name] = [
                    torch.from_numpy(np.ascontiguousarray(array)).to(_device(old))
                    for array, old in zip(moved.values[name], batch.values[name], strict=True)
                ]
        return FieldBatch(values, dict(batch.roles))

    def _forward_images(
        self,
        images: torch.Tensor | FieldBatch | Mapping[str, Any],
        masks: torch.Tensor | None,
        roles: Mapping[str, str] | None,
    ) -> Any:
        """``forward`` of a module that moves images and masks: a batch of fields with
        roles, or the images (and the masks, when given) moved by one draw."""
        if isinstance(images, FieldBatch | Mapping):
            return self._forward_fields(images, roles)
        out, moved, _ = self._move(images, [] if masks is None else [masks])
        return out if masks is None else (out, moved[0])

    def _prepare(self, batch: FieldBatch) -> None:
        """Read what the next :meth:`_move` draws from (an IoU crop: the boxes); nothing
        by default."""

    def _move_padded(self, padded: PaddedBoxes, geometry: Geometry) -> PaddedBoxes:
        """Padded boxes moved by the host ``geometry`` on their device (its parts copied
        there, non-blocking)."""
        device = padded.boxes.device
        size = geometry.uniform_size
        if size is None:
            raise ValueError("padded boxes need one output size for the whole batch")
        crops, offsets, resized, flips = (
            upload(part, device)
            for part in (geometry.box_crops(), geometry.offsets, geometry.resized, geometry.flips)
        )
        return move_padded(
            padded,
            crops=crops,
            offsets=offsets,
            resized=resized,
            out_size=size,
            flips=flips,
            min_size=self.min_box_size,
            min_visibility=self.min_box_visibility,
        )

    def __init__(self, op: ops.Operation, layout: str, seed: int | None) -> None:
        super().__init__()
        self.op = op
        self.layout = check_layout(layout)
        self._draws = UniformDraws(seed)

    def _uniform(self, count: int) -> np.ndarray:
        """``(count, op.draws_per_sample)`` uniforms in [0, 1) (advances the generator)."""
        return self._draws.uniform(count, self.op.draws_per_sample)

    def extra_repr(self) -> str:
        fields = repr(self.op).removeprefix(type(self.op).__name__)[1:-1]
        return f"{fields}, layout={self.layout!r}, seed={self._draws.seed}"

    @property
    def generator(self) -> torch.Generator | None:
        """The seeded host generator (``None``: torch's default generator)."""
        return self._draws.generator()

    def manual_seed(self, seed: int) -> None:
        """Restart the random sequence from ``seed``."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self._draws = UniformDraws(seed)

    def set_epoch(self, epoch: int) -> None:
        """Restart the seeded sequence from ``(seed, epoch)`` (no effect without a seed).

        The module sees device batches, not sample indices, so its draws follow the batch
        order: after ``set_epoch(e)`` they depend on the seed, ``e`` and the batches of
        epoch ``e`` only, so a rerun or a resumed run draws epoch ``e`` alike.
        ``DevicePrefetcher.set_epoch`` calls it.

        Raises:
            TypeError: ``epoch`` is not an int.
        """
        self._draws.set_epoch(epoch)


class DeviceRandomHorizontalFlip(_SeededModule):
    """Flip each sample of a batch left-right with probability ``p``, on its device: the
    device kernel of :class:`fastdata.ops.RandomHorizontalFlip`.

    Args:
        p: Probability that a sample is flipped, in [0, 1].
        layout: ``"CHW"`` (batches ``(B, C, H, W)``) or ``"HWC"`` (``(B, H, W, C)``), any
            dtype, any memory format.
        seed: Seed of the module's draws (``None``: torch's default generator, so
            ``torch.manual_seed`` makes a run reproducible).

    Raises:
        TypeError: ``p`` is not a number or ``layout`` is not a string.
        ValueError: ``p`` outside [0, 1] or an unknown ``layout``.
    """

    op_type = ops.RandomHorizontalFlip
    op: ops.RandomHorizontalFlip

    def __init__(self, p: float = 0.5, *, layout: str = "CHW", seed: int | None = None) -> None:
        super().__init__(ops.RandomHorizontalFlip(p), layout, seed)

    @property
    def p(self) -> float:
        """Probability that a sample is flipped."""
        return self.op.p

    def forward(
        self,
        images: torch.Tensor | FieldBatch | Mapping[str, Any],
        masks: torch.Tensor | None = None,
        roles: Mapping[str, str] | None = None,
    ) -> Any:
        """Flip a random subset of the batch.

        Args:
            images: 4-D batch in the module's layout, or a batch of fields with roles
                (a :class:`~fastdata.transforms.FieldBatch`, or a dict and ``roles``).
            masks: Optional ``(B, H, W)`` or 4-D (same layout) masks, flipped alike.
            roles: The roles of a dict batch's fields.

        Returns:
            The images (and masks, when given), same shapes, dtypes and device; for a batch
            of fields, a :class:`~fastdata.transforms.FieldBatch`.

        Raises:
            ValueError: ``images`` is not 4-D or ``masks`` does not match it.
        """
        return self._forward_images(images, masks, roles)

    def _move(
        self, images: torch.Tensor, masks: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], Geometry]:
        _check_batches(images, masks, self.layout)
        flips_host = self.op.flips(self._uniform(images.shape[0]))
        flip = upload(flips_host, images.device)
        out_images = self._flip(images, flip, -2 if self.layout == "HWC" else -1)
        moved = [
            self._flip(mask, flip, -1 if mask.dim() == 3 or self.layout == "CHW" else -2)
            for mask in masks
        ]
        height, width = _spatial(images, self.layout)
        sides = np.full(images.shape[0], height), np.full(images.shape[0], width)
        return out_images, moved, Geometry.identity(*sides, flips_host)

    @staticmethod
    def _flip(tensor: torch.Tensor, flip: torch.Tensor, dim: int) -> torch.Tensor:
        shape = (tensor.shape[0],) + (1,) * (tensor.dim() - 1)
        return torch.where(flip.view(shape), tensor.flip(dim), tensor)


class DeviceRandomResizedCrop(_SeededModule):
    """Crop a random box of each sample and resize it to ``size``, the whole batch at once:
    the device kernel of :class:`fastdata.ops.RandomResizedCrop`.

    Boxes are drawn like torchvision's ``RandomResizedCrop`` (area fraction in ``scale``,
    aspect ratio log-uniform in ``ratio``, ten tries then a centre crop: the description's
    sampler, shared with the decoders and CPU transforms); the
    resize is bilinear without antialiasing (``grid_sample``, ``align_corners=False``),
    nearest for masks. Images keep their dtype: float16/bfloat16 are resampled in float32
    and cast back, uint8 likewise and rounded.

    Args:
        size: Output ``(height, width)``, or one int for a square.
        scale: Range of the crop's area as a fraction of the image's.
        ratio: Range of the crop's width / height.
        layout: ``"CHW"`` or ``"HWC"``, as for :class:`DeviceRandomHorizontalFlip`.
        seed: Seed of the module's draws (``None``: torch's default generator, so
            ``torch.manual_seed`` makes a run reproducible).

    Raises:
        TypeError: ``scale`` or ``ratio`` is not a (low, high) pair of numbers, or
            ``layout`` is not a string.
        ValueError: A size is not positive, a range is empty or out of bounds, or an
            unknown ``layout``.
    """

    op_type = ops.RandomResizedCrop
    op: ops.RandomResizedCrop

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        *,
        layout: str = "CHW",
        seed: int | None = None,
    ) -> None:
        super().__init__(ops.RandomResizedCrop(size, scale, ratio), layout, seed)

    @property
    def size(self) -> tuple[int, int]:
        """Output ``(height, width)``."""
        return self.op.size

    @property
    def scale(self) -> tuple[float, float]:
        """Range of the crop's area fraction."""
        return self.op.scale

    @property
    def ratio(self) -> tuple[float, float]:
        """Range of the crop's width / height."""
        return self.op.ratio

    def sample_boxes(self, batch_size: int, height: int, width: int) -> torch.Tensor:
        """Draw one crop box per sample (advances the generator).

        Returns:
            ``(batch_size, 4)`` int64 on the host: ``x0, y0, w, h`` in pixels.
        """
        sizes = np.full(batch_size, height), np.full(batch_size, width)
        top, left, box_h, box_w = self.op.boxes(*sizes, self._uniform(batch_size)).T
        return torch.from_numpy(np.stack([left, top, box_w, box_h], axis=1))

    def forward(
        self,
        images: torch.Tensor | FieldBatch | Mapping[str, Any],
        masks: torch.Tensor | None = None,
        roles: Mapping[str, str] | None = None,
    ) -> Any:
        """Crop and resize every sample.

        Args:
            images: 4-D batch in the module's layout, float or uint8, or a batch of fields
                with roles (a :class:`~fastdata.transforms.FieldBatch`, or a dict and
                ``roles``).
            masks: Optional ``(B, H, W)`` or 4-D (same layout) integer masks.
            roles: The roles of a dict batch's fields.

        Returns:
            Images of spatial size ``size`` in the same layout, dtype, device and memory
            format (a channels-last ``(B, C, H, W)`` batch stays channels-last), and masks,
            when given, likewise; for a batch of fields, a
            :class:`~fastdata.transforms.FieldBatch`.

        Raises:
            ValueError: ``images`` is not 4-D or ``masks`` does not match it.
        """
        return self._forward_images(images, masks, roles)

    def _move(
        self, images: torch.Tensor, masks: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor], Geometry]:
        _check_batches(images, masks, self.layout)
        bchw = images.permute(0, 3, 1, 2) if self.layout == "HWC" else images
        batch, _, height, width = bchw.shape
        boxes = self.sample_boxes(batch, height, width).double()
        crops = boxes[:, [1, 0, 3, 2]].numpy().astype(np.int64)  # (top, left, h, w)
        geometry = Geometry.of(crops, np.tile(np.array(self.size, np.int64), (batch, 1)))
        x0, y0, box_w, box_h = boxes.unbind(dim=1)
        theta = torch.zeros(batch, 2, 3, dtype=torch.float32)
        theta[:, 0, 0] = box_w / width
        theta[:, 0, 2] = (2 * x0 + box_w) / width - 1
        theta[:, 1, 1] = box_h / height
        theta[:, 1, 2] = (2 * y0 + box_h) / height - 1
        out_size = (batch, 1, *self.size)
        theta_there = upload(theta.numpy(), images.device)
        grid = F.affine_grid(theta_there, list(out_size), align_corners=False)
        out = self._resample(bchw, grid, "bilinear")
        if self.layout == "HWC":
            out = out.permute(0, 2, 3, 1).contiguous()
        elif _channels_last(images):
            out = out.contiguous(memory_format=torch.channels_last)  # keep the caller's format
        return out, [self._move_mask(mask, grid) for mask in masks], geometry

    def _move_mask(self, masks: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        mask_bchw = masks.unsqueeze(1) if masks.dim() == 3 else masks
        if masks.dim() == 4 and self.layout == "HWC":
            mask_bchw = masks.permute(0, 3, 1, 2)
        out_masks = self._resample(mask_bchw, grid, "nearest")
        if masks.dim() == 3:
            out_masks = out_masks.squeeze(1)
        elif self.layout == "HWC":
            out_masks = out_masks.permute(0, 2, 3, 1).contiguous()
        return out_masks

    @staticmethod
    def _resample(bchw: torch.Tensor, grid: torch.Tensor, mode: str) -> torch.Tensor:
        dtype = bchw.dtype
        # grid_sample wants input and grid in one float dtype; a half-precision grid would be
        # off by up to half a pixel at 224 px, so half types are resampled in float32.
        work = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        out = F.grid_sample(
            bchw.to(work), grid.to(work), mode=mode, padding_mode="border", align_corners=False
        )
        if not dtype.is_floating_point:
            out = out.round_() if mode == "bilinear" else out
            info = torch.iinfo(dtype)
            out = out.clamp_(info.min, info.max)
        return out.to(dtype)
