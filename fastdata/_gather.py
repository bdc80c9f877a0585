"""The one batched read path over segmented storage (shards on disk, or one RAM buffer).

``ShardReader`` and the datasets' stores both read through these functions (each field
kind's ``gather`` calls the one for its layout), so indexing, ordering and copying behave
the same everywhere; the checks of a shard happen when the ``view`` callables open it
(``fastdata.shards.reader``), once per shard and process.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import numpy as np

from fastdata._threads import parallel_for

# Below this many bytes per sample a vectorised fancy-index read beats a copy loop.
SMALL_SAMPLE_BYTES = 512


def locate(starts: np.ndarray, indices: Any) -> tuple[np.ndarray, np.ndarray]:
    """Global indices → (segment, index inside that segment), vectorised.

    Args:
        starts: ``(S + 1,)`` int64 cumulative segment starts: ``starts[0] == 0``,
            ``starts[-1]`` the number of samples. Empty segments are allowed.
        indices: Integer indices; negative ones count from the end.

    Raises:
        IndexError: An index is out of range (the first such index is named).
    """
    indices = np.asarray(indices, dtype=np.int64)
    n = int(starts[-1])
    if indices.size and (indices.min() < -n or indices.max() >= n):
        bad = indices[(indices < -n) | (indices >= n)][0]
        raise IndexError(f"sample index {int(bad)} out of range for {n} samples")
    indices = np.where(indices < 0, indices + n, indices)
    if len(starts) == 2:  # one segment
        return np.zeros(indices.shape, np.int64), indices
    segments = np.searchsorted(starts, indices, side="right") - 1
    return segments, indices - starts[segments]


def gather_rows(
    view: Callable[[int], Any],
    segments: np.ndarray,
    local: np.ndarray,
    out: np.ndarray,
    *,
    sample_nbytes: int,
    executor: Executor | None = None,
    tasks: int = 1,
) -> None:
    """Copy rows ``local`` of segments ``segments`` into ``out[0:len(segments)]``.

    Args:
        view: Segment number → its ``(n, *shape)`` rows: a mapped ``np.ndarray``, or an
            array-like that needs sorted unique indices (``h5py.Dataset``).
        segments, local: What :func:`locate` returns.
        out: ``(len(segments), *shape)`` destination.
        sample_nbytes: Bytes per row; small rows are read with one fancy index per
            segment, large ones copied one by one in (segment, row) order.
        executor, tasks: The copy loop is split into ``tasks`` slices on ``executor``
            (NumPy releases the GIL while copying).
    """
    small = sample_nbytes <= SMALL_SAMPLE_BYTES
    copies: list[tuple[int, Any, int]] = []  # (output row, view, row in view), file order
    for segment in np.unique(segments).tolist():
        positions = np.flatnonzero(segments == segment)
        rows = view(segment)
        if not isinstance(rows, np.ndarray):  # h5py (chunked): sorted unique rows only
            unique, inverse = np.unique(local[positions], return_inverse=True)
            out[positions] = rows[unique][inverse]
        elif small:
            out[positions] = rows[local[positions]]
        else:
            order = np.argsort(local[positions], kind="stable")
            wanted = local[positions][order].tolist()
            copies += [(p, rows, r) for p, r in zip(positions[order].tolist(), wanted, strict=True)]

    def body(start: int, stop: int) -> None:
        for position, rows, row in copies[start:stop]:
            out[position] = rows[row]

    parallel_for(executor, len(copies), body, tasks=tasks)


def gather_encoded(
    view: Callable[[int], tuple[Any, np.ndarray]], segments: np.ndarray, local: np.ndarray
) -> list[np.ndarray]:
    """Variable-length samples as 1-D arrays (views where the storage allows).

    Args:
        view: Segment number → ``(blob, offsets)``: sample ``i`` is
            ``blob[offsets[i]:offsets[i + 1]]``.
        segments, local: What :func:`locate` returns.
    """
    cache: dict[int, tuple[Any, np.ndarray]] = {}
    result = []
    for segment, position in zip(segments.tolist(), local.tolist(), strict=True):
        if segment not in cache:
            cache[segment] = view(segment)
        blob, offsets = cache[segment]
        result.append(np.asarray(blob[offsets[position] : offsets[position + 1]]))
    return result
