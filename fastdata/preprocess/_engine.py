"""Engines execute shard tasks. The interface is one method, so a Ray engine can sit
beside the local one; both must produce byte-identical shards (they share
:func:`~fastdata.preprocess._task.write_shard` and the pure per-sample function).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from fastdata.preprocess._pool import CHUNK_ITEMS, lend_pool
from fastdata.preprocess._task import ShardJob, ShardResult, ShardTask, run_shard_task, write_shard


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
    spawned by the first job and kept, idle, for the next one in this process (starting
    them costs as much as hundreds of images); they exit a minute after the last job, or
    as soon as this process dies.

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
        num_items = sum(len(task.items) for task in tasks)
        if self.workers == 1 or num_items == 0:
            for task in tasks:
                result = run_shard_task(task, job)
                advance(len(task.items))
                yield result
            return
        # spawn: a fork of a process whose OpenCV thread pool has run deadlocks the children.
        with lend_pool(min(self.workers, max(1, -(-num_items // CHUNK_ITEMS))), job) as pool:
            results = pool.results([item for task in tasks for item in task.items], advance)
            for task in tasks:
                yield write_shard(task, job, itertools.islice(results, len(task.items)))
