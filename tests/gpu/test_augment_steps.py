"""The colour, affine, erasing, policy and mixing device modules on CUDA: the same result
as the CPU transforms for one seed (bilinear warps and float blends within one level)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata import gpu, ops, transforms

DESCRIPTIONS = [
    (ops.ColorJitter(0.4, 0.4, 0.4, 0.1), transforms.ColorJitter, gpu.DeviceColorJitter),
    (ops.Equalize(), transforms.RandomEqualize, gpu.DeviceRandomEqualize),
    (ops.AutoContrast(), transforms.RandomAutocontrast, gpu.DeviceRandomAutocontrast),
    (ops.Sharpness(3.0), transforms.RandomAdjustSharpness, gpu.DeviceRandomAdjustSharpness),
    (ops.GaussianBlur(7), transforms.GaussianBlur, gpu.DeviceGaussianBlur),
    (ops.RandAugment(2, 9, 0.5), transforms.RandAugment, gpu.DeviceRandAugment),
    (ops.TrivialAugmentWide(), transforms.TrivialAugmentWide, gpu.DeviceTrivialAugmentWide),
    (ops.RandomErasing(p=1.0, value="random"), transforms.RandomErasing, gpu.DeviceRandomErasing),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("op", "cpu_type", "device_type"), DESCRIPTIONS, ids=repr)
def test_device_modules_on_cuda_match_the_cpu_transforms(
    op: ops.Operation, cpu_type: type, device_type: type
) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (32, 48, 64, 3), dtype=np.uint8)
    cpu_out = cpu_type.from_op(op, seed=5)(images.copy())
    cuda_in = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous().cuda()
    cuda_out = device_type.from_op(op, seed=5)(cuda_in).permute(0, 2, 3, 1).cpu().numpy()
    diff = np.abs(cuda_out.astype(int) - cpu_out)
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01


@pytest.mark.gpu
def test_mixing_on_cuda_matches_the_cpu() -> None:
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8)
    labels = torch.arange(16) % 10
    for mix_type in (transforms.MixUp, transforms.CutMix):
        on_cpu = mix_type(0.8, 10, seed=3)(images, labels)
        on_cuda = mix_type(0.8, 10, seed=3)(images.cuda(), labels.cuda())
        assert (on_cuda[0].cpu().int() - on_cpu[0].int()).abs().max() <= 1
        torch.testing.assert_close(on_cuda[1].cpu(), on_cpu[1])
