"""Device modules of the per-sample descriptions (colour, affine, erasing, policies): the
description turns host draws into steps (one seed, the CPU transforms' steps), each step's
device kernel (:mod:`fastdata.gpu._kernels`) runs on its samples of the batch."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import torch

from fastdata import ops
from fastdata._ops_augmix import refuse_masks
from fastdata._ops_steps import MOVING_KERNELS, Step, StepOperation
from fastdata._transfer import upload
from fastdata.gpu._kernels import (
    DEVICE_KERNELS,
    DEVICE_LUTS,
    HOST_LUT_KERNELS,
    LOOKUP_KERNELS,
    apply_luts,
    host_luts,
)
from fastdata.gpu.augment import _channels_last, _check_batch, _SeededModule


class DeviceStepModule(_SeededModule):
    """A device module running a per-sample description on uint8 batches: its
    constructor takes the description's arguments plus ``layout`` and ``seed`` (see
    :class:`~fastdata.gpu.DeviceRandomHorizontalFlip`).

    Returns new tensors (the input is not changed) in the input's layout and memory
    format; masks follow the pixel-moving steps (nearest-neighbour, outside pixels 0).
    """

    op: StepOperation

    def __init__(
        self, *args: Any, layout: str = "CHW", seed: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(cast(Any, self.op_type)(*args, **kwargs), layout, seed)

    def forward(
        self, images: torch.Tensor, masks: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Augment a batch.

        Args:
            images: 4-D uint8 batch in the module's layout, 1 or 3 channels.
            masks: Optional ``(B, H, W)`` or 4-D (same layout) masks.

        Returns:
            The images (and masks, when given), same shapes, dtypes and device.

        Raises:
            ValueError: ``images`` is not a 4-D uint8 batch of 1 or 3 channels, or
                ``masks`` does not match it.
        """
        _check_batch(images, masks, self.layout)
        if images.dtype != torch.uint8:
            raise ValueError(
                f"images must be uint8 (normalise after augmenting), got {images.dtype}"
            )
        out = (images.permute(0, 3, 1, 2) if self.layout == "HWC" else images).contiguous()
        batch, channels, height, width = out.shape
        if channels not in (1, 3):
            raise ValueError(f"images must have 1 or 3 channels, got {channels}")
        moved: list[torch.Tensor] = []
        if masks is not None:
            mask_bchw = masks.unsqueeze(1) if masks.dim() == 3 else masks
            if masks.dim() == 4 and self.layout == "HWC":
                mask_bchw = masks.permute(0, 3, 1, 2)
            moved = [mask_bchw.contiguous()]
        heights, widths = np.full(batch, height), np.full(batch, width)
        out, moved = self._run(out, moved, images, heights, widths)
        if self.layout == "HWC":
            out = out.permute(0, 2, 3, 1).contiguous()
        elif _channels_last(images):
            out = out.contiguous(memory_format=torch.channels_last)
        if masks is None:
            return out
        mask_out = moved[0]
        if masks.dim() == 3:
            mask_out = mask_out.squeeze(1)
        elif self.layout == "HWC":
            mask_out = mask_out.permute(0, 2, 3, 1).contiguous()
        return out, mask_out

    def _run(
        self,
        out: torch.Tensor,
        moved: list[torch.Tensor],
        images: torch.Tensor,
        heights: np.ndarray,
        widths: np.ndarray,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The description's steps on ``(B, C, H, W)`` ``out`` and ``(B, 1, H, W)`` masks
        (copied first when ``out`` shares ``images``' memory)."""
        steps = self.op.steps(self._uniform(len(out)), heights, widths)
        out = out.clone() if steps and out.data_ptr() == images.data_ptr() else out
        return run_device_steps(steps, out, moved)


def run_device_steps(
    steps: list[Step], out: torch.Tensor, moved: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Run ``steps`` in order on ``(B, C, H, W)`` uint8 ``out`` (written into) and move
    the ``(B, 1, H, W)`` masks with the pixel-moving steps; returns both."""
    batch = len(out)
    units = _units(steps, batch)
    for unit, rows in zip(units, _unit_rows(units, batch, out.device), strict=True):
        part = out if rows is None else out.index_select(0, rows)
        if len(unit) > 1:  # table lookups on disjoint samples: one lookup
            result = apply_luts(part, _unit_luts(part, unit))
            out = result if rows is None else out.index_copy_(0, rows, result)
            continue
        step = unit[0]
        moving = step.kernel in MOVING_KERNELS
        mask_parts = (
            [m if rows is None else m.index_select(0, rows) for m in moved] if moving else []
        )
        result, mask_results = DEVICE_KERNELS[step.kernel](
            part, step.params, step.options, mask_parts
        )
        out = result if rows is None else out.index_copy_(0, rows, result)
        if moving:
            moved = [
                r if rows is None else m.index_copy(0, rows, r)
                for m, r in zip(moved, mask_results, strict=True)
            ]
    return out, moved


def _units(steps: list[Step], batch: int) -> list[list[Step]]:
    """``steps`` in the order they run, a step alone or several in one lookup.

    Consecutive steps on disjoint samples (a layer: one position of a policy's ops) may run
    in any order; the table lookups of a layer run as one, at the place of its first (its
    host-built tables first). Each step's kernel launches once per batch, so this saves a
    gather, a lookup and a scatter per step.
    """
    units: list[list[Step]] = []
    lookups: list[Step] | None = None
    touched = np.zeros(batch, dtype=bool)
    for step in steps:
        if touched[step.index].any():  # a sample seen in this layer: the next layer starts
            touched[:] = False
            lookups = None
        touched[step.index] = True
        if step.kernel not in LOOKUP_KERNELS:
            units.append([step])
        elif lookups is None:
            lookups = [step]
            units.append(lookups)
        else:
            lookups.append(step)
    return [sorted(unit, key=lambda step: step.kernel not in HOST_LUT_KERNELS) for unit in units]


def _unit_rows(
    units: list[list[Step]], batch: int, device: torch.device
) -> list[torch.Tensor | None]:
    """Each unit's sample positions on ``device`` (``None``: a step on the whole batch),
    all copied in one pinned, non-blocking transfer: a copy per step from pageable memory
    would make the host wait for the device each time."""
    indices = [np.concatenate([step.index for step in unit]) for unit in units]
    whole = [
        len(unit) == 1 and len(index) == batch for unit, index in zip(units, indices, strict=True)
    ]
    partial = [index for index, is_whole in zip(indices, whole, strict=True) if not is_whole]
    if not partial:
        return [None] * len(units)
    rows = upload(np.concatenate(partial), device)
    out: list[torch.Tensor | None] = []
    start = 0
    for index, is_whole in zip(indices, whole, strict=True):
        if is_whole:
            out.append(None)
        else:
            out.append(rows[start : start + len(index)])
            start += len(index)
    return out


def _unit_luts(images: torch.Tensor, unit: list[Step]) -> torch.Tensor:
    """``(N, C, 256)`` tables of a unit's lookups for ``images`` (its samples in the unit's
    order): the host-built ones in one copy, the others made from their images."""
    channels = images.shape[1]
    on_host = [
        host_luts(step.kernel, step.params, len(step.index))
        for step in unit
        if step.kernel in HOST_LUT_KERNELS
    ]
    pieces: list[torch.Tensor] = []
    start = 0
    if on_host:
        tables = upload(np.concatenate(on_host), images.device)
        pieces.append(tables[:, None].expand(-1, channels, 256))
        start = len(tables)
    for step in unit[len(on_host) :]:
        count = len(step.index)
        luts = DEVICE_LUTS[step.kernel](images[start : start + count], step.params)
        pieces.append(luts[:, None].expand(-1, channels, 256) if luts.dim() == 2 else luts)
        start += count
    return torch.cat(pieces)


def _module_doc(op: str, summary: str) -> str:
    return f"""{summary} on the device: the device kernel of :class:`fastdata.ops.{op}`.

    Takes :class:`fastdata.ops.{op}`'s arguments, ``layout`` and ``seed``; see
    :class:`DeviceStepModule`.
    """


class DeviceColorJitter(DeviceStepModule):
    __doc__ = _module_doc("ColorJitter", "Random brightness, contrast, saturation and hue")
    op_type = ops.ColorJitter
    op: ops.ColorJitter


class DeviceRandomGrayscale(DeviceStepModule):
    __doc__ = _module_doc("RandomGrayscale", "Grey with probability ``p``")
    op_type = ops.RandomGrayscale
    op: ops.RandomGrayscale


class DeviceRandomSolarize(DeviceStepModule):
    __doc__ = _module_doc("RandomSolarize", "Solarize with probability ``p``")
    op_type = ops.RandomSolarize
    op: ops.RandomSolarize


class DeviceRandomPosterize(DeviceStepModule):
    __doc__ = _module_doc("RandomPosterize", "Posterize with probability ``p``")
    op_type = ops.RandomPosterize
    op: ops.RandomPosterize


class DeviceRandomEqualize(DeviceStepModule):
    __doc__ = _module_doc("RandomEqualize", "Equalize with probability ``p``")
    op_type = ops.RandomEqualize
    op: ops.RandomEqualize


class DeviceRandomAutocontrast(DeviceStepModule):
    __doc__ = _module_doc("RandomAutocontrast", "Autocontrast with probability ``p``")
    op_type = ops.RandomAutocontrast
    op: ops.RandomAutocontrast


class DeviceRandomAdjustSharpness(DeviceStepModule):
    __doc__ = _module_doc("RandomAdjustSharpness", "Sharpen or blur with probability ``p``")
    op_type = ops.RandomAdjustSharpness
    op: ops.RandomAdjustSharpness


class DeviceRandomInvert(DeviceStepModule):
    __doc__ = _module_doc("RandomInvert", "Invert with probability ``p``")
    op_type = ops.RandomInvert
    op: ops.RandomInvert


class DeviceGaussianBlur(DeviceStepModule):
    __doc__ = _module_doc("GaussianBlur", "Gaussian blur of a random sigma")
    op_type = ops.GaussianBlur
    op: ops.GaussianBlur


class DeviceRandomAffine(DeviceStepModule):
    __doc__ = _module_doc("RandomAffine", "Random rotation, shift, scale and shear")
    op_type = ops.RandomAffine
    op: ops.RandomAffine


class DeviceRandomErasing(DeviceStepModule):
    __doc__ = _module_doc("RandomErasing", "Erase a random box with probability ``p``")
    op_type = ops.RandomErasing
    op: ops.RandomErasing


class DeviceRandAugment(DeviceStepModule):
    __doc__ = _module_doc("RandAugment", "timm's RandAugment")
    op_type = ops.RandAugment
    op: ops.RandAugment


class DeviceTrivialAugmentWide(DeviceStepModule):
    __doc__ = _module_doc("TrivialAugmentWide", "torchvision's TrivialAugmentWide")
    op_type = ops.TrivialAugmentWide
    op: ops.TrivialAugmentWide


class DeviceAugMix(DeviceStepModule):
    __doc__ = _module_doc("AugMix", "torchvision's AugMix (refuses masks)")
    op_type = ops.AugMix
    op: ops.AugMix

    def _run(
        self,
        out: torch.Tensor,
        moved: list[torch.Tensor],
        images: torch.Tensor,
        heights: np.ndarray,
        widths: np.ndarray,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Each chain's steps on a copy of ``out``, blended with it in float32 (the CPU
        transform's order), truncated to uint8."""
        refuse_masks(self.op, moved)
        chains, weights = self.op.mixing(self._uniform(len(out)), heights, widths)
        factors = upload(weights.astype(np.float32), out.device, torch.float32)
        mixed = out.to(torch.float32) * factors[:, 0].view(-1, 1, 1, 1)
        for chain, steps in enumerate(chains):
            chained, _ = run_device_steps(steps, out.clone(), [])
            mixed.add_(factors[:, 1 + chain].view(-1, 1, 1, 1) * chained)
        return mixed.to(torch.uint8), moved
