"""Timed windows over one DataLoader configuration: throughput, spread, memory."""

from __future__ import annotations

import gc
import math
import statistics
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import psutil
from torch.utils.data import DataLoader

from fastdata._batch import batch_nbytes
from fastdata.tune._loop import Tick, timed_steps

# Share of the window spent warming up (untimed) before the timed window starts.
_WARMUP_SHARE = 0.2
# A window keeps going until it holds at least this many timed batches (or the deadline).
_MIN_BATCHES = 6


@dataclass(frozen=True)
class LoaderConfig:
    """One point of the search space.

    Attributes:
        num_workers: DataLoader worker processes (0: batches are read in the calling process).
        prefetch_factor: Batches each worker keeps in flight; ``None`` when ``num_workers == 0``.
        num_threads: The dataset's ``num_threads`` (its in-process read pool), or ``None`` when
            the dataset has no such setting.
        pin_memory: Whether the DataLoader pins batches (only useful with CUDA).
    """

    num_workers: int
    prefetch_factor: int | None = None
    num_threads: int | None = None
    pin_memory: bool = False

    @property
    def label(self) -> str:
        """Short human description, e.g. ``"4 workers, prefetch 2"``."""
        if self.num_workers == 0:
            text = "in-process"
            if self.num_threads is not None:
                text += f", {self.num_threads} thread{'s' if self.num_threads != 1 else ''}"
        else:
            plural = "s" if self.num_workers != 1 else ""
            text = f"{self.num_workers} worker{plural}, prefetch {self.prefetch_factor}"
        return text + (", pinned" if self.pin_memory else "")

    def loader_kwargs(self, *, persistent_workers: bool) -> dict[str, Any]:
        """The DataLoader keyword arguments of this configuration (never ``batch_size``)."""
        kwargs: dict[str, Any] = {"num_workers": self.num_workers, "pin_memory": self.pin_memory}
        if self.num_workers > 0:
            kwargs["prefetch_factor"] = self.prefetch_factor
            kwargs["persistent_workers"] = persistent_workers
        return kwargs

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "prefetch_factor": self.prefetch_factor,
            "num_threads": self.num_threads,
            "pin_memory": self.pin_memory,
        }


@dataclass(frozen=True)
class Measurement:
    """What one timed window of one configuration delivered.

    Attributes:
        config: The configuration measured.
        batches_per_s: Batches per second through the whole loop (fetch and ``step``).
        spread: Standard error of ``batches_per_s`` from the per-batch loop times, batches/s.
        wait_s: Mean time per batch the loop waited for data, seconds.
        step_s: Mean time per batch spent in the consumer ``step``, seconds.
        startup_s: Time from creating the iterator to the first batch, seconds.
        predicted_bytes: Host memory this configuration is predicted to hold, bytes.
        worker_bytes: Largest unique memory (USS) of one worker process, bytes; ``None``
            without workers.
        num_batches: Batches timed (warm-up excluded).
    """

    config: LoaderConfig
    batches_per_s: float
    spread: float
    wait_s: float
    step_s: float
    startup_s: float
    predicted_bytes: int
    worker_bytes: int | None
    num_batches: int

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in self.__dict__.items() if k != "config"}
        data["config"] = self.config.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        fields = dict(data)
        fields["config"] = LoaderConfig(**fields["config"])
        return cls(**fields)


def predict_bytes(config: LoaderConfig, batch_bytes: int, worker_bytes: int) -> int:
    """Host memory a configuration holds: batches in flight plus the workers' own memory.

    In-process reading holds the batch being consumed and the one being read. Workers hold
    ``num_workers * prefetch_factor`` batches in shared memory plus the consumed one, and
    each worker its own unique memory; pinning keeps up to two more (pinned) copies.
    """
    if config.num_workers == 0:
        total = 2 * batch_bytes
    else:
        in_flight = config.num_workers * (config.prefetch_factor or 2)
        total = (in_flight + 1) * batch_bytes + config.num_workers * worker_bytes
    if config.pin_memory:
        total += 2 * batch_bytes
    return total


def _child_pids() -> set[int]:
    return {child.pid for child in psutil.Process().children(recursive=True)}


def _largest_worker_bytes(before: set[int]) -> int | None:
    """Largest unique memory among child processes started since ``before``."""
    largest: int | None = None
    for child in psutil.Process().children(recursive=True):
        if child.pid in before:
            continue
        try:
            info = child.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        size = int(getattr(info, "uss", info.rss))
        largest = size if largest is None else max(largest, size)
    return largest


@dataclass
class Window:
    """Raw result of :func:`run_window` before it becomes a :class:`Measurement`."""

    measurement: Measurement
    batch_bytes: int


def make_loader(dataset: Any, **kwargs: Any) -> DataLoader:
    """``DataLoader(dataset, **kwargs)``; for a fastdata dataset whose ``decode=`` decoder
    runs on whole batches in the training process (``nvjpeg``, ``dali``), its own
    ``dataset.loader(**kwargs)``, whose workers read the encoded bytes for it to decode."""
    if getattr(dataset, "batch_decode", None) is not None:
        return dataset.loader(**kwargs)
    return DataLoader(dataset, **kwargs)


def run_window(
    dataset: Any,
    batch_size: int,
    config: LoaderConfig,
    *,
    step: Callable[[Any], Any] | None,
    extra_kwargs: Mapping[str, Any],
    window_s: float,
    deadline: float,
    worker_bytes_prior: int,
) -> Window:
    """Iterate one DataLoader configuration and time a window after a warm-up.

    The first ``num_workers + 1`` batches (worker start-up, first file opens) and the first
    fifth of ``window_s`` (lazy initialisation, caches) are not timed. Epoch boundaries are:
    workers persist, as recommended, and refilling their pipeline is part of the cost of an
    epoch (it matters for datasets of few batches). The window ends once ``window_s`` has
    passed with at least a few batches timed, or at ``deadline`` (a ``perf_counter`` value).

    Raises:
        ValueError: The loader yields no batch at all.
    """
    if config.num_threads is not None:
        dataset.num_threads = config.num_threads
    kwargs = dict(extra_kwargs)
    kwargs.update(config.loader_kwargs(persistent_workers=config.num_workers > 0))
    with warnings.catch_warnings():
        # torch warns above os.cpu_count() workers; the caller chose max_workers knowingly.
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        loader = make_loader(dataset, batch_size=batch_size, **kwargs)
        return _time_loader(
            loader,
            batch_size=batch_size,
            config=config,
            step=step,
            window_s=window_s,
            deadline=deadline,
            worker_bytes_prior=worker_bytes_prior,
        )


def _time_loader(
    loader: DataLoader,
    *,
    batch_size: int,
    config: LoaderConfig,
    step: Callable[[Any], Any] | None,
    window_s: float,
    deadline: float,
    worker_bytes_prior: int,
) -> Window:
    """Time one window of ``loader`` (see :func:`run_window`) and size its workers."""
    before = _child_pids() if config.num_workers else set()
    sizes: list[int] = []
    ticks = timed_steps(
        loader, step, repeat=True, first=lambda batch: sizes.append(batch_nbytes(batch))
    )
    try:
        startup_s, waits, steps = _timed_window(
            ticks, skip=config.num_workers + 1, window_s=window_s, deadline=deadline
        )
        worker_bytes = _largest_worker_bytes(before) if config.num_workers else None
    finally:
        ticks.close()
        del ticks, loader
        gc.collect()
    if startup_s is None:
        raise ValueError(f"the loader yields no batch (batch_size={batch_size}): nothing to tune")
    batch_bytes = sizes[0]
    predicted = predict_bytes(
        config, batch_bytes, worker_bytes if worker_bytes is not None else worker_bytes_prior
    )
    measurement = _summarize(
        config,
        startup_s=startup_s,
        waits=waits,
        steps=steps,
        predicted_bytes=predicted,
        worker_bytes=worker_bytes,
    )
    return Window(measurement, batch_bytes)


def _timed_window(
    ticks: Iterator[Tick], *, skip: int, window_s: float, deadline: float
) -> tuple[float | None, list[float], list[float]]:
    """The start-up time and the per-batch wait and step times of the timed window.

    The first ``skip`` batches and those ending within the warm-up share of ``window_s``
    after the first batch are not kept. The window ends once it holds ``_MIN_BATCHES``
    batches and spans ``window_s``, or at ``deadline`` with at least two batches. The
    start-up time is ``None`` when the loader yields nothing.
    """
    waits: list[float] = []
    steps: list[float] = []
    startup_s: float | None = None
    warm_until = window_start = math.inf
    for tick in ticks:
        if startup_s is None:
            startup_s = tick.since_start_s
            warm_until = tick.fetched + _WARMUP_SHARE * window_s
        if skip > 0 or tick.done < warm_until:
            skip = max(0, skip - 1)
            continue
        if math.isinf(window_start):
            window_start = tick.fetched
        waits.append(tick.wait_s)
        steps.append(tick.step_s)
        enough = len(waits) >= _MIN_BATCHES and tick.done - window_start >= window_s
        if enough or (tick.done >= deadline and len(waits) >= 2):
            break
    return startup_s, waits, steps


def _summarize(
    config: LoaderConfig,
    *,
    startup_s: float,
    waits: list[float],
    steps: list[float],
    predicted_bytes: int,
    worker_bytes: int | None,
) -> Measurement:
    """A :class:`Measurement` from the window's per-batch wait and step times."""
    loops = [w + s for w, s in zip(waits, steps, strict=True)]
    # Standard error of the rate, from the per-batch loop times (delta method).
    mean_s = statistics.fmean(loops)
    spread = (statistics.stdev(loops) / mean_s) / math.sqrt(len(loops)) / mean_s
    return Measurement(
        config=config,
        batches_per_s=1 / mean_s,
        spread=spread,
        wait_s=statistics.fmean(waits),
        step_s=statistics.fmean(steps),
        startup_s=startup_s,
        predicted_bytes=predicted_bytes,
        worker_bytes=worker_bytes,
        num_batches=len(loops),
    )
