"""Device-agnostic helpers for the GPU backends, kept free of CUDA so CI tests them on CPU:
batch-then-one-by-one decoding (one bad image must not sink a batch) and torch crop/resize."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional alias

from fastdata.decode._geometry import Box

In = TypeVar("In")
Out = TypeVar("Out")


def decode_batch_or_each(
    items: Sequence[In],
    decode_many: Callable[[list[In]], list[Out]],
    decode_one: Callable[[In], Out],
) -> list[Out | Exception]:
    """Decode ``items`` in one batched call; if that call fails, decode them one by one.

    Batched decoders (nvJPEG through torchvision, DALI) return no partial results when any
    image is bad, so on failure each item is retried alone to find the culprits.

    Returns:
        One entry per item: its decoded result, or the exception its lone decode raised.
    """
    if not items:
        return []
    try:
        results: list[Out | Exception] = list(decode_many(list(items)))
    except Exception:
        results = []
        for item in items:
            try:
                results.append(decode_one(item))
            except Exception as error:
                results.append(error)
    if len(results) != len(items):
        raise RuntimeError(f"the batched decoder returned {len(results)} for {len(items)} inputs")
    return results


def crop_resize_chw(image: torch.Tensor, box: Box, out_hw: tuple[int, int]) -> torch.Tensor:
    """Cut ``box`` out of a ``(C, H, W)`` uint8 image and resize it to ``out_hw``.

    Works on any device. Shrinking uses antialiased bilinear interpolation (close to
    OpenCV's area averaging); enlarging plain bilinear.

    Returns:
        ``(C, out_h, out_w)`` uint8 on the image's device.
    """
    region = image[:, box.top : box.top + box.height, box.left : box.left + box.width]
    if (region.shape[1], region.shape[2]) == out_hw:
        return region
    shrinking = region.shape[1] >= out_hw[0] and region.shape[2] >= out_hw[1]
    resized = F.interpolate(
        region.unsqueeze(0).float(),
        size=out_hw,
        mode="bilinear",
        align_corners=False,
        antialias=shrinking,
    )
    return resized.squeeze(0).round_().clamp_(0, 255).to(torch.uint8)
