"""The CPU batch transform of :class:`fastdata.ops.AugMix`: each slice of samples runs
every chain's steps (the kernels of :mod:`fastdata.transforms._kernels`) on a copy of its
originals and blends them, on the dataset's threads."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor

import numpy as np

from fastdata import ops
from fastdata._images import Images
from fastdata._ops_augmix import refuse_masks
from fastdata._ops_steps import Step
from fastdata._threads import parallel_for
from fastdata.transforms._geometric import _sizes
from fastdata.transforms._steps import StepTransform, _check_channels, _run_array, _steps_of


def mix_chains(
    chains: Sequence[Sequence[Step]],
    weights: np.ndarray,
    batch: np.ndarray,
    executor: Executor | None,
    tasks: int,
) -> None:
    """Blend the original ``(B, H, W, C)`` uint8 ``batch`` and its chains, in place:
    ``weights[:, 0] * original + sum(weights[:, 1 + i] * chain_i)`` in float32 (in that
    order, as torchvision adds them), truncated to uint8."""
    scratch = np.empty_like(batch)  # each chain's copy; every slice writes its own rows
    factors = weights.astype(np.float32)

    def body(start: int, stop: int) -> None:
        rows = slice(start, stop)
        original = batch[rows]
        mixed = original.astype(np.float32)
        mixed *= factors[rows, 0, None, None, None]
        for chain, steps in enumerate(chains):
            chained = scratch[rows]
            chained[...] = original
            for step in _steps_of(steps, start, stop):
                _run_array(step, scratch, [])
            mixed += factors[rows, 1 + chain, None, None, None] * chained
        original[...] = mixed  # truncates toward zero, as torchvision's .to(uint8)

    parallel_for(executor, len(batch), body, tasks=tasks)


class AugMix(StepTransform):
    """torchvision's AugMix: chains of ops on copies of each image, blended with the
    original: the CPU kernel of :class:`fastdata.ops.AugMix`.

    Takes :class:`fastdata.ops.AugMix`'s arguments (positional or by name) and ``seed``
    (see :class:`BatchTransform`); raises what the description raises, and
    ``ValueError`` when called with masks (or boxes), which cannot follow a blend of
    differently moved copies.
    """

    op_type = ops.AugMix
    op: ops.AugMix

    def apply_all(
        self,
        images: Images,
        masks: Sequence[Images],
        executor: Executor | None,
        tasks: int,
        out: np.ndarray | None = None,  # never given: works in place (writes_out is False)
    ) -> tuple[Images, list[Images]]:
        refuse_masks(self.op, masks)
        heights, widths = _sizes(images)
        draws = self.uniform(len(heights), self.op.draws_per_sample)
        if isinstance(images, np.ndarray):
            batch = images if images.ndim == 4 else images[..., None]
            _check_channels(batch.shape[-1])
            chains, weights = self.op.mixing(draws, heights, widths)
            mix_chains(chains, weights, batch, executor, tasks)
            return images, []
        # A list (sizes differ): each sample is a batch of one, from its own draws.
        samples = images
        for k, image in enumerate(samples):
            sample = np.ascontiguousarray(image if image.ndim == 3 else image[..., None])[None]
            _check_channels(sample.shape[-1])
            row = slice(k, k + 1)
            chains, weights = self.op.mixing(draws[row], heights[row], widths[row])
            mix_chains(chains, weights, sample, None, 1)
            samples[k] = sample[0] if image.ndim == 3 else sample[0, ..., 0]
        return images, []
