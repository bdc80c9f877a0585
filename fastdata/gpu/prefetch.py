"""Move batches to the device one step ahead of the consumer, on a side CUDA stream.

Stream semantics (CUDA): batch ``i + 1`` is copied (``non_blocking`` from pinned host
memory) and transformed on the prefetcher's side stream while the consumer works on batch
``i`` on its own (current) stream. Before a batch is handed out, the consumer's stream is
made to wait for the event recorded after that batch's copy and transform, so the consumer
never reads a half-copied batch, yet does not wait for later batches. Every handed-out
tensor is ``record_stream``-ed on the consumer's stream, so the caching allocator does not
reuse its memory for a later batch until the consumer's queued work on it is done. Each
copy first waits for work already queued on the consumer's stream (e.g. moving the
transform's buffers to the device). Host batches stay referenced until their copy is done.

Memory stays bounded: ``record_stream`` defers reuse of a batch's memory until the
consumer's queued work is done, so a host running far ahead of the GPU would pile up
batches. Asking for batch ``i`` therefore marks the consumer's stream, and the host waits
for the mark of batch ``i - MAX_STEPS_AHEAD`` before going on: the host stays at most that
many steps ahead of the GPU, which is plenty to keep it busy.
"""

from __future__ import annotations

import os
import weakref
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sized
from typing import Any

import torch

from fastdata.gpu._batch import (
    Batch,
    FieldKey,
    check_fields,
    fields_of,
    iter_tensors,
    map_fields,
    map_tensors,
)

MAX_STEPS_AHEAD = 3

Transform = Callable[[Any], Any] | Mapping[FieldKey, Callable[[Any], Any]]


def resolve_device(device: str | int | torch.device) -> torch.device:
    """``device`` as a ``torch.device``; a bare ``"cuda"`` gets an index (see below).

    A bare ``"cuda"`` is the current CUDA device, except under ``torchrun`` (``LOCAL_RANK``
    set) with several GPUs visible, where it is ``cuda:LOCAL_RANK``: an object built before
    ``torch.cuda.set_device(local_rank)`` would otherwise put every rank on GPU 0. When the
    current device was set to another GPU than ``LOCAL_RANK`` (neither 0 nor the local
    rank), the choice is ambiguous and refused: pass the device explicitly.

    Raises:
        TypeError: ``device`` is not a string, int or ``torch.device``.
        ValueError: A CUDA device is asked for and CUDA is not available, or a bare
            ``"cuda"`` is ambiguous under ``torchrun``.
    """
    if isinstance(device, bool) or not isinstance(device, (str, int, torch.device)):
        raise TypeError(f"device must be a str, int or torch.device, got {device!r}")
    resolved = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device={device!r} needs CUDA, which is not available here")
        if resolved.index is None:
            resolved = torch.device("cuda", _default_cuda_index())
    return resolved


def _default_cuda_index() -> int:
    """The index a bare ``"cuda"`` means (see :func:`resolve_device`)."""
    current = torch.cuda.current_device()
    local_rank = os.environ.get("LOCAL_RANK", "")
    count = torch.cuda.device_count()
    if not local_rank.isdigit() or count < 2 or int(local_rank) >= count:
        return current  # not torchrun, or one GPU visible per rank (CUDA_VISIBLE_DEVICES)
    rank = int(local_rank)
    if current in (0, rank):
        return rank
    raise ValueError(
        f"device='cuda' is ambiguous: LOCAL_RANK={rank} but the current CUDA device is "
        f"{current}; pass device=torch.device('cuda', index) explicitly"
    )


class DevicePrefetcher:
    """Wrap an iterable of batches so each arrives on ``device``, the next already in flight.

    Batches are tensors, or tuples, lists and dicts of them (nested; other leaves pass
    through). On CUDA, host tensors are pinned if they are not already (prefer
    ``DataLoader(pin_memory=True)``, which pins in a background thread), copied with
    ``non_blocking=True`` on one side stream per prefetcher, and ``transform`` runs on that
    stream too; see the module docstring for the stream semantics. On other devices the
    same one-ahead logic runs without streams.

    Iterating again starts a new pass over ``loader`` and drops the previous pass's
    in-flight batch; breaking out of a loop early leaks nothing. Over a loader with
    ``hold_back`` (a :class:`~fastdata.datasets.ResumableDataLoader`), the batch in flight
    is left out of the loader's ``state_dict()``: a checkpoint resumes with it.

    Args:
        loader: Any iterable of batches, typically a ``torch.utils.data.DataLoader``.
        device: Target device, e.g. ``"cuda"``, ``"cuda:1"``, ``local_rank`` (an int means
            that CUDA device, as under DDP) or ``"cpu"``.
        transform: Applied on the device (under ``torch.no_grad()``) after the copy: a
            callable taking the whole batch, or a mapping from a top-level field (dict key
            or tuple/list position) to the callable for that field, e.g.
            ``{0: Normalize(...), 1: MaskToLong()}``.
        pin_memory: Pin host tensors that are not pinned before copying (CUDA only).
        host_fields: Top-level fields left on the host untouched, e.g. lists of encoded
            JPEG bytes meant for ``torchvision.io.decode_jpeg(..., device="cuda")``, which
            wants them on the host. Lists of tensors in other fields are copied element-wise.

    Raises:
        TypeError: ``loader`` is not iterable, ``transform`` is neither callable nor a
            mapping of callables, or ``device`` has a wrong type.
        ValueError: A CUDA device is asked for and CUDA is not available.
    """

    def __init__(
        self,
        loader: Iterable[Batch],
        device: str | int | torch.device,
        *,
        transform: Transform | None = None,
        pin_memory: bool = True,
        host_fields: Collection[FieldKey] = (),
    ) -> None:
        if not isinstance(loader, Iterable):
            raise TypeError(f"loader must be an iterable of batches, got {type(loader).__name__}")
        if transform is not None and not callable(transform):
            if not isinstance(transform, Mapping):
                raise TypeError(
                    "transform must be a callable or a mapping from field to callable, "
                    f"got {type(transform).__name__}"
                )
            bad = {key: fn for key, fn in transform.items() if not callable(fn)}
            if bad:
                raise TypeError(f"transform maps field(s) to non-callables: {bad!r}")
        self.loader = loader
        self.device = resolve_device(device)
        self.transform = transform
        self.pin_memory = bool(pin_memory)
        self.host_fields = frozenset(host_fields)
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._active: weakref.ReferenceType[_PrefetchIterator] | None = None

    def __len__(self) -> int:
        """The number of batches per pass: ``len(loader)``.

        Raises:
            TypeError: ``loader`` has no length (e.g. an iterable-style dataset's loader).
        """
        if not isinstance(self.loader, Sized):
            raise TypeError(f"loader of type {type(self.loader).__name__} has no len()")
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        # Pass through what training code reads from a DataLoader (dataset, sampler, ...).
        if name in ("loader", "__setstate__") or name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def set_epoch(self, epoch: int) -> None:
        """Call ``set_epoch(epoch)`` on the loader, its sampler(s) and dataset, and on the
        transform's modules, where they have it.

        ``DistributedSampler`` needs this every epoch for a new shuffle order under DDP;
        seeded device augmentations restart their draws from ``(seed, epoch)``.
        """
        owners: list[object] = [self.loader]
        for name in ("sampler", "batch_sampler", "dataset"):
            owners.append(getattr(self.loader, name, None))
        owners.append(getattr(getattr(self.loader, "batch_sampler", None), "sampler", None))
        transforms = (
            self.transform.values() if isinstance(self.transform, Mapping) else [self.transform]
        )
        for transform in transforms:
            modules = transform.modules() if isinstance(transform, torch.nn.Module) else []
            owners.extend(modules)
        seen: set[int] = set()
        for owner in owners:
            method = getattr(owner, "set_epoch", None)
            if owner is not None and callable(method) and id(owner) not in seen:
                seen.add(id(owner))
                method(epoch)

    def __iter__(self) -> Iterator[Batch]:
        previous = self._active() if self._active is not None else None
        if previous is not None:
            previous.close()
        source = iter(self.loader)
        taken = [0]  # batches taken from the loader and not handed out yet
        hold_back = getattr(self.loader, "hold_back", None)
        if callable(hold_back):  # a resumable loader: they are not consumed yet
            hold_back(lambda: taken[0])
        iterator = _PrefetchIterator(self, source, taken)
        self._active = weakref.ref(iterator)
        return iterator

    def _move(self, tensor: torch.Tensor) -> torch.Tensor:
        if self._stream is not None and tensor.device.type == "cpu":
            if self.pin_memory and not tensor.is_pinned():
                tensor = tensor.pin_memory()
            return tensor.to(self.device, non_blocking=True)
        return tensor.to(self.device)

    def _transfer(self, batch: Batch) -> Batch:
        """Copy ``batch`` (except ``host_fields``) to the device and apply the transform."""
        if self.host_fields:
            check_fields(batch, self.host_fields, "host_fields")
            keys = [key for key in fields_of(batch) if key not in self.host_fields]
            moved = map_fields(batch, lambda _key, value: map_tensors(value, self._move), keys)
        else:
            moved = map_tensors(batch, self._move)
        if self.transform is None:
            return moved
        with torch.no_grad():
            if isinstance(self.transform, Mapping):
                fns = self.transform
                check_fields(moved, fns.keys(), "transform")
                return map_fields(moved, lambda key, value: fns[key](value), fns.keys())
            return self.transform(moved)

    def _start(self, host_batch: Batch) -> _Pending:
        if self._stream is None:
            return _Pending(self._transfer(host_batch), None, None)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._stream):
            device_batch = self._transfer(host_batch)
            done = torch.cuda.Event()
            done.record(self._stream)
        return _Pending(device_batch, done, host_batch)

    def _mark_consumer(self) -> torch.cuda.Event | None:
        """An event on the consumer's stream after all the work it has queued so far."""
        if self._stream is None:
            return None
        mark = torch.cuda.Event()
        mark.record(torch.cuda.current_stream(self.device))
        return mark

    def _finish(self, pending: _Pending) -> Batch:
        if pending.done is None:
            return pending.device_batch
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(pending.done)
        for tensor in iter_tensors(pending.device_batch):
            if tensor.device.type == "cuda":
                tensor.record_stream(consumer)
        return pending.device_batch


class _Pending:
    """One batch in flight: its device tensors, the event after its copy, its host tensors."""

    __slots__ = ("device_batch", "done", "host_batch")

    def __init__(self, device_batch: Batch, done: torch.cuda.Event | None, host_batch: Batch):
        self.device_batch = device_batch
        self.done = done
        self.host_batch = host_batch


class _PrefetchIterator:
    """One pass over the loader; holds at most one batch in flight."""

    def __init__(self, owner: DevicePrefetcher, source: Iterator[Batch], taken: list[int]) -> None:
        self._owner: DevicePrefetcher | None = owner
        self._source: Iterator[Batch] | None = source
        self._taken = taken  # [batches taken from source and not handed out]
        self._pending: _Pending | None = None
        # An error raised while preparing the next batch: raised by the next __next__, after
        # the batch already prepared has been handed out.
        self._error: BaseException | None = None
        # Host batches whose copy may still be running: kept alive until its event is done.
        self._copying: list[_Pending] = []
        # Consumer-stream marks of the last hand-outs (CUDA): bound how far the host runs ahead.
        self._marks: deque[torch.cuda.Event] = deque()
        self._advance()

    def __iter__(self) -> _PrefetchIterator:
        return self

    def _advance(self) -> None:
        """Start the next batch; an error doing so is kept for the next ``__next__``."""
        if self._source is None or self._owner is None:
            return
        try:
            host_batch = next(self._source)
            self._taken[0] += 1
            self._pending = self._owner._start(host_batch)
        except StopIteration:
            self._source = None
        except Exception as error:
            self._source = None
            self._error = error

    def __next__(self) -> Batch:
        current, self._pending = self._pending, None
        if current is None or self._owner is None:
            error, self._error = self._error, None
            self.close()
            if error is not None:
                raise error
            raise StopIteration
        mark = self._owner._mark_consumer()
        if mark is not None:
            self._marks.append(mark)
            if len(self._marks) > MAX_STEPS_AHEAD:
                self._marks.popleft().synchronize()
        batch = self._owner._finish(current)
        self._copying = [p for p in self._copying if p.done is not None and not p.done.query()]
        if current.done is not None:
            current.device_batch = None
            self._copying.append(current)
        self._taken[0] -= 1
        self._advance()
        return batch

    def __del__(self) -> None:
        # An early `break` drops the iterator: release its batches as `close()` does.
        self.close()

    def close(self) -> None:
        """Drop the in-flight batch and the loader's iterator (stops its workers)."""
        owner, self._owner = self._owner, None
        in_flight = self._pending is not None or bool(self._copying)
        if owner is not None and owner._stream is not None and in_flight:
            # Copies still running must finish before their host memory can be released.
            owner._stream.synchronize()
        self._pending = None
        self._copying = []
        self._marks.clear()
        self._source = None


def to_device(
    loader: Iterable[Batch],
    device: str | int | torch.device,
    transform: Transform | None = None,
    **options: Any,
) -> DevicePrefetcher:
    """One line: ``for images, labels in to_device(loader, "cuda", {0: Normalize(...)})``.

    Same as ``DevicePrefetcher(loader, device, transform=transform, **options)``.
    """
    return DevicePrefetcher(loader, device, transform=transform, **options)
