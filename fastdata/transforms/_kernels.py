"""The CPU kernels of the per-sample steps (:mod:`fastdata._ops_steps`): NumPy and OpenCV
on a ``(N, H, W, C)`` uint8 slice of the batch (C 1 or 3), one function per kernel name.

``CPU_KERNELS`` maps each name to its function: here, or in :mod:`._hsv` (hue) and
:mod:`._warp` (affine). Each takes the slice, the step's per-sample parameters for it, its
shared options and the mask slices (``(N, H, W)`` uint8, given to kernels that move
pixels), and returns the new slice and masks (written in place where it can). Values follow
PIL's definitions (see :mod:`fastdata._ops_colour`): blends in float32 truncated to uint8,
lookup tables built in float64 where PIL builds them in Python.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import cv2
import numpy as np

from fastdata._planes import cached_planes
from fastdata._tables import (
    LEVELS,
    PARAMETER_LUTS,
    Params,
    blend,
    erase_noise,
    gaussian_taps,
    posterize_luts,
    solarize_add_luts,
    table,
)
from fastdata.transforms._hsv import hue
from fastdata.transforms._warp import affine

Kernel = Callable[
    [np.ndarray, Params, dict[str, Any], list[np.ndarray]], tuple[np.ndarray, list[np.ndarray]]
]


# PIL's L weights over 65536 and the 0.5 of its rounding, one row of cv2.transform: every
# product and partial sum is a multiple of 2**-16 below 256, exact in float32.
LUMA_WEIGHTS = np.array([[19595, 38470, 7471, 32768]], np.float32) / np.float32(65536.0)


def luma(images: np.ndarray) -> np.ndarray:
    """PIL's ``L`` of ``(N, H, W, 3)`` uint8 images: ``(N, H, W)`` uint8,
    ``(19595 R + 38470 G + 7471 B + 32768) >> 16`` (exact: float32 holds the sums)."""
    out = np.empty(images.shape[:3], np.uint8)
    for k in range(len(images)):
        rgb = images[k].astype(np.float32)  # cv2.transform keeps the input's depth
        sums: np.ndarray = cv2.transform(rgb, LUMA_WEIGHTS).reshape(images.shape[1:3])
        sums = sums.astype(np.float32, copy=False)
        out[k] = np.floor(sums, out=sums)
    return out


def _each(kernel: Kernel) -> Kernel:
    """``kernel`` run one sample at a time (its float temporaries stay in cache)."""

    def per_image(
        images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        for k in range(len(images)):
            one = {name: value[k : k + 1] for name, value in params.items()}
            kernel(images[k : k + 1], one, options, [])
        return images, masks

    per_image.__doc__ = kernel.__doc__
    return per_image


def _per_sample(values: np.ndarray, ndim: int) -> np.ndarray:
    """``(N,)`` values shaped to broadcast over ``(N, ...)`` of ``ndim`` axes."""
    return values.reshape((-1,) + (1,) * (ndim - 1))


def apply_luts(images: np.ndarray, luts: np.ndarray) -> np.ndarray:
    """Map every value through its sample's table of ``(N, 256)`` uint8 (all channels), in
    place (any strides)."""
    channels = images.shape[-1]
    for k in range(len(images)):
        image = images[k] if channels > 1 else images[k, ..., 0]
        table = luts[k]
        if image.flags.c_contiguous:
            cv2.LUT(image, table, dst=image)
        else:  # OpenCV writes only into contiguous memory
            image[...] = cv2.LUT(image, table).reshape(image.shape)
    return images


def blend_into(image: np.ndarray, degenerate: np.ndarray, factor: float) -> None:
    """:func:`fastdata._tables.blend` of one sample written into ``image``, in place, with
    one float32 buffer (the same float32 operations in the same order: the same bytes).
    ``degenerate`` broadcasts against ``image``."""
    blend_floats_into(image, image.astype(np.float32), degenerate.astype(np.float32), factor)


def blend_floats_into(image: np.ndarray, work: np.ndarray, low: np.ndarray, factor: float) -> None:
    """:func:`blend_into` from float32 copies of the sample (``work``, overwritten) and of
    the degenerate (``low``)."""
    work -= low
    work *= np.float32(factor)
    work += low
    if not 0.0 <= factor <= 1.0:
        # between the two values the rounded sum stays in [0, 255]: rounding is monotonic
        # and both ends are exact, so only an extrapolating factor needs the clip
        np.clip(work, 0, 255, out=work)
    image[...] = work  # truncates, as astype(np.uint8) does


def _lut_kernel(build: Callable[[Params], np.ndarray]) -> Kernel:
    def kernel(
        images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        return apply_luts(images, build(params)), masks

    return kernel


def posterize(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Keep the ``bits`` highest bits: a bitwise and with the mask that the table maps 255
    to (several times faster than the lookup)."""
    for k, keep in enumerate(posterize_luts(params["bits"])[:, 255].tolist()):
        np.bitwise_and(images[k], np.uint8(keep), out=images[k])
    return images, masks


def _level_mask(image: np.ndarray, low: int, value: int, below: bool) -> np.ndarray:
    """``value`` where ``image`` (one sample, any layout) is ``> low`` (``<= low`` if
    ``below``), else 0: uint8 of its shape (OpenCV's threshold on its 2-D view)."""
    rows = image.reshape(image.shape[0], -1)  # a copy if ``image`` is strided: only read
    kind = cv2.THRESH_BINARY_INV if below else cv2.THRESH_BINARY
    return cv2.threshold(rows, low, value, kind)[1].reshape(image.shape)


def solarize(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """``255 - x`` where ``x >= threshold`` (the table's values): ``x`` xor 255 there, the
    255s from a threshold (arithmetic masked by NumPy's ``where`` runs several times
    slower than the lookup on photos)."""
    for k, threshold in enumerate(params["threshold"].tolist()):
        lowest = math.ceil(threshold)  # the least integer level at or above it
        if lowest <= 0:
            np.subtract(255, images[k], out=images[k])
        elif lowest <= 255:
            np.bitwise_xor(images[k], _level_mask(images[k], lowest - 1, 255, False), out=images[k])
    return images, masks


def solarize_add(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """timm's ``solarize_add``: ``x + add`` below 128 (the table's values). Where ``add`` is
    in [0, 128] no sum passes 255: ``add`` itself is thresholded in below 128 and added;
    elsewhere the table."""
    for k, add in enumerate(params["add"].tolist()):
        if 0 <= add <= 128:
            # levels are integers: truncating x + add is adding its floor
            step = _level_mask(images[k], 127, math.floor(add), True)
            np.add(images[k], step, out=images[k])
        else:
            apply_luts(images[k : k + 1], solarize_add_luts(np.array([add])))
    return images, masks


def contrast_means(images: np.ndarray) -> np.ndarray:
    """PIL's contrast degenerate: the mean of ``L`` rounded, ``(N,)`` int64.

    The floored ``L`` of an RGB image stays float32 (:func:`luma`'s exact values) and is
    summed by OpenCV in float64, exact: the mean is the same double as NumPy's."""
    count, height, width, channels = images.shape
    totals = np.empty(count, np.float64)
    for k in range(count):
        if channels == 3:
            sums = cv2.transform(images[k].astype(np.float32), LUMA_WEIGHTS)
            totals[k] = cv2.sumElems(np.floor(sums, out=sums))[0]
        else:
            totals[k] = cv2.sumElems(images[k])[0]
    return np.floor(totals / (height * width) + 0.5).astype(np.int64)


def contrast(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """PIL's contrast: a blend with the image's mean grey level."""
    means = contrast_means(images).astype(np.float32)[:, None]
    return apply_luts(images, blend(means, LEVELS[None], params["factor"][:, None])), masks


def saturation(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """PIL's colour enhance: a blend with the image's ``L`` grey."""
    if images.shape[-1] != 3:
        return images, masks
    for k, factor in enumerate(params["factor"].tolist()):
        # one float32 copy serves the grey (:func:`luma`'s exact values) and the blend;
        # the grey in all three channels: arithmetic broadcasting a channel of 1 against 3
        # runs NumPy's inner loop 3 values at a time, several times slower
        work = images[k].astype(np.float32)
        gray = cv2.transform(work, LUMA_WEIGHTS)
        gray = cv2.cvtColor(np.floor(gray, out=gray), cv2.COLOR_GRAY2RGB)
        blend_floats_into(images[k], work, gray, factor)
    return images, masks


def grayscale(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """PIL's ``L`` in every channel."""
    if images.shape[-1] == 3:
        for k, gray in enumerate(luma(images)):
            cv2.cvtColor(gray, cv2.COLOR_GRAY2RGB, dst=images[k])
    return images, masks


def smooth(images: np.ndarray) -> np.ndarray:
    """PIL's ``ImageFilter.SMOOTH`` of each image: the 3x3 kernel
    ``[[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13``, rounded, the outer rows and columns kept.

    The kernel is a 3x3 box sum plus four times the centre: a uint16 box filter and a shift,
    exact; OpenCV's conversion of a thirteenth of it to uint8 rounds the float quotient,
    exact too, since a sum of integers over 13 is never within 1/26 of a tie."""
    out = np.empty_like(images)
    for k, image in enumerate(images):
        total = cv2.boxFilter(
            image, cv2.CV_16U, (3, 3), normalize=False, borderType=cv2.BORDER_REPLICATE
        ).reshape(image.shape)
        centre = image.astype(np.uint16)
        centre <<= 2
        total += centre
        cv2.convertScaleAbs(total, dst=out[k], alpha=1.0 / 13.0)
        for edge in (np.s_[0], np.s_[-1], np.s_[:, 0], np.s_[:, -1]):
            out[k][edge] = image[edge]
    return out


def sharpness(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """PIL's sharpness: a blend with the smoothed image."""
    smoothed = smooth(images)
    for k, factor in enumerate(params["factor"].tolist()):
        blend_into(images[k], smoothed[k], factor)
    return images, masks


def invert(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """``255 - x``."""
    np.subtract(255, images, out=images)
    return images, masks


def split_planes(images: np.ndarray) -> np.ndarray:
    """``(N, C, H, W)`` planes of ``(N, H, W, C)`` images: a view of a gray batch, else
    copies split by OpenCV (written through the cache: :mod:`fastdata._planes`)."""
    if images.shape[-1] == 1:
        return images.transpose(0, 3, 1, 2)
    count, height, width, channels = images.shape
    planes = cached_planes(count, channels, height, width)
    for k in range(count):
        cv2.split(images[k], list(planes[k]))
    return planes


def map_planes(images: np.ndarray, planes: np.ndarray, luts: np.ndarray) -> np.ndarray:
    """``images`` with each of its :func:`split_planes` planes mapped through its table of
    ``(N, C, 256)`` uint8, in place: a lookup per plane and a merge (OpenCV looks up a
    table per channel of interleaved pixels value by value, half again slower)."""
    gray = images.shape[-1] == 1
    for k in range(len(images)):
        image_planes = list(planes[k])
        for channel, plane in enumerate(image_planes):
            if plane.flags.c_contiguous:
                cv2.LUT(plane, luts[k, channel], dst=plane)
            else:  # a gray view of strided memory: OpenCV writes only into contiguous memory
                plane[...] = cv2.LUT(plane, luts[k, channel])
        if gray:
            continue
        if images[k].flags.c_contiguous:
            cv2.merge(image_planes, dst=images[k])
        else:
            images[k] = cv2.merge(image_planes)
    return images


def histograms(planes: np.ndarray) -> np.ndarray:
    """``(N, C, 256)`` int64 histograms of :func:`split_planes` planes."""
    count, channels = planes.shape[:2]
    hist = np.empty((count, channels, 256), np.int64)
    for k in range(count):
        for channel in range(channels):
            counts = cv2.calcHist([planes[k, channel]], [0], None, [256], [0, 256])
            hist[k, channel] = counts.ravel()
    return hist


def channel_extremes(planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(N, C)`` int64 minima and maxima of :func:`split_planes` planes."""
    count, channels = planes.shape[:2]
    low = np.empty((count, channels), np.int64)
    high = np.empty((count, channels), np.int64)
    for k in range(count):
        for channel in range(channels):
            low[k, channel], high[k, channel] = cv2.minMaxLoc(planes[k, channel])[:2]
    return low, high


def equalize_luts(hist: np.ndarray) -> np.ndarray:
    """PIL's ``ImageOps.equalize`` tables from ``(..., 256)`` histograms."""
    below = np.cumsum(hist, axis=-1)
    below -= hist  # pixels below each level
    # PIL's step: the pixels below the last level that has any, over 255
    step = np.where(hist > 0, below, 0).max(axis=-1, keepdims=True) // 255
    safe = np.maximum(step, 1)
    return table(np.where(step > 0, (safe // 2 + below) // safe, np.arange(256)))


def autocontrast_luts(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """PIL's ``ImageOps.autocontrast`` tables (no cutoff) from per-channel minima and
    maxima (any shape; a trailing 256 axis is added)."""
    levels = np.arange(256, dtype=np.float64)
    span = (high - low).astype(np.float64)[..., None]
    scale = 255.0 / np.where(span > 0, span, 1.0)
    stretched = np.trunc(levels * scale - low[..., None] * scale)
    return table(np.where(span > 0, stretched, levels))


def equalize(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """PIL's per-channel histogram equalisation."""
    planes = split_planes(images)
    return map_planes(images, planes, equalize_luts(histograms(planes))), masks


def autocontrast(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """PIL's per-channel stretch of [min, max] to [0, 255]."""
    planes = split_planes(images)
    return map_planes(images, planes, autocontrast_luts(*channel_extremes(planes))), masks


def blur(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """torchvision's Gaussian blur: reflected borders, rounded to uint8."""
    size_x, size_y = options["kernel_size"]
    for k, sigma in enumerate(params["sigma"].tolist()):
        taps_x, taps_y = gaussian_taps(size_x, sigma), gaussian_taps(size_y, sigma)
        blurred = cv2.sepFilter2D(
            images[k], cv2.CV_32F, taps_x, taps_y, borderType=cv2.BORDER_REFLECT_101
        )
        images[k] = np.clip(np.rint(blurred), 0, 255).astype(np.uint8).reshape(images.shape[1:])
    return images, masks


def erase(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Set each sample's box to ``value`` (or its seeded noise)."""
    value = options["value"]
    for k, ((top, left, height, width), seed) in enumerate(
        zip(params["box"].tolist(), params["seed"].tolist(), strict=True)
    ):
        region = images[k, top : top + height, left : left + width]
        if value == "random":
            region[...] = erase_noise(seed, region.shape)
        else:
            region[...] = np.asarray(value, np.uint8)
    return images, masks


CPU_KERNELS: dict[str, Kernel] = {
    **{name: _lut_kernel(build) for name, build in PARAMETER_LUTS.items()},
    "posterize": posterize,
    "solarize": solarize,
    "solarize_add": solarize_add,
    "contrast": contrast,
    "saturation": _each(saturation),
    "hue": _each(hue),
    "sharpness": _each(sharpness),
    "grayscale": grayscale,
    "invert": invert,
    "equalize": equalize,
    "autocontrast": autocontrast,
    "blur": blur,
    "affine": affine,
    "erase": erase,
}
