"""``ResumableDataLoader``: a ``DataLoader`` whose ``state_dict()`` is exact with workers."""

from __future__ import annotations

import logging
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from fastdata.datasets._collate import passthrough_collate
from fastdata.datasets._positions import Ranges, consumed_ranges
from fastdata.datasets._slots import MAX_SHAPES, SlotReleaser
from fastdata.datasets.distributed import ShardAwareDistributedSampler

if TYPE_CHECKING:
    from fastdata.datasets._batch_decode import BatchDecode

logger = logging.getLogger(__name__)

_RECENT = 64  # handed-out batches a wrapper may hold back from the state (read-ahead)


class ResumableDataLoader(DataLoader):
    """A standard ``DataLoader`` that records the batches the loop took, for a mid-epoch resume.

    Worker processes prefetch batches ahead of the training loop, so a sampler cannot tell
    how far the loop got. This loader records which batches it handed to the loop (and so
    which positions of the sampler's order they hold): its ``state_dict()`` (and the
    sampler's, while this loader iterates it) names exactly the samples consumed, and after
    ``load_state_dict()`` the next iteration yields exactly the others, in the epoch's
    order, whatever ``num_workers``, ``prefetch_factor``, ``persistent_workers``,
    ``pin_memory``, ``drop_last`` and ``in_order`` (batches handed out of order are
    recorded as such); ``batch_size`` may differ in the resumed run. A state taken after
    ``sampler.set_epoch(e)`` and before the first batch of epoch ``e`` holds nothing of
    ``e``: the resumed epoch is whole. Lightning saves and restores it like torchdata's
    ``StatefulDataLoader`` (it has ``state_dict`` / ``load_state_dict``).

    Worker memory: each worker sends its batches in a small ring of shared-memory segments
    per batch shape (``prefetch_factor`` + 2), filled again only once this process holds
    nothing of one (no batch, view, NumPy array or storage object of it) and has not sent
    it on to another process (a ``torch.multiprocessing`` queue); when none is free, in
    fresh shared memory as a plain ``DataLoader`` does, so keeping batches is always safe.
    Not with ``pin_memory=True`` (the loop gets pinned copies).

    It takes every ``DataLoader`` argument; ``collate_fn`` defaults to
    :func:`passthrough_collate` (fastdata datasets return whole batches). The exact resume
    needs a :class:`ShardAwareDistributedSampler` (``sampler=``, or inside a
    ``batch_sampler`` that takes its indices in order, as ``BatchSampler`` does; one that
    reorders them across batches makes ``state_dict()`` raise); with any other sampler a
    loaded state restarts the epoch from its beginning, with a warning. It claims that
    sampler: with several processes, another loader built around it cannot iterate it.

    Epochs: each batch of indices it hands the dataset carries the epoch it belongs to
    (``EpochBatch``), in every worker process, persistent or not; a seeded fastdata
    batch transform then draws per sample from ``(seed, epoch, index)``. The epoch is the
    sampler's ``epoch`` when it has one (``DistributedSampler``,
    :class:`ShardAwareDistributedSampler`: ``set_epoch``), else the one given to
    :meth:`set_epoch`, else it counts this loader's iterations from 0.

    Example:
        >>> sampler = ShardAwareDistributedSampler(ds)                      # doctest: +SKIP
        >>> loader = ds.loader(batch_size=64, sampler=sampler, num_workers=4)
        >>> checkpoint["loader"] = loader.state_dict()      # mid-epoch, exact
        >>> loader.load_state_dict(checkpoint["loader"])    # in the resumed run
    """

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        if len(args) < 6 and kwargs.get("collate_fn") is None:  # collate_fn: 7th positional
            kwargs["collate_fn"] = passthrough_collate
        super().__init__(dataset, *args, **kwargs)
        self._pass: _Pass | None = None  # the current iteration's record
        self._epoch: int | None = None  # the epoch of the current (or last) iteration
        self._given_epoch: int | None = None  # set_epoch's, for the next iteration
        # The dataset's decoder, run here on each batch the dataset read encoded.
        self._batch_decode: BatchDecode | None = None
        sampler = self._shard_sampler()
        if sampler is not None:
            sampler._claim()  # iterations of it that this loader did not start are refused

    def _decode_batches(self, batch_decode: BatchDecode) -> None:
        """Have the dataset return its images encoded (the batches of indices say so) and
        decode each batch here, after the workers, with ``batch_decode``."""
        self._batch_decode = batch_decode

    def _shard_sampler(self) -> ShardAwareDistributedSampler | None:
        for candidate in (self.sampler, getattr(self.batch_sampler, "sampler", None)):
            if isinstance(candidate, ShardAwareDistributedSampler):
                return candidate
        return None

    @property
    def epoch(self) -> int | None:
        """The epoch of the current iteration (of the last one once it ended; ``None``
        before the first): the one its batches of indices carry."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next iteration (passed on to the sampler's ``set_epoch``).

        Raises:
            TypeError: ``epoch`` is not an int.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise TypeError(f"epoch must be an int, got {epoch!r}")
        self._given_epoch = epoch
        for owner in {id(o): o for o in self._samplers()}.values():
            method = getattr(owner, "set_epoch", None)
            if callable(method):
                method(epoch)

    def _samplers(self) -> list[Any]:
        batch_sampler = self.batch_sampler
        return [self.sampler, getattr(batch_sampler, "sampler", None), batch_sampler]

    def _next_epoch(self) -> int:
        """The epoch the iteration starting now belongs to."""
        for owner in self._samplers():
            epoch = getattr(owner, "epoch", None)
            if isinstance(epoch, int) and not isinstance(epoch, bool):
                return epoch
        if self._given_epoch is not None:
            return self._given_epoch
        return 0 if self._epoch is None else self._epoch + 1

    @property
    def _index_sampler(self) -> Any:
        # What the iterator draws batches of indices from: each batch tagged with its
        # epoch, and recorded, to know which positions of the sampler's order it holds.
        inner = super()._index_sampler
        if self._auto_collation:
            inner = _EpochBatches(inner, self)
        return _RecordedBatches(inner, self)

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        if not getattr(self, "in_order", True):
            return _OutOfOrderIterator(self)
        return _SlotIterator(self)

    def _worker_slot_count(self) -> int:
        """Shared-memory segments per batch shape each worker may keep and reuse (0: none).

        Enough for the batches a worker has queued (``prefetch_factor``), the one the loop
        holds and the one it just let go of. Not with ``pin_memory``: the pinned copy is
        what the loop gets, and the worker's batch is dropped before this loader sees it.
        """
        if self.num_workers == 0 or self.pin_memory:
            return 0
        return (self.prefetch_factor or 2) + 2

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._epoch = self._next_epoch()
        self._given_epoch = None
        sampler = self._shard_sampler()
        record = _Pass(sampler)
        self._pass = record
        if sampler is not None:
            sampler._attach(self, record.consumed)
            sampler._start_read_ahead()  # downloads start before the workers do
        handing = _Handing(super().__iter__(), record)
        if self._batch_decode is None:
            return handing
        # Decoded here, the next batch possibly scheduled on the decoder before this one is
        # handed out: a batch read and not handed out yet is not consumed.
        decoded = self._batch_decode.stream(handing, self.last_batch_indices, self._epoch)
        record.held_back = decoded.read_ahead_count()
        return _Decoding(handing, decoded)

    def hold_back(self, count: Callable[[], int] | None) -> None:
        """Leave the last ``count()`` batches handed out out of the state, until the next
        iteration starts (``None``: none).

        For a wrapper that reads batches ahead of the loop (e.g. decodes the next batch
        while the loop uses this one, as :class:`~fastdata.decode.DecodingLoader` does): the
        batches it holds are not consumed yet, so a state taken meanwhile (by this loader or
        by its sampler) resumes with them. Call it after ``iter(loader)``.
        """
        if self._pass is not None:
            self._pass.held_back = count

    def last_batch_indices(self) -> list[int] | None:
        """The dataset indices the current iteration's last batch handed out was read
        from, in the order they were asked of the dataset (which may leave out samples it
        cannot read, under its ``on_error``); ``None`` before the first batch, or when they
        are not known (an iterable dataset).

        For a wrapper that reports on samples by batch position (e.g.
        :class:`~fastdata.decode.DecodingLoader` naming ``dataset[i]`` in a decode error).
        """
        return list(self._pass.last_indices) if self._pass and self._pass.last_indices else None

    def state_dict(self) -> dict[str, Any]:
        """Where the loop is in the epoch: the sampler's state with the exact consumed samples.

        Returns:
            ``{"sampler": ShardAwareDistributedSampler.state_dict() or None,
            "num_batches": batches the loop took in this iteration of the epoch,
            "epoch": the epoch of this iteration (None before the first)}``.

        Raises:
            ValueError: A ``batch_sampler`` reordered the sampler's indices across batches,
                so the samples behind the batches taken are unknown.
        """
        sampler = self._shard_sampler()
        record = self._pass
        epoch = {"epoch": self._epoch}
        if sampler is None:
            taken = record.taken() if record is not None else 0
            return {"sampler": None, "num_batches": taken, **epoch}
        if record is None or not sampler._attached_to(self):
            # not iterating the sampler's current epoch (set_epoch, load_state_dict since)
            return {"sampler": sampler.state_dict(), "num_batches": 0, **epoch}
        consumed = sampler._state(record.consumed())
        return {"sampler": consumed, "num_batches": record.taken(), **epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields the batches of the epoch not yet taken.

        Raises:
            TypeError: ``state`` is not a mapping from :meth:`state_dict`, or a value has
                the wrong type.
            ValueError: The sampler refuses it (saved with other settings, counts out of
                range).
        """
        if not isinstance(state, Mapping) or "sampler" not in state:
            raise TypeError(
                "state must be the mapping ResumableDataLoader.state_dict() returned, got "
                f"{type(state).__name__}"
            )
        taken = state.get("num_batches", 0)
        if isinstance(taken, bool) or not isinstance(taken, int | np.integer):
            raise TypeError(f"num_batches must be an int, got {taken!r} ({type(taken).__name__})")
        if taken < 0:
            raise ValueError(f"num_batches must be >= 0, got {taken}")
        saved = state["sampler"]
        if saved is not None and not isinstance(saved, Mapping):
            raise TypeError(f"state['sampler'] must be a mapping or None, got {saved!r}")
        epoch = state.get("epoch")
        if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int)):
            raise TypeError(f"epoch must be an int or None, got {epoch!r}")
        if epoch is not None:
            self._given_epoch = epoch  # the resumed iteration's epoch
        sampler = self._shard_sampler()
        if saved is None or sampler is None:
            if taken:
                logger.warning(
                    "ResumableDataLoader: no ShardAwareDistributedSampler state to resume "
                    "from; the epoch restarts from its beginning"
                )
            return
        sampler.load_state_dict(saved)
        self._pass = None


class _Pass:
    """One iteration of a loader: the batches drawn from its sampler and those handed out.

    Batch ``k`` of the iteration is the ``k``-th list of indices the batch sampler made;
    it holds the positions ``[ends[k-1], ends[k])`` of the iteration's stream (the epoch's
    positions not consumed before it).
    """

    def __init__(self, sampler: ShardAwareDistributedSampler | None) -> None:
        self.sampler = sampler
        self.done: Ranges = sampler._pending_resume() if sampler is not None else []
        self.num_positions = sampler.num_samples if sampler is not None else 0
        self.stream: np.ndarray | None = None  # the indices the sampler yields, in order
        self.ends: list[int] = []  # stream offset after each batch drawn
        self.count = 0  # batches handed out
        self.head = 0  # batches 0 .. head-1 all handed out
        self.ahead: set[int] = set()  # batches past the head handed out (out of order)
        self.recent: deque[int] = deque(maxlen=_RECENT)  # numbers of the last handed out
        self.problem: str | None = None  # why the consumed samples are unknown
        self.held_back: Callable[[], int] | None = None  # batches a wrapper has not used yet
        self.drawn = 0  # batches drawn
        self.in_flight: dict[int, list[int] | None] = {}  # their indices, until handed out
        self.last_indices: list[int] | None = None  # of the batch handed out last

    def drew(self, batch: Any) -> None:
        """The batch sampler made ``batch`` (indices, or one index without batching)."""
        indices = np.asarray(batch).reshape(-1)
        known = indices.dtype.kind in "iu"  # an iterable dataset's "indices" are None
        self.in_flight[self.drawn] = indices.tolist() if known else None
        self.drawn += 1
        if self.sampler is None:
            return
        begin = self.ends[-1] if self.ends else 0
        self.ends.append(begin + len(indices))
        if self.problem is not None:
            return
        if self.stream is None:  # what the sampler yields in this iteration, once it began
            self.stream = self.sampler._stream
        stream = self.stream if self.stream is not None else np.empty(0, np.int64)
        expected = stream[begin : begin + len(indices)]
        if not np.array_equal(np.sort(indices), np.sort(expected)):
            self.problem = (
                f"batch {len(self.ends) - 1} does not hold the sampler's next "
                f"{len(indices)} indices (a batch_sampler that reorders them across batches)"
            )

    def handed_out(self, number: int | None) -> None:
        """Batch ``number`` went to the loop (``None``: the next one in order; -1: unknown)."""
        if number is None:
            number = self.count
        elif number < 0:
            self.problem = "the loader could not tell which batch it handed out"
        self.last_indices = self.in_flight.pop(number, None)
        self.count += 1
        self.recent.append(number)
        self.ahead.add(number)
        while self.head in self.ahead:
            self.ahead.remove(self.head)
            self.head += 1

    def unfinished(self) -> int:
        """The last batches handed out that a wrapper holds back (read ahead, not used)."""
        count = self.held_back() if self.held_back is not None else 0
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= self.count:
            raise ValueError(f"hold_back: count() must be in [0, {self.count}], got {count!r}")
        if count > len(self.recent):
            raise ValueError(f"hold_back: at most {_RECENT} batches can be held back, got {count}")
        return count

    def taken(self) -> int:
        """Batches handed out and used."""
        return self.count - self.unfinished()

    def consumed(self) -> Ranges:
        """The positions of the epoch consumed: those before this iteration and those of
        the batches handed out, less the ones held back."""
        if self.problem is not None:
            raise ValueError(f"the loader's state is unknown: {self.problem}")
        unfinished = self.unfinished()
        held = set(list(self.recent)[len(self.recent) - unfinished :])
        runs: list[tuple[int, int]] = []  # runs of batch numbers taken, first and last
        begin = 0
        for number in sorted(n for n in held if n < self.head):
            if number > begin:
                runs.append((begin, number - 1))
            begin = number + 1
        if self.head > begin:
            runs.append((begin, self.head - 1))
        for number in sorted(self.ahead - held):
            if runs and runs[-1][1] == number - 1:
                runs[-1] = (runs[-1][0], number)
            else:
                runs.append((number, number))
        taken = [self._span(first, last) for first, last in runs]
        return consumed_ranges(self.num_positions, self.done, taken)

    def _span(self, first: int, last: int) -> tuple[int, int]:
        """Stream offsets of batches ``first`` .. ``last``."""
        return (self.ends[first - 1] if first else 0, self.ends[last])


class EpochBatch(list[int]):
    """A batch of dataset indices (a ``list``) that says which epoch it belongs to.

    :class:`ResumableDataLoader` hands these to ``dataset.__getitems__`` (through the
    worker processes' index queues: it pickles with its epoch). ``encoded``: the dataset
    returns its images encoded, for the loader to decode (a dataset whose ``decode=``
    decoder runs in the training process). ``worker_slots`` > 0 lets a fastdata dataset in
    a worker send the batch in a ring of that many shared-memory segments, which the
    loader's iterator marks free again in the training process.
    """

    def __init__(
        self, indices: Iterable[int], epoch: int, encoded: bool = False, worker_slots: int = 0
    ) -> None:
        super().__init__(indices)
        self.epoch = epoch
        self.encoded = encoded
        self.worker_slots = worker_slots

    def __reduce__(self) -> tuple[Any, ...]:
        return (EpochBatch, (list(self), self.epoch, self.encoded, self.worker_slots))


class _EpochBatches:
    """The loader's batch sampler, each batch tagged with the loader's current epoch."""

    def __init__(self, batches: Iterable[Any], owner: ResumableDataLoader) -> None:
        self._batches = batches
        self._owner = weakref.ref(owner)  # weak, as _RecordedBatches's owner

    def __iter__(self) -> Iterator[EpochBatch]:
        owner = self._owner()
        epoch = owner._epoch if owner is not None and owner._epoch is not None else 0
        encoded = owner is not None and owner._batch_decode is not None
        slots = owner._worker_slot_count() if owner is not None else 0
        return (EpochBatch(batch, epoch, encoded, slots) for batch in self._batches)

    def __len__(self) -> int:
        return len(self._batches)  # type: ignore[arg-type]


class _RecordedBatches:
    """The loader's index sampler, telling the current iteration's record what it draws."""

    def __init__(self, inner: Iterable[Any], owner: ResumableDataLoader) -> None:
        self.inner = inner
        # weak: a persistent iterator holds this, and the loader holds the iterator (a
        # cycle would leave the workers to the garbage collector, which stops them slowly)
        self.owner = weakref.ref(owner)

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]

    def _record(self) -> _Pass | None:
        owner = self.owner()
        return owner._pass if owner is not None else None

    def __iter__(self) -> Iterator[Any]:
        record = self._record()  # not the loader: this generator lives in its iterator
        for batch in self.inner:
            if record is not None:
                record.drew(batch)
            yield batch


class _SlotIterator(_MultiProcessingDataLoaderIter):
    """The worker iterator, marking free the workers' batch segments nothing refers to
    any more, before it waits for the next batch (see :mod:`fastdata.datasets._slots`)."""

    def __init__(self, loader: ResumableDataLoader) -> None:
        limit = loader.num_workers * loader._worker_slot_count() * MAX_SHAPES  # what they hold
        self._slots = SlotReleaser(limit)
        super().__init__(loader)

    def _next_data(self) -> Any:
        self._slots.release()
        return super()._next_data()

    def _get_data(self) -> Any:
        # Every batch a worker sends comes through here: those handed out, those kept for
        # their turn, those drained when a persistent iterator restarts.
        received = super()._get_data()
        self._slots.arrived(received[1])
        return received


class _OutOfOrderIterator(_SlotIterator):
    """The worker iterator of ``in_order=False``, telling which batch each result was.

    ``_task_info`` holds the batches sent and not yet handed out; the one a call hands out
    is the one that leaves it (-1 when that cannot be told: the state then refuses).
    """

    last_handed_out = -1

    def _next_data(self) -> Any:
        pending = set(getattr(self, "_task_info", {}))
        data = super()._next_data()
        left = pending.difference(getattr(self, "_task_info", {}))
        self.last_handed_out = left.pop() if len(left) == 1 else -1
        return data


class _Handing(Iterator[Any]):
    """The DataLoader's iterator, recording the batches it hands out."""

    def __init__(self, inner: Iterator[Any], record: _Pass) -> None:
        self._inner = inner
        self._record = record

    def __next__(self) -> Any:
        batch = next(self._inner)
        number = getattr(self._inner, "last_handed_out", None)
        self._record.handed_out(number)
        return batch

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]


class _Decoding(Iterator[Any]):
    """The iterator of a loader that decodes its batches: ``decoded`` batches of the
    recording iterator ``handing``."""

    def __init__(self, handing: _Handing, decoded: Iterator[Any]) -> None:
        self._handing = handing
        self._decoded = decoded

    def __next__(self) -> Any:
        return next(self._decoded)

    def __len__(self) -> int:
        return len(self._handing)
