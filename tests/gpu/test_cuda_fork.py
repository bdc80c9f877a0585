"""A DataLoader worker forked from a process using CUDA survives its first garbage
collection while the parent's garbage holds a CUDA tensor a side stream used (freeing one
records an event: a CUDA call, which aborts a forked child). ``gpu``-marked."""

from __future__ import annotations

import gc
import multiprocessing

import pytest
import torch

import fastdata  # noqa: F401 - registers the fork hook under test

pytestmark = pytest.mark.gpu


def _collect() -> None:
    gc.enable()
    gc.collect()


def test_a_forked_child_collects_without_freeing_an_inherited_cuda_tensor() -> None:
    side = torch.cuda.Stream()
    gc.collect()
    gc.disable()  # the cycle below stays garbage until the child collects
    try:
        tensor = torch.ones(1 << 20, device="cuda")
        with torch.cuda.stream(side):
            tensor.mul_(2)
        tensor.record_stream(side)
        cycle: dict[str, object] = {"tensor": tensor}
        cycle["self"] = cycle
        del tensor, cycle
        torch.cuda.synchronize()
        child = multiprocessing.get_context("fork").Process(target=_collect)
        child.start()
        child.join(60)
        assert child.exitcode == 0, f"the forked child ended with {child.exitcode}"
    finally:
        gc.enable()
        gc.collect()
