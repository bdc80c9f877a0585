"""Per-stage timing of a DataLoader's work, replayed in the calling process."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from fastdata._batch import map_tensors


def _run_delays_ns() -> dict[str, int]:
    """Nanoseconds each thread of this process has waited for a CPU (Linux schedstat).

    Time spent runnable but not running is neither the reads' own CPU work nor waiting on
    storage: it is other processes holding the CPUs. Measured apart, it keeps the verdict
    right on a loaded machine. Empty where schedstat is missing.
    """
    delays: dict[str, int] = {}
    for stat in Path("/proc/self/task").glob("*/schedstat"):
        try:
            delays[stat.parent.name] = int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return delays


def _run_delay_since_s(before: dict[str, int]) -> float:
    """Run-queue wait of this process's threads since ``before`` (threads gone since are
    not counted), seconds."""
    after = _run_delays_ns()
    return sum(max(0, ns - before.get(tid, 0)) for tid, ns in after.items()) / 1e9


def copy_batch(batch: Any, device: torch.device, *, non_blocking: bool) -> Any:
    """``batch`` with every tensor copied to ``device``, its structure (named tuples,
    mapping types) kept."""
    return map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=non_blocking))


def synchronize(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


# What the reads spend most of their time on: their own CPU work, waiting for a CPU that
# other processes hold, or waiting on something else (storage, the network, a sleep).
INPUT_KINDS = ("cpu", "contention", "io")


@dataclass(frozen=True)
class StageTimes:
    """Mean seconds per batch of each stage, measured in the calling process.

    Attributes:
        fetch_s: Reading the samples (``__getitems__`` or ``__getitem__`` per index).
        collate_s: The loader's ``collate_fn``.
        to_device_s: Copying the batch to the device, ``None`` when no device was given.
        cpu_s: CPU time this process used during fetch and collate (all its threads).
        run_wait_s: Time this process's threads were runnable but waited for a CPU during
            fetch and collate (run-queue delay; 0 where Linux schedstat is missing).
    """

    fetch_s: float
    collate_s: float
    to_device_s: float | None
    cpu_s: float
    run_wait_s: float

    @property
    def _thread_s(self) -> float:
        """Thread time to share out: the wall time, or more when threads overlapped."""
        return max(self.fetch_s + self.collate_s, self.cpu_s + self.run_wait_s, 1e-12)

    @property
    def cpu_share(self) -> float:
        """Share of fetch and collate spent on a CPU."""
        return self.cpu_s / self._thread_s

    @property
    def contention_share(self) -> float:
        """Share of fetch and collate spent waiting for a CPU other processes held."""
        return self.run_wait_s / self._thread_s

    @property
    def io_share(self) -> float:
        """Share of fetch and collate spent off the CPUs and not waiting for one: on
        storage, the network or a sleep."""
        return max(0.0, 1.0 - self.cpu_share - self.contention_share)

    @property
    def input_kind(self) -> str:
        """The largest share: ``"cpu"``, ``"contention"`` or ``"io"``."""
        shares = (self.cpu_share, self.contention_share, self.io_share)
        return INPUT_KINDS[shares.index(max(shares))]


def time_stages(
    loader: DataLoader, num_batches: int, device: torch.device | None
) -> StageTimes | None:
    """Replay ``num_batches`` batches of ``loader``'s own sampler, dataset and collate in this
    process and time each stage; ``None`` for iterable datasets, which cannot be replayed."""
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        return None
    if loader.batch_sampler is not None:
        index_lists = [list(b) for b in itertools.islice(iter(loader.batch_sampler), num_batches)]
    else:
        index_lists = [[i] for i in itertools.islice(iter(loader.sampler), num_batches)]
    if not index_lists:
        return None
    fetch_s = collate_s = copy_s = 0.0
    cpu_s = run_wait_s = 0.0
    getitems = getattr(dataset, "__getitems__", None)
    for indices in index_lists:
        cpu0, delays0, t0 = time.process_time(), _run_delays_ns(), time.perf_counter()
        samples = getitems(indices) if getitems else [dataset[i] for i in indices]
        t1 = time.perf_counter()
        batch = loader.collate_fn(samples if loader.batch_sampler is not None else samples[0])
        t2 = time.perf_counter()
        cpu_s += time.process_time() - cpu0
        run_wait_s += _run_delay_since_s(delays0)
        fetch_s += t1 - t0
        collate_s += t2 - t1
        if device is not None:
            t3 = time.perf_counter()
            copy_batch(batch, device, non_blocking=loader.pin_memory)
            synchronize(device)
            copy_s += time.perf_counter() - t3
    count = len(index_lists)
    return StageTimes(
        fetch_s=fetch_s / count,
        collate_s=collate_s / count,
        to_device_s=copy_s / count if device is not None else None,
        cpu_s=cpu_s / count,
        run_wait_s=run_wait_s / count,
    )
