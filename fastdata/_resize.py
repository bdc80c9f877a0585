"""The one antialiased resize kernel of uint8 images: preprocessing and the CPU
transforms (``Resize``, ``RandomResizedCrop``) use it.

An axis that shrinks by less than 2x (what is left after a JPEG's reduced-size decode, and
the usual ``Resize(256)`` of a photo) gets a 3-tap Gaussian low-pass whose sigma grows
with the factor, then bilinear sampling; a shrink of 2x or more is area-averaged; an
image that grows is sampled bilinearly. Chosen by measurement (``benchmarks/bench_resize.py``;
the figures are in docs/benchmarks.md): OpenCV's ``INTER_AREA`` takes a slow generic path
at non-integer factors, plain ``INTER_LINEAR`` aliases, and PIL's antialiased bilinear is
slower still. Its pixels stay within 1.5 levels of 255
(mean absolute difference) of PIL's antialiased bilinear resize on photos
(``tests/test_resize.py``).
"""

from __future__ import annotations

import cv2
import numpy as np

_SIGMA_PER_EXTRA_SCALE = 0.8
_AREA_FROM_SCALE = 2.0


def _plane(image: np.ndarray) -> np.ndarray:
    """``(H, W, 1)`` as ``(H, W)`` (OpenCV drops a single channel axis), else as is."""
    return image[:, :, 0] if image.ndim == 3 and image.shape[2] == 1 else image


def resize_image(
    image: np.ndarray, width: int, height: int, out: np.ndarray | None = None
) -> np.ndarray:
    """Antialiased resize of ``(H, W[, C])`` uint8 ``image`` to ``(height, width[, C])``.

    Args:
        image: The image; any strides (a crop view is fine).
        width: Output width.
        height: Output height.
        out: Where to write the result (``(height, width[, C])`` uint8, C-contiguous), or
            ``None`` for a new array.

    Returns:
        ``out``, or the new array, with ``image``'s number of axes.
    """
    h, w = image.shape[:2]
    scale_x, scale_y = w / width, h / height
    source, dst = _plane(image), None if out is None else _plane(out)
    if max(scale_x, scale_y) >= _AREA_FROM_SCALE:
        interpolation = cv2.INTER_AREA
    else:
        interpolation = cv2.INTER_LINEAR
        kernel = (3 if scale_x > 1 else 1, 3 if scale_y > 1 else 1)
        if kernel != (1, 1):
            source = cv2.GaussianBlur(
                source,
                kernel,
                sigmaX=max(_SIGMA_PER_EXTRA_SCALE * (scale_x - 1), 1e-3),
                sigmaY=max(_SIGMA_PER_EXTRA_SCALE * (scale_y - 1), 1e-3),
                borderType=cv2.BORDER_REFLECT_101,
            )
    if (h, w) == (height, width):
        resized = source
        if dst is not None:
            dst[...] = resized
    else:
        resized = cv2.resize(source, (width, height), dst=dst, interpolation=interpolation)
    if out is not None:
        return out
    return resized[..., None] if image.ndim == 3 and resized.ndim == 2 else resized
