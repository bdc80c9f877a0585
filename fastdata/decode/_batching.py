"""Device-agnostic helpers for the GPU backends, kept free of CUDA so CI tests them on CPU:
batch-then-one-by-one decoding (one bad image must not sink a batch), telling decode
errors from environment errors, and torch crop/resize batched by geometry."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional alias

from fastdata.decode._base import copy_to_device
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

# torchvision reports nvJPEG failures as "<step>: <nvjpegStatus_t>" and CUDA failures as
# "Failed to synchronize CUDA stream: <cudaError_t>" (decode_jpegs_cuda.cpp), numbers only.
_STATUS_AT_END = re.compile(r":\s*(\d+)\s*$")
# nvjpegStatus_t values that say the environment failed, not the image: 1 not initialized,
# 5 allocator failure (out of memory), 6 execution failed, 7 arch mismatch, 8 internal
# error. The others are the image's: 2 invalid parameter, 3 bad JPEG, 4 JPEG not
# supported, 9 implementation not supported, 10 incomplete bitstream.
_NVJPEG_ENVIRONMENT_STATUSES = frozenset({1, 5, 6, 7, 8})
# Steps that fail only for environment reasons, whatever the number: setting nvJPEG up,
# creating its buffers, and any CUDA call.
_ENVIRONMENT_STEPS = ("initialize nvjpeg", "failed to create", "nvjpeggetproperty", "cuda")


def _numbered_status_is_environment(message: str) -> bool:
    """Whether a torchvision message whose first line ends in a status number names an
    environment failure (see ``_NVJPEG_ENVIRONMENT_STATUSES``); ``False`` without one."""
    lines = message.splitlines()
    first = lines[0] if lines else ""  # a C++ stack trace may follow on later lines
    match = _STATUS_AT_END.search(first)
    if match is None:
        return False
    step = first[: match.start()]
    if "failed" not in step:  # torchvision's steps say "Failed to ..." / "... failed"
        return False
    if any(marker in step for marker in _ENVIRONMENT_STEPS):
        return True
    return int(match[1]) in _NVJPEG_ENVIRONMENT_STATUSES


def is_environment_error(error: BaseException) -> bool:
    """Whether ``error`` comes from the environment (CUDA out of memory, a build without
    nvJPEG, an API the installed version lacks, a CUDA fault, nvJPEG status 1, 5-8 as
    torchvision reports it: "Failed to decode batch: 5") rather than from a bad image.

    Decoders treat only the other errors as per-image decode failures.
    """
    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    if isinstance(error, TypeError | AttributeError | NotImplementedError | ImportError):
        return True  # the installed library does not take what we pass: not the image
    message = str(error).strip().lower()
    if any(marker in message for marker in _ENVIRONMENT_MARKERS):
        return True
    return _numbered_status_is_environment(message)


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
    if len(groups) == 1:
        regions = torch.stack(
            [_region(image, box) for image, box in zip(images, boxes, strict=True)]
        )
        out.copy_(resize_regions(regions.float(), out_hw).round_().clamp_(0, 255))
        return
    # The rows of every group, uploaded once as a device index: a Python list as an index
    # on a CUDA tensor is built on the host and copied synchronously, one host sync per
    # group (per image with random crops).
    order = [row for rows in groups.values() for row in rows]
    order_index = copy_to_device(torch.tensor(order, dtype=torch.int64), out.device)
    resized = torch.empty(out.shape, dtype=torch.float32, device=out.device)
    start = 0
    for rows in groups.values():
        regions = torch.stack([_region(images[row], boxes[row]) for row in rows]).float()
        rows_index = order_index[start : start + len(rows)]
        resized.index_copy_(0, rows_index, resize_regions(regions, out_hw))
        start += len(rows)
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
