"""Splitting per-sample work of one batch across a thread pool (OpenCV and NumPy copies
release the GIL, so threads scale where worker processes would pay to ship the batch)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor

import cv2


def parallel_for(
    executor: Executor | None,
    count: int,
    body: Callable[[int, int], None],
    *,
    tasks: int,
    chunk: int | None = None,
) -> None:
    """Run ``body(start, stop)`` over ``range(count)`` on at most ``tasks`` threads.

    With ``chunk=None`` the range is split into ``tasks`` equal slices, one per thread (for
    work of equal cost per item, such as copies). With a ``chunk``, each thread takes the
    next ``chunk`` items as it finishes its last ones, so that items of unequal cost (images
    of different sizes) or a thread the machine descheduled do not leave the others idle at
    the end of the batch; ``body`` is then called many times per thread.

    Runs inline when there is no executor, one task, or fewer than two items per task;
    exceptions from any call propagate to the caller. With a ``chunk``, an exception stops
    the threads from taking more items, and the call returns only once none still runs
    ``body`` (so that none writes into the caller's buffers after it).
    """
    if executor is None or tasks <= 1 or count < 2 * tasks:
        if count:
            body(0, count)
        return
    if chunk is None:
        bounds = [count * k // tasks for k in range(tasks + 1)]
        futures = [executor.submit(body, bounds[k], bounds[k + 1]) for k in range(1, tasks)]
        body(bounds[0], bounds[1])  # the calling thread takes the first slice
    else:
        starts = iter(range(0, count, max(1, chunk)))
        lock = threading.Lock()
        failed = threading.Event()

        def take_until_done() -> None:
            while not failed.is_set():
                with lock:
                    start = next(starts, None)
                if start is None:
                    return
                try:
                    body(start, min(start + max(1, chunk), count))
                except BaseException:
                    failed.set()  # the other threads take no more items
                    raise

        futures = [executor.submit(take_until_done) for _ in range(1, tasks)]
        try:
            take_until_done()  # the calling thread takes chunks too
        finally:  # return or raise only once no thread still runs `body`
            for future in futures:
                future.exception()
    for future in futures:
        future.result()


class _OpenCVForkedOnOneThread:
    """Forks from this process start their child with OpenCV on one thread (registered
    once, below, for every fork: a DataLoader's workers, the preprocessing workers, a
    user's own pool). Each forked worker is one of the parallel tasks, and OpenCV's own
    pool in every worker only competes with the others for the cores; the child cannot
    shrink it itself (``cv2.setNumThreads`` in a child forked after the pool has run
    deadlocks), so the pool is shrunk here while forking and this process's setting is
    restored after (a counter: several threads may fork at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._forking = 0
        self._threads = 0

    def before(self) -> None:
        with self._lock:
            if self._forking == 0:
                self._threads = cv2.getNumThreads()
                cv2.setNumThreads(1)
            self._forking += 1

    def after_in_parent(self) -> None:
        with self._lock:
            self._forking -= 1
            if self._forking == 0:
                cv2.setNumThreads(self._threads)

    def after_in_child(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self._forking = 0


_FORKS = _OpenCVForkedOnOneThread()
os.register_at_fork(
    before=_FORKS.before,
    after_in_parent=_FORKS.after_in_parent,
    after_in_child=_FORKS.after_in_child,
)
