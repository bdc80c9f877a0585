"""The CPU affine kernel: inverse maps in PIL's coordinates warped by OpenCV, whole-pixel
shifts copied, bilinear shifts along one axis blended from two views (see
:mod:`fastdata.transforms._kernels`)."""

from __future__ import annotations

import math
from typing import Any

import cv2
import numpy as np

from fastdata._tables import Params


def opencv_matrix(matrix: np.ndarray) -> np.ndarray:
    """An inverse map in PIL's coordinates (:mod:`fastdata._affine`) in OpenCV's, whose
    origin is the top-left pixel's centre."""
    (a, b, dx), (c, d, dy) = matrix.tolist()  # Python floats: cheaper than NumPy per sample
    return np.array([[a, b, a * 0.5 + b * 0.5 + dx - 0.5], [c, d, c * 0.5 + d * 0.5 + dy - 0.5]])


INTERPOLATION_FLAGS = {"nearest": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR}


def translation(matrix: np.ndarray) -> tuple[float, float] | None:
    """``(dx, dy)`` when the inverse map ``matrix`` (PIL's coordinates) only translates
    (the output at ``(x, y)`` is the input at ``(x + dx, y + dy)``), else ``None``."""
    (a, b, dx), (c, d, dy) = matrix.tolist()
    return (dx, dy) if (a, b, c, d) == (1.0, 0.0, 0.0, 1.0) else None


def _along(axis: int, start: int, stop: int) -> tuple[slice, ...]:
    """The index of ``start:stop`` on ``axis`` (0 or 1) of an image."""
    return (slice(start, stop),) if axis == 0 else (slice(None), slice(start, stop))


# A fill: a number (gray images, masks), or a row of fill pixels at least as long as the
# image's sides, ``(L, C)``.
Fill = np.ndarray | int


def _fill(region: np.ndarray, fill: Fill) -> None:
    """Set every pixel of ``region`` (a view of ``(h, w[, C])``) to ``fill``: a number, or
    its row copied down the rows (NumPy broadcasts one pixel of 3 values value by value,
    dozens of times slower)."""
    region[...] = fill if isinstance(fill, int) else fill[: region.shape[1]]


def fill_row(fill: np.ndarray | int, length: int) -> Fill:
    """The :data:`Fill` of pixel value ``fill`` (``(C,)`` uint8, or a number) for images of
    sides up to ``length``."""
    if isinstance(fill, int):
        return fill
    row = np.empty((length, len(fill)), np.uint8)
    row[...] = fill
    return row


def blend_shift_into(  # noqa: PLR0917
    target: np.ndarray,
    source: np.ndarray,
    axis: int,
    shift: float,
    fill: Fill,
    scratch: np.ndarray,
) -> None:
    """``target`` sampled bilinearly from ``source`` at ``x + shift`` along ``axis``, what
    OpenCV's bilinear warp gives with a constant border of ``fill`` (blended into the
    pixels next to it), up to rounding: the weighted sum of two shifted views of
    ``source`` (a few times faster than the warp, which maps every pixel's coordinates).
    ``scratch`` is like ``source``; ``target`` may be ``source``."""
    length = source.shape[axis]
    whole = math.floor(shift)
    frac = shift - whole
    # both taps inside the image from ``low`` to ``high``
    low = min(max(-whole, 0), length)
    high = max(min(length - whole - 1, length), low)
    if high > low:
        cv2.addWeighted(
            source[_along(axis, low + whole, high + whole)], 1.0 - frac,
            source[_along(axis, low + whole + 1, high + whole + 1)], frac,
            0.0, dst=scratch[_along(axis, low, high)],
        )  # fmt: skip
    _fill(scratch[_along(axis, 0, low)], fill)
    _fill(scratch[_along(axis, high, length)], fill)
    pixel = np.float32(fill) if isinstance(fill, int) else fill[0].astype(np.float32)
    # one tap on the border: the first source pixel (right tap) or the last (left tap)
    for position, edge, weight in ((low - 1, 0, frac), (high, length - 1, 1.0 - frac)):
        if 0 <= position < length and position + whole + (edge == 0) == edge:
            pixels = source[_along(axis, edge, edge + 1)].astype(np.float32)
            mixed = pixels * np.float32(weight) + pixel * np.float32(1.0 - weight)
            scratch[_along(axis, position, position + 1)] = np.rint(mixed)
    target[...] = scratch


def shift_into(target: np.ndarray, source: np.ndarray, shift: tuple[int, int], fill: Fill) -> None:
    """``target`` (``(H, W, ...)``) at ``(x, y)`` is ``source`` at ``(x + dx, y + dy)``,
    ``fill`` where that is outside: what a warp by a whole-pixel shift gives, nearest or
    bilinear (every sample point is a pixel centre), as two copies. ``target`` may be
    ``source``."""
    height, width = source.shape[:2]
    dx, dy = shift
    top, bottom = min(max(-dy, 0), height), max(min(height - dy, height), 0)
    left, right = min(max(-dx, 0), width), max(min(width - dx, width), 0)
    if bottom > top and right > left:  # NumPy copies overlapping views through a buffer
        target[top:bottom, left:right] = source[top + dy : bottom + dy, left + dx : right + dx]
    else:
        top = bottom = left = right = 0
    _fill(target[:top], fill)
    _fill(target[bottom:], fill)
    _fill(target[top:bottom, :left], fill)
    _fill(target[top:bottom, right:], fill)


def affine(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Warp by inverse maps; outside pixels take ``fill`` (masks: nearest, 0).

    Bilinear RGB warps run on an RGBA copy: OpenCV's vectorised 4-channel path computes
    the same interpolation per channel as its 3-channel one, in half the time, so the
    pixels are identical. Whole-pixel shifts (TrivialAugmentWide's translations) are
    copies: every sample point is a pixel centre, which both interpolations return as is.
    Bilinear shifts along one axis (RandAugment's translations) blend two shifted views
    (:func:`blend_shift_into`)."""
    height, width, channels = images.shape[1:]
    fill = options["fill"]
    border = tuple(float(v) for v in (fill * channels if len(fill) == 1 else fill))
    fill_values = fill_row(
        np.array(border, np.uint8) if channels > 1 else int(border[0]), max(height, width)
    )
    interpolation = INTERPOLATION_FLAGS[options["interpolation"]]
    flags = interpolation | cv2.WARP_INVERSE_MAP
    bilinear = interpolation == cv2.INTER_LINEAR
    four = channels == 3 and bilinear
    # the RGBA detour warps a copy: its result goes straight back into the batch
    out = images if four else np.empty_like(images)
    mask_outs = [np.empty_like(mask) for mask in masks]
    rgba = scratch = None  # made on first use
    for k, matrix in enumerate(params["matrix"]):
        target = out[k] if channels > 1 else out[k, ..., 0]
        source = images[k] if channels > 1 else images[k, ..., 0]
        move = translation(matrix)
        if move is not None and move[0].is_integer() and move[1].is_integer():
            shift = (int(move[0]), int(move[1]))
            shift_into(target, source, shift, fill_values)
            for mask, mask_out in zip(masks, mask_outs, strict=True):
                shift_into(mask_out[k], mask[k], shift, 0)
            continue
        transform = opencv_matrix(matrix)
        if move is not None and bilinear and 0.0 in move:  # along one axis
            scratch = np.empty_like(source) if scratch is None else scratch
            axis, along = (1, move[0]) if move[1] == 0.0 else (0, move[1])
            blend_shift_into(target, source, axis, along, fill_values, scratch)
        elif four:
            if rgba is None:
                rgba = np.empty((2, height, width, 4), np.uint8)
            cv2.cvtColor(source, cv2.COLOR_RGB2RGBA, dst=rgba[0])
            cv2.warpAffine(
                rgba[0], transform, (width, height), dst=rgba[1], flags=flags,
                borderMode=cv2.BORDER_CONSTANT, borderValue=(*border, 0.0),
            )  # fmt: skip
            cv2.cvtColor(rgba[1], cv2.COLOR_RGBA2RGB, dst=target)
        else:
            cv2.warpAffine(
                images[k], transform, (width, height), dst=target, flags=flags,
                borderMode=cv2.BORDER_CONSTANT, borderValue=border,
            )  # fmt: skip
        for mask, mask_out in zip(masks, mask_outs, strict=True):
            mask_out[k] = cv2.warpAffine(
                mask[k], transform, (width, height),
                flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP,
                borderMode=cv2.BORDER_CONSTANT, borderValue=0,
            )  # fmt: skip
    return out, mask_outs
