"""What the annotation sources share: the box rules, the image rules and the dataset base.

Box rules (every format, applied as the annotations are read): a box is ``(x1, y1, x2, y2)``
in pixels of the image as stored in the shards' source frame (see each format for how its
numbers become that). A box with a non-finite coordinate, no positive width or height, or
more than :data:`BOX_TOLERANCE_PX` pixels past an image edge is a bad annotation; a box
that sticks out by less (annotation tools round) is clipped to the image. An image with a
bad annotation is left out whole, not kept with a box missing (a missing box would teach
a detector that the object is background), and recorded in the dataset's ``skipped``.
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from PIL import Image, ImageOps

from fastdata.errors import DecodeError, PreprocessError
from fastdata.preprocess._sources import display_name

logger = logging.getLogger("fastdata.preprocess.annotations")

# Annotation tools round coordinates; a box this far past an edge is clipped, not refused.
BOX_TOLERANCE_PX = 1.0
# The files taken as images when a format lists a folder (matched case-insensitively).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
_ORIENTATION_TAG = 0x0112


class AnnotationError(PreprocessError, ValueError):
    """An annotation source as a whole cannot be read: a missing or malformed annotation
    file (not JSON, not XML, not the format's layout), or no images with annotations."""


def box_problems(
    boxes: np.ndarray, width: np.ndarray, height: np.ndarray, tolerance: float = BOX_TOLERANCE_PX
) -> tuple[np.ndarray, list[str | None]]:
    """Check and clip boxes against their images' sizes (the box rules above).

    Args:
        boxes: ``(M, 4)`` float64 ``x1, y1, x2, y2``.
        width, height: ``(M,)`` the size of each box's image, in the boxes' units.
        tolerance: How far past an edge a box is clipped rather than refused.

    Returns:
        The boxes clipped to their images (``(M, 4)`` float64), and per box ``None`` or
        what is wrong with it (without naming the box).
    """
    m = len(boxes)
    problems: list[str | None] = [None] * m
    if m == 0:
        return boxes.reshape(0, 4), problems
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(boxes).all(axis=1)
        box_w, box_h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        positive = (box_w > 0) & (box_h > 0)
        inside = (
            (boxes[:, 0] >= -tolerance)
            & (boxes[:, 1] >= -tolerance)
            & (boxes[:, 2] <= width + tolerance)
            & (boxes[:, 3] <= height + tolerance)
        )
        clipped = np.stack(
            [
                np.clip(boxes[:, 0], 0, width),
                np.clip(boxes[:, 1], 0, height),
                np.clip(boxes[:, 2], 0, width),
                np.clip(boxes[:, 3], 0, height),
            ],
            axis=1,
        )
        visible = (clipped[:, 2] > clipped[:, 0]) & (clipped[:, 3] > clipped[:, 1])
    for i in np.flatnonzero(~(finite & positive & inside & visible)):
        if not finite[i]:
            problems[i] = "has a coordinate that is not a finite number"
        elif not positive[i]:
            problems[i] = (
                f"has width {box_w[i]:g} and height {box_h[i]:g}; a box needs a positive size"
            )
        else:
            problems[i] = (
                f"lies past the {width[i]:g}x{height[i]:g} image by more than {tolerance:g} "
                f"(x1, y1, x2, y2 = {', '.join(f'{v:g}' for v in boxes[i])})"
            )
    return clipped, problems


@dataclass
class BoxTable:
    """Every kept image of a source with its boxes, as values + offsets (not one Python
    object per box: a COCO file holds hundreds of thousands).

    Attributes:
        files: Each image's path, relative to the image folder.
        boxes: ``(M, 4)`` float32 ``x1, y1, x2, y2``: pixels, or fractions of the image's
            width and height when the source is normalised (YOLO).
        labels: ``(M,)`` int64 class per box.
        flags: Per-box int64 ``(M,)`` arrays by name (``iscrowd``, ``difficult``...).
        offsets: ``(K + 1,)`` int64: image ``k``'s boxes are ``offsets[k]:offsets[k+1]``.
        sizes: ``(K, 2)`` int64 ``(width, height)`` the annotation gives, ``0`` where it
            gives none.
        skipped: Images (or annotations) left out: ``{"path", "reason"}`` each.
    """

    files: list[str] = field(default_factory=list)
    boxes: np.ndarray = field(default_factory=lambda: np.zeros((0, 4), np.float32))
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    flags: dict[str, np.ndarray] = field(default_factory=dict)
    offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    sizes: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int64))
    skipped: list[dict[str, str]] = field(default_factory=list)


class TableBuilder:
    """Collects images one at a time into a :class:`BoxTable`."""

    def __init__(self, flag_names: Sequence[str] = ()) -> None:
        self.table = BoxTable()
        self._files: list[str] = []
        self._boxes: list[np.ndarray] = []
        self._labels: list[np.ndarray] = []
        self._flags: dict[str, list[np.ndarray]] = {name: [] for name in flag_names}
        self._counts: list[int] = []
        self._sizes: list[tuple[int, int]] = []

    def add(
        self,
        file: str,
        boxes: np.ndarray,
        labels: np.ndarray,
        flags: dict[str, np.ndarray],
        size: tuple[int, int] = (0, 0),
    ) -> None:
        self._files.append(file)
        self._boxes.append(np.asarray(boxes, np.float32).reshape(-1, 4))
        self._labels.append(np.asarray(labels, np.int64).reshape(-1))
        for name, values in self._flags.items():
            values.append(np.asarray(flags.get(name, np.zeros(len(labels))), np.int64))
        self._counts.append(len(labels))
        self._sizes.append(size)

    def skip(self, path: str, reason: str) -> None:
        self.table.skipped.append({"path": display_name(path), "reason": reason})

    def build(self) -> BoxTable:
        table = self.table
        table.files = self._files
        if self._boxes:
            table.boxes = np.concatenate(self._boxes)
            table.labels = np.concatenate(self._labels)
        table.flags = {
            name: np.concatenate(values) if values else np.zeros(0, np.int64)
            for name, values in self._flags.items()
        }
        table.offsets = np.concatenate([[0], np.cumsum(self._counts, dtype=np.int64)])
        table.sizes = np.asarray(self._sizes, np.int64).reshape(-1, 2)
        return table


def open_image(path: Path, source: str) -> Image.Image:
    """The image file, opened lazily (pixels decode when read).

    Raises:
        OSError: The file is missing or not an image PIL reads.
        DecodeError: PIL refuses it as a decompression bomb (reason ``too_large``).
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(path)
    except Image.DecompressionBombError as exc:
        raise DecodeError(str(exc), source, "too_large") from exc


def orientation(image: Image.Image) -> int:
    """The image's EXIF orientation tag (1: as stored)."""
    try:
        value = image.getexif().get(_ORIENTATION_TAG, 1)
    except Exception:  # a damaged EXIF block: the pixels as stored
        return 1
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def match_annotated_size(
    image: Image.Image, annotated: tuple[int, int], source: str
) -> Image.Image:
    """``image`` in the frame its annotation was drawn on: as stored when the annotated
    ``(width, height)`` is the stored size (or not given); turned upright by its EXIF
    orientation when the annotated size is that of the upright photo (orientations 5-8
    swap the sides).

    Raises:
        DecodeError: The annotated size is neither (reason ``mismatch``): its boxes would
            land in the wrong place.
    """
    width, height = annotated
    if width <= 0 or image.size == (width, height):
        return image
    if image.size == (height, width) and orientation(image) >= 5:
        return ImageOps.exif_transpose(image)
    raise DecodeError(
        f"the image is {image.width}x{image.height}, but its annotation says {width}x{height}",
        source,
        "mismatch",
    )


class DetectionSource:
    """A detection dataset read from annotation files, torchvision style: item ``i`` is
    ``(PIL image, {"boxes": (N, 4) float32 x1y1x2y2 pixels, "labels": (N,) int64, flags})``
    with ``N >= 0``; per-box flags (``iscrowd``, ``difficult``) are ``(N,)`` int64.

    Attributes:
        classes: Label ``i`` is ``classes[i]`` (empty when the source names no classes).
        description: The format and the annotation path, e.g. ``COCO instances.json``
            (the manifest's ``source.dataset``).
        files: Each item's image path, relative to the image folder.
        skipped: What was left out while reading the annotations, ``{"path", "reason"}``
            each (bad annotations; see the box rules). ``preprocess`` applies its
            ``on_error`` to them and records them in the manifest's ``skipped``.
    """

    format_name: ClassVar[str] = ""
    # Whether boxes are fractions of the image size (scaled when the image is opened).
    normalised: ClassVar[bool] = False

    def __init__(self, images: Path, table: BoxTable, classes: list[str], describe: str) -> None:
        self.images = images
        self._table = table
        self.classes = classes
        self.files = table.files
        self.skipped = table.skipped
        self.description = describe
        if table.skipped:
            logger.info(
                "%s: left out %d image(s) with bad annotations, e.g. %s: %s",
                describe,
                len(table.skipped),
                table.skipped[0]["path"],
                table.skipped[0]["reason"],
            )

    def __len__(self) -> int:
        return len(self._table.files)

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            raise TypeError(f"index must be an int, got {type(index).__name__}")
        size = len(self)
        if not -size <= index < size:
            raise IndexError(f"index {index} is out of range for {size} images")
        index = int(index) % size
        table = self._table
        path = self.images / table.files[index]
        source = display_name(str(path))
        image = self._frame(open_image(path, source), index, source)
        start, stop = int(table.offsets[index]), int(table.offsets[index + 1])
        boxes = table.boxes[start:stop].copy()
        if self.normalised:
            boxes *= np.asarray([image.width, image.height] * 2, np.float32)
            np.clip(boxes[:, 0::2], 0, image.width, out=boxes[:, 0::2])
            np.clip(boxes[:, 1::2], 0, image.height, out=boxes[:, 1::2])
        target = {"boxes": boxes, "labels": table.labels[start:stop].copy()}
        for name, values in table.flags.items():
            target[name] = values[start:stop].copy()
        return image, target

    def digest(self) -> str:
        """SHA-256 over every image name, box, label and flag: a resumed job notices any
        change of the annotations, not only of the items it probes."""
        table = self._table
        digest = hashlib.sha256(f"{self.format_name}\0{self.classes}\0".encode())
        digest.update("\0".join(table.files).encode("utf-8", "surrogateescape"))
        arrays = [table.boxes, table.labels, table.offsets, table.sizes]
        for name in sorted(table.flags):
            digest.update(name.encode())
            arrays.append(table.flags[name])
        for array in arrays:
            digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()

    def _frame(self, image: Image.Image, index: int, source: str) -> Image.Image:
        """The image in the frame its boxes are in (see :func:`match_annotated_size`)."""
        size = self._table.sizes[index]
        return match_annotated_size(image, (int(size[0]), int(size[1])), source)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.description}: {len(self)} images, "
            f"{len(self._table.labels)} boxes, {len(self.classes)} classes, "
            f"{len(self.skipped)} skipped)"
        )


def read_class_names(path: Path) -> list[str]:
    """One class name a line (blank lines ignored): ``classes.txt`` of YOLO and VOC tools.

    Raises:
        AnnotationError: The file cannot be read, is empty or names a class twice.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AnnotationError(f"cannot read class names from {path}: {exc}") from exc
    return check_class_names([line.strip() for line in text.splitlines() if line.strip()], path)


def check_class_names(names: Sequence[str] | None, where: object = "class_names") -> list[str]:
    """``names`` as a list, checked: non-empty, strings, no name twice.

    Raises:
        TypeError: ``names`` is not a sequence of strings.
        AnnotationError: It is empty or repeats a name.
    """
    if names is None:
        return []
    if isinstance(names, str) or not all(isinstance(name, str) for name in names):
        raise TypeError(f"class_names must be a sequence of str, got {names!r:.80}")
    names = list(names)
    if not names:
        raise AnnotationError(f"{where}: no class names")
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        raise AnnotationError(f"{where}: class name {repeated[0]!r} is listed twice")
    return names
