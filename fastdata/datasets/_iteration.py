"""How a :class:`ShardAwareDistributedSampler` learns who iterates it and what the loop took.

The sampler never inspects its callers. Three explicit channels tell it what it needs:

- **The loader declares itself.** A :class:`~fastdata.datasets.ResumableDataLoader`
  (``dataset.loader(...)``) claims its sampler when it is built, and admits each of its own
  iterations just before starting it, handing over the exact count of samples the loop
  took. With ``num_replicas > 1``, an iteration of a claimed sampler that its loader did
  not admit is another loader built around the same sampler: a framework that rebuilds
  the DataLoader to split its batches between processes (``accelerator.prepare(loader)``)
  would shard it a second time, so it is refused, whatever that framework names its
  classes.
- **The caller says what was consumed**: ``state_dict(num_consumed=...)``.
- **The iterator's own state** (the ``state_dict`` / ``load_state_dict`` protocol of
  torchdata's ``StatefulDataLoader``, which snapshots the sampler's iterator each time it
  hands a batch out): :class:`EpochIterator` records how many samples it handed out, which
  at that moment is exactly what the loop will have consumed when that batch arrives.

Anything else (a plain ``DataLoader``, with or without worker processes, that prefetch
ahead of the loop) cannot say what the loop consumed: a ``state_dict()`` taken then
records the samples handed out, marked as such; such a state only loads together with
the iterator state that confirms it, and the sampler warns at its next step when none came.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping
from typing import Any, Protocol

import numpy as np


class IteratedSampler(Protocol):
    """What an :class:`EpochIterator` reads and moves of its sampler (a
    :class:`~fastdata.datasets.ShardAwareDistributedSampler`, which imports this module)."""

    dataset: Any
    epoch: int
    _unconfirmed_load: bool
    _yielded: int

    def _check_saved_position(self) -> None: ...

    def _confirm_saved_position(self) -> None: ...


# Marks a state whose ``num_consumed`` counts the samples handed out, not those consumed.
HANDED_OUT = "handed_out"


class EpochIterator(Iterator[int]):
    """One iteration over the sampler's indices of the current epoch.

    Yields ``indices`` (this rank's global indices of the epoch not consumed before). Its
    ``state_dict()`` / ``load_state_dict()`` record how many it handed out and confirm the
    sampler state saved and loaded with it, for loaders that snapshot the iterator as they
    hand each batch out (torchdata).
    """

    def __init__(
        self, sampler: IteratedSampler, indices: np.ndarray, started: Iterator[int] | None = None
    ) -> None:
        self._sampler = sampler
        self._source = indices
        # Made at the first step (after a load), or ``started`` (see StartedReadAhead). A
        # dataset in object storage downloads the shards of this order ahead of their use:
        # its read_ahead yields these indices.
        self._started = started
        self._indices: Iterator[int] | None = None
        self._position = 0  # indices handed out

    def __iter__(self) -> EpochIterator:
        return self

    def __next__(self) -> int:
        sampler = self._sampler
        if self._indices is None:
            if sampler._unconfirmed_load:
                raise ValueError(unreported_position_error())
            read_ahead = getattr(sampler.dataset, "read_ahead", None)
            if self._started is not None:
                self._indices, self._started = self._started, None
            elif read_ahead is None:
                self._indices = iter(self._source.tolist())
            else:
                self._indices = read_ahead(self._source)
        sampler._check_saved_position()
        if self._position >= len(self._source):
            raise StopIteration
        index = int(next(self._indices))
        self._position += 1
        sampler._yielded += 1
        return index

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "num_handed_out"}``, taken with the sampler's state as a batch is
        handed out: it confirms that the sampler's handed-out count is what was consumed."""
        self._sampler._confirm_saved_position()
        return {"epoch": self._sampler.epoch, "num_handed_out": self._position}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Confirm the sampler state loaded just before (the positions it skips).

        Raises:
            ValueError: ``state`` is not from :meth:`state_dict` of this epoch, or comes
                after this iterator's first step.
        """
        sampler = self._sampler
        count = state.get("num_handed_out") if isinstance(state, Mapping) else None
        if (
            isinstance(count, bool)
            or not isinstance(count, int)
            or count < 0
            or state.get("epoch") != sampler.epoch
        ):
            raise ValueError(
                f"state must be an EpochIterator.state_dict() of epoch {sampler.epoch}, got "
                f"{state!r}"
            )
        if self._indices is not None:
            raise ValueError("load_state_dict() must come before the iterator's first step")
        sampler._unconfirmed_load = False


class StartedReadAhead:
    """An epoch's read-ahead started before its iteration (by ``set_epoch``,
    ``load_state_dict`` and the loader's iteration), so that the first shards of a remote
    set download while the loader starts its worker processes and they draw their first
    batches (they were fetched only once the workers had started, 0.3-0.5 s later). The
    iteration takes it over when its order is this one (``key``: the epoch and the resumed
    positions), else it is closed. Its first step only downloads (``read_ahead`` holds
    the shards from its second step on): one never iterated keeps nothing in the cache."""

    def __init__(
        self, key: tuple[int, str], indices: np.ndarray, stream: Generator[int, None, None]
    ) -> None:
        self.key = key
        self.indices = indices
        self._stream: Generator[int, None, None] | None = stream
        self._first: int | None = None

    @classmethod
    def start(
        cls, dataset: Any, key: tuple[int, str], indices: np.ndarray
    ) -> StartedReadAhead | None:
        """The read-ahead of ``indices`` through ``dataset.read_ahead``, its first step
        taken (which starts the downloads of the shards the order reads first); ``None``
        when the dataset reads nothing ahead or the order is empty."""
        read_ahead = getattr(dataset, "read_ahead", None)
        if read_ahead is None or len(indices) == 0:
            return None
        stream = read_ahead(indices)
        if not isinstance(stream, Generator):  # a plain iterator: nothing started
            return None
        started = cls(key, indices, stream)
        started._first = next(stream)
        return started

    def take(self, key: tuple[int, str]) -> Iterator[int] | None:
        """The started stream when ``key`` is its order's (yielding all of it, the first
        index included); else ``None``, and it is closed."""
        stream, self._stream = self._stream, None
        if stream is None:
            return None
        if key != self.key:
            stream.close()  # lets go of the shards it holds in the cache
            return None
        return _resumed(self._first, stream)

    def close(self) -> None:
        """Let go of what it started (shards held in the cache)."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()


def _resumed(first: int | None, stream: Generator[int, None, None]) -> Iterator[int]:
    try:
        if first is not None:
            yield first
        yield from stream
    finally:
        stream.close()


def foreign_loader_error(num_replicas: int) -> str:
    """The message for an iteration of a claimed sampler that its loader did not start."""
    return (
        "ShardAwareDistributedSampler was given to dataset.loader(...) but another "
        "loader built around it iterates it: a framework that rebuilds the DataLoader to "
        "split its batches between processes (accelerator.prepare(dataloader)) shards it a "
        f"second time, and each of the {num_replicas} processes would see 1/{num_replicas} "
        "of its share; iterate the dataset.loader(...) itself (keep it out of "
        "accelerator.prepare() and move batches with .to(accelerator.device))"
    )


def unreported_position_error() -> str:
    """The message for a loaded state that records only the samples handed out."""
    return (
        "the loaded sampler state records the samples handed out, not those the loop "
        "consumed (state_dict() was called without num_consumed while a loader that does "
        "not report what the loop took iterated the sampler); save "
        "dataset.loader(...).state_dict() or torchdata's StatefulDataLoader.state_dict(), "
        "or pass num_consumed=batches_done * batch_size to sampler.state_dict()"
    )


def unreported_save_warning(count: int) -> str:
    """The warning for a ``state_dict()`` that no loader confirmed."""
    return (
        f"sampler.state_dict() was called without num_consumed while a loader that does not "
        f"report what the loop took iterates the sampler: it recorded the {count} samples "
        "handed out (DataLoader workers prefetch ahead of the loop), and loading it will be "
        "refused; pass num_consumed=batches_done * batch_size, or save "
        "dataset.loader(...).state_dict()"
    )
