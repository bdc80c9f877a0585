"""Forked worker processes: the local engine's default where forking is safe.

A forked child starts as a copy of this process in milliseconds (a spawned one first imports
OpenCV and NumPy), and it holds a dataset object as it is here (open files, h5py handles,
lambdas, classes defined in a notebook) without pickling. torch's ``DataLoader`` forks its
workers on Linux for the same reasons. Forking a process
whose libraries run threads is what can go wrong: a child has only the forking thread,
and a library that waits on its other threads hangs. The rules kept here:

- fork only where the platform forks safely: not on Windows (no ``fork``), not on macOS
  (its system frameworks are not fork-safe; CPython spawns there by default);
- never when CUDA is initialised in this process: a forked child cannot use it (CUDA
  raises "Cannot re-initialize CUDA in forked subprocess"), and a dataset returning CUDA
  tensors would need it;
- OpenCV's thread pool is shrunk to one thread in this process while forking (every
  fork, :mod:`fastdata._threads`), and a child
  runs torch on one thread, as ``DataLoader`` workers do (torch's OpenMP pool, once used
  here, hangs the child's first parallel operation otherwise).
"""

from __future__ import annotations

import multiprocessing
import sys


def cuda_is_initialised() -> bool:
    """Whether this process has initialised CUDA through torch (never imports torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_initialized())


def fork_refusal() -> str:
    """``""`` when worker processes may be forked from this process, else the reason."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return f"this platform ({sys.platform}) cannot fork processes"
    if sys.platform == "darwin":
        return "macOS system libraries are not safe in forked processes"
    if cuda_is_initialised():
        return (
            "CUDA is initialised in this process, and forked processes cannot use it "
            "(preprocess before touching CUDA, or in a separate process)"
        )
    return ""


def resolve_start_method(start_method: str) -> str:
    """``"fork"`` or ``"spawn"`` for a :class:`~fastdata.preprocess.engine.LocalEngine`'s
    ``start_method``: ``"auto"`` forks where :func:`fork_refusal` allows it (a forked
    worker starts in milliseconds; a spawned one imports OpenCV and NumPy first, as much
    time as a hundred images take) and spawns elsewhere."""
    if start_method != "auto":
        return start_method
    return "spawn" if fork_refusal() else "fork"


def single_threaded_torch() -> None:
    """Run torch on one thread in a worker process (when the dataset has loaded torch):
    the workers are the parallelism, and a forked child cannot use the parent's pool."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
