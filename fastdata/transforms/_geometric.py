"""Per-batch uint8 crops, resizes and flips with OpenCV (which releases the GIL): the CPU
kernels of the descriptions in :mod:`fastdata.ops`."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor

import cv2
import numpy as np

from fastdata import ops
from fastdata._resize import resize_image
from fastdata._threads import parallel_for
from fastdata.transforms._base import Images, OpTransform, check_out


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


def _output(images: Images, height: int, width: int, out: np.ndarray | None = None) -> np.ndarray:
    """A ``(B, height, width[, C])`` uint8 batch matching the input's channels: ``out``
    when given (checked), otherwise a new one."""
    if isinstance(images, np.ndarray):
        shape = (len(images), height, width, *images.shape[3:])
    else:
        first = images[0] if len(images) else np.empty((1, 1, 3), np.uint8)
        shape = (len(images), height, width, *first.shape[2:])
    if out is None:
        return np.empty(shape, np.uint8)
    check_out(out, shape)
    return out


# Masks are resampled nearest-neighbour at pixel centres (OpenCV's INTER_NEAREST samples
# the top-left corner instead, half a pixel off the bilinear image); grid_sample's
# "nearest" with align_corners=False, the device executor's, samples the same centres.
MASK_INTERPOLATION = cv2.INTER_NEAREST_EXACT


def _check_interpolation(interpolation: int | None) -> int | None:
    if interpolation is not None and (
        isinstance(interpolation, bool) or not isinstance(interpolation, int)
    ):
        raise TypeError(
            "interpolation must be None (the antialiased kernel) or an OpenCV INTER_* flag, "
            f"got {interpolation!r}"
        )
    return interpolation


def _resize(
    source: np.ndarray, width: int, height: int, out: np.ndarray | None, interpolation: int | None
) -> np.ndarray:
    """``source`` resized to ``(height, width)`` into ``out`` (or a new array): with the
    antialiased kernel preprocessing shares when ``interpolation`` is ``None``."""
    if interpolation is None:
        return resize_image(source, width, height, out)
    return cv2.resize(source, (width, height), dst=out, interpolation=interpolation)


class RandomResizedCrop(OpTransform):
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

    def apply_all(
        self,
        images: Images,
        masks: Sequence[Images],
        executor: Executor | None,
        tasks: int,
        out: np.ndarray | None = None,
    ) -> tuple[Images, list[Images]]:
        heights, widths = _sizes(images)
        boxes = self.boxes(heights, widths).tolist()
        out_h, out_w = self.size
        out = _output(images, out_h, out_w, out)
        mask_outs = [_output(mask, out_h, out_w) for mask in masks]

        def body(start: int, stop: int) -> None:
            for k in range(start, stop):
                top, left, h, w = boxes[k]
                crop = images[k][top : top + h, left : left + w]
                _resize(crop, out_w, out_h, out[k], self.interpolation)
                for mask, mask_out in zip(masks, mask_outs, strict=True):
                    crop = mask[k][top : top + h, left : left + w]
                    cv2.resize(
                        crop, (out_w, out_h), dst=mask_out[k], interpolation=MASK_INTERPOLATION
                    )

        parallel_for(executor, len(images), body, tasks=tasks)
        return out, list(mask_outs)


class CenterCrop(OpTransform):
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

    def apply_all(
        self,
        images: Images,
        masks: Sequence[Images],
        executor: Executor | None,
        tasks: int,
        out: np.ndarray | None = None,
    ) -> tuple[Images, list[Images]]:
        heights, widths = _sizes(images)
        out_h, out_w = self.size
        boxes = self.op.boxes(heights, widths).tolist()
        out = _output(images, out_h, out_w, out)
        mask_outs = [_output(mask, out_h, out_w) for mask in masks]

        def body(start: int, stop: int) -> None:
            for k in range(start, stop):
                top, left = boxes[k][:2]
                out[k] = images[k][top : top + out_h, left : left + out_w]
                for mask, mask_out in zip(masks, mask_outs, strict=True):
                    mask_out[k] = mask[k][top : top + out_h, left : left + out_w]

        parallel_for(executor, len(images), body, tasks=tasks)
        return out, list(mask_outs)


class Resize(OpTransform):
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

    def apply_all(
        self,
        images: Images,
        masks: Sequence[Images],
        executor: Executor | None,
        tasks: int,
        out: np.ndarray | None = None,
    ) -> tuple[Images, list[Images]]:
        heights, widths = _sizes(images)
        targets = self.op.targets(heights, widths)
        same = len(set(targets)) <= 1

        def empty(batch: Images, given: np.ndarray | None = None) -> Images:
            if same and targets:
                return _output(batch, *targets[0], given)
            if given is not None and not same:
                raise ValueError(
                    f"out cannot hold outputs of different sizes: {sorted(set(targets))[:3]}"
                )
            return [None] * len(batch)  # type: ignore[list-item]

        outputs = empty(images, out)
        mask_outs = [empty(mask) for mask in masks]
        pairs: list[tuple[Images, Images, int | None]] = [(images, outputs, self.interpolation)]
        pairs += [
            (mask, mask_out, MASK_INTERPOLATION)
            for mask, mask_out in zip(masks, mask_outs, strict=True)
        ]

        def body(start: int, stop: int) -> None:
            for k in range(start, stop):
                out_h, out_w = targets[k]
                for source, dest, interpolation in pairs:
                    if same:
                        _resize(source[k], out_w, out_h, dest[k], interpolation)
                    else:
                        dest[k] = _resize(source[k], out_w, out_h, None, interpolation)

        parallel_for(executor, len(images), body, tasks=tasks)
        return outputs, mask_outs


class RandomHorizontalFlip(OpTransform):
    """Mirror each image left-right with probability ``p`` (in place for arrays): the CPU
    kernel of :class:`fastdata.ops.HorizontalFlip`.

    Args:
        p: Probability that a sample is flipped, in [0, 1].
        seed: See :class:`BatchTransform`.
    """

    op_type = ops.HorizontalFlip
    op: ops.HorizontalFlip

    def __init__(self, p: float = 0.5, seed: int | None = None) -> None:
        super().__init__(ops.HorizontalFlip(p), seed)

    @property
    def p(self) -> float:
        """Probability that a sample is flipped."""
        return self.op.p

    def apply_all(
        self,
        images: Images,
        masks: Sequence[Images],
        executor: Executor | None,
        tasks: int,
        out: np.ndarray | None = None,  # never given: flips in place (writes_out is False)
    ) -> tuple[Images, list[Images]]:
        draws = self.uniform(len(images), self.op.draws_per_sample)
        flips = np.flatnonzero(self.op.flips(draws)).tolist()
        batches = [images, *masks]
        for batch in batches:
            if isinstance(batch, list):
                for k in flips:
                    batch[k] = cv2.flip(batch[k], 1)

        def body(start: int, stop: int) -> None:
            for k in flips[start:stop]:
                for batch in batches:
                    if isinstance(batch, np.ndarray):
                        cv2.flip(batch[k], 1, dst=batch[k])  # in place: no [:, ::-1] copy

        parallel_for(executor, len(flips), body, tasks=tasks)
        return images, list(masks)
