"""The one source of random draws for augmentations: uniforms that the CPU transforms,
the decoders and the device modules turn into crop boxes and flips (through
:mod:`fastdata._crop`).

With a seed, a batch read through ``dataset.loader(...)`` draws per sample from
``(seed, epoch, sample index)`` alone (:func:`batch_draws`): the epoch reaches the
DataLoader workers with the batch of indices itself, so epochs differ and a rerun (or a
resumed run) draws the same, whatever ``num_workers``, ``persistent_workers`` and the
batch size. Everywhere else a seed gives a stream: a ``torch.Generator`` per process and
DataLoader worker, restarted from ``(seed, epoch)`` by :meth:`UniformDraws.set_epoch`.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np
import torch
from torch.utils.data import get_worker_info

# Worker ``w`` of a DataLoader draws from ``seed + WORKER_STRIDE * w``.
WORKER_STRIDE = 7919

_MASK = (1 << 64) - 1
# The samples whose draws the current thread's transform is taking: (epoch, indices).
_BATCH: ContextVar[tuple[int, np.ndarray] | None] = ContextVar("fastdata_batch", default=None)


@contextmanager
def batch_draws(epoch: int, indices: np.ndarray) -> Iterator[None]:
    """Within this block, seeded draws of ``len(indices)`` rows in this thread are keyed by
    ``(seed, epoch, indices[k])``: what a dataset sets around its transform for a batch
    whose epoch it knows (the batch of indices ``dataset.loader(...)`` hands it).

    Args:
        epoch: The epoch the batch belongs to.
        indices: ``(B,)`` int64 dataset indices of the batch's samples, in batch order.
    """
    token = _BATCH.set((int(epoch), np.asarray(indices, dtype=np.int64).reshape(-1)))
    try:
        yield
    finally:
        _BATCH.reset(token)


def _mix(values: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a ``uint64`` array: a bijection that scatters every bit."""
    values = values + np.uint64(0x9E3779B97F4A7C15)
    values = (values ^ (values >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    values = (values ^ (values >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


def _key(*parts: int) -> np.ndarray:
    """One ``uint64`` key (a ``(1,)`` array) mixed from ints of any sign and size."""
    key = np.zeros(1, np.uint64)
    for part in parts:
        key = _mix(key ^ np.uint64(part & _MASK))
    return key


def keyed_uniform(seed: int, epoch: int, indices: np.ndarray, columns: int) -> np.ndarray:
    """``(len(indices), columns)`` float64 uniforms in [0, 1); row ``k`` depends on
    ``(seed, epoch, indices[k])`` only (53 random bits each)."""
    rows = _mix(_key(seed, epoch) ^ indices.astype(np.uint64))
    steps = np.arange(1, columns + 1, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
    bits = _mix(rows[:, None] + steps[None, :]) >> np.uint64(11)
    return bits.astype(np.float64) * 2.0**-53


class UniformDraws:
    """Float64 uniforms in [0, 1), reproducible per DataLoader worker.

    Without a seed the draws come from torch's default generator, which ``DataLoader``
    seeds per worker from the main process's seed (so ``torch.manual_seed(s)`` makes a run
    reproducible). With a seed:

    - inside :func:`batch_draws` (a batch read through ``dataset.loader(...)``), a draw of
      that batch's size is keyed per sample by ``(seed, epoch, index)``;
    - otherwise they come from a ``torch.Generator`` seeded with ``seed + 7919 *
      worker_id``, made afresh in each process (after a fork or a pickle), so a seed gives
      the same draws whatever the global state. In the main process (worker 0) this is
      ``torch.Generator().manual_seed(seed)``, the device augmentations' generator.
      :meth:`set_epoch` restarts it from ``(seed, epoch)``.

    Args:
        seed: ``None`` or an int.

    Raises:
        TypeError: ``seed`` is not an int or ``None``.
    """

    def __init__(self, seed: int | None = None) -> None:
        if seed is not None and (
            not isinstance(seed, int | np.integer) or isinstance(seed, bool | np.bool_)
        ):
            raise TypeError(f"seed must be an int or None, got {seed!r}")
        self.seed = None if seed is None else int(seed)
        self.epoch: int | None = None  # set_epoch's; None: the stream of the seed alone
        self._generator: torch.Generator | None = None
        self._generator_pid = -1

    def set_epoch(self, epoch: int) -> None:
        """Restart the seeded stream from ``(seed, epoch)``: the draws of an epoch then
        depend on the seed and the epoch only, not on the epochs before it (a resumed run
        draws as the original did). No effect without a seed.

        Raises:
            TypeError: ``epoch`` is not an int.
        """
        if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer):
            raise TypeError(f"epoch must be an int, got {epoch!r}")
        self.epoch = int(epoch)
        self._generator, self._generator_pid = None, -1

    def generator(self) -> torch.Generator | None:
        """This process's generator: ``None`` (torch's default) unless ``seed`` was given."""
        if self.seed is None:
            return None
        if self._generator is None or self._generator_pid != os.getpid():
            info = get_worker_info()
            worker_id = info.id if info is not None else 0
            seed = self.seed + WORKER_STRIDE * worker_id
            if self.epoch is not None:
                seed = int(_key(seed, self.epoch)[0] >> np.uint64(1))  # manual_seed: < 2**63
            self._generator = torch.Generator().manual_seed(seed)
            self._generator_pid = os.getpid()
        return self._generator

    def uniform(self, count: int, columns: int = 1) -> np.ndarray:
        """``(count, columns)`` float64 uniforms in [0, 1): keyed per sample inside
        :func:`batch_draws` for a batch of ``count`` samples (with a seed), else from the
        stream."""
        batch = _BATCH.get()
        if self.seed is not None and batch is not None and len(batch[1]) == count:
            return keyed_uniform(self.seed, batch[0], batch[1], columns)
        draws = torch.rand((count, columns), generator=self.generator(), dtype=torch.float64)
        return draws.numpy()

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_generator"], state["_generator_pid"] = None, -1  # re-seeded where it lands
        return state

    def __repr__(self) -> str:
        epoch = "" if self.epoch is None else f", epoch={self.epoch}"
        return f"UniformDraws(seed={self.seed}{epoch})"


# Turning uniforms into the other distributions the augmentations draw from, so every
# random parameter still comes from one UniformDraws stream (one seed, one result on every
# executor).


def normal_from_uniform(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """Standard normal samples from two equal-shape arrays of uniforms in [0, 1)
    (Box-Muller)."""
    radius = np.sqrt(-2.0 * np.log1p(-first))  # 1 - u in (0, 1]: never log(0)
    return radius * np.cos(2.0 * np.pi * second)


def beta_from_uniform(draws: np.ndarray, alpha: float) -> np.ndarray:
    """``Beta(alpha, alpha)`` samples, one per uniform in ``draws`` (any shape).

    Each uniform seeds a NumPy generator that draws the sample, so the result is a pure
    function of the draws (the same on every executor and platform for one seed).
    """
    flat = np.asarray(draws, np.float64).ravel()
    samples = [
        np.random.Generator(np.random.PCG64(int(u * 2.0**53))).beta(alpha, alpha) for u in flat
    ]
    return np.asarray(samples, np.float64).reshape(np.shape(draws))


def dirichlet_from_uniform(draws: np.ndarray, alpha: float, size: int) -> np.ndarray:
    """``Dirichlet(alpha, ..., alpha)`` samples of ``size`` weights, one per uniform in
    ``(N,)`` ``draws``: ``(N, size)`` float64 rows that sum to 1, each a pure function of
    its uniform (as in :func:`beta_from_uniform`)."""
    flat = np.asarray(draws, np.float64).ravel()
    concentration = np.full(size, float(alpha))
    rows = [
        np.random.Generator(np.random.PCG64(int(u * 2.0**53))).dirichlet(concentration)
        for u in flat
    ]
    return np.asarray(rows, np.float64).reshape(len(flat), size)


def integers_from_uniform(draws: np.ndarray, high: int | np.ndarray) -> np.ndarray:
    """Integers uniform in ``[0, high)`` from uniforms in [0, 1) (int64, ``draws``' shape)."""
    high_array = np.asarray(high, np.int64)
    return np.minimum(np.floor(draws * high_array).astype(np.int64), high_array - 1)
