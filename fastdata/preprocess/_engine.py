"""Engines execute shard tasks. The interface is one method, so a Ray engine can sit
beside the local one; both must produce byte-identical shards (they share
:func:`~fastdata.preprocess._task.write_shard` and the pure per-sample function).
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Protocol

import cv2

from fastdata.preprocess._sources import SourceItem
from fastdata.preprocess._task import (
    SampleResult,
    ShardJob,
    ShardResult,
    ShardTask,
    process_sample,
    run_shard_task,
    write_shard,
)

_CHUNK_ITEMS = 16
_CHUNKS_IN_FLIGHT_PER_WORKER = 4


class Engine(Protocol):
    """Runs shard tasks and reports each written shard.

    ``run`` yields one :class:`ShardResult` per task, in any order, after the shard file
    is in place; ``advance(n)`` is called as samples complete (for the progress bar).
    An exception (e.g. :class:`~fastdata.errors.PreprocessError`) stops the job.
    """

    def run(
        self, tasks: Sequence[ShardTask], job: ShardJob, advance: Callable[[int], None]
    ) -> Iterator[ShardResult]: ...


class LocalEngine:
    """A local process pool: every worker decodes samples of the current shard while the
    parent writes it, so a job is parallel even when it is one shard.

    Args:
        workers: Processes decoding samples; ``1`` runs everything in this process.
    """

    def __init__(self, workers: int) -> None:
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive int, got {workers!r}")
        self.workers = workers

    def run(
        self, tasks: Sequence[ShardTask], job: ShardJob, advance: Callable[[int], None]
    ) -> Iterator[ShardResult]:
        if self.workers == 1:
            for task in tasks:
                result = run_shard_task(task, job)
                advance(len(task.items))
                yield result
            return
        # spawn: a fork of a process whose OpenCV thread pool has run deadlocks the children,
        # and forkserver children returned large (image-sized) results far slower than
        # spawned ones: time benchmarks/bench_preprocess.py before changing the start method.
        # ProcessPoolExecutor rather than multiprocessing.Pool: when a worker raises (on_error
        # "fail") or the caller stops early, Pool.terminate() kills workers mid-operation and
        # can deadlock on the task queue's lock; the executor cancels what has not started and
        # lets running chunks finish.
        executor = ProcessPoolExecutor(
            self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_init_worker,
            initargs=(job,),
        )
        try:
            stream = _ResultStream(executor, tasks, self.workers * _CHUNKS_IN_FLIGHT_PER_WORKER)
            for task in tasks:
                yield write_shard(task, job, stream.take(len(task.items), advance))
        finally:
            executor.shutdown(wait=True, cancel_futures=True)


class _ResultStream:
    """Per-sample results of all tasks' items, in order, computed a bounded window ahead."""

    def __init__(
        self, executor: ProcessPoolExecutor, tasks: Sequence[ShardTask], max_chunks: int
    ) -> None:
        items = [item for task in tasks for item in task.items]
        self._chunks = iter(
            [items[i : i + _CHUNK_ITEMS] for i in range(0, len(items), _CHUNK_ITEMS)]
        )
        self._executor = executor
        self._pending: deque[Future[list[SampleResult]]] = deque()
        self._ready: deque[SampleResult] = deque()
        self._max_chunks = max_chunks

    def _fill(self) -> None:
        while len(self._pending) < self._max_chunks:
            chunk = next(self._chunks, None)
            if chunk is None:
                return
            self._pending.append(self._executor.submit(_process_chunk, chunk))

    def take(self, count: int, advance: Callable[[int], None]) -> Iterator[SampleResult]:
        for _ in range(count):
            if not self._ready:
                self._fill()
                chunk = self._pending.popleft().result()
                advance(len(chunk))
                self._ready.extend(chunk)
                self._fill()
            yield self._ready.popleft()


_worker_job: ShardJob | None = None


def _init_worker(job: ShardJob) -> None:
    global _worker_job  # noqa: PLW0603 - one job per pool process
    _worker_job = job
    cv2.setNumThreads(1)  # the pool is the parallelism; OpenCV's own threads oversubscribe


def _process_chunk(items: list[SourceItem]) -> list[SampleResult]:
    if _worker_job is None:
        raise RuntimeError("preprocess worker used before _init_worker")
    return [process_sample(item, _worker_job) for item in items]
