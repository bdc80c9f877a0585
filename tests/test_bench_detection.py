"""benchmarks/bench_detection.py runs end to end in its quick mode (peers that do not
import here are skipped with a note) and writes its figures."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_measures_fastdata_and_its_kept_pixels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("skimage")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench = importlib.import_module("bench_detection")
    runs = tmp_path / "runs"
    monkeypatch.setattr(importlib.import_module("_harness"), "RUNS_DIR", runs)
    assert bench.main(["--quick", "--data", str(tmp_path / "data"), "--only", "fastdata"]) == 0
    (written,) = runs.glob("detection-*.json")
    results = json.loads(written.read_text())["results"]
    for name in (
        "fastdata, JPEG shards (crop in the decode)",
        "fastdata, JPEG shards (crop in the decode, main process, 2 threads)",
        "fastdata, uint8 shards",
        "fastdata, uint8 shards (main process, 2 threads)",
    ):
        assert results["images_per_s"][name] > 0
        assert results["kept_visible_object_pixels"][name] >= 0.95
    assert 3 <= results["boxes_per_image"] <= 6
    assert "| fastdata, JPEG shards (crop in the decode) |" in capsys.readouterr().out


def test_synthetic_boxes_lie_inside_their_images(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench = importlib.import_module("bench_detection")
    boxes, labels = bench.synthetic_boxes([(375, 500), (500, 333)] * 1000, seed=0)
    counts = [len(rows) for rows in boxes]
    assert min(counts) >= 1 and 4.3 <= np.mean(counts) <= 4.7
    for rows, (height, width) in zip(boxes, [(375, 500), (500, 333)] * 1000, strict=True):
        assert (rows[:, :2] >= 0).all() and (rows[:, 2] <= width).all()
        assert (rows[:, 3] <= height).all() and (rows[:, 2:] > rows[:, :2]).all()
    assert all(len(rows) == len(classes) for rows, classes in zip(boxes, labels, strict=True))
