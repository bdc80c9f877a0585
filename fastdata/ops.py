"""Augmentations described once: the frozen descriptions that every executor runs.

Users write the executors: the CPU batch transforms of :mod:`fastdata.transforms`
(``RandomResizedCrop(224)``) and the device modules of :mod:`fastdata.gpu`
(``DeviceRandomResizedCrop(224)``). This module is the layer beneath them, for executor
authors, and for moving one op between executors: each executor holds its description
as ``.op``, and every description carries the name of the CPU transform that runs it
(``fastdata.ops.RandomHorizontalFlip`` is what ``transforms.RandomHorizontalFlip`` and
``gpu.DeviceRandomHorizontalFlip`` run), so one augmentation has one name, and
``Device`` + that name on the device.

A description (:class:`RandomResizedCrop`, :class:`CenterCrop`, :class:`Resize`,
:class:`RandomHorizontalFlip`...) holds an operation's validated arguments and states what
it makes of its input before any pixel is read: :meth:`~Operation.output_size` (raising
when an input is too small), ``reads_only`` (it writes a new batch and never its input),
``keeps_size``, ``min_input_side`` (how far a JPEG decoder may shrink the input without
changing the result) and ``draws_per_sample``. Its random parameters come from uniform
draws the executor makes (``(B, draws_per_sample)`` float64 in [0, 1), one seeded
generator per worker), turned into crop boxes or flips here through one geometry module,
so one description and one seed give one result whatever runs it.

Three executors run the same descriptions, each with its own kernel only:

- the CPU batch transforms, :mod:`fastdata.transforms` (OpenCV on the dataset's
  threads): ``transforms.RandomResizedCrop.from_op(crop.op, seed=0)``;
- the decoders, :mod:`fastdata.decode` (crop boxes cut before or while decoding):
  ``create_decoder(size=crop.op.size, random_crop=crop.op)``;
- the device modules, :mod:`fastdata.gpu` (``grid_sample`` on the whole batch):
  ``gpu.DeviceRandomResizedCrop.from_op(crop.op, seed=0)``.

Every executor class's constructor keeps the torchvision-style arguments and builds the
description from them; :meth:`Executor.from_op` makes one from a description instead.

Beyond crops and flips, the colour ops (:class:`ColorJitter`, :class:`RandomGrayscale`,
:class:`RandomSolarize`, :class:`RandomPosterize`, :class:`RandomEqualize`,
:class:`RandomAutocontrast`, :class:`RandomAdjustSharpness`, :class:`RandomInvert`,
:class:`GaussianBlur`), :class:`RandomAffine`, :class:`RandomErasing` and the policies
:class:`RandAugment` and :class:`TrivialAugmentWide` turn their draws into per-sample
steps (one kernel name, the samples it applies to, their parameters) that the CPU
transforms and the device modules run with their own kernel per name (:class:`AugMix`
into such steps per chain and the weights that mix the chains); :class:`MixUp` and
:class:`CutMix` turn theirs into a mixing plan for a collated batch. The detection
geometry, :class:`RandomIoUCrop` (SSD's crop, which draws from the samples' boxes) and
:class:`Letterbox` (YOLO's resize-and-pad), states each sample's crop in input pixels,
which images, masks and boxes all follow.

Adding an augmentation is one description and one kernel per executor, all under one
name: a frozen :class:`Operation` subclass here that validates its arguments, declares
its output and turns draws into its parameters (pixel geometry, if it moves pixels, in
``fastdata/_crop.py``); an :class:`Executor` subclass of the same name, of
:class:`~fastdata.transforms.BatchTransform` in ``fastdata/transforms/``, whose
``apply_all`` moves images and masks alike (or whose ``apply`` changes values only); a
device module named ``Device`` + that name in ``fastdata/gpu/``. Decoders run crops only:
an operation that is not a crop has no decoder kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np

from fastdata._crop import (
    DRAWS_PER_BOX,
    centered_boxes,
    check_ranges,
    parse_size,
    random_boxes,
    shorter_side_size,
)
from fastdata._operation import Operation

__all__ = [
    "AugMix",
    "CenterCrop",
    "ColorJitter",
    "CutMix",
    "Executor",
    "GaussianBlur",
    "Letterbox",
    "MixUp",
    "Operation",
    "RandAugment",
    "RandomAdjustSharpness",
    "RandomAffine",
    "RandomAutocontrast",
    "RandomEqualize",
    "RandomErasing",
    "RandomGrayscale",
    "RandomHorizontalFlip",
    "RandomInvert",
    "RandomIoUCrop",
    "RandomPosterize",
    "RandomResizedCrop",
    "RandomSolarize",
    "Resize",
    "TrivialAugmentWide",
]


def _frozen_set(op: Operation, **values: Any) -> None:
    for name, value in values.items():
        object.__setattr__(op, name, value)


@dataclass(frozen=True, init=False)
class RandomResizedCrop(Operation):
    """Crop a random area and aspect ratio of each image and resize it to ``size`` (the
    Inception crop, as ``torchvision.transforms.RandomResizedCrop``).

    Up to ten tries draw an area fraction uniform in ``scale`` and an aspect ratio
    log-uniform in ``ratio``; the first box that fits is placed uniformly, else the
    largest centred box whose aspect is the image's clamped into ``ratio`` is taken.

    Args:
        size: Output ``(height, width)``, or one int for a square.
        scale: Range of the crop's area as a fraction of the image's, ``0 < low <= high <= 1``.
        ratio: Range of the crop's aspect ratio (width / height), ``0 < low <= high``.

    Raises:
        TypeError: ``size`` is not an int or a pair of ints, or a range not a pair of numbers.
        ValueError: A side below 1, or a range empty or out of bounds.
    """

    size: tuple[int, int]
    scale: tuple[float, float]
    ratio: tuple[float, float]

    draws_per_sample: ClassVar[int] = DRAWS_PER_BOX
    reads_only: ClassVar[bool] = True
    keeps_size: ClassVar[bool] = False

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
    ) -> None:
        checked_size = parse_size(size)
        checked_scale, checked_ratio = check_ranges(scale, ratio)
        _frozen_set(self, size=checked_size, scale=checked_scale, ratio=checked_ratio)

    def output_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        """``size`` (any input of at least 1x1 gives one)."""
        return self.size

    def boxes(self, heights: np.ndarray, widths: np.ndarray, draws: np.ndarray) -> np.ndarray:
        """Crop boxes for images of ``(B,)`` integer heights and widths from
        ``(B, draws_per_sample)`` uniforms: ``(B, 4)`` int64 ``(top, left, height, width)``."""
        return random_boxes(heights, widths, self.scale, self.ratio, draws)


@dataclass(frozen=True, init=False)
class CenterCrop(Operation):
    """Cut the centre ``size`` of each image (``top = (H - height) // 2``), no resize.

    Args:
        size: Output ``(height, width)``, or one int for a square; inputs must be at least
            this large.

    Raises:
        TypeError: ``size`` is not an int or a pair of ints.
        ValueError: A side below 1.
    """

    size: tuple[int, int]

    reads_only: ClassVar[bool] = True
    keeps_size: ClassVar[bool] = False

    def __init__(self, size: int | Sequence[int]) -> None:
        _frozen_set(self, size=parse_size(size))

    def output_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        """``size``; raises when the inputs are smaller."""
        if size is not None and (size[0] < self.size[0] or size[1] < self.size[1]):
            raise ValueError(
                f"CenterCrop size {self.size} is larger than an image of "
                f"{size[0]}x{size[1]}; resize first"
            )
        return self.size

    def boxes(self, heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
        """Centred boxes ``(B, 4)`` int64 ``(top, left, height, width)`` for images of
        ``(B,)`` heights and widths (the smallest checked against ``size``)."""
        if len(heights):
            self.output_size((int(np.min(heights)), int(np.min(widths))))
        return centered_boxes(heights, widths, self.size[0], self.size[1])


@dataclass(frozen=True, init=False)
class Resize(Operation):
    """Resize each image: an int resizes the shorter side to it (aspect kept, the other
    side truncated as torchvision does), a ``(height, width)`` pair to exactly that.

    Args:
        size: Shorter side, or ``(height, width)``.

    Raises:
        TypeError: ``size`` is not an int or a pair of ints.
        ValueError: A side below 1.
    """

    size: int | tuple[int, int]

    reads_only: ClassVar[bool] = True
    keeps_size: ClassVar[bool] = False

    def __init__(self, size: int | Sequence[int]) -> None:
        pair = parse_size(size)
        _frozen_set(self, size=pair if isinstance(size, tuple | list) else pair[0])

    @property
    def shorter(self) -> int | None:
        """The shorter side asked for, or ``None`` for an exact ``(height, width)``."""
        return self.size if isinstance(self.size, int) else None

    @property
    def min_input_side(self) -> int | None:
        """The shorter side, or the smaller side of the pair: a reduced decode down to it
        loses nothing the resize keeps."""
        return self.size if isinstance(self.size, int) else min(self.size)

    def output_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        """The pair given, or for a shorter side the size it gives ``size`` (``None`` when
        inputs vary)."""
        if not isinstance(self.size, int):
            return self.size
        return None if size is None else self.target(*size)

    def target(self, height: int, width: int) -> tuple[int, int]:
        """The output ``(height, width)`` of one ``height`` x ``width`` image."""
        if isinstance(self.size, int):
            return shorter_side_size(height, width, self.size)
        return self.size

    def targets(self, heights: np.ndarray, widths: np.ndarray) -> list[tuple[int, int]]:
        """:meth:`target` of each image of ``(B,)`` heights and widths."""
        side = self.size
        if not isinstance(side, int):
            return [side] * len(heights)
        pairs = zip(heights.tolist(), widths.tolist(), strict=True)
        return [shorter_side_size(height, width, side) for height, width in pairs]


@dataclass(frozen=True, init=False)
class RandomHorizontalFlip(Operation):
    """Mirror each image left-right with probability ``p``.

    Args:
        p: Probability that a sample is flipped, in [0, 1].

    Raises:
        TypeError: ``p`` is not a number.
        ValueError: ``p`` outside [0, 1].
    """

    p: float

    draws_per_sample: ClassVar[int] = 1

    def __init__(self, p: float = 0.5) -> None:
        if isinstance(p, bool) or not isinstance(p, int | float | np.floating | np.integer):
            raise TypeError(f"p must be a number in [0, 1], got {p!r}")
        if not 0 <= p <= 1:
            raise ValueError(f"p must be in [0, 1], got {p!r}")
        _frozen_set(self, p=float(p))

    def flips(self, draws: np.ndarray) -> np.ndarray:
        """Which samples to flip: ``(B,)`` bool from ``(B, 1)`` uniforms."""
        return draws[:, 0] < self.p


OperationT = TypeVar("OperationT", bound=Operation)
ExecutorT = TypeVar("ExecutorT", bound="Executor")


class Executor:
    """Base of the classes that run one description: the CPU batch transforms and the
    device modules. Each holds its description as ``op`` and contains only its kernel.

    Attributes:
        op_type: The description class this executor runs.
        op: The description it runs.
    """

    op_type: ClassVar[type[Operation]]
    op: Operation

    @classmethod
    def from_op(cls: type[ExecutorT], op: Operation, **options: Any) -> ExecutorT:
        """This executor running ``op`` (held as ``.op``).

        Args:
            op: A description of this executor's ``op_type``.
            **options: The executor's own settings (``seed``, ``interpolation``, ``layout``).

        Raises:
            TypeError: ``op`` is another kind of description.
        """
        if not isinstance(op, cls.op_type):
            raise TypeError(
                f"{cls.__name__} runs a fastdata.ops.{cls.op_type.__name__}, "
                f"got {type(op).__name__}"
            )
        executor = cls(*op.arguments(), **options)
        executor.op = op  # an equal description: hold the one given
        return executor


def described(value: object, op_type: type[OperationT]) -> OperationT | None:
    """The description ``value`` is, or the one the executor ``value`` holds.

    Args:
        value: A description, an :class:`Executor`, or anything else.
        op_type: The description class wanted.

    Returns:
        The description when it is an ``op_type``, else ``None``.
    """
    op = value.op if isinstance(value, Executor) else value
    return op if isinstance(op, op_type) else None


# The per-sample colour, affine, erasing and policy descriptions, and batch mixing, each
# family in a module of its own.
from fastdata._ops_augmix import AugMix  # noqa: E402
from fastdata._ops_boxes import Letterbox, RandomIoUCrop  # noqa: E402
from fastdata._ops_colour import (  # noqa: E402
    ColorJitter,
    GaussianBlur,
    RandomAdjustSharpness,
    RandomAutocontrast,
    RandomEqualize,
    RandomGrayscale,
    RandomInvert,
    RandomPosterize,
    RandomSolarize,
)
from fastdata._ops_mix import CutMix, MixUp  # noqa: E402
from fastdata._ops_policy import (  # noqa: E402
    RandAugment,
    RandomAffine,
    RandomErasing,
    TrivialAugmentWide,
)
