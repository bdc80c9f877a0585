"""Batch-mixing descriptions (re-exported by :mod:`fastdata.ops`): MixUp and CutMix with
soft labels, timm's ``Mixup`` semantics (label smoothing, per batch or per element)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fastdata._affine import cutmix_boxes
from fastdata._draws import beta_from_uniform
from fastdata._operation import Operation
from fastdata._ops_steps import check_number, check_probability, frozen_set

MIX_MODES = ("batch", "elem")


@dataclass(frozen=True)
class MixPlan:
    """What one call mixes: sample ``i`` keeps ``lam[i]`` of itself and takes the rest
    from sample ``B - 1 - i`` (the batch reversed, as timm pairs them).

    Attributes:
        lam: ``(B,)`` float64 weight of each sample's own image and label.
        boxes: ``(B, 4)`` int64 ``(top, left, height, width)`` pasted from the partner
            (CutMix), or ``None`` (MixUp blends whole images).
    """

    lam: np.ndarray
    boxes: np.ndarray | None


@dataclass(frozen=True, init=False)
class _Mix(Operation):
    alpha: float
    num_classes: int
    label_smoothing: float
    p: float
    mode: str

    draws_per_sample: ClassVar[int] = 4  # applied, beta, box row, box column

    def __init__(
        self,
        alpha: float = 1.0,
        num_classes: int | None = None,
        label_smoothing: float = 0.1,
        p: float = 1.0,
        mode: str = "batch",
    ) -> None:
        if num_classes is None:
            raise TypeError(f"{type(self).__name__} needs num_classes (an int >= 1)")
        if not isinstance(num_classes, int | np.integer) or isinstance(num_classes, bool):
            raise TypeError(f"num_classes must be an int >= 1, got {num_classes!r}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be an int >= 1, got {num_classes!r}")
        checked_alpha = check_number(alpha, "alpha", 0)
        if checked_alpha <= 0:
            raise ValueError(f"alpha must be positive, got {alpha!r}")
        if not isinstance(mode, str):
            raise TypeError(f"mode must be a string, got {mode!r}")
        if mode not in MIX_MODES:
            raise ValueError(f"mode must be one of {MIX_MODES}, got {mode!r}")
        frozen_set(
            self,
            alpha=checked_alpha,
            num_classes=int(num_classes),
            label_smoothing=check_number(label_smoothing, "label_smoothing", 0, 1),
            p=check_probability(p),
            mode=mode,
        )

    def draw_rows(self, batch: int) -> int:
        """Rows of draws a call takes: one per batch, or one per sample (``"elem"``)."""
        return batch if self.mode == "elem" else 1

    def _lam(self, draws: np.ndarray, batch: int) -> np.ndarray:
        lam = np.where(draws[:, 0] < self.p, beta_from_uniform(draws[:, 1], self.alpha), 1.0)
        return np.broadcast_to(lam, (batch,)).copy() if len(lam) == 1 else lam

    def plan(self, draws: np.ndarray, batch: int, height: int, width: int) -> MixPlan:
        """The mixing for a batch of ``batch`` images of ``height`` x ``width`` from
        ``(draw_rows(batch), 4)`` uniforms."""
        raise NotImplementedError


@dataclass(frozen=True, init=False)
class MixUp(_Mix):
    """Blend each sample with its partner: ``lam * x + (1 - lam) * partner``, labels
    likewise, ``lam ~ Beta(alpha, alpha)`` (timm's ``Mixup`` with ``mixup_alpha``).

    Arguments, positional or by name:

    - ``alpha``: Beta distribution parameter, > 0.
    - ``num_classes``: Classes of the soft labels.
    - ``label_smoothing``: Smoothing of the one-hot labels before mixing (timm: 0.1).
    - ``p``: Probability that a batch (or an element, ``"elem"``) is mixed.
    - ``mode``: ``"batch"``: one ``lam`` per batch; ``"elem"``: one per sample.

    Raises:
        TypeError, ValueError: An argument of the wrong type or out of range.
    """

    def plan(self, draws: np.ndarray, batch: int, height: int, width: int) -> MixPlan:
        """``lam`` per sample, no boxes."""
        return MixPlan(self._lam(draws, batch), None)


@dataclass(frozen=True, init=False)
class CutMix(_Mix):
    """Paste a box of the partner into each sample, the box's side ``sqrt(1 - lam)`` of
    the image's with ``lam ~ Beta(alpha, alpha)``, labels weighted by the area kept
    (timm's ``Mixup`` with ``cutmix_alpha``, ``correct_lam=True``).

    Arguments, positional or by name:

    - ``alpha``: Beta distribution parameter, > 0.
    - ``num_classes``: Classes of the soft labels.
    - ``label_smoothing``: Smoothing of the one-hot labels before mixing (timm: 0.1).
    - ``p``: Probability that a batch (or an element, ``"elem"``) is mixed.
    - ``mode``: ``"batch"``: one box per batch; ``"elem"``: one per sample.

    Raises:
        TypeError, ValueError: An argument of the wrong type or out of range.
    """

    def plan(self, draws: np.ndarray, batch: int, height: int, width: int) -> MixPlan:
        """Boxes per sample and ``lam`` corrected to the area kept."""
        lam = self._lam(draws, batch)
        rows = np.broadcast_to(draws[:, 2:4], (batch, 2)) if len(draws) == 1 else draws[:, 2:4]
        boxes = cutmix_boxes(height, width, lam, rows)
        boxes[lam >= 1.0] = 0  # not mixed: no box
        area = (boxes[:, 2] * boxes[:, 3]).astype(np.float64)
        return MixPlan(1.0 - area / float(height * width), boxes)
