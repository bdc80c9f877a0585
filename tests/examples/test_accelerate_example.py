"""examples/accelerate_training.py: one process, mid-epoch resume, two processes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from tests.examples.conftest import EXAMPLES, NUM_SAMPLES, load_example, recorded, run_example

pytest.importorskip("accelerate")


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("accelerate_training")


def test_one_process_and_a_mid_epoch_resume(
    example: ModuleType, shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [
        str(shards),
        "--batch-size",
        "8",
        "--num-workers",
        "2",
        "--state-dir",
        str(tmp_path / "state"),
    ]
    first_file, resumed_file = tmp_path / "first.jsonl", tmp_path / "resumed.jsonl"
    example.main([*common, "--stop-after", "3", "--record", str(first_file)])
    assert "stopped after 3 steps" in capsys.readouterr().out
    example.main([*common, "--resume", "--record", str(resumed_file)])
    assert f"epoch 1: {NUM_SAMPLES} samples over 1 processes" in capsys.readouterr().out
    first, resumed = recorded(first_file), recorded(resumed_file)
    assert len(first[(0, 0)]) == 24
    assert Counter(first[(0, 0)] + resumed[(0, 0)]) == Counter(range(NUM_SAMPLES))
    assert sorted(resumed[(1, 0)]) == list(range(NUM_SAMPLES))


@pytest.mark.slow
def test_two_processes_read_every_sample_once(shards: Path, tmp_path: Path) -> None:
    out = run_example(
        [
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            str(EXAMPLES / "accelerate_training.py"),
            str(shards),
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--num-workers",
            "1",
            "--record",
            "seen.jsonl",
        ],
        tmp_path,
    )
    assert f"epoch 0: {NUM_SAMPLES} samples over 2 processes" in out
    seen = recorded(tmp_path / "seen.jsonl")
    ranks = [seen[(0, 0)], seen[(0, 1)]]
    assert len(ranks[0]) == len(ranks[1]) == NUM_SAMPLES // 2
    assert sorted(ranks[0] + ranks[1]) == list(range(NUM_SAMPLES))
