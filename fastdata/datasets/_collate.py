"""Collate for datasets whose ``__getitems__`` already returns a collated batch."""

from __future__ import annotations

from typing import Any

from torch.utils.data import default_collate


def passthrough_collate(batch: Any) -> Any:
    """Return a batch that ``__getitems__`` already collated, untouched.

    ``DataLoader`` calls ``collate_fn`` on whatever the dataset's ``__getitems__``
    returned. fastdata datasets return a finished batch (a tuple of tensors, or of a list
    of encoded-byte tensors and tensors), which ``default_collate`` would take apart
    sample by sample. Pass this function as ``collate_fn``.

    A ``list`` is what ``DataLoader`` hands over when it fetched samples one by one
    (a dataset without ``__getitems__``); it is collated with ``default_collate`` so
    this function is safe with any dataset.

    Example:
        >>> loader = DataLoader(ds, batch_size=64, collate_fn=passthrough_collate)  # doctest: +SKIP
    """
    if isinstance(batch, list):
        return default_collate(batch)
    return batch
