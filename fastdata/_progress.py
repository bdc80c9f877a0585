"""Progress bars for long work: tqdm.auto (notebook-aware), silenced on request."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress(
    iterable: Iterable[T],
    *,
    total: int | None = None,
    desc: str = "",
    unit: str = "it",
    enabled: bool = True,
) -> Iterator[T]:
    """Wrap ``iterable`` in a progress bar unless ``enabled`` is false."""
    if not enabled:
        return iter(iterable)
    return iter(tqdm(iterable, total=total, desc=desc, unit=unit, dynamic_ncols=True))


def progress_bar(*, total: int | None, desc: str, unit: str = "it", enabled: bool = True) -> tqdm:
    """A manually updated progress bar (``.update(n)``, ``.close()``); disabled when asked."""
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True)
