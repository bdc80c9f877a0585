"""benchmarks/bench_ram_jpeg.py builds its photo set without a download and compares
loaders that give the same output."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest
import simplejpeg

ROOT = Path(__file__).resolve().parents[1]


def test_photo_set_and_the_naive_loader_match_the_datasets_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("skimage")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench = importlib.import_module("bench_ram_jpeg")
    paths = bench.build_photo_set(tmp_path / "photos", 4)
    sizes = {simplejpeg.decode_jpeg_header(path.read_bytes())[:2] for path in paths}
    assert sizes == {(375, 500), (500, 375), (333, 500), (360, 480)}
    from fastdata import RAMDataset  # noqa: PLC0415

    dataset = RAMDataset(paths, [0, 1, 2, 3], bench.eval_transform(), show_progress=False)
    images, _ = dataset.__getitems__([0, 1, 2, 3])
    for train in (False, True):
        naive = bench.PilSamples(paths, train=train)
        image, index = naive[1]
        assert image.shape == images.shape[1:] and index == 1
    naive_eval = bench.PilSamples(paths, train=False)[0][0].numpy().astype(np.int16)
    assert np.abs(naive_eval - images[0].numpy()).mean() < 4  # the same crop, other kernels
