"""Datasets and consumers of known cost for the tuner and profiler tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from fastdata.tune._measure import LoaderConfig, Measurement, Window, predict_bytes
from tests.conftest import write_image_shards


def burn_cpu(seconds: float) -> None:
    """Spin until this thread has used ``seconds`` of CPU time, however loaded the machine."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


class SleepDataset(Dataset):
    """I/O-like samples: each sleeps ``cost_s`` (parallelizes regardless of CPU load)."""

    def __init__(self, length: int, cost_s: float, sample_bytes: int = 16) -> None:
        self.length, self.cost_s, self.sample_bytes = length, cost_s, sample_bytes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.cost_s)
        return torch.empty(self.sample_bytes, dtype=torch.uint8)


class BusyDataset(Dataset):
    """CPU-bound samples: each burns ``cost_s`` of CPU time."""

    def __init__(self, length: int, cost_s: float) -> None:
        self.length, self.cost_s = length, cost_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        burn_cpu(self.cost_s)
        return torch.full((4,), index)


class ThreadedSleepDataset(Dataset):
    """Reads whole batches with an in-process thread pool (the ShardDataset contract):
    ``num_threads`` is settable and ``__getitems__`` returns an already-collated batch.

    In a DataLoader worker each batch also sleeps ``worker_cost_s``: the per-batch transfer
    that worker processes pay for large uint8 batches, made explicit so that a test does
    not hang on how this machine's memory bandwidth compares with its sleep granularity.
    """

    def __init__(
        self, length: int, cost_s: float, sample_bytes: int, worker_cost_s: float = 0.0
    ) -> None:
        self.length, self.cost_s, self.sample_bytes = length, cost_s, sample_bytes
        self.worker_cost_s = worker_cost_s
        self.num_threads = 1
        self._pool: ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None or self._pool._max_workers != self.num_threads:
            self._pool = ThreadPoolExecutor(self.num_threads)
        return self._pool

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        time.sleep(self.cost_s)
        return torch.empty(self.sample_bytes, dtype=torch.uint8)

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        out = torch.empty((len(indices), self.sample_bytes), dtype=torch.uint8)

        def read(position: int) -> None:
            time.sleep(self.cost_s)
            out[position].fill_(position % 256)

        list(self._executor().map(read, range(len(indices))))
        if get_worker_info() is not None:
            time.sleep(self.worker_cost_s)
        return out


class SleepStream(IterableDataset):
    """An iterable dataset whose items each sleep ``cost_s``."""

    def __init__(self, length: int, cost_s: float) -> None:
        self.length, self.cost_s = length, cost_s

    def __iter__(self) -> Any:
        for index in range(self.length):
            time.sleep(self.cost_s)
            yield torch.tensor([index])


class VirtualClock:
    """The clocks ``profile`` reads (wall, process CPU, run-queue delay), advanced only by
    the datasets and steps below: a verdict measured on it is the same however loaded the
    machine is. :meth:`install` points fastdata's tuning modules at it."""

    def __init__(self) -> None:
        self.wall_s = self.cpu_s = self.run_wait_s = 0.0

    def spend(self, *, blocked_s: float = 0.0, cpu_s: float = 0.0, run_wait_s: float = 0.0) -> None:
        """Pass time: ``blocked_s`` off the CPUs (storage, a sleep), ``cpu_s`` on one,
        ``run_wait_s`` waiting for one."""
        self.wall_s += blocked_s + cpu_s + run_wait_s
        self.cpu_s += cpu_s
        self.run_wait_s += run_wait_s

    def install(self, monkeypatch: Any) -> None:
        from fastdata.tune import _loop, _stages  # noqa: PLC0415 - patched here only

        clocks = SimpleNamespace(perf_counter=lambda: self.wall_s, process_time=lambda: self.cpu_s)
        monkeypatch.setattr(_loop, "time", clocks)
        monkeypatch.setattr(_stages, "time", clocks)
        monkeypatch.setattr(
            _stages, "_run_delays_ns", lambda: {"main": round(self.run_wait_s * 1e9)}
        )


class VirtualDataset(Dataset):
    """Samples whose cost is spent on a :class:`VirtualClock`: ``blocked_s`` waiting on
    storage, ``cpu_s`` computing, ``run_wait_s`` waiting for a CPU, each per sample."""

    def __init__(self, length: int, clock: VirtualClock, **cost_s: float) -> None:
        self.length, self.clock, self.cost_s = length, clock, cost_s

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        self.clock.spend(**self.cost_s)
        return torch.full((4,), index)


class VirtualStream(IterableDataset):
    """An iterable :class:`VirtualDataset`."""

    def __init__(self, length: int, clock: VirtualClock, **cost_s: float) -> None:
        self.samples = VirtualDataset(length, clock, **cost_s)

    def __iter__(self) -> Any:
        return (self.samples[index] for index in range(len(self.samples)))


def virtual_step(clock: VirtualClock, seconds: float) -> Any:
    """A consumer that spends ``seconds`` of wall time on ``clock``."""

    def step(batch: Any) -> None:
        clock.spend(blocked_s=seconds)

    return step


class ModelledWindows:
    """Stands in for ``run_window``: each configuration delivers the batches per second a
    model says, so a test of the search holds however loaded the machine is (throughput on
    real clocks is what ``benchmarks/bench_autotune.py`` measures).

    Args:
        rate: Batches per second of a configuration (the whole loop: reading and step).
        step_s: Seconds per batch the step takes (the rest of a batch's time is waiting).
        batch_bytes: Bytes of one batch.
        worker_bytes: Unique memory of one worker process, bytes.
    """

    def __init__(
        self,
        rate: Callable[[LoaderConfig], float],
        *,
        step_s: float = 0.0,
        batch_bytes: int = 1 << 10,
        worker_bytes: int = 32 << 20,
    ) -> None:
        self.rate, self.step_s = rate, step_s
        self.batch_bytes, self.worker_bytes = batch_bytes, worker_bytes

    def __call__(self, dataset: Any, batch_size: int, config: LoaderConfig, **_: Any) -> Window:
        if config.num_threads is not None:  # as the real window does
            dataset.num_threads = config.num_threads
        per_s = self.rate(config)
        workers = config.num_workers > 0
        measurement = Measurement(
            config=config,
            batches_per_s=per_s,
            spread=0.0,
            wait_s=max(0.0, 1 / per_s - self.step_s),
            step_s=self.step_s,
            startup_s=0.0,
            predicted_bytes=predict_bytes(config, self.batch_bytes, self.worker_bytes),
            worker_bytes=self.worker_bytes if workers else None,
            num_batches=10,
        )
        return Window(measurement, self.batch_bytes)

    def install(self, monkeypatch: Any) -> None:
        from fastdata.tune import _search  # noqa: PLC0415 - patched here only

        monkeypatch.setattr(_search, "run_window", self)


def passthrough(batch: Any) -> Any:
    """Collate for datasets whose ``__getitems__`` already returns a batch."""
    return batch


def sleep_step(seconds: float) -> Any:
    """A consumer of known cost."""

    def step(batch: Any) -> None:
        time.sleep(seconds)

    return step


def write_tiny_shards(root: Path, num_samples: int = 64, seed: int = 0) -> Path:
    """A one-shard set of ``(16, 16, 3)`` uint8 images and int64 labels under ``root``."""
    return write_image_shards(root, [num_samples], seed=seed)
