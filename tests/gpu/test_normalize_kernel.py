"""The one-pass Triton kernel of the device ``Normalize``.

On the CPU it runs under Triton's interpreter (in a subprocess: the interpreter is chosen
when the kernel is defined); on CUDA it is what ``Normalize`` launches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from fastdata.gpu import Normalize
from fastdata.gpu import _normalize_kernel as kernel_module
from fastdata.gpu._normalize_kernel import normalize_in_one_pass

ROOT = Path(__file__).resolve().parents[2]
MEAN, STD = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]

# Builds batches of every channel count, input and output memory order and output dtype,
# runs the kernels,
# and prints for each case whether it ran and how many values differ from the fused
# float32 multiply-add. The interpreter evaluates fma as a multiply, then an add, and
# truncates to bfloat16: those values are accepted as well (on CUDA the test below asks
# for the exact bytes).
_INTERPRETED = """
import itertools, json, torch
from fastdata.gpu import _normalize_kernel as kernel
from fastdata.gpu._normalize_kernel import normalize_in_one_pass
generator = torch.Generator().manual_seed(0)
results = []
for shape in [(4, 3, 17, 19), (3, 4, 8, 8), (2, 2, 3, 5)]:
    channels = shape[1]
    scale = torch.rand(channels, generator=generator) / 50 + 0.01
    bias = -torch.rand(channels, generator=generator) * 2
    orders = (torch.contiguous_format, torch.channels_last)
    for source_format, memory_format in itertools.product(orders, orders):
        images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
        images = images.contiguous(memory_format=source_format)
        levels = images.double()
        exact = levels * scale.double().view(1, -1, 1, 1) + bias.double().view(1, -1, 1, 1)
        unfused = images.float() * scale.view(1, -1, 1, 1) + bias.view(1, -1, 1, 1)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            out = torch.full(shape, float("nan"), dtype=dtype).contiguous(
                memory_format=memory_format
            )
            ran = normalize_in_one_pass(images, out, scale, bias)
            wide = out.clone()  # the same with 64-bit offsets (batches of over 2**31 values)
            kernel._WIDE_FROM = 0
            ran = ran and normalize_in_one_pass(images, wide, scale, bias)
            kernel._WIDE_FROM = 2**31
            ran = ran and torch.equal(wide, out)
            right = torch.zeros(shape, dtype=torch.bool)
            for value in (exact.float(), unfused):
                right |= out == value.to(dtype)
                if dtype == torch.bfloat16:  # the interpreter truncates to bfloat16
                    bits = value.view(torch.int32) & -65536
                    right |= out == bits.view(torch.float32).to(dtype)
            results.append([list(shape), f"{source_format} -> {memory_format}", str(dtype), ran,
                            int((~right).sum())])
print(json.dumps(results))
"""


def test_the_kernel_normalizes_every_layout_and_dtype_under_the_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_INTERPRETED)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) == 36
    for shape, memory_format, dtype, ran, wrong in results:
        assert ran, (shape, memory_format, dtype)
        assert wrong == 0, f"{wrong} wrong values for {shape} {memory_format} {dtype}"


def test_the_kernels_decline_a_batch_whose_rows_are_not_one_run_of_pixels() -> None:
    # a crop view of a larger batch: addcmul's strided loop does it
    images = torch.zeros((2, 3, 8, 9), dtype=torch.uint8)[:, :, 2:6, 1:6]
    out = torch.empty((2, 3, 4, 5), dtype=torch.float32)
    assert not normalize_in_one_pass(images, out, torch.ones(3), torch.zeros(3))


def test_a_kernel_that_cannot_launch_warns_once_and_leaves_the_work_to_addcmul(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    launches: list[tuple[int, ...]] = []

    class Unbuildable:  # what Triton raises where its launcher cannot be compiled
        def __getitem__(self, grid: tuple[int, ...]) -> Any:
            def launch(*args: Any, **kwargs: Any) -> None:
                launches.append(grid)
                raise RuntimeError("Failed to find C compiler")

            return launch

    monkeypatch.setattr(kernel_module, "_kernels", lambda: (Unbuildable(), Unbuildable()))
    monkeypatch.setattr(kernel_module, "_unavailable", [])
    images = torch.zeros((2, 3, 4, 5), dtype=torch.uint8)
    out = torch.full((2, 3, 4, 5), -1.0)
    with pytest.warns(RuntimeWarning, match="C compiler.*torch.addcmul normalizes instead"):
        assert not normalize_in_one_pass(images, out, torch.ones(3), torch.zeros(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning, no second try
        assert not normalize_in_one_pass(images, out, torch.ones(3), torch.zeros(3))
    assert len(launches) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("source", ["HWC", "CHW"])
def test_cuda_normalize_runs_the_kernel_with_the_fused_arithmetic(
    dtype: torch.dtype, channels_last: bool, source: str
) -> None:
    pytest.importorskip("triton")
    hwc = torch.randint(0, 256, (5, 31, 37, 3), dtype=torch.uint8, device="cuda")
    images = hwc if source == "HWC" else hwc.permute(0, 3, 1, 2).contiguous()
    normalize = Normalize(MEAN, STD, dtype=dtype, channels_last=channels_last).cuda()
    # Normalize's constants: float32 reciprocal of std, and -mean times it in float32
    scale = torch.tensor(STD).reciprocal()
    bias = -torch.tensor(MEAN) * scale
    levels = hwc.permute(0, 3, 1, 2).cpu().double()
    fused = levels * scale.double().view(1, 3, 1, 1) + bias.double().view(1, 3, 1, 1)
    launched: list[bool] = []

    def spy(*args: torch.Tensor) -> bool:
        launched.append(normalize_in_one_pass(*args))
        return launched[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("fastdata.gpu.normalize.normalize_in_one_pass", spy)
        out = normalize(images)
    assert launched == [True]
    assert torch.equal(out.cpu(), fused.float().to(dtype))  # one rounding to float32
    # the same bytes as the CPU path (the tables of the same arithmetic)
    assert torch.equal(out.cpu(), normalize.cpu()(images.cpu()))


@pytest.mark.gpu
def test_a_cuda_call_after_the_first_launches_one_kernel() -> None:
    # the constants of the statistics are kept: only the normalization runs on the device
    pytest.importorskip("triton")
    normalize = Normalize(MEAN, STD, dtype=torch.bfloat16, channels_last=True).cuda()
    images = torch.randint(0, 256, (4, 32, 32, 3), dtype=torch.uint8, device="cuda")
    normalize(images)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        normalize(images)
        torch.cuda.synchronize()
    kernels = [
        event.name
        for event in profile.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    ]
    assert len(kernels) == 1, kernels
