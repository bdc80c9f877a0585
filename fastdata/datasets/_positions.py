"""Sets of positions in a rank's epoch order, as sorted ``[start, stop)`` ranges.

A resumable state records which positions of the epoch's order the training loop has
consumed: usually a prefix, plus a few batches past it when a loader hands batches out of
order (``DataLoader(in_order=False)``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

Ranges = list[tuple[int, int]]


def mask_of(num_positions: int, ranges: Iterable[tuple[int, int]]) -> np.ndarray:
    """``(num_positions,)`` bool: True at the positions in ``ranges``."""
    mask = np.zeros(num_positions, dtype=bool)
    for start, stop in ranges:
        mask[start:stop] = True
    return mask


def ranges_of(mask: np.ndarray) -> Ranges:
    """The runs of True in ``mask``, as sorted, disjoint, non-adjacent ranges."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]])))
    return [(int(start), int(stop)) for start, stop in zip(edges[::2], edges[1::2], strict=True)]


def remaining_positions(num_positions: int, done: Ranges) -> np.ndarray:
    """The positions not in ``done``, in order: what an iteration after a resume yields."""
    if not done:
        return np.arange(num_positions)
    return np.flatnonzero(~mask_of(num_positions, done))


def consumed_ranges(num_positions: int, done: Ranges, taken: Sequence[tuple[int, int]]) -> Ranges:
    """``done`` plus the positions of ``taken``, ranges of the stream that followed ``done``.

    The stream of an iteration is ``remaining_positions(num_positions, done)``; ``taken``
    indexes it.
    """
    if not done and len(taken) <= 1:  # the usual case: one prefix
        return [(start, stop) for start, stop in taken if stop > start]
    mask = mask_of(num_positions, done)
    stream = np.flatnonzero(~mask)
    for start, stop in taken:
        mask[stream[start:stop]] = True
    return ranges_of(mask)
