"""The one harness the benchmarks share: environment metadata, timing a loader, JSON results.

Every ``bench_<topic>.py`` run writes its figures and :func:`environment` (machine, load,
versions) to ``benchmarks/results/runs/<topic>-<UTC time>.json`` (git-ignored), so a number
never travels without the conditions it was taken under. The tracked
``benchmarks/results/<topic>.json``, the figures the README quotes, is replaced only by a
whole run given ``--publish`` (:func:`add_publish_argument`): a partial run (``--only``,
``--quick``) or an exploratory one never overwrites it.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from fastdata._system import available_memory_bytes, usable_cpus

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"
# Every run's own results (git-ignored).
RUNS_DIR = RESULTS_DIR / "runs"


def load_tool(name: str) -> Any:
    """A script from ``tools/`` loaded as a module (the tools are not a package)."""
    path = REPO_ROOT / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # worker processes pickle its functions by module name
    spec.loader.exec_module(module)
    return module


def images_per_second(
    loader: Iterable[Any], *, warm_epochs: int = 1, min_seconds: float = 2.0
) -> float:
    """Images per second over timed epochs after ``warm_epochs`` untimed ones.

    Timed epochs repeat (whole epochs) until ``min_seconds`` have passed, so that fast
    loaders over a small dataset are not timed on a few milliseconds. A batch is a tuple
    whose first item is the images (a tensor or a list of tensors).
    """
    for _ in range(warm_epochs):
        for _batch in loader:
            pass
    count = 0
    started = time.perf_counter()
    while count == 0 or time.perf_counter() - started < min_seconds:
        for batch in loader:
            count += len(batch[0])
    return count / (time.perf_counter() - started)


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        return platform.processor() or "unknown"
    return platform.processor() or "unknown"


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _gpu_name() -> str | None:
    torch = sys.modules.get("torch")  # only a benchmark that uses torch can have used a GPU
    if torch is None or not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_name())


def environment() -> dict[str, Any]:
    """Machine, load and package versions, for the JSON result."""
    packages = ("torch-fastdata", "torch", "numpy", "h5py", "opencv-python-headless",
                "simplejpeg", "pillow", "torchvision", "nvidia-dali-cuda120",
                "nvidia-dali-cuda130", "ray")  # fmt: skip
    return {
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "usable_cpus": usable_cpus(),
        "available_memory_bytes": available_memory_bytes(),
        "load_average_1_5_15": list(os.getloadavg()),
        "gpu": _gpu_name(),
        "git_commit": _git_commit(),
        # the compiled module (setup.py) is optional: the CPU Normalize is slower without it
        "fastdata_compiled_lookups": importlib.util.find_spec("fastdata._lookup") is not None,
        "versions": {name: _version(name) for name in packages},
    }


def images_per(
    epochs: Iterable[Any],
    batches: int,
    warmup: int,
    clocks: Sequence[Callable[[], float]],
    min_seconds: float = 0.0,
) -> list[float]:
    """Images per unit of each clock (``time.perf_counter``, a CPU-time reading) over
    ``batches`` batches, or more until ``min_seconds`` of wall time have passed, after
    ``warmup`` untimed ones (enough to start the workers and drain the batches they queued
    meanwhile). ``epochs`` is iterated again whenever an epoch ends; a batch is a tuple
    whose first item holds the images. The operating system counts a process's CPU time
    in ticks of 10 ms: a fast loader's pass of a fraction of a second reads several per
    cent off from it, which ``min_seconds`` bounds."""
    iterator = iter(epochs)

    def take() -> int:
        nonlocal iterator
        try:
            return len(next(iterator)[0])
        except StopIteration:
            iterator = iter(epochs)
            return len(next(iterator)[0])

    for _ in range(warmup):
        take()
    starts = [clock() for clock in clocks]
    began = time.perf_counter()
    count = taken = 0
    while taken < batches or time.perf_counter() - began < min_seconds:
        count += take()
        taken += 1
    spans = [clock() - start for clock, start in zip(clocks, starts, strict=True)]
    return [count / span if span > 0 else float("nan") for span in spans]


def tree_cpu_seconds() -> float:
    """CPU time (user + system) of this process and its live children: a loader's workers
    and DALI's threads. A clock for :func:`images_per` that other tenants of a shared
    machine move less than the wall clock."""
    import psutil  # noqa: PLC0415 - only the benchmarks that read CPU time need it

    total = 0.0
    processes = [psutil.Process()]
    processes += processes[0].children(recursive=True)
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:  # a child that ended meanwhile
            continue
        total += times.user + times.system
    return total


def best_of_passes(
    rows: dict[str, Callable[[], Any]],
    measure: Callable[[str, Any], float],
    repeats: int,
    *,
    unit: str = "images/s",
    in_process: str = "DALI",
) -> dict[str, float]:
    """The best of ``repeats`` round-robin passes of ``measure(name, rows[name]())`` per row,
    printed as they come; 0.0 for a row that failed in every pass (one line each time).

    Rows whose name starts with ``in_process`` are measured after every other row's
    passes: DALI's threads stay in this process, and a DataLoader forking its workers
    after them may crash.
    """
    import gc  # noqa: PLC0415 - only the benchmarks' main runs need it

    best = dict.fromkeys(rows, 0.0)
    groups = [
        [name for name in rows if not name.startswith(in_process)],
        [name for name in rows if name.startswith(in_process)],
    ]
    width = max(map(len, rows), default=0)
    for group in groups:
        for repeat in range(repeats):
            for name in group:
                where = f"[{repeat + 1}/{repeats}] {name:{width}s}"
                try:
                    measured = measure(name, rows[name]())
                except Exception as error:  # a peer's pipeline that does not run here
                    print(f"{where} failed: {type(error).__name__}: {str(error)[:200]}")
                    continue
                finally:
                    gc.collect()  # this row's workers end before the next row forks its own
                best[name] = max(best[name], measured)
                print(f"{where} {measured:10,.1f} {unit}", flush=True)
    return best


def add_publish_argument(parser: argparse.ArgumentParser) -> None:
    """``--publish``: also replace the tracked ``benchmarks/results/<topic>.json``."""
    parser.add_argument(
        "--publish",
        action="store_true",
        help="also replace the tracked benchmarks/results/<topic>.json (and chart) that the "
        "README quotes; refused for a partial run. Without it only "
        "benchmarks/results/runs/ (git-ignored) is written",
    )


@dataclass(frozen=True)
class Saved:
    """Where :func:`save` wrote: the run's own file, and the tracked one if published."""

    run: Path
    published: Path | None


def save(
    topic: str, results: dict[str, Any], *, partial: bool = False, publish: bool = False
) -> Saved:
    """Write ``results`` plus :func:`environment` for this run.

    Always to ``benchmarks/results/runs/<topic>-<UTC time>.json``; also to the tracked
    ``benchmarks/results/<topic>.json`` when ``publish`` and the run is whole (not
    ``partial``: a run selected by ``--only`` or shortened by ``--quick``).
    """
    document = {"topic": topic, "results": results, "environment": environment()}
    text = json.dumps(document, indent=1) + "\n"
    RUNS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    run = RUNS_DIR / f"{topic}-{stamp}.json"
    run.write_text(text)
    published = None
    if publish and partial:
        print(f"partial run: --publish ignored, benchmarks/results/{topic}.json left as it was")
    elif publish:
        published = RESULTS_DIR / f"{topic}.json"
        published.write_text(text)
    where = f"{run}" + (f" and {published}" if published else "")
    print(f"results: {where}")
    return Saved(run, published)
