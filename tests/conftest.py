"""Shared fixtures and marker handling: `gpu` tests skip cleanly without CUDA."""

from __future__ import annotations

import importlib.util

import pytest
import torch


# Markers, not ``item.keywords``: keywords also hold directory names, so every test under
# tests/gpu/ would count as `gpu`-marked.
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_dali = pytest.mark.skip(reason="needs NVIDIA DALI: pip install nvidia-dali-cuda130")
    skip_ray = pytest.mark.skip(reason="needs Ray: pip install 'fastdata[ray]'")
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
