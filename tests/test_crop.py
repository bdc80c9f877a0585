from __future__ import annotations

import math

import numpy as np
import pytest

from fastdata._crop import (
    ATTEMPTS,
    DRAWS_PER_BOX,
    centered_boxes,
    check_ranges,
    largest_centered_boxes,
    random_boxes,
)
from fastdata.decode import create_decoder
from fastdata.decode._geometry import random_box
from fastdata.gpu.augment import DeviceRandomResizedCrop
from fastdata.ops import RandomResizedCrop as CropOp
from fastdata.transforms import RandomResizedCrop

SCALE, RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


def test_check_ranges_returns_floats_and_names_the_bad_argument() -> None:
    assert check_ranges((1, 1), [0.5, 2]) == ((1.0, 1.0), (0.5, 2.0))
    with pytest.raises(
        ValueError, match=r"scale must satisfy 0 < low <= high <= 1, got \(0.5, 0.2\)"
    ):
        check_ranges((0.5, 0.2), RATIO)
    with pytest.raises(ValueError, match="scale must satisfy"):
        check_ranges((0.5, 1.5), RATIO)
    with pytest.raises(ValueError, match=r"ratio must satisfy 0 < low <= high, got \(0.0, 1.0\)"):
        check_ranges(SCALE, (0.0, 1.0))
    with pytest.raises(TypeError, match=r"scale must be a \(low, high\) pair of numbers, got 0.5"):
        check_ranges(0.5, RATIO)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ratio must be a"):
        check_ranges(SCALE, (1.0, 2.0, 3.0))
    with pytest.raises(TypeError, match="ratio must be a"):
        check_ranges(SCALE, (True, 2.0))


@pytest.mark.parametrize("build", [CropOp, RandomResizedCrop, DeviceRandomResizedCrop])
def test_every_crop_class_validates_through_check_ranges(build: type) -> None:
    with pytest.raises(ValueError, match="scale must satisfy"):
        build(8, scale=(0.5, 0.2))
    with pytest.raises(TypeError, match="ratio must be a"):
        build(8, ratio="wide")


def test_boxes_stay_inside_the_image() -> None:
    rng = np.random.default_rng(0)
    heights = rng.integers(1, 400, 2000)
    widths = rng.integers(1, 400, 2000)
    boxes = random_boxes(heights, widths, SCALE, RATIO, rng.random((2000, DRAWS_PER_BOX)))
    top, left, height, width = boxes.T
    assert boxes.dtype == np.int64 and boxes.shape == (2000, 4)
    assert (top >= 0).all() and (left >= 0).all() and (height >= 1).all() and (width >= 1).all()
    assert (top + height <= heights).all() and (left + width <= widths).all()


def test_a_fitting_try_follows_the_ranges_and_uses_the_first_draws() -> None:
    rng = np.random.default_rng(1)
    draws = rng.random((500, DRAWS_PER_BOX))
    sizes = np.full(500, 1000)
    scale, ratio = (0.1, 0.5), (0.5, 2.0)  # on a 1000x1000 image the first try always fits
    top, left, height, width = random_boxes(sizes, sizes, scale, ratio, draws).T
    area = height * width / 1e6
    assert (area >= 0.099).all() and (area <= 0.501).all()
    assert (width / height >= 0.498).all() and (width / height <= 2.01).all()
    target = 1e6 * (0.1 + 0.4 * draws[:, 0])
    aspect = np.exp(math.log(0.5) + math.log(4.0) * draws[:, ATTEMPTS])
    np.testing.assert_array_equal(width, np.round(np.sqrt(target * aspect)))
    np.testing.assert_array_equal(top, np.floor(draws[:, -2] * (1000 - height + 1)))
    np.testing.assert_array_equal(left, np.floor(draws[:, -1] * (1000 - width + 1)))
    assert len(set(zip(top.tolist(), left.tolist(), strict=True))) > 450


def test_extreme_aspect_ratios_fall_back_to_the_clamped_centre_box() -> None:
    draws = np.random.default_rng(2).random((2, DRAWS_PER_BOX))
    boxes = random_boxes(np.array([10, 1000]), np.array([1000, 10]), (0.9, 1.0), RATIO, draws)
    wide, tall = round(10 * 4 / 3), round(10 / (3 / 4))
    assert boxes.tolist() == [[0, (1000 - wide) // 2, 10, wide], [(1000 - tall) // 2, 0, tall, 10]]


def test_an_in_range_image_without_a_fitting_try_falls_back_to_the_whole_image() -> None:
    # zero draws: every try is the full area at ratio 3/4, i.e. 7x9 on an 8x8 image
    boxes = random_boxes(np.array([8]), np.array([8]), (1.0, 1.0), RATIO, np.zeros((1, 22)))
    assert boxes.tolist() == [[0, 0, 8, 8]]


def test_draws_just_below_one_stay_inside() -> None:
    draws = np.full((1, DRAWS_PER_BOX), np.nextafter(1.0, 0.0))
    top, left, height, width = random_boxes(np.array([7]), np.array([9]), SCALE, RATIO, draws)[0]
    assert top + height <= 7 and left + width <= 9


def test_seeded_draws_give_the_same_boxes() -> None:
    heights, widths = np.array([20, 5, 300, 7]), np.array([16, 90, 30, 7])

    def sample(seed: int) -> np.ndarray:
        draws = np.random.default_rng(seed).random((4, DRAWS_PER_BOX))
        return random_boxes(heights, widths, SCALE, RATIO, draws)

    np.testing.assert_array_equal(sample(3), sample(3))
    assert not np.array_equal(sample(3), sample(4))


def test_centre_boxes() -> None:
    heights, widths = np.array([300, 400, 100]), np.array([400, 300, 400])
    assert centered_boxes(heights, widths, 100, 50).tolist() == [
        [100, 175, 100, 50],
        [150, 125, 100, 50],
        [0, 175, 100, 50],
    ]
    assert largest_centered_boxes(heights, widths, (1.0, 1.0)).tolist() == [
        [0, 50, 300, 300],
        [50, 0, 300, 300],
        [0, 150, 100, 100],
    ]
    assert largest_centered_boxes(heights, widths, (0.5, 2.0)).tolist() == [
        [0, 0, 300, 400],
        [0, 0, 400, 300],
        [0, 100, 100, 200],
    ]


def test_the_three_crop_classes_cut_the_same_boxes() -> None:
    """Decoders, CPU transforms and GPU module share one sampler: same draws, same boxes."""
    device_boxes = DeviceRandomResizedCrop(8, seed=5).sample_boxes(16, 40, 60).numpy()
    left, top, width, height = device_boxes.T
    cpu_boxes = RandomResizedCrop(8, seed=5).boxes(np.full(16, 40), np.full(16, 60))
    np.testing.assert_array_equal(cpu_boxes, np.stack([top, left, height, width], axis=1))
    draws = np.random.default_rng(6).random((16, DRAWS_PER_BOX))
    decoded = [list(random_box((40, 60), CropOp(8), row)) for row in draws]
    shared = random_boxes(np.full(16, 40), np.full(16, 60), SCALE, RATIO, draws)
    assert decoded == shared.tolist()


def test_one_seed_gives_one_box_in_every_executor() -> None:
    """One random scheme: a seed gives the decoder, the CPU transform and the device
    module the same boxes (in the main process; workers offset the seed by their id)."""
    decoder = create_decoder("cpu", size=8, random_crop=True, seed=5)
    decoded = random_boxes(np.full(16, 40), np.full(16, 60), SCALE, RATIO, decoder._draws(16))
    cpu_boxes = RandomResizedCrop(8, seed=5).boxes(np.full(16, 40), np.full(16, 60))
    left, top, width, height = DeviceRandomResizedCrop(8, seed=5).sample_boxes(16, 40, 60).T
    np.testing.assert_array_equal(decoded, cpu_boxes)
    np.testing.assert_array_equal(cpu_boxes, np.stack([top, left, height, width], axis=1))
    assert not np.array_equal(
        cpu_boxes, RandomResizedCrop(8, seed=6).boxes(np.full(16, 40), np.full(16, 60))
    )
    with pytest.raises(TypeError, match=r"seed must be an int or None, got 1\.5"):
        create_decoder("cpu", size=8, seed=1.5)  # type: ignore[arg-type]
