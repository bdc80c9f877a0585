"""Detection geometry on the device (run on CPU tensors everywhere, on CUDA when there is
one): the same crops and boxes as the CPU executors from the same seed, boxes padded on the
device or as lists, painted scenes checked with NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastdata import ops
from fastdata.datasets import pad_ragged
from fastdata.gpu import (
    DeviceLetterbox,
    DeviceRandomHorizontalFlip,
    DeviceRandomIoUCrop,
    PaddedBoxes,
    compact,
)
from fastdata.transforms import FieldBatch, RandomIoUCrop
from tests.detection_scenes import check_painted, kept_object_share, object_masks, painted_scenes

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SIZE = 96
ROLES = {"image": "image", "mask": "mask", "boxes": "boxes", "labels": "box_labels"}


def _fields(
    images: np.ndarray,
    boxes: list[np.ndarray],
    device: str,
    *,
    padded: bool,
    masks: np.ndarray | None = None,
) -> FieldBatch:
    """A device batch: images (B, 3, H, W), boxes and their index as labels, padded
    ``(padded, counts)`` pairs or lists of tensors."""
    box_list = [torch.from_numpy(rows) for rows in boxes]
    label_list = [torch.arange(len(rows)) for rows in boxes]
    values: dict[str, object] = {"image": torch.from_numpy(images).permute(0, 3, 1, 2).to(device)}
    if padded:
        values["boxes"] = tuple(part.to(device) for part in pad_ragged(box_list))
        values["labels"] = tuple(part.to(device) for part in pad_ragged(label_list, -1))
    else:
        values["boxes"] = [rows.to(device) for rows in box_list]
        values["labels"] = [rows.to(device) for rows in label_list]
    if masks is not None:
        values["mask"] = torch.from_numpy(masks).to(device)
    return FieldBatch(values, {name: ROLES[name] for name in values})


def _unpadded(value: object) -> list[np.ndarray]:
    """Per-sample rows of a padded pair or a list, on the host."""
    if isinstance(value, tuple):
        padded, counts = value
        return [
            rows[:count].cpu().numpy() for rows, count in zip(padded, counts.tolist(), strict=True)
        ]
    return [rows.cpu().numpy() for rows in value]  # type: ignore[attr-defined]


def _device_detection(batch: FieldBatch, seed: int) -> FieldBatch:
    moved = DeviceRandomIoUCrop(size=SIZE, seed=seed)(batch)
    return DeviceRandomHorizontalFlip(seed=seed + 1)(moved)


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("device", DEVICES)
def test_device_crops_and_boxes_equal_the_cpu_executors(device: str, padded: bool) -> None:
    images, boxes = painted_scenes(32, 120, 160, 11)
    count = len(images)
    cpu_crops = RandomIoUCrop(seed=3).crops(np.full(count, 120), np.full(count, 160), boxes)
    device_batch = _fields(images, boxes, device, padded=padded)
    if padded:
        padded_boxes = PaddedBoxes.from_list(boxes, device)
        device_crops = DeviceRandomIoUCrop(size=SIZE, seed=3).crops(
            device_batch["image"], padded_boxes
        )
        np.testing.assert_array_equal(device_crops.cpu().numpy(), cpu_crops)
    moved = DeviceRandomIoUCrop(size=SIZE, seed=3)(device_batch)
    on_cpu = RandomIoUCrop(seed=3, size=SIZE).apply_batch(
        FieldBatch(
            {"image": images, "boxes": boxes, "labels": [np.arange(len(r)) for r in boxes]},
            {"image": "image", "boxes": "boxes", "labels": "box_labels"},
        )
    )
    for name in ("boxes", "labels"):
        for ours, theirs in zip(_unpadded(moved[name]), on_cpu[name], strict=True):
            np.testing.assert_allclose(ours, theirs, atol=1e-3)


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("device", DEVICES)
def test_painted_boxes_follow_their_colour_on_the_device(device: str, padded: bool) -> None:
    judged = 0
    for seed in range(3):
        images, boxes = painted_scenes(24, 120, 160, seed)
        moved = _device_detection(_fields(images, boxes, device, padded=padded), seed)
        pixels = moved["image"].permute(0, 2, 3, 1).cpu().numpy()
        count = len(images)
        crops = RandomIoUCrop(seed=seed).crops(np.full(count, 120), np.full(count, 160), boxes)
        for k, (rows, ids) in enumerate(
            zip(_unpadded(moved["boxes"]), _unpadded(moved["labels"]), strict=True)
        ):
            sides = boxes[k][:, 2:] - boxes[k][:, :2]
            areas = sides[:, 0] * sides[:, 1] * SIZE * SIZE / (crops[k, 2] * crops[k, 3])
            judged += check_painted(pixels[k], rows, ids, np.arange(len(boxes[k])), areas)
    assert judged >= 30


@pytest.mark.parametrize("device", DEVICES)
def test_device_boxes_cover_95_percent_of_visible_object_pixels(device: str) -> None:
    masks, boxes = object_masks(64, 120, 160, seed=3)
    images = np.repeat(masks[..., None] * 200, 3, axis=-1)
    visible = covered = 0
    for seed in range(3):
        batch = _fields(images, boxes, device, padded=True, masks=masks)
        moved = _device_detection(batch, seed)
        for mask, rows in zip(moved["mask"].cpu().numpy(), _unpadded(moved["boxes"]), strict=True):
            seen, inside = kept_object_share(mask, rows)
            visible, covered = visible + seen, covered + inside
    assert visible > 0 and covered / visible >= 0.95


@pytest.mark.parametrize("padded", [True, False])
@pytest.mark.parametrize("device", DEVICES)
def test_device_letterbox_pads_and_moves_boxes(device: str, padded: bool) -> None:
    images, boxes = painted_scenes(4, 60, 120, 9)
    moved = DeviceLetterbox(SIZE)(_fields(images, boxes, device, padded=padded))
    pixels = moved["image"].permute(0, 2, 3, 1).cpu().numpy()
    assert (pixels[:, :23] == 114).all() and (pixels[:, 73:] == 114).all()
    for k, rows in enumerate(_unpadded(moved["boxes"])):
        np.testing.assert_allclose(rows, boxes[k] * 0.8 + [0, 24, 0, 24], atol=1e-4)
        ids = np.arange(len(boxes[k]))
        check_painted(pixels[k], rows, ids, ids)


@pytest.mark.parametrize("device", DEVICES)
def test_padded_boxes_never_leave_the_device(device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    images, boxes = painted_scenes(8, 60, 80, 4)
    batch = _fields(images, boxes, device, padded=True)
    # the host movers are the list path's: the padded path must not call them
    monkeypatch.setattr("fastdata.gpu.augment.apply_geometry", _refuse)
    if device == "cuda":  # and nothing waits for the GPU: a synchronising call raises
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
    try:
        moved = _device_detection(batch, 0)
        letterboxed = DeviceLetterbox(SIZE)(batch)
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    assert letterboxed["boxes"][0].shape == batch["boxes"][0].shape
    assert isinstance(moved["boxes"], tuple) and moved["boxes"][0].device == batch["image"].device
    assert moved["labels"][0].shape[:2] == moved["boxes"][0].shape[:2]


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("padded boxes were moved on the host")


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
    with pytest.raises(ValueError, match="min_visibility"):
        DeviceRandomIoUCrop(size=4, min_visibility=2.0)
    assert crop(images).shape == (2, 3, 4, 4)  # no boxes: a crop of good shape each
    assert DeviceRandomIoUCrop.from_op(ops.RandomIoUCrop(), size=4).size == (4, 4)
    boxes = PaddedBoxes.from_list([np.array([[0, 0, 4, 4]], np.float32), np.zeros((0, 4))])
    out, moved = DeviceLetterbox(4)(images, boxes=boxes)
    assert out.shape == (2, 3, 4, 4) and moved.valid.tolist() == [[True], [False]]
