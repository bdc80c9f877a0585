"""Shared benchmark helpers: timing, environment metadata and JSON results.

Every ``bench_<topic>.py`` writes ``benchmarks/results/<topic>.json`` holding its figures
and :func:`environment` (machine, load, versions), so a number never travels without the
conditions it was taken under.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any, TypeVar

from fastdata._system import available_memory_bytes, usable_cpus

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parents[1]
T = TypeVar("T")


class Stopwatch:
    """Seconds elapsed inside a ``with timer() as t:`` block, in ``t.seconds``."""

    seconds: float = 0.0


@contextmanager
def timer() -> Iterator[Stopwatch]:
    """Time a block with ``time.perf_counter``."""
    watch = Stopwatch()
    started = time.perf_counter()
    try:
        yield watch
    finally:
        watch.seconds = time.perf_counter() - started


def timed(function: Callable[[], T]) -> tuple[T, float]:
    """``(function(), seconds it took)``."""
    with timer() as watch:
        result = function()
    return result, watch.seconds


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
        pass
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


def environment() -> dict[str, Any]:
    """Machine, load and package versions, for the JSON result."""
    packages = ("fastdata", "torch", "numpy", "h5py", "opencv-python-headless", "pillow")
    return {
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "usable_cpus": usable_cpus(),
        "available_memory_bytes": available_memory_bytes(),
        "load_average_1_5_15": list(os.getloadavg()),
        "git_commit": _git_commit(),
        "versions": {name: _version(name) for name in packages},
    }


def write_result(topic: str, results: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<topic>.json``: ``results`` plus :func:`environment`."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{topic}.json"
    path.write_text(
        json.dumps({"topic": topic, "results": results, "environment": environment()}, indent=1)
        + "\n"
    )
    return path
