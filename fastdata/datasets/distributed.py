"""``ShardAwareDistributedSampler``: DDP sampling that keeps each rank on its own shards.

The order of an epoch is one global sequence ``G`` of every sample index, drawn from
``(seed, epoch)`` alone: shards in a seeded permutation, grouped into windows of
``window_shards`` consecutive shards, samples shuffled within each window. Rank ``r`` of
``W`` takes the ``r``-th contiguous ``1/W`` slice of ``G``, so it reads about ``1/W`` of
the shards, nearly all of them whole (only the shards of the windows at its two slice ends
are shared with a neighbour). ``G`` does not depend on ``W``: one process and eight
processes see the same order, split differently.

With ``partition="fixed"`` a rank reads the same samples every epoch (the slice of the
shards in an order drawn from ``seed`` alone), in an order reshuffled each epoch: after
the first epoch, each node's page cache holds just the shards of its own ranks.

The sampler is a ``torch.utils.data.DistributedSampler``, so frameworks that add a
distributed sampler when there is none (Lightning's ``use_distributed_sampler``) leave it
alone. Who iterates it is never guessed (no look at the call stack, no class names): a
:class:`~fastdata.datasets.ResumableDataLoader` (``dataset.loader(...)``) declares itself
when it is built and when each of its iterations starts (``datasets/_iteration.py``).
"""

from __future__ import annotations

import hashlib
import math
import os
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence, Sized
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from fastdata.datasets._iteration import (
    HANDED_OUT,
    EpochIterator,
    foreign_loader_error,
    unreported_save_warning,
)
from fastdata.shards import Manifest, load_manifest

# What a saved position means depends on every setting that shapes the order: a state
# saved with other settings is refused rather than resumed into a different order. The rank
# is not among them: every rank consumes the same count, so one rank's state is valid on
# all (Lightning saves rank 0's state only and loads it on every rank).
_SETTINGS = (
    "seed",
    "num_replicas",
    "num_samples",
    "partition",
    "shuffle",
    "drop_last",
    "window_shards",
    "shard_layout",
)
_STATE_KEYS = (*_SETTINGS, "epoch", "num_consumed")
PARTITIONS = ("epoch", "fixed")


@runtime_checkable
class ShardSized(Protocol):
    """A dataset that says how many samples each of its shards holds, in index order.

    Global sample ``i`` belongs to the first shard whose cumulative size exceeds ``i``.
    """

    @property
    def shard_sizes(self) -> Sequence[int]: ...


def shard_sizes_of(source: object) -> list[int]:
    """Per-shard sample counts of ``source``.

    Args:
        source: An object with a ``shard_sizes`` attribute (:class:`ShardSized`), a
            :class:`~fastdata.shards.Manifest`, an object with a ``manifest`` attribute
            (e.g. :class:`~fastdata.shards.ShardReader`), a shard folder or ``index.json``
            path, or a sequence of ints. Any other dataset with a length counts as one shard
            (e.g. a ``RAMDataset``, where locality does not matter).

    Raises:
        TypeError: ``source`` is none of these.
        ValueError: A count is negative.
    """
    if isinstance(source, ShardSized):
        sizes: Sequence[Any] = source.shard_sizes
    elif isinstance(source, Manifest):
        sizes = [s.num_samples for s in source.shards]
    elif isinstance(getattr(source, "manifest", None), Manifest):
        sizes = [s.num_samples for s in source.manifest.shards]  # type: ignore[attr-defined]
    elif isinstance(source, str | os.PathLike):
        sizes = [s.num_samples for s in load_manifest(Path(source)).shards]
    elif isinstance(source, Sequence) and all(isinstance(n, int | np.integer) for n in source):
        sizes = source
    elif isinstance(source, Sized):  # e.g. a RAMDataset: one "shard", nothing to keep local
        sizes = [len(source)]
    else:
        raise TypeError(
            "dataset must have a `shard_sizes` attribute, a `manifest`, be a shard folder "
            f"path, a sequence of per-shard counts or have a length, got {type(source).__name__}"
        )
    counts = [int(n) for n in sizes]
    if any(n < 0 for n in counts):
        raise ValueError(f"shard sizes must be >= 0, got {counts}")
    return counts


class ShardAwareDistributedSampler(DistributedSampler):
    """Distributed sampler for sharded datasets: locality per rank, equal length per rank.

    Every rank yields ``num_samples`` global indices per epoch, so every rank runs the
    same number of batches and no collective hangs at the end of an epoch:

    - ``drop_last=False`` (default): ``G`` is extended to a multiple of ``num_replicas``
      by repeating its first samples, so each sample is seen once and fewer than
      ``num_replicas`` samples a second time per epoch.
    - ``drop_last=True``: the last ``len(G) % num_replicas`` samples of ``G`` are left out
      (different ones each epoch when shuffling); every other sample is seen once.

    ``len(sampler)`` is always ``num_samples``, the epoch's per-rank count (as torchdata's
    ``StatefulDistributedSampler``), also for a resumed epoch.

    Resuming: ``state_dict()`` records the epoch and how many samples this rank has
    consumed; after ``load_state_dict()`` the next iteration yields the rest of that epoch
    only, then ``set_epoch`` goes on with full epochs. A state saved with other settings
    (seed, world size, shuffle, drop_last, window_shards, partition, shard layout) is
    refused. The sampler knows what the loop consumed only when told (it never inspects
    who calls it): by the :class:`~fastdata.datasets.ResumableDataLoader`
    (``dataset.loader(...)``) iterating it, which reports its exact count; by
    ``num_consumed``; or, under torchdata's ``StatefulDataLoader``, through the state of
    the sampler's iterator, which that loader takes as it hands each batch out. A
    ``state_dict()`` taken under a plain ``DataLoader`` without ``num_consumed`` records the
    samples handed out, ahead of the loop when workers prefetch: it is marked as such, the
    sampler warns at its next step, and ``load_state_dict`` refuses it on its own.

    Loaders: a sampler given to ``dataset.loader(...)`` serves that loader. With
    ``num_replicas > 1`` an iteration that this loader did not start (another DataLoader
    built around the same sampler, e.g. by ``accelerator.prepare(loader)``, which would
    split its batches between the processes a second time) raises ``ValueError``.

    Args:
        dataset: Anything :func:`shard_sizes_of` accepts; indices are global sample indices
            in shard order (``ShardReader`` / ``ShardDataset`` numbering).
        num_replicas: World size; from ``torch.distributed`` when it is initialized.
        rank: This process's rank; from ``torch.distributed`` when it is initialized.
        shuffle: Permute shards and samples each epoch; ``False`` keeps storage order.
        seed: Base of the order; must be the same on every rank.
        drop_last: Drop the tail instead of padding (see above).
        window_shards: Shards whose samples are shuffled together. Larger mixes more
            (e.g. class-sorted shards), smaller reads fewer files at once; ``>=`` the shard
            count is a full shuffle and gives up locality.
        partition: ``"epoch"`` (default): the ranks split a new global order each epoch,
            the same whatever the world size. ``"fixed"``: each rank keeps the same
            samples every epoch and shuffles them among themselves (order then depends on
            the world size too): for datasets larger than one node's RAM on several
            nodes, where each node's page cache can then hold its ranks' shards. With
            ``drop_last=True`` the same samples are left out every epoch: prefer padding.

    Example:
        >>> sampler = ShardAwareDistributedSampler(dataset, seed=0)   # doctest: +SKIP
        >>> loader = DataLoader(dataset, batch_size=256, sampler=sampler)
        >>> for epoch in range(epochs):
        ...     sampler.set_epoch(epoch)
        ...     for batch in loader: ...
    """

    def __init__(
        self,
        dataset: object,
        num_replicas: int | None = None,
        rank: int | None = None,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        window_shards: int = 4,
        partition: str = "epoch",
    ) -> None:
        self.shard_sizes = shard_sizes_of(dataset)
        self.dataset = dataset  # type: ignore[assignment]  # DistributedSampler's attribute
        num_replicas, rank = _world(num_replicas, rank)
        if isinstance(window_shards, bool) or not isinstance(window_shards, int):
            raise TypeError(f"window_shards must be an int, got {window_shards!r}")
        if window_shards < 1:
            raise ValueError(f"window_shards must be >= 1, got {window_shards}")
        if partition not in PARTITIONS:
            raise ValueError(f"partition must be one of {PARTITIONS}, got {partition!r}")
        if not isinstance(seed, int | np.integer):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.window_shards = window_shards
        self.partition = partition
        self.epoch = 0
        self._starts = np.concatenate([[0], np.cumsum(self.shard_sizes, dtype=np.int64)])
        total = int(self._starts[-1])
        if drop_last:
            self.num_samples = total // num_replicas
        else:
            self.num_samples = math.ceil(total / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shard_layout = _layout_digest(self.shard_sizes)
        self._resume_from: int | None = None  # samples the next iteration skips (resume)
        self._yielded = 0  # samples of this epoch handed out, skipped ones included
        self._consumer: Callable[[], int | None] | None = None  # a loader's exact count
        self._claimed = False  # given to a dataset.loader(...): it starts the iterations
        self._admitted = False  # that loader started the next iteration
        self._reported = 0  # a position known to be consumed (0, or a loaded state's)
        self._unconfirmed_save = 0  # handed-out count a state_dict() recorded, unconfirmed
        self._unconfirmed_load = False  # a loaded state awaits its iterator's position

    # -- torch Sampler ------------------------------------------------------------------
    def __len__(self) -> int:
        """``num_samples``: the per-rank sample count of an epoch (also a resumed one)."""
        return self.num_samples

    def __iter__(self) -> EpochIterator:
        """This rank's indices of the epoch, less those a loaded state says were consumed.

        Returns:
            An iterator with ``state_dict()`` / ``load_state_dict()`` (the position in the
            epoch, for loaders that snapshot it as they hand batches out).

        Raises:
            ValueError: This sampler serves a ``dataset.loader(...)`` and another loader
                built around it iterates it with ``num_replicas > 1`` (e.g.
                ``accelerator.prepare(loader)``, which splits its batches again).
        """
        if self._admitted:
            self._admitted = False
        elif self._claimed:
            if self.num_replicas > 1:
                raise ValueError(foreign_loader_error(self.num_replicas))
            self._consumer = None  # the loader's count is not this iteration's
        start = self._resume_from or 0
        self._resume_from = None
        self._yielded = start
        return EpochIterator(self, start)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields (call on every rank)."""
        if epoch != self.epoch:
            self._resume_from = None
            self._yielded = 0
            self._consumer = None
            self._reported = 0
            self._unconfirmed_load = False
        self.epoch = epoch

    # -- the order ----------------------------------------------------------------------
    def rank_indices(self, epoch: int | None = None) -> np.ndarray:
        """This rank's whole epoch, ``(num_samples,)`` int64 global indices, in order."""
        epoch = self.epoch if epoch is None else epoch
        if self.partition == "epoch":
            return self._rank_slice(epoch)
        members = self._rank_slice(None)
        if not self.shuffle:
            return members
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch, self.rank]))
        return rng.permutation(members)

    def _rank_slice(self, epoch: int | None) -> np.ndarray:
        """This rank's slice of ``G`` (of ``epoch``; of the fixed partition order for None)."""
        begin = self.rank * self.num_samples
        end = begin + self.num_samples
        total = int(self._starts[-1])
        part = self._global_slice(epoch, begin, min(end, total))
        if end > total:  # padding: positions past the end of G wrap around to its start
            positions = np.arange(max(begin, total), end) - total
            prefix = self._global_slice(epoch, 0, min(total, int(positions[-1]) + 1))
            part = np.concatenate([part, prefix[positions % total]])
        return part

    def _global_slice(self, epoch: int | None, begin: int, end: int) -> np.ndarray:
        """``G[begin:end]`` of ``epoch``, computed only for the windows it touches; for
        ``None``, shards in an order drawn from ``seed`` alone, samples in storage order."""
        if end <= begin:
            return np.empty(0, dtype=np.int64)
        sizes = np.asarray(self.shard_sizes, dtype=np.int64)
        if self.shuffle:
            key = [self.seed] if epoch is None else [self.seed, epoch]
            rng = np.random.default_rng(np.random.SeedSequence(key))
            shard_order = rng.permutation(len(sizes))
        else:
            shard_order = np.arange(len(sizes))
        window_ends = np.cumsum(sizes[shard_order], dtype=np.int64)[
            self.window_shards - 1 :: self.window_shards
        ]
        if window_ends.size == 0 or window_ends[-1] != self._starts[-1]:
            window_ends = np.append(window_ends, self._starts[-1])
        first = int(np.searchsorted(window_ends, begin, side="right"))
        last = int(np.searchsorted(window_ends, end - 1, side="right"))
        pieces = []
        for window in range(first, last + 1):
            shards = shard_order[window * self.window_shards : (window + 1) * self.window_shards]
            members = np.concatenate(
                [np.arange(self._starts[s], self._starts[s + 1]) for s in shards]
            )
            if self.shuffle and epoch is not None:
                rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch, window]))
                members = rng.permutation(members)
            pieces.append(members)
        window_begin = int(window_ends[first - 1]) if first > 0 else 0
        return np.concatenate(pieces)[begin - window_begin : end - window_begin]

    # -- resuming -----------------------------------------------------------------------
    def state_dict(self, num_consumed: int | None = None) -> dict[str, Any]:
        """Where this rank is in the epoch, for :meth:`load_state_dict`.

        Args:
            num_consumed: Samples of this epoch the training loop has consumed on this rank.
                Defaults to the exact count of the :class:`ResumableDataLoader` iterating
                this sampler. Without either, the state records the samples handed out
                (``"position": "handed_out"``, unless none was): under torchdata's
                ``StatefulDataLoader``, which also saves the iterator's state, that is what
                the loop consumed; under any other loader the sampler cannot tell (workers
                prefetch), so it warns at its next step and ``load_state_dict`` refuses
                the state on its own.

        Raises:
            ValueError: ``num_consumed`` is out of range.
        """
        consumed = num_consumed
        if consumed is None and self._consumer is not None:
            consumed = self._consumer()
        reported = consumed is not None or self._yielded == self._reported
        if consumed is None:
            consumed = self._yielded
        # Unreported: an iterator state_dict() right after (torchdata) confirms it.
        self._unconfirmed_save = 0 if reported else consumed
        if not 0 <= consumed <= self.num_samples:
            raise ValueError(f"num_consumed must be in [0, {self.num_samples}], got {consumed}")
        position = {} if reported else {"position": HANDED_OUT}
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "num_replicas": self.num_replicas,
            "num_samples": self.num_samples,
            "partition": self.partition,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "window_shards": self.window_shards,
            "shard_layout": self.shard_layout,
            "num_consumed": int(consumed),
            **position,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields the samples of ``state`` not yet consumed.

        A state from any rank of the same run is valid on every rank (all ranks consume
        the same count).

        A state marked ``"position": "handed_out"`` (see :meth:`state_dict`) needs the
        iterator state saved with it (torchdata restores it): the first step of an
        iteration that did not get it raises ``ValueError``.

        Raises:
            ValueError: ``state`` lacks keys, or was saved with another seed, world size,
                partition, shuffle, drop_last, window_shards or shard layout (its order
                would differ: the resume would repeat some samples and skip others).
        """
        if not isinstance(state, Mapping):
            raise TypeError(
                f"state must be a mapping from state_dict(), got {type(state).__name__}"
            )
        missing = [key for key in _STATE_KEYS if key not in state]
        if missing:
            raise ValueError(
                f"state lacks keys {missing} (saved by another fastdata version?); "
                f"expected {list(_STATE_KEYS)}"
            )
        for key in _SETTINGS:
            mine = getattr(self, key)
            if state[key] != mine:
                raise ValueError(
                    f"state was saved with {key}={state[key]!r}, this sampler has "
                    f"{key}={mine!r}; a mid-epoch resume needs the same dataset (shard "
                    "layout), world size and sampler settings (seed, shuffle, drop_last, "
                    "window_shards, partition)"
                )
        consumed = int(state["num_consumed"])
        if not 0 <= consumed <= self.num_samples:
            raise ValueError(f"num_consumed must be in [0, {self.num_samples}], got {consumed}")
        self.epoch = int(state["epoch"])
        self._resume_from = consumed
        self._yielded = consumed
        self._consumer = None
        self._unconfirmed_save = 0
        self._unconfirmed_load = state.get("position") == HANDED_OUT
        self._reported = -1 if self._unconfirmed_load else consumed

    def _pending_offset(self) -> int:
        """Samples of the epoch the next iteration skips (set by :meth:`load_state_dict`)."""
        return self._resume_from or 0

    # -- the loader channel (see fastdata.datasets._iteration) ---------------------------
    def _claim(self) -> None:
        """A ``dataset.loader(...)`` serves this sampler: only it starts iterations."""
        self._claimed = True

    def _admit(self, consumer: object, count: Callable[[], int | None] | None) -> None:
        """``consumer`` (the claiming loader) starts the next iteration; ``count`` answers
        :meth:`state_dict` with the samples its loop took (``None``: it cannot count)."""
        self._admitted = True
        self._unconfirmed_save = 0
        if count is None:
            self._consumer = None
            return
        ref = weakref.ref(consumer)

        def consumed() -> int | None:
            return count() if ref() is not None else None

        self._consumer = consumed

    def _confirm_saved_position(self) -> None:
        """The iterator's state was saved with the last :meth:`state_dict` (torchdata)."""
        self._unconfirmed_save = 0

    def _check_saved_position(self) -> None:
        """Warn, at the step after it, about a state no loader said the loop consumed."""
        if self._unconfirmed_save:
            count, self._unconfirmed_save = self._unconfirmed_save, 0
            warnings.warn(unreported_save_warning(count), UserWarning, stacklevel=4)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_consumer"] = None  # a closure over a loader: not picklable, not needed
        return state


def _layout_digest(sizes: Sequence[int]) -> str:
    """A short fingerprint of the per-shard sample counts (the order depends on them)."""
    data = np.asarray(sizes, dtype="<i8").tobytes()
    return f"{len(sizes)}:{sum(sizes)}:{hashlib.sha256(data).hexdigest()[:16]}"


def _world(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """World size and rank: the ones given, else those of the initialized process group."""
    if num_replicas is None or rank is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "num_replicas and rank must be given when torch.distributed is not "
                "initialized (call init_process_group first, or pass both)"
            )
        num_replicas = dist.get_world_size() if num_replicas is None else num_replicas
        rank = dist.get_rank() if rank is None else rank
    for name, value in (("num_replicas", num_replicas), ("rank", rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be in [0, {num_replicas - 1}], got {rank}")
    return num_replicas, rank
