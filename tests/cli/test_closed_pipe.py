"""Output into a pipe whose reader has gone (``fastdata inspect OUT | head``): every
subcommand ends quietly with 141, as a Unix tool killed by SIGPIPE does; no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests.tune.synthetic import write_tiny_shards

REPO = Path(__file__).resolve().parents[2]


def _run_into_closed_pipe(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run ``python -m fastdata ARGS`` with stdout a pipe whose reading end is closed."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`head`) is gone before the first line: no race
    try:
        return subprocess.run(
            [sys.executable, "-m", "fastdata", *args], cwd=cwd, stdout=write_end,
            stderr=subprocess.PIPE, text=True, timeout=300, check=False,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
    finally:
        os.close(write_end)


@pytest.fixture(scope="module")
def shard_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("closed-pipe") / "out"
    out.mkdir()
    return write_tiny_shards(out, num_samples=8)


@pytest.mark.parametrize("command", [["inspect"], ["verify", "-q"]])
def test_reading_commands_end_quietly(command: list[str], shard_set: Path) -> None:
    done = _run_into_closed_pipe([*command, str(shard_set)], shard_set.parent)
    assert (done.returncode, done.stderr) == (141, "")


def test_preprocess_ends_quietly_after_the_job(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    (tmp_path / "src" / "a").mkdir(parents=True)
    for index in range(3):
        image = rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)
        cv2.imwrite(str(tmp_path / "src" / "a" / f"{index}.jpg"), image)
    done = _run_into_closed_pipe(
        ["preprocess", "src", "out", "--size", "8", "--workers", "1", "-q"], tmp_path
    )
    assert (done.returncode, done.stderr) == (141, "")
    assert (tmp_path / "out" / "index.json").is_file()  # the work itself was done


def test_an_error_still_reaches_stderr(tmp_path: Path) -> None:
    done = _run_into_closed_pipe(["inspect", str(tmp_path / "missing")], tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("fastdata inspect: error:") and "Traceback" not in done.stderr
