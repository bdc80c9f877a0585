"""Colour descriptions (re-exported by :mod:`fastdata.ops`): values change, pixels stay.

Each follows the definition torchvision uses for uint8 images, which for the enhance ops
is PIL's (``ImageEnhance``: a blend ``degenerate + factor * (image - degenerate)``
truncated to uint8; ``ImageOps`` for the others).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fastdata._ops_steps import (
    Step,
    StepOperation,
    check_number,
    check_probability,
    check_range,
    frozen_set,
    is_number,
    where,
)


@dataclass(frozen=True, init=False)
class ColorJitter(StepOperation):
    """Change brightness, contrast, saturation and hue by random factors, in a random
    order per sample (``torchvision.transforms.v2.ColorJitter``).

    Args:
        brightness: ``b`` for factors uniform in ``[max(0, 1 - b), 1 + b]``, or a
            ``(low, high)`` range; 0 leaves brightness alone.
        contrast: Likewise for contrast.
        saturation: Likewise for saturation.
        hue: ``h`` in [0, 0.5] for hue shifts uniform in ``[-h, h]`` (fractions of the
            colour wheel), or a range within [-0.5, 0.5].

    Raises:
        TypeError: A value is not a number or a pair of numbers.
        ValueError: A negative value, or a range out of bounds.
    """

    brightness: tuple[float, float] | None
    contrast: tuple[float, float] | None
    saturation: tuple[float, float] | None
    hue: tuple[float, float] | None

    draws_per_sample: ClassVar[int] = 8  # 4 for the order, 4 for the factors
    KERNELS: ClassVar[tuple[str, ...]] = ("brightness", "contrast", "saturation", "hue")

    def __init__(
        self,
        brightness: float | Sequence[float] | None = 0,
        contrast: float | Sequence[float] | None = 0,
        saturation: float | Sequence[float] | None = 0,
        hue: float | Sequence[float] | None = 0,
    ) -> None:
        ranges: dict[str, tuple[float, float] | None] = {}
        for name, value in (
            ("brightness", brightness),
            ("contrast", contrast),
            ("saturation", saturation),
        ):
            pair = None if value is None else check_range(value, name, 0.0, np.inf, centre=1.0)
            ranges[name] = None if pair == (1.0, 1.0) else pair
        hue_pair = None if hue is None else check_range(hue, "hue", -0.5, 0.5, centre=0.0)
        ranges["hue"] = None if hue_pair == (0.0, 0.0) else hue_pair
        frozen_set(self, **ranges)

    def steps(self, draws: np.ndarray, heights: np.ndarray, widths: np.ndarray) -> list[Step]:
        """Per order position, one step per adjustment for the samples that take it
        there (a uniformly random order of the four per sample)."""
        order = np.argsort(draws[:, :4], axis=1, kind="stable")
        ranges = (self.brightness, self.contrast, self.saturation, self.hue)
        steps = []
        for position in range(4):
            for kind, (kernel, bounds) in enumerate(zip(self.KERNELS, ranges, strict=True)):
                if bounds is None:
                    continue
                index = where(order[:, position] == kind)
                if len(index):
                    factor = bounds[0] + (bounds[1] - bounds[0]) * draws[index, 4 + kind]
                    steps.append(Step(kernel, index, {"factor": factor}))
        return steps


@dataclass(frozen=True, init=False)
class _Chance(StepOperation):
    """A colour kernel applied with probability ``p`` per sample."""

    p: float

    draws_per_sample: ClassVar[int] = 1
    kernel: ClassVar[str]

    def _params(self, count: int) -> dict[str, np.ndarray]:
        return {}

    def steps(self, draws: np.ndarray, heights: np.ndarray, widths: np.ndarray) -> list[Step]:
        """One step for the samples whose draw falls below ``p``."""
        index = where(draws[:, 0] < self.p)
        return [Step(self.kernel, index, self._params(len(index)))] if len(index) else []


@dataclass(frozen=True, init=False)
class RandomGrayscale(_Chance):
    """Turn a sample grey with probability ``p`` (PIL's ``L``: ``(299 R + 587 G + 114 B)
    / 1000``, rounded), kept at its channel count (as torchvision's ``RandomGrayscale``).

    Raises:
        TypeError, ValueError: ``p`` is not a number in [0, 1].
    """

    kernel: ClassVar[str] = "grayscale"

    def __init__(self, p: float = 0.1) -> None:
        frozen_set(self, p=check_probability(p))


@dataclass(frozen=True, init=False)
class RandomInvert(_Chance):
    """``255 - x`` with probability ``p`` (torchvision's ``RandomInvert``,
    ``ImageOps.invert``)."""

    kernel: ClassVar[str] = "invert"

    def __init__(self, p: float = 0.5) -> None:
        frozen_set(self, p=check_probability(p))


@dataclass(frozen=True, init=False)
class RandomEqualize(_Chance):
    """Equalize each channel's histogram with probability ``p`` (torchvision's
    ``RandomEqualize``, ``ImageOps.equalize``)."""

    kernel: ClassVar[str] = "equalize"

    def __init__(self, p: float = 0.5) -> None:
        frozen_set(self, p=check_probability(p))


@dataclass(frozen=True, init=False)
class RandomAutocontrast(_Chance):
    """Stretch each channel to [0, 255] with probability ``p`` (torchvision's
    ``RandomAutocontrast``, ``ImageOps.autocontrast``)."""

    kernel: ClassVar[str] = "autocontrast"

    def __init__(self, p: float = 0.5) -> None:
        frozen_set(self, p=check_probability(p))


@dataclass(frozen=True, init=False)
class RandomSolarize(_Chance):
    """Invert the values ``>= threshold`` with probability ``p`` (torchvision's
    ``RandomSolarize``, ``ImageOps.solarize``).

    Args:
        threshold: In [0, 256] (256 changes nothing, 0 inverts everything).
        p: Probability per sample.
    """

    threshold: float
    kernel: ClassVar[str] = "solarize"

    def __init__(self, threshold: float, p: float = 0.5) -> None:
        checked = check_number(threshold, "threshold", 0, 256)
        frozen_set(self, threshold=checked, p=check_probability(p))

    def _params(self, count: int) -> dict[str, np.ndarray]:
        return {"threshold": np.full(count, self.threshold)}


@dataclass(frozen=True, init=False)
class RandomPosterize(_Chance):
    """Keep the ``bits`` highest bits of each value with probability ``p``
    (torchvision's ``RandomPosterize``, ``ImageOps.posterize``).

    Args:
        bits: 1 to 8 (0 bits would leave a black image, and Pillow refuses it).
        p: Probability per sample.
    """

    bits: int
    kernel: ClassVar[str] = "posterize"

    def __init__(self, bits: int, p: float = 0.5) -> None:
        if not isinstance(bits, int | np.integer) or isinstance(bits, bool):
            raise TypeError(f"bits must be an int in [1, 8], got {bits!r}")
        if not 1 <= bits <= 8:
            raise ValueError(f"bits must be in [1, 8], got {bits!r}")
        frozen_set(self, bits=int(bits), p=check_probability(p))

    def _params(self, count: int) -> dict[str, np.ndarray]:
        return {"bits": np.full(count, self.bits, np.int64)}


@dataclass(frozen=True, init=False)
class RandomAdjustSharpness(_Chance):
    """Sharpen (factor > 1) or blur (< 1) with probability ``p``
    (torchvision's ``RandomAdjustSharpness``, ``ImageEnhance.Sharpness``: a blend with the
    image smoothed by the 3x3 kernel ``[[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13``, edges kept).

    Args:
        sharpness_factor: Non-negative; 1 keeps the image.
        p: Probability per sample.
    """

    sharpness_factor: float
    kernel: ClassVar[str] = "sharpness"

    def __init__(self, sharpness_factor: float, p: float = 0.5) -> None:
        factor = check_number(sharpness_factor, "sharpness_factor", 0)
        frozen_set(self, sharpness_factor=factor, p=check_probability(p))

    def _params(self, count: int) -> dict[str, np.ndarray]:
        return {"factor": np.full(count, self.sharpness_factor)}


@dataclass(frozen=True, init=False)
class GaussianBlur(StepOperation):
    """Blur each sample with a Gaussian of a random ``sigma`` (``GaussianBlur`` of
    torchvision: normalised kernel of ``kernel_size`` taps, reflected borders, rounded).

    Args:
        kernel_size: Odd positive int, or ``(width, height)`` taps.
        sigma: A fixed positive sigma, or a ``(low, high)`` range drawn uniformly per sample.

    Raises:
        TypeError: ``kernel_size`` is not an int or pair of ints, or ``sigma`` not a number
            or pair.
        ValueError: An even or non-positive size, or a non-positive sigma.
    """

    kernel_size: tuple[int, int]
    sigma: tuple[float, float]

    draws_per_sample: ClassVar[int] = 1

    def __init__(
        self, kernel_size: int | Sequence[int], sigma: float | Sequence[float] = (0.1, 2.0)
    ) -> None:
        sizes = kernel_size if isinstance(kernel_size, tuple | list) else (kernel_size,) * 2
        if len(sizes) != 2 or not all(
            isinstance(k, int | np.integer) and not isinstance(k, bool) for k in sizes
        ):
            raise TypeError(f"kernel_size must be an int or a pair of ints, got {kernel_size!r}")
        if not all(k > 0 and k % 2 == 1 for k in sizes):
            raise ValueError(f"kernel_size must be odd and positive, got {kernel_size!r}")
        pair = (sigma, sigma) if is_number(sigma) else sigma
        checked = check_range(pair, "sigma", 0.0, np.inf)
        if checked[0] <= 0:
            raise ValueError(f"sigma must be positive, got {sigma!r}")
        frozen_set(self, kernel_size=(int(sizes[0]), int(sizes[1])), sigma=checked)

    def steps(self, draws: np.ndarray, heights: np.ndarray, widths: np.ndarray) -> list[Step]:
        """One step for every sample, ``sigma`` drawn per sample."""
        need_h, need_w = self.kernel_size[1] // 2, self.kernel_size[0] // 2
        if len(heights) and (heights.min() <= need_h or widths.min() <= need_w):
            raise ValueError(
                f"GaussianBlur kernel_size {self.kernel_size} needs images larger than "
                f"{need_w}x{need_h} (width x height), got one of "
                f"{int(widths.min())}x{int(heights.min())}"
            )
        sigma = self.sigma[0] + (self.sigma[1] - self.sigma[0]) * draws[:, 0]
        index = np.arange(len(draws), dtype=np.int64)
        return [Step("blur", index, {"sigma": sigma}, {"kernel_size": self.kernel_size})]
