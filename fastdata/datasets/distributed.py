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
alone. Wrappers that shard its output a second time (Lightning's
``DistributedSamplerWrapper``, Accelerate's ``prepare(dataloader)``) are detected when the
iteration starts and refused with the fix.
"""

from __future__ import annotations

import hashlib
import math
import os
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence, Sized
from types import FrameType
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch.distributed as dist
from torch.utils.data import DistributedSampler

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
_MAX_CALLER_FRAMES = 12  # how far up __iter__ looks for a wrapper or a DataLoader iterator
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
        sizes = [s.num_samples for s in load_manifest(source).shards]
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
    refused. With DataLoader workers, save the state through a loader that knows what the
    loop took: :class:`~fastdata.datasets.ResumableDataLoader` (``dataset.loader(...)``)
    or torchdata's ``StatefulDataLoader``; a plain ``DataLoader`` with workers prefetches,
    and ``state_dict()`` then refuses to guess (pass ``num_consumed``).

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
        self._prefetching_workers = 0  # workers of the plain DataLoader iterating this epoch
        self._consumer: Callable[[], int | None] | None = None  # a loader's exact count

    # -- torch Sampler ------------------------------------------------------------------
    def __len__(self) -> int:
        """``num_samples``: the per-rank sample count of an epoch (also a resumed one)."""
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        """This rank's indices of the epoch, less those a loaded state says were consumed.

        Raises:
            ValueError: A wrapper shards this sampler's output again (Lightning's
                ``DistributedSamplerWrapper``, Accelerate's ``prepare(dataloader)``).
        """
        self._prefetching_workers = self._inspect_callers()
        start = self._resume_from or 0
        self._resume_from = None
        self._yielded = start
        return self._generate(self.rank_indices()[start:])

    def _inspect_callers(self) -> int:
        """Refuse a second sharding wrapper; return the worker count of a plain DataLoader
        iterator driving this iteration (0 for none, for torchdata's, or single-process)."""
        try:
            frame: FrameType | None = sys._getframe(2)  # the caller of __iter__
        except ValueError:  # called from the top of the stack
            return 0
        for _ in range(_MAX_CALLER_FRAMES):
            if frame is None:
                break
            owner = frame.f_locals.get("self")
            if owner is not None and owner is not self:
                _refuse_double_sharding(owner, self.num_replicas)
                if _is_loader_iterator(owner):
                    if type(owner).__module__.startswith("torchdata"):
                        return 0  # StatefulDataLoader snapshots the sampler at the right time
                    return int(getattr(owner, "_num_workers", 0))
            frame = frame.f_back
        return 0

    def _generate(self, indices: np.ndarray) -> Iterator[int]:
        # a dataset in object storage downloads the shards of this order ahead of their use
        read_ahead = getattr(self.dataset, "read_ahead", None)
        for index in indices.tolist() if read_ahead is None else read_ahead(indices):
            self._yielded += 1
            yield index

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields (call on every rank)."""
        if epoch != self.epoch:
            self._resume_from = None
            self._yielded = 0
            self._prefetching_workers = 0
            self._consumer = None
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
                this sampler, else the number the sampler has handed out: exact with
                ``num_workers=0`` and under torchdata's ``StatefulDataLoader`` (which
                saves this state when the batch is yielded).

        Raises:
            ValueError: ``num_consumed`` is out of range, or is left out while a plain
                ``DataLoader`` with workers (which prefetch ahead of the loop) iterates this
                epoch: the handed-out count would skip the prefetched samples on resume.
        """
        consumed = num_consumed
        if consumed is None and self._consumer is not None:
            consumed = self._consumer()
        if consumed is None:
            if self._prefetching_workers and self._yielded:
                raise ValueError(
                    f"state_dict() cannot tell what the loop consumed: a DataLoader with "
                    f"{self._prefetching_workers} workers prefetches ahead of it (handed out "
                    f"{self._yielded}); iterate a fastdata ResumableDataLoader "
                    "(dataset.loader(...)) or torchdata's StatefulDataLoader and save "
                    "loader.state_dict(), or pass num_consumed=batches_done * batch_size"
                )
            consumed = self._yielded
        if not 0 <= consumed <= self.num_samples:
            raise ValueError(f"num_consumed must be in [0, {self.num_samples}], got {consumed}")
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
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields the samples of ``state`` not yet consumed.

        A state from any rank of the same run is valid on every rank (all ranks consume
        the same count).

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
        self._prefetching_workers = 0
        self._consumer = None

    def _pending_offset(self) -> int:
        """Samples of the epoch the next iteration skips (set by :meth:`load_state_dict`)."""
        return self._resume_from or 0

    def _attach(self, consumer: object, count: Callable[[], int | None]) -> None:
        """Let ``consumer`` (a loader) answer :meth:`state_dict` with its exact count."""
        ref = weakref.ref(consumer)

        def consumed() -> int | None:
            return count() if ref() is not None else None

        self._consumer = consumed

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_consumer"] = None  # a closure over a loader: not picklable, not needed
        return state


def _layout_digest(sizes: Sequence[int]) -> str:
    """A short fingerprint of the per-shard sample counts (the order depends on them)."""
    data = np.asarray(sizes, dtype="<i8").tobytes()
    return f"{len(sizes)}:{sum(sizes)}:{hashlib.sha256(data).hexdigest()[:16]}"


def _is_loader_iterator(owner: object) -> bool:
    return any(cls.__name__ == "_BaseDataLoaderIter" for cls in type(owner).__mro__)


def _refuse_double_sharding(owner: object, num_replicas: int) -> None:
    """Raise when ``owner`` (a caller of ``__iter__``) splits this sampler's output again."""
    if num_replicas <= 1:
        return
    if isinstance(owner, DistributedSampler) and not isinstance(
        owner, ShardAwareDistributedSampler
    ):
        if owner.num_replicas > 1:
            raise ValueError(
                f"ShardAwareDistributedSampler is wrapped by {type(owner).__name__}, which "
                f"shards it a second time (each rank would see 1/{owner.num_replicas} of its "
                "share): give the DataLoader the sampler itself; under Lightning, "
                "Trainer(use_distributed_sampler=False) if your Lightning version still wraps it"
            )
    elif type(owner).__name__ == "BatchSamplerShard" and getattr(owner, "num_processes", 1) > 1:
        raise ValueError(
            "accelerator.prepare(dataloader) shards the batches of a DataLoader whose "
            "ShardAwareDistributedSampler already gives each process its share (each would "
            f"see 1/{owner.num_processes} of it): prepare only the model and optimizer, "  # type: ignore[attr-defined]
            "keep the DataLoader out of prepare() and move batches with "
            ".to(accelerator.device)"
        )


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
