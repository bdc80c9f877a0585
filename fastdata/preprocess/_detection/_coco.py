"""COCO detection annotations (``instances_*.json``) as a dataset of images and boxes."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fastdata.preprocess._detection._common import (
    AnnotationError,
    DetectionSource,
    TableBuilder,
    box_problems,
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _load_json(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as file:
            data = json.load(file)
    except FileNotFoundError as exc:
        raise AnnotationError(f"COCO annotation file does not exist: {path}") from exc
    except OSError as exc:
        raise AnnotationError(f"cannot read COCO annotation file {path}: {exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AnnotationError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise AnnotationError(
            f"{path} holds a JSON {type(data).__name__}; a COCO file is an object with "
            "'images', 'annotations' and 'categories' lists"
        )
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            found = "no" if key not in data else f"a {type(data[key]).__name__} as"
            raise AnnotationError(
                f"{path} has {found} '{key}'; a COCO detection file has 'images', "
                "'annotations' and 'categories' lists"
            )
    return data


def _categories(path: Path, entries: list[Any]) -> tuple[list[int], list[str]]:
    """Category ids sorted, and their names (label ``i`` is category ``ids[i]``)."""
    names: dict[int, str] = {}
    for position, entry in enumerate(entries):
        if not (isinstance(entry, dict) and _is_int(entry.get("id"))):
            raise AnnotationError(
                f"{path}: categories[{position}] = {entry!r:.80} has no integer 'id'"
            )
        if entry["id"] in names:
            raise AnnotationError(f"{path}: category id {entry['id']} is listed twice")
        name = entry.get("name", str(entry["id"]))
        names[entry["id"]] = name if isinstance(name, str) else str(name)
    ids = sorted(names)
    return ids, [names[i] for i in ids]


def _images(path: Path, entries: list[Any]) -> dict[int, tuple[str, tuple[int, int]]]:
    """``{image id: (file_name, (width, height) or (0, 0))}``, sorted by id."""
    images: dict[int, tuple[str, tuple[int, int]]] = {}
    for position, entry in enumerate(entries):
        if not (
            isinstance(entry, dict)
            and _is_int(entry.get("id"))
            and isinstance(entry.get("file_name"), str)
        ):
            raise AnnotationError(
                f"{path}: images[{position}] = {entry!r:.80} needs an integer 'id' and a "
                "'file_name'"
            )
        if entry["id"] in images:
            raise AnnotationError(f"{path}: image id {entry['id']} is listed twice")
        width, height = entry.get("width", 0), entry.get("height", 0)
        if not (_is_int(width) and _is_int(height) and width >= 0 and height >= 0):
            raise AnnotationError(
                f"{path}: image id {entry['id']} has width {width!r} and height {height!r}; "
                "expected non-negative integers"
            )
        size = (width, height) if width and height else (0, 0)
        images[entry["id"]] = (entry["file_name"], size)
    return dict(sorted(images.items()))


def _annotation_problem(entry: Any, labels: dict[int, int]) -> str | None:
    """What makes an annotation unusable apart from its box's geometry, or ``None``."""
    bbox = entry.get("bbox")
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(map(_is_number, bbox))):
        return f"has bbox {bbox!r:.60}; expected [x, y, width, height] numbers"
    category = entry.get("category_id")
    if not _is_int(category) or category not in labels:
        return f"has category_id {category!r}, which is not in 'categories'"
    for flag in ("iscrowd", "ignore"):
        if flag in entry and entry[flag] not in (0, 1):
            return f"has {flag} {entry[flag]!r}; expected 0 or 1"
    return None


class CocoDetection(DetectionSource):
    """Images and boxes of a COCO detection file (``instances_train2017.json``).

    Rules: items are the file's ``images``, sorted by id (``image_ids[i]`` is item
    ``i``'s), each read from ``images / file_name``; an image without annotations has
    ``N = 0`` boxes. ``bbox`` ``[x, y, w, h]`` becomes ``[x, y, x + w, y + h]`` pixels.
    Labels are the category ids in sorted order, mapped to ``0..K-1``: label ``i`` is
    category ``category_ids[i]``, named ``classes[i]``. Every item's target has
    ``iscrowd`` (0 when absent), and ``ignore`` when any annotation has that key. The
    image is used as stored; when the file's ``width`` and ``height`` are those of the
    upright photo of an EXIF-rotated JPEG, the photo is turned upright first, and any other
    size mismatch is an error of that item (``DecodeError``, reason ``mismatch``).

    Left out, and listed in ``skipped`` (see :class:`DetectionSource`): an image with an
    annotation whose bbox is malformed or breaks the box rules, whose category is not in
    ``categories``, or whose flag is not 0/1; and annotations whose ``image_id`` is not in
    ``images``. A file that is not JSON, lacks one of the three lists, or has a malformed
    image or category entry is an :class:`AnnotationError`.

    Args:
        images: The folder the ``file_name`` paths are relative to.
        annotations: The JSON file.
        class_names: Must be ``None`` (the file names its categories); there for the
            signature the formats share.

    Raises:
        AnnotationError: See above.
        ValueError: ``class_names`` is given.
    """

    format_name = "coco"

    def __init__(
        self,
        images: str | Path,
        annotations: str | Path,
        class_names: Sequence[str] | None = None,
    ) -> None:
        if class_names is not None:
            raise ValueError(
                "class_names is for YOLO and VOC annotations; a COCO file names its categories"
            )
        path = Path(annotations)
        data = _load_json(path)
        self.category_ids, classes = _categories(path, data["categories"])
        images_by_id = _images(path, data["images"])
        labels = {category: label for label, category in enumerate(self.category_ids)}
        has_ignore = any(isinstance(a, dict) and "ignore" in a for a in data["annotations"])
        by_image: dict[int, list[dict[str, Any]]] = defaultdict(list)
        builder = TableBuilder(("iscrowd", "ignore") if has_ignore else ("iscrowd",))
        orphans: dict[object, list[str]] = defaultdict(list)
        for position, entry in enumerate(data["annotations"]):
            if not isinstance(entry, dict):
                raise AnnotationError(
                    f"{path}: annotations[{position}] = {entry!r:.80} is no object"
                )
            name = f"annotation id {entry.get('id', '?')} (annotations[{position}])"
            image_id = entry.get("image_id")
            if not _is_int(image_id) or image_id not in images_by_id:
                orphans[repr(image_id)].append(name)
                continue
            by_image[image_id].append({**entry, "_name": name})
        self.image_ids: list[int] = []
        for image_id, (file_name, size) in images_by_id.items():
            reason = self._add_image(builder, file_name, size, by_image.get(image_id, []), labels)
            if reason:
                where = f"{path.name} image id {image_id} ({file_name})"
                builder.skip(str(Path(images) / file_name), f"{where}: {reason}")
            else:
                self.image_ids.append(image_id)
        for image_id, names in orphans.items():
            more = f" and {len(names) - 1} more" if len(names) > 1 else ""
            builder.skip(
                str(path), f"{names[0]}{more} refer to image_id {image_id}, not in 'images'"
            )
        table = builder.build()
        super().__init__(Path(images), table, classes, f"COCO {path}")

    @staticmethod
    def _add_image(
        builder: TableBuilder,
        file_name: str,
        size: tuple[int, int],
        entries: list[dict[str, Any]],
        labels: dict[int, int],
    ) -> str | None:
        """Add one image with its annotations; or return why it is left out."""
        for entry in entries:
            problem = _annotation_problem(entry, labels)
            if problem:
                return f"{entry['_name']} {problem}"
        xywh = np.asarray([entry["bbox"] for entry in entries], np.float64).reshape(-1, 4)
        xyxy = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
        if size[0]:
            width = np.full(len(xyxy), float(size[0]))
            height = np.full(len(xyxy), float(size[1]))
        else:  # no size given: only the geometry's own rules apply
            width = height = np.full(len(xyxy), math.inf)
        clipped, problems = box_problems(xyxy, width, height)
        for entry, problem in zip(entries, problems, strict=True):
            if problem:
                return f"{entry['_name']}: bbox {entry['bbox']} {problem}"
        flags = {
            name: np.asarray([int(entry.get(name, 0)) for entry in entries], np.int64)
            for name in ("iscrowd", "ignore")
        }
        category = np.asarray([labels[entry["category_id"]] for entry in entries], np.int64)
        builder.add(file_name, clipped, category, flags, size)
        return None
