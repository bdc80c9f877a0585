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

    Time spent runnable but not running is CPU contention, not I/O: counting it keeps the
    CPU-versus-I/O verdict right on a loaded machine. Empty where schedstat is missing.
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


@dataclass(frozen=True)
class StageTimes:
    """Mean seconds per batch of each stage, measured in the calling process.

    Attributes:
        fetch_s: Reading the samples (``__getitems__`` or ``__getitem__`` per index).
        collate_s: The loader's ``collate_fn``.
        to_device_s: Copying the batch to the device, ``None`` when no device was given.
        cpu_share: Share of fetch and collate wall time spent on, or waiting for, a CPU
            (process CPU time plus run-queue delay, over wall time; capped at 1). Low means
            the reads wait on storage (I/O).
    """

    fetch_s: float
    collate_s: float
    to_device_s: float | None
    cpu_share: float


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
    cpu_s = wall_s = 0.0
    getitems = getattr(dataset, "__getitems__", None)
    for indices in index_lists:
        cpu0, delays0, t0 = time.process_time(), _run_delays_ns(), time.perf_counter()
        samples = getitems(indices) if getitems else [dataset[i] for i in indices]
        t1 = time.perf_counter()
        batch = loader.collate_fn(samples if loader.batch_sampler is not None else samples[0])
        t2 = time.perf_counter()
        cpu_s += time.process_time() - cpu0 + _run_delay_since_s(delays0)
        wall_s += t2 - t0
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
        cpu_share=min(1.0, cpu_s / wall_s) if wall_s > 0 else 1.0,
    )
