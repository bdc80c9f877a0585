"""Affine, erasing and policy descriptions (re-exported by :mod:`fastdata.ops`):
``RandomAffine``, ``RandomErasing``, ``RandAugment`` (timm's) and ``TrivialAugmentWide``
(torchvision's)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from fastdata._affine import (
    DRAWS_PER_ERASE,
    affine_matrices,
    erase_boxes,
    rotate_matrices,
    shear_matrices,
    translate_matrices,
)
from fastdata._draws import integers_from_uniform, normal_from_uniform
from fastdata._ops_steps import (
    Step,
    StepOperation,
    check_fill,
    check_interpolation,
    check_number,
    check_probability,
    check_range,
    frozen_set,
    where,
)


@dataclass(frozen=True, init=False)
class RandomAffine(StepOperation):
    """Rotate, shift, scale and shear each sample about its centre by random amounts
    (``torchvision.transforms.v2.RandomAffine``); masks follow, nearest-neighbour.

    Args:
        degrees: ``d`` for angles uniform in ``[-d, d]``, or a ``(low, high)`` range.
        translate: ``(a, b)``: shifts up to ``a`` of the width and ``b`` of the height
            (rounded to pixels), or ``None``.
        scale: ``(low, high)`` scale range, or ``None``.
        shear: ``s`` for x-shear angles in ``[-s, s]`` degrees, a ``(low, high)`` x range,
            or ``(x_low, x_high, y_low, y_high)``; ``None``: none.
        interpolation: ``"nearest"`` or ``"bilinear"`` for the images.
        fill: Value of the pixels from outside the image (int or one per channel).

    Raises:
        TypeError, ValueError: An argument of the wrong type or out of range.
    """

    degrees: tuple[float, float]
    translate: tuple[float, float] | None
    scale: tuple[float, float] | None
    shear: tuple[float, float, float, float] | None
    interpolation: str
    fill: tuple[int, ...]

    draws_per_sample: ClassVar[int] = 6
    moves_pixels: ClassVar[bool] = True

    def __init__(  # noqa: PLR0917 - torchvision's positional signature
        self,
        degrees: float | Sequence[float],
        translate: Sequence[float] | None = None,
        scale: Sequence[float] | None = None,
        shear: float | Sequence[float] | None = None,
        interpolation: str = "nearest",
        fill: int | Sequence[int] = 0,
    ) -> None:
        checked_degrees = check_range(degrees, "degrees", -math.inf, math.inf, centre=0.0)
        checked_translate = None
        if translate is not None:
            checked_translate = check_range(translate, "translate", 0.0, math.inf)
            if max(checked_translate) > 1:
                raise ValueError(f"translate values must be in [0, 1], got {translate!r}")
        checked_scale = None if scale is None else check_range(scale, "scale", 0.0, math.inf)
        if checked_scale is not None and checked_scale[0] <= 0:
            raise ValueError(f"scale must be positive, got {scale!r}")
        checked_shear = None
        if shear is not None:
            if isinstance(shear, tuple | list) and len(shear) == 4:
                x_range = check_range(list(shear[:2]), "shear", -math.inf, math.inf)
                y_range = check_range(list(shear[2:]), "shear", -math.inf, math.inf)
                checked_shear = (*x_range, *y_range)
            else:
                x_range = check_range(shear, "shear", -math.inf, math.inf, centre=0.0)
                checked_shear = (*x_range, 0.0, 0.0)
        frozen_set(
            self,
            degrees=checked_degrees,
            translate=checked_translate,
            scale=checked_scale,
            shear=checked_shear,
            interpolation=check_interpolation(interpolation),
            fill=check_fill(fill),
        )

    def steps(self, draws: np.ndarray, heights: np.ndarray, widths: np.ndarray) -> list[Step]:
        """One affine step for every sample."""
        count = len(draws)

        def uniform(bounds: Sequence[float], column: int) -> np.ndarray:
            return bounds[0] + (bounds[1] - bounds[0]) * draws[:, column]

        angle = uniform(self.degrees, 0)
        shift = np.zeros((count, 2))
        if self.translate is not None:
            max_x, max_y = self.translate[0] * widths, self.translate[1] * heights
            shift[:, 0] = np.round(-max_x + 2 * max_x * draws[:, 1])
            shift[:, 1] = np.round(-max_y + 2 * max_y * draws[:, 2])
        scale = np.ones(count) if self.scale is None else uniform(self.scale, 3)
        shear = np.zeros((count, 2))
        if self.shear is not None:
            shear[:, 0] = uniform(self.shear[:2], 4)
            shear[:, 1] = uniform(self.shear[2:], 5)
        matrix = affine_matrices(
            heights, widths, angle=angle, translate=shift, scale=scale, shear=shear
        )
        index = np.arange(count, dtype=np.int64)
        return [Step("affine", index, {"matrix": matrix}, self._affine_options())]

    def _affine_options(self) -> dict[str, Any]:
        return {"interpolation": self.interpolation, "fill": self.fill}


@dataclass(frozen=True, init=False)
class RandomErasing(StepOperation):
    """Erase a random box of each sample with probability ``p``
    (``torchvision.transforms.v2.RandomErasing``; masks are left as they are).

    Args:
        p: Probability per sample.
        scale: Range of the box's area as a fraction of the image's.
        ratio: Range of the box's aspect ratio (height / width), drawn log-uniformly.
        value: The box's value: an int, one int per channel, or ``"random"`` (uniform
            uint8 noise per pixel).

    Raises:
        TypeError, ValueError: An argument of the wrong type or out of range.
    """

    p: float
    scale: tuple[float, float]
    ratio: tuple[float, float]
    value: tuple[int, ...] | str

    draws_per_sample: ClassVar[int] = 1 + DRAWS_PER_ERASE + 1

    def __init__(
        self,
        p: float = 0.5,
        scale: Sequence[float] = (0.02, 0.33),
        ratio: Sequence[float] = (0.3, 3.3),
        value: int | Sequence[int] | str = 0,
    ) -> None:
        checked_scale = check_range(scale, "scale", 0.0, 1.0)
        checked_ratio = check_range(ratio, "ratio", 0.0, math.inf)
        if checked_ratio[0] <= 0:
            raise ValueError(f"ratio must be positive, got {ratio!r}")
        if isinstance(value, str):
            if value != "random":
                raise ValueError(f"value must be an int, ints or 'random', got {value!r}")
            checked_value: tuple[int, ...] | str = value
        else:
            checked_value = check_fill(value, "value")
        frozen_set(
            self,
            p=check_probability(p),
            scale=checked_scale,
            ratio=checked_ratio,
            value=checked_value,
        )

    def steps(self, draws: np.ndarray, heights: np.ndarray, widths: np.ndarray) -> list[Step]:
        """One erase step for the samples drawn (below ``p``) that found a box."""
        boxes = erase_boxes(heights, widths, self.scale, self.ratio, draws[:, 1:-1])
        index = where((draws[:, 0] < self.p) & (boxes[:, 2] > 0) & (boxes[:, 3] > 0))
        if not len(index):
            return []
        seeds = (draws[index, -1] * 2.0**53).astype(np.int64)
        params = {"box": boxes[index], "seed": seeds}
        return [Step("erase", index, params, {"value": self.value})]


def op_groups(chosen: np.ndarray, count: int) -> list[tuple[int, np.ndarray]]:
    """``(op index, increasing int64 sample positions)`` for every op in ``range(count)``
    that ``chosen`` (``(B,)``, -1 for none) picks, in op order: one stable sort, not a
    comparison of the whole batch per op."""
    order = np.argsort(chosen, kind="stable")
    bounds = np.searchsorted(chosen[order], np.arange(count + 1)).tolist()
    return [
        (op_index, order[low:high].astype(np.int64))
        for op_index, (low, high) in enumerate(itertools.pairwise(bounds))
        if high > low
    ]


GEOMETRIC_OPS = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")


def geometry_matrices(
    name: str, value: np.ndarray, heights: np.ndarray, widths: np.ndarray
) -> np.ndarray:
    """Inverse maps of a policy's geometric op ``name`` (one of ``GEOMETRIC_OPS``) at
    ``value`` (degrees, shear factors or pixels) for images of ``heights`` x ``widths``."""
    zeros = np.zeros(len(value))
    if name == "rotate":
        return rotate_matrices(heights, widths, value)
    if name == "shear_x":
        return shear_matrices(value, zeros)
    if name == "shear_y":
        return shear_matrices(zeros, value)
    if name == "translate_x":
        return translate_matrices(value, zeros)
    return translate_matrices(zeros, value)


def policy_steps(  # noqa: PLR0917
    names: Sequence[str],
    values: np.ndarray,
    chosen: np.ndarray,
    heights: np.ndarray,
    widths: np.ndarray,
    affine_options: dict[str, Any],
) -> list[Step]:
    """Steps for one policy position: sample ``i`` takes ``names[chosen[i]]`` with
    parameter ``values[i]`` (``chosen < 0``: nothing). The geometric ops of the position
    share one ``affine`` step (each sample takes one op per position: their order does not
    matter), so the kernel warps runs of neighbouring samples in one call."""
    steps = []
    warped: list[tuple[np.ndarray, np.ndarray]] = []
    for op_index, index in op_groups(chosen, len(names)):
        name = names[op_index]
        if name == "identity":
            continue
        value = values[index]
        if name in ("autocontrast", "equalize", "invert"):
            steps.append(Step(name, index))
        elif name in GEOMETRIC_OPS:
            warped.append((index, geometry_matrices(name, value, heights[index], widths[index])))
        else:
            key = {"posterize": "bits", "solarize": "threshold", "solarize_add": "add"}.get(
                name, "factor"
            )
            param = value.astype(np.int64) if name == "posterize" else value
            steps.append(Step(name, index, {key: param}))
    if warped:
        index = np.concatenate([index for index, _ in warped])
        matrix = np.concatenate([matrix for _, matrix in warped])
        order = np.argsort(index, kind="stable")
        steps.append(Step("affine", index[order], {"matrix": matrix[order]}, affine_options))
    return steps


# timm's RandAugment op set (auto_augment._RAND_TRANSFORMS) as kernel names.
RAND_AUGMENT_OPS = (
    "autocontrast",
    "equalize",
    "invert",
    "rotate",
    "posterize",
    "solarize",
    "solarize_add",
    "saturation",  # timm's "Color"
    "contrast",
    "brightness",
    "sharpness",
    "shear_x",
    "shear_y",
    "translate_x",  # timm's TranslateXRel: a fraction of the width
    "translate_y",
)
MAX_LEVEL = 10.0  # timm's _LEVEL_DENOM: magnitudes run from 0 to 10


def rand_augment_values(
    name: str, level: np.ndarray, negate: np.ndarray, increasing: bool
) -> np.ndarray:
    """timm's level-to-argument mapping for ``level`` in [0, 10] (translations as
    fractions of the side), edge magnitudes clamped: posterize keeps at least 1 bit."""
    fraction = level / MAX_LEVEL
    sign = np.where(negate, -1.0, 1.0)
    if name == "rotate":
        return 30.0 * fraction * sign
    if name == "posterize":
        bits = np.floor(4 * fraction)
        return np.maximum(1, 4 - bits if increasing else bits)
    if name == "solarize":
        threshold = np.minimum(256, np.floor(256 * fraction))
        return 256 - threshold if increasing else threshold
    if name == "solarize_add":
        return np.minimum(128, np.floor(110 * fraction))
    if name in ("saturation", "contrast", "brightness", "sharpness"):
        if increasing:
            return np.maximum(0.1, 1.0 + 0.9 * fraction * sign)
        return 1.8 * fraction + 0.1
    if name in ("shear_x", "shear_y"):
        return 0.3 * fraction * sign
    if name in ("translate_x", "translate_y"):
        return 0.45 * fraction * sign
    return np.zeros_like(level)


@dataclass(frozen=True, init=False)
class RandAugment(StepOperation):
    """timm's RandAugment (``rand-m{magnitude}-n{num_ops}-mstd{magnitude_std}``): per
    sample, ``num_ops`` ops drawn uniformly with replacement from timm's 15, each applied
    with probability ``p`` at a magnitude drawn from ``N(magnitude, magnitude_std)``
    clipped to [0, 10].

    Magnitudes use timm's 0-10 scale (torchvision's ``RandAugment`` uses 0-30 with
    ``num_magnitude_bins=31``: its ``magnitude=27`` is this ``magnitude=9``). Edge
    magnitudes are clamped (posterize keeps at least 1 bit).

    Args:
        num_ops: Ops per sample (``n``), >= 0.
        magnitude: Mean magnitude in [0, 10] (``m``).
        magnitude_std: Spread of the magnitude; 0 fixed, ``inf`` uniform in
            ``[0, magnitude]`` (timm's ``mstd``).
        p: Probability each drawn op is applied (timm: 0.5).
        increasing: timm's ``inc1`` op variants (every op stronger with the magnitude).
        interpolation: ``"nearest"`` or ``"bilinear"`` for rotations, shears and shifts.
        fill: Value of the pixels from outside the image (timm: the ImageNet mean).

    Raises:
        TypeError, ValueError: An argument of the wrong type or out of range.
    """

    num_ops: int
    magnitude: float
    magnitude_std: float
    p: float
    increasing: bool
    interpolation: str
    fill: tuple[int, ...]

    moves_pixels: ClassVar[bool] = True
    DRAWS_PER_OP: ClassVar[int] = 5  # op, applied, two for the normal, sign

    def __init__(  # noqa: PLR0917 - torchvision's positional signature
        self,
        num_ops: int = 2,
        magnitude: float = 9,
        magnitude_std: float = 0.0,
        p: float = 0.5,
        increasing: bool = False,
        interpolation: str = "bilinear",
        fill: int | Sequence[int] = (124, 116, 104),
    ) -> None:
        if not isinstance(num_ops, int | np.integer) or isinstance(num_ops, bool):
            raise TypeError(f"num_ops must be a non-negative int, got {num_ops!r}")
        if num_ops < 0:
            raise ValueError(f"num_ops must be a non-negative int, got {num_ops!r}")
        if not isinstance(increasing, bool):
            raise TypeError(f"increasing must be a bool, got {increasing!r}")
        frozen_set(
            self,
            num_ops=int(num_ops),
            magnitude=check_number(magnitude, "magnitude", 0, MAX_LEVEL),
            magnitude_std=check_number(magnitude_std, "magnitude_std", 0),
            p=check_probability(p),
            increasing=increasing,
            interpolation=check_interpolation(interpolation),
            fill=check_fill(fill),
        )

    @property
    def draws_per_sample(self) -> int:  # type: ignore[override]
        """``5 * num_ops``."""
        return self.DRAWS_PER_OP * self.num_ops

    def plan(self, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(B, num_ops)`` op indices into ``RAND_AUGMENT_OPS`` (-1 where not applied),
        whether applied, levels in [0, 10] and signs (``True``: negated)."""
        per_op = draws.reshape(len(draws), self.num_ops, self.DRAWS_PER_OP)
        chosen = integers_from_uniform(per_op[..., 0], len(RAND_AUGMENT_OPS))
        applied = per_op[..., 1] < self.p
        if math.isinf(self.magnitude_std):
            level = self.magnitude * per_op[..., 2]
        elif self.magnitude_std > 0:
            normal = normal_from_uniform(per_op[..., 2], per_op[..., 3])
            level = self.magnitude + self.magnitude_std * normal
        else:
            level = np.full(chosen.shape, self.magnitude)
        level = np.clip(level, 0.0, MAX_LEVEL)
        negate = per_op[..., 4] > 0.5
        return np.where(applied, chosen, -1), applied, level, negate

    def steps(self, draws: np.ndarray, heights: np.ndarray, widths: np.ndarray) -> list[Step]:
        """Per position, one step per op drawn there."""
        chosen, _, level, negate = self.plan(draws)
        options = {"interpolation": self.interpolation, "fill": self.fill}
        steps = []
        for position in range(self.num_ops):
            values = np.zeros(len(draws))
            for op_index, rows in op_groups(chosen[:, position], len(RAND_AUGMENT_OPS)):
                name = RAND_AUGMENT_OPS[op_index]
                values[rows] = rand_augment_values(
                    name, level[rows, position], negate[rows, position], self.increasing
                )
                if name == "translate_x":
                    values[rows] *= widths[rows]
                elif name == "translate_y":
                    values[rows] *= heights[rows]
            steps += policy_steps(
                RAND_AUGMENT_OPS, values, chosen[:, position], heights, widths, options
            )
        return steps


# torchvision's TrivialAugmentWide ops: (kernel name, magnitude at the top bin, signed).
TRIVIAL_AUGMENT_OPS: tuple[tuple[str, float, bool], ...] = (
    ("identity", 0.0, False),
    ("shear_x", 0.99, True),
    ("shear_y", 0.99, True),
    ("translate_x", 32.0, True),
    ("translate_y", 32.0, True),
    ("rotate", 135.0, True),
    ("brightness", 0.99, True),
    ("saturation", 0.99, True),  # torchvision's "Color"
    ("contrast", 0.99, True),
    ("sharpness", 0.99, True),
    ("posterize", 0.0, False),  # bins map to 8 .. 2 bits
    ("solarize", 255.0, False),  # bins map to thresholds 255 .. 0
    ("autocontrast", 0.0, False),
    ("equalize", 0.0, False),
)


@dataclass(frozen=True, init=False)
class TrivialAugmentWide(StepOperation):
    """torchvision's TrivialAugmentWide: per sample one op drawn uniformly from its 14
    (identity included) at a magnitude bin drawn uniformly, sign drawn for signed ops.

    Args:
        num_magnitude_bins: Bins of each op's magnitude range (>= 2).
        interpolation: ``"nearest"`` or ``"bilinear"`` for the geometric ops.
        fill: Value of the pixels from outside the image.

    Raises:
        TypeError, ValueError: An argument of the wrong type or out of range.
    """

    num_magnitude_bins: int
    interpolation: str
    fill: tuple[int, ...]

    draws_per_sample: ClassVar[int] = 3
    moves_pixels: ClassVar[bool] = True

    def __init__(
        self,
        num_magnitude_bins: int = 31,
        interpolation: str = "nearest",
        fill: int | Sequence[int] = 0,
    ) -> None:
        bins = num_magnitude_bins
        if not isinstance(bins, int | np.integer) or isinstance(bins, bool):
            raise TypeError(f"num_magnitude_bins must be an int >= 2, got {bins!r}")
        if bins < 2:
            raise ValueError(f"num_magnitude_bins must be an int >= 2, got {bins!r}")
        frozen_set(
            self,
            num_magnitude_bins=int(bins),
            interpolation=check_interpolation(interpolation),
            fill=check_fill(fill),
        )

    def plan(self, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(B,)`` op indices into ``TRIVIAL_AUGMENT_OPS`` and signed magnitudes."""
        chosen = integers_from_uniform(draws[:, 0], len(TRIVIAL_AUGMENT_OPS))
        bins = integers_from_uniform(draws[:, 1], self.num_magnitude_bins)
        top = np.array([spec[1] for spec in TRIVIAL_AUGMENT_OPS])[chosen]
        signed = np.array([spec[2] for spec in TRIVIAL_AUGMENT_OPS])[chosen]
        magnitude = top * bins / (self.num_magnitude_bins - 1)  # linspace(0, top, bins)[bin]
        names = np.array([spec[0] for spec in TRIVIAL_AUGMENT_OPS])[chosen]
        step = (self.num_magnitude_bins - 1) / 6
        magnitude = np.where(names == "posterize", 8 - np.round(bins / step), magnitude)
        solarize_top = TRIVIAL_AUGMENT_OPS[11][1]
        magnitude = np.where(names == "solarize", solarize_top - magnitude, magnitude)
        magnitude = np.where(signed & (draws[:, 2] < 0.5), -magnitude, magnitude)
        return chosen, magnitude

    def steps(self, draws: np.ndarray, heights: np.ndarray, widths: np.ndarray) -> list[Step]:
        """One step per op drawn."""
        chosen, magnitude = self.plan(draws)
        names = [spec[0] for spec in TRIVIAL_AUGMENT_OPS]
        values = magnitude.copy()
        enhance = np.isin(chosen, [6, 7, 8, 9])
        values[enhance] = 1.0 + magnitude[enhance]
        translate = np.isin(chosen, [3, 4])
        values[translate] = np.trunc(magnitude[translate])  # torchvision: int(magnitude)
        options = {"interpolation": self.interpolation, "fill": self.fill}
        return policy_steps(names, values, chosen, heights, widths, options)
