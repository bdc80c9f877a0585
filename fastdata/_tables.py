"""Host-side tables and constants the CPU and device kernels of the per-sample steps share
(lookup tables built from parameters, Gaussian taps, PIL's smoothing kernel, erase noise),
so both executors apply the very same numbers."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

Params = dict[str, np.ndarray]

LEVELS = np.arange(256, dtype=np.float32)


def blend(degenerate: np.ndarray, images: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """PIL's ``Image.blend(degenerate, images, factor)`` as uint8: ``degenerate + factor *
    (images - degenerate)`` in float32, clipped, truncated. ``factor`` broadcasts."""
    low = degenerate.astype(np.float32)
    temp = low + factor.astype(np.float32) * (images.astype(np.float32) - low)
    return table(temp)


def table(values: np.ndarray) -> np.ndarray:
    """``values`` clipped to uint8 (two ufuncs: ``np.clip`` checks cost more on tables)."""
    return np.minimum(np.maximum(values, 0), 255).astype(np.uint8)


def brightness_luts(factor: np.ndarray) -> np.ndarray:
    """``(N, 256)`` tables of PIL's brightness (a blend with black)."""
    return blend(np.zeros(1, np.float32), LEVELS[None], factor[:, None])


# torchvision's (v, p, q, t) -> (r, g, b) selection per hue sextant.
SEXTANT_SELECT = np.array([[0, 2, 1, 1, 3, 0], [3, 0, 0, 2, 1, 1], [1, 1, 3, 0, 0, 2]])


SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], np.float32)


def solarize_luts(threshold: np.ndarray) -> np.ndarray:
    """``(N, 256)`` tables inverting the values ``>= threshold``."""
    levels = np.arange(256)
    return table(np.where(levels[None] >= threshold[:, None], 255 - levels, levels))


def solarize_add_luts(add: np.ndarray) -> np.ndarray:
    """timm's ``solarize_add``: ``min(255, x + add)`` below 128, kept above."""
    levels = np.arange(256)
    return table(np.where(levels[None] < 128, levels + add[:, None], levels))


def posterize_luts(bits: np.ndarray) -> np.ndarray:
    """``(N, 256)`` tables keeping the ``bits`` highest bits."""
    masks = (~(2 ** (8 - bits.astype(np.int64)) - 1)) & 0xFF
    return (np.arange(256)[None] & masks[:, None]).astype(np.uint8)


def gaussian_taps(size: int, sigma: float) -> np.ndarray:
    """torchvision's normalised 1-D Gaussian of ``size`` taps (float32)."""
    half = (size - 1) * 0.5
    x = np.linspace(-half, half, size, dtype=np.float32)
    pdf = np.exp(np.float32(-0.5) * (x / np.float32(sigma)) ** 2)
    return (pdf / pdf.sum()).astype(np.float32)


def erase_noise(seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """The uint8 noise an erased box of ``shape`` gets from its ``seed``."""
    return np.random.Generator(np.random.PCG64(seed)).integers(0, 256, shape, dtype=np.uint8)


# The kernels whose tables depend on their parameters alone: built here, on the host, for
# the CPU and the device kernels alike.
PARAMETER_LUTS: dict[str, Callable[[Params], np.ndarray]] = {
    "brightness": lambda params: brightness_luts(params["factor"]),
    "solarize": lambda params: solarize_luts(params["threshold"]),
    "solarize_add": lambda params: solarize_add_luts(params["add"]),
    "posterize": lambda params: posterize_luts(params["bits"]),
}
