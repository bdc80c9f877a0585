"""Device-agnostic helpers for the GPU backends, kept free of CUDA so CI tests them on CPU:
batch-then-one-by-one decoding (one bad image must not sink a batch), telling decode
errors from environment errors, and torch crop/resize batched by geometry."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional alias

from fastdata.decode._geometry import Box

In = TypeVar("In")
Out = TypeVar("Out")

# The largest shrink factor per axis handed to antialiased bilinear interpolation; larger
# shrinks are area-averaged down to this factor first. CUDA's antialiased kernel keeps the
# filter weights in shared memory and fails ("Too much shared memory required") beyond
# about 94x per axis; 4x keeps the filter short and the result close to area averaging.
MAX_INTERPOLATION_SHRINK = 4

# Messages of errors that say the environment is wrong (no nvJPEG, no memory, a CUDA
# fault), not the image: such errors must reach the caller, never become a skipped sample.
_ENVIRONMENT_MARKERS = (
    "not compiled with nvjpeg",
    "out of memory",
    "cuda error",
    "cudaerror",
    "cuda driver",
    "no kernel image",
    "allocation failed",
    "failed to allocate",
    "nvjpeg_status_allocator_failure",
    "nvjpeg_status_not_initialized",
    "nvjpeg_status_arch_mismatch",
    "nvjpeg_status_execution_failed",
    "nvjpeg_status_internal_error",
)


def is_environment_error(error: BaseException) -> bool:
    """Whether ``error`` comes from the environment (CUDA out of memory, a build without
    nvJPEG, an API the installed version lacks) rather than from a bad image.

    Decoders treat only the other errors as per-image decode failures.
    """
    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    if isinstance(error, TypeError | AttributeError | NotImplementedError | ImportError):
        return True  # the installed library does not take what we pass: not the image
    message = str(error).lower()
    return any(marker in message for marker in _ENVIRONMENT_MARKERS)


def decode_batch_or_each(
    items: Sequence[In],
    decode_many: Callable[[list[In]], list[Out]],
    decode_one: Callable[[In], Out],
    *,
    on_batch_failure: Callable[[Exception], None] | None = None,
) -> list[Out | Exception]:
    """Decode ``items`` in one batched call; if that call fails, decode them one by one.

    Batched decoders (nvJPEG through torchvision, DALI) return no partial results when any
    image is bad, so on failure each item is retried alone to find the culprits. Only
    decode errors are handled so: an environment error (:func:`is_environment_error`)
    raises at once, from the batched call or from any lone one.

    Args:
        items: The inputs.
        decode_many: Decodes a list of inputs in one call.
        decode_one: Decodes one input.
        on_batch_failure: Called with the batched call's error before the one-by-one
            retry (e.g. to warn, or to rebuild a pipeline the error left unusable).

    Returns:
        One entry per item: its decoded result, or the decode error its lone decode raised.

    Raises:
        Exception: An environment error, as raised by the decoder.
        RuntimeError: The batched decoder returned a wrong number of results.
    """
    if not items:
        return []
    try:
        results: list[Out | Exception] = list(decode_many(list(items)))
    except Exception as batch_error:
        if is_environment_error(batch_error):
            raise
        if on_batch_failure is not None:
            on_batch_failure(batch_error)
        results = []
        for item in items:
            try:
                results.append(decode_one(item))
            except Exception as error:
                if is_environment_error(error):
                    raise
                results.append(error)
    if len(results) != len(items):
        raise RuntimeError(f"the batched decoder returned {len(results)} for {len(items)} inputs")
    return results


def _pre_reduce(regions: torch.Tensor, out_hw: tuple[int, int]) -> torch.Tensor:
    """Area-average ``(N, C, H, W)`` float regions down to at most
    ``MAX_INTERPOLATION_SHRINK`` times ``out_hw`` per axis (no-op when already there)."""
    height, width = regions.shape[-2:]
    target = (
        min(height, MAX_INTERPOLATION_SHRINK * out_hw[0]),
        min(width, MAX_INTERPOLATION_SHRINK * out_hw[1]),
    )
    if target == (height, width):
        return regions
    return F.adaptive_avg_pool2d(regions, target)


def resize_regions(regions: torch.Tensor, out_hw: tuple[int, int]) -> torch.Tensor:
    """Resize ``(N, C, h, w)`` float regions of one size to ``(N, C, *out_hw)`` float.

    Antialiased bilinear in every case (it equals plain bilinear on an axis that grows,
    and antialiases an axis that shrinks even when the other grows), after area averaging
    when an axis shrinks more than ``MAX_INTERPOLATION_SHRINK`` times. Close to OpenCV's
    area resize when shrinking; works on any device.
    """
    if tuple(regions.shape[-2:]) == out_hw:
        return regions
    reduced = _pre_reduce(regions, out_hw)
    return F.interpolate(reduced, size=out_hw, mode="bilinear", align_corners=False, antialias=True)


def crop_resize_batch(
    images: Sequence[torch.Tensor], boxes: Sequence[Box], out: torch.Tensor
) -> None:
    """Cut ``boxes[i]`` out of ``images[i]`` (``(C, H, W)`` uint8) and resize each into
    ``out[i]`` (``(N, C, *out_hw)`` uint8, any memory format), batched by geometry.

    Regions of the same size are stacked and resized in one call (one set of kernel
    launches per distinct region size, not per image), and the float → uint8 rounding
    runs once for the whole batch.
    """
    if len(images) != len(boxes) or len(images) != out.shape[0]:
        raise ValueError(
            f"got {len(images)} images, {len(boxes)} boxes and {out.shape[0]} output rows"
        )
    if not images:
        return
    out_hw = (int(out.shape[-2]), int(out.shape[-1]))
    groups: dict[tuple[int, int], list[int]] = {}
    for row, box in enumerate(boxes):
        groups.setdefault((box.height, box.width), []).append(row)
    resized = torch.empty(out.shape, dtype=torch.float32, device=out.device)
    for rows in groups.values():
        regions = torch.stack([_region(images[row], boxes[row]) for row in rows]).float()
        resized[rows] = resize_regions(regions, out_hw)
    out.copy_(resized.round_().clamp_(0, 255))


def _region(image: torch.Tensor, box: Box) -> torch.Tensor:
    return image[:, box.top : box.top + box.height, box.left : box.left + box.width]


def crop_resize_chw(image: torch.Tensor, box: Box, out_hw: tuple[int, int]) -> torch.Tensor:
    """Cut ``box`` out of a ``(C, H, W)`` uint8 image and resize it to ``out_hw``.

    Returns:
        ``(C, out_h, out_w)`` uint8 on the image's device (see :func:`crop_resize_batch`).
    """
    region = _region(image, box)
    if (region.shape[1], region.shape[2]) == out_hw:
        return region
    out = torch.empty((1, image.shape[0], *out_hw), dtype=torch.uint8, device=image.device)
    crop_resize_batch([image], [box], out)
    return out[0]
