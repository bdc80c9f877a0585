"""Where a dataset's batch tensors come from: reused in the training process, shared
memory in DataLoader workers.

A batch handed to a ``DataLoader`` may be held by the caller for as long as it likes, so
a buffer is reused only once nothing outside this module refers to its memory any more:
no returned batch, no view of one, no NumPy array made from one. That is counted on the
tensor storage itself (every tensor or view of the memory holds one reference to it), and
on the storage's Python object (``tensor.untyped_storage()`` or ``tensor.storage()`` kept
without any tensor), so a caller who keeps a batch simply gets a fresh buffer next time.
A batch is handed out as a new tensor over the buffer's memory, not as a view of the tensor
the pool keeps, so no ``._base`` leads a caller to that one. A buffer that was moved to
shared memory (sent to another process) is never reused.

Inside a DataLoader worker, a batch leaves as shared memory that the training process
maps, and the worker cannot see when that mapping is dropped: it allocates each batch it
sends in fresh shared memory (so sending it does not copy it once more), faulted in with
one system call (Linux), unless the loader's iterator tells it when a batch's memory is
free again (:class:`~fastdata.datasets.ResumableDataLoader`, ``dataset.loader(...)``):
then it takes it from a small ring of segments (:mod:`fastdata.datasets._slots`). Scratch
batches that never leave the worker are reused there as in the training process.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import get_worker_info

from fastdata._batch_memory import is_free, populate, storage_use_count
from fastdata.datasets._slots import WorkerSlots

_SHARED_MIN_BYTES = 1 << 16  # smaller batches: a plain allocation is cheaper
# Free buffers kept per (shape, dtype) and thread: the batch a training loop still holds
# while it asks for the next one, plus the one it has let go of.
_SLOTS = 2
# Batch sizes a pool keeps buffers for: the full batches and an epoch's last, partial one.
_BATCH_SIZES = 2

Key = tuple[tuple[int, ...], torch.dtype]


class BatchBuffers:
    """Per-thread pools of batch tensors for one dataset.

    Pickled without its pools: each process (and thread) starts with empty ones.

    Args:
        buffers_per_batch: How many batch tensors (shapes) the dataset may take from the
            pool for one batch: one per field it reads, plus decoded crops and a
            transform's output. Each thread keeps buffers for that many shapes in each of
            two batch sizes (full batches and the last partial one), the shapes used least
            recently forgotten first, so that no batch of a steady loop allocates.

    Raises:
        TypeError: ``buffers_per_batch`` is not an int.
        ValueError: ``buffers_per_batch`` is below 1.
    """

    def __init__(self, buffers_per_batch: int = 2) -> None:
        if isinstance(buffers_per_batch, bool) or not isinstance(buffers_per_batch, int):
            raise TypeError(f"buffers_per_batch must be an int, got {buffers_per_batch!r}")
        if buffers_per_batch < 1:
            raise ValueError(f"buffers_per_batch must be at least 1, got {buffers_per_batch}")
        self.max_keys = _BATCH_SIZES * buffers_per_batch
        self._allocated: dict[int, int] = {}  # by thread (no lock: each writes its own)
        self._local = threading.local()

    @property
    def allocations(self) -> int:
        """Batch tensors the pools have allocated (not reused) in this process so far."""
        return sum(list(self._allocated.values()))  # copied at once: threads may add

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, *, returned: bool) -> torch.Tensor:
        """An uninitialised ``shape`` tensor of ``dtype``.

        Args:
            shape: The batch shape.
            dtype: Its dtype.
            returned: Whether the tensor is handed to the caller (inside a worker it is then
                allocated in shared memory) or only read by a transform in this call.
        """
        if get_worker_info() is not None:
            nbytes = math.prod(shape) * dtype.itemsize
            if not returned and storage_use_count is not None:
                return self._reused(tuple(shape), dtype)  # scratch: never leaves the worker
            if not returned or nbytes < _SHARED_MIN_BYTES:
                return torch.empty(shape, dtype=dtype)
            capacity = getattr(self._local, "worker_slots", 0)
            if capacity and storage_use_count is not None:
                batch = self._worker_slots().take(tuple(shape), dtype, capacity)
                if batch is not None:
                    return batch
            storage = torch.UntypedStorage._new_shared(nbytes)
            populate(storage.data_ptr(), nbytes)
            return torch.empty(0, dtype=dtype).set_(storage).view(shape)
        if storage_use_count is None:  # torch without the count: no reuse
            return torch.empty(shape, dtype=dtype)
        return self._reused(tuple(shape), dtype)

    @contextlib.contextmanager
    def worker_slots(self, capacity: int) -> Iterator[None]:
        """Within it, batches this thread hands out of a DataLoader worker come from a ring
        of ``capacity`` shared-memory segments per shape (0: none), each taken again once
        the training process has let go of it (see :mod:`fastdata.datasets._slots`).

        Only for a loader whose iterator marks the segments free: a
        :class:`~fastdata.datasets.ResumableDataLoader` asks for it in its index batches.
        Hold the batch made within it past its end: segments taken in it that nothing
        refers to at the end (samples dropped) go back to the ring. When the code within
        raises, every segment taken in it goes back, once the exception is let go of.
        """
        previous = getattr(self._local, "worker_slots", 0)
        self._local.worker_slots = capacity
        try:
            yield
        except BaseException:
            self._local.worker_slots = previous
            if capacity:  # the batch is not sent: its segments go back to the ring
                self._worker_slots().abandon()
            raise
        self._local.worker_slots = previous
        if capacity:
            self._worker_slots().settle()

    def _worker_slots(self) -> WorkerSlots:
        slots: WorkerSlots | None = getattr(self._local, "slots", None)
        if slots is None:
            slots = self._local.slots = WorkerSlots()
        return slots

    def _reused(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        pools: dict[Key, list[torch.Tensor]] = self._local.__dict__.setdefault("pools", {})
        key = (shape, dtype)
        pool = pools.pop(key, [])
        pools[key] = pool  # the most recently used shape last: forgotten last
        for kept in [k for k in pool if k.is_shared()]:
            pool.remove(kept)  # sent to another process: its readers are out of sight
        for kept in pool:
            if is_free(kept):
                return kept.detach()  # an alias, not a view: the caller's references count
        kept = torch.empty(shape, dtype=dtype)
        thread = threading.get_ident()
        self._allocated[thread] = self._allocated.get(thread, 0) + 1
        if len(pool) < _SLOTS:
            pool.append(kept)
        while len(pools) > self.max_keys:
            del pools[next(iter(pools))]  # the shape used least recently
        return kept.detach()

    def clear(self) -> None:
        """Forget every thread's pools (their memory is freed once no batch refers to it)."""
        self._local = threading.local()

    def __getstate__(self) -> dict[str, Any]:
        return {"max_keys": self.max_keys}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.max_keys = state["max_keys"]
        self._allocated = {}
        self._local = threading.local()
