"""MixUp and CutMix on collated batches (timm's ``Mixup`` semantics, soft labels), and
``RandomChoice``."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from fastdata import ops
from fastdata._fields import FieldBatch
from fastdata._images import Images
from fastdata._mixing import MixExecutor
from fastdata._ops_steps import check_probability
from fastdata.transforms._base import BatchTransform

if TYPE_CHECKING:
    from fastdata.gpu import Normalize


class _Mix(MixExecutor):
    def __init__(
        self, *args: Any, layout: str = "CHW", seed: int | None = None, **kwargs: Any
    ) -> None:
        # the description's arguments: alpha, num_classes, label_smoothing, p, mode
        self._setup(cast(Any, self.op_type)(*args, **kwargs), layout, seed)

    def __call__(
        self, images: torch.Tensor, labels: torch.Tensor, normalize: Normalize | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix a collated batch.

        Args:
            images: ``(B, C, H, W)`` (``layout="CHW"``) or ``(B, H, W, C)`` tensor, uint8
                (results rounded) or float, on any device.
            labels: ``(B,)`` class indices, or ``(B, num_classes)`` soft targets.
            normalize: A :class:`fastdata.gpu.Normalize` to apply to the mixed images (the
                same result as calling it on them): on a uint8 CPU batch each image is
                mixed in cache and normalized at once, one pass instead of two.

        Returns:
            ``(images, soft_labels)``: new images like the input (or ``normalize``'s
            output) and ``(B, num_classes)`` float32 targets on the images' device.

        Raises:
            TypeError: Not tensors, or ``normalize`` is not a ``Normalize``.
            ValueError: Shapes that do not fit, or labels out of range.
        """
        return self.mix(images, labels, normalize)

    def __repr__(self) -> str:
        fields = repr(self.op).removeprefix(type(self.op).__name__)
        return type(self).__name__ + fields


class MixUp(_Mix):
    """Blend each sample with its partner (the batch reversed) by ``lam ~ Beta(alpha,
    alpha)``, labels likewise: the kernel of :class:`fastdata.ops.MixUp`, on CPU batches
    after collate or on the device (torch ops wherever the batch is).

    Arguments, positional or by name:

    - ``alpha``: Beta parameter, > 0 (timm's recipe: 0.8).
    - ``num_classes``: Classes of the soft labels.
    - ``label_smoothing``: Smoothing of the one-hot labels (timm's ``Mixup``: 0.1).
    - ``p``: Probability that a batch (or element) is mixed.
    - ``mode``: ``"batch"`` (one ``lam`` per batch) or ``"elem"`` (one per sample).
    - ``layout``: ``"CHW"`` or ``"HWC"``.
    - ``seed``: Seed of the draws (``None``: torch's default generator).

    Example:
        >>> mix = RandomChoice([MixUp(alpha=0.8, num_classes=1000),
        ...                     CutMix(alpha=1.0, num_classes=1000)])
        >>> images, soft_labels = mix(images, labels)
        >>> # or mixed and normalized in one pass over a CPU batch:
        >>> images, soft_labels = mix(images, labels, normalize=normalize)
    """

    op_type = ops.MixUp
    op: ops.MixUp


class CutMix(_Mix):
    """Paste a box of its partner (the batch reversed) into each sample, labels weighted
    by the area kept: the kernel of :class:`fastdata.ops.CutMix`, on CPU batches after
    collate or on the device. Arguments as :class:`MixUp` (timm's recipe: ``alpha=1.0``).
    """

    op_type = ops.CutMix
    op: ops.CutMix


class RandomChoice(BatchTransform):
    """Apply one of ``transforms``, drawn per call with probabilities ``p``.

    With mixing transforms (``MixUp``, ``CutMix``) it is called like them,
    ``mix(images, labels)``; with batch transforms it is one (datasets call it per batch,
    so one choice per batch). Any other callables are called with the arguments given.

    Args:
        transforms: The choices, at least one.
        p: Their probabilities (normalised), or ``None`` for uniform.
        seed: Seed of the choice (``None``: torch's default generator).

    Raises:
        TypeError: ``transforms`` holds something that is not callable.
        ValueError: No transforms, or ``p`` of another length or not positive.
    """

    def __init__(
        self,
        transforms: Sequence[Any],
        p: Sequence[float] | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(seed)
        choices = list(transforms)
        if not choices:
            raise ValueError("transforms must hold at least one transform, got none")
        bad = [t for t in choices if not callable(t)]
        if bad:
            raise TypeError(f"transforms must be callables, got {bad[0]!r}")
        weights = [1.0] * len(choices) if p is None else [check_probability(w) for w in p]
        if len(weights) != len(choices) or sum(weights) <= 0:
            raise ValueError(
                f"p must give one non-negative weight per transform ({len(choices)}) with a "
                f"positive sum, got {p!r}"
            )
        self.transforms = choices
        self.p = [w / sum(weights) for w in weights]
        self._batch = all(getattr(t, "batched", False) for t in choices)
        if self._batch:
            self.in_place = any(t.in_place for t in choices)
            self.keeps_size = all(t.keeps_size for t in choices)
            sides = {t.min_input_side for t in choices}
            self.min_input_side = sides.pop() if len(sides) == 1 else None

    @property
    def batched(self) -> bool:  # type: ignore[override]
        """Whether every choice is a batch transform (then this is one)."""
        return self._batch

    def choose(self) -> Any:
        """Draw the transform for the next call."""
        draw = float(self.uniform(1)[0, 0])
        index = int(np.searchsorted(np.cumsum(self.p), draw, side="right"))
        return self.transforms[min(index, len(self.transforms) - 1)]

    def output_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        """The choices' common output size.

        Raises:
            ValueError: The choices give different sizes.
        """
        sizes = {t.output_size(size) for t in self.transforms}
        if len(sizes) != 1:
            raise ValueError(f"RandomChoice's transforms give different sizes: {sizes}")
        return sizes.pop()

    def apply_all(
        self,
        images: Images,
        masks: Sequence[Images],
        executor: Executor | None,
        tasks: int,
        out: np.ndarray | None = None,
    ) -> tuple[Images, list[Images]]:
        return self.choose().apply_all(images, masks, executor, tasks)

    def apply_batch(
        self,
        batch: FieldBatch,
        executor: Executor | None = None,
        tasks: int = 1,
        out: np.ndarray | None = None,
    ) -> FieldBatch:
        return self.choose().apply_batch(batch, executor, tasks)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self._batch:
            return super().__call__(*args, **kwargs)
        return self.choose()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"RandomChoice({self.transforms!r}, p={self.p!r})"
