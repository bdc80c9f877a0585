"""The CPU affine kernel: inverse maps in PIL's coordinates warped by OpenCV, whole-pixel
shifts copied (see :mod:`fastdata.transforms._kernels`)."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from fastdata._tables import Params


def opencv_matrix(matrix: np.ndarray) -> np.ndarray:
    """An inverse map in PIL's coordinates (:mod:`fastdata._affine`) in OpenCV's, whose
    origin is the top-left pixel's centre."""
    linear, offset = matrix[:, :2], matrix[:, 2]
    return np.concatenate([linear, (linear @ [0.5, 0.5] + offset - 0.5)[:, None]], axis=1)


INTERPOLATION_FLAGS = {"nearest": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR}


def whole_pixel_shift(matrix: np.ndarray) -> tuple[int, int] | None:
    """``(dx, dy)`` when the inverse map ``matrix`` (PIL's coordinates) only moves by whole
    pixels (the output at ``(x, y)`` is the input at ``(x + dx, y + dy)``), else ``None``."""
    (a, b, dx), (c, d, dy) = matrix.tolist()  # Python floats: a few comparisons per sample
    if (a, b, c, d) == (1.0, 0.0, 0.0, 1.0) and dx.is_integer() and dy.is_integer():
        return int(dx), int(dy)
    return None


def shift_into(
    target: np.ndarray, source: np.ndarray, shift: tuple[int, int], fill: np.ndarray | int
) -> None:
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
    target[:top] = fill
    target[bottom:] = fill
    target[top:bottom, :left] = fill
    target[top:bottom, right:] = fill


def affine(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Warp by inverse maps; outside pixels take ``fill`` (masks: nearest, 0).

    Bilinear RGB warps run on an RGBA copy: OpenCV's vectorised 4-channel path computes
    the same interpolation per channel as its 3-channel one, in half the time, so the
    pixels are identical. Whole-pixel shifts (TrivialAugmentWide's translations) are
    copies: every sample point is a pixel centre, which both interpolations return as is."""
    height, width, channels = images.shape[1:]
    fill = options["fill"]
    border = tuple(float(v) for v in (fill * channels if len(fill) == 1 else fill))
    fill_values = np.array(border, np.uint8) if channels > 1 else int(border[0])
    interpolation = INTERPOLATION_FLAGS[options["interpolation"]]
    flags = interpolation | cv2.WARP_INVERSE_MAP
    four = channels == 3 and interpolation == cv2.INTER_LINEAR
    rgba = np.empty((2, height, width, 4), np.uint8) if four else None
    # the RGBA detour warps a copy: its result goes straight back into the batch
    out = images if four else np.empty_like(images)
    mask_outs = [np.empty_like(mask) for mask in masks]
    for k, matrix in enumerate(params["matrix"]):
        target = out[k] if channels > 1 else out[k, ..., 0]
        shift = whole_pixel_shift(matrix)
        if shift is not None:
            shift_into(target, images[k] if channels > 1 else images[k, ..., 0], shift, fill_values)
            for mask, mask_out in zip(masks, mask_outs, strict=True):
                shift_into(mask_out[k], mask[k], shift, 0)
            continue
        transform = opencv_matrix(matrix)
        if rgba is not None:
            cv2.cvtColor(images[k], cv2.COLOR_RGB2RGBA, dst=rgba[0])
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
