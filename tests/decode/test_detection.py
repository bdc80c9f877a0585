"""IoU crops decoded in one step: the same crops as the CPU transform from the same seed,
and painted boxes still on their colour after the decode-crop-resize."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from fastdata._fields import apply_geometry
from fastdata.decode.detection import decode_iou_crops
from fastdata.transforms import FieldBatch, Geometry, RandomIoUCrop
from tests.detection_scenes import check_painted, painted_scenes

SIZE = 96


def _encode(images: np.ndarray, extension: str) -> list[np.ndarray]:
    params = [cv2.IMWRITE_JPEG_QUALITY, 97] if extension == ".jpg" else []
    encoded = []
    for image in images:
        ok, data = cv2.imencode(extension, image[..., ::-1], params)  # OpenCV writes BGR
        assert ok
        encoded.append(data.reshape(-1))
    return encoded


@pytest.mark.parametrize("extension", [".jpg", ".png"])
def test_decoded_iou_crops_are_the_transforms_and_boxes_keep_their_colour(extension: str) -> None:
    images, boxes = painted_scenes(24, 240, 320, 13)
    buffers = _encode(images, extension)
    count = len(images)
    transform = RandomIoUCrop(seed=6, size=SIZE)
    draws = RandomIoUCrop(seed=6).uniform(count, transform.op.draws_per_sample)
    out = np.empty((count, SIZE, SIZE, 3), np.uint8)
    crops = decode_iou_crops(buffers, boxes, transform.op, draws, out)
    expected = transform.crops(np.full(count, 240), np.full(count, 320), boxes)
    np.testing.assert_array_equal(crops, expected)
    # the boxes follow the same crops through the CPU movers
    targets = FieldBatch(
        {"boxes": boxes, "labels": [np.arange(len(rows)) for rows in boxes]},
        {"boxes": "boxes", "labels": "box_labels"},
    )
    moved = apply_geometry(transform, targets, Geometry.of(crops, np.full((count, 2), SIZE)))
    judged = 0
    for k in range(count):
        scale = SIZE * SIZE / (crops[k, 2] * crops[k, 3])
        sides = boxes[k][:, 2:] - boxes[k][:, :2]
        areas = sides[:, 0] * sides[:, 1] * scale
        ids = moved["labels"][k]
        judged += check_painted(out[k], moved["boxes"][k], ids, np.arange(len(boxes[k])), areas)
    assert judged >= 30
