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
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from fastdata.datasets._iteration import (
    HANDED_OUT,
    EpochIterator,
    StartedReadAhead,
    foreign_loader_error,
    unreported_save_warning,
)
from fastdata.datasets._positions import Ranges, consumed_ranges, remaining_positions
from fastdata.datasets._rank_cache import (
    agreed_window,
    folder_shares,
    gather_caches,
    gathers_caches,
)
from fastdata.shards import Manifest, load_manifest
from fastdata.shards.reader import CacheRoom

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
_STATE_KEYS = (*_SETTINGS, "epoch", "num_consumed")  # and "consumed_after" (optional)
_MAX_EPOCH = 2**63 - 1
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
            (e.g. a ``RAMDataset`` of files or arrays, where locality does not matter).

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
    refused. The sampler knows what the loop consumed only when told (it never inspects
    who calls it): by the :class:`~fastdata.datasets.ResumableDataLoader`
    (``dataset.loader(...)``) iterating it, which reports exactly what it handed to the
    loop; by ``num_consumed``; or, under torchdata's ``StatefulDataLoader``, through the
    state of the sampler's iterator, which that loader takes as it hands each batch out. A
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
            count is a full shuffle and gives up locality. A remote set's order keeps
            twice the window in its cache (where the sampler hands samples out and where
            the loader reads them) and a spare: when its ``cache_limit`` holds fewer
            shards, the sampler shuffles as many as fit (at least 1) and warns once;
            :attr:`window_shards` is then that number (the order depends on
            ``cache_limit`` too). Under an initialized ``torch.distributed`` group the
            ranks agree on it when the sampler is built (a collective: build it on every
            rank): ranks of a host sharing a cache folder split its limit, and every
            rank takes the smallest window, so that all draw one order. Without a
            process group of ``num_replicas`` ranks (``num_replicas`` and ``rank`` given
            by hand, or a data-parallel subset of a larger group), give every rank the
            same ``cache_limit`` (ranks sharing a folder, each its share).
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
        self.partition = partition
        self._window_wanted = window_shards
        self.window_shards = self._window_for_cache(dataset, window_shards)
        self.epoch = 0
        self._starts = np.concatenate([[0], np.cumsum(self.shard_sizes, dtype=np.int64)])
        total = int(self._starts[-1])
        if drop_last:
            self.num_samples = total // num_replicas
        else:
            self.num_samples = math.ceil(total / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.shard_layout = _layout_digest(self.shard_sizes)
        self._resume: Ranges | None = None  # consumed positions the next iteration skips
        self._skipped: Ranges = []  # positions the current iteration skipped (a resume)
        self._yielded = 0  # samples the current iteration handed out
        self._stream: np.ndarray | None = None  # the indices the current iteration yields
        self._claimed = False  # given to a dataset.loader(...): it starts the iterations
        self._admitted = False  # that loader started the next iteration
        self._unconfirmed_save = 0  # handed-out count a state_dict() recorded, unconfirmed
        self._unconfirmed_load = False  # a loaded state awaits its iterator's confirmation
        self._consumer: Callable[[], Ranges | None] | None = None  # a loader's exact count
        self._consumer_owner: weakref.ref[object] | None = None
        self._started: StartedReadAhead | None = None  # the next iteration's read-ahead

    def _window_for_cache(self, dataset: object, wanted: int) -> int:
        """``wanted``, or fewer shards when the dataset's capped cache (a remote set) cannot
        hold the shards a shuffled order keeps in use: the order then reads no shard twice
        an epoch. A pure function of the set and the ``cache_limit`` of every rank: under
        an initialized ``torch.distributed`` group the ranks agree on it (the smallest
        window of any rank, each rank counting its share of a cache folder that ranks of
        its node share), so that every rank draws the same order."""
        self._window_source = "its cache_limit"
        if gathers_caches(dataset, self.num_replicas, self.shuffle, self.partition):
            return self._window_agreed(dataset, wanted)
        room: Any = getattr(dataset, "cache_room", None)
        if room is None or not self.shuffle or self.partition != "epoch":
            return wanted  # unshuffled, or each rank's own permutation: windows change nothing
        fitting = int(room.window_shards(wanted))
        if fitting < wanted:
            _warn_shrunk_window(
                room,
                fitting,
                wanted,
                limit=f"cache_limit ({room.limit_bytes} bytes)",
                whose="",
                sharers=1,
                stacklevel=3,
            )
        return fitting

    def _window_agreed(self, dataset: Any, wanted: int) -> int:
        """The window every rank takes: the ranks gather their caches (a collective)."""
        shares = folder_shares(gather_caches(dataset.cache_folder))
        mine = next(share for share in shares if self.rank in share.ranks)
        if mine.share_bytes is not None and hasattr(dataset, "share_cache"):
            dataset.share_cache(mine.share_bytes)  # its read-ahead stays within its share
        fitting, limiting = agreed_window(shares, wanted)
        self._window_source = "the cache_limit of every rank (shared by the ranks of a folder)"
        if limiting is not None and limiting.room is not None:
            _warn_shrunk_window(
                limiting.room,
                fitting,
                wanted,
                limit=f"cache_limit ({limiting.limit_bytes} bytes) of {limiting.describe()},",
                whose=" of every rank",
                sharers=len(limiting.ranks),
                stacklevel=4,
            )
        return fitting

    # -- torch Sampler ------------------------------------------------------------------
    def __len__(self) -> int:
        """``num_samples``: the per-rank sample count of an epoch (also a resumed one)."""
        return self.num_samples

    def __iter__(self) -> EpochIterator:
        """This rank's indices of the epoch, less those a loaded state says were consumed.

        Returns:
            An iterator with ``state_dict()`` / ``load_state_dict()`` (how far it went, for
            loaders that snapshot it as they hand batches out).

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
            self._consumer = self._consumer_owner = None  # not the loader's iteration
        done = self._resume or []
        started, self._started = self._started, None
        key = self._order_key()
        indices = started.indices if started and started.key == key else self._next_indices()
        self._resume = None
        self._skipped = done
        self._yielded = 0
        self._stream = indices
        return EpochIterator(self, indices, started.take(key) if started else None)

    def _order_key(self) -> tuple[int, str]:
        """What the next iteration's order depends on besides the settings."""
        return self.epoch, repr(self._resume)

    def _next_indices(self) -> np.ndarray:
        """The indices the next iteration yields (this rank's epoch less a loaded state's
        consumed positions)."""
        indices = self.rank_indices()
        if self._resume:
            indices = indices[remaining_positions(self.num_samples, self._resume)]
        return indices

    def _start_read_ahead(self) -> None:
        """Start the next iteration's read-ahead now (``set_epoch``, ``load_state_dict``
        and the loader, before its workers start): a dataset in object storage begins
        downloading the shards its order reads first. The iteration takes it over; a
        change of order drops it."""
        key = self._order_key()
        if self._started is not None and self._started.key == key:
            return  # started already
        self._drop_read_ahead()
        self._started = StartedReadAhead.start(self.dataset, key, self._next_indices())

    def _drop_read_ahead(self) -> None:
        started, self._started = self._started, None
        if started is not None:
            started.close()

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch whose order the next iteration yields (call on every rank)."""
        if epoch != self.epoch:
            self._resume = None
            self._skipped = []
            self._yielded = 0
            self._consumer = self._consumer_owner = None
            self._unconfirmed_load = False
        self.epoch = epoch
        self._start_read_ahead()  # a remote set: the epoch's first shards start downloading

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
            num_consumed: Samples of this epoch the training loop has consumed on this rank
                (the first ones of the epoch's order). Defaults to what the
                :class:`ResumableDataLoader` iterating this sampler handed to the loop.
                Without either, the state records the samples handed out (``"position":
                "handed_out"``, unless none was since the epoch began or a state was
                loaded): under torchdata's ``StatefulDataLoader``, which also saves the
                iterator's state, that is what the loop consumed; under any other loader
                the sampler cannot tell (workers prefetch), so it warns at its next step
                and ``load_state_dict`` refuses the state on its own.

        Returns:
            The settings that shape the order, ``epoch``, ``num_consumed`` (the consumed
            samples at the head of the epoch's order) and ``consumed_after``: ``[start,
            stop)`` ranges of positions past that head also consumed (a loader with
            ``in_order=False`` hands batches out of order); ``[]`` otherwise.

        Raises:
            TypeError: ``num_consumed`` is not an int.
            ValueError: ``num_consumed`` is out of range.
        """
        self._unconfirmed_save = 0
        if num_consumed is not None:
            head = _checked_int("num_consumed", num_consumed, 0, self.num_samples)
            return self._state([(0, head)] if head else [])
        done = self._consumer() if self._consumer is not None else None
        if done is not None:
            return self._state(done)
        handed_out = self._handed_out()
        state = self._state(handed_out)
        known = (self._resume is not None or self._yielded == 0) and not self._unconfirmed_load
        if not known:  # an iterator state_dict() right after (torchdata) confirms it
            self._unconfirmed_save = max(sum(stop - start for start, stop in handed_out), 1)
            state["position"] = HANDED_OUT
        return state

    def _handed_out(self) -> Ranges:
        """Positions of the epoch consumed as far as this sampler knows: a loaded state not
        yet iterated, else what was skipped plus what the current iteration handed out."""
        if self._resume is not None:
            return list(self._resume)
        return consumed_ranges(self.num_samples, self._skipped, [(0, self._yielded)])

    # -- the loader channel (see fastdata/datasets/_iteration.py) ------------------------
    def _claim(self) -> None:
        """A ``dataset.loader(...)`` serves this sampler: only it starts iterations."""
        self._claimed = True

    def _state(self, done: Ranges) -> dict[str, Any]:
        """The state whose consumed positions are ``done`` (sorted disjoint ranges)."""
        head = done[0][1] if done and done[0][0] == 0 else 0
        after = done[1:] if head else done
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
            "num_consumed": head,
            "consumed_after": [[start, stop] for start, stop in after],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the next iteration yields the samples of ``state`` not yet consumed.

        A state from any rank of the same run is valid on every rank (all ranks consume
        the same count).

        Raises:
            TypeError: ``state`` is not a mapping, or a value has the wrong type (counts and
                the epoch must be ints, not floats, strings or bools).
            ValueError: ``state`` lacks keys, a count is out of range, or it was saved with
                another seed, world size, partition, shuffle, drop_last, window_shards or
                shard layout (its order would differ: the resume would repeat some samples
                and skip others).
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
            _check_type(key, state[key], mine)
            if state[key] != mine:
                shrunk = (
                    f" ({self._window_source} lets it shuffle {mine} "
                    f"shard{'s' if mine > 1 else ''} together of the "
                    f"{self._window_wanted} asked for: resume with the cache_limit of the "
                    "saved run)"
                    if key == "window_shards" and mine != self._window_wanted
                    else ""
                )
                raise ValueError(
                    f"state was saved with {key}={state[key]!r}, this sampler has "
                    f"{key}={mine!r}{shrunk}; a mid-epoch resume needs the same dataset "
                    "(shard layout, cache_limit of a remote set), world size and sampler "
                    "settings (seed, shuffle, drop_last, window_shards, partition)"
                )
        epoch = _checked_int("epoch", state["epoch"], 0, _MAX_EPOCH)
        head = _checked_int("num_consumed", state["num_consumed"], 0, self.num_samples)
        after = _checked_ranges(state.get("consumed_after", []), head, self.num_samples)
        self.epoch = epoch
        self._resume = ([(0, head)] if head else []) + after
        self._skipped = []
        self._yielded = 0
        self._consumer = self._consumer_owner = None
        self._unconfirmed_save = 0
        self._unconfirmed_load = state.get("position") == HANDED_OUT
        self._start_read_ahead()  # the resumed order's first shards

    def _pending_resume(self) -> Ranges:
        """Positions of the epoch the next iteration skips (set by :meth:`load_state_dict`)."""
        return list(self._resume or [])

    def _attach(self, consumer: object, count: Callable[[], Ranges]) -> None:
        """Let ``consumer`` (a loader) answer :meth:`state_dict` with the positions its
        loop consumed, until the epoch changes or a state is loaded; it starts the next
        iteration (a claimed sampler refuses the others, see :meth:`__iter__`)."""
        self._admitted = True
        self._unconfirmed_save = 0
        ref = weakref.ref(consumer)

        def consumed() -> Ranges | None:
            return count() if ref() is not None else None

        self._consumer, self._consumer_owner = consumed, ref

    def _attached_to(self, consumer: object) -> bool:
        """Whether ``consumer`` iterates the current epoch (its count is the state)."""
        return self._consumer_owner is not None and self._consumer_owner() is consumer

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
        # a closure over a loader, and a weak reference: not picklable, not needed
        state["_consumer"] = state["_consumer_owner"] = None
        state["_stream"] = None  # the main process's record of what it yields
        state["_started"] = None  # a generator of this process, holding its downloads
        return state


def _warn_shrunk_window(
    room: CacheRoom,
    fitting: int,
    wanted: int,
    *,
    limit: str,
    whose: str,
    sharers: int,
    stacklevel: int,
) -> None:
    """Warn that ``room`` (one rank's share of ``limit``) shrinks the window to ``fitting``."""
    in_use = 2 * fitting + 1
    outcome = (
        f"so that the cache holds the {in_use} its order keeps in use"
        if in_use <= room.shards
        else f"and even so its order keeps {in_use} in use, more than the cache holds"
    )
    warnings.warn(
        f"{limit} holds {room.shards} shard{'s' if room.shards > 1 else ''} of the set"
        f"{' for each' if sharers > 1 else ''}: the sampler{whose} shuffles {fitting} "
        f"shard{'s' if fitting > 1 else ''} together instead of "
        f"window_shards={wanted}, {outcome} (those shuffled together where the "
        "sampler hands samples out, again where the loader reads them, and one "
        "spare)"
        + (
            " and no shard is downloaded twice an epoch"
            if in_use <= room.shards
            else ": shards are downloaded more than once an epoch"
        )
        + f"; allow {room.bytes_for(wanted) * sharers} bytes to shuffle {wanted} together",
        UserWarning,
        stacklevel=stacklevel + 1,
    )


def _checked_int(key: str, value: object, low: int, high: int) -> int:
    """``value`` if it is an int (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise TypeError(f"{key} must be an int, got {value!r} ({type(value).__name__})")
    if not low <= value <= high:
        raise ValueError(f"{key} must be in [{low}, {high}], got {value}")
    return int(value)


def _check_type(key: str, saved: object, mine: object) -> None:
    """A saved setting has the type of this sampler's (a bool is not an int, 1.0 not 1)."""
    if isinstance(mine, bool):
        ok = isinstance(saved, bool | np.bool_)
    elif isinstance(mine, int):
        ok = isinstance(saved, int | np.integer) and not isinstance(saved, bool)
    else:
        ok = isinstance(saved, type(mine))
    if not ok:
        name = type(mine).__name__
        article = "an" if name[0] in "aeiou" else "a"
        raise TypeError(f"{key} must be {article} {name}, got {saved!r} ({type(saved).__name__})")


def _checked_ranges(value: object, head: int, num_samples: int) -> Ranges:
    """``consumed_after``: sorted, disjoint ``[start, stop)`` ranges in ``(head, num_samples]``."""
    if not isinstance(value, list | tuple):
        raise TypeError(f"consumed_after must be a list of [start, stop], got {value!r}")
    ranges: Ranges = []
    floor = head + 1  # past the head, and not touching the previous range
    for item in value:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise TypeError(f"consumed_after must be a list of [start, stop], got {item!r}")
        start = _checked_int("consumed_after start", item[0], floor, num_samples - 1)
        stop = _checked_int("consumed_after stop", item[1], start + 1, num_samples)
        ranges.append((start, stop))
        floor = stop + 1
    return ranges


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
