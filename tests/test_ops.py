"""The augmentation descriptions: validation, declared outputs, and one result from one
description whichever executor runs it."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from fastdata import ops, transforms
from fastdata.decode import create_decoder
from fastdata.decode._geometry import crop_boxes
from fastdata.gpu import DeviceRandomHorizontalFlip, DeviceRandomResizedCrop


def test_descriptions_validate_their_arguments_once() -> None:
    with pytest.raises(TypeError, match="size must be an int"):
        ops.RandomResizedCrop(True)
    with pytest.raises(ValueError, match="size must be a positive int"):
        ops.CenterCrop((4, 0))
    with pytest.raises(TypeError, match="size must be an int"):
        ops.Resize(2.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scale must satisfy"):
        ops.RandomResizedCrop(8, scale=(0.5, 0.2))
    with pytest.raises(ValueError, match="ratio must satisfy"):
        ops.RandomResizedCrop(8, ratio=(0.0, 1.0))
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\], got 1\.5"):
        ops.RandomHorizontalFlip(1.5)
    with pytest.raises(TypeError, match="p must be a number"):
        ops.RandomHorizontalFlip("half")  # type: ignore[arg-type]
    # the executors validate through their description
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        transforms.RandomHorizontalFlip(-0.1)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        DeviceRandomHorizontalFlip(2.0)


def test_descriptions_are_frozen_values() -> None:
    crop = ops.RandomResizedCrop([24, 32], scale=(0.5, 1), ratio=[1, 2])
    assert crop == ops.RandomResizedCrop((24, 32), (0.5, 1.0), (1.0, 2.0))
    assert (crop.size, crop.scale, crop.ratio) == ((24, 32), (0.5, 1.0), (1.0, 2.0))
    assert hash(crop) == hash(ops.RandomResizedCrop((24, 32), (0.5, 1.0), (1.0, 2.0)))
    assert pickle.loads(pickle.dumps(crop)) == crop
    assert ops.Resize(8) != ops.Resize((8, 8))
    with pytest.raises(AttributeError):
        crop.size = (1, 1)  # type: ignore[misc]


def test_descriptions_declare_their_output() -> None:
    crop, centre = ops.RandomResizedCrop((12, 9)), ops.CenterCrop(8)
    shorter, pair, flip = ops.Resize(16), ops.Resize((20, 10)), ops.RandomHorizontalFlip()
    assert crop.output_size((3, 400)) == (12, 9) and crop.output_size(None) == (12, 9)
    assert centre.output_size((8, 30)) == (8, 8)
    with pytest.raises(
        ValueError, match=r"CenterCrop size \(8, 8\) is larger than an image of 7x30"
    ):
        centre.output_size((7, 30))
    assert shorter.output_size((32, 64)) == (16, 32) and shorter.output_size(None) is None
    assert shorter.output_size((45, 30)) == (24, 16)  # torchvision truncates the longer side
    assert pair.output_size(None) == (20, 10)
    assert flip.output_size((5, 7)) == (5, 7)
    assert [op.min_input_side for op in (crop, centre, shorter, pair, flip)] == [
        None,
        None,
        16,
        10,
        None,
    ]
    assert [op.reads_only for op in (crop, centre, shorter, flip)] == [True, True, True, False]
    assert [op.keeps_size for op in (crop, centre, shorter, flip)] == [False, False, False, True]
    assert [op.draws_per_sample for op in (crop, centre, shorter, flip)] == [22, 0, 0, 1]


def test_executors_hold_their_description_and_declare_what_it_does() -> None:
    op = ops.Resize(16)
    cpu = transforms.Resize.from_op(op)
    assert cpu.op is op and cpu.min_input_side == 16 and not cpu.in_place
    assert transforms.Resize(16).op == op
    assert repr(transforms.RandomHorizontalFlip(0.25)) == "RandomHorizontalFlip(p=0.25)"
    assert transforms.RandomHorizontalFlip().in_place
    assert DeviceRandomResizedCrop(8, seed=1).op == ops.RandomResizedCrop(8)
    with pytest.raises(TypeError, match=r"RandomResizedCrop runs a fastdata\.ops\.RandomResized"):
        transforms.RandomResizedCrop.from_op(ops.CenterCrop(8))
    with pytest.raises(
        TypeError, match=r"DeviceRandomHorizontalFlip runs a fastdata\.ops\.RandomHo"
    ):
        DeviceRandomHorizontalFlip.from_op(ops.RandomResizedCrop(8))


def test_one_description_one_seed_one_box_in_every_executor() -> None:
    """The CPU transform, the decoder and the device module built from one description
    object cut the same boxes from one seed (main process: worker 0)."""
    op = ops.RandomResizedCrop((16, 12), scale=(0.2, 0.9), ratio=(0.6, 1.8))
    heights, widths = np.full(32, 90), np.full(32, 70)
    cpu_boxes = transforms.RandomResizedCrop.from_op(op, seed=21).boxes(heights, widths)
    decoder = create_decoder("cpu", size=op.size, random_crop=op, seed=21)
    decoded = crop_boxes(
        np.stack([heights, widths], 1), op.size, decoder.random_crop, decoder._draws(32)
    )
    left, top, width, height = (
        DeviceRandomResizedCrop.from_op(op, seed=21).sample_boxes(32, 90, 70).T
    )
    device_boxes = np.stack([top, left, height, width], axis=1)
    np.testing.assert_array_equal(cpu_boxes, decoded)
    np.testing.assert_array_equal(cpu_boxes, device_boxes)
    assert len({tuple(box) for box in cpu_boxes.tolist()}) > 16  # the boxes do vary


def test_one_description_one_seed_one_flip_on_cpu_and_device() -> None:
    op = ops.RandomHorizontalFlip(0.5)
    images = torch.arange(16 * 2 * 5 * 3, dtype=torch.uint8).reshape(16, 2, 5, 3)
    images = images.permute(0, 3, 1, 2)  # (B, C, H, W), channels-last memory
    cpu = transforms.RandomHorizontalFlip.from_op(op, seed=8)(images.clone())
    device = DeviceRandomHorizontalFlip.from_op(op, seed=8)(images)
    assert torch.equal(cpu, device)  # type: ignore[arg-type]
    flipped = [k for k in range(16) if not torch.equal(cpu[k], images[k])]  # type: ignore[index]
    assert 0 < len(flipped) < 16
