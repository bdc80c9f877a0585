"""``profile``: where a training loop's time goes, and what to try next."""

from __future__ import annotations

import html
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader

from fastdata._progress import progress_bar
from fastdata._system import usable_cpus
from fastdata.tune._loop import timed_steps
from fastdata.tune._stages import StageTimes, synchronize, time_stages

# The loop is input-bound when it waits for data at least this share of the time.
INPUT_BOUND_SHARE = 0.2


@dataclass(frozen=True)
class ProfileReport:
    """What :func:`fastdata.profile` measured.

    Attributes:
        steps: Loop iterations timed (warm-up excluded).
        wait_s: Total time waiting for the next batch, seconds.
        step_s: Total time in ``step`` (device synchronized when on CUDA), seconds.
        num_workers: The loader's worker processes.
        stages: Per-batch fetch / collate / host-to-device times replayed in this process,
            or ``None`` for an iterable dataset.
        bound: ``"input"`` or ``"compute"``.
        input_kind: For an input-bound loop, what the reads spend most of their time on:
            ``"cpu"`` (their own work), ``"contention"`` (waiting for a CPU that other
            processes hold: a busy machine) or ``"io"`` (storage, network); ``None`` if
            unknown or compute-bound.
        advice: The next thing to try.
    """

    steps: int
    wait_s: float
    step_s: float
    num_workers: int
    stages: StageTimes | None
    bound: str
    input_kind: str | None
    advice: str

    @property
    def wait_fraction(self) -> float:
        """Share of the loop spent waiting for data."""
        total = self.wait_s + self.step_s
        return self.wait_s / total if total > 0 else 0.0

    @property
    def verdict(self) -> str:
        """``"input-bound (CPU)"``, ``"input-bound (CPU contention)"``,
        ``"input-bound (I/O)"``, ``"input-bound"`` (kind unknown) or ``"compute-bound"``."""
        if self.bound == "compute":
            return "compute-bound"
        kinds = {"cpu": " (CPU)", "contention": " (CPU contention)", "io": " (I/O)"}
        kind = kinds.get(self.input_kind or "", "")
        return f"input-bound{kind}"

    def _lines(self) -> list[str]:
        per_batch = 1e3 / max(1, self.steps)
        lines = [
            f"verdict: {self.verdict}",
            f"waiting for data {self.wait_fraction:.0%} of the loop: "
            f"{self.wait_s * per_batch:.1f} ms/batch waiting, "
            f"{self.step_s * per_batch:.1f} ms/batch in step "
            f"({self.steps} steps, {self.num_workers} workers)",
        ]
        if self.stages is not None:
            stage = self.stages
            copy = (
                "" if stage.to_device_s is None else f", to device {stage.to_device_s * 1e3:.1f} ms"
            )
            lines.append(
                f"per batch in one process: fetch {stage.fetch_s * 1e3:.1f} ms, collate "
                f"{stage.collate_s * 1e3:.1f} ms{copy}; of fetch+collate "
                f"{stage.cpu_share:.0%} on a CPU, {stage.contention_share:.0%} waiting for one "
                f"(other processes), {stage.io_share:.0%} waiting on storage or sleeping"
            )
        lines.append(f"next: {self.advice}")
        return lines

    def __str__(self) -> str:
        return "\n".join(self._lines())

    def _repr_html_(self) -> str:
        head, *rest = self._lines()
        items = "".join(f"<li>{html.escape(line)}</li>" for line in rest)
        return f"<div><p><b>fastdata.profile</b>: {html.escape(head)}</p><ul>{items}</ul></div>"


def _advice(
    bound: str,
    kind: str | None,
    loader: DataLoader,
    stages: StageTimes | None,
    step_per_batch_s: float,
) -> str:
    workers = loader.num_workers
    cpus = usable_cpus()
    if bound == "compute":
        tip = (
            "the input pipeline keeps up: speed up the step itself (mixed precision, "
            "channels_last, torch.compile, a larger batch)"
        )
        if torch.cuda.is_available() and not loader.pin_memory:
            tip += "; pin_memory=True with non_blocking copies overlaps the host-to-device copy"
        return tip
    if stages is not None:
        work_s = stages.fetch_s + stages.collate_s
        needed = max(1, math.ceil(work_s / max(step_per_batch_s, 1e-6)))
        sizing = (
            f"each batch costs {work_s * 1e3:.1f} ms to read and collate, so ~{needed} "
            f"workers keep the step fed"
        )
    else:
        needed, sizing = workers + 1, "the dataset is iterable, so stages were not replayed"
    if stages is not None and workers >= needed:
        return (
            f"the {workers} workers can supply enough ({sizing}): the wait is in the training "
            f"process receiving batches (one shared-memory copy each); read in-process with "
            f"threads (num_workers=0 and dataset.num_threads) or use larger batches"
        )
    if kind == "contention" and stages is not None:
        return (
            f"the machine is busy: the reads waited for a CPU "
            f"{stages.contention_share:.0%} of their time while other processes held the "
            f"{cpus} usable CPUs; more workers would wait as well: free CPUs (fewer jobs at "
            f"once) or cheapen the reads (fastdata preprocess, decode on the GPU)"
        )
    if kind == "io":
        return (
            f"the reads wait on storage ({sizing}): more workers or in-process threads than "
            f"CPUs (dataset.num_threads), a larger prefetch_factor, or cache the data in RAM "
            f"(RAMDataset)"
        )
    if workers < min(needed, cpus):
        return (
            f"raise num_workers from {workers} ({sizing}; {cpus} usable CPUs), "
            f"or run fastdata.autotune"
        )
    return (
        f"the workers are CPU-bound and the {cpus} usable CPUs are used ({sizing}): move work "
        f"offline (decode and resize once with fastdata preprocess), keep batches uint8 and "
        f"normalize or decode on the GPU"
    )


def profile(
    loader: DataLoader,
    step: Callable[[Any], Any],
    *,
    steps: int = 50,
    warmup: int = 3,
    device: str | torch.device | None = None,
    probe_batches: int = 3,
    progress: bool = True,
) -> ProfileReport:
    """Run ``step`` over ``loader`` and report what the loop waits on.

    The loop is timed as the user runs it: time in ``next(iterator)`` is waiting for data,
    time in ``step`` (followed by a CUDA synchronize when ``device`` is a CUDA device) is
    compute. Then ``probe_batches`` batches of the loader's own sampler are replayed in this
    process to time each stage (fetch, collate, copy to ``device``) and to tell whether the
    reads spend their time on a CPU, waiting for a CPU other processes hold (a busy machine:
    Linux run-queue delay), or waiting on storage.

    Args:
        loader: The DataLoader to profile (iterated once from the start).
        step: Called on every batch, e.g. a training step.
        steps: Iterations to time after the warm-up.
        warmup: Iterations run first and not timed (worker start-up, first file opens).
        device: Where batches go; enables the host-to-device stage and synchronizing.
        probe_batches: Batches replayed for the per-stage times.
        progress: Show a progress bar (tqdm.auto).

    Returns:
        The times, the verdict (``report.verdict``) and the next thing to try.

    Raises:
        TypeError: ``loader`` is not a DataLoader or ``step`` is not callable.
        ValueError: ``steps``/``warmup``/``probe_batches`` out of range, or the loader ends
            before a single step could be timed.

    Warns:
        UserWarning: The loader ended before ``warmup + steps`` batches; the report then
            covers the steps that were timed (``report.steps``).
    """
    _check_arguments(loader, step, steps=steps, warmup=warmup, probe_batches=probe_batches)
    target = torch.device(device) if device is not None else None
    wait_s, step_s, timed = _time_loop(
        loader, step, target, warmup=warmup, steps=steps, progress=progress
    )
    stages = time_stages(loader, probe_batches, target)
    bound, kind = _diagnose(wait_s, step_s, stages)
    return ProfileReport(
        steps=timed,
        wait_s=wait_s,
        step_s=step_s,
        num_workers=loader.num_workers,
        stages=stages,
        bound=bound,
        input_kind=kind,
        advice=_advice(bound, kind, loader, stages, step_s / timed),
    )


def _check_arguments(
    loader: Any, step: Any, *, steps: Any, warmup: Any, probe_batches: Any
) -> None:
    """Check ``profile``'s arguments at the boundary.

    Raises:
        TypeError: ``loader`` is not a DataLoader or ``step`` is not callable.
        ValueError: ``steps``/``warmup``/``probe_batches`` out of range.
    """
    if not isinstance(loader, DataLoader):
        raise TypeError(
            f"loader must be a torch.utils.data.DataLoader, got {type(loader).__name__}"
        )
    if not callable(step):
        raise TypeError(f"step must be callable, got {type(step).__name__}")
    for name, value, low in (
        ("steps", steps, 1),
        ("warmup", warmup, 0),
        ("probe_batches", probe_batches, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _time_loop(
    loader: DataLoader,
    step: Callable[[Any], Any],
    target: torch.device | None,
    *,
    warmup: int,
    steps: int,
    progress: bool,
) -> tuple[float, float, int]:
    """Total wait and step seconds over the timed steps, and how many were timed.

    Raises:
        ValueError: The loader ends within the warm-up.

    Warns:
        UserWarning: The loader ends before ``warmup + steps`` batches.
    """
    wait_s = step_s = 0.0
    timed = 0
    bar = progress_bar(total=warmup + steps, desc="profile", unit="step", enabled=progress)
    ticks = timed_steps(loader, step, synchronize=lambda: synchronize(target))
    try:
        for index, tick in enumerate(ticks):
            bar.update(1)
            if index >= warmup:
                wait_s += tick.wait_s
                step_s += tick.step_s
                timed += 1
            if index + 1 >= warmup + steps:
                break
    finally:
        ticks.close()
        bar.close()
    if timed == 0:
        raise ValueError(
            f"the loader ended before a step could be timed: it needs more than "
            f"warmup={warmup} batches"
        )
    if timed < steps:
        warnings.warn(
            f"profile: the loader ended after {warmup + timed} batches, so {timed} steps were "
            f"timed, not steps={steps} (warmup={warmup} came first); pass steps={timed} or "
            f"fewer, or a loader with more batches, to time what you asked",
            UserWarning,
            stacklevel=3,
        )
    return wait_s, step_s, timed


def _diagnose(wait_s: float, step_s: float, stages: StageTimes | None) -> tuple[str, str | None]:
    """``("input" | "compute", "cpu" | "contention" | "io" | None)``: what bounds the loop,
    and for an input-bound loop what the reads spend most of their time on."""
    bound = "input" if wait_s >= INPUT_BOUND_SHARE * (wait_s + step_s) else "compute"
    kind = stages.input_kind if bound == "input" and stages is not None else None
    return bound, kind
