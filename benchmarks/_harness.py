"""The small harness the benchmarks share: machine metadata, timing a loader, JSON results.

(Written on the ``datasets`` branch; no shared harness existed when it was needed.)
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastdata import __version__
from fastdata._system import usable_cpus

RESULTS = Path(__file__).resolve().parent / "results"


def load_tool(name: str) -> Any:
    """A script from ``tools/`` loaded as a module (the tools are not a package)."""
    path = Path(__file__).resolve().parents[1] / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # worker processes pickle its functions by module name
    spec.loader.exec_module(module)
    return module


def machine() -> dict[str, Any]:
    """What the figures were measured on (they compare only within one run)."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "fastdata": __version__,
        "commit": commit,
        "cpus": usable_cpus(),
        "load_average_1min": os.getloadavg()[0],
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


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


def save(name: str, results: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<name>.json`` with the machine metadata."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **results}, indent=1))
    return path
