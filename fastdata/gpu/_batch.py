"""Walk the tensors of a batch: tensors, and tuples, lists and dicts of them (nested)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any

import torch

Batch = Any
FieldKey = str | int


def map_tensors(batch: Batch, fn: Callable[[torch.Tensor], torch.Tensor]) -> Batch:
    """Apply ``fn`` to every tensor of ``batch``, keeping its structure.

    Tuples (named ones too), lists and mappings are rebuilt; other leaves (ints, strings,
    NumPy arrays, …) pass through unchanged.
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


def iter_tensors(batch: Batch) -> Iterator[torch.Tensor]:
    """Every tensor of ``batch``, depth first."""
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from iter_tensors(value)
    elif isinstance(batch, (tuple, list)):
        for value in batch:
            yield from iter_tensors(value)


def fields_of(batch: Batch) -> list[FieldKey]:
    """The top-level keys (mapping) or positions (tuple/list) of ``batch``."""
    if isinstance(batch, Mapping):
        return list(batch.keys())
    if isinstance(batch, (tuple, list)):
        return list(range(len(batch)))
    return []


def check_fields(batch: Batch, keys: Collection[FieldKey], argument: str) -> None:
    """Make sure every key is a top-level field of ``batch``.

    Raises:
        KeyError: A key is not a field of ``batch`` (the message names ``argument``).
    """
    present = fields_of(batch)
    missing = [key for key in keys if key not in present]
    if missing:
        raise KeyError(
            f"{argument} names field(s) {missing} that the batch lacks; its fields are {present}"
        )


def map_fields(
    batch: Batch, fn: Callable[[FieldKey, Any], Any], keys: Collection[FieldKey]
) -> Batch:
    """Replace the top-level fields ``keys`` of a mapping/tuple/list batch by ``fn(key, value)``."""
    if isinstance(batch, Mapping):
        return type(batch)(  # type: ignore[call-arg]
            {key: fn(key, value) if key in keys else value for key, value in batch.items()}
        )
    values = [fn(i, value) if i in keys else value for i, value in enumerate(batch)]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*values)
    return type(batch)(values)
