"""Shared fixtures and marker handling: `gpu` tests skip cleanly without CUDA."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch


# Markers, not ``item.keywords``: keywords also hold directory names, so every test under
# tests/gpu/ would count as `gpu`-marked.
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_dali = pytest.mark.skip(
        reason="needs NVIDIA DALI: pip install 'torch-fastdata[dali-cu13]' (or [dali-cu12])"
    )
    skip_ray = pytest.mark.skip(reason="needs Ray: pip install 'torch-fastdata[ray]'")
    has_cuda = torch.cuda.is_available()
    has_dali = importlib.util.find_spec("nvidia") is not None and (
        importlib.util.find_spec("nvidia.dali") is not None
    )
    has_ray = importlib.util.find_spec("ray") is not None
    for item in items:
        if item.get_closest_marker("gpu") is not None and not has_cuda:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("dali") is not None and not has_dali:
            item.add_marker(skip_dali)
        if item.get_closest_marker("ray") is not None and not has_ray:
            item.add_marker(skip_ray)


def _load_sample_tool() -> Any:
    """``tools/make_sample_dataset.py`` (not part of the package), loaded from its path."""
    path = Path(__file__).resolve().parents[1] / "tools" / "make_sample_dataset.py"
    spec = importlib.util.spec_from_file_location("make_sample_dataset", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # worker processes pickle its functions by module name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def sample_tool() -> Any:
    """The sample-dataset generator module (``make_sample_dataset``, ``make_image``)."""
    return _load_sample_tool()


@pytest.fixture
def sample_imagefolder(tmp_path: Path, sample_tool: Any) -> Path:
    """A tiny ImageFolder tree: 24 JPEGs of 64x48 pixels in 3 classes (``class_000``...)."""
    root = tmp_path / "images"
    sample_tool.make_sample_dataset(root, 24, num_classes=3, seed=0, image_size=(64, 48), workers=1)
    return root


DEMO_IMAGES = 320  # the documented examples' sample set: 5 batches of 64


def make_demo_workdir(root: Path, sample_tool: Any, write_out: Callable[[], Any]) -> Path:
    """The folder the README's and the guides' examples run in: ``demo-data/sample``
    (``DEMO_IMAGES`` JPEGs), ``out/`` written by ``write_out`` (the page's own
    preprocessing example, run in ``root``; it returns the summary) and ``out-jpeg/`` for
    the examples that read JPEG shards."""
    # here, not at the top: conftest loads for every test, and this needs h5py
    from fastdata.preprocess import PreprocessOptions, preprocess  # noqa: PLC0415

    sample_tool.make_sample_dataset(
        root / "demo-data" / "sample", DEMO_IMAGES, num_classes=3, seed=0, image_size=(64, 48)
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)
        assert write_out().num_processed == DEMO_IMAGES
        preprocess(
            "demo-data/sample",
            "out-jpeg/",
            PreprocessOptions(sizes=(256,), storage="jpeg"),
            workers=1,
            show_progress=False,
        )
    return root


def write_image_shards(
    root: Path, shard_sizes: Sequence[int], *, seed: int = 0, class_names: Sequence[str] = ()
) -> Path:
    """A shard set under ``root``: ``(16, 16, 3)`` uint8 images (random, from ``seed``) and
    int64 labels equal to the sample index, in shards of ``shard_sizes`` samples."""
    from fastdata.shards import FieldSpec, Manifest, ShardWriter, save_manifest  # noqa: PLC0415

    fields = [
        FieldSpec("image", "array", "uint8", (16, 16, 3), "HWC"),
        FieldSpec("label", "array", "int64"),
    ]
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    infos, index = [], 0
    for number, count in enumerate(shard_sizes):
        with ShardWriter(root / f"shard-{number:05d}.h5", fields) as writer:
            for _ in range(count):
                image = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
                writer.append({"image": image, "label": index})
                index += 1
            infos.append(writer.close())
    save_manifest(root, Manifest(fields=fields, shards=infos, class_names=list(class_names)))
    return root
