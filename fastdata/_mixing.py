"""The MixUp/CutMix kernel on a collated batch (torch ops, on whatever device the batch
is: the CPU after collate or the GPU), shared by :mod:`fastdata.transforms` and
:mod:`fastdata.gpu`, and the executor base that draws the plan from a seed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import cv2
import numpy as np
import torch

from fastdata import ops
from fastdata._draws import UniformDraws
from fastdata._layout import check_layout
from fastdata._ops_mix import MixPlan
from fastdata._transfer import copy_to_device, upload

# The k-th image of a batch, made on demand (fastdata.gpu's Normalize reads it).
ImageSource = Callable[[int], np.ndarray]

# devices where torch.Tensor checks can be asserted without a read-back (the meta device
# has no values to check)
_ASYNC_ASSERT_DEVICES = ("cuda", "meta")


def soft_targets(
    labels: torch.Tensor, num_classes: int, smoothing: float, device: torch.device
) -> torch.Tensor:
    """``(B, num_classes)`` float32 targets: one-hot ``labels`` smoothed as timm's
    ``mixup_target`` (``1 - smoothing + smoothing / K`` on, ``smoothing / K`` off), or
    ``labels`` as float32 when they are already ``(B, K)`` soft targets.

    Raises:
        ValueError: ``labels`` is neither ``(B,)`` integers in ``[0, num_classes)`` nor
            ``(B, num_classes)`` (CUDA labels out of range fail with a device-side assert
            instead: checking them on the host would make it wait for the device).
    """
    if labels.dim() == 2 and labels.shape[1] == num_classes:
        return copy_to_device(labels, device).to(torch.float32)
    if labels.dim() != 1 or labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(
            f"labels must be (B,) class indices or (B, {num_classes}) soft targets, "
            f"got {tuple(labels.shape)} {labels.dtype}"
        )
    if labels.device.type in _ASYNC_ASSERT_DEVICES and labels.numel():
        # checked on the device without reading back (a sync): a bad label fails a later
        # CUDA call with a device-side assert instead of a ValueError
        torch._assert_async(((labels >= 0) & (labels < num_classes)).all())
    elif labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(
            f"labels must be in [0, {num_classes}), got values "
            f"{int(labels.min())}..{int(labels.max())}"
        )
    off = smoothing / num_classes
    targets = torch.full((len(labels), num_classes), off, dtype=torch.float32, device=device)
    index = copy_to_device(labels, device).to(torch.int64)[:, None]
    return targets.scatter_(1, index, 1.0 - smoothing + off)


# Blend weights that take all of one image (an unmixed sample, a lam drawn at an end):
# OpenCV's blend gives exactly that image's bytes, here copied or handed on without it.
_WHOLE_WEIGHTS = (0.0, 1.0)

# CPU tensors of these dtypes have a NumPy view.
NUMPY_DTYPES = (torch.uint8, torch.float16, torch.float32, torch.float64)


def mix_batch(
    images: torch.Tensor, targets: torch.Tensor, plan: MixPlan, layout: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mix each sample with the batch reversed by ``plan``.

    Args:
        images: ``(B, C, H, W)`` (``"CHW"``) or ``(B, H, W, C)`` (``"HWC"``) batch; uint8
            results are rounded.
        targets: ``(B, K)`` float32 soft targets.
        plan: The draw: ``lam`` per sample and CutMix boxes (or ``None``: MixUp).
        layout: ``"CHW"`` or ``"HWC"``.

    Returns:
        New images (same dtype, layout and device) and ``(B, K)`` mixed targets.
    """
    device = images.device
    mixed_targets = mix_targets(targets, plan, device)
    if plan.boxes is None:
        return _blend(images, plan.lam), mixed_targets
    if device.type != "cpu":  # one select with box masks: no launch per sample
        return paste_by_masks(images, plan.boxes, layout), mixed_targets
    out = images.clone()
    count = len(images)
    target: Any = out  # a tensor, or a NumPy view of one
    source: Any = images
    if images.dtype in NUMPY_DTYPES and not images.requires_grad:
        target, source = out.numpy(), images.numpy()  # NumPy's slicing: a fraction of torch's
    for i, (top, left, box_h, box_w) in enumerate(plan.boxes.tolist()):
        if box_h and box_w:  # paste the partner's box (only the box is read)
            rows, cols = slice(top, top + box_h), slice(left, left + box_w)
            if layout == "CHW":
                target[i, :, rows, cols] = source[count - 1 - i, :, rows, cols]
            else:
                target[i, rows, cols] = source[count - 1 - i, rows, cols]
    return out, mixed_targets


def mix_targets(targets: torch.Tensor, plan: MixPlan, device: torch.device) -> torch.Tensor:
    """``(B, K)`` soft targets mixed with the batch reversed by ``plan.lam``."""
    lam = upload(plan.lam.astype(np.float32), device)
    return targets * lam[:, None] + targets.flip(0) * (1.0 - lam[:, None])


def mixed_images(images: torch.Tensor, plan: MixPlan, layout: str) -> ImageSource | None:
    """The ``k``-th image :func:`mix_batch` makes, one at a time, in the memory of
    ``images[k]`` (a reused buffer, valid until the next call): the same bytes, made in
    cache for a step that reads each image once (``Normalize``'s lookup tables). ``None``
    unless ``images`` is a uint8 CPU batch, contiguous or channels-last."""
    if images.device.type != "cpu" or images.dtype != torch.uint8 or images.requires_grad:
        return None
    if images.is_contiguous():
        memory = images.numpy()
        interleaved = layout == "HWC"
    elif layout == "CHW" and images.is_contiguous(memory_format=torch.channels_last):
        memory, interleaved = images.permute(0, 2, 3, 1).numpy(), True
    else:
        return None
    count = len(memory)
    buffer = np.empty(memory.shape[1:], np.uint8)
    weights = plan.lam.tolist()

    def blended(k: int) -> np.ndarray:  # as _blend: OpenCV's rounding, pixels x channels
        weight = weights[k]
        if weight in _WHOLE_WEIGHTS:  # all of one image: that image, as it is
            return memory[k] if weight == 1.0 else memory[count - 1 - k]
        pixels = (-1, memory.shape[-1])
        own, partner = memory[k].reshape(pixels), memory[count - 1 - k].reshape(pixels)
        cv2.addWeighted(own, weight, partner, 1.0 - weight, 0.0, buffer.reshape(pixels))
        return buffer

    if plan.boxes is None:
        return blended
    boxes = plan.boxes.tolist()

    def pasted(k: int) -> np.ndarray:
        top, left, box_h, box_w = boxes[k]
        if not (box_h and box_w):
            return memory[k]
        buffer[...] = memory[k]
        box = (slice(top, top + box_h), slice(left, left + box_w))
        where = box if interleaved else (slice(None), *box)
        buffer[where] = memory[count - 1 - k][where]
        return buffer

    return pasted


def paste_by_masks(images: torch.Tensor, boxes: np.ndarray, layout: str) -> torch.Tensor:
    """CutMix's paste of the partner's (the batch reversed) ``(B, 4)`` boxes as one select:
    the same result as pasting sample by sample, in a fixed number of launches."""
    height, width = images.shape[2:4] if layout == "CHW" else images.shape[1:3]
    inside = box_masks(boxes, int(height), int(width), images.device)
    inside = inside if layout == "CHW" else inside.permute(0, 2, 3, 1)
    return torch.where(inside, images.flip(0), images)


def box_masks(boxes: np.ndarray, height: int, width: int, device: torch.device) -> torch.Tensor:
    """``(N, 1, H, W)`` bool: inside each sample's ``(top, left, height, width)`` box (host
    ``(N, 4)`` integers, copied once, pinned and non-blocking)."""
    limits = upload(boxes.astype(np.int64).reshape(-1, 4), device)
    top, left = limits[:, 0:1], limits[:, 1:2]
    rows = torch.arange(height, device=device)[None]
    cols = torch.arange(width, device=device)[None]
    inside_rows = (rows >= top) & (rows < top + limits[:, 2:3])  # (N, H)
    inside_cols = (cols >= left) & (cols < left + limits[:, 3:4])  # (N, W)
    return (inside_rows[:, :, None] & inside_cols[:, None, :])[:, None]


def _blend(images: torch.Tensor, lam: np.ndarray) -> torch.Tensor:
    """``lam * x + (1 - lam) * partner`` per sample (the batch reversed); uint8 rounded.

    A uint8 batch on the CPU, contiguous or channels-last (a collated ``(B, H, W, C)``
    batch seen as ``(B, C, H, W)``), is blended by OpenCV, one pass per sample (float
    arithmetic rounded as torch's, a tie of exactly half a level apart), and keeps its
    memory layout; others by torch.
    """
    count = len(images)
    if images.device.type == "cpu" and images.dtype == torch.uint8:
        if images.is_contiguous():
            memory, restore = images, images.shape
        elif images.dim() == 4 and images.is_contiguous(memory_format=torch.channels_last):
            memory, restore = images.permute(0, 2, 3, 1), None  # (B, H, W, C), contiguous
        else:
            memory = None
        if memory is not None:
            source = memory.numpy().reshape(count, -1, memory.shape[-1])
            out = np.empty_like(source)
            for i, weight in enumerate(lam.tolist()):
                partner = source[count - 1 - i]
                if weight in _WHOLE_WEIGHTS:  # the blend's bytes, copied
                    out[i] = source[i] if weight == 1.0 else partner
                else:
                    cv2.addWeighted(source[i], weight, partner, 1.0 - weight, 0.0, out[i])
            mixed = torch.from_numpy(out).view(memory.shape)
            return mixed.view(restore) if restore is not None else mixed.permute(0, 3, 1, 2)
    shape = (-1,) + (1,) * (images.dim() - 1)
    work = images.dtype if images.dtype.is_floating_point else torch.float32
    weight = upload(lam, images.device, work).view(shape)
    blended = torch.lerp(images.flip(0).to(work), images.to(work), weight)
    if not images.dtype.is_floating_point:
        blended = blended.round_().clamp_(0, 255)
    return blended.to(images.dtype)


class MixExecutor(ops.Executor):
    """Runs a :class:`fastdata.ops.MixUp` or :class:`fastdata.ops.CutMix` on a collated
    batch: draws the plan (one row per batch, or per sample in ``"elem"`` mode) from
    :class:`fastdata._draws.UniformDraws`, then :func:`mix_batch`."""

    op: Any

    def _setup(self, op: ops.Operation, layout: str, seed: int | None) -> None:
        self.op = op
        self.layout = check_layout(layout)
        self._draws = UniformDraws(seed)

    def mix(
        self, images: torch.Tensor, labels: torch.Tensor, normalize: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix ``images`` and ``labels``; see :func:`mix_batch` and :func:`soft_targets`.
        With ``normalize`` (a :class:`fastdata.gpu.Normalize`), return
        ``normalize(mixed images)``: on a uint8 CPU batch each mixed image goes straight
        into the normalized output, the mixed batch is never written.

        Raises:
            TypeError: ``images`` or ``labels`` is not a tensor, or ``normalize`` is not a
                ``Normalize``.
            ValueError: ``images`` is not 4-D, or ``labels`` does not fit it.
        """
        if normalize is not None and not callable(getattr(normalize, "normalize_images_of", None)):
            raise TypeError(
                "normalize must be a fastdata.gpu.Normalize or None, got "
                f"{type(normalize).__name__}"
            )
        if not isinstance(images, torch.Tensor) or not isinstance(labels, torch.Tensor):
            raise TypeError(
                f"images and labels must be tensors, got {type(images).__name__} and "
                f"{type(labels).__name__}"
            )
        if images.dim() != 4:
            raise ValueError(
                f"images must be a 4-D batch in layout {self.layout}, got {tuple(images.shape)}"
            )
        if len(labels) != len(images):
            raise ValueError(f"labels has {len(labels)} rows for {len(images)} images")
        batch = len(images)
        height, width = images.shape[2:4] if self.layout == "CHW" else images.shape[1:3]
        draws = self._draws.uniform(self.op.draw_rows(batch), self.op.draws_per_sample)
        plan = self.op.plan(draws, batch, int(height), int(width))
        targets = soft_targets(labels, self.op.num_classes, self.op.label_smoothing, images.device)
        if normalize is None:
            return mix_batch(images, targets, plan, self.layout)
        image_at = mixed_images(images, plan, self.layout)
        if image_at is not None:
            normalized = normalize.normalize_images_of(images, image_at)
            if normalized is not None:
                return normalized, mix_targets(targets, plan, images.device)
        mixed, mixed_targets = mix_batch(images, targets, plan, self.layout)
        return normalize(mixed), mixed_targets

    def manual_seed(self, seed: int) -> None:
        """Restart the random sequence from ``seed``."""
        self._draws = UniformDraws(seed)
