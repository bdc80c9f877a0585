"""``ResumableDataLoader``: a ``DataLoader`` whose ``state_dict()`` is exact with workers."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from torch.utils.data import DataLoader

from fastdata.datasets._collate import passthrough_collate
from fastdata.datasets.distributed import ShardAwareDistributedSampler

logger = logging.getLogger(__name__)


class ResumableDataLoader(DataLoader):
    """A standard ``DataLoader`` that counts the batches the loop took, for a mid-epoch resume.

    Worker processes prefetch batches ahead of the training loop, so a sampler cannot tell
    how far the loop got. This loader counts the batches it handed to the loop: its
    ``state_dict()`` (and the sampler's, while this loader iterates it) records exactly the
    samples consumed, whatever ``num_workers`` and ``prefetch_factor``. Lightning saves and
    restores it like torchdata's ``StatefulDataLoader`` (it has ``state_dict`` /
    ``load_state_dict``).

    It takes every ``DataLoader`` argument; ``collate_fn`` defaults to
    :func:`passthrough_collate` (fastdata datasets return whole batches). The exact resume
    needs a :class:`ShardAwareDistributedSampler` (``sampler=`` with ``batch_size``, or
    inside a ``batch_sampler`` with a ``batch_size`` attribute); with any other sampler a
    loaded state restarts the epoch from its beginning, with a warning. It claims that
    sampler: with several processes, another loader built around it cannot iterate it.

    Epochs: each batch of indices it hands the dataset carries the epoch it belongs to
    (:class:`EpochBatch`), in every worker process, persistent or not; a seeded fastdata
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
        self._start: int | None = None  # sampler offset when the current iteration began
        self._taken = 0  # batches handed to the loop in the current iteration
        self._epoch: int | None = None  # the epoch of the current (or last) iteration
        self._given_epoch: int | None = None  # set_epoch's, for the next iteration
        sampler = self._shard_sampler()
        if sampler is not None:
            sampler._claim()  # iterations of it that this loader did not start are refused

    def _shard_sampler(self) -> ShardAwareDistributedSampler | None:
        for candidate in (self.sampler, getattr(self.batch_sampler, "sampler", None)):
            if isinstance(candidate, ShardAwareDistributedSampler):
                return candidate
        return None

    def _batch_size(self) -> int | None:
        size = self.batch_size
        if size is None:
            size = getattr(self.batch_sampler, "batch_size", None)
        return size if isinstance(size, int) else None

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
        # What the DataLoader's iterator draws batches from: tag each with its epoch.
        index_sampler = super()._index_sampler
        if not self._auto_collation:
            return index_sampler
        return _EpochBatches(index_sampler, self)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._epoch = self._next_epoch()
        self._given_epoch = None
        sampler = self._shard_sampler()
        self._start = sampler._pending_offset() if sampler is not None else 0
        self._taken = 0
        if sampler is not None:
            counts = self._batch_size() is not None
            sampler._admit(self, self._consumed_samples if counts else None)
        return _Counting(super().__iter__(), self)

    def _consumed_samples(self) -> int | None:
        """Samples of the epoch the loop has taken (``None`` before the first iteration)."""
        sampler, size = self._shard_sampler(), self._batch_size()
        if self._start is None or sampler is None or size is None:
            return None
        return min(self._start + self._taken * size, sampler.num_samples)

    def state_dict(self) -> dict[str, Any]:
        """Where the loop is in the epoch: the sampler's state with the exact consumed count.

        Returns:
            ``{"sampler": ShardAwareDistributedSampler.state_dict() or None,
            "num_batches": batches taken in this iteration}``.
        """
        sampler = self._shard_sampler()
        state = None
        if sampler is not None:
            state = sampler.state_dict(num_consumed=self._consumed_samples())
        return {"sampler": state, "num_batches": self._taken, "epoch": self._epoch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields the batches of the epoch not yet taken.

        Raises:
            TypeError: ``state`` is not a mapping from :meth:`state_dict`.
            ValueError: The sampler refuses it (saved with other settings).
        """
        if not isinstance(state, Mapping) or "sampler" not in state:
            raise TypeError(
                "state must be the mapping ResumableDataLoader.state_dict() returned, got "
                f"{type(state).__name__}"
            )
        if isinstance(state.get("epoch"), int):
            self._given_epoch = state["epoch"]  # the resumed iteration's epoch
        sampler = self._shard_sampler()
        if state["sampler"] is None or sampler is None:
            if state.get("num_batches"):
                logger.warning(
                    "ResumableDataLoader: no ShardAwareDistributedSampler state to resume "
                    "from; the epoch restarts from its beginning"
                )
            return
        sampler.load_state_dict(state["sampler"])
        self._start = None
        self._taken = 0


class EpochBatch(list[int]):
    """A batch of dataset indices (a ``list``) that says which epoch it belongs to.

    :class:`ResumableDataLoader` hands these to ``dataset.__getitems__`` (through the
    worker processes' index queues: it pickles with its epoch).
    """

    def __init__(self, indices: Iterable[int], epoch: int) -> None:
        super().__init__(indices)
        self.epoch = epoch

    def __reduce__(self) -> tuple[Any, ...]:
        return (EpochBatch, (list(self), self.epoch))


class _EpochBatches:
    """The loader's batch sampler, each batch tagged with the loader's current epoch."""

    def __init__(self, batches: Any, loader: ResumableDataLoader) -> None:
        self._batches = batches
        self._loader = loader

    def __iter__(self) -> Iterator[EpochBatch]:
        epoch = self._loader._epoch or 0
        return (EpochBatch(batch, epoch) for batch in self._batches)

    def __len__(self) -> int:
        return len(self._batches)


class _Counting(Iterator[Any]):
    """The DataLoader's iterator, counting the batches it hands out."""

    def __init__(self, inner: Iterator[Any], owner: ResumableDataLoader) -> None:
        self._inner = inner
        self._owner = owner

    def __next__(self) -> Any:
        batch = next(self._inner)
        self._owner._taken += 1
        return batch

    def __len__(self) -> int:
        return len(self._inner)  # type: ignore[arg-type]
