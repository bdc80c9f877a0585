"""The one rule for class labels, whatever their source (an image folder, a CSV or file
list, a dataset object's items, ``RAMDataset`` targets): an integer in
``0..LABEL_MAX`` (stored as int64). A negative label or one that int64 cannot hold is
refused with the value and the item named, never wrapped around or stored as given."""

from __future__ import annotations

from typing import Any

import numpy as np

LABEL_MAX = int(np.iinfo(np.int64).max)
LABEL_RANGE = f"0..{LABEL_MAX}"


def label_out_of_range(value: int, where: str) -> str:
    """The one-line message for ``value``, a label of ``where`` that is not in range."""
    return f"{where} has label {value}; labels must be integers in {LABEL_RANGE}"


def check_label(value: int, where: str, error: type[Exception] = ValueError) -> int:
    """``value`` if it is a label in range.

    Args:
        value: The label, an int.
        where: The item it belongs to, for the message (``"dataset[5]"``).
        error: The exception type to raise (a ``ValueError`` subclass of the caller's).

    Raises:
        ValueError: (or ``error``) The label is negative or above :data:`LABEL_MAX`.
    """
    if not 0 <= value <= LABEL_MAX:
        raise error(label_out_of_range(value, where))
    return value


def label_array(values: Any, count: int, name: str = "targets") -> np.ndarray:
    """``count`` labels as an ``(count,)`` int64 array.

    Args:
        values: A sequence, NumPy array or CPU tensor of integer labels.
        count: How many there must be.
        name: The argument's name, for the messages (``"targets"``).

    Raises:
        TypeError: A value is not an integer.
        ValueError: Another count or shape, or a label out of range (named by position).
    """
    if isinstance(values, (list, tuple)) and all(type(value) is int for value in values):
        # Python ints, checked before NumPy turns those beyond int64 into floats
        for k, value in enumerate(values):
            check_label(value, f"{name}[{k}]")
        values = np.array(values, np.int64)
    to_numpy = None if isinstance(values, np.ndarray) else getattr(values, "numpy", None)
    labels = np.asarray(to_numpy() if callable(to_numpy) else values)  # a tensor: its array
    if labels.ndim != 1 or len(labels) != count:
        raise ValueError(f"{name} must be {count} labels (one per image), got shape {labels.shape}")
    if labels.size and labels.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers, got dtype {labels.dtype}")
    if labels.size:
        outside = labels > LABEL_MAX if labels.dtype.kind == "u" else labels < 0
        if outside.any():
            k = int(np.argmax(outside))
            check_label(int(labels[k]), f"{name}[{k}]")
    return labels.astype(np.int64)
