"""Offline geometric transforms on uint8 images and masks (OpenCV).

Every function takes and returns ``(H, W, C)`` or ``(H, W)`` uint8 arrays. Images are
resized with ``INTER_AREA`` when shrinking and ``INTER_LINEAR`` when enlarging; masks
always with ``INTER_NEAREST`` so that class ids are never blended.
"""

from __future__ import annotations

import cv2
import numpy as np

# shorter: shorter side to S then centre crop S x S; exact: stretch to S x S;
# pad: longer side to S then zero-pad to S x S; longer: cap the longer side at S (variable).
RESIZE_MODES = ("shorter", "exact", "pad", "longer")


def resize_to(image: np.ndarray, width: int, height: int, *, nearest: bool = False) -> np.ndarray:
    """Resize to exactly ``(height, width)`` (no-op when already that size)."""
    h, w = image.shape[:2]
    if (h, w) == (height, width):
        return image
    if nearest:
        interpolation = cv2.INTER_NEAREST
    elif width * height < w * h:
        interpolation = cv2.INTER_AREA
    else:
        interpolation = cv2.INTER_LINEAR
    out = cv2.resize(image, (width, height), interpolation=interpolation)
    return out if out.ndim == image.ndim else out[..., None]  # cv2 drops a C=1 axis


def scaled_size(height: int, width: int, side: int, *, longer: bool) -> tuple[int, int]:
    """``(height, width)`` after scaling so that the shorter (or longer) side is ``side``."""
    if (height >= width) == longer:  # the height is the side that becomes ``side``
        return side, max(1, round(width * side / height))
    return max(1, round(height * side / width)), side


def center_crop(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centred ``(height, width)`` window (a view); the image must be at least that big."""
    h, w = image.shape[:2]
    top, left = (h - height) // 2, (w - width) // 2
    return image[top : top + height, left : left + width]


def pad_to_square(image: np.ndarray, side: int) -> np.ndarray:
    """Zero-pad (centred) to ``side x side``; the image must fit."""
    h, w = image.shape[:2]
    if (h, w) == (side, side):
        return image
    out = np.zeros((side, side, *image.shape[2:]), dtype=image.dtype)
    top, left = (side - h) // 2, (side - w) // 2
    out[top : top + h, left : left + w] = image
    return out


def transform(image: np.ndarray, side: int, mode: str, *, nearest: bool = False) -> np.ndarray:
    """Apply one resize mode of :data:`RESIZE_MODES` for output side ``side``.

    Returns:
        A C-contiguous uint8 array: ``(side, side[, C])`` for ``shorter``/``exact``/``pad``;
        for ``longer`` the image scaled down (never up) so its longer side is ``side``.
    """
    h, w = image.shape[:2]
    if mode == "exact":
        out = resize_to(image, side, side, nearest=nearest)
    elif mode == "shorter":
        image = shorter_window(image, side)
        h, w = image.shape[:2]
        new_h, new_w = scaled_size(h, w, side, longer=False)
        out = center_crop(resize_to(image, new_w, new_h, nearest=nearest), side, side)
    elif mode == "pad":
        new_h, new_w = scaled_size(h, w, side, longer=True)
        out = pad_to_square(resize_to(image, new_w, new_h, nearest=nearest), side)
    elif mode == "longer":
        if max(h, w) <= side:
            out = image
        else:
            new_h, new_w = scaled_size(h, w, side, longer=True)
            out = resize_to(image, new_w, new_h, nearest=nearest)
    else:
        raise ValueError(f"resize mode must be one of {RESIZE_MODES}, got {mode!r}")
    return np.ascontiguousarray(out)


def shorter_window(image: np.ndarray, side: int) -> np.ndarray:
    """Crop before resizing under ``shorter``, where scaling the whole image would make an
    intermediate more than 16 times the output (a thin strip enlarged: a 1 x 10000 image
    would become 224 x 2,240,000 to keep 224 x 224 of it): return the centred window of the
    source that the centre crop reads, plus a margin; other images come back unchanged.

    The window has the crop's centre and scale, so the result is the same centred crop:
    identical where the scale is a whole number, else within the rounding of the scaled
    size (under one output pixel).
    """
    h, w = image.shape[:2]
    short, long = min(h, w), max(h, w)
    if short >= side or long * side <= 16 * side * short:
        return image
    margin = 2  # source pixels beyond the crop that a bilinear output pixel may read
    length = min(long, short + 2 * margin)
    length += (long - length) % 2  # the window's centre is the image's centre
    start = (long - length) // 2
    return image[start : start + length] if h > w else image[:, start : start + length]


def decode_min_side(side: int, mode: str, height: int, width: int) -> int:
    """Smallest shorter side a reduced-size decode may produce for ``transform`` to lose
    nothing: the target itself for ``shorter``/``exact``, scaled for the longer-side modes."""
    if mode in ("shorter", "exact"):
        return side
    return max(1, -(-side * min(height, width) // max(height, width)))
