"""The one walker over a batch: tensors, arrays and bytes inside tuples (named ones too),
lists and mappings, nested.

The device prefetcher moves a batch's tensors with :func:`map_tensors`, the profiler
times the same move, and the tuner sizes batches with :func:`batch_nbytes`: one
definition of "the tensors of a batch" keeps them agreeing on which leaves count and on
the structure they give back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

Batch = Any


def iter_leaves(batch: Batch) -> Iterator[Any]:
    """Every leaf of ``batch`` (what is not a tuple, list or mapping), depth first."""
    if isinstance(batch, Mapping):
        for value in batch.values():
            yield from iter_leaves(value)
    elif isinstance(batch, (tuple, list)):
        for value in batch:
            yield from iter_leaves(value)
    else:
        yield batch


def iter_tensors(batch: Batch) -> Iterator[torch.Tensor]:
    """Every tensor of ``batch``, depth first."""
    return (leaf for leaf in iter_leaves(batch) if isinstance(leaf, torch.Tensor))


def map_tensors(batch: Batch, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    """Apply ``fn`` to every tensor of ``batch``, keeping its structure.

    Tuples (named ones too), lists and mappings are rebuilt with their own type; other
    leaves (ints, strings, NumPy arrays, …) pass through unchanged.
    """
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return type(batch)({key: map_tensors(value, fn) for key, value in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(map_tensors(value, fn) for value in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(map_tensors(value, fn) for value in batch)
    return batch


def leaf_nbytes(leaf: Any) -> int:
    """Bytes held by one leaf: a tensor, a NumPy array or bytes; 0 for anything else."""
    if isinstance(leaf, torch.Tensor):
        return leaf.element_size() * leaf.nelement()
    if isinstance(leaf, np.ndarray):
        return int(leaf.nbytes)
    if isinstance(leaf, (bytes, bytearray)):
        return len(leaf)
    return 0


def batch_nbytes(batch: Batch) -> int:
    """Bytes of the tensors, arrays and bytes in a (possibly nested) batch."""
    return sum(leaf_nbytes(leaf) for leaf in iter_leaves(batch))
