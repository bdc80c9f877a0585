"""Splitting per-sample work of one batch across a thread pool (OpenCV and NumPy copies
release the GIL, so threads scale where worker processes would pay to ship the batch)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor


def parallel_for(
    executor: Executor | None, count: int, body: Callable[[int, int], None], *, tasks: int
) -> None:
    """Run ``body(start, stop)`` over ``range(count)`` split into at most ``tasks`` slices.

    Runs inline when there is no executor, one task, or fewer than two items per task;
    exceptions from any slice propagate to the caller.
    """
    if executor is None or tasks <= 1 or count < 2 * tasks:
        if count:
            body(0, count)
        return
    bounds = [count * k // tasks for k in range(tasks + 1)]
    futures = [executor.submit(body, bounds[k], bounds[k + 1]) for k in range(1, tasks)]
    body(bounds[0], bounds[1])  # the calling thread takes the first slice
    for future in futures:
        future.result()
