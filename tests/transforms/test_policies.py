"""Geometry (against PIL), random erasing, and the RandAugment / TrivialAugmentWide
policies: their draws follow the reference distributions (statistical tests over many
draws), every op runs at both ends of its magnitude, and one seed gives one result on the
CPU and on the device."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from fastdata import gpu, ops, transforms
from fastdata._affine import translate_matrices
from fastdata._ops_policy import (
    GEOMETRIC_OPS,
    MAX_LEVEL,
    RAND_AUGMENT_OPS,
    TRIVIAL_AUGMENT_OPS,
    geometry_matrices,
    rand_augment_values,
)
from fastdata._ops_steps import Step, StepOperation
from fastdata.gpu._steps import _units, run_device_steps
from fastdata.transforms._kernels import CPU_KERNELS
from fastdata.transforms._steps import run_steps
from fastdata.transforms._warp import opencv_matrix

stats = pytest.importorskip("scipy.stats")

FILL = (10, 20, 30)


# the policies the step tests run: timm's recipe, one with every op at full strength, and
# one op per sample
POLICIES = [
    ops.RandAugment(2, 9, 0.5),
    ops.RandAugment(3, 5, float("inf"), p=0.9, increasing=True),
    ops.TrivialAugmentWide(),
]


def _photo(height: int = 40, width: int = 56, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 4, yy * 5, (xx + yy) * 2], axis=-1)
    return np.clip(base + rng.normal(0, 20, (height, width, 3)), 0, 255).astype(np.uint8)


def _warp(image: np.ndarray, matrix: np.ndarray, interpolation: str) -> np.ndarray:
    options = {"interpolation": interpolation, "fill": FILL}
    out, _ = CPU_KERNELS["affine"](image[None].copy(), {"matrix": matrix}, options, [])
    return out[0]


def _inside(matrix: np.ndarray, height: int, width: int) -> np.ndarray:
    """Output pixels whose 2x2 bilinear taps all lie inside the input."""
    ys, xs = np.mgrid[0:height, 0:width] + 0.5
    (a, b, c), (d, e, f) = matrix[0]
    source_x, source_y = a * xs + b * ys + c, d * xs + e * ys + f
    return (
        (source_x >= 1.5)
        & (source_x <= width - 1.5)
        & (source_y >= 1.5)
        & (source_y <= height - 1.5)
    )


CASES = [
    ("rotate", 17.0, lambda image, res, v: image.rotate(v, resample=res, fillcolor=FILL)),
    ("rotate", -45.0, lambda image, res, v: image.rotate(v, resample=res, fillcolor=FILL)),
    ("rotate", 135.0, lambda image, res, v: image.rotate(v, resample=res, fillcolor=FILL)),
    ("shear_x", 0.3, lambda image, res, v: image.transform(image.size, Image.AFFINE, (1, v, 0, 0, 1, 0), resample=res, fillcolor=FILL)),  # noqa: E501
    ("shear_y", -0.99, lambda image, res, v: image.transform(image.size, Image.AFFINE, (1, 0, 0, v, 1, 0), resample=res, fillcolor=FILL)),  # noqa: E501
    ("translate_x", -25.2, lambda image, res, v: image.transform(image.size, Image.AFFINE, (1, 0, v, 0, 1, 0), resample=res, fillcolor=FILL)),  # noqa: E501
    ("translate_y", 7.0, lambda image, res, v: image.transform(image.size, Image.AFFINE, (1, 0, 0, 0, 1, v), resample=res, fillcolor=FILL)),  # noqa: E501
    ("translate_y", -5.6, lambda image, res, v: image.transform(image.size, Image.AFFINE, (1, 0, 0, 0, 1, v), resample=res, fillcolor=FILL)),  # noqa: E501
]  # fmt: skip


def _matrix(kind: str, value: float, height: int, width: int) -> np.ndarray:
    return geometry_matrices(kind, np.array([value]), np.array([height]), np.array([width]))


@pytest.mark.parametrize(("kind", "value", "reference"), CASES)
def test_geometry_matches_pil(kind: str, value: float, reference: object) -> None:
    """Nearest: PIL's pixels but for exact half-pixel ties (at most 2%); bilinear: within
    one level wherever the taps are inside the image (at the border the fill is blended
    as a constant border; PIL repeats the edge pixel there)."""
    image = _photo()
    height, width = image.shape[:2]
    matrix = _matrix(kind, value, height, width)
    pil = Image.fromarray(image)
    nearest = np.asarray(reference(pil, Image.NEAREST, value))  # type: ignore[operator]
    differs = np.any(_warp(image, matrix, "nearest") != nearest, axis=-1)
    assert differs.mean() <= 0.02
    bilinear = np.asarray(reference(pil, Image.BILINEAR, value))  # type: ignore[operator]
    diff = np.abs(_warp(image, matrix, "bilinear").astype(int) - bilinear)
    assert diff[_inside(matrix, height, width)].max() <= 1


def test_quarter_turns_and_shifts_are_exact_moves() -> None:
    image = _photo(32, 32)
    matrix = _matrix("rotate", 90.0, 32, 32)
    assert np.array_equal(_warp(image, matrix, "bilinear"), np.rot90(image))
    shifted = _warp(image, _matrix("translate_x", 5.0, 32, 32), "nearest")
    assert np.array_equal(shifted[:, :-5], image[:, 5:])
    assert np.all(shifted[:, -5:] == FILL)


@pytest.mark.parametrize("fill", [(10, 20, 30), (7,)])
def test_bilinear_rgb_warps_equal_the_three_channel_warp(fill: tuple[int, ...]) -> None:
    """The RGBA detour of bilinear RGB warps changes no pixel, fill and edges included."""
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (4, 23, 41, 3), dtype=np.uint8)
    cases = [("rotate", 33.0), ("shear_x", -0.4), ("shear_y", 0.25), ("rotate", -170.0)]
    matrices = np.concatenate([_matrix(kind, value, 23, 41) for kind, value in cases])
    options = {"interpolation": "bilinear", "fill": fill}
    out, _ = CPU_KERNELS["affine"](images.copy(), {"matrix": matrices}, options, [])
    border = tuple(float(v) for v in (fill * 3 if len(fill) == 1 else fill))
    for image, matrix, warped in zip(images, matrices, out, strict=True):
        expected = cv2.warpAffine(
            image, opencv_matrix(matrix), (41, 23), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_CONSTANT, borderValue=border,
        )  # fmt: skip
        assert np.array_equal(warped, expected)


@pytest.mark.parametrize("channels", [3, 1])
def test_bilinear_shifts_along_one_axis_are_opencvs_warp_within_a_level(channels: int) -> None:
    """A translation along one axis blends two shifted views: OpenCV's bilinear warp (its
    constant border blended into the pixels next to it) but for rounding, at shifts inside
    a pixel, across the image and past it, on both sides; the input is left as it was."""
    images = np.random.default_rng(4).integers(0, 256, (10, 23, 41, channels), dtype=np.uint8)
    shifts = [("translate_x", 0.3), ("translate_x", -25.23), ("translate_x", 40.5),
              ("translate_x", -41.7), ("translate_x", 300.5), ("translate_y", 5.6),
              ("translate_y", -0.01), ("translate_y", 22.4), ("translate_y", -22.9),
              ("translate_y", -90.2)]  # fmt: skip
    matrices = np.concatenate([_matrix(kind, value, 23, 41) for kind, value in shifts])
    fill = (10, 20, 30)[:channels]
    options = {"interpolation": "bilinear", "fill": fill}
    out, _ = CPU_KERNELS["affine"](images.copy(), {"matrix": matrices}, options, [])
    for image, matrix, shifted in zip(images, matrices, out, strict=True):
        expected = cv2.warpAffine(
            image, opencv_matrix(matrix), (41, 23), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_CONSTANT, borderValue=tuple(float(v) for v in fill),
        ).reshape(image.shape)  # fmt: skip
        assert np.abs(shifted.astype(int) - expected).max() <= 1


def test_policies_on_threads_equal_one_thread() -> None:
    """Threads split the batch into slices of samples, each running every step of its
    samples: the same pixels and masks as one thread."""
    images = np.stack([_photo(seed=s) for s in range(13)])
    masks = images[..., 0] // 32
    pool = ThreadPoolExecutor(3)
    for make in (
        lambda: transforms.Compose([transforms.RandAugment(3, 9, 0.5, seed=5),
                                    transforms.RandomErasing(0.5, seed=6)]),
        lambda: transforms.TrivialAugmentWide(seed=7),
    ):  # fmt: skip
        alone, (alone_mask,) = make().apply_all(images.copy(), [masks.copy()], None, 1)
        threaded, (threaded_mask,) = make().apply_all(images.copy(), [masks.copy()], pool, 3)
        assert np.array_equal(threaded, alone)
        assert np.array_equal(threaded_mask, alone_mask)
        assert not np.array_equal(alone, images)


def test_masks_follow_the_geometry_nearest() -> None:
    images = np.stack([_photo(seed=s) for s in range(8)])
    masks = images[..., 0] // 32  # labels 0..7 that move like the red channel
    for transform in (
        transforms.RandomAffine(40, (0.2, 0.2), (0.7, 1.3), (-10, 10, -5, 5), fill=0, seed=1),
        transforms.RandAugment(3, 9, 0.5, p=1.0, interpolation="nearest", fill=0, seed=2),
        transforms.TrivialAugmentWide(seed=3),
    ):
        out, moved = transform(images.copy(), masks=masks.copy())
        assert out.shape == images.shape
        assert moved.shape == masks.shape and moved.dtype == np.uint8
        assert set(np.unique(moved)) <= set(np.unique(masks))
    affine = transforms.RandomAffine(40, (0.2, 0.2), fill=0, seed=1)
    out, moved = affine(images.copy(), masks=images[..., 0].copy())
    assert np.array_equal(moved, out[..., 0])  # nearest with fill 0: the same pixels


def _both(op: ops.Operation, seed: int) -> tuple[transforms.BatchTransform, torch.nn.Module]:
    cpu_type = {
        ops.RandomAffine: transforms.RandomAffine,
        ops.RandomErasing: transforms.RandomErasing,
        ops.RandAugment: transforms.RandAugment,
        ops.TrivialAugmentWide: transforms.TrivialAugmentWide,
    }[type(op)]
    device_type = {
        ops.RandomAffine: gpu.DeviceRandomAffine,
        ops.RandomErasing: gpu.DeviceRandomErasing,
        ops.RandAugment: gpu.DeviceRandAugment,
        ops.TrivialAugmentWide: gpu.DeviceTrivialAugmentWide,
    }[type(op)]
    return cpu_type.from_op(op, seed=seed), device_type.from_op(op, seed=seed)


@pytest.mark.parametrize(
    "op",
    [
        ops.RandomAffine(30, (0.1, 0.1), (0.8, 1.2), 10),
        ops.RandomAffine(180, shear=(-20, 20, -20, 20), interpolation="bilinear", fill=(1, 2, 3)),
        ops.RandomErasing(p=0.7),
        ops.RandomErasing(p=1.0, value="random"),
        ops.RandomErasing(p=1.0, value=(255, 0, 128)),
        ops.RandAugment(2, 9, 0.5),
        ops.RandAugment(4, 10, float("inf"), p=1.0, increasing=True),
        ops.TrivialAugmentWide(),
        ops.TrivialAugmentWide(interpolation="bilinear", fill=128),
    ],
    ids=repr,
)
def test_one_seed_one_result_on_cpu_and_device(op: ops.Operation) -> None:
    """Bilinear warps agree within one level (float rounding); everything else exactly."""
    images = np.stack([_photo(24, 32, seed=s) for s in range(16)])
    masks = images[..., 1] // 64
    cpu_transform, device_module = _both(op, seed=11)
    planar = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    for _ in range(2):
        on_cpu, cpu_masks = cpu_transform(images.copy(), masks=masks.copy())
        on_device, device_masks = device_module(planar, torch.from_numpy(masks))
        diff = np.abs(on_device.permute(0, 2, 3, 1).numpy().astype(int) - on_cpu)
        assert diff.max() <= 1 and (diff > 0).mean() < 0.01
        agree = (device_masks.numpy() == cpu_masks).mean()
        assert agree > 0.995  # nearest: ties at exact half pixels may round apart


@pytest.mark.parametrize("op", POLICIES, ids=repr)
def test_device_lookups_on_disjoint_samples_run_as_one_with_the_same_bytes(
    op: StepOperation,
) -> None:
    """The table lookups of one layer of steps (one position of a policy) run as one: the
    same bytes as every step run alone, in order."""
    count = 64
    images = np.stack([_photo(24, 32, seed=s) for s in range(count)])
    planar = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    draws = np.random.default_rng(3).random((count, op.draws_per_sample))
    steps = op.steps(draws, np.full(count, 24), np.full(count, 32))
    assert any(len(unit) > 2 for unit in _units(steps, count))
    together, _ = run_device_steps(steps, planar.clone(), [])
    alone = planar.clone()
    for step in steps:
        alone, _ = run_device_steps([step], alone, [])
    assert torch.equal(together, alone)


def test_device_modules_keep_layouts() -> None:
    images = torch.from_numpy(np.stack([_photo(16, 20, seed=s) for s in range(4)]))
    planar = images.permute(0, 3, 1, 2)
    out_hwc = gpu.DeviceRandAugment(2, 9, seed=1, layout="HWC")(images.contiguous())
    out_chw = gpu.DeviceRandAugment(2, 9, seed=1)(planar.contiguous())
    assert torch.equal(out_hwc.permute(0, 3, 1, 2), out_chw)
    channels_last = planar.contiguous(memory_format=torch.channels_last)
    out_cl = gpu.DeviceRandAugment(2, 9, seed=1)(channels_last)
    assert out_cl.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out_cl, out_chw)


def _timm_rand_augment_draws(count: int, magnitude: float, std: float, seed: int) -> tuple:
    """timm's RandAugment sampling (auto_augment.RandAugment / RandAugmentOp), in Python."""
    rng = random.Random(seed)
    names, levels, applied = [], [], []
    for _ in range(count):
        names.append(rng.randrange(len(RAND_AUGMENT_OPS)))  # np.random.choice, replace
        applied.append(not rng.random() > 0.5)  # prob 0.5
        level = rng.gauss(magnitude, std) if std > 0 else magnitude
        levels.append(max(0.0, min(level, MAX_LEVEL)))
    return np.array(names), np.array(applied), np.array(levels)


def test_rand_augment_draws_follow_timms_distribution() -> None:
    op = ops.RandAugment(num_ops=2, magnitude=9, magnitude_std=0.5)
    count = 20_000
    draws = np.random.default_rng(0).random((count, op.draws_per_sample))
    chosen, applied, level, negate = op.plan(draws)
    names, ref_applied, ref_levels = _timm_rand_augment_draws(2 * count, 9, 0.5, seed=0)
    ops_drawn = np.where(applied, chosen, -1)[applied]
    # op choice: uniform over the 15 ops (chi-square against the expected counts)
    observed = np.bincount(ops_drawn, minlength=len(RAND_AUGMENT_OPS))
    assert stats.chisquare(observed).pvalue > 1e-3
    assert stats.chisquare(np.bincount(names, minlength=15)).pvalue > 1e-3
    # applied with probability 0.5, like timm's
    assert stats.binomtest(int(applied.sum()), applied.size, 0.5).pvalue > 1e-3
    assert abs(applied.mean() - ref_applied.mean()) < 0.02
    # magnitudes: N(9, 0.5) clipped to [0, 10], the same distribution as timm's draws
    assert stats.ks_2samp(level.ravel(), ref_levels).pvalue > 1e-3
    assert level.min() >= 0 and level.max() <= MAX_LEVEL
    assert stats.binomtest(int(negate.sum()), negate.size, 0.5).pvalue > 1e-3
    # mstd = inf: uniform in [0, magnitude]
    uniform = ops.RandAugment(2, 9, float("inf")).plan(draws)[2]
    assert stats.kstest(uniform.ravel(), stats.uniform(0, 9).cdf).pvalue > 1e-3


def test_trivial_augment_draws_follow_torchvisions_distribution() -> None:
    op = ops.TrivialAugmentWide()
    count = 30_000
    draws = np.random.default_rng(1).random((count, op.draws_per_sample))
    chosen, magnitude = op.plan(draws)
    assert stats.chisquare(np.bincount(chosen, minlength=14)).pvalue > 1e-3
    rotations = magnitude[chosen == 5]  # signed, linspace(0, 135, 31)
    bins = np.round(np.abs(rotations) / (135 / 30)).astype(int)
    assert np.allclose(np.abs(rotations), bins * 135 / 30)
    assert stats.chisquare(np.bincount(bins, minlength=31)).pvalue > 1e-3
    assert (
        stats.binomtest(int((rotations < 0).sum()), int((rotations != 0).sum()), 0.5).pvalue > 1e-3
    )
    bits = magnitude[chosen == 10]
    expected_bits = 8 - np.round(np.arange(31) / 5)  # torchvision's posterize bins
    assert set(np.unique(bits)) == set(expected_bits)
    thresholds = magnitude[chosen == 11]
    assert thresholds.min() == 0 and thresholds.max() == 255


@pytest.mark.parametrize("increasing", [False, True])
@pytest.mark.parametrize("level", [0.0, 10.0])
def test_every_rand_augment_op_at_both_ends_of_its_magnitude(
    level: float, increasing: bool
) -> None:
    images = np.stack([_photo(20, 24, seed=s) for s in range(2)])
    for name in RAND_AUGMENT_OPS:
        values = rand_augment_values(name, np.full(2, level), np.array([False, True]), increasing)
        if name == "posterize":
            assert values.min() >= 1  # never 0 bits (timm asks for 0; Pillow >= 13 refuses)
        if name in ("saturation", "contrast", "brightness", "sharpness"):
            assert values.min() >= 0.1
        if name == "solarize":
            assert values.min() >= 0 and values.max() <= 256
    # every op, forced, on both executors, at this magnitude
    for op_index in range(len(RAND_AUGMENT_OPS)):
        op = ops.RandAugment(1, level, 0.0, p=1.0, increasing=increasing, interpolation="nearest")
        draws = np.array([[(op_index + 0.5) / len(RAND_AUGMENT_OPS), 0.0, 0.5, 0.5, 0.2]] * 2)
        steps = op.steps(draws, np.full(2, 20), np.full(2, 24))
        assert len(steps) <= 1
        for step in steps:
            out, _ = CPU_KERNELS[step.kernel](images.copy(), step.params, step.options, [])
            assert out.shape == images.shape and out.dtype == np.uint8


@pytest.mark.parametrize("magnitude_bin", [0, 30])
def test_every_trivial_augment_op_at_both_ends(magnitude_bin: int) -> None:
    images = np.stack([_photo(20, 24, seed=s) for s in range(2)])
    op = ops.TrivialAugmentWide()
    for op_index in range(len(TRIVIAL_AUGMENT_OPS)):
        draws = np.array([[(op_index + 0.5) / 14, (magnitude_bin + 0.5) / 31, 0.9]] * 2)
        for step in op.steps(draws, np.full(2, 20), np.full(2, 24)):
            out, _ = CPU_KERNELS[step.kernel](images.copy(), step.params, step.options, [])
            assert out.shape == images.shape
            if step.kernel == "posterize":
                assert step.params["bits"].min() >= 2


def test_random_erasing_follows_torchvision() -> None:
    images = np.full((400, 20, 30, 3), 200, np.uint8)
    erasing = transforms.RandomErasing(p=0.5, value=(0, 1, 2), seed=4)
    out = erasing(images.copy())
    erased = np.any(out != 200, axis=(1, 2, 3))
    assert stats.binomtest(int(erased.sum()), 400, 0.5).pvalue > 1e-3
    areas = [np.all(o == (0, 1, 2), axis=-1).sum() / 600 for o in out[erased]]
    assert min(areas) >= 0.02 - 0.01 and max(areas) <= 0.33 + 0.02
    for sample in out[erased]:  # one rectangle of the value
        rows, cols = np.nonzero(np.all(sample == (0, 1, 2), axis=-1))
        assert len(rows) == (np.ptp(rows) + 1) * (np.ptp(cols) + 1)
    noise = transforms.RandomErasing(p=1.0, value="random", seed=4)(images.copy())
    again = transforms.RandomErasing(p=1.0, value="random", seed=4)(images.copy())
    assert np.array_equal(noise, again) and len(np.unique(noise)) > 100
    tiny = np.zeros((3, 1, 1, 3), np.uint8)  # no box fits: nothing erased
    assert np.array_equal(transforms.RandomErasing(p=1.0, value=9)(tiny.copy()), tiny)


def test_policy_and_geometry_arguments_are_validated() -> None:
    with pytest.raises(ValueError, match=r"magnitude must be in \[0, 10.0\], got 11"):
        ops.RandAugment(magnitude=11)
    with pytest.raises(TypeError, match="num_ops must be a non-negative int"):
        transforms.RandAugment(num_ops=1.5)
    with pytest.raises(ValueError, match="num_magnitude_bins must be an int >= 2"):
        gpu.DeviceTrivialAugmentWide(num_magnitude_bins=1)
    with pytest.raises(ValueError, match="interpolation must be one of"):
        ops.RandomAffine(10, interpolation="bicubic")
    with pytest.raises(ValueError, match=r"fill must be in \[0, 255\]"):
        ops.RandAugment(fill=300)
    with pytest.raises(ValueError, match=r"translate values must be in \[0, 1\]"):
        ops.RandomAffine(0, translate=(0.5, 2))
    with pytest.raises(ValueError, match="value must be an int, ints or 'random'"):
        ops.RandomErasing(value="noise")
    with pytest.raises(ValueError, match="scale must give"):
        ops.RandomErasing(scale=(0.5, 0.1))


def test_policies_are_values_executors_rebuild() -> None:
    op = ops.RandAugment(num_ops=2, magnitude=9, magnitude_std=0.5)
    assert op.draws_per_sample == 10 and op.moves_pixels and op.keeps_size
    cpu = transforms.RandAugment.from_op(op, seed=0)
    assert cpu.op is op and cpu.magnitude_std == 0.5
    assert transforms.RandAugment(2, 9, 0.5).op == op
    device = gpu.DeviceRandAugment.from_op(op, seed=0)
    assert device.op is op
    assert transforms.TrivialAugmentWide().op == ops.TrivialAugmentWide(31, "nearest", 0)
    assert ops.RandAugment(num_ops=0).draws_per_sample == 0
    images = np.stack([_photo(8, 8)] * 2)
    assert np.array_equal(transforms.RandAugment(num_ops=0)(images.copy()), images)


def test_steps_run_on_views_of_scattered_samples(monkeypatch: pytest.MonkeyPatch) -> None:
    # a step's samples 1, 2, 5 and 7: the kernel runs once per run of consecutive samples,
    # on views of the batch (no gathered copy written back), with its parameters and masks
    seen: list[tuple[bool, list[float]]] = []
    add_shift = CPU_KERNELS["brightness"]

    def recording(images, params, options, masks):  # type: ignore[no-untyped-def]
        seen.append((images.base is not None, params["factor"].tolist()))
        return add_shift(images, params, options, masks)

    monkeypatch.setitem(CPU_KERNELS, "brightness", recording)
    batch = np.random.default_rng(0).integers(0, 256, (8, 6, 5, 3), dtype=np.uint8)
    factors = np.array([0.5, 1.5, 0.25, 2.0], np.float32)
    step = Step("brightness", np.array([1, 2, 5, 7]), {"factor": factors})
    expected = batch.copy()
    for position, sample in enumerate([1, 2, 5, 7]):
        one = {"factor": factors[position : position + 1]}
        add_shift(expected[sample : sample + 1], one, {}, [])
    run_steps([step], batch, [], None, 1)
    assert seen == [(True, [0.5, 1.5]), (True, [0.25]), (True, [2.0])]
    assert np.array_equal(batch, expected)


def _by_sample(steps: list[Step]) -> dict[int, list[tuple[str, dict[str, np.ndarray]]]]:
    """Each sample's kernels and parameters, in the order the steps run them."""
    out: dict[int, list[tuple[str, dict[str, np.ndarray]]]] = {}
    for step in steps:
        assert (np.diff(step.index) > 0).all()  # the executors walk increasing positions
        for row, sample in enumerate(step.index.tolist()):
            params = {name: value[row] for name, value in step.params.items()}
            out.setdefault(sample, []).append((step.kernel, params))
    return out


@pytest.mark.parametrize("op", POLICIES, ids=repr)
def test_policy_steps_give_each_sample_what_its_own_draws_give_it(op: ops.Operation) -> None:
    # grouped by op, the geometric ops of a position in one affine step: per sample the
    # same kernels and parameters as the sample drawn alone
    rng = np.random.default_rng(11)
    count = 96
    draws = rng.random((count, op.draws_per_sample))
    heights, widths = rng.integers(20, 60, count), rng.integers(20, 60, count)
    steps = op.steps(draws, heights, widths)
    assert sum(step.kernel == "affine" for step in steps) <= getattr(op, "num_ops", 1)
    batch = _by_sample(steps)
    # each sample's kernels as its plan names them, apart from the grouping
    if isinstance(op, ops.RandAugment):
        chosen, _, level, negate = op.plan(draws)
        names = [[RAND_AUGMENT_OPS[k] for k in row if k >= 0] for row in chosen.tolist()]
        # and each applied op's parameter from timm's mapping, sample by sample
        for sample, row in enumerate(chosen.tolist()):
            applied = [(position, k) for position, k in enumerate(row) if k >= 0]
            for (position, op_index), (_, params) in zip(
                applied, batch.get(sample, []), strict=True
            ):
                name = RAND_AUGMENT_OPS[op_index]
                picked = np.array([position])
                value = rand_augment_values(
                    name, level[sample, picked], negate[sample, picked], op.increasing
                )
                value = (
                    value
                    * {"translate_x": widths, "translate_y": heights}.get(name, np.ones(count))[
                        sample
                    ]
                )
                size = (heights[sample : sample + 1], widths[sample : sample + 1])
                if name in GEOMETRIC_OPS:
                    value = geometry_matrices(name, value, *size)
                for actual in params.values():
                    assert np.array_equal(actual, value[0]), (sample, name)
    else:
        picked = op.plan(draws)[0].tolist()
        names = [[TRIVIAL_AUGMENT_OPS[k][0]] if k else [] for k in picked]
    for sample, planned in enumerate(names):
        kernels = ["affine" if name in GEOMETRIC_OPS else name for name in planned]
        assert [kernel for kernel, _ in batch.get(sample, [])] == kernels
    for sample in range(count):
        rows = slice(sample, sample + 1)
        alone = _by_sample(op.steps(draws[rows], heights[rows], widths[rows])).get(0, [])
        together = batch.get(sample, [])
        assert [kernel for kernel, _ in together] == [kernel for kernel, _ in alone]
        for (_, params), (_, expected) in zip(together, alone, strict=True):
            assert params.keys() == expected.keys()
            for name, value in params.items():
                assert np.array_equal(value, expected[name]), (sample, name)


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("channels", [1, 3])
def test_whole_pixel_shifts_equal_opencvs_warp(interpolation: str, channels: int) -> None:
    # shifts copy pixels; OpenCV's warp by the same map is the reference, masks included
    rng = np.random.default_rng(12)
    height, width = 9, 13
    images = rng.integers(0, 256, (1, height, width, channels), dtype=np.uint8)
    mask = rng.integers(1, 9, (1, height, width), dtype=np.uint8)
    fill = (7, 200, 31)[:channels]
    flags = {"nearest": cv2.INTER_NEAREST, "bilinear": cv2.INTER_LINEAR}[interpolation]
    for dx in (0, 1, -1, 5, -12, 13, -13, 20):
        for dy in (0, 2, -3, 8, -9, 30):
            matrix = translate_matrices(np.array([float(dx)]), np.array([float(dy)]))
            transform = opencv_matrix(matrix[0])
            expected = cv2.warpAffine(
                images[0], transform, (width, height), flags=flags | cv2.WARP_INVERSE_MAP,
                borderMode=cv2.BORDER_CONSTANT, borderValue=tuple(float(v) for v in fill),
            ).reshape(images.shape[1:])  # fmt: skip
            expected_mask = cv2.warpAffine(
                mask[0], transform, (width, height), flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP,
                borderMode=cv2.BORDER_CONSTANT, borderValue=0,
            )  # fmt: skip
            options = {"interpolation": interpolation, "fill": fill}
            out, (moved,) = CPU_KERNELS["affine"](
                images.copy(), {"matrix": matrix}, options, [mask.copy()]
            )
            assert np.array_equal(out[0], expected), (dx, dy)
            assert np.array_equal(moved[0], expected_mask), (dx, dy)
