"""Colour ops: each kernel against its PIL definition (``ImageEnhance``/``ImageOps``,
which torchvision follows for uint8 images) within one level per pixel (measured: exact),
hue against ``colorsys`` (torchvision's float HSV), blur against torchvision's definition;
the CPU transforms and the device modules give one result for one seed."""

from __future__ import annotations

import colorsys
import pickle
from collections.abc import Callable

import numpy as np
import pytest
import torch
from PIL import Image, ImageEnhance, ImageFilter, ImageOps

from fastdata import gpu, ops, transforms
from fastdata._tables import PARAMETER_LUTS, blend
from fastdata.gpu._kernels import DEVICE_KERNELS
from fastdata.transforms._kernels import CPU_KERNELS, blend_into, contrast_means, luma, smooth

TOLERANCE = 1  # levels per pixel, the documented bound against the references


def _photos(count: int = 6, height: int = 24, width: int = 32, seed: int = 0) -> np.ndarray:
    """Gradients with noise, plus pure noise, a narrow-range and a constant image."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:height, 0:width]
    base = np.stack([xx * 8, yy * 10, (xx + yy) * 4], axis=-1)
    images = np.clip(base[None] + rng.normal(0, 25, (count, height, width, 3)), 0, 255)
    images = images.astype(np.uint8)
    images[1] = rng.integers(0, 256, (height, width, 3))
    images[2] = rng.integers(60, 120, (height, width, 3))
    images[3] = 77
    return images


def _kernel(name: str, images: np.ndarray, **params: float) -> np.ndarray:
    per_sample = {key: np.full(len(images), value) for key, value in params.items()}
    out, _ = CPU_KERNELS[name](images.copy(), per_sample, {}, [])
    return out


def _assert_close(actual: np.ndarray, expected: np.ndarray, tolerance: int = TOLERANCE) -> None:
    diff = np.abs(actual.astype(np.int64) - expected.astype(np.int64))
    assert diff.max() <= tolerance, f"max difference {diff.max()} > {tolerance}"


PIL_ENHANCE: dict[str, Callable[[Image.Image], ImageEnhance._Enhance]] = {
    "brightness": ImageEnhance.Brightness,
    "contrast": ImageEnhance.Contrast,
    "saturation": ImageEnhance.Color,
    "sharpness": ImageEnhance.Sharpness,
}


@pytest.mark.parametrize("name", sorted(PIL_ENHANCE))
@pytest.mark.parametrize("factor", [0.0, 0.1, 0.5, 1.0, 1.9, 5.0])
def test_enhance_kernels_match_pil(name: str, factor: float) -> None:
    images = _photos()
    expected = [np.asarray(PIL_ENHANCE[name](Image.fromarray(i)).enhance(factor)) for i in images]
    _assert_close(_kernel(name, images, factor=factor), np.stack(expected))


@pytest.mark.parametrize("threshold", [0, 1, 100, 128, 255, 256])
def test_solarize_matches_pil_at_every_edge(threshold: int) -> None:
    images = _photos()
    expected = [np.asarray(ImageOps.solarize(Image.fromarray(i), threshold)) for i in images]
    _assert_close(_kernel("solarize", images, threshold=threshold), np.stack(expected), 0)


@pytest.mark.parametrize("bits", range(1, 9))
def test_posterize_matches_pil_for_every_bit_count(bits: int) -> None:
    images = _photos()
    expected = [np.asarray(ImageOps.posterize(Image.fromarray(i), bits)) for i in images]
    _assert_close(_kernel("posterize", images, bits=bits), np.stack(expected), 0)


@pytest.mark.parametrize(
    ("name", "reference"),
    [
        ("equalize", ImageOps.equalize),
        ("autocontrast", ImageOps.autocontrast),
        ("invert", ImageOps.invert),
        ("grayscale", lambda image: image.convert("L").convert("RGB")),
    ],
)
def test_parameterless_kernels_match_pil(
    name: str, reference: Callable[[Image.Image], Image.Image]
) -> None:
    images = _photos()  # a constant image among them: equalize and autocontrast keep it
    expected = [np.asarray(reference(Image.fromarray(i))) for i in images]
    _assert_close(_kernel(name, images), np.stack(expected), 0)


def test_solarize_add_is_timms() -> None:
    images = _photos()
    for add in (0, 55, 110, 128):
        lut = np.array([min(255, i + add) if i < 128 else i for i in range(256)], np.uint8)
        _assert_close(_kernel("solarize_add", images, add=add), lut[images], 0)


@pytest.mark.parametrize("shift", [-0.5, -0.2, 0.0, 0.1, 0.45, 0.5])
def test_hue_matches_float_hsv(shift: float) -> None:
    images = _photos(count=4, height=8, width=8)
    expected = np.empty_like(images)
    for index in np.ndindex(images.shape[:3]):
        hue, sat, val = colorsys.rgb_to_hsv(*(images[index] / 255.0))
        rgb = colorsys.hsv_to_rgb((hue + shift) % 1.0, sat, val)
        expected[index] = np.floor(np.array(rgb) * (256 - 1e-3))
    _assert_close(_kernel("hue", images, factor=shift), expected)


def _torchvision_blur(image: np.ndarray, size: int, sigma: float) -> np.ndarray:
    """torchvision's gaussian_blur definition in NumPy: 2-D kernel, reflect padding."""
    half = (size - 1) * 0.5
    x = np.linspace(-half, half, size)
    taps = np.exp(-0.5 * (x / sigma) ** 2)
    taps /= taps.sum()
    kernel = np.outer(taps, taps)
    pad = size // 2
    padded = np.pad(image.astype(np.float64), ((pad, pad), (pad, pad), (0, 0)), mode="reflect")
    out = np.zeros(image.shape)
    for dy in range(size):
        for dx in range(size):
            out += kernel[dy, dx] * padded[dy : dy + image.shape[0], dx : dx + image.shape[1]]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


@pytest.mark.parametrize(("size", "sigma"), [(3, 0.1), (5, 1.0), (9, 2.0), (23, 7.0)])
def test_gaussian_blur_matches_torchvisions_definition(size: int, sigma: float) -> None:
    images = _photos()
    out, _ = CPU_KERNELS["blur"](
        images.copy(), {"sigma": np.full(len(images), sigma)}, {"kernel_size": (size, size)}, []
    )
    expected = np.stack([_torchvision_blur(image, size, sigma) for image in images])
    _assert_close(out, expected)


def _pairs() -> list[tuple[transforms.BatchTransform, torch.nn.Module]]:
    """Every colour op's CPU transform and device module, built from one description."""
    descriptions = [
        ops.ColorJitter(0.4, 0.4, 0.4, 0.1),
        ops.ColorJitter(brightness=(0.0, 3.0), hue=(-0.5, 0.5)),
        ops.RandomGrayscale(0.5),
        ops.RandomSolarize(128),
        ops.RandomPosterize(1, p=0.7),
        ops.RandomEqualize(),
        ops.RandomAutocontrast(),
        ops.RandomAdjustSharpness(0.0),
        ops.RandomAdjustSharpness(4.0),
        ops.RandomInvert(),
        ops.GaussianBlur((3, 7), (0.1, 3.0)),
    ]
    cpu_types = {
        ops.ColorJitter: transforms.ColorJitter,
        ops.RandomGrayscale: transforms.RandomGrayscale,
        ops.RandomSolarize: transforms.RandomSolarize,
        ops.RandomPosterize: transforms.RandomPosterize,
        ops.RandomEqualize: transforms.RandomEqualize,
        ops.RandomAutocontrast: transforms.RandomAutocontrast,
        ops.RandomAdjustSharpness: transforms.RandomAdjustSharpness,
        ops.RandomInvert: transforms.RandomInvert,
        ops.GaussianBlur: transforms.GaussianBlur,
    }
    device_types = {
        ops.ColorJitter: gpu.DeviceColorJitter,
        ops.RandomGrayscale: gpu.DeviceRandomGrayscale,
        ops.RandomSolarize: gpu.DeviceRandomSolarize,
        ops.RandomPosterize: gpu.DeviceRandomPosterize,
        ops.RandomEqualize: gpu.DeviceRandomEqualize,
        ops.RandomAutocontrast: gpu.DeviceRandomAutocontrast,
        ops.RandomAdjustSharpness: gpu.DeviceRandomAdjustSharpness,
        ops.RandomInvert: gpu.DeviceRandomInvert,
        ops.GaussianBlur: gpu.DeviceGaussianBlur,
    }
    return [
        (cpu_types[type(op)].from_op(op, seed=3), device_types[type(op)].from_op(op, seed=3))
        for op in descriptions
    ]


@pytest.mark.parametrize("pair", _pairs(), ids=lambda pair: repr(pair[0]))
def test_one_seed_one_result_on_cpu_and_device(
    pair: tuple[transforms.BatchTransform, torch.nn.Module],
) -> None:
    cpu_transform, device_module = pair
    images = _photos(count=12)
    planar = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
    for _ in range(2):  # the second batch too: both advance their draws alike
        on_cpu = cpu_transform(images.copy())
        on_device = device_module(planar)
        assert isinstance(on_cpu, np.ndarray) and isinstance(on_device, torch.Tensor)
        _assert_close(on_device.permute(0, 2, 3, 1).numpy(), on_cpu, 0)
    # the device module returns new tensors; its input is as it was
    assert torch.equal(planar, torch.from_numpy(images).permute(0, 3, 1, 2))


def test_jitter_order_and_factors_are_per_sample_and_seeded() -> None:
    images = np.repeat(_photos()[:1], 64, axis=0)
    jitter = transforms.ColorJitter(brightness=0.5, contrast=0.5, seed=1)
    out = jitter(images.copy())
    assert len({sample.tobytes() for sample in out}) == 64  # every sample its own factors
    assert np.array_equal(transforms.ColorJitter(0.5, 0.5, seed=1)(images.copy()), out)
    # one factor alone: brightness is a per-sample table of PIL's blend with black
    steps = ops.ColorJitter(brightness=(0.2, 1.8)).steps(np.full((64, 8), 0.5), *[np.ones(64)] * 2)
    assert [step.kernel for step in steps] == ["brightness"]
    assert np.allclose(steps[0].params["factor"], 1.0)


def test_probability_picks_samples_and_edges_are_all_or_none() -> None:
    images = _photos(count=16)
    assert np.array_equal(transforms.RandomInvert(p=1.0)(images.copy()), 255 - images)
    assert np.array_equal(transforms.RandomInvert(p=0.0)(images.copy()), images)
    out = transforms.RandomInvert(p=0.5, seed=0)(images.copy())
    inverted = [np.array_equal(o, 255 - i) for o, i in zip(out, images, strict=True)]
    kept = [np.array_equal(o, i) for o, i in zip(out, images, strict=True)]
    assert all(a or b for a, b in zip(inverted, kept, strict=True)) and 0 < sum(inverted) < 16


def test_colour_ops_take_gray_images_lists_and_tensors() -> None:
    images = _photos(count=4)
    gray = images[..., 0].copy()
    for transform in (
        transforms.ColorJitter(0.4, 0.4, 0.4, 0.2, seed=0),
        transforms.RandomEqualize(1.0),
    ):
        out = transform(gray.copy())
        assert out.shape == gray.shape and out.dtype == np.uint8
    as_list = [images[0].copy(), images[1, :10, :12].copy()]
    out_list = transforms.RandomInvert(1.0)(as_list)
    assert np.array_equal(out_list[1], 255 - images[1, :10, :12])
    planar = torch.from_numpy(images).permute(0, 3, 1, 2)
    out_tensor = transforms.RandomPosterize(1, p=1.0)(planar)
    assert torch.equal(out_tensor, planar & 0x80)
    with pytest.raises(ValueError, match="1- or 3-channel"):
        transforms.RandomInvert(1.0)(np.zeros((2, 4, 4, 4), np.uint8))
    with pytest.raises(ValueError, match="images must be uint8"):
        gpu.DeviceRandomInvert(1.0)(planar.float())


def test_colour_descriptions_validate_their_arguments() -> None:
    with pytest.raises(ValueError, match=r"bits must be in \[1, 8\], got 0"):
        ops.RandomPosterize(0)
    with pytest.raises(TypeError, match="bits must be an int"):
        transforms.RandomPosterize(2.5)
    with pytest.raises(ValueError, match=r"threshold must be in \[0, 256\]"):
        ops.RandomSolarize(300)
    with pytest.raises(ValueError, match="brightness must be non-negative"):
        ops.ColorJitter(brightness=-0.1)
    with pytest.raises(ValueError, match=r"hue must give -0.5 <= low <= high <= 0.5"):
        ops.ColorJitter(hue=0.6)
    with pytest.raises(TypeError, match="contrast must be a number or a"):
        gpu.DeviceColorJitter(contrast="high")
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        ops.GaussianBlur(4)
    with pytest.raises(ValueError, match="sigma must be positive"):
        ops.GaussianBlur(3, sigma=0.0)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        transforms.RandomGrayscale(p=2)
    with pytest.raises(ValueError, match=r"kernel_size \(9, 9\) needs images larger than 4x4"):
        transforms.GaussianBlur(9)(np.zeros((1, 4, 4, 3), np.uint8))


def test_colour_descriptions_are_values_and_executors_hold_them() -> None:
    jitter = ops.ColorJitter(0.4, 0.4, 0.4, 0.1)
    assert jitter == ops.ColorJitter(0.4, 0.4, 0.4, 0.1)
    assert jitter.brightness == (0.6, 1.4) and jitter.hue == (-0.1, 0.1)
    assert ops.ColorJitter().brightness is None  # 0: left alone
    assert pickle.loads(pickle.dumps(jitter)) == jitter
    cpu = transforms.ColorJitter.from_op(jitter, seed=0)
    assert cpu.op is jitter and cpu.brightness == (0.6, 1.4) and cpu.keeps_size
    assert pickle.loads(pickle.dumps(cpu)).op == jitter
    solarize = ops.RandomSolarize(100, p=0.2)
    assert transforms.RandomSolarize.from_op(solarize).op == ops.RandomSolarize(100, 0.2)
    assert gpu.DeviceRandomSolarize.from_op(solarize).op is solarize
    with pytest.raises(TypeError, match=r"RandomSolarize runs a fastdata\.ops\.RandomSolarize"):
        transforms.RandomSolarize.from_op(ops.RandomInvert())


def test_luma_is_pils_l_for_every_rgb_triple() -> None:
    # all 2**24 colours: the float32 transform with the rounding half in its offset column
    # gives PIL's integer ``(19595 R + 38470 G + 7471 B + 32768) >> 16`` everywhere
    levels = np.arange(256, dtype=np.int64)
    red, green, blue = np.meshgrid(levels, levels, levels, indexing="ij")
    rgb = np.stack([red, green, blue], axis=-1).reshape(1, 4096, 4096, 3)
    expected = (19595 * rgb[..., 0] + 38470 * rgb[..., 1] + 7471 * rgb[..., 2] + 32768) >> 16
    assert np.array_equal(luma(rgb.astype(np.uint8)), expected)
    image = np.random.default_rng(0).integers(0, 256, (7, 5, 3), dtype=np.uint8)
    assert np.array_equal(luma(image[None])[0], np.asarray(Image.fromarray(image).convert("L")))


def _extreme_images(
    rng: np.random.Generator, height: int, width: int, channels: int
) -> list[np.ndarray]:
    """Noise, narrow-range noise, all black, all white and black/white checks."""
    shape = (height, width, channels)
    checks = (np.indices(shape).sum(axis=0) % 2 * 255).astype(np.uint8)
    return [
        rng.integers(0, 256, shape, dtype=np.uint8),
        rng.integers(100, 140, shape, dtype=np.uint8),
        np.zeros(shape, np.uint8),
        np.full(shape, 255, np.uint8),
        checks,
    ]


def test_smooth_is_pils_smooth_filter_on_every_size_and_extreme() -> None:
    rng = np.random.default_rng(5)
    for height, width in [(3, 3), (3, 17), (16, 3), (24, 32), (61, 45), (224, 224)]:
        for channels in (1, 3):
            for image in _extreme_images(rng, height, width, channels):
                pil = Image.fromarray(image[..., 0] if channels == 1 else image)
                expected = np.asarray(pil.filter(ImageFilter.SMOOTH)).reshape(image.shape)
                assert np.array_equal(smooth(image[None])[0], expected), (height, width)
    for height, width in [(1, 1), (1, 9), (2, 2), (7, 2)]:  # borders only: kept
        image = rng.integers(0, 256, (1, height, width, 3), dtype=np.uint8)
        assert np.array_equal(smooth(image), image)


def test_blend_into_is_the_float32_blend_for_every_factor() -> None:
    # the in-place blend (no clip between 0 and 1) against the tables' formula
    rng = np.random.default_rng(6)
    edges = [0.0, 1.0, 0.1, 0.5, 0.7, 0.9999999, 1.0000001, 1.9, 5.0]
    factors = edges + rng.uniform(0, 1, 40).tolist() + rng.uniform(1, 3, 40).tolist()
    images = _extreme_images(rng, 19, 23, 3)
    for factor in factors:
        for image in images:
            for degenerate in images:
                expected = blend(degenerate, image, np.float32(factor))
                actual = image.copy()
                blend_into(actual, degenerate, factor)
                assert np.array_equal(actual, expected), factor


@pytest.mark.parametrize(
    ("name", "reference"),
    [("equalize", ImageOps.equalize), ("autocontrast", ImageOps.autocontrast)],
)
def test_histogram_kernels_match_pil_on_extreme_images(
    name: str, reference: Callable[[Image.Image], Image.Image]
) -> None:
    rng = np.random.default_rng(7)
    for height, width in [(1, 1), (5, 3), (24, 32), (64, 48)]:
        for channels in (1, 3):
            images = _extreme_images(rng, height, width, channels)
            spread = rng.integers(0, 256, (height, width, channels), dtype=np.uint8)
            spread[..., 0] = 9  # one constant channel beside varied ones
            images.append(spread)
            for image in images:
                pil = Image.fromarray(image[..., 0] if channels == 1 else image)
                expected = np.asarray(reference(pil)).reshape(image.shape)
                assert np.array_equal(_kernel(name, image[None])[0], expected), (name, image)


def _every_level(channels: int) -> np.ndarray:
    """``(2, 16, 16, channels)``: every level, in order and reversed."""
    levels = np.arange(256, dtype=np.uint8).reshape(16, 16)
    one = np.repeat(levels[..., None], channels, axis=-1)
    return np.stack([one, one[::-1, ::-1]])


@pytest.mark.parametrize(
    ("name", "key", "values"),
    [
        ("posterize", "bits", [0, 1, 2, 3, 4, 5, 6, 7, 8]),
        ("solarize", "threshold", [-3.0, 0.0, 0.5, 1.0, 100.0, 127.2, 128.0, 255.0, 256.0, 300.0]),
        ("solarize_add", "add", [0.0, 1.0, 54.9, 110.0, 128.0, 128.5, 200.0, -7.5]),
    ],
)
def test_bitwise_kernels_equal_their_tables(name: str, key: str, values: list[float]) -> None:
    # the masked arithmetic against the tables the device kernels look up, every level
    for channels in (1, 3):
        images = _every_level(channels)
        for value in values:
            per_sample = np.full(len(images), value, np.int64 if key == "bits" else np.float64)
            luts = PARAMETER_LUTS[name]({key: per_sample})
            expected = np.stack([lut[image] for lut, image in zip(luts, images, strict=True)])
            assert np.array_equal(_kernel(name, images, **{key: value}), expected), value
            # in place on a strided view of a wider batch, the columns between untouched
            wide = np.zeros((2, 16, 32, channels), np.uint8)
            wide[:, :, ::2] = images
            CPU_KERNELS[name](wide[:, :, ::2], {key: per_sample}, {}, [])
            assert np.array_equal(wide[:, :, ::2], expected) and not wide[:, :, 1::2].any()


def test_contrast_means_are_the_rounded_mean_of_pils_l() -> None:
    rng = np.random.default_rng(8)
    for channels in (1, 3):
        images = np.stack(_extreme_images(rng, 31, 17, channels))
        # means on and next to a half: 1x2 images of levels k and k + 1
        halves = np.repeat(np.arange(255, dtype=np.uint8), 2).reshape(255, 1, 2, 1) + np.array(
            [0, 1], np.uint8
        ).reshape(1, 1, 2, 1)
        halves = np.repeat(halves, channels, axis=-1)
        for batch in (images, halves):
            gray = luma(batch) if channels == 3 else batch[..., 0]
            exact = gray.reshape(len(batch), -1).sum(axis=1, dtype=np.int64)
            pixels = batch.shape[1] * batch.shape[2]
            expected = (2 * exact + pixels) // (2 * pixels)  # floor(mean + 0.5) in integers
            assert np.array_equal(contrast_means(batch), expected)


def test_saturation_is_the_float32_blend_with_l_for_every_factor() -> None:
    rng = np.random.default_rng(9)
    images = np.stack(_extreme_images(rng, 21, 26, 3))
    gray = np.repeat(luma(images)[..., None], 3, axis=-1)
    factors = [0.0, 0.1, 0.5, 1.0, 1.0000001, 1.9, 5.0, *rng.uniform(0, 3, 30).tolist()]
    for factor in factors:
        expected = blend(gray, images, np.float32(factor))
        assert np.array_equal(_kernel("saturation", images, factor=factor), expected), factor


def test_hue_planes_equal_the_device_kernels_float32_formula() -> None:
    # the CPU kernel works plane by plane; the device kernel on the CPU is the formula
    rng = np.random.default_rng(10)
    corners = np.array(list(np.ndindex(2, 2, 2)), np.uint8).reshape(1, 8, 1, 3) * 255
    greys = np.repeat(np.arange(0, 256, 15, dtype=np.uint8)[None, :, None, None], 3, axis=-1)
    batches = [np.stack(_extreme_images(rng, 13, 11, 3)), corners, greys]
    shifts = [-0.5, -0.25, -1e-7, -1e-9, 0.0, 1e-7, 0.1, 0.5, *rng.uniform(-0.5, 0.5, 12).tolist()]
    for images in batches:
        planar = torch.from_numpy(images).permute(0, 3, 1, 2).contiguous()
        for shift in shifts:
            factor = np.full(len(images), shift)
            expected, _ = DEVICE_KERNELS["hue"](planar, {"factor": factor}, {}, [])
            actual = _kernel("hue", images, factor=shift)
            assert np.array_equal(actual, expected.permute(0, 2, 3, 1).numpy()), shift
