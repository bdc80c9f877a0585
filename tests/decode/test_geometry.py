from __future__ import annotations

import numpy as np
import pytest

from fastdata import transforms
from fastdata._codec import reduction_factors
from fastdata._crop import DRAWS_PER_BOX
from fastdata.decode import create_decoder
from fastdata.decode._geometry import (
    Box,
    center_box,
    crop_box,
    crop_boxes,
    crop_description,
    parse_size,
    random_box,
)
from fastdata.gpu import DeviceRandomResizedCrop
from fastdata.ops import RandomResizedCrop


def test_parse_size() -> None:
    assert parse_size(224) == (224, 224)
    assert parse_size((200, 300)) == (200, 300)
    with pytest.raises(TypeError, match="size must be an int"):
        parse_size(2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="size must be an int"):
        parse_size(True)
    with pytest.raises(ValueError, match=r"positive int or \(height, width\), got \(0, 10\)"):
        parse_size((0, 10))
    with pytest.raises(ValueError, match=r"positive int or \(height, width\)"):
        parse_size((1, 2, 3))  # type: ignore[arg-type]


def test_one_size_parser_for_every_executor() -> None:
    """The CPU transforms, the decoders and the device crop read sizes alike: bools and
    floats are type errors, zero and three sides value errors."""
    cpu = (transforms.CenterCrop, transforms.RandomResizedCrop, transforms.Resize)
    for build in (*cpu, DeviceRandomResizedCrop, parse_size):
        assert build(np.int64(4)) is not None
        with pytest.raises(TypeError, match="size must be an int"):
            build(True)
        with pytest.raises(TypeError, match="size must be an int"):
            build((4, 2.5))
        with pytest.raises(ValueError, match="size must be a positive int"):
            build((4, 0))


def test_center_box_keeps_output_aspect() -> None:
    assert center_box((300, 400), (224, 224)) == Box(0, 50, 300, 300)
    assert center_box((400, 300), (100, 100)) == Box(50, 0, 300, 300)
    assert center_box((100, 400), (100, 200)) == Box(0, 100, 100, 200)


def test_random_box_is_inside_and_within_ranges() -> None:
    crop = RandomResizedCrop(8, scale=(0.25, 0.5), ratio=(0.75, 1.333))
    rng = np.random.default_rng(0)
    for _ in range(200):
        box = random_box((300, 500), crop, rng.random(DRAWS_PER_BOX))
        assert box.top >= 0 and box.left >= 0
        assert box.top + box.height <= 300 and box.left + box.width <= 500
        assert 0.2 <= box.height * box.width / (300 * 500) <= 0.55
        assert 0.7 <= box.width / box.height <= 1.4


def test_random_box_falls_back_to_clamped_center() -> None:
    # a 1000:10 strip cannot hold any sampled box: fall back to the widest allowed ratio
    box = random_box((10, 1000), RandomResizedCrop(8, scale=(0.9, 1.0)), np.zeros(DRAWS_PER_BOX))
    assert box.height == 10 and box.width == round(10 * 4 / 3)


def test_reduction_only_when_box_is_twice_the_output() -> None:
    boxes = np.array([[0, 0, 1000, 1000], [0, 0, 400, 400], [0, 0, 2000, 2000],
                      [0, 0, 1000, 447], [5, 9, 1792, 1800]])  # fmt: skip
    assert reduction_factors(boxes[:, 2:], (224, 224)).tolist() == [4, 1, 8, 1, 8]
    assert reduction_factors(boxes[:, 2:], (100, 300)).tolist() == [2, 1, 4, 1, 4]


def test_batched_boxes_match_one_at_a_time() -> None:
    rng = np.random.default_rng(3)
    heights, widths = rng.integers(50, 900, 64), rng.integers(50, 900, 64)
    draws = rng.random((64, DRAWS_PER_BOX))
    centred = crop_boxes(np.stack([heights, widths], 1), (224, 160), None, draws)
    crop = RandomResizedCrop((224, 160))
    random = crop_boxes(np.stack([heights, widths], 1), (224, 160), crop, draws)
    for row in range(64):
        source_hw = (int(heights[row]), int(widths[row]))
        assert tuple(centred[row]) == center_box(source_hw, (224, 160))
        assert tuple(random[row]) == random_box(source_hw, crop, draws[row])
        assert crop_box(source_hw, (224, 160), crop, draws[row]) == tuple(random[row])


def test_decoders_take_the_description_or_an_executor_holding_it() -> None:
    """One description, three executors: the decoder runs the description itself, or the
    one a CPU transform or device module holds (and, with the same seed, cuts the same
    boxes as they do)."""
    op = RandomResizedCrop((16, 12), scale=(0.3, 0.9), ratio=(0.5, 2.0))
    cpu = transforms.RandomResizedCrop.from_op(op, seed=4)
    device = DeviceRandomResizedCrop.from_op(op, seed=4)
    expected = cpu.boxes(np.full(8, 40), np.full(8, 60))  # a fresh seed-4 sequence
    for given in (op, cpu, device):
        assert crop_description(given, (16, 12)) is op
        decoder = create_decoder("cpu", size=(16, 12), random_crop=given, seed=4)
        assert decoder.random_crop is op
        boxes = crop_boxes([(40, 60)] * 8, (16, 12), decoder.random_crop, decoder._draws(8))
        np.testing.assert_array_equal(boxes, expected)
    assert crop_description(True, (4, 4)) == RandomResizedCrop(4)
    assert crop_description(False, (4, 4)) is None
    with pytest.raises(ValueError, match=r"has size \(16, 12\) but the decoder outputs \(8, 8\)"):
        create_decoder("cpu", size=8, random_crop=cpu)
    with pytest.raises(TypeError, match=r"random_crop must be a RandomResizedCrop \(the transform"):
        create_decoder("cpu", size=8, random_crop="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"random_crop must be a RandomResizedCrop \(the transform"):
        create_decoder("cpu", size=8, random_crop=transforms.RandomHorizontalFlip())
