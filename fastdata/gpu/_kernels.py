"""The device kernels of the per-sample steps (:mod:`fastdata._ops_steps`): torch ops on
a ``(N, C, H, W)`` uint8 slice of the batch (C 1 or 3), one function per kernel name, the
same definitions as the CPU kernels (:mod:`fastdata.transforms._kernels`), whose
host-side tables and taps they reuse.

Each takes the slice, the step's per-sample parameters (NumPy, on the host), its options
and ``(N, 1, H, W)`` mask slices (kernels that move pixels), and returns new tensors. The
kernels that look each sample up in a table of 256 values are defined by the function that
makes the tables (``DEVICE_LUTS``; ``host_luts`` for those made from the parameters alone),
so that the lookups of several steps can run as one (:func:`fastdata.gpu._steps.run_device_steps`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from fastdata import _tables as cpu
from fastdata._mixing import box_masks
from fastdata._tables import Params
from fastdata._transfer import upload

DeviceKernel = Callable[
    [torch.Tensor, Params, dict[str, Any], list[torch.Tensor]],
    tuple[torch.Tensor, list[torch.Tensor]],
]


def _host(
    array: np.ndarray, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    # pinned and non_blocking on CUDA: a kernel never makes the host wait for the device
    return upload(array, device, dtype)


def _per_sample(values: np.ndarray, device: torch.device) -> torch.Tensor:
    return _host(values, device, torch.float32).view(-1, 1, 1, 1)


def luma(images: torch.Tensor) -> torch.Tensor:
    """PIL's ``L`` of ``(N, 3, H, W)`` uint8: ``(N, 1, H, W)`` uint8."""
    rgb = images.to(torch.int32)
    weighted = rgb[:, 0:1] * 19595 + rgb[:, 1:2] * 38470 + rgb[:, 2:3] * 7471 + 0x8000
    return (weighted >> 16).to(torch.uint8)


def blend(degenerate: torch.Tensor, images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's blend as uint8 (float32, clipped, truncated); ``factor`` broadcasts."""
    low = degenerate.to(torch.float32)
    temp = low + factor * (images.to(torch.float32) - low)
    return temp.clamp_(0, 255).to(torch.uint8)


def apply_luts(images: torch.Tensor, luts: torch.Tensor) -> torch.Tensor:
    """Map values through ``(N, 256)`` or ``(N, C, 256)`` uint8 tables."""
    count, channels = images.shape[:2]
    if luts.dim() == 2:
        luts = luts[:, None].expand(count, channels, 256)
    flat = images.reshape(count, channels, -1).to(torch.int64)
    return luts.gather(2, flat).view_as(images)


DeviceLuts = Callable[[torch.Tensor, Params], torch.Tensor]
_INVERTED = np.arange(255, -1, -1, dtype=np.uint8)


# The kernels that are a lookup in per-sample tables built on the host from their
# parameters alone (invert's tables are one table).
HOST_LUT_KERNELS = frozenset({"invert", *cpu.PARAMETER_LUTS})


def host_luts(kernel: str, params: Params, count: int) -> np.ndarray:
    """The ``(count, 256)`` uint8 tables of a kernel in ``HOST_LUT_KERNELS``."""
    if kernel == "invert":
        return np.broadcast_to(_INVERTED, (count, 256))
    return cpu.PARAMETER_LUTS[kernel](params)


def _lookup(build: DeviceLuts) -> DeviceKernel:
    def kernel(
        images: torch.Tensor, params: Params, options: dict[str, Any], masks: list[torch.Tensor]
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return apply_luts(images, build(images, params)), masks

    kernel.__doc__ = build.__doc__
    return kernel


def _from_host(build: Callable[[Params], np.ndarray]) -> DeviceLuts:
    return lambda images, params: _host(build(params), images.device)


def contrast_luts(images: torch.Tensor, params: Params) -> torch.Tensor:
    """PIL's contrast: a blend with the mean grey level, rounded."""
    gray = luma(images) if images.shape[1] == 3 else images
    means = gray.flatten(1).to(torch.float64).mean(dim=1).add_(0.5).floor_().to(torch.float32)
    levels = torch.arange(256, dtype=torch.float32, device=images.device)
    factor = _host(params["factor"], images.device, torch.float32)
    return blend(means[:, None], levels[None], factor[:, None])


def saturation(
    images: torch.Tensor, params: Params, options: dict[str, Any], masks: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """PIL's colour enhance: a blend with ``L``."""
    if images.shape[1] != 3:
        return images, masks
    return blend(luma(images), images, _per_sample(params["factor"], images.device)), masks


def grayscale(
    images: torch.Tensor, params: Params, options: dict[str, Any], masks: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """PIL's ``L`` in every channel."""
    if images.shape[1] != 3:
        return images, masks
    return luma(images).expand_as(images).contiguous(), masks


def rgb_to_hsv(rgb: torch.Tensor) -> torch.Tensor:
    """torchvision's float HSV of ``(N, 3, H, W)`` float32 RGB in [0, 1]."""
    maxc, minc = rgb.amax(dim=1), rgb.amin(dim=1)
    equal = maxc == minc
    span = maxc - minc
    ones = torch.ones_like(maxc)
    sat = span / torch.where(equal, ones, maxc)
    divisor = torch.where(equal, ones, span).unsqueeze(1)
    rc, gc, bc = ((maxc.unsqueeze(1) - rgb) / divisor).unbind(dim=1)
    not_red = maxc != rgb[:, 0]
    is_green = maxc == rgb[:, 1]
    hue = (bc - gc) * ~not_red
    hue = hue + (2.0 + rc - bc) * (is_green & not_red)
    hue = hue + (4.0 + gc - rc) * (not_red & ~is_green)
    hue = torch.fmod(hue / 6.0 + 1.0, 1.0)
    return torch.stack([hue, sat, maxc], dim=1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """torchvision's RGB of ``(N, 3, H, W)`` float32 HSV."""
    hue, sat, val = hsv.unbind(dim=1)
    h6 = hue * 6.0
    sextant = torch.floor(h6)
    frac = h6 - sextant
    sxf = sat * frac
    one_minus_s = 1.0 - sat
    q = ((1.0 - sxf) * val).clamp_(0.0, 1.0)
    t = ((sxf + one_minus_s) * val).clamp_(0.0, 1.0)
    p = (one_minus_s * val).clamp_(0.0, 1.0)
    vpqt = torch.stack([val, p, q, t], dim=1)
    select = _host(cpu.SEXTANT_SELECT, hsv.device)
    index = select[:, torch.remainder(sextant.to(torch.int64), 6)]  # (3, N, H, W)
    return vpqt.gather(1, index.transpose(0, 1))


def hue(
    images: torch.Tensor, params: Params, options: dict[str, Any], masks: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """torchvision's hue shift in float HSV."""
    if images.shape[1] != 3:
        return images, masks
    hsv = rgb_to_hsv(images.to(torch.float32) / 255.0)
    shift = _host(params["factor"], images.device, torch.float32).view(-1, 1, 1)
    hsv[:, 0] = torch.remainder(hsv[:, 0] + shift, 1.0)
    return (hsv_to_rgb(hsv) * (255.0 + 1.0 - 1e-3)).to(torch.uint8), masks


def smooth(images: torch.Tensor) -> torch.Tensor:
    """PIL's ``SMOOTH`` filter (3x3, rounded, outer rows and columns kept)."""
    channels = images.shape[1]
    weight = _host(cpu.SMOOTH, images.device)
    weight = weight.view(1, 1, 3, 3).expand(channels, 1, 3, 3)
    sums = F.conv2d(images.to(torch.float32), weight, groups=channels)
    out = images.clone()
    out[:, :, 1:-1, 1:-1] = torch.floor((sums + 6.5) / 13.0).to(torch.uint8)
    return out


def sharpness(
    images: torch.Tensor, params: Params, options: dict[str, Any], masks: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """PIL's sharpness: a blend with the smoothed image."""
    return blend(smooth(images), images, _per_sample(params["factor"], images.device)), masks


def invert(
    images: torch.Tensor, params: Params, options: dict[str, Any], masks: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``255 - x``."""
    return 255 - images, masks


def histograms(images: torch.Tensor) -> torch.Tensor:
    """``(N, C, 256)`` int64 per-channel histograms."""
    count, channels = images.shape[:2]
    keys = images.reshape(count * channels, -1).to(torch.int64)
    # scatter_add_, not bincount: bincount sizes its output from the data's maximum,
    # read back to the host (a sync on CUDA)
    hist = torch.zeros(count * channels, 256, dtype=torch.int64, device=images.device)
    hist.scatter_add_(1, keys, torch.ones_like(keys))
    return hist.view(count, channels, 256)


def equalize_luts(images: torch.Tensor, params: Params) -> torch.Tensor:
    """PIL's per-channel histogram equalisation."""
    hist = histograms(images)
    levels = torch.arange(256, device=images.device)
    last = 255 - torch.argmax((hist.flip(-1) > 0).to(torch.uint8), dim=-1)
    last_count = hist.gather(-1, last[..., None])[..., 0]
    step = torch.div(hist.sum(-1) - last_count, 255, rounding_mode="floor")
    below = torch.cumsum(hist, dim=-1) - hist
    safe = step.clamp(min=1)[..., None]
    table = torch.div(
        torch.div(safe, 2, rounding_mode="floor") + below, safe, rounding_mode="floor"
    )
    return torch.where(step[..., None] > 0, table, levels).clamp_(0, 255).to(torch.uint8)


def autocontrast_luts(images: torch.Tensor, params: Params) -> torch.Tensor:
    """PIL's per-channel stretch of [min, max] to [0, 255]."""
    flat = images.flatten(2)
    low, high = flat.amin(dim=2).to(torch.float64), flat.amax(dim=2).to(torch.float64)
    levels = torch.arange(256, dtype=torch.float64, device=images.device)
    span = (high - low)[..., None]
    # tensor / tensor: ``255.0 / span`` is computed as 255 * (1 / span), a rounding apart
    scale = torch.full_like(span, 255.0) / torch.where(span > 0, span, torch.ones_like(span))
    stretched = torch.trunc(levels * scale - low[..., None] * scale)
    return torch.where(span > 0, stretched, levels).clamp_(0, 255).to(torch.uint8)


def blur(
    images: torch.Tensor, params: Params, options: dict[str, Any], masks: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """torchvision's Gaussian blur (separable, reflected borders, rounded)."""
    count, channels, height, width = images.shape
    size_x, size_y = options["kernel_size"]
    sigmas = params["sigma"].tolist()
    taps_x = np.stack([cpu.gaussian_taps(size_x, s) for s in sigmas])  # (N, size_x)
    taps_y = np.stack([cpu.gaussian_taps(size_y, s) for s in sigmas])
    weight_x = _host(np.repeat(taps_x, channels, axis=0), images.device)
    weight_y = _host(np.repeat(taps_y, channels, axis=0), images.device)
    work = images.to(torch.float32).reshape(1, count * channels, height, width)
    work = F.pad(work, (size_x // 2, size_x // 2, size_y // 2, size_y // 2), mode="reflect")
    work = F.conv2d(work, weight_x.view(-1, 1, 1, size_x), groups=count * channels)
    work = F.conv2d(work, weight_y.view(-1, 1, size_y, 1), groups=count * channels)
    out = work.round_().clamp_(0, 255).to(torch.uint8)
    return out.view(count, channels, height, width), masks


def affine_theta(matrix: np.ndarray, height: int, width: int) -> np.ndarray:
    """``affine_grid``'s ``(N, 2, 3)`` theta of inverse maps in PIL's coordinates."""
    # normalised u = S x - 1 with S = diag(2 / W, 2 / H): theta = S L S^-1, offset
    # S L S^-1 1 + S o - 1
    scale = np.array([2.0 / width, 2.0 / height])
    linear = matrix[:, :, :2] * scale[None, :, None] / scale[None, None, :]
    offset = linear @ np.ones(2) + scale * matrix[:, :, 2] - 1.0
    return np.concatenate([linear, offset[:, :, None]], axis=2)


def affine(
    images: torch.Tensor, params: Params, options: dict[str, Any], masks: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Warp by inverse maps with ``grid_sample``; outside pixels take ``fill``."""
    count, channels, height, width = images.shape
    theta = _host(affine_theta(params["matrix"], height, width), images.device, torch.float32)
    grid = F.affine_grid(theta, [count, 1, height, width], align_corners=False)
    fill = options["fill"] * channels if len(options["fill"]) == 1 else options["fill"]
    fill_values = _host(np.asarray(fill, np.float32), images.device).view(1, -1, 1, 1)
    work = torch.cat(
        [images.to(torch.float32), torch.ones_like(images[:, :1], dtype=torch.float32)], dim=1
    )
    mode = options["interpolation"]
    sampled = F.grid_sample(work, grid, mode=mode, padding_mode="zeros", align_corners=False)
    inside, warped = sampled[:, -1:], sampled[:, :-1]
    if mode == "nearest":
        warped = torch.where(inside < 0.5, fill_values.expand_as(warped), warped)
    else:  # bilinear over a constant border: the outside taps' weight goes to the fill
        warped = warped + fill_values * (1.0 - inside)
    out = warped.round_().clamp_(0, 255).to(images.dtype)
    mask_outs = [
        F.grid_sample(mask.to(torch.float32), grid, mode="nearest", align_corners=False)
        .round_()
        .to(mask.dtype)
        for mask in masks
    ]
    return out, mask_outs


def erase(
    images: torch.Tensor, params: Params, options: dict[str, Any], masks: list[torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Set each sample's box to ``value`` (or the CPU kernel's seeded noise): one select
    over the slice with box masks, the noise laid out on the host and copied once."""
    count, channels, height, width = images.shape
    value = options["value"]
    boxes = params["box"].astype(np.int64).reshape(count, 4)
    if value == "random":
        canvas = np.zeros((count, channels, height, width), np.uint8)
        for k, ((top, left, box_h, box_w), seed) in enumerate(
            zip(boxes.tolist(), params["seed"].tolist(), strict=True)
        ):
            noise = cpu.erase_noise(seed, (box_h, box_w, channels)).transpose(2, 0, 1)
            canvas[k, :, top : top + box_h, left : left + box_w] = noise
        replacement = _host(canvas, images.device)
    else:
        replacement = _host(np.asarray(value, np.uint8), images.device).view(1, -1, 1, 1)
    inside = box_masks(boxes, height, width, images.device)
    return torch.where(inside, replacement.to(images.dtype), images), masks


# The table-lookup kernels' tables (``(N, 256)`` or ``(N, C, 256)`` uint8) on the device.
DEVICE_LUTS: dict[str, DeviceLuts] = {
    **{name: _from_host(build) for name, build in cpu.PARAMETER_LUTS.items()},
    "contrast": contrast_luts,
    "equalize": equalize_luts,
    "autocontrast": autocontrast_luts,
}

# Every kernel that is a lookup in per-sample tables (invert: one subtraction when alone).
LOOKUP_KERNELS = frozenset({"invert", *DEVICE_LUTS})

DEVICE_KERNELS: dict[str, DeviceKernel] = {
    **{name: _lookup(build) for name, build in DEVICE_LUTS.items()},
    "saturation": saturation,
    "hue": hue,
    "sharpness": sharpness,
    "grayscale": grayscale,
    "invert": invert,
    "blur": blur,
    "affine": affine,
    "erase": erase,
}
