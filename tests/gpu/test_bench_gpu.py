"""The CPU-side logic of benchmarks/bench_gpu.py: both copy paths measured on equal terms,
and the prefetcher built once, outside the timed region."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from fastdata.gpu import DevicePrefetcher, Normalize

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_gpu.py"


@pytest.fixture(scope="module")
def bench() -> Any:
    sys.path.insert(0, str(BENCH.parent))
    try:
        spec = importlib.util.spec_from_file_location("bench_gpu", BENCH)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH.parent))
    return module


def test_both_paths_pin_on_equal_terms(bench: Any) -> None:
    images = torch.randint(0, 256, (2, 8, 8, 3), dtype=torch.uint8)
    pinned: list[tuple[torch.dtype, int]] = []

    def pin(tensor: torch.Tensor) -> torch.Tensor:  # stands for Tensor.pin_memory
        pinned.append((tensor.dtype, tensor.numel()))
        return tensor.clone()

    normalize = Normalize(bench.MEAN, bench.STD, layout="HWC")
    paths = bench.copy_paths(images, torch.device("cpu"), normalize, normalize, pin)
    assert sorted(pinned, key=str) == sorted(
        [(torch.uint8, images.numel()), (torch.float32, images.numel())], key=str
    )  # the pre-pinned buffers, made before any timing
    expected = normalize(images)
    for name, path in paths.items():
        pinned.clear()
        torch.testing.assert_close(path(), expected)
        if name.endswith("_pin_per_call"):  # each path pins what it copies, every call
            dtype = torch.float32 if name.startswith("float") else torch.uint8
            assert pinned == [(dtype, images.numel())], name
        else:
            assert pinned == [], name


def test_prefetcher_is_built_once_outside_the_timing(
    bench: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[int] = []

    class Counting(DevicePrefetcher):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(1)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(bench, "DevicePrefetcher", Counting)
    normalize = Normalize(bench.MEAN, bench.STD, layout="HWC")
    work = torch.randn(4, 4)
    batches = [torch.randint(0, 256, (1, 4, 4, 3), dtype=torch.uint8) for _ in range(2)]
    out = bench.overlap_part(
        batches,
        torch.device("cpu"),
        normalize,
        bench._synthetic_step(work, 1),
        steps=4,
        repeat=3,
        sync=None,
    )
    assert built == [1]
    assert set(out) >= {"compute_only_s", "serial_s", "prefetched_s", "hidden_fraction"}


def test_script_runs_its_host_part_without_cuda(
    bench: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is present: the device half would run")
    saved: list[str] = []
    monkeypatch.setattr(bench, "save", lambda topic, results, **_: saved.append(topic) or "x.json")
    assert bench.main(["--batch", "2", "--size", "8", "--repeat", "1"]) == 0
    assert saved == ["gpu"]


def test_copy_overlap_builds_its_prefetcher_once_and_normalizes_in_the_step(
    bench: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    built: list[object] = []

    class Counting(DevicePrefetcher):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            built.append(kwargs.get("transform"))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(bench, "DevicePrefetcher", Counting)
    normalized: list[torch.dtype] = []

    def step(batch: torch.Tensor) -> torch.Tensor:
        normalized.append(batch.dtype)  # the step gets the normalized batch
        return batch

    normalize = Normalize(bench.MEAN, bench.STD, layout="HWC")
    batches = [torch.randint(0, 256, (1, 4, 4, 3), dtype=torch.uint8) for _ in range(2)]
    out = bench.copy_overlap_part(
        batches, torch.device("cpu"), normalize, step, steps=4, repeat=2, sync=None
    )
    assert built == [None]  # the copy alone on the prefetcher
    assert set(normalized) == {torch.float32}
    assert 0.0 <= out["hidden_fraction"] <= 1.0


def test_device_rates_run_on_any_device(bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    rates_module = sys.modules["_gpu_rates"]
    monkeypatch.setattr(rates_module.torch.cuda, "synchronize", lambda: None)
    rates = rates_module.device_rates(torch.device("cpu"), batch=2, repeat=1)
    assert set(rates) == {
        *(
            f"{name}{peer}_img_s"
            for name in ("normalize_bf16", "normalize_f32", "normalize_f32_planar")
            for peer in ("", "_addcmul")
        ),
        "augment_img_s",
        "augment_heavy_img_s",
        "prefetch_pageable_img_s",
    }
    assert all(rate > 0 for rate in rates.values())
    photos = rates_module.photo_jpegs(2)
    assert [data[:2] for data in photos] == [b"\xff\xd8"] * 2
