"""examples/stateful_resume.py: stop mid-epoch with workers, resume, nothing repeated or lost."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from tests.examples.conftest import NUM_SAMPLES, load_example, recorded


@pytest.fixture(scope="module")
def example() -> ModuleType:
    return load_example("stateful_resume")


@pytest.mark.parametrize("loader", ["torchdata", "fastdata"])
def test_stop_and_resume_with_workers(
    example: ModuleType,
    shards: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    loader: str,
) -> None:
    if loader == "torchdata":
        pytest.importorskip("torchdata.stateful_dataloader")
    common = [
        str(shards),
        "--loader",
        loader,
        "--batch-size",
        "8",
        "--num-workers",
        "2",
        "--checkpoint",
        str(tmp_path / "state.pt"),
    ]
    first_file, resumed_file = tmp_path / "first.jsonl", tmp_path / "resumed.jsonl"
    example.main([*common, "--stop-after", "5", "--record", str(first_file)])
    assert "stopped in epoch 0 after 5 steps" in capsys.readouterr().out
    example.main([*common, "--resume", "--record", str(resumed_file)])
    out = capsys.readouterr().out
    assert f"epoch 0: {NUM_SAMPLES - 40} samples" in out  # the rest of the epoch
    assert f"epoch 1: {NUM_SAMPLES} samples" in out  # then full epochs
    first, resumed = recorded(first_file), recorded(resumed_file)
    assert Counter(first[(0, 0)] + resumed[(0, 0)]) == Counter(range(NUM_SAMPLES))
    assert sorted(resumed[(1, 0)]) == list(range(NUM_SAMPLES))
