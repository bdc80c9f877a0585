"""``Normalize`` of a uint8 batch on the CPU by a lookup table per channel.

A uint8 input has 256 values per channel, so ``bias + x * scale`` in float32 (rounded once
to the output dtype) is a table of 256 entries per channel, built by that very expression.
Each output value is then its table's entry, written in one pass: no float copy of the
input, no second pass to scale and shift, and the same bytes as the arithmetic. Planar
output is written by the compiled ``fastdata._lookup`` where it was built (streaming
stores: the output's lines are not read into the cache first), else, and channels_last
output always, by OpenCV's ``LUT``. Tables of 16-bit floats are looked up as their
``int16`` bit patterns.
"""

from __future__ import annotations

import cv2
import numpy as np
import torch

from fastdata._mixing import ImageSource
from fastdata._planes import cached_interleaved, cached_planes

try:
    from fastdata._lookup import planes as compiled_planes
except ImportError:  # installed without a C compiler: OpenCV's lookups, the same bytes
    compiled_planes = None  # type: ignore[assignment]

# Output dtypes whose bit patterns OpenCV's LUT writes, as the NumPy dtype it sees.
_TABLE_VIEWS = {torch.float32: np.float32, torch.float16: np.int16, torch.bfloat16: np.int16}
# OpenCV's split, merge and multi-channel LUT take up to 4 channels.
_MAX_CHANNELS = 4


def channel_tables(scale: torch.Tensor, bias: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """``(C, 256)`` tables: ``bias + level * scale`` per channel in float32, in ``dtype``
    (seen as the NumPy dtype OpenCV's LUT copies: ``float32`` or ``int16`` bits)."""
    levels = torch.arange(256, dtype=torch.float32).expand(scale.numel(), 256)
    values = torch.addcmul(bias.view(-1, 1), levels, scale.view(-1, 1)).to(dtype)
    return _bits(values.contiguous(), _TABLE_VIEWS[dtype]).numpy()


def _per_image_planar(images: torch.Tensor) -> bool:
    """``(B, C, H, W)`` whose every channel plane is one contiguous run."""
    height, width = images.shape[2:]
    return (
        images.stride(3) == 1 and images.stride(2) == width and images.stride(1) == (height * width)
    )


def _per_image_interleaved(images: torch.Tensor) -> bool:
    """``(B, C, H, W)`` seen on ``(B, H, W, C)`` memory whose every image is contiguous."""
    channels, _, width = images.shape[1:]
    return (
        images.stride(1) == 1
        and images.stride(3) == channels
        and images.stride(2) == (width * channels)
    )


def _bits(out: torch.Tensor, view: type | np.dtype) -> torch.Tensor:
    """``out`` as the dtype OpenCV writes (its 16-bit floats as ``int16``)."""
    return out.view(torch.int16) if view == np.int16 else out


def normalize_by_tables(
    images: torch.Tensor,
    out: torch.Tensor,
    tables: np.ndarray,
    image_at: ImageSource | None = None,
) -> bool:
    """Write ``tables[c][images]`` into ``out`` (same shape, contiguous or channels_last)
    image by image; ``False`` (nothing written) for memory this path does not handle.

    Args:
        images: ``(B, C, H, W)`` uint8 on the CPU, planar or interleaved per image.
        out: ``(B, C, H, W)`` output of the tables' dtype, contiguous or channels_last.
        tables: :func:`channel_tables`.
        image_at: Gives the ``k``-th image to look up in place of ``images``' own, in the
            same memory (``(C, H, W)`` planar or ``(H, W, C)`` interleaved, contiguous):
            the batch as a step before this one makes it, an image at a time (a mixing
            step whose result then never fills a batch of its own).
    """
    channels = images.shape[1]
    if not 1 <= channels <= _MAX_CHANNELS or images.numel() == 0:
        return False
    planar_in = channels == 1 or _per_image_planar(images)
    interleaved_in = channels == 1 or _per_image_interleaved(images)
    planar_out = out.is_contiguous()
    interleaved_out = out.is_contiguous(memory_format=torch.channels_last)
    if not (planar_in or interleaved_in) or not (planar_out or interleaved_out):
        return False
    view = tables.dtype
    if planar_out:
        target = _bits(out, view).numpy()
        source = images.numpy() if planar_in else images.permute(0, 2, 3, 1).numpy()
        planes = None
        if not planar_in and compiled_planes is None:  # OpenCV's vectorised split first
            planes = cached_planes(1, channels, images.shape[2], images.shape[3])[0]
        for k in range(len(images)):
            image = source[k] if image_at is None else image_at(k)
            if image.shape != source.shape[1:]:  # only the first can differ: nothing written
                return False
            if compiled_planes is not None:
                compiled_planes(image, tables, target[k], channels, not planar_in)
                continue
            if planes is not None:
                cv2.split(image, list(planes))
            rows = planes if planes is not None else image
            for channel in range(channels):
                cv2.LUT(rows[channel], tables[channel], dst=target[k, channel])
        return True
    # channels_last output: one multi-channel lookup per interleaved image
    target_array = _bits(out.permute(0, 2, 3, 1), view).numpy()
    table = np.ascontiguousarray(tables.T).reshape(1, 256, channels)
    interleaved = None
    if not interleaved_in:
        interleaved = cached_interleaved(images.shape[2], images.shape[3], channels)
        source = images.numpy()
    else:
        source = images.permute(0, 2, 3, 1).numpy()
    for k in range(len(images)):
        pixels = source[k] if image_at is None else image_at(k)
        if pixels.shape != source.shape[1:]:  # only the first can differ: nothing written
            return False
        if interleaved is not None:
            cv2.merge(list(pixels), dst=interleaved)
            pixels = interleaved
        if channels == 1:
            cv2.LUT(pixels.reshape(pixels.shape[:2]), tables[0], dst=target_array[k, ..., 0])
        else:
            cv2.LUT(pixels, table, dst=target_array[k])
    return True
