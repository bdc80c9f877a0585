"""Detection datasets as a preprocessing source: ``(image, {"boxes", "labels", ...})`` items
written as image + boxes + box labels fields with roles, boxes following the offline resize
(NumPy references), bad annotations skipped or refused like bad images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from fastdata import PreprocessOptions, ShardDataset, load_manifest
from fastdata.errors import PreprocessError
from fastdata.preprocess import preprocess

COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]


class Detection:
    """Item i: a PIL image of ``sizes[i]`` with its boxes painted in solid colours."""

    def __init__(self, boxes: list[np.ndarray], sizes: list[tuple[int, int]], **extra: Any):
        self.boxes = boxes
        self.sizes = sizes
        self.extra = extra

    def __len__(self) -> int:
        return len(self.boxes)

    def __getitem__(self, index: int) -> tuple[Image.Image, dict[str, Any]]:
        height, width = self.sizes[index]
        pixels = np.full((height, width, 3), 128, np.uint8)
        boxes = self.boxes[index]
        for k, (x1, y1, x2, y2) in enumerate(np.nan_to_num(boxes).astype(int).tolist()):
            pixels[max(y1, 0) : y2, max(x1, 0) : x2] = COLOURS[k % 3]
        target = {
            "boxes": boxes,
            "labels": np.arange(len(boxes)) + 1,
            "image_id": index,  # not per box: not stored
            **{key: values[index] for key, values in self.extra.items()},
        }
        return Image.fromarray(pixels), target


BOXES = [
    np.array([[10, 5, 30, 25], [60, 30, 90, 45]], np.float32),
    np.zeros((0, 4), np.float32),
    np.array([[0, 0, 40, 80]], np.float32),
]
SIZES = [(50, 100), (40, 40), (80, 60)]  # (H, W)


def letterbox_reference(boxes: np.ndarray, height: int, width: int, side: int) -> np.ndarray:
    scale = side / max(height, width)
    new_h, new_w = round(height * scale), round(width * scale)
    pad_top, pad_left = (side - new_h) // 2, (side - new_w) // 2
    factors = np.array([new_w / width, new_h / height] * 2)
    return boxes * factors + [pad_left, pad_top, pad_left, pad_top]


def test_letterbox_scales_and_shifts_boxes(tmp_path: Path) -> None:
    iscrowd = [np.array([0, 1]), np.zeros(0, np.int64), np.array([1])]
    dataset = Detection(BOXES, SIZES, iscrowd=iscrowd)
    preprocess(dataset, tmp_path, PreprocessOptions(sizes=(64,), resize="pad"), show_progress=False)
    manifest = load_manifest(tmp_path)
    roles = {spec.name: spec.role for spec in manifest.fields}
    assert roles == {
        "image": "image",
        "boxes": "boxes",
        "labels": "box_labels",
        "iscrowd": "other",
        "path": "path",
    }
    ds = ShardDataset(tmp_path, fields=("image", "boxes", "labels", "iscrowd"))
    images, boxes, labels, crowd = ds.__getitems__([0, 1, 2])
    assert tuple(images.shape) == (3, 3, 64, 64)
    for i in range(3):
        expected = letterbox_reference(BOXES[i], *SIZES[i], 64)
        np.testing.assert_allclose(boxes[i].numpy(), expected, atol=1e-4)
        assert labels[i].tolist() == list(range(1, len(BOXES[i]) + 1))
        assert crowd[i].tolist() == iscrowd[i].tolist()
    # painted rectangles: each box still holds its colour, and >= 90 % of that colour
    picture = images[0].permute(1, 2, 0).numpy().astype(int)
    for k, box in enumerate(boxes[0].numpy()):
        colour = np.abs(picture - COLOURS[k]).sum(axis=2) < 60
        x1, y1, x2, y2 = np.round(box).astype(int)
        inside = colour[y1:y2, x1:x2].sum()
        assert inside >= 0.9 * colour.sum() and colour.sum() > 0


def test_shorter_crop_drops_boxes_outside_with_their_labels(tmp_path: Path) -> None:
    # 50x100 -> centre 50x50 crop (x 25..75): box 0 keeps 5 of 20 columns (25 %),
    # a box at x 0..10 is gone
    boxes = [np.array([[10, 5, 30, 25], [0, 0, 10, 10], [40, 10, 60, 40]], np.float32)]
    preprocess(
        Detection(boxes, [(50, 100)]),
        tmp_path,
        PreprocessOptions(sizes=(25,), resize="shorter"),
        show_progress=False,
    )
    ds = ShardDataset(tmp_path, fields=("boxes", "labels"))
    kept, labels = ds[0]
    assert labels.tolist() == [1, 3]
    np.testing.assert_allclose(kept.numpy(), [[0, 2.5, 2.5, 12.5], [7.5, 5, 17.5, 20]])


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (np.array([[np.nan, 0, 5, 5]], np.float32), "NaN"),
        (np.array([[20, 0, 5, 5]], np.float32), "negative size"),
        (np.array([[0, 0, 500, 5]], np.float32), "outside"),
    ],
)
def test_bad_annotations_are_counted_skips_or_errors(
    tmp_path: Path, bad: np.ndarray, reason: str
) -> None:
    boxes = [BOXES[0], bad, BOXES[2]]
    summary = preprocess(
        Detection(boxes, SIZES),
        tmp_path / "skip",
        PreprocessOptions(sizes=(32,)),
        show_progress=False,
    )
    manifest = load_manifest(tmp_path / "skip")
    assert manifest.num_samples == 2
    assert [entry["reason"] for entry in manifest.skipped] == [
        next(entry["reason"] for entry in manifest.skipped)
    ]
    assert reason in manifest.skipped[0]["reason"]
    assert summary is not None
    with pytest.raises(PreprocessError, match=reason):
        preprocess(
            Detection(boxes, SIZES),
            tmp_path / "raise",
            PreprocessOptions(sizes=(32,), on_error="raise"),
            show_progress=False,
        )


class Mismatched(Detection):
    def __getitem__(self, index: int) -> tuple[Image.Image, dict[str, Any]]:
        image, target = super().__getitem__(index)
        if index == 1:
            target["labels"] = np.array([1, 2, 3])
        return image, target


def test_labels_not_one_per_box_are_skipped(tmp_path: Path) -> None:
    preprocess(
        Mismatched(BOXES, SIZES), tmp_path, PreprocessOptions(sizes=(32,)), show_progress=False
    )
    manifest = load_manifest(tmp_path)
    assert manifest.num_samples == 2
    assert "3 labels for 0 boxes" in manifest.skipped[0]["reason"]
