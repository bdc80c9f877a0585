"""CPU batch transforms of the per-sample descriptions (colour, affine, erasing, policies):
the description turns the batch's draws into steps, :func:`run_steps` runs each step's
kernel (:mod:`fastdata.transforms._kernels`) on its samples, split over the dataset's
threads."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any, cast

import numpy as np

from fastdata import ops
from fastdata._images import Images
from fastdata._ops_steps import MOVING_KERNELS, Step, StepOperation
from fastdata._threads import parallel_for
from fastdata.transforms._base import OpTransform
from fastdata.transforms._geometric import _sizes
from fastdata.transforms._kernels import CPU_KERNELS


def _four_d(image: np.ndarray) -> np.ndarray:
    """A ``(..., H, W)`` gray image or batch as ``(..., H, W, 1)`` (a view)."""
    return image[..., None]


def _check_channels(channels: int) -> None:
    if channels not in (1, 3):
        raise ValueError(f"colour and policy ops take 1- or 3-channel images, got {channels}")


def _run_array(step: Step, images: np.ndarray, masks: list[np.ndarray]) -> None:
    """Run one step's kernel on its samples of the batch, in place: once per run of
    consecutive samples, on views of the batch (gathering scattered samples into a copy
    and writing them back cost two more passes over their pixels than the kernels of a
    policy's steps spend on them)."""
    kernel = CPU_KERNELS[step.kernel]
    moved = masks if step.kernel in MOVING_KERNELS else []
    index = step.index.tolist()  # a few samples a step: Python lists beat NumPy calls
    if not index:
        return
    # indices are increasing and unique: a run ends where the next one is not the next row
    starts = [0, *(i for i in range(1, len(index)) if index[i] != index[i - 1] + 1)]
    stops = [*starts[1:], len(index)]
    whole = len(starts) == 1
    for low, high in zip(starts, stops, strict=True):
        row = index[low]
        rows = slice(row, row + high - low)
        params = step.params if whole else {k: v[low:high] for k, v in step.params.items()}
        part = images[rows]
        mask_parts = [mask[rows] for mask in moved]
        out, mask_outs = kernel(part, params, step.options, mask_parts)
        if out is not part:
            images[rows] = out
        for mask, mask_part, mask_out in zip(moved, mask_parts, mask_outs, strict=True):
            if mask_out is not mask_part:
                mask[rows] = mask_out


def _steps_of(steps: Sequence[Step], start: int, stop: int) -> list[Step]:
    """``steps`` restricted to the samples ``start`` to ``stop`` (the same parameters)."""
    out = []
    for step in steps:
        low, high = np.searchsorted(step.index, [start, stop])
        if high > low:
            params = {name: value[low:high] for name, value in step.params.items()}
            out.append(Step(step.kernel, step.index[low:high], params, step.options))
    return out


def run_steps(
    steps: Sequence[Step],
    images: Images,
    masks: list[Images],
    executor: Executor | None,
    tasks: int,
) -> None:
    """Run ``steps`` in order on a batch, in place (masks move with the pixel-moving steps).

    Args:
        steps: From a description's ``steps``.
        images: C-contiguous ``(B, H, W, C)`` / ``(B, H, W)`` uint8 array, or a list of
            ``(H, W, C)`` / ``(H, W)`` arrays (replaced item by item).
        masks: Mask batches matching the images.
        executor: Optional thread pool.
        tasks: Slices of samples to split the batch into on ``executor`` (each runs every
            step on its samples).
    """
    if isinstance(images, np.ndarray):
        batch = images if images.ndim == 4 else _four_d(images)
        _check_channels(batch.shape[-1])
        arrays = [mask for mask in masks if isinstance(mask, np.ndarray)]
        if len(arrays) == len(masks):
            mask_arrays = cast(list[np.ndarray], masks)

            def body(start: int, stop: int) -> None:
                # every step on this slice of samples: a policy's steps hold a few samples
                # each, and samples do not depend on each other
                mine = steps if stop - start == len(batch) else _steps_of(steps, start, stop)
                for step in mine:
                    _run_array(step, batch, mask_arrays)

            parallel_for(executor, len(batch), body, tasks=tasks)
            return
    # A list (sizes differ): each sample is a batch of one.
    count = len(images)
    for k in range(count):
        image = images[k]
        sample = (image if image.ndim == 3 else _four_d(image))[None]
        _check_channels(sample.shape[-1])
        mask_samples = [np.ascontiguousarray(mask[k])[None] for mask in masks]
        for step in steps:
            position = np.searchsorted(step.index, k)
            if position >= len(step.index) or step.index[position] != k:
                continue
            single = Step(
                step.kernel,
                np.zeros(1, np.int64),
                {name: value[position : position + 1] for name, value in step.params.items()},
                step.options,
            )
            _run_array(single, sample, mask_samples)
        images[k] = sample[0] if image.ndim == 3 else sample[0, ..., 0]
        for mask, mask_sample in zip(masks, mask_samples, strict=True):
            mask[k] = mask_sample[0]


class StepTransform(OpTransform):
    """A CPU batch transform running a per-sample description (colour, affine, erasing,
    a policy) in place: its constructor takes the description's arguments plus ``seed``.

    Input ``(B, H, W, C)`` uint8 (C 1 or 3) or a list of ``(H, W, C)`` uint8; masks
    follow the pixel-moving steps (nearest-neighbour), colour steps leave them alone.
    """

    op: StepOperation

    def __init__(self, *args: Any, seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(cast(Any, self.op_type)(*args, **kwargs), seed)

    def apply_all(
        self,
        images: Images,
        masks: Sequence[Images],
        executor: Executor | None,
        tasks: int,
        out: np.ndarray | None = None,  # never given: works in place (writes_out is False)
    ) -> tuple[Images, list[Images]]:
        heights, widths = _sizes(images)
        draws = self.uniform(len(heights), self.op.draws_per_sample)
        moved = list(masks)
        run_steps(self.op.steps(draws, heights, widths), images, moved, executor, tasks)
        return images, moved

    def __getattr__(self, name: str) -> Any:
        # the description's arguments read as the transform's (jitter.brightness)
        if name != "op" and "op" in self.__dict__ and hasattr(self.__dict__["op"], name):
            return getattr(self.__dict__["op"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class ColorJitter(StepTransform):
    """Random brightness, contrast, saturation and hue, in a random order per sample: the CPU
    kernel of :class:`fastdata.ops.ColorJitter`.

    Takes :class:`fastdata.ops.ColorJitter`'s arguments (positional or by name) and ``seed``
    (see :class:`BatchTransform`); raises what the description raises.
    """

    op_type = ops.ColorJitter
    op: ops.ColorJitter


class RandomGrayscale(StepTransform):
    """Turn samples grey with probability ``p``: the CPU kernel of
    :class:`fastdata.ops.RandomGrayscale`.

    Takes :class:`fastdata.ops.RandomGrayscale`'s arguments (positional or by name) and ``seed``
    (see :class:`BatchTransform`); raises what the description raises.
    """

    op_type = ops.RandomGrayscale
    op: ops.RandomGrayscale


class RandomSolarize(StepTransform):
    """Invert the values above a threshold with probability ``p``: the CPU kernel of
    :class:`fastdata.ops.RandomSolarize`.

    Takes :class:`fastdata.ops.RandomSolarize`'s arguments (positional or by name) and ``seed``
    (see :class:`BatchTransform`); raises what the description raises.
    """

    op_type = ops.RandomSolarize
    op: ops.RandomSolarize


class RandomPosterize(StepTransform):
    """Keep the highest bits with probability ``p``: the CPU kernel of
    :class:`fastdata.ops.RandomPosterize`.

    Takes :class:`fastdata.ops.RandomPosterize`'s arguments (positional or by name) and ``seed``
    (see :class:`BatchTransform`); raises what the description raises.
    """

    op_type = ops.RandomPosterize
    op: ops.RandomPosterize


class RandomEqualize(StepTransform):
    """Equalize histograms with probability ``p``: the CPU kernel of
    :class:`fastdata.ops.RandomEqualize`.

    Takes :class:`fastdata.ops.RandomEqualize`'s arguments (positional or by name) and ``seed``
    (see :class:`BatchTransform`); raises what the description raises.
    """

    op_type = ops.RandomEqualize
    op: ops.RandomEqualize


class RandomAutocontrast(StepTransform):
    """Stretch each channel to [0, 255] with probability ``p``: the CPU kernel of
    :class:`fastdata.ops.RandomAutocontrast`.

    Takes :class:`fastdata.ops.RandomAutocontrast`'s arguments (positional or by name) and ``seed``
    (see :class:`BatchTransform`); raises what the description raises.
    """

    op_type = ops.RandomAutocontrast
    op: ops.RandomAutocontrast


class RandomAdjustSharpness(StepTransform):
    """Sharpen or blur with probability ``p``: the CPU kernel of
    :class:`fastdata.ops.RandomAdjustSharpness`.

    Takes :class:`fastdata.ops.RandomAdjustSharpness`'s arguments (positional or by name) and
    ``seed`` (see :class:`BatchTransform`); raises what the description raises.
    """

    op_type = ops.RandomAdjustSharpness
    op: ops.RandomAdjustSharpness


class RandomInvert(StepTransform):
    """Invert with probability ``p``: the CPU kernel of :class:`fastdata.ops.RandomInvert`.

    Takes :class:`fastdata.ops.RandomInvert`'s arguments (positional or by name) and ``seed``
    (see :class:`BatchTransform`); raises what the description raises.
    """

    op_type = ops.RandomInvert
    op: ops.RandomInvert


class GaussianBlur(StepTransform):
    """Gaussian blur of a random sigma per sample: the CPU kernel of
    :class:`fastdata.ops.GaussianBlur`.

    Takes :class:`fastdata.ops.GaussianBlur`'s arguments (positional or by name) and ``seed``
    (see :class:`BatchTransform`); raises what the description raises.
    """

    op_type = ops.GaussianBlur
    op: ops.GaussianBlur


class RandomAffine(StepTransform):
    """Random rotation, shift, scale and shear; masks follow: the CPU kernel of
    :class:`fastdata.ops.RandomAffine`.

    Takes :class:`fastdata.ops.RandomAffine`'s arguments (positional or by name) and ``seed``
    (see :class:`BatchTransform`); raises what the description raises.
    """

    op_type = ops.RandomAffine
    op: ops.RandomAffine


class RandomErasing(StepTransform):
    """Erase a random box of each sample with probability ``p``: the CPU kernel of
    :class:`fastdata.ops.RandomErasing`.

    Takes :class:`fastdata.ops.RandomErasing`'s arguments (positional or by name) and ``seed``
    (see :class:`BatchTransform`); raises what the description raises.
    """

    op_type = ops.RandomErasing
    op: ops.RandomErasing


class RandAugment(StepTransform):
    """timm's RandAugment policy; masks follow the geometric ops: the CPU kernel of
    :class:`fastdata.ops.RandAugment`.

    Takes :class:`fastdata.ops.RandAugment`'s arguments (positional or by name) and ``seed``
    (see :class:`BatchTransform`); raises what the description raises.
    """

    op_type = ops.RandAugment
    op: ops.RandAugment


class TrivialAugmentWide(StepTransform):
    """torchvision's TrivialAugmentWide policy; masks follow the geometric ops: the CPU kernel of
    :class:`fastdata.ops.TrivialAugmentWide`.

    Takes :class:`fastdata.ops.TrivialAugmentWide`'s arguments (positional or by name) and ``seed``
    (see :class:`BatchTransform`); raises what the description raises.
    """

    op_type = ops.TrivialAugmentWide
    op: ops.TrivialAugmentWide
