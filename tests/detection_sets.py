"""Tiny detection sets written by the tests: photos with painted boxes, and their COCO,
YOLO and VOC annotations, with the boxes as written for references worked out by hand."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (40, 60, 230)}
# (width, height) of the photos in turn: a 2:1 downscale to 40 leaves whole pixels
PHOTO_SIZES = ((80, 60), (60, 80), (40, 40))


@dataclass
class DetectionSet:
    """Where a set is and what it holds.

    Attributes:
        images: The image folder.
        boxes: Per image (in file-name order), ``(N, 4)`` float64 xyxy pixels.
        labels: Per image, ``(N,)`` int64 class indices into ``class_names``.
        sizes: Per image, ``(width, height)``.
    """

    images: Path
    boxes: list[np.ndarray]
    labels: list[np.ndarray]
    sizes: list[tuple[int, int]]
    class_names: tuple[str, ...] = tuple(COLOURS)


def painted_photos(root: Path, num_images: int = 12, seed: int = 0) -> DetectionSet:
    """``root/img_000.jpg``...: grey noise with 0-3 solid rectangles of the class colours;
    box corners are even pixels, so a 2:1 downscale keeps them whole."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    boxes, labels, sizes = [], [], []
    for index in range(num_images):
        width, height = PHOTO_SIZES[index % len(PHOTO_SIZES)]
        pixels = rng.integers(90, 140, (height, width, 3), dtype=np.uint8)
        count = index % 4
        image_boxes, image_labels = [], []
        for _ in range(count):
            box_w, box_h = 2 * rng.integers(5, 10, 2)
            x1 = 2 * rng.integers(0, (width - box_w) // 2 + 1)
            y1 = 2 * rng.integers(0, (height - box_h) // 2 + 1)
            label = int(rng.integers(0, len(COLOURS)))
            pixels[y1 : y1 + box_h, x1 : x1 + box_w] = list(COLOURS.values())[label]
            image_boxes.append([x1, y1, x1 + box_w, y1 + box_h])
            image_labels.append(label)
        Image.fromarray(pixels).save(root / f"img_{index:03d}.jpg", quality=95)
        boxes.append(np.asarray(image_boxes, np.float64).reshape(-1, 4))
        labels.append(np.asarray(image_labels, np.int64))
        sizes.append((width, height))
    return DetectionSet(root, boxes, labels, sizes)


def write_coco(photos: DetectionSet, path: Path) -> Path:
    """A COCO file: image ids 100, 101...; category ids 1, 2, 3 (red, green, blue)."""
    images = [
        {"id": 100 + i, "file_name": f"img_{i:03d}.jpg", "width": w, "height": h}
        for i, (w, h) in enumerate(photos.sizes)
    ]
    annotations = []
    for i, (boxes, labels) in enumerate(zip(photos.boxes, photos.labels, strict=True)):
        for box, label in zip(boxes, labels, strict=True):
            x1, y1, x2, y2 = (float(v) for v in box)
            annotations.append(
                {"id": len(annotations) + 1, "image_id": 100 + i, "category_id": int(label) + 1,
                 "bbox": [x1, y1, x2 - x1, y2 - y1], "iscrowd": 0, "area": (x2 - x1) * (y2 - y1)}
            )  # fmt: skip
    categories = [{"id": i + 1, "name": name} for i, name in enumerate(photos.class_names)]
    path.write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    return path


def write_yolo(photos: DetectionSet, folder: Path) -> Path:
    """One ``.txt`` per photo with boxes (photos without boxes have none), and
    ``classes.txt``."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, (boxes, labels, (w, h)) in enumerate(
        zip(photos.boxes, photos.labels, photos.sizes, strict=True)
    ):
        if not len(boxes):
            continue
        lines = [
            f"{label} {(x1 + x2) / 2 / w} {(y1 + y2) / 2 / h} {(x2 - x1) / w} {(y2 - y1) / h}"
            for (x1, y1, x2, y2), label in zip(boxes, labels, strict=True)
        ]
        (folder / f"img_{i:03d}.txt").write_text("\n".join(lines) + "\n")
    (folder / "classes.txt").write_text("\n".join(photos.class_names) + "\n")
    return folder


def write_voc(photos: DetectionSet, folder: Path) -> Path:
    """One VOC ``.xml`` per photo (1-based inclusive corners)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i, (boxes, labels, (w, h)) in enumerate(
        zip(photos.boxes, photos.labels, photos.sizes, strict=True)
    ):
        objects = "".join(
            f"<object><name>{photos.class_names[label]}</name><difficult>0</difficult>"
            f"<bndbox><xmin>{int(x1) + 1}</xmin><ymin>{int(y1) + 1}</ymin>"
            f"<xmax>{int(x2)}</xmax><ymax>{int(y2)}</ymax></bndbox></object>"
            for (x1, y1, x2, y2), label in zip(boxes, labels, strict=True)
        )
        (folder / f"img_{i:03d}.xml").write_text(
            f"<annotation><filename>img_{i:03d}.jpg</filename><size><width>{w}</width>"
            f"<height>{h}</height><depth>3</depth></size>{objects}</annotation>"
        )
    return folder


def letterboxed(photos: DetectionSet, side: int) -> list[np.ndarray]:
    """The boxes after ``resize="pad"`` to ``side``: scaled by ``side / longer side`` and
    shifted by the centred padding (whole pixels for :data:`PHOTO_SIZES` and side 40)."""
    out = []
    for boxes, (w, h) in zip(photos.boxes, photos.sizes, strict=True):
        scale = side / max(w, h)
        new_w, new_h = round(w * scale), round(h * scale)
        left, top = (side - new_w) // 2, (side - new_h) // 2
        out.append(boxes * scale + [left, top, left, top])
    return out
