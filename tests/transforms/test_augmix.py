"""AugMix: its draws follow torchvision's distribution (statistical tests over many
draws), its magnitudes map as torchvision's tables do, the chains and the blend match a
PIL reference, every op runs at both ends of the severity, and one seed gives one result
on the CPU and on the device."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageOps

from fastdata import gpu, ops, transforms
from fastdata._draws import dirichlet_from_uniform
from fastdata._ops_augmix import AUGMIX_OPS, NUM_BINS, PARTIAL_OPS, augmix_values
from fastdata.gpu._kernels import DEVICE_KERNELS
from fastdata.transforms._kernels import CPU_KERNELS

stats = pytest.importorskip("scipy.stats")

NAMES = [spec[0] for spec in AUGMIX_OPS]


def _photo(height: int = 24, width: int = 32, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 6, yy * 7, (xx + yy) * 3], axis=-1)
    return np.clip(base + rng.normal(0, 20, (height, width, 3)), 0, 255).astype(np.uint8)


def _torchvision_draws(count: int, severity: int, width: int, all_ops: bool, seed: int) -> dict:
    """torchvision's AugMix sampling (transforms.v2.AugMix.forward), per chain, in Python."""
    rng = random.Random(seed)
    op_count = len(AUGMIX_OPS) if all_ops else PARTIAL_OPS
    drawn: dict[str, list] = {"ops": [], "bins": [], "negated": [], "depths": []}
    for _ in range(count * width):
        depth = rng.randint(1, 3)  # torch.randint(low=1, high=4)
        drawn["depths"].append(depth)
        for _ in range(depth):
            op = rng.randrange(op_count)
            drawn["ops"].append(op)
            drawn["bins"].append(rng.randrange(severity))  # torch.randint(severity, ())
            if AUGMIX_OPS[op][2]:
                drawn["negated"].append(rng.random() <= 0.5)
    return {key: np.array(value) for key, value in drawn.items()}


@pytest.mark.parametrize("all_ops", [True, False])
def test_draws_follow_torchvisions_distribution(all_ops: bool) -> None:
    op = ops.AugMix(severity=4, mixture_width=3, alpha=0.7, all_ops=all_ops)
    count = 6_000
    draws = np.random.default_rng(2).random((count, op.draws_per_sample))
    chosen, bins, negate, weights = op.plan(draws)
    reference = _torchvision_draws(count, 4, 3, all_ops, seed=0)
    applied = chosen >= 0
    # ops uniform over torchvision's set (13, or its 9 without the enhance ops)
    observed = np.bincount(chosen[applied], minlength=op.op_count)
    assert len(observed) == (13 if all_ops else 9)
    assert stats.chisquare(observed).pvalue > 1e-3
    assert stats.chisquare(np.bincount(reference["ops"], minlength=op.op_count)).pvalue > 1e-3
    # magnitude bins uniform below the severity; signs even
    assert stats.chisquare(np.bincount(bins[applied], minlength=4)).pvalue > 1e-3
    assert bins.max() == 3
    signed = np.array([spec[2] for spec in AUGMIX_OPS])[chosen[applied]]
    negated = negate[applied][signed]
    assert stats.binomtest(int(negated.sum()), negated.size, 0.5).pvalue > 1e-3
    assert abs(negated.mean() - reference["negated"].mean()) < 0.02
    # depths 1 to 3 per chain, uniformly, as torchvision's
    depths = applied.sum(axis=-1).ravel()
    assert set(np.unique(depths)) == {1, 2, 3}
    table = [np.bincount(depths)[1:], np.bincount(reference["depths"])[1:]]
    assert stats.chi2_contingency(table).pvalue > 1e-3
    # ops fill each chain from its start
    assert np.all(np.diff(applied.astype(int), axis=-1) <= 0)
    # the original's weight ~ Beta(alpha, alpha); the chains' Dirichlet times the rest
    assert stats.kstest(weights[:, 0], stats.beta(0.7, 0.7).cdf).pvalue > 1e-3
    assert np.allclose(weights.sum(axis=1), 1.0)
    share = weights[:, 1] / (1 - weights[:, 0])  # a Dirichlet marginal: Beta(a, 2a)
    assert stats.kstest(share, stats.beta(0.7, 1.4).cdf).pvalue > 1e-3


def test_fixed_chain_depth_applies_every_link() -> None:
    op = ops.AugMix(chain_depth=2, mixture_width=4)
    assert op.draws_per_sample == 2 + 4 * (1 + 3 * 2)
    chosen = op.plan(np.random.default_rng(0).random((50, op.draws_per_sample)))[0]
    assert chosen.shape == (50, 4, 2) and np.all(chosen >= 0)


def test_dirichlet_draws_are_a_function_of_the_uniform() -> None:
    uniforms = np.array([0.1, 0.7, 0.1])
    rows = dirichlet_from_uniform(uniforms, 1.0, 3)
    assert rows.shape == (3, 3) and np.allclose(rows.sum(axis=1), 1.0)
    assert np.array_equal(rows[0], rows[2]) and not np.array_equal(rows[0], rows[1])


def _torchvision_tables(height: int, width: int) -> dict[str, np.ndarray]:
    """torchvision's AugMix._AUGMENTATION_SPACE magnitudes for 10 bins."""
    linspace = lambda top: torch.linspace(0.0, top, NUM_BINS).double().numpy()  # noqa: E731
    posterize = (4 - (torch.arange(NUM_BINS) / ((NUM_BINS - 1) / 4))).round().int().numpy()
    return {
        "shear_x": linspace(0.3),
        "shear_y": linspace(0.3),
        "translate_x": linspace(width / 3.0),
        "translate_y": linspace(height / 3.0),
        "rotate": linspace(30.0),
        "posterize": np.maximum(1, posterize),  # clamped: never 0 bits
        "solarize": 255.0 * torch.linspace(1.0, 0.0, NUM_BINS).double().numpy(),
        "brightness": linspace(0.9),
        "saturation": linspace(0.9),
        "contrast": linspace(0.9),
        "sharpness": linspace(0.9),
    }


def test_magnitudes_map_as_torchvisions_tables() -> None:
    height, width = 37, 224
    tables = _torchvision_tables(height, width)
    bins = np.arange(NUM_BINS)
    for name, table in tables.items():
        for negate in (False, True):
            values = augmix_values(
                np.array([name] * NUM_BINS), bins, np.full(NUM_BINS, negate),
                np.full(NUM_BINS, height), np.full(NUM_BINS, width),
            )  # fmt: skip
            signed = {spec[0]: spec[2] for spec in AUGMIX_OPS}[name]
            expected = -table if signed and negate else table
            if name in ("brightness", "saturation", "contrast", "sharpness"):
                expected = 1.0 + expected
            if name.startswith("translate"):
                expected = np.trunc(expected)  # int(magnitude)
            assert np.allclose(values, expected, atol=1e-6), name
    assert list(tables["posterize"]) == [4, 4, 3, 3, 2, 2, 1, 1, 1, 1]


# The value ops against PIL: (name, PIL op of an image and the kernel parameter).
PIL_OPS = {
    "posterize": lambda image, v: ImageOps.posterize(image, int(v)),
    "solarize": ImageOps.solarize,
    "autocontrast": lambda image, v: ImageOps.autocontrast(image),
    "equalize": lambda image, v: ImageOps.equalize(image),
    "brightness": lambda image, v: ImageEnhance.Brightness(image).enhance(v),
    "saturation": lambda image, v: ImageEnhance.Color(image).enhance(v),
    "contrast": lambda image, v: ImageEnhance.Contrast(image).enhance(v),
    "sharpness": lambda image, v: ImageEnhance.Sharpness(image).enhance(v),
}


def _forced_draws(op: ops.AugMix, picks: list[list[tuple[int, int, bool]]], count: int):
    """Draws making every sample's chain ``i`` run ``picks[i]``: (op index, bin, negate)."""
    draws = np.random.default_rng(5).random((count, op.draws_per_sample))
    per_chain = 1 + 3 * op.max_depth
    for chain, links in enumerate(picks):
        base = 2 + chain * per_chain
        for link, (op_index, magnitude_bin, negate) in enumerate(links):
            column = base + 1 + 3 * link
            draws[:, column] = (op_index + 0.5) / op.op_count
            draws[:, column + 1] = (magnitude_bin + 0.5) / op.severity
            draws[:, column + 2] = 0.25 if negate else 0.75
    return draws


def test_chains_and_blend_match_a_pil_reference() -> None:
    """Value ops chained with PIL on each chain's copy, blended in float32 with the plan's
    weights and truncated: within 1 level of the CPU transform (measured: equal)."""
    op = ops.AugMix(severity=10, mixture_width=3, chain_depth=2)
    value_ops = [NAMES.index(name) for name in PIL_OPS]
    rng = np.random.default_rng(1)
    for trial in range(6):
        picks = [
            [(int(rng.choice(value_ops)), int(rng.integers(10)), bool(rng.integers(2)))
             for _ in range(2)]
            for _ in range(3)
        ]  # fmt: skip
        images = np.stack([_photo(seed=trial * 10 + s) for s in range(3)])
        draws = _forced_draws(op, picks, len(images))
        transform = transforms.AugMix.from_op(op)
        transform.uniform = lambda count, columns, draws=draws: draws  # type: ignore[method-assign]
        out = transform(images.copy())
        weights = op.plan(draws)[3].astype(np.float32)
        for k, image in enumerate(images):
            mixed = image.astype(np.float32) * weights[k, 0]
            for chain, links in enumerate(picks):
                pil = Image.fromarray(image)
                for op_index, magnitude_bin, negate in links:
                    name = NAMES[op_index]
                    value = augmix_values(
                        np.array([name]), np.array([magnitude_bin]), np.array([negate]),
                        np.array([24]), np.array([32]),
                    )[0]  # fmt: skip
                    pil = PIL_OPS[name](pil, value)
                mixed += weights[k, 1 + chain] * np.asarray(pil)
            expected = mixed.astype(np.uint8)
            assert np.abs(out[k].astype(int) - expected).max() <= 1


@pytest.mark.parametrize("severity", [1, 10])
def test_every_op_at_both_ends_of_the_severity(severity: int) -> None:
    """Bin 0 (severity 1: identity magnitudes, solarize at 255, 4 bits) and bin 9 (30
    degrees, a third of the side, solarize at 0, posterize clamped to 1 bit) on both
    executors' kernels."""
    images = np.stack([_photo(20, 24, seed=s) for s in range(2)])
    planar = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    op = ops.AugMix(severity=severity, mixture_width=1, chain_depth=1)
    for op_index, name in enumerate(NAMES):
        draws = _forced_draws(op, [[(op_index, severity - 1, True)]], 2)
        (steps,), _ = op.mixing(draws, np.full(2, 20), np.full(2, 24))
        assert [step.kernel for step in steps] == [
            "affine" if "_" in name or name == "rotate" else name
        ]
        for step in steps:
            if name == "posterize":
                assert step.params["bits"].tolist() == ([4, 4] if severity == 1 else [1, 1])
            if name == "solarize":
                assert step.params["threshold"].tolist() == (
                    [255, 255] if severity == 1 else [0, 0]
                )
            out, _ = CPU_KERNELS[step.kernel](images.copy(), step.params, step.options, [])
            assert out.shape == images.shape and out.dtype == np.uint8
            on_device, _ = DEVICE_KERNELS[step.kernel](
                planar.clone(), step.params, step.options, []
            )
            diff = np.abs(on_device.permute(0, 2, 3, 1).numpy().astype(int) - out)
            assert diff.max() <= 1
            if (
                severity == 1
                and step.kernel != "affine"
                and name not in ("autocontrast", "equalize", "posterize")
            ):
                assert np.array_equal(out, images)  # magnitude 0: the image itself
    inverted = _forced_draws(op, [[(NAMES.index("solarize"), severity - 1, False)]], 2)
    if severity == 10:  # threshold 0 inverts every value
        (steps,), _ = op.mixing(inverted, np.full(2, 20), np.full(2, 24))
        out, _ = CPU_KERNELS["solarize"](images.copy(), steps[0].params, {}, [])
        assert np.array_equal(out, 255 - images)


@pytest.mark.parametrize(
    "op",
    [
        ops.AugMix(),
        ops.AugMix(severity=10, mixture_width=2, chain_depth=3, alpha=0.5, all_ops=False),
        ops.AugMix(severity=7, interpolation="nearest", fill=(1, 2, 3)),
    ],
    ids=repr,
)
def test_one_seed_one_result_on_cpu_and_device(op: ops.AugMix) -> None:
    """The kernels agree within one level (bilinear warps round apart, nearest ones part
    at exact half-pixel ties); a later posterize, solarize or equalize can turn such a
    level into a jump: under 1% of the values differ, under 0.5% by more than 2."""
    images = np.stack([_photo(seed=s) for s in range(16)])
    cpu_transform = transforms.AugMix.from_op(op, seed=11)
    device_module = gpu.DeviceAugMix.from_op(op, seed=11)
    planar = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    for _ in range(2):
        on_cpu = cpu_transform(images.copy())
        on_device = device_module(planar)
        diff = np.abs(on_device.permute(0, 2, 3, 1).numpy().astype(int) - on_cpu)
        assert (diff > 0).mean() < 0.01 and (diff > 2).mean() < 0.005
        assert not np.array_equal(on_cpu, images)
    assert torch.equal(planar, torch.from_numpy(images).permute(0, 3, 1, 2))  # input kept


def test_threads_lists_and_gray_batches_equal_one_batch() -> None:
    images = np.stack([_photo(seed=s) for s in range(9)])
    alone = transforms.AugMix(seed=3).apply_all(images.copy(), [], None, 1)[0]
    threaded = transforms.AugMix(seed=3).apply_all(images.copy(), [], ThreadPoolExecutor(3), 3)[0]
    assert np.array_equal(threaded, alone)
    listed = transforms.AugMix(seed=3)(list(images.copy()))
    assert all(np.array_equal(a, b) for a, b in zip(listed, alone, strict=True))
    gray = transforms.AugMix(seed=3)(images[..., 0].copy())
    assert gray.shape == images.shape[:3] and not np.array_equal(gray, images[..., 0])


def test_masks_and_boxes_are_refused() -> None:
    images = np.stack([_photo(seed=s) for s in range(2)])
    masks = images[..., 0] // 64
    with pytest.raises(ValueError, match="masks cannot follow"):
        transforms.AugMix(seed=0)(images.copy(), masks=masks)
    with pytest.raises(ValueError, match="masks cannot follow"):
        gpu.DeviceAugMix(seed=0)(
            torch.from_numpy(images).permute(0, 3, 1, 2), torch.from_numpy(masks)
        )
    boxes = [np.array([[1, 1, 5, 5]], np.float32)] * 2
    with pytest.raises(ValueError, match="cannot move the boxes field"):
        transforms.AugMix(seed=0)({"image": images.copy(), "boxes": boxes})


def test_arguments_are_validated_and_rebuild_the_description() -> None:
    with pytest.raises(ValueError, match=r"severity must be in \[1, 10\], got 11"):
        ops.AugMix(severity=11)
    with pytest.raises(ValueError, match="severity must be >= 1, got 0"):
        transforms.AugMix(severity=0)
    with pytest.raises(ValueError, match="mixture_width must be >= 1, got 0"):
        gpu.DeviceAugMix(mixture_width=0)
    with pytest.raises(TypeError, match=r"chain_depth must be an int, got 1\.5"):
        ops.AugMix(chain_depth=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alpha must be a finite number > 0, got 0"):
        ops.AugMix(alpha=0)
    with pytest.raises(TypeError, match="all_ops must be a bool"):
        ops.AugMix(all_ops=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="interpolation must be one of"):
        ops.AugMix(interpolation="bicubic")
    op = ops.AugMix(5, 2, 1, 0.5, False, "nearest", 7)
    assert transforms.AugMix(5, 2, 1, 0.5, False, "nearest", 7).op == op
    assert transforms.AugMix.from_op(op, seed=0).op is op
    assert gpu.DeviceAugMix.from_op(op).op is op
    assert transforms.AugMix(severity=4).severity == 4
    assert op.moves_pixels and op.keeps_size and op.draws_per_sample == 2 + 2 * 4
