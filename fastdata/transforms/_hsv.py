"""The CPU hue kernel: torchvision's float HSV round trip of uint8 RGB samples, plane by
plane (see :mod:`fastdata.transforms._kernels`)."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from fastdata._tables import SEXTANT_SELECT, Params


def rgb_to_hsv(
    red: np.ndarray, green: np.ndarray, blue: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torchvision's float HSV of float32 RGB planes in [0, 1] (any equal shapes): float32
    hue, saturation and value planes.

    Plane by plane: reducing or broadcasting over a last axis of 3 runs NumPy's inner loop
    3 values at a time, tens of times slower; the float32 operations are the same."""
    maxc = np.maximum(np.maximum(red, green), blue)
    minc = np.minimum(np.minimum(red, green), blue)
    equal = maxc == minc
    span = maxc - minc
    ones = np.ones_like(maxc)
    sat = span / np.where(equal, ones, maxc)
    divisor = np.where(equal, ones, span)
    rc, gc, bc = ((maxc - plane) / divisor for plane in (red, green, blue))
    not_red = maxc != red
    is_green = maxc == green
    hue = (bc - gc) * ~not_red
    hue += (2.0 + rc - bc) * (is_green & not_red)
    hue += (4.0 + gc - rc) * (not_red & ~is_green)
    hue /= np.float32(6.0)
    hue += np.float32(1.0)  # positive: fmod by 1 is the floor's rest
    hue -= np.floor(hue)
    return hue, sat, maxc


# Per RGB channel, which of (v, p, q, t) each hue sextant takes, as lookup tables of the
# sextant 0..6 (6, a hue of exactly one turn, is sextant 0).
SEXTANT_LUTS = np.zeros((3, 256), np.uint8)
SEXTANT_LUTS[:, :7] = SEXTANT_SELECT[:, np.arange(7) % 6]


def hsv_to_rgb(hue: np.ndarray, sat: np.ndarray, val: np.ndarray) -> list[np.ndarray]:
    """torchvision's RGB planes (float32) of float32 HSV planes (2-D, contiguous)."""
    h6 = hue * np.float32(6.0)
    sextant = np.floor(h6)
    frac = h6 - sextant
    sxf = sat * frac
    one_minus_s = np.float32(1.0) - sat
    q = np.clip((np.float32(1.0) - sxf) * val, 0.0, 1.0)
    t = np.clip((sxf + one_minus_s) * val, 0.0, 1.0)
    p = np.clip(one_minus_s * val, 0.0, 1.0)
    sextants = sextant.astype(np.uint8)  # 0..6: hues are in [0, 1]
    planes = []
    for channel_picks in SEXTANT_LUTS:
        pick = cv2.LUT(sextants, channel_picks)
        plane = val.copy()
        for chosen, source in ((1, p), (2, q), (3, t)):
            cv2.copyTo(source, (pick == chosen).view(np.uint8), plane)
        planes.append(plane)
    return planes


def hue(
    images: np.ndarray, params: Params, options: dict[str, Any], masks: list[np.ndarray]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """torchvision's hue shift: float HSV, hue rotated by ``factor`` turns."""
    if images.shape[-1] != 3:
        return images, masks
    scale = np.float32(255.0 + 1.0 - 1e-3)
    for k, shift in enumerate(params["factor"].astype(np.float32).tolist()):
        planes = [images[k, ..., c].astype(np.float32) / np.float32(255.0) for c in range(3)]
        hue, sat, val = rgb_to_hsv(*planes)
        hue += np.float32(shift)
        hue -= np.floor(hue)  # NumPy's remainder by 1, the same float32 values
        for channel, plane in enumerate(hsv_to_rgb(hue, sat, val)):
            images[k, ..., channel] = plane * scale  # truncates, as astype(np.uint8) does
    return images, masks
