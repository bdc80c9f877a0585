"""Pixel geometry of the affine augmentations and of the boxes that erasing and CutMix cut:
the math behind :mod:`fastdata.ops` that every executor shares.

Affine maps are *inverse* maps, ``(B, 2, 3)`` float64: an output pixel at continuous
coordinates ``(x, y)`` (origin at the top-left corner of the top-left pixel, pixel centres at
``i + 0.5``, PIL's convention) samples the input at ``matrix @ (x, y, 1)``. The CPU kernels
shift them to OpenCV's pixel-centre origin, the device kernels to ``affine_grid``'s
normalised coordinates. Boxes are ``(B, 4)`` int64 rows ``(top, left, height, width)``.
"""

from __future__ import annotations

import numpy as np

from fastdata._crop import DRAWS_PER_BOX, placed, tried_sides

# Per erased box: the random crop's draws (ATTEMPTS areas and ratios, top and left).
DRAWS_PER_ERASE = DRAWS_PER_BOX


def _matrices(linear: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """``(B, 2, 3)`` from ``(B, 2, 2)`` linear parts and ``(B, 2)`` offsets."""
    return np.concatenate([linear, offset[:, :, None]], axis=2)


def affine_matrices(
    heights: np.ndarray,
    widths: np.ndarray,
    *,
    angle: np.ndarray,
    translate: np.ndarray,
    scale: np.ndarray,
    shear: np.ndarray,
) -> np.ndarray:
    """Inverse maps of torchvision's ``affine`` about each image's centre (its PIL
    definition: ``torchvision.transforms.functional._get_inverse_affine_matrix``).

    Args:
        heights: ``(B,)`` image heights.
        widths: ``(B,)`` image widths.
        angle: ``(B,)`` rotation in degrees (torchvision's ``affine`` angle).
        translate: ``(B, 2)`` shift ``(x, y)`` in pixels.
        scale: ``(B,)`` scale factors (> 0).
        shear: ``(B, 2)`` shear angles ``(x, y)`` in degrees.

    Returns:
        ``(B, 2, 3)`` float64 inverse maps.
    """
    rot = np.radians(angle)
    shear_x, shear_y = np.radians(shear[:, 0]), np.radians(shear[:, 1])
    a = np.cos(rot - shear_y) / np.cos(shear_y)
    b = -np.cos(rot - shear_y) * np.tan(shear_x) / np.cos(shear_y) - np.sin(rot)
    c = np.sin(rot - shear_y) / np.cos(shear_y)
    d = -np.sin(rot - shear_y) * np.tan(shear_x) / np.cos(shear_y) + np.cos(rot)
    linear = np.stack([np.stack([d, -b], 1), np.stack([-c, a], 1)], 1) / scale[:, None, None]
    centre = np.stack([widths * 0.5, heights * 0.5], axis=1).astype(np.float64)
    offset = np.einsum("bij,bj->bi", linear, -centre - translate) + centre
    return _matrices(linear, offset)


def rotate_matrices(heights: np.ndarray, widths: np.ndarray, degrees: np.ndarray) -> np.ndarray:
    """Inverse maps of ``PIL.Image.rotate(degrees)``: counter-clockwise about the centre,
    same canvas (torchvision's ``rotate``)."""
    count = len(degrees)
    zeros = np.zeros((count, 2))
    angle = -np.asarray(degrees, np.float64)
    return affine_matrices(
        heights, widths, angle=angle, translate=zeros, scale=np.ones(count), shear=zeros
    )


def shear_matrices(factor_x: np.ndarray, factor_y: np.ndarray) -> np.ndarray:
    """Inverse maps of a shear about the top-left corner: the input at
    ``(x + factor_x * y, y + factor_y * x)`` (timm's and torchvision's RandAugment shears)."""
    ones = np.ones_like(factor_x, dtype=np.float64)
    linear = np.stack([np.stack([ones, factor_x], 1), np.stack([factor_y, ones], 1)], 1)
    return _matrices(linear, np.zeros((len(factor_x), 2)))


def translate_matrices(pixels_x: np.ndarray, pixels_y: np.ndarray) -> np.ndarray:
    """Inverse maps of a shift: the output at ``(x, y)`` is the input at
    ``(x + pixels_x, y + pixels_y)`` (timm's translate; the sign is drawn at random)."""
    count = len(pixels_x)
    linear = np.broadcast_to(np.eye(2), (count, 2, 2))
    return _matrices(linear, np.stack([pixels_x, pixels_y], axis=1).astype(np.float64))


def erase_boxes(
    heights: np.ndarray,
    widths: np.ndarray,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    draws: np.ndarray,
) -> np.ndarray:
    """torchvision's ``RandomErasing`` boxes: up to ten tries of an area fraction uniform in
    ``scale`` and a log-uniform aspect ratio in ``ratio``; the first box smaller than the
    image on both sides is placed uniformly, else none (height and width 0).

    Args:
        heights: ``(B,)`` image heights.
        widths: ``(B,)`` image widths.
        scale: Area fraction range.
        ratio: Aspect ratio (height / width) range.
        draws: ``(B, DRAWS_PER_ERASE)`` uniforms in [0, 1).

    Returns:
        ``(B, 4)`` int64 ``(top, left, height, width)``.
    """
    box_h, box_w = tried_sides(heights, widths, scale, ratio, draws)
    fits = (box_h < heights[:, None]) & (box_w < widths[:, None])
    found = fits.any(axis=1)
    first = np.argmax(fits, axis=1)
    rows = np.arange(len(heights))
    box_h = np.where(found, box_h[rows, first], 0)
    box_w = np.where(found, box_w[rows, first], 0)
    top, left = placed(heights, widths, box_h, box_w, draws[:, -2:])
    return np.stack([np.where(found, top, 0), np.where(found, left, 0), box_h, box_w], axis=1)


def cutmix_boxes(
    heights: np.ndarray | int, widths: np.ndarray | int, lam: np.ndarray, draws: np.ndarray
) -> np.ndarray:
    """timm's CutMix boxes (``rand_bbox``): sides ``int(side * sqrt(1 - lam))`` centred at a
    uniform pixel, clipped to the image.

    Args:
        heights: Image height(s).
        widths: Image width(s).
        lam: ``(N,)`` mixing weights of the kept image.
        draws: ``(N, 2)`` uniforms: the centre's row and column.

    Returns:
        ``(N, 4)`` int64 ``(top, left, height, width)``.
    """
    heights_array = np.broadcast_to(np.asarray(heights, np.int64), lam.shape)
    widths_array = np.broadcast_to(np.asarray(widths, np.int64), lam.shape)
    cut = np.sqrt(1.0 - lam)
    cut_h = (heights_array * cut).astype(np.int64)
    cut_w = (widths_array * cut).astype(np.int64)
    centre_y = np.floor(draws[:, 0] * heights_array).astype(np.int64)
    centre_x = np.floor(draws[:, 1] * widths_array).astype(np.int64)
    top = np.clip(centre_y - cut_h // 2, 0, heights_array)
    bottom = np.clip(centre_y + cut_h // 2, 0, heights_array)
    left = np.clip(centre_x - cut_w // 2, 0, widths_array)
    right = np.clip(centre_x + cut_w // 2, 0, widths_array)
    return np.stack([top, left, bottom - top, right - left], axis=1)
