"""For engine authors: how a preprocessing job reaches the processes that run it.

:func:`~fastdata.preprocess.preprocess` splits a job into :class:`ShardTask` s (pure
functions: items in, one shard file out) that share one :class:`ShardJob`, and hands them
to an :class:`Engine`. :class:`LocalEngine` (a local process pool) is the default; the
Ray engine (:class:`~fastdata.preprocess.RayEngine`) is another. A new engine implements
:class:`Engine`'s one method and runs each task with :func:`run_shard_task`, which writes
the shard and returns its :class:`ShardResult`; every engine produces byte-identical shards
(they share the writer and the pure per-sample function).

Example:
    >>> from fastdata.preprocess import preprocess
    >>> from fastdata.preprocess.engine import LocalEngine
    >>> preprocess("photos/", "out/", engine=LocalEngine(4, start_method="spawn"))
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from fastdata.errors import PreprocessError
from fastdata.preprocess._fork import fork_refusal, resolve_start_method
from fastdata.preprocess._pool import CHUNK_ITEMS, lend_pool
from fastdata.preprocess._task import ShardJob, ShardResult, ShardTask, run_shard_task, write_shard

__all__ = ["Engine", "LocalEngine", "ShardJob", "ShardResult", "ShardTask", "run_shard_task"]


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
    parent writes it, so a job is parallel even when it is one shard. The workers are
    started by the first job and kept, idle, for the next one in this thread; they exit
    a minute after the last job, or as soon as this process dies. Workers forked for a
    dataset that cannot be pickled serve that job only.

    Args:
        workers: Processes decoding samples; ``1`` runs everything in this process.
        start_method: ``"auto"`` (the default): ``"fork"`` where this process can fork
            safely (Linux, CUDA not initialised), else ``"spawn"``. ``"fork"``: copies of
            this process, which start in milliseconds and inherit the job without
            pickling. ``"spawn"``: fresh interpreters that import the job (a script that
            calls :func:`preprocess` must then do so under ``if __name__ ==
            "__main__":``); a dataset object that cannot be pickled is then refused,
            naming why (``"auto"`` forks for it where that is safe).

    Raises:
        ValueError: ``workers`` is not a positive int, or ``start_method`` is none of
            ``"auto"``, ``"fork"`` and ``"spawn"``.
        PreprocessError: ``"fork"`` where this process cannot fork workers (the message
            says why).
    """

    def __init__(self, workers: int, *, start_method: str = "auto") -> None:
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive int, got {workers!r}")
        if start_method not in ("auto", "fork", "spawn"):
            raise ValueError(
                f"start_method must be 'auto', 'fork' or 'spawn', got {start_method!r}"
            )
        refusal = fork_refusal() if start_method == "fork" else ""
        if refusal:
            raise PreprocessError(f"LocalEngine cannot fork its worker processes: {refusal}")
        self.workers = workers
        self.start_method = start_method

    def run(
        self, tasks: Sequence[ShardTask], job: ShardJob, advance: Callable[[int], None]
    ) -> Iterator[ShardResult]:
        num_items = sum(len(task.items) for task in tasks)
        if self.workers == 1 or num_items == 0:
            for task in tasks:
                result = run_shard_task(task, job)
                advance(len(task.items))
                yield result
            return
        workers = min(self.workers, max(1, -(-num_items // CHUNK_ITEMS)))
        # resolved per job: CUDA may have been initialised since the engine was made
        start_method = resolve_start_method(self.start_method)
        with lend_pool(workers, job, start_method) as pool:
            items = itertools.chain.from_iterable(task.items for task in tasks)  # lazily
            results = pool.results(items, num_items, advance)
            for task in tasks:
                yield write_shard(task, job, itertools.islice(results, len(task.items)))
