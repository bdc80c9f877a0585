"""Why the tuner recommends what it does: the limit it hit and a one-paragraph explanation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata._system import format_bytes
from fastdata.tune._measure import LoaderConfig, Measurement

if TYPE_CHECKING:
    from fastdata.tune._search import Search
    from fastdata.tune.result import TuneResult

# The loop counts as consumer-bound when ``step`` takes at least this share of it.
CONSUMER_SHARE = 0.7


def _parallelism(config: LoaderConfig) -> int:
    return config.num_workers or (config.num_threads or 1)


def limit(
    search: Search, chosen: Measurement, base: Measurement, max_workers: int, has_step: bool
) -> tuple[str, str]:
    """``(limited_by, sentence)``: what stopped the search at ``chosen`` (see ``TuneResult``)."""
    loop_s = chosen.wait_s + chosen.step_s
    if has_step and chosen.step_s >= CONSUMER_SHARE * loop_s:
        return "consumer", (
            f"The step is the bound: it takes {chosen.step_s / loop_s:.0%} of the loop, so more "
            f"workers would only cost memory."
        )
    wanted = [
        (config, predicted)
        for config, predicted in search.refused
        if config.num_workers > chosen.config.num_workers
        or (
            config.num_workers == 0 == chosen.config.num_workers
            and _parallelism(config) > _parallelism(chosen.config)
        )
    ]
    if wanted:
        config, predicted = min(wanted, key=lambda item: item[1])
        worker = format_bytes(search.worker_bytes_guess())
        return "memory", (
            f"Memory, not CPU, is the limit: {config.label} would hold about "
            f"{format_bytes(predicted)}, over the budget of {format_bytes(search.budget)} "
            f"(a batch is {format_bytes(search.batch_bytes)}, a worker about {worker})."
        )
    if search.out_of_time:
        return "time-budget", (
            "The search stopped at its time budget before it converged; a larger "
            "time_budget_s gives a firmer answer."
        )
    if _parallelism(chosen.config) >= max_workers >= 1 and chosen is not base:
        plural = "s" if max_workers != 1 else ""
        return "cpus", (
            f"Throughput grew up to the {max_workers} usable CPU{plural} (cgroup quota, "
            f"affinity and LOCAL_WORLD_SIZE counted): more CPUs, or cheaper samples "
            f"(decode and resize offline with fastdata preprocess), are the way to go faster."
        )
    if max_workers == 0 or (max_workers == 1 and chosen is base):
        return "cpus", (
            "With a single usable CPU, worker processes only add copies and memory; "
            "reading in the training process is as fast."
        )
    return "no-gain", (
        "More parallelism stopped paying off: the training process (receiving and "
        "collating batches) or the storage is the bound."
    )


def paragraph(result: TuneResult, base: Measurement, reason: str, min_gain: float) -> str:
    """The one-paragraph explanation of ``result``."""
    best = result.best
    parts = [
        f"Reading one batch of {result.batch_size} ({format_bytes(result.batch_bytes)}) takes "
        f"{base.wait_s * 1e3:.1f} ms in the training process"
        + (f", and the step {base.step_s * 1e3:.1f} ms." if base.step_s > 1e-4 else "."),
        f"{best.config.label.capitalize()} delivers {best.batches_per_s:.1f} ± "
        f"{best.spread:.1f} batches/s ({best.batches_per_s * result.batch_size:,.0f} samples/s),"
        f" {best.batches_per_s / base.batches_per_s:.1f}x the num_workers=0 loop.",
        reason,
    ]
    if best.config.num_workers == 0 and (best.config.num_threads or 0) > 1:
        parts.append(
            f"In-process threads are recommended over worker processes: they are the fastest "
            f"(or within {min_gain:.0%} of it) and avoid the workers' per-batch shared-memory "
            f"copy and their memory."
        )
    elif best.config.num_workers == 0:
        if result.max_workers >= 1:
            parts.append("num_workers=0: worker processes did not pay off for this dataset.")
    else:
        parts.append(
            f"persistent_workers=True saves the {best.startup_s:.2f} s worker start-up "
            f"measured, once per epoch."
        )
    parts.append(
        f"{len(result.measurements)} configurations measured in {result.wall_time_s:.0f} s."
    )
    return " ".join(parts)
