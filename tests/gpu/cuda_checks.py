"""Helpers of the `gpu` tests: count the host synchronizations torch reports, queue GPU
spin on the current stream."""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch


def host_syncs(fn: Callable[[], object]) -> int:
    """How many host synchronizations torch reports (sync debug mode) while ``fn`` runs:
    copies from pageable memory with ``non_blocking=False``, ``.item()``, Python-list
    indices built on the host, ... (not the event waits a caller asks for)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message).lower() for w in caught)


def spin(cycles: int) -> None:
    """Queue ``cycles`` GPU clock cycles of spin on the current stream (no host work)."""
    torch.cuda._sleep(cycles)
