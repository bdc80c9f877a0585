"""The shared shape of the per-sample augmentations (colour, affine, erasing, policies):
a description turns a batch's draws into :class:`Step` s, each one kernel applied to some
samples with per-sample parameters, and every executor runs the steps with its own kernel
for each name. Argument checks shared by the descriptions live here too."""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from fastdata._operation import Operation

# Kernel names every executor implements (CPU: fastdata/transforms/_kernels.py, device:
# fastdata/gpu/_kernels.py). Colour kernels change values only; the others move pixels.
COLOUR_KERNELS = (
    "brightness",
    "contrast",
    "saturation",
    "hue",
    "sharpness",
    "grayscale",
    "solarize",
    "solarize_add",
    "posterize",
    "invert",
    "equalize",
    "autocontrast",
    "blur",
)
MOVING_KERNELS = ("affine",)
OTHER_KERNELS = ("erase",)


@dataclass(frozen=True)
class Step:
    """One kernel applied to the samples ``index`` of a batch.

    Attributes:
        kernel: A name in ``COLOUR_KERNELS``, ``MOVING_KERNELS`` or ``OTHER_KERNELS``.
        index: ``(N,)`` int64 sample positions, increasing.
        params: Per-sample parameters, each an array whose first axis has length ``N``.
        options: Parameters shared by these samples (fill, interpolation, kernel size).
    """

    kernel: str
    index: np.ndarray
    params: dict[str, np.ndarray] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)


class StepOperation(Operation):
    """A description whose parameters are per-sample :class:`Step` s.

    Attributes:
        moves_pixels: ``True``: masks follow the images (nearest-neighbour).
    """

    moves_pixels: ClassVar[bool] = False

    def arguments(self) -> tuple[Any, ...]:
        """The constructor's arguments, in its order, that rebuild this description."""
        names = list(inspect.signature(type(self).__init__).parameters)[1:]
        return tuple(getattr(self, name) for name in names)

    def steps(self, draws: np.ndarray, heights: np.ndarray, widths: np.ndarray) -> list[Step]:
        """The steps for a batch of images of ``(B,)`` heights and widths, from
        ``(B, draws_per_sample)`` uniforms in [0, 1), in the order they apply."""
        raise NotImplementedError


def frozen_set(op: Operation, **values: Any) -> None:
    """Set the fields of a frozen description in its constructor."""
    for name, value in values.items():
        object.__setattr__(op, name, value)


def where(mask: np.ndarray) -> np.ndarray:
    """The positions of ``mask`` as int64."""
    return np.flatnonzero(mask).astype(np.int64)


def is_number(value: object) -> bool:
    """A real number that is not a bool."""
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def check_probability(value: object, name: str = "p") -> float:
    """``value`` as a float in [0, 1] (``TypeError``/``ValueError`` naming ``name``)."""
    if not is_number(value):
        raise TypeError(f"{name} must be a number in [0, 1], got {value!r}")
    if not 0 <= float(value) <= 1:  # type: ignore[arg-type]
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return float(value)  # type: ignore[arg-type]


def check_number(value: object, name: str, low: float = -math.inf, high: float = math.inf) -> float:
    """``value`` as a float in ``[low, high]``."""
    if not is_number(value):
        raise TypeError(f"{name} must be a number, got {value!r}")
    if not low <= float(value) <= high:  # type: ignore[arg-type]
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
    return float(value)  # type: ignore[arg-type]


def check_range(
    value: object,
    name: str,
    low: float,
    high: float,
    centre: float | None = None,
) -> tuple[float, float]:
    """A ``(low, high)`` range from a pair, or from one number ``v`` as
    ``(centre - v, centre + v)`` (clipped at ``low``; ``v >= 0``) when ``centre`` is given."""
    if is_number(value) and centre is not None:
        spread = float(value)  # type: ignore[arg-type]
        if spread < 0:
            raise ValueError(f"{name} must be non-negative, got {value!r}")
        pair = (max(low, centre - spread), centre + spread)
    elif isinstance(value, tuple | list) and len(value) == 2 and all(map(is_number, value)):
        pair = (float(value[0]), float(value[1]))
    else:
        raise TypeError(f"{name} must be a number or a (low, high) pair, got {value!r}")
    if not low <= pair[0] <= pair[1] <= high:
        raise ValueError(f"{name} must give {low} <= low <= high <= {high}, got {value!r}")
    return pair


def check_fill(value: object, name: str = "fill") -> tuple[int, ...]:
    """A fill as a tuple of uint8 values (one int: every channel)."""
    items: Sequence[object] = value if isinstance(value, tuple | list) else [value]
    if not items or not all(
        isinstance(v, int | np.integer) and not isinstance(v, bool) for v in items
    ):
        raise TypeError(f"{name} must be an int or a tuple of ints in [0, 255], got {value!r}")
    if not all(0 <= int(v) <= 255 for v in items):  # type: ignore[call-overload]
        raise ValueError(f"{name} must be in [0, 255], got {value!r}")
    return tuple(int(v) for v in items)  # type: ignore[call-overload]


INTERPOLATIONS = ("nearest", "bilinear")


def check_interpolation(value: object) -> str:
    """``"nearest"`` or ``"bilinear"``."""
    if not isinstance(value, str):
        raise TypeError(f"interpolation must be a string, got {value!r}")
    if value not in INTERPOLATIONS:
        raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {value!r}")
    return value
