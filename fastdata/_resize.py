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


def resize_center_crop(
    image: np.ndarray,
    resized_hw: tuple[int, int],
    box: tuple[int, int, int, int],
    out: np.ndarray,
) -> np.ndarray:
    """``resize_image(image, width, height)[top : top + h, left : left + w]`` written into
    ``out``, the same pixels, with the low-pass filter run only on the source pixels the
    box samples (plus the filter's and the bilinear neighbour's margin): the pixels outside
    them reach only resized pixels outside the box, which are dropped.

    Args:
        image: ``(H, W, C)`` uint8, any strides.
        resized_hw: The ``(height, width)`` the whole image is resized to.
        box: ``(top, left, height, width)`` inside the resized image.
        out: ``(height, width, C)`` uint8, C-contiguous (a row of a batch).

    Returns:
        ``out``.
    """
    h, w = image.shape[:2]
    resized_h, resized_w = resized_hw
    top, left, box_h, box_w = box
    scale_y, scale_x = h / resized_h, w / resized_w
    source = image
    if max(scale_x, scale_y) < _AREA_FROM_SCALE and (scale_x > 1 or scale_y > 1):
        # cv2.resize samples source row (i + 0.5) * scale - 0.5 and the next one; the
        # 3-tap filter reads one more on each side
        first_y = max(int((top + 0.5) * scale_y - 0.5) - 2, 0)
        last_y = min(int((top + box_h - 0.5) * scale_y - 0.5) + 3, h)
        first_x = max(int((left + 0.5) * scale_x - 0.5) - 2, 0)
        last_x = min(int((left + box_w - 0.5) * scale_x - 0.5) + 3, w)
        source = np.empty_like(image)  # outside the region: never sampled for the box
        # filtered straight into the region of `source` (OpenCV writes into the view)
        cv2.GaussianBlur(
            _plane(image[first_y:last_y, first_x:last_x]),
            (3 if scale_x > 1 else 1, 3 if scale_y > 1 else 1),
            dst=_plane(source[first_y:last_y, first_x:last_x]),
            sigmaX=max(_SIGMA_PER_EXTRA_SCALE * (scale_x - 1), 1e-3),
            sigmaY=max(_SIGMA_PER_EXTRA_SCALE * (scale_y - 1), 1e-3),
            borderType=cv2.BORDER_REFLECT_101,
        )
        resized = cv2.resize(_plane(source), (resized_w, resized_h), interpolation=cv2.INTER_LINEAR)
    else:
        resized = resize_image(image, resized_w, resized_h)
    if resized.ndim == 2:
        resized = resized[..., None]
    out[...] = resized[top : top + box_h, left : left + box_w]
    return out
