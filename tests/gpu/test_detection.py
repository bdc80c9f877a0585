"""Detection geometry on the device (run on CPU tensors everywhere, on CUDA when there is
one): the same crops and boxes as the CPU executors from the same seed, painted scenes
checked with NumPy, no host sync needed for boxes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata import ops
from fastdata.gpu import (
    DeviceLetterbox,
    DeviceRandomHorizontalFlip,
    DeviceRandomIoUCrop,
    PaddedBoxes,
    compact,
)
from fastdata.transforms import Geometry, RandomIoUCrop, move_boxes
from tests.detection_scenes import check_painted, kept_object_share, object_masks, painted_scenes

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SIZE = 96


def _device_detection(
    images: np.ndarray, masks: np.ndarray | None, boxes: list[np.ndarray], seed: int, device: str
) -> tuple[torch.Tensor, torch.Tensor | None, PaddedBoxes]:
    batch = torch.from_numpy(images).permute(0, 3, 1, 2).to(device)
    padded = PaddedBoxes.from_list(boxes, device)
    crop = DeviceRandomIoUCrop(size=SIZE, seed=seed)
    flip = DeviceRandomHorizontalFlip(seed=seed + 1)
    if masks is None:
        out, moved = crop(batch, boxes=padded)
        out, moved = flip(out, boxes=moved)
        return out, None, moved
    out, out_masks, moved = crop(batch, torch.from_numpy(masks).to(device), padded)
    out, out_masks, moved = flip(out, out_masks, moved)
    return out, out_masks, moved


@pytest.mark.parametrize("device", DEVICES)
def test_device_crops_and_boxes_equal_the_cpu_executors(device: str) -> None:
    images, boxes = painted_scenes(32, 120, 160, 11)
    count = len(images)
    batch = torch.from_numpy(images).permute(0, 3, 1, 2).to(device)
    padded = PaddedBoxes.from_list(boxes, device)
    device_crops = DeviceRandomIoUCrop(size=SIZE, seed=3).crops(batch, padded)
    cpu = RandomIoUCrop(seed=3).geometry(np.full(count, 120), np.full(count, 160), boxes)
    np.testing.assert_array_equal(device_crops.cpu().numpy(), cpu.crops.astype(np.int64))
    _, moved = DeviceRandomIoUCrop(size=SIZE, seed=3)(batch, boxes=padded)
    kept, _ = move_boxes(boxes, Geometry(cpu.crops, np.full((count, 2), SIZE)))
    for device_boxes, cpu_boxes in zip(moved.to_list(), kept, strict=True):
        np.testing.assert_allclose(device_boxes.cpu().numpy(), cpu_boxes, atol=1e-3)


@pytest.mark.parametrize("device", DEVICES)
def test_painted_boxes_follow_their_colour_on_the_device(device: str) -> None:
    judged = 0
    for seed in range(3):
        images, boxes = painted_scenes(24, 120, 160, seed)
        out, _, moved = _device_detection(images, None, boxes, seed, device)
        pixels = out.permute(0, 2, 3, 1).cpu().numpy()
        kept_rows = moved.valid.cpu().numpy()
        rows = moved.boxes.cpu().numpy()
        crops = DeviceRandomIoUCrop(size=SIZE, seed=seed).crops(
            torch.from_numpy(images).permute(0, 3, 1, 2), PaddedBoxes.from_list(boxes)
        )
        for k in range(len(images)):
            ids = np.flatnonzero(kept_rows[k])
            height, width = crops[k, 2:].tolist()
            sides = boxes[k][:, 2:] - boxes[k][:, :2]
            areas = sides[:, 0] * sides[:, 1] * SIZE * SIZE / (height * width)
            judged += check_painted(pixels[k], rows[k][ids], ids, np.arange(len(boxes[k])), areas)
    assert judged >= 30


@pytest.mark.parametrize("device", DEVICES)
def test_device_boxes_cover_95_percent_of_visible_object_pixels(device: str) -> None:
    masks, boxes = object_masks(64, 120, 160, seed=3)
    images = np.repeat(masks[..., None] * 200, 3, axis=-1)
    visible = covered = 0
    for seed in range(3):
        _, out_masks, moved = _device_detection(images, masks, boxes, seed, device)
        assert out_masks is not None
        for mask, sample_boxes in zip(out_masks.cpu().numpy(), moved.to_list(), strict=True):
            seen, inside = kept_object_share(mask, sample_boxes.cpu().numpy())
            visible, covered = visible + seen, covered + inside
    assert visible > 0 and covered / visible >= 0.95


@pytest.mark.parametrize("device", DEVICES)
def test_device_letterbox_pads_and_moves_boxes(device: str) -> None:
    images, boxes = painted_scenes(4, 60, 120, 9)
    batch = torch.from_numpy(images).permute(0, 3, 1, 2).to(device)
    out, moved = DeviceLetterbox(SIZE)(batch, boxes=PaddedBoxes.from_list(boxes, device))
    pixels = out.permute(0, 2, 3, 1).cpu().numpy()
    assert (pixels[:, :23] == 114).all() and (pixels[:, 73:] == 114).all()
    for k, sample_boxes in enumerate(moved.to_list()):
        np.testing.assert_allclose(
            sample_boxes.cpu().numpy(), boxes[k] * 0.8 + [0, 24, 0, 24], atol=1e-4
        )
        ids = np.arange(len(boxes[k]))
        check_painted(pixels[k], sample_boxes.cpu().numpy(), ids, ids)


def test_compact_moves_valid_boxes_first_with_their_fields() -> None:
    boxes = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 4)
    valid = torch.tensor([[False, True, True], [True, False, False]])
    labels = torch.tensor([[7, 8, 9], [4, 5, 6]])
    moved, counts, (moved_labels,) = compact(PaddedBoxes(boxes, valid), labels)
    assert counts.tolist() == [2, 1]
    assert moved_labels[0, :2].tolist() == [8, 9] and moved_labels[1, 0].item() == 4
    assert torch.equal(moved.boxes[0, :2], boxes[0, 1:])
    assert moved.valid.tolist() == [[True, True, False], [True, False, False]]


def test_device_modules_check_their_boxes_and_describe_themselves() -> None:
    images = torch.zeros(2, 3, 8, 8, dtype=torch.uint8)
    crop = DeviceRandomIoUCrop(size=4, seed=0)
    assert crop.op == ops.RandomIoUCrop()
    with pytest.raises(TypeError, match="PaddedBoxes"):
        crop(images, boxes=[torch.zeros(0, 4)] * 2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="do not match"):
        crop(images, boxes=PaddedBoxes.from_list([np.zeros((1, 4))]))
    # no boxes at all: still one crop per sample, resized
    assert crop(images).shape == (2, 3, 4, 4)
    assert DeviceRandomIoUCrop.from_op(ops.RandomIoUCrop(), size=4).size == (4, 4)
