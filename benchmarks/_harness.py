"""Tiny shared benchmark harness: timing, machine metadata, JSON results."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

import fastdata
from fastdata._system import usable_cpus

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine_info() -> dict[str, Any]:
    """What the figures were measured on."""
    info: dict[str, Any] = {
        "when_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "usable_cpus": usable_cpus(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "torch": torch.__version__,
        "fastdata": fastdata.__version__,
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }
    return info


def time_call(
    fn: Callable[[], object],
    *,
    repeat: int = 5,
    warmup: int = 1,
    sync: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Seconds per call of ``fn``: median and minimum of ``repeat`` timed calls.

    ``sync`` (e.g. ``torch.cuda.synchronize``) runs before each clock read, so
    asynchronous device work is counted.
    """
    for _ in range(warmup):
        fn()
    if sync is not None:
        sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        if sync is not None:
            sync()
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "min_s": min(times), "repeat": repeat}


def write_results(name: str, results: dict[str, Any], path: str | Path | None = None) -> Path:
    """Write ``{"machine": ..., "results": ...}`` as JSON (default ``results/<name>.json``)."""
    out = Path(path) if path is not None else RESULTS_DIR / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "machine": machine_info(), "results": results}
    out.write_text(json.dumps(payload, indent=1) + "\n")
    return out
