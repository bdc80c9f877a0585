"""Batch memory a DataLoader worker reuses once the training process has let go of it.

A batch a worker sends lives in shared memory that the training process maps. Allocating,
faulting in and freeing a fresh segment per batch (and mapping it anew in the training
process) costs about as much CPU as a light augmentation of the batch. Under
:class:`~fastdata.datasets.ResumableDataLoader` (``dataset.loader(...)``), whose iterator
runs in the training process, each worker instead keeps a small ring of segments per batch
shape, and the training process keeps each one mapped:

- A segment carries, after the batch, a trailer: a marker, the segment's token and a flag
  byte. The flag is ``HELD`` while the segment is written, in flight or handed out; the
  training process alone sets it ``FREE``, and only once nothing refers to the memory there:
  no batch handed out, no view of one, no NumPy array or storage object made from one (the
  counts of :func:`~fastdata._batch_memory.is_free`), no batch kept by the loader
  (received out of order). A segment whose memory was pickled for another process (a
  ``torch.multiprocessing`` queue), whose readers are out of sight, is never set ``FREE``.
  The worker alone sets it back to ``HELD`` when it takes the
  segment for a new batch, and takes only a ``FREE`` one that nothing in the worker refers
  to either.
- A batch is handed out as the tensor the worker sent, over the segment's memory; the
  loader keeps its own tensor over the whole segment, which keeps the mapping (sending the
  segment again maps nothing new) and lets it write the flag.
- When no segment is free (a caller keeping batches, a slow step) the worker sends a fresh
  segment, as without a ring: nobody waits and no kept batch changes.
- Segments a batch took before its dataset raised are never sent: the worker puts them
  back in the ring once nothing refers to them (the exception's traceback, until the
  worker has reported it).

A segment whose batch never reaches the loader's iterator as sent (a ``collate_fn`` that
copies the batch in the worker) stays ``HELD``: the worker then sends fresh segments, as
without a ring. With ``pin_memory=True`` the loop gets pinned copies made before the loader
sees the batch, so no ring is offered.
"""

from __future__ import annotations

import ctypes
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import shared_cache

from fastdata._batch_memory import is_free, populate

_MARKER = b"fastdata:slot\x00\x01\x7f"  # 16 bytes
_TOKEN_AT = len(_MARKER)  # 8 bytes, little-endian
_FLAG_AT = _TOKEN_AT + 8
TRAILER_BYTES = 64  # a multiple of every dtype's size: the batch starts at offset 0
HELD, FREE = 0, 1
# Rings per worker thread: one per field sent (images, masks, labels) and batch size (the
# full batches and the last, shorter one).
MAX_SHAPES = 8


def _trailer(storage: torch.UntypedStorage) -> int | None:
    """The address of ``storage``'s slot trailer, or ``None`` if it is not a worker slot."""
    if storage.device.type != "cpu" or not storage.is_shared():
        return None
    nbytes = storage.nbytes()
    if nbytes < TRAILER_BYTES:
        return None
    address = storage.data_ptr() + nbytes - TRAILER_BYTES
    return address if ctypes.string_at(address, _TOKEN_AT) == _MARKER else None


@dataclass
class _Slot:
    """One segment: ``whole`` is a 1-D uint8 tensor over all of it (trailer included)."""

    whole: torch.Tensor
    flag: ctypes.c_uint8  # over the trailer's flag byte; valid while `whole` lives

    @classmethod
    def new(cls, nbytes: int) -> _Slot:
        storage = torch.UntypedStorage._new_shared(nbytes + TRAILER_BYTES)
        populate(storage.data_ptr(), nbytes + TRAILER_BYTES)
        address = storage.data_ptr() + nbytes
        token = int.from_bytes(os.urandom(8), "little")
        ctypes.memmove(address, _MARKER + token.to_bytes(8, "little"), _FLAG_AT)
        flag = ctypes.c_uint8.from_address(address + _FLAG_AT)
        flag.value = HELD
        return cls(torch.empty(0, dtype=torch.uint8).set_(storage), flag)

    def batch(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A new tensor of ``shape`` and ``dtype`` over the segment's start."""
        strides: list[int] = []
        step = 1
        for size in reversed(shape):
            strides.insert(0, step)
            step *= size
        storage = self.whole.untyped_storage()
        return torch.empty(0, dtype=dtype).set_(storage, 0, shape, strides)


class WorkerSlots:
    """A worker's rings of segments, per batch shape and dtype (one thread's)."""

    def __init__(self) -> None:
        self._rings: dict[tuple[tuple[int, ...], torch.dtype], list[_Slot]] = {}
        self._taken: list[_Slot] = []  # since the last settle()
        # Taken for a batch that failed: never sent, put back once nothing refers to them.
        self._unsent: list[_Slot] = []

    def take(
        self, shape: tuple[int, ...], dtype: torch.dtype, capacity: int
    ) -> torch.Tensor | None:
        """A batch tensor in a free segment of the ring, or in a new one while the ring has
        fewer than ``capacity``; ``None`` when every one is held."""
        if self._unsent:
            self._put_back_unsent()
        ring = self._rings.setdefault((shape, dtype), [])
        for slot in ring:
            # The training process let go of it (FREE) and nothing here refers to it.
            if slot.flag.value == FREE and is_free(slot.whole):
                slot.flag.value = HELD
                self._taken.append(slot)
                return slot.batch(shape, dtype)
        if len(ring) >= capacity:
            return None
        slot = _Slot.new(math.prod(shape) * dtype.itemsize)
        ring.append(slot)
        self._taken.append(slot)
        if len(self._rings) > MAX_SHAPES:
            del self._rings[next(iter(self._rings))]
        return slot.batch(shape, dtype)

    def settle(self) -> None:
        """Put back the segments taken since the last call that nothing refers to: called
        while the batch about to be sent is still referenced, these are the ones it does not
        hold (samples dropped under ``on_error``): they never leave the worker."""
        for slot in self._taken:
            if is_free(slot.whole):
                slot.flag.value = FREE
        self._taken.clear()

    def abandon(self) -> None:
        """The batch the segments taken since the last :meth:`settle` were for failed (its
        dataset raised): none of them leaves the worker. Each goes back to the ring once
        nothing here refers to it any more (the exception's traceback may, until the worker
        has reported it), checked when a segment is next taken."""
        self._unsent.extend(self._taken)
        self._taken.clear()
        self._put_back_unsent()

    def _put_back_unsent(self) -> None:
        still_referenced = []
        for slot in self._unsent:
            if is_free(slot.whole):
                slot.flag.value = FREE
            else:
                still_referenced.append(slot)
        self._unsent = still_referenced


@dataclass
class _Arrived:
    whole: torch.Tensor  # the loader's own tensor over the segment: keeps it mapped
    flag: ctypes.c_uint8
    held: bool
    # torch's record of the mapping when it arrived (key, entry): sending the memory on to
    # another process replaces the entry
    sharing: tuple[Any, Any] | None


class SlotReleaser:
    """In the training process: the worker segments that batches arrived in, each set
    ``FREE`` once nothing refers to it.

    Args:
        limit: Segments kept mapped at most (beyond it the oldest free ones are dropped:
            a worker that sends one again has it mapped anew).
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._slots: dict[int, _Arrived] = {}
        self.arrivals = 0  # batch tensors that came in a worker's segment
        self.reuses = 0  # of those, in a segment that came before (the worker reused it)
        self.passed_on = 0  # segments sent on to another process: never freed

    def arrived(self, data: Any) -> None:
        """Note the worker segments the batch ``data`` (as the worker sent it) lies in."""
        for tensor in _tensors(data):
            storage = tensor.untyped_storage()
            address = _trailer(storage)
            if address is None:
                continue
            token = int.from_bytes(ctypes.string_at(address + _TOKEN_AT, 8), "little")
            known = self._slots.pop(token, None)
            self.arrivals += 1
            if known is not None and known.whole.data_ptr() == storage.data_ptr():
                self.reuses += 1
                known.held = True
                self._slots[token] = known  # to the end: the most recent
                continue
            whole = torch.empty(0, dtype=torch.uint8).set_(storage)
            flag = ctypes.c_uint8.from_address(address + _FLAG_AT)
            self._slots[token] = _Arrived(whole, flag, True, _sharing_entry(storage))
        if len(self._slots) > self._limit:
            self._drop_oldest_free()

    def release(self) -> None:
        """Set ``FREE`` every held segment nothing here refers to any more and that was not
        sent on to another process (whose readers are out of sight: that one is dropped
        from here and stays ``HELD``; its worker never writes it again)."""
        for token, slot in list(self._slots.items()):
            if not slot.held or not is_free(slot.whole):
                continue
            if slot.sharing is None or shared_cache.get(slot.sharing[0]) is not slot.sharing[1]:
                del self._slots[token]
                self.passed_on += 1
                continue
            slot.held = False
            slot.flag.value = FREE

    def _drop_oldest_free(self) -> None:
        for token in [t for t, slot in self._slots.items() if not slot.held]:
            if len(self._slots) <= self._limit:
                return
            del self._slots[token]


def _sharing_entry(storage: torch.UntypedStorage) -> tuple[Any, Any] | None:
    """torch's record of ``storage``'s mapping, made when it was received (the
    ``shared_cache`` of ``torch.multiprocessing``, keyed by file or handle), or ``None``.

    Sending the memory on (pickled for another process) records it anew: a new entry.
    """
    for key, entry in list(shared_cache.items()):
        if entry.cdata == storage._cdata:
            return key, entry
    return None


def _tensors(data: Any) -> Iterator[torch.Tensor]:
    """The CPU tensors of a batch: itself, or the values of a tuple, list or dict."""
    if isinstance(data, torch.Tensor):
        values: Any = (data,)
    elif isinstance(data, tuple | list):
        values = data
    elif isinstance(data, dict):
        values = data.values()
    else:
        return
    for value in values:
        if isinstance(value, torch.Tensor) and value.device.type == "cpu":
            yield value
