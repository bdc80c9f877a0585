"""Offline geometric transforms on uint8 images and masks (OpenCV).

Every function takes and returns ``(H, W, C)`` or ``(H, W)`` uint8 arrays. Images are
shrunk with :func:`shrink` (area-like antialiasing) and enlarged with ``INTER_LINEAR``;
masks always resized with ``INTER_NEAREST`` so that class ids are never blended. Where to
crop and what size to scale to is the one geometry module's (:mod:`fastdata._crop`), the
math the decoders and the training-time transforms use.
"""

from __future__ import annotations

import cv2
import numpy as np

from fastdata._crop import largest_centered_box, scaled_size

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
    elif width <= w and height <= h:
        out = shrink(image, width, height)
        return out if out.ndim == image.ndim else out[..., None]  # cv2 drops a C=1 axis
    elif width * height < w * h:
        interpolation = cv2.INTER_AREA
    else:
        interpolation = cv2.INTER_LINEAR
    out = cv2.resize(image, (width, height), interpolation=interpolation)
    return out if out.ndim == image.ndim else out[..., None]  # cv2 drops a C=1 axis


# Shrinking by less than 2x per axis (what remains after a JPEG's reduced-size decode): a
# 3-tap Gaussian low-pass whose sigma grows with the factor, then bilinear sampling.
# OpenCV's INTER_AREA takes a slow generic path at non-integer factors: 1.3 ms against
# 0.35 ms for 480x360 -> 299x224 on one core here; on the sample photos the result is
# within 0.8 levels of 255 of INTER_AREA on average (tests/preprocess/test_resize.py
# bounds it against PIL decode + area resize).
_SIGMA_PER_EXTRA_SCALE = 0.8
_FAST_SHRINK_MAX_SCALE = 2.0


def shrink(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """Antialiased downscale of ``(H, W[, C])`` uint8 ``image`` to ``(height, width[, C])``
    (neither side may grow). Factors of 2 or more use ``INTER_AREA``; smaller ones a
    3-tap Gaussian low-pass and bilinear sampling, deterministic and ~4x faster.
    """
    h, w = image.shape[:2]
    scale_x, scale_y = w / width, h / height
    if max(scale_x, scale_y) >= _FAST_SHRINK_MAX_SCALE:
        return cv2.resize(image, (width, height), interpolation=cv2.INTER_AREA)
    kernel = (3 if scale_x > 1 else 1, 3 if scale_y > 1 else 1)
    if kernel != (1, 1):
        image = cv2.GaussianBlur(
            image,
            kernel,
            sigmaX=max(_SIGMA_PER_EXTRA_SCALE * (scale_x - 1), 1e-3),
            sigmaY=max(_SIGMA_PER_EXTRA_SCALE * (scale_y - 1), 1e-3),
            borderType=cv2.BORDER_REFLECT_101,
        )
    return cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR)


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
        # the centred square of the source, then one resize: the same picture as scaling
        # the shorter side to S and cropping (the crop's scale is exact on both axes), at
        # the cost of the pixels kept only; the decoders' centred crop of a square output
        top, left, height, width = largest_centered_box((h, w), 1.0)
        square = image[top : top + height, left : left + width]
        out = resize_to(square, side, side, nearest=nearest)
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


def decode_min_side(side: int, mode: str, height: int, width: int) -> int:
    """Smallest shorter side a reduced-size decode may produce for ``transform`` to lose
    nothing: the target itself for ``shorter``/``exact``, scaled for the longer-side modes."""
    if mode in ("shorter", "exact"):
        return side
    return max(1, -(-side * min(height, width) // max(height, width)))
