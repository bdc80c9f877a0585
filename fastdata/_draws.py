"""The one source of random draws for augmentations: a per-process, per-worker seeded
``torch.Generator`` whose uniforms the CPU transforms and the decoders turn into crop boxes
and flips (through :mod:`fastdata._crop`)."""

from __future__ import annotations

import os

import numpy as np
import torch
from torch.utils.data import get_worker_info

# Worker ``w`` of a DataLoader draws from ``seed + WORKER_STRIDE * w``.
WORKER_STRIDE = 7919


class UniformDraws:
    """Float64 uniforms in [0, 1), reproducible per DataLoader worker.

    Without a seed the draws come from torch's default generator, which ``DataLoader``
    seeds per worker from the main process's seed (so ``torch.manual_seed(s)`` makes a run
    reproducible). With a seed they come from a ``torch.Generator`` seeded with
    ``seed + 7919 * worker_id``, made afresh in each process (after a fork or a pickle),
    so a seed gives the same draws whatever the global state. In the main process (worker
    0) this is ``torch.Generator().manual_seed(seed)``, the device augmentations' generator.

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
        self._generator: torch.Generator | None = None
        self._generator_pid = -1

    def generator(self) -> torch.Generator | None:
        """This process's generator: ``None`` (torch's default) unless ``seed`` was given."""
        if self.seed is None:
            return None
        if self._generator is None or self._generator_pid != os.getpid():
            info = get_worker_info()
            worker_id = info.id if info is not None else 0
            seed = self.seed + WORKER_STRIDE * worker_id
            self._generator = torch.Generator().manual_seed(seed)
            self._generator_pid = os.getpid()
        return self._generator

    def uniform(self, count: int, columns: int = 1) -> np.ndarray:
        """``(count, columns)`` float64 uniforms in [0, 1)."""
        draws = torch.rand((count, columns), generator=self.generator(), dtype=torch.float64)
        return draws.numpy()

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state["_generator"], state["_generator_pid"] = None, -1  # re-seeded where it lands
        return state

    def __repr__(self) -> str:
        return f"UniformDraws(seed={self.seed})"


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


def integers_from_uniform(draws: np.ndarray, high: int | np.ndarray) -> np.ndarray:
    """Integers uniform in ``[0, high)`` from uniforms in [0, 1) (int64, ``draws``' shape)."""
    high_array = np.asarray(high, np.int64)
    return np.minimum(np.floor(draws * high_array).astype(np.int64), high_array - 1)
