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
    BoxTable,
    DetectionSource,
    box_problems,
)
from fastdata.preprocess._sources import display_name


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_NUMBERS = frozenset({int, float})


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
    # type() rather than isinstance(): a JSON number is exactly an int or a float (not a
    # bool), and this runs once per annotation (a million in COCO's train set)
    if not (type(bbox) is list and len(bbox) == 4 and {type(v) for v in bbox} <= _NUMBERS):
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
        entries: list[Any] = data["annotations"]
        columns = _Columns(len(entries))
        position_of = {image_id: k for k, image_id in enumerate(images_by_id)}
        problems: dict[int, tuple[int, str]] = {}  # image -> (first annotation, what)
        orphans: dict[str, list[int]] = defaultdict(list)
        for position, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise AnnotationError(
                    f"{path}: annotations[{position}] = {entry!r:.80} is no object"
                )
            image_id = entry.get("image_id")
            image = position_of.get(image_id) if _is_int(image_id) else None  # type: ignore[arg-type]
            if image is None:
                orphans[repr(image_id)].append(position)
                continue
            problem = _annotation_problem(entry, labels)
            if problem:
                problems.setdefault(image, (position, f"{_name(entry, position)} {problem}"))
                continue
            columns.set(position, image, entry, labels[entry["category_id"]])
        sizes = np.asarray([size for _, size in images_by_id.values()], np.int64).reshape(-1, 2)
        self._check_boxes(columns, sizes, entries, problems)
        has_ignore = any("ignore" in entry for entry in entries)
        table, kept = columns.table(sizes, problems, has_ignore)
        files = [file_name for file_name, _ in images_by_id.values()]
        image_ids = list(images_by_id)
        table.files = [files[k] for k in kept]
        for image, (_, reason) in sorted(problems.items(), key=lambda item: item[1][0]):
            where = f"{path.name} image id {image_ids[image]} ({files[image]})"
            table.skipped.append(
                {
                    "path": display_name(str(Path(images) / files[image])),
                    "reason": f"{where}: {reason}",
                }
            )
        for image_id, positions in orphans.items():
            more = f" and {len(positions) - 1} more" if len(positions) > 1 else ""
            first = _name(entries[positions[0]], positions[0])
            table.skipped.append(
                {
                    "path": display_name(str(path)),
                    "reason": f"{first}{more} {'refer' if more else 'refers'} to image_id "
                    f"{image_id}, not in 'images'",
                }
            )
        self.image_ids = [image_ids[k] for k in kept]
        super().__init__(Path(images), table, classes, f"COCO {path}")

    @staticmethod
    def _check_boxes(
        columns: _Columns,
        sizes: np.ndarray,
        entries: list[Any],
        problems: dict[int, tuple[int, str]],
    ) -> None:
        """Apply the box rules to every well-formed annotation at once (clipping them in
        ``columns``); note the first problem of each image in ``problems``."""
        rows = np.flatnonzero(columns.image >= 0)
        size = sizes[columns.image[rows]].astype(np.float64)
        unknown = size[:, 0] == 0  # no size given: only the geometry's own rules apply
        size[unknown] = math.inf
        xywh = columns.bbox[rows]
        xyxy = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], axis=1)
        clipped, found = box_problems(xyxy, size[:, 0], size[:, 1])
        columns.bbox[rows] = clipped
        for row, problem in zip(rows, found, strict=True):
            if problem:
                image = int(columns.image[row])
                entry = entries[row]
                text = f"{_name(entry, int(row))}: bbox {entry['bbox']} {problem}"
                if image not in problems or problems[image][0] > row:
                    problems[image] = (int(row), text)


def _name(entry: dict[str, Any], position: int) -> str:
    return f"annotation id {entry.get('id', '?')} (annotations[{position}])"


class _Columns:
    """The well-formed annotations as arrays, by position in the file (``image`` ``-1``:
    not one)."""

    def __init__(self, count: int) -> None:
        self.image = np.full(count, -1, np.int64)
        self.bbox = np.zeros((count, 4), np.float64)  # xywh, then clipped xyxy
        self.label = np.zeros(count, np.int64)
        self.iscrowd = np.zeros(count, np.int64)
        self.ignore = np.zeros(count, np.int64)

    def set(self, position: int, image: int, entry: dict[str, Any], label: int) -> None:
        self.image[position] = image
        self.bbox[position] = entry["bbox"]
        self.label[position] = label
        self.iscrowd[position] = entry.get("iscrowd", 0)
        self.ignore[position] = entry.get("ignore", 0)

    def table(
        self, sizes: np.ndarray, problems: dict[int, tuple[int, str]], has_ignore: bool
    ) -> tuple[BoxTable, np.ndarray]:
        """The kept images' boxes (by image, then by position in the file), and the kept
        images' positions."""
        kept = np.setdiff1d(np.arange(len(sizes)), np.fromiter(problems, np.int64, len(problems)))
        new_index = np.full(len(sizes), -1, np.int64)
        new_index[kept] = np.arange(len(kept))
        rows = np.flatnonzero(self.image >= 0)
        rows = rows[new_index[self.image[rows]] >= 0]
        rows = rows[np.argsort(new_index[self.image[rows]], kind="stable")]
        counts = np.bincount(new_index[self.image[rows]], minlength=len(kept))
        flags = {"iscrowd": self.iscrowd[rows]}
        if has_ignore:
            flags["ignore"] = self.ignore[rows]
        table = BoxTable(
            boxes=self.bbox[rows].astype(np.float32),
            labels=self.label[rows],
            flags=flags,
            offsets=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
            sizes=sizes[kept],
        )
        return table, kept
