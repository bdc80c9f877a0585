"""Where torchvision imports: the colour kernels against ``torchvision.transforms.v2``'s
functional ops on uint8 tensors with the same parameters (skipped without torchvision;
PIL, which these follow, is the reference that always runs: test_colour.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from fastdata.transforms._kernels import CPU_KERNELS

v2 = pytest.importorskip("torchvision.transforms.v2.functional")

# torchvision's grey (0.2989 R + 0.587 G + 0.114 B) and its unrounded contrast mean put
# grayscale, saturation and contrast 1 level from PIL's definitions, which fastdata follows
# (measured: every other op equal).
TOLERANCE = 1


def _images() -> np.ndarray:
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:32, 0:40]
    base = np.stack([xx * 6, yy * 7, (xx + yy) * 3], axis=-1)
    return np.clip(base[None] + rng.normal(0, 30, (4, 32, 40, 3)), 0, 255).astype(np.uint8)


CASES: list[tuple[str, dict[str, Any], Callable[[torch.Tensor], torch.Tensor]]] = [
    ("brightness", {"factor": 1.7}, lambda t: v2.adjust_brightness(t, 1.7)),
    ("contrast", {"factor": 0.4}, lambda t: v2.adjust_contrast(t, 0.4)),
    ("saturation", {"factor": 1.8}, lambda t: v2.adjust_saturation(t, 1.8)),
    ("sharpness", {"factor": 2.5}, lambda t: v2.adjust_sharpness(t, 2.5)),
    ("hue", {"factor": 0.3}, lambda t: v2.adjust_hue(t, 0.3)),
    ("posterize", {"bits": 3}, lambda t: v2.posterize(t, 3)),
    ("solarize", {"threshold": 100}, lambda t: v2.solarize(t, 100)),
    ("equalize", {}, v2.equalize),
    ("autocontrast", {}, v2.autocontrast),
    ("invert", {}, v2.invert),
    ("grayscale", {}, lambda t: v2.rgb_to_grayscale(t, num_output_channels=3)),
]


@pytest.mark.parametrize(("name", "params", "reference"), CASES, ids=[c[0] for c in CASES])
def test_colour_kernels_match_torchvision(
    name: str, params: dict[str, Any], reference: Callable[[torch.Tensor], torch.Tensor]
) -> None:
    images = _images()
    per_sample = {key: np.full(len(images), value) for key, value in params.items()}
    ours, _ = CPU_KERNELS[name](images.copy(), per_sample, {}, [])
    theirs = reference(torch.from_numpy(images).permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
    diff = np.abs(ours.astype(int) - theirs.numpy().astype(int))
    assert diff.max() <= TOLERANCE, f"{name}: max difference {diff.max()}"


def test_gaussian_blur_matches_torchvision() -> None:
    images = _images()
    options = {"kernel_size": (5, 5)}
    ours, _ = CPU_KERNELS["blur"](images.copy(), {"sigma": np.full(4, 1.3)}, options, [])
    theirs = v2.gaussian_blur(torch.from_numpy(images).permute(0, 3, 1, 2), [5, 5], [1.3, 1.3])
    diff = np.abs(ours.astype(int) - theirs.permute(0, 2, 3, 1).numpy().astype(int))
    assert diff.max() <= 1
