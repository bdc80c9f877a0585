"""The mixing device modules take the transforms' ``normalize=``: ``module(images, labels,
normalize=n)`` is ``n`` of the mixed uint8 images (within float tolerance of the two calls,
the same targets), in either layout, on CPU tensors (CUDA where there is one)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fastdata import gpu
from fastdata.transforms import CutMix, MixUp, RandomChoice

MODULES = [gpu.DeviceMixUp(0.8, 10, seed=0), gpu.DeviceCutMix(1.0, 10, seed=0)]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _batch(layout: str, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (9, 3, 12, 16), dtype=torch.uint8, generator=gen)
    if layout == "HWC":
        images = images.permute(0, 2, 3, 1).contiguous()
    return images.to(device), (torch.arange(9) % 10).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("mode", ["batch", "elem"])
@pytest.mark.parametrize("module_type", [gpu.DeviceMixUp, gpu.DeviceCutMix])
def test_normalize_gives_the_normalized_mixed_batch(
    module_type: type[nn.Module], mode: str, layout: str, device: str
) -> None:
    images, labels = _batch(layout, device)
    normalize = gpu.Normalize(
        [120.0, 110.0, 100.0], [60.0, 55.0, 50.0], layout=layout, channels_last=True
    ).to(device)
    alpha = 0.8 if module_type is gpu.DeviceMixUp else 1.0
    two_steps = module_type(alpha, 10, mode=mode, layout=layout, seed=3)
    one_call = module_type(alpha, 10, mode=mode, layout=layout, seed=3)
    for _ in range(3):  # the same draws, call after call
        mixed, targets = two_steps(images, labels)
        want = normalize(mixed)
        got, got_targets = one_call(images, labels, normalize=normalize)
        assert got.dtype == want.dtype == torch.float32 and got.stride() == want.stride()
        assert got.device == images.device
        torch.testing.assert_close(got, want)
        torch.testing.assert_close(got_targets, targets)
        positional, _ = module_type(alpha, 10, mode=mode, layout=layout, seed=5)(
            images, labels, normalize
        )
        assert positional.dtype == torch.float32


def test_the_module_and_the_transform_give_one_result_with_normalize() -> None:
    images, labels = _batch("CHW")
    normalize = gpu.Normalize([120.0, 110.0, 100.0], [60.0, 55.0, 50.0])
    for transform, module in (
        (MixUp(0.8, 10, seed=2), gpu.DeviceMixUp(0.8, 10, seed=2)),
        (CutMix(1.0, 10, seed=2), gpu.DeviceCutMix(1.0, 10, seed=2)),
    ):
        want, want_targets = transform(images, labels, normalize=normalize)
        got, got_targets = module(images, labels, normalize=normalize)
        torch.testing.assert_close(got, want)
        assert torch.equal(got_targets, want_targets)


def test_random_choice_of_modules_passes_normalize_on() -> None:
    images, labels = _batch("CHW")
    normalize = gpu.Normalize([120.0, 110.0, 100.0], [60.0, 55.0, 50.0])
    mix = RandomChoice(MODULES, seed=0)
    for _ in range(4):
        out, soft = mix(images, labels, normalize=normalize)
        assert out.dtype == torch.float32 and soft.shape == (9, 10)


@pytest.mark.parametrize("module", MODULES, ids=["mixup", "cutmix"])
def test_normalize_must_be_a_normalize(module: nn.Module) -> None:
    images, labels = _batch("CHW")
    with pytest.raises(
        TypeError, match=r"normalize must be a fastdata\.gpu\.Normalize or None, got function"
    ):
        module(images, labels, normalize=lambda x: x)
