"""Progress bars for long work: tqdm.auto (notebook-aware), silenced on request.

Byte counts are shown scaled (``1.2G/3.4G``, ``310MB/s``). When stderr is not a terminal
(a log file, CI), bars redraw at most every :data:`LOG_INTERVAL_S` seconds instead of ten
times a second, so a log gets a few lines per bar rather than hundreds of carriage-return
updates; ``TQDM_MININTERVAL`` in the environment still wins.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")

# Seconds between redraws of a bar written to something that is not a terminal.
LOG_INTERVAL_S = 30.0


def _options(unit: str) -> dict[str, Any]:
    options: dict[str, Any] = {"unit": unit, "dynamic_ncols": True}
    if unit == "B":
        options.update(unit_scale=True, unit_divisor=1024)
    notebook = "notebook" in getattr(tqdm, "__module__", "")
    stream = sys.stderr
    interactive = stream is not None and hasattr(stream, "isatty") and stream.isatty()
    if not notebook and not interactive and "TQDM_MININTERVAL" not in os.environ:
        # maxinterval too: tqdm's monitor thread otherwise forces a redraw every 10 s.
        options.update(mininterval=LOG_INTERVAL_S, maxinterval=LOG_INTERVAL_S)
    return options


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
    return iter(tqdm(iterable, total=total, desc=desc, **_options(unit)))


def progress_bar(*, total: int | None, desc: str, unit: str = "it", enabled: bool = True) -> tqdm:
    """A manually updated progress bar (``.update(n)``, ``.close()``); disabled when asked.

    ``unit="B"`` counts bytes, shown scaled (KiB, MiB, GiB).
    """
    return tqdm(total=total, desc=desc, disable=not enabled, **_options(unit))
