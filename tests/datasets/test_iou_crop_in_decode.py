"""A leading RandomIoUCrop(size=...) over encoded images runs in the decode: crops drawn
from the header sizes and the stored boxes, the boxes and labels moved by the same crops,
the same result as decoding first and cropping after."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from fastdata.datasets import ShardDataset, _base, _buffers
from fastdata.shards import FieldSpec
from fastdata.transforms import Compose, RandomHorizontalFlip, RandomIoUCrop
from tests.datasets.conftest import write_shards
from tests.detection_scenes import check_painted, painted_scenes

SIZE = 96
COUNT = 24


@pytest.fixture(params=["png", "jpeg"])
def painted_set(
    tmp_path: Path, request: pytest.FixtureRequest
) -> tuple[Path, np.ndarray, list[np.ndarray]]:
    encoding = request.param
    images, boxes = painted_scenes(COUNT, 120, 160, 17)
    fields = [
        FieldSpec("image", "encoded", "uint8", encoding=encoding, role="image"),
        FieldSpec("boxes", "ragged", "float32", (4,), role="boxes"),
        FieldSpec("labels", "ragged", "int64", (), role="box_labels"),
    ]
    samples = []
    for image, rows in zip(images, boxes, strict=True):
        extension, params = (
            (".png", []) if encoding == "png" else (".jpg", [cv2.IMWRITE_JPEG_QUALITY, 97])
        )
        ok, data = cv2.imencode(extension, image[..., ::-1], params)
        assert ok
        samples.append({"image": data.tobytes(), "boxes": rows, "labels": np.arange(len(rows))})
    return write_shards(tmp_path / "painted", fields, samples, (COUNT,)), images, boxes


def _dataset(root: Path, interpolation: int | None) -> ShardDataset:
    crop = RandomIoUCrop(seed=5, size=SIZE, interpolation=interpolation)
    transform = Compose([crop, RandomHorizontalFlip(seed=6)])
    return ShardDataset(root, fields=("image", "boxes", "labels"), transform=transform)


def test_iou_crop_runs_in_the_decode_and_boxes_follow(
    painted_set: tuple[Path, np.ndarray, list[np.ndarray]],
) -> None:
    root, _images, boxes = painted_set
    in_decode = _dataset(root, None)
    assert in_decode.plan.decode_iou_crop is not None and in_decode.plan.decoded_size == (SIZE,) * 2
    after = _dataset(root, cv2.INTER_LINEAR)  # not the default kernel: decoded first
    assert after.plan.decode_iou_crop is None
    indices = list(range(COUNT))
    images, moved_boxes, labels = in_decode.__getitems__(indices)
    _, reference_boxes, reference_labels = after.__getitems__(indices)
    assert tuple(images.shape) == (COUNT, 3, SIZE, SIZE)
    judged = 0
    crops = RandomIoUCrop(seed=5).crops(np.full(COUNT, 120), np.full(COUNT, 160), boxes)
    pixels = images.permute(0, 2, 3, 1).numpy()
    for k in range(COUNT):
        np.testing.assert_array_equal(labels[k].numpy(), reference_labels[k].numpy())
        np.testing.assert_allclose(moved_boxes[k].numpy(), reference_boxes[k].numpy(), atol=1e-4)
        sides = boxes[k][:, 2:] - boxes[k][:, :2]
        areas = sides[:, 0] * sides[:, 1] * SIZE * SIZE / (crops[k, 2] * crops[k, 3])
        ids = labels[k].numpy()
        judged += check_painted(
            pixels[k], moved_boxes[k].numpy(), ids, np.arange(len(boxes[k])), areas
        )
    assert judged >= 20


def test_iou_crop_in_the_decode_through_the_loader(
    painted_set: tuple[Path, np.ndarray, list[np.ndarray]],
) -> None:
    root, _images, _boxes = painted_set
    dataset = _dataset(root, None)
    loader = dataset.loader(batch_size=8, shuffle=False, num_workers=0)
    batches = list(loader)
    assert len(batches) == COUNT // 8
    images, boxes, labels = batches[0]
    assert tuple(images.shape) == (8, 3, SIZE, SIZE)
    assert all(len(rows) == len(classes) for rows, classes in zip(boxes, labels, strict=True))


def test_a_worker_sends_the_decoded_and_flipped_batch_without_a_copy(
    painted_set: tuple[Path, np.ndarray, list[np.ndarray]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoded into its crops and flipped in place inside a worker, the batch is returned
    as the shared-memory tensor it was decoded into: sending it copies nothing more."""
    root, _images, _boxes = painted_set
    indices = list(range(COUNT))
    expected = _dataset(root, None).__getitems__(indices)
    for module in (_buffers, _base):
        monkeypatch.setattr(module, "get_worker_info", object)  # non-None: as in a worker
    monkeypatch.setattr(_buffers, "_SHARED_MIN_BYTES", 0)
    images, boxes, labels = _dataset(root, None).__getitems__(indices)
    assert images.untyped_storage().is_shared()
    assert torch.equal(images, expected[0])
    for k in range(COUNT):
        assert torch.equal(boxes[k], expected[1][k]) and torch.equal(labels[k], expected[2][k])
