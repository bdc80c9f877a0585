"""``Normalize`` of a uint8 batch on the device in one pass, by a Triton kernel.

torch's ``addcmul`` of a uint8 batch with float32 per-channel constants, written into a
``float16``/``bfloat16``/``float32`` output, is one kernel, but with mixed dtypes and a
broadcast operand it takes torch's generic strided loop: each element is loaded alone,
through an index computation, which runs at a fraction of the memory bandwidth. On a busy
device the normalization then takes compute time that the prefetcher's side stream cannot
hide. The kernels here compute each value with the same fused multiply-add in float32 as
``addcmul``, rounded once to the output dtype (the same bytes), in wide loads and stores:

- batch and output in the same memory order (a ``(B, H, W, C)`` batch into a
  ``channels_last`` output, a planar batch into a contiguous one): both walked as flat
  arrays;
- in different orders (a ``(B, H, W, C)`` batch into a contiguous, planar output, the
  default): a block of pixels at a time, each channel read from the pixels and written as
  one run of its plane.

torch ships no eager fused kernel for this, and ``torch.compile`` is a whole-program
choice (a compile at the first batch, a recompile per shape) that the module leaves to the
user; Triton, which CUDA builds of torch install, compiles these small kernels once per
dtype pair. Without Triton, or where it cannot compile here (its launcher needs a C
compiler), ``addcmul`` does the work, with one warning.
"""

from __future__ import annotations

import functools
import warnings
from contextlib import nullcontext
from typing import Any

import torch

# Values per program: uint8 loads 16 wide per thread with 4 warps of 32 threads.
_BLOCK = 16 * 4 * 32 * 4
# Pixels per program where the memory orders differ (each pixel has a value per channel).
_PIXEL_BLOCK = 2048
# Batches of more values than this take 64-bit offsets.
_WIDE_FROM = 2**31 - 1 - _BLOCK
# Set once a launch failed here; addcmul is used from then on.
_unavailable: list[str] = []


@functools.cache
def _kernels() -> Any:
    """``(flat, by_pixels)``: the Triton kernels, each compiled per dtype pair at its first
    launch; ``None`` without Triton."""
    try:
        import triton  # noqa: PLC0415 - optional: CUDA builds of torch install it
        import triton.language as tl  # noqa: PLC0415
    except ImportError:
        return None

    @triton.jit
    def flat(  # type: ignore[no-untyped-def]  # noqa: PLR0917 - a kernel's signature
        images,
        out,
        scale,
        bias,
        numel,
        channel_stride,
        channels: tl.constexpr,
        block: tl.constexpr,
        wide: tl.constexpr,
    ):
        start = tl.program_id(0)
        if wide:  # offsets past 2**31 elements
            start = start.to(tl.int64)
        offsets = start * block + tl.arange(0, block)
        inside = offsets < numel
        channel = (offsets // channel_stride) % channels
        levels = tl.load(images + offsets, mask=inside, other=0).to(tl.float32)
        values = tl.fma(levels, tl.load(scale + channel), tl.load(bias + channel))
        tl.store(out + offsets, values.to(out.dtype.element_ty), mask=inside)

    @triton.jit
    def by_pixels(  # type: ignore[no-untyped-def]  # noqa: PLR0917 - a kernel's signature
        images,
        out,
        scale,
        bias,
        pixels,
        pixels_per_image,
        in_image_stride,
        in_pixel_stride,
        in_channel_stride,
        out_image_stride,
        out_pixel_stride,
        out_channel_stride,
        channels: tl.constexpr,
        block: tl.constexpr,
        wide: tl.constexpr,
    ):
        start = tl.program_id(0)
        if wide:  # offsets past 2**31 elements
            start = start.to(tl.int64)
        pixel = start * block + tl.arange(0, block)  # of the whole batch
        inside = pixel < pixels
        image = pixel // pixels_per_image
        within = pixel - image * pixels_per_image
        source = images + image * in_image_stride + within * in_pixel_stride
        target = out + image * out_image_stride + within * out_pixel_stride
        for channel in tl.static_range(channels):
            levels = tl.load(source + channel * in_channel_stride, mask=inside, other=0)
            values = tl.fma(
                levels.to(tl.float32), tl.load(scale + channel), tl.load(bias + channel)
            )
            tl.store(
                target + channel * out_channel_stride,
                values.to(out.dtype.element_ty),
                mask=inside,
            )

    return flat, by_pixels


def _pixel_strides(tensor: torch.Tensor) -> tuple[int, int, int] | None:
    """``(image, pixel, channel)`` strides of a ``(B, C, H, W)`` tensor whose ``H`` and ``W``
    make one run of pixels; ``None`` where they do not."""
    height, width = tensor.shape[2:]
    pixel = tensor.stride(3) if width > 1 else tensor.stride(2)
    if height > 1 and width > 1 and tensor.stride(2) != width * pixel:
        return None
    return tensor.stride(0), pixel, tensor.stride(1)


def normalize_in_one_pass(
    images: torch.Tensor, out: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor
) -> bool:
    """Write ``bias + images * scale`` (float32, per channel, rounded once) into ``out`` and
    return ``True``; ``False`` (nothing written) where the kernels do not apply: no Triton,
    a batch whose rows and columns are not one run of pixels, or a launch here that failed
    before.

    ``images``: uint8 ``(B, C, H, W)`` (any memory order); ``out``: a fresh tensor of the
    same shape on the same device; ``scale``/``bias``: ``C`` float32 values there.
    """
    kernels = _kernels()
    if kernels is None or _unavailable:
        return False
    flat, by_pixels = kernels
    numel = images.numel()
    if numel == 0:
        return True
    scale, bias = scale.reshape(-1).contiguous(), bias.reshape(-1).contiguous()
    channels = images.shape[1]
    if images.stride() == out.stride():  # the same memory order, both dense
        grid = ((numel + _BLOCK - 1) // _BLOCK,)
        kernel = flat[grid]
        args: tuple[int, ...] = (numel, images.stride(1))
        block = _BLOCK
    else:
        source, target = _pixel_strides(images), _pixel_strides(out)
        if source is None or target is None:
            return False
        pixels = numel // channels
        grid = ((pixels + _PIXEL_BLOCK - 1) // _PIXEL_BLOCK,)
        kernel = by_pixels[grid]
        args = (pixels, pixels // images.shape[0], *source, *target)
        block = _PIXEL_BLOCK
    try:
        # off CUDA only under Triton's interpreter (the tests)
        device = torch.cuda.device(images.device) if images.is_cuda else nullcontext()
        with device:
            kernel(
                images,
                out,
                scale,
                bias,
                *args,
                channels=channels,
                block=block,
                wide=numel > _WIDE_FROM,
            )
    except Exception as error:  # any compile or launch failure: addcmul instead
        _unavailable.append(f"{type(error).__name__}: {error}")
        warnings.warn(
            f"fastdata.gpu.Normalize: its one-pass Triton kernel cannot run here "
            f"({_unavailable[0][:300]}); torch.addcmul normalizes instead, at a fraction of "
            f"the memory bandwidth",
            RuntimeWarning,
            stacklevel=3,
        )
        return False
    return True
