"""Per-batch uint8 crops, resizes and flips with OpenCV (which releases the GIL): the CPU
executors of the descriptions in :mod:`fastdata.ops`.

Each draws one :class:`~fastdata.transforms.Geometry` per batch
(:meth:`GeometricTransform.geometry`); the movers of :mod:`fastdata._fields`
move every field by its role from it (images, masks, boxes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from concurrent.futures import Executor

import numpy as np

from fastdata import _roles, ops
from fastdata._fields import (
    FieldBatch,
    Geometry,
    apply_geometry,
)
from fastdata.transforms._base import Images, OpTransform


def _sizes(images: Images) -> tuple[np.ndarray, np.ndarray]:
    """Per-sample heights and widths, ``(B,)`` int64 each."""
    if isinstance(images, np.ndarray):
        count = images.shape[0]
        return (
            np.full(count, images.shape[1], np.int64),
            np.full(count, images.shape[2], np.int64),
        )
    return (
        np.array([image.shape[0] for image in images], np.int64),
        np.array([image.shape[1] for image in images], np.int64),
    )


def _check_interpolation(interpolation: int | None) -> int | None:
    if interpolation is not None and (
        isinstance(interpolation, bool) or not isinstance(interpolation, int)
    ):
        raise TypeError(
            "interpolation must be None (the antialiased kernel) or an OpenCV INTER_* flag, "
            f"got {interpolation!r}"
        )
    return interpolation


class GeometricTransform(OpTransform):
    """A batch transform that changes the geometry: it draws one
    :class:`~fastdata.transforms.Geometry` per batch (:meth:`geometry`) and every
    field whose role has a mover follows it (images with :attr:`interpolation`, masks
    nearest-neighbour, boxes clipped and dropped by ``min_box_size`` and
    ``min_box_visibility``, with their labels).
    """

    moves_pixels = True
    interpolation: int | None = None

    def geometry(self, heights: np.ndarray, widths: np.ndarray, batch: FieldBatch) -> Geometry:
        """This batch's geometry, from this transform's draws.

        Args:
            heights: ``(B,)`` int64 heights of the first image field's samples.
            widths: ``(B,)`` int64 widths.
            batch: The whole batch (a crop that depends on the boxes reads them here).
        """
        raise NotImplementedError

    def apply_batch(
        self,
        batch: FieldBatch,
        executor: Executor | None = None,
        tasks: int = 1,
        out: np.ndarray | None = None,
    ) -> FieldBatch:
        """Draw once and move every field by its role (see :class:`GeometricTransform`)."""
        images = batch.names(_roles.IMAGE)
        if not images:
            return batch
        heights, widths = _sizes(batch.values[images[0]])
        for name in images[1:]:
            other = _sizes(batch.values[name])
            if not (np.array_equal(other[0], heights) and np.array_equal(other[1], widths)):
                raise ValueError(
                    f"image fields {images[0]!r} and {name!r} differ in size: {self!r} moves "
                    "every image field of a batch by one geometry"
                )
        geometry = self.geometry(heights, widths, batch)
        return apply_geometry(self, batch, geometry, executor=executor, tasks=tasks, out=out)

    def fold(self, following: object) -> GeometricTransform | None:
        """This transform and a :class:`RandomHorizontalFlip` that follows it as one step
        (:class:`~fastdata.transforms.Compose` runs it): the same draws and the same
        result, with each flip made right after its sample's resize, while the sample is
        in cache, instead of in a second pass over the batch. ``None`` where the two do
        not fold (another transform, or one that keeps boxes the flip would drop)."""
        if (
            type(following) is not RandomHorizontalFlip
            or isinstance(self, RandomHorizontalFlip)  # two mirrors of a box: W - (W - x)
            or type(self).apply_batch is not GeometricTransform.apply_batch
            or not following.min_box_size <= self.min_box_size
        ):
            return None
        return _ThenFlip(self, following)

    def apply_all(
        self,
        images: Images,
        masks: Sequence[Images],
        executor: Executor | None,
        tasks: int,
        out: np.ndarray | None = None,
    ) -> tuple[Images, list[Images]]:
        """Images and masks only: :meth:`apply_batch` of an ``image`` and ``mask_<i>`` batch."""
        names = [f"mask_{i}" for i in range(len(masks))]
        batch = FieldBatch(
            {"image": images, **dict(zip(names, masks, strict=True))},
            {"image": _roles.IMAGE, **dict.fromkeys(names, _roles.MASK)},
        )
        moved = self.apply_batch(batch, executor, tasks, out)
        return moved.values["image"], [moved.values[name] for name in names]


class RandomResizedCrop(GeometricTransform):
    """Crop a random area and aspect ratio of each image, resized to ``size``
    (the Inception crop, as ``torchvision.transforms.RandomResizedCrop``): the CPU kernel
    of :class:`fastdata.ops.RandomResizedCrop`.

    Args:
        size: Output ``(height, width)``, or one int for a square.
        scale: Range of the crop's area as a fraction of the image's.
        ratio: Range of the crop's aspect ratio (width / height), sampled log-uniformly.
        interpolation: ``None`` (default): the antialiased kernel preprocessing uses
            (bilinear with a low-pass sized to the shrink; see :mod:`fastdata._resize`);
            or an OpenCV ``INTER_*`` flag.
        seed: See :class:`BatchTransform`.

    Input ``(B, H, W, C)`` uint8 or a list of ``(H, W, C)`` uint8; output
    ``(B, height, width, C)`` uint8.
    """

    op_type = ops.RandomResizedCrop
    op: ops.RandomResizedCrop
    writes_out = True

    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3 / 4, 4 / 3),
        interpolation: int | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(ops.RandomResizedCrop(size, scale, ratio), seed)
        self.interpolation = _check_interpolation(interpolation)

    @property
    def size(self) -> tuple[int, int]:
        """Output ``(height, width)``."""
        return self.op.size

    @property
    def scale(self) -> tuple[float, float]:
        """Range of the crop's area fraction."""
        return self.op.scale

    @property
    def ratio(self) -> tuple[float, float]:
        """Range of the crop's width / height."""
        return self.op.ratio

    def boxes(self, heights: np.ndarray, widths: np.ndarray) -> np.ndarray:
        """Crop boxes ``(B, 4)`` int64 as ``(top, left, height, width)`` for images of
        ``(B,)`` heights and widths, from this transform's draws."""
        draws = self.uniform(len(heights), self.op.draws_per_sample)
        return self.op.boxes(heights, widths, draws)

    def geometry(self, heights: np.ndarray, widths: np.ndarray, batch: FieldBatch) -> Geometry:
        boxes = self.boxes(heights, widths)
        return Geometry.of(boxes, np.tile(np.array(self.size, np.int64), (len(boxes), 1)))


class CenterCrop(GeometricTransform):
    """Crop the centre ``size`` of each image (``top = (H - height) // 2``): the CPU kernel
    of :class:`fastdata.ops.CenterCrop`.

    Args:
        size: Output ``(height, width)``, or one int for a square.

    Input ``(B, H, W, C)`` uint8 or a list of such images at least ``size`` large; output
    ``(B, height, width, C)`` uint8.
    """

    op_type = ops.CenterCrop
    op: ops.CenterCrop
    writes_out = True

    def __init__(self, size: int | Sequence[int]) -> None:
        super().__init__(ops.CenterCrop(size))

    @property
    def size(self) -> tuple[int, int]:
        """Output ``(height, width)``."""
        return self.op.size

    def geometry(self, heights: np.ndarray, widths: np.ndarray, batch: FieldBatch) -> Geometry:
        boxes = self.op.boxes(heights, widths)
        return Geometry.of(boxes, boxes[:, 2:])


class Resize(GeometricTransform):
    """Resize each image: an int resizes the shorter side to it (aspect kept), a
    ``(height, width)`` resizes to exactly that: the CPU kernel of
    :class:`fastdata.ops.Resize`.

    JPEG decoders in fastdata datasets decode at a reduced scale (1/2, 1/4, 1/8) when that
    still leaves at least this many pixels (``min_input_side``).

    Args:
        size: Shorter side, or ``(height, width)``.
        interpolation: ``None`` (default): the antialiased kernel preprocessing uses
            (see :mod:`fastdata._resize`), or an OpenCV ``INTER_*`` flag.

    Output: ``(B, height, width, C)`` uint8 for a pair or when every result has one size,
    otherwise a list of ``(H, W, C)`` uint8.
    """

    op_type = ops.Resize
    op: ops.Resize
    writes_out = True

    def __init__(self, size: int | Sequence[int], interpolation: int | None = None) -> None:
        super().__init__(ops.Resize(size))
        self.interpolation = _check_interpolation(interpolation)

    @property
    def size(self) -> int | tuple[int, int]:
        """The shorter side, or the exact ``(height, width)``."""
        return self.op.size

    @property
    def shorter(self) -> int | None:
        """The shorter side, or ``None`` for an exact ``(height, width)``."""
        return self.op.shorter

    def geometry(self, heights: np.ndarray, widths: np.ndarray, batch: FieldBatch) -> Geometry:
        targets = np.array(self.op.targets(heights, widths), np.int64).reshape(-1, 2)
        zeros = np.zeros(len(heights), np.int64)
        return Geometry.of(np.stack([zeros, zeros, heights, widths], axis=1), targets)


class RandomHorizontalFlip(GeometricTransform):
    """Mirror each image left-right with probability ``p`` (in place for arrays): the CPU
    kernel of :class:`fastdata.ops.RandomHorizontalFlip`.

    Args:
        p: Probability that a sample is flipped, in [0, 1].
        seed: See :class:`BatchTransform`.
    """

    op_type = ops.RandomHorizontalFlip
    op: ops.RandomHorizontalFlip

    def __init__(self, p: float = 0.5, seed: int | None = None) -> None:
        super().__init__(ops.RandomHorizontalFlip(p), seed)

    @property
    def p(self) -> float:
        """Probability that a sample is flipped."""
        return self.op.p

    def flips(self, count: int) -> np.ndarray:
        """Which of ``count`` samples are flipped, ``(count,)`` bool, from this
        transform's draws."""
        return self.op.flips(self.uniform(count, self.op.draws_per_sample))

    def geometry(self, heights: np.ndarray, widths: np.ndarray, batch: FieldBatch) -> Geometry:
        return Geometry.identity(heights, widths, self.flips(len(heights)))


class _ThenFlip(GeometricTransform):
    """A geometric transform followed by a horizontal flip, as one geometry: the first's
    draw, then the flip's draw for the first's output sizes. Its boxes are those of the two
    steps: a flip after a crop keeps every box the crop kept when its ``min_box_size`` is
    not larger (checked by :meth:`GeometricTransform.fold`), and mirrors each one once.
    """

    def __init__(self, first: GeometricTransform, flip: RandomHorizontalFlip) -> None:
        # no description or draws of its own: its steps hold them
        self.first, self.flip = first, flip
        self.op = first.op
        self.min_input_side = first.min_input_side
        self.in_place = first.in_place
        self.keeps_size = first.keeps_size
        self.writes_out = first.writes_out
        self.moves_pixels = True
        self._follow_first()

    def _follow_first(self) -> None:
        """Take the first step's kernel and box settings (a caller may change them)."""
        self.interpolation = self.first.interpolation
        self.min_box_size = self.first.min_box_size
        self.min_box_visibility = self.first.min_box_visibility

    def output_size(self, size: tuple[int, int] | None) -> tuple[int, int] | None:
        return self.first.output_size(size)

    def apply_batch(
        self,
        batch: FieldBatch,
        executor: Executor | None = None,
        tasks: int = 1,
        out: np.ndarray | None = None,
    ) -> FieldBatch:
        self._follow_first()
        if not self.flip.min_box_size <= self.min_box_size:  # changed since: two steps
            batch = self.first.apply_batch(batch, executor, tasks, out)
            return self.flip.apply_batch(batch, executor, tasks)
        return super().apply_batch(batch, executor, tasks, out)

    def geometry(self, heights: np.ndarray, widths: np.ndarray, batch: FieldBatch) -> Geometry:
        geometry = self.first.geometry(heights, widths, batch)
        flips = self.flip.flips(len(heights))
        return dataclasses.replace(geometry, flips=geometry.flips ^ flips)

    def fold(self, following: object) -> GeometricTransform | None:
        return None  # a second flip mirrors the boxes again: it runs as its own step

    def __repr__(self) -> str:
        return f"{self.first!r} then {self.flip!r}"
