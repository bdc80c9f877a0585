"""Device-agnostic helpers for the GPU backends, kept free of CUDA so CI tests them on CPU:
batch-then-one-by-one decoding (one bad image must not sink a batch), telling decode
errors from environment errors, and torch crop/resize of a whole batch in two matmuls."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from fastdata._transfer import copy_to_device
from fastdata.decode._geometry import Box

In = TypeVar("In")
Out = TypeVar("Out")

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


# The most float32 elements (``rows x C x H x W``) of padded regions resampled in one
# call: 256 MiB, a batch of 64 ImageNet-sized crops in one go; larger images go in chunks
# of consecutive rows (a single region over the budget still goes alone).
MAX_PADDED_ELEMENTS = 1 << 26


def axis_weights(sizes: torch.Tensor, out_size: int, padded_size: int) -> torch.Tensor:
    """Resampling matrices for one axis: ``(N, out_size, padded_size)`` float32 on
    ``sizes``' device, row ``j`` of matrix ``i`` the weights of source pixels
    ``0 .. sizes[i] - 1`` in output pixel ``j`` (zero beyond ``sizes[i]``, rows sum to 1).

    Shrinking (``sizes[i] > out_size``): an exact area average, each source pixel weighted
    by how much of it the output pixel's span ``[j * s, (j + 1) * s)`` covers (OpenCV's
    ``INTER_AREA``). Otherwise bilinear with half-pixel centres and the edge pixels repeated
    (``F.interpolate(mode="bilinear", align_corners=False)``; the identity at equal size).

    Args:
        sizes: ``(N,)`` integer region sizes along the axis, each >= 1.
        out_size: The output size along the axis.
        padded_size: The padded source size along the axis (>= every size).
    """
    size = sizes.to(torch.float32).view(-1, 1, 1)
    scale = size / out_size
    target = torch.arange(out_size, dtype=torch.float32, device=sizes.device).view(1, -1, 1)
    source = torch.arange(padded_size, dtype=torch.float32, device=sizes.device).view(1, 1, -1)
    # in place where possible: these are (N, out_size, padded_size) each
    covered = torch.minimum(source + 1, (target + 1) * scale)
    covered.sub_(torch.maximum(source, target * scale))
    tent = (source - ((target + 0.5) * scale - 0.5)).abs_().neg_().add_(1)
    weights = torch.where(scale > 1, covered, tent).clamp_(min=0).mul_(source < size)
    return weights.div_(weights.sum(-1, keepdim=True))


def _chunks(boxes: Sequence[Box], channels: int) -> list[tuple[int, int]]:
    """Consecutive ``(start, stop)`` row ranges whose regions, padded to the range's largest
    height and width, hold at most ``MAX_PADDED_ELEMENTS`` floats (one row at least)."""
    chunks: list[tuple[int, int]] = []
    start, height, width = 0, 0, 0
    for row, box in enumerate(boxes):
        grown = (max(height, box.height), max(width, box.width))
        if row > start and (row - start + 1) * channels * grown[0] * grown[1] > (
            MAX_PADDED_ELEMENTS
        ):
            chunks.append((start, row))
            start, grown = row, (box.height, box.width)
        height, width = grown
    chunks.append((start, len(boxes)))
    return chunks


def _resample_chunk(
    images: Sequence[torch.Tensor], boxes: Sequence[Box], sizes: torch.Tensor, out: torch.Tensor
) -> None:
    """Resize the regions of one chunk into ``out`` with two batched matmuls.

    The regions are copied (as float32, zero-padded) into one buffer laid out
    ``(N, A, C, B)``, ``A`` the axis resampled first: the first matmul is then
    ``(N, out_a, A) @ (N, A, C * B)`` and the second ``(N, out_a * C, B) @ (N, B, out_b)``,
    with no copy in between. ``A`` is the axis whose order costs fewer multiplications.
    """
    rows, channels = len(boxes), int(out.shape[1])
    out_h, out_w = int(out.shape[-2]), int(out.shape[-1])
    height = max(box.height for box in boxes)
    width = max(box.width for box in boxes)
    rows_first = out_h * width * (height + out_w) <= out_w * height * (width + out_h)
    if rows_first:
        padded = torch.zeros(
            (rows, height, channels, width), dtype=torch.float32, device=out.device
        )
        regions = padded.permute(0, 2, 1, 3)  # (N, C, H, W) view
        first = axis_weights(sizes[:, 0], out_h, height)
        second = axis_weights(sizes[:, 1], out_w, width)
    else:
        padded = torch.zeros(
            (rows, width, channels, height), dtype=torch.float32, device=out.device
        )
        regions = padded.permute(0, 2, 3, 1)
        first = axis_weights(sizes[:, 1], out_w, width)
        second = axis_weights(sizes[:, 0], out_h, height)
    for row, (image, box) in enumerate(zip(images, boxes, strict=True)):
        regions[row, :, : box.height, : box.width].copy_(_region(image, box))
    half = torch.bmm(first, padded.view(rows, padded.shape[1], -1))
    full = torch.bmm(half.view(rows, -1, padded.shape[3]), second.transpose(1, 2))
    full = full.view(rows, first.shape[1], channels, second.shape[1])
    # (N, out_a, C, out_b) -> (N, C, out_h, out_w)
    resized = full.permute(0, 2, 1, 3) if rows_first else full.permute(0, 2, 3, 1)
    out.copy_(resized.round_().clamp_(0, 255))


def crop_resize_batch(
    images: Sequence[torch.Tensor], boxes: Sequence[Box], out: torch.Tensor
) -> None:
    """Cut ``boxes[i]`` out of ``images[i]`` (``(C, H, W)`` uint8) and resize each into
    ``out[i]`` (``(N, C, *out_hw)`` uint8, any memory format), all sizes together.

    Each axis is resampled by a matrix (:func:`axis_weights`: area average when shrinking,
    bilinear when enlarging), so the whole batch is two batched matmuls over the regions
    zero-padded to the largest one, whatever the mix of crop sizes: the number of kernel
    launches does not grow with distinct sizes (only a copy per region). The region sizes
    go to the device in one copy from pinned memory; nothing waits for the device. Batches
    of large images go in chunks of rows (``MAX_PADDED_ELEMENTS``).

    Precision: float32 matmuls; with TF32 matmuls allowed
    (``torch.backends.cuda.matmul.allow_tf32``) a pixel may differ by a level.
    """
    if len(images) != len(boxes) or len(images) != out.shape[0]:
        raise ValueError(
            f"got {len(images)} images, {len(boxes)} boxes and {out.shape[0]} output rows"
        )
    if not images:
        return
    out_hw = (int(out.shape[-2]), int(out.shape[-1]))
    if all((box.height, box.width) == out_hw for box in boxes):
        out.copy_(
            torch.stack([_region(image, box) for image, box in zip(images, boxes, strict=True)])
        )
        return
    # a device tensor copied from pinned memory: built from a Python list on a CUDA device
    # it would be copied synchronously (a host sync)
    sizes = copy_to_device(
        torch.tensor([(box.height, box.width) for box in boxes], dtype=torch.int64), out.device
    )
    for start, stop in _chunks(boxes, int(out.shape[1])):
        _resample_chunk(images[start:stop], boxes[start:stop], sizes[start:stop], out[start:stop])


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
