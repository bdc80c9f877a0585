"""A tiny shard set whose labels are the sample indices, and a way to run the examples."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import write_image_shards

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
SHARD_SIZES = (13, 9, 17, 8, 13)  # 60 samples, uneven shards
NUM_SAMPLES = sum(SHARD_SIZES)


@pytest.fixture(scope="session")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``(16, 16, 3)`` uint8 images; label ``i`` for sample ``i`` (60 classes)."""
    root = tmp_path_factory.mktemp("examples") / "shards"
    class_names = [f"c{i}" for i in range(NUM_SAMPLES)]
    return write_image_shards(root, SHARD_SIZES, class_names=class_names)


def run_example(args: list[str], cwd: Path, timeout_s: float = 300) -> str:
    """Run ``python examples/<args>`` as a user would; return its stdout (asserts success).

    Temporary files go to ``cwd`` (a test's ``tmp_path``): torchrun leaves its log folder.
    """
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore", "TMPDIR": str(cwd)}
    done = subprocess.run(
        [sys.executable, *args],
        check=False,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` (to call its ``main`` in this process: no re-import)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recorded(path: Path) -> dict[tuple[int, int], list[int]]:
    """``{(epoch, rank): labels in the order read}`` from an example's ``--record`` file."""
    seen: dict[tuple[int, int], list[int]] = defaultdict(list)
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        seen[(entry["epoch"], entry["rank"])] += entry["labels"]
    return dict(seen)
