"""``autotune``: measure DataLoader settings instead of guessing them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fastdata._progress import progress_bar
from fastdata._system import available_memory_bytes, usable_cpus
from fastdata.tune import _cache, _explain
from fastdata.tune._measure import Measurement
from fastdata.tune._search import Search
from fastdata.tune.result import TuneResult

# DataLoader arguments the tuner sets itself; the caller may pass any other.
_TUNED = ("batch_size", "num_workers", "persistent_workers", "pin_memory", "prefetch_factor")


def local_world_size() -> int:
    """Processes of this job on this host (``LOCAL_WORLD_SIZE`` set by torchrun; 1 otherwise).

    Raises:
        ValueError: ``LOCAL_WORLD_SIZE`` is set but is not a positive integer.
    """
    raw = os.environ.get("LOCAL_WORLD_SIZE", "").strip()
    if not raw:
        return 1
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"LOCAL_WORLD_SIZE must be a positive integer, got {raw!r}")
    return int(raw)


def default_max_workers() -> int:
    """Usable CPUs (cgroup quota, affinity) shared among this host's DDP processes."""
    return max(1, usable_cpus() // local_world_size())


def budget_bytes(ram_budget: float) -> int:
    """``ram_budget`` as bytes: a fraction of available memory if at most 1, else bytes.

    Raises:
        ValueError: ``ram_budget`` is not positive.
    """
    if isinstance(ram_budget, bool) or not isinstance(ram_budget, (int, float)):
        raise TypeError(f"ram_budget must be a number, got {type(ram_budget).__name__}")
    if not ram_budget > 0:
        raise ValueError(
            f"ram_budget must be a fraction of available memory in (0, 1] or a number of "
            f"bytes > 1, got {ram_budget!r}"
        )
    if ram_budget <= 1:
        return int(ram_budget * available_memory_bytes())
    return int(ram_budget)


def autotune(
    dataset: Any,
    batch_size: int,
    *,
    step: Callable[[Any], Any] | None = None,
    ram_budget: float = 0.5,
    time_budget_s: float = 60.0,
    max_workers: int | None = None,
    window_s: float | None = None,
    min_gain: float = 0.05,
    cache: bool | str | Path = False,
    progress: bool = True,
    **loader_kwargs: Any,
) -> TuneResult:
    """Find the DataLoader settings that deliver the most batches per second.

    The search starts from the single-process loop (time to read a batch versus time in
    ``step``), estimates how many workers would keep ``step`` fed, then measures around
    that estimate in short timed windows (warm-up discarded), moving while a step gains at
    least ``min_gain``. Datasets with a ``num_threads`` attribute (an in-process read pool)
    are also measured with ``num_workers=0`` and 1 … ``max_workers`` threads. The best
    worker count is then tried with ``prefetch_factor=4`` (and 8 if 4 paid off). Among
    configurations within ``min_gain`` of the fastest, the one with the fewest worker
    processes and least memory is recommended (the cheaper one is measured once more
    first), so in-process reading wins when it is as fast. The dataset's
    attributes (``num_threads``) are restored afterwards.

    Args:
        dataset: A map-style or iterable dataset.
        batch_size: Samples per batch.
        step: Optional consumer called on every batch (a training step or a stand-in of
            known cost); the tuner then stops adding workers once ``step`` is the bound.
        ram_budget: Host memory the loader may hold: a fraction of available memory
            (cgroup-aware) if at most 1, else bytes. Configurations predicted to exceed it
            (batches in flight plus measured worker memory) are never run nor recommended.
        time_budget_s: Wall time the search may take, seconds.
        max_workers: Most worker processes (and threads); default: usable CPUs (cgroup
            quota, affinity) divided by ``LOCAL_WORLD_SIZE``.
        window_s: Timed window per configuration, seconds; default from ``time_budget_s``.
        min_gain: Smallest relative throughput gain worth one more worker (0.05 = 5%).
        cache: ``True`` caches results in ``~/.cache/fastdata/autotune`` keyed by dataset
            fingerprint, batch size, host and these settings; a path caches there instead.
        progress: Show a progress bar (tqdm.auto).
        **loader_kwargs: Any other DataLoader argument (``collate_fn``, ``sampler``,
            ``drop_last`` …), used while measuring and kept in ``result.loader_kwargs``.

    Returns:
        The recommendation, its ``loader_kwargs`` and every measurement.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: An argument is out of range, or ``loader_kwargs`` names a tuned setting.
        InsufficientMemoryError: Two batches alone exceed the memory budget.
    """
    max_workers, window_s = _check_arguments(
        batch_size,
        max_workers=max_workers,
        time_budget_s=time_budget_s,
        min_gain=min_gain,
        window_s=window_s,
        loader_kwargs=loader_kwargs,
    )
    budget = budget_bytes(ram_budget)
    cache_dir = _cache_dir(cache)
    key = ""
    if cache_dir is not None:
        settings = {
            "ram_budget": ram_budget,
            "max_workers": max_workers,
            "min_gain": min_gain,
            "step": _cache.describe(step),
            **{name: _cache.describe(value) for name, value in loader_kwargs.items()},
        }
        key = _cache.cache_key(dataset, batch_size, settings)
        cached = _cache.load(cache_dir, key)
        if cached is not None:
            return TuneResult.from_dict(cached, extra_kwargs=loader_kwargs, from_cache=True)

    started = time.perf_counter()
    search = Search(
        dataset=dataset,
        batch_size=batch_size,
        step=step,
        extra_kwargs=dict(loader_kwargs),
        window_s=window_s,
        deadline=started + time_budget_s,
        budget=budget,
        bar=None,
    )
    base, chosen = _run_search(
        search, dataset, max_workers=max_workers, min_gain=min_gain, progress=progress
    )
    result = _result(
        search,
        base,
        chosen,
        max_workers=max_workers,
        min_gain=min_gain,
        has_step=step is not None,
        wall_time_s=time.perf_counter() - started,
    )
    if cache_dir is not None:
        _cache.store(cache_dir, key, result.to_dict())
    return result


def _check_arguments(
    batch_size: int,
    *,
    max_workers: int | None,
    time_budget_s: float,
    min_gain: float,
    window_s: float | None,
    loader_kwargs: dict[str, Any],
) -> tuple[int, float]:
    """Check ``autotune``'s arguments; returns ``max_workers`` and ``window_s`` with their
    defaults filled in.

    Raises:
        TypeError: ``batch_size`` or ``max_workers`` is not an int.
        ValueError: An argument is out of range, or ``loader_kwargs`` names a tuned setting.
    """
    for name, value in (("batch_size", batch_size), ("max_workers", max_workers)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    tuned = sorted(set(loader_kwargs) & set(_TUNED))
    if tuned:
        raise ValueError(
            f"loader_kwargs must not set {', '.join(tuned)}: autotune chooses "
            f"{', '.join(_TUNED)} itself"
        )
    if not time_budget_s > 0:
        raise ValueError(f"time_budget_s must be positive, got {time_budget_s!r}")
    if max_workers is None:
        max_workers = default_max_workers()
    elif max_workers < 0:
        raise ValueError(f"max_workers must be a non-negative integer, got {max_workers!r}")
    if not 0 <= min_gain < 1:
        raise ValueError(f"min_gain must be in [0, 1), got {min_gain!r}")
    if window_s is None:
        window_s = min(2.0, max(0.2, time_budget_s / 15))
    elif not window_s > 0:
        raise ValueError(f"window_s must be positive, got {window_s!r}")
    return max_workers, window_s


def _cache_dir(cache: bool | str | Path) -> Path | None:
    """Where results are cached: the default directory for ``True``, none for ``False``."""
    if cache is True:
        return _cache.default_cache_dir()
    if cache is False:
        return None
    return Path(cache)


def _run_search(
    search: Search, dataset: Any, *, max_workers: int, min_gain: float, progress: bool
) -> tuple[Measurement, Measurement]:
    """Run the search with a progress bar; returns the baseline and the chosen measurement.

    The dataset's attributes are put back afterwards: setting ``num_threads`` may go
    through a property (``None`` meaning "automatic"), so restoring the instance
    attributes themselves puts back exactly what was there.
    """
    has_threads = hasattr(dataset, "num_threads")
    attributes = dict(vars(dataset)) if hasattr(dataset, "__dict__") else None
    pin = torch.cuda.is_available()
    estimated_trials = 1 + (4 if max_workers else 0) + (2 if has_threads and max_workers > 1 else 0)
    bar = progress_bar(total=estimated_trials, desc="autotune", unit="config", enabled=progress)
    search.bar = bar
    try:
        base = search.run(max_workers=max_workers, min_gain=min_gain, threads=has_threads, pin=pin)
        chosen = search.choose(min_gain) or base
    finally:
        if attributes is not None:
            vars(dataset).clear()
            vars(dataset).update(attributes)
        bar.total = bar.n
        bar.close()
    return base, chosen


def _result(
    search: Search,
    base: Measurement,
    chosen: Measurement,
    *,
    max_workers: int,
    min_gain: float,
    has_step: bool,
    wall_time_s: float,
) -> TuneResult:
    """The :class:`TuneResult` of a finished search, with its explanation."""
    limited_by, reason = _explain.limit(search, chosen, base, max_workers, has_step)
    result = TuneResult(
        recommended=chosen.config,
        measurements=list(search.measured.values()),
        batch_size=search.batch_size,
        batch_bytes=search.batch_bytes,
        worker_bytes=search.worker_bytes,
        budget_bytes=search.budget,
        max_workers=max_workers,
        limited_by=limited_by,
        explanation="",
        wall_time_s=wall_time_s,
        extra_kwargs=dict(search.extra_kwargs),
    )
    result.explanation = _explain.paragraph(result, base, reason, min_gain)
    return result
