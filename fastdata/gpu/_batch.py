"""The top-level fields of a batch (tuple, list or mapping), for the device modules.

Walking a batch's tensors is :mod:`fastdata._batch`'s (re-exported here).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

from fastdata._batch import Batch, iter_tensors, map_tensors

__all__ = [
    "Batch",
    "FieldKey",
    "check_fields",
    "fields_of",
    "iter_tensors",
    "map_fields",
    "map_tensors",
]

FieldKey = str | int


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
