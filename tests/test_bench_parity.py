"""benchmarks/bench_parity.py: its photo set, the torchvision rule it reimplements, and a
whole ``--quick`` run."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fastdata._crop import random_boxes

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("bench_parity")


def test_the_pil_crop_rule_is_fastdatas_for_the_same_draws(bench: Any) -> None:
    rng = np.random.default_rng(0)
    heights = rng.integers(20, 400, 200)
    widths = rng.integers(20, 400, 200)
    widths[:5] = heights[:5] * 5  # no try fits: the clamped whole image
    draws = rng.random((200, 22))
    draws[:5, :10] = 0.999
    expected = random_boxes(heights, widths, bench.SCALE, bench.RATIO, draws)
    got = [
        bench.torchvision_box(int(h), int(w), d)
        for h, w, d in zip(heights, widths, draws, strict=True)
    ]
    assert np.array_equal(np.array(got), expected)


def test_quick_run_trains_every_path(bench: Any, tmp_path: Path) -> None:
    pytest.importorskip("skimage")
    args = bench.parse(["--quick", "--workdir", str(tmp_path)])
    results = bench.run(args)
    assert set(results["paths"]) == {"torchvision", "square", "keep24"}
    assert results["train_images"] == 16 and results["val_images"] == 4
    for row in results["paths"].values():
        assert 0.0 <= row["accuracy_mean"] <= 1.0
        assert row["train_images_per_s"] > 0
    train = sorted((tmp_path / "photos-4x5-scale0.25" / "train").rglob("*.jpg"))
    assert len(train) == 16 and len({p.parent.name for p in train}) == 4
