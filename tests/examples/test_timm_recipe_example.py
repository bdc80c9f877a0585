"""examples/timm_recipe.py: the timm recipe trains on the tiny shard set, augmenting on
the CPU (in workers) and on the device."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.examples.conftest import load_example


@pytest.mark.parametrize("augment_on", ["cpu", "device"])
def test_the_timm_recipe_trains(
    shards: Path, capsys: pytest.CaptureFixture[str], augment_on: str
) -> None:
    example = load_example("timm_recipe")
    args = [str(shards), "--epochs", "2", "--batch-size", "8", "--image-size", "16"]
    losses = example.main([*args, "--num-workers", "2", "--augment-on", augment_on])
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)
    assert "epoch 1: 7 batches" in capsys.readouterr().out  # 60 samples, drop_last
