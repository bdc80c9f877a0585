"""The AugMix description (re-exported by :mod:`fastdata.ops`): torchvision's
``AugMix``, per sample ``mixture_width`` chains of ops mixed with the original image.

Unlike the other policies its ops do not run one after another on the sample: each chain
runs on a copy of the original, and the result is the original and the chains blended
with random weights. :meth:`AugMix.mixing` states the chains as steps (one list per
chain, the kernels of :mod:`fastdata._ops_steps`) and the weights; every executor runs
each chain's steps with its own kernels and blends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fastdata._draws import beta_from_uniform, dirichlet_from_uniform, integers_from_uniform
from fastdata._ops_policy import policy_steps
from fastdata._ops_steps import (
    Step,
    StepOperation,
    check_fill,
    check_interpolation,
    check_number,
    frozen_set,
)

# torchvision's AugMix ops in its order: (kernel name, magnitude at the top bin, signed).
# The first nine are its partial set (all_ops=False); translations are fractions of the
# side, posterize counts bits down from 4, solarize thresholds are fractions of 255.
AUGMIX_OPS: tuple[tuple[str, float, bool], ...] = (
    ("shear_x", 0.3, True),
    ("shear_y", 0.3, True),
    ("translate_x", 1 / 3, True),
    ("translate_y", 1 / 3, True),
    ("rotate", 30.0, True),
    ("posterize", 4.0, False),
    ("solarize", 1.0, False),
    ("autocontrast", 0.0, False),
    ("equalize", 0.0, False),
    ("brightness", 0.9, True),
    ("saturation", 0.9, True),  # torchvision's "Color"
    ("contrast", 0.9, True),
    ("sharpness", 0.9, True),
)
PARTIAL_OPS = 9
NUM_BINS = 10  # torchvision's _PARAMETER_MAX: magnitudes are linspace(0, top, 10)[bin]
RANDOM_DEPTHS = (1, 3)  # chain_depth <= 0: each chain 1 to 3 ops, uniformly
DRAWS_PER_LINK = 3  # op, magnitude bin, sign


def augmix_values(
    names: np.ndarray, bins: np.ndarray, negate: np.ndarray, heights: np.ndarray,
    widths: np.ndarray,
) -> np.ndarray:  # fmt: skip
    """The kernel parameter of each drawn op, as torchvision maps its magnitude bin
    (``linspace(0, top, 10)[bin]``, negated for signed ops), edge magnitudes clamped:
    posterize keeps at least 1 bit (torchvision's bins reach 0 bits at severity 9).

    Args:
        names: ``(N,)`` kernel names from :data:`AUGMIX_OPS`.
        bins: ``(N,)`` int magnitude bins in ``[0, severity)``.
        negate: ``(N,)`` bool: negate the signed ops.
        heights: ``(N,)`` image heights.
        widths: ``(N,)`` image widths.

    Returns:
        ``(N,)`` float64: factors for the enhance ops, degrees, shear tangents, whole
        pixels for the shifts, bits, thresholds (0 for the ops without a parameter).
    """
    tops = {name: top for name, top, _ in AUGMIX_OPS}
    signed = {name: sign for name, _, sign in AUGMIX_OPS}
    top = np.array([tops[name] for name in names], np.float64)
    magnitude = top * bins / (NUM_BINS - 1)
    is_signed = np.array([signed[name] for name in names], bool)
    magnitude = np.where(is_signed & negate, -magnitude, magnitude)
    values = magnitude.copy()
    for name in set(names.tolist()):
        rows = names == name
        if name in ("brightness", "saturation", "contrast", "sharpness"):
            values[rows] = 1.0 + magnitude[rows]
        elif name == "translate_x":
            values[rows] = np.trunc(magnitude[rows] * widths[rows])  # int(magnitude)
        elif name == "translate_y":
            values[rows] = np.trunc(magnitude[rows] * heights[rows])
        elif name == "posterize":  # (4 - bin / (9 / 4)).round(): never a tie
            values[rows] = np.maximum(1, np.round(4 - bins[rows] / ((NUM_BINS - 1) / 4)))
        elif name == "solarize":  # threshold 255 * linspace(1, 0, 10)[bin]
            values[rows] = 255.0 * (1.0 - bins[rows] / (NUM_BINS - 1))
    return values


@dataclass(frozen=True, init=False)
class AugMix(StepOperation):
    """torchvision's AugMix (Hendrycks et al.): per sample, ``mixture_width`` chains of
    ``chain_depth`` ops (1 to 3, drawn per chain, when ``chain_depth <= 0``), each op
    drawn uniformly from torchvision's AugMix set at a magnitude bin drawn uniformly below
    ``severity`` (of 10) with a random sign for the signed ops; each chain runs on the
    original image, and the result is ``m * original + (1 - m) * sum(w_i * chain_i)``
    with ``m ~ Beta(alpha, alpha)`` and ``w ~ Dirichlet(alpha, ..., alpha)``, in float32,
    truncated to uint8 as torchvision does.

    The op set is torchvision's: shear, translate (up to a third of the side), rotate (up
    to 30 degrees), posterize, solarize, autocontrast, equalize, and with ``all_ops``
    brightness, colour, contrast and sharpness (factors 0.1 to 1.9). Edge magnitudes are
    clamped: posterize keeps at least 1 bit. The chains mix differently moved copies of
    the image, so masks and boxes cannot follow: executors refuse them (torchvision
    does too).

    Args:
        severity: Magnitude bins drawn from, 1 to 10.
        mixture_width: Chains per sample, >= 1.
        chain_depth: Ops per chain; <= 0: 1 to 3 drawn per chain.
        alpha: Concentration of the Beta and Dirichlet weights, > 0.
        all_ops: Include the four enhance ops (brightness, colour, contrast, sharpness).
        interpolation: ``"nearest"`` or ``"bilinear"`` for the geometric ops.
        fill: Value of the pixels from outside the image (int or one per channel).

    Raises:
        TypeError, ValueError: An argument of the wrong type or out of range.
    """

    severity: int
    mixture_width: int
    chain_depth: int
    alpha: float
    all_ops: bool
    interpolation: str
    fill: tuple[int, ...]

    moves_pixels: ClassVar[bool] = True

    def __init__(  # noqa: PLR0917 - torchvision's positional signature
        self,
        severity: int = 3,
        mixture_width: int = 3,
        chain_depth: int = -1,
        alpha: float = 1.0,
        all_ops: bool = True,
        interpolation: str = "bilinear",
        fill: int | Sequence[int] = 0,
    ) -> None:
        for name, value, low in (
            ("severity", severity, 1),
            ("mixture_width", mixture_width, 1),
            ("chain_depth", chain_depth, None),
        ):
            if not isinstance(value, int | np.integer) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {value!r}")
            if low is not None and value < low:
                raise ValueError(f"{name} must be >= {low}, got {value!r}")
        if severity > NUM_BINS:
            raise ValueError(f"severity must be in [1, {NUM_BINS}], got {severity!r}")
        checked_alpha = check_number(alpha, "alpha", 0.0)
        if checked_alpha <= 0 or math.isinf(checked_alpha):
            raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}")
        if not isinstance(all_ops, bool):
            raise TypeError(f"all_ops must be a bool, got {all_ops!r}")
        frozen_set(
            self,
            severity=int(severity),
            mixture_width=int(mixture_width),
            chain_depth=int(chain_depth),
            alpha=checked_alpha,
            all_ops=all_ops,
            interpolation=check_interpolation(interpolation),
            fill=check_fill(fill),
        )

    @property
    def max_depth(self) -> int:
        """The most ops a chain runs: ``chain_depth``, or 3 when it is drawn."""
        return self.chain_depth if self.chain_depth > 0 else RANDOM_DEPTHS[1]

    @property
    def draws_per_sample(self) -> int:  # type: ignore[override]
        """Two for the weights, and per chain one for its depth and three per op."""
        return 2 + self.mixture_width * (1 + DRAWS_PER_LINK * self.max_depth)

    @property
    def op_count(self) -> int:
        """How many of :data:`AUGMIX_OPS` are drawn from (13, or the first 9)."""
        return len(AUGMIX_OPS) if self.all_ops else PARTIAL_OPS

    def plan(self, draws: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(B, mixture_width, max_depth)`` op indices into :data:`AUGMIX_OPS` (-1 past
        the chain's depth), magnitude bins and signs (``True``: negated), and the
        ``(B, 1 + mixture_width)`` float64 weights (the original's, then each chain's)."""
        count = len(draws)
        per_chain = draws[:, 2:].reshape(
            count, self.mixture_width, 1 + DRAWS_PER_LINK * self.max_depth
        )
        links = per_chain[..., 1:].reshape(count, self.mixture_width, self.max_depth, -1)
        chosen = integers_from_uniform(links[..., 0], self.op_count)
        bins = integers_from_uniform(links[..., 1], self.severity)
        negate = links[..., 2] <= 0.5  # torchvision: torch.rand(()) <= 0.5
        if self.chain_depth > 0:
            depth = np.full((count, self.mixture_width), self.chain_depth)
        else:
            low, high = RANDOM_DEPTHS
            depth = low + integers_from_uniform(per_chain[..., 0], high - low + 1)
        chosen = np.where(np.arange(self.max_depth) < depth[..., None], chosen, -1)
        original = beta_from_uniform(draws[:, 0], self.alpha)
        chains = dirichlet_from_uniform(draws[:, 1], self.alpha, self.mixture_width)
        weights = np.concatenate([original[:, None], chains * (1 - original)[:, None]], 1)
        return chosen, bins, negate, weights

    def steps(self, draws: np.ndarray, heights: np.ndarray, widths: np.ndarray) -> list[Step]:
        """Not one list of steps: AugMix runs chains on copies and blends them (see
        :meth:`mixing`)."""
        raise NotImplementedError("AugMix blends chains of steps: use AugMix.mixing")

    def mixing(
        self, draws: np.ndarray, heights: np.ndarray, widths: np.ndarray
    ) -> tuple[list[list[Step]], np.ndarray]:
        """The steps of each chain, in order, and the ``(B, 1 + mixture_width)`` weights
        (the original's first), for images of ``(B,)`` heights and widths from
        ``(B, draws_per_sample)`` uniforms in [0, 1)."""
        chosen, bins, negate, weights = self.plan(draws)
        names = [spec[0] for spec in AUGMIX_OPS]
        all_names = np.array(names)
        options = {"interpolation": self.interpolation, "fill": self.fill}
        chains = []
        for chain in range(self.mixture_width):
            steps: list[Step] = []
            for link in range(self.max_depth):
                picked = chosen[:, chain, link]
                names_drawn = all_names[np.maximum(picked, 0)]
                values = augmix_values(
                    names_drawn, bins[:, chain, link], negate[:, chain, link], heights, widths
                )
                steps += policy_steps(names, values, picked, heights, widths, options)
            chains.append(steps)
        return chains, weights


def refuse_masks(op: AugMix, masks: Sequence[object]) -> None:
    """AugMix blends differently moved copies of an image: no mask can follow them."""
    if masks:
        raise ValueError(
            f"{op!r} mixes differently moved copies of each image, so masks cannot follow: "
            "use RandAugment or TrivialAugmentWide for batches with masks"
        )
