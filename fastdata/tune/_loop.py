"""The timed training loop that ``autotune`` and ``profile`` share.

Both time a loop as a user runs it: the time in ``next(iterator)`` is waiting for data,
the time in ``step`` (then a device synchronize, if given) is compute. They differ only in
which iterations they keep (a warm-up count, a timed window) and in what they report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Tick:
    """One iteration of the loop.

    Attributes:
        wait_s: Time waiting for the batch, seconds (with ``repeat``, the first batch of a
            new epoch also carries the time to restart the loader).
        step_s: Time in ``step`` and ``synchronize``, seconds.
        fetched: ``time.perf_counter()`` when the batch arrived.
        done: ``time.perf_counter()`` when ``step`` returned.
        since_start_s: From the start of the loop (before ``iter(loader)``) to ``fetched``.
    """

    wait_s: float
    step_s: float
    fetched: float
    done: float
    since_start_s: float


def timed_steps(
    loader: Iterable[Any],
    step: Callable[[Any], Any] | None,
    *,
    synchronize: Callable[[], None] | None = None,
    repeat: bool = False,
    first: Callable[[Any], None] | None = None,
) -> Generator[Tick, None, None]:
    """Iterate ``loader``, run ``step`` on each batch and yield each iteration's times.

    The batch is dropped before the tick is yielded, so no more than one batch is held
    while the caller decides whether to go on; closing the generator drops the loader's
    iterator (and with it the workers of a non-persistent DataLoader).

    Args:
        loader: Any iterable of batches (iterated from the start).
        step: Called on every batch; ``None`` times the data alone.
        synchronize: Called after ``step`` so that queued device work is timed as compute.
        repeat: Start a new epoch when the loader ends (after at least one batch) instead
            of stopping.
        first: Called with the first batch, before ``step`` (e.g. to size it).

    Yields:
        A :class:`Tick` per batch.
    """
    started = time.perf_counter()
    iterator = iter(loader)
    seen = False
    epoch_since: float | None = None
    try:
        while True:
            t0 = time.perf_counter() if epoch_since is None else epoch_since
            try:
                batch = next(iterator)
            except StopIteration:
                if not repeat or not seen:
                    return
                # A new epoch: its refill time is charged to its first batch.
                epoch_since = t0
                iterator = iter(loader)
                continue
            epoch_since = None
            t1 = time.perf_counter()
            if not seen:
                seen = True
                if first is not None:
                    first(batch)
            if step is not None:
                step(batch)
            if synchronize is not None:
                synchronize()
            t2 = time.perf_counter()
            del batch
            yield Tick(
                wait_s=t1 - t0, step_s=t2 - t1, fetched=t1, done=t2, since_start_s=t1 - started
            )
    finally:
        del iterator
