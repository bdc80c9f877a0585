"""YOLO labels (one ``.txt`` per image, ``class cx cy w h`` normalised) as a dataset."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from fastdata.preprocess._detection._common import (
    IMAGE_SUFFIXES,
    AnnotationError,
    DetectionSource,
    TableBuilder,
    box_problems,
    check_class_names,
    orientation,
    read_class_names,
)
from fastdata.preprocess._sources import _Walker

CLASS_NAMES_FILE = "classes.txt"
# Normalised coordinates are rounded to ~6 digits by exporters: allow 0.1% past an edge.
_NORMALISED_TOLERANCE = 1e-3


def _parse_label_file(path: Path, num_classes: int) -> tuple[np.ndarray, np.ndarray] | str:
    """``(boxes (N, 4) x1y1x2y2 normalised, labels (N,))``, or why the file is unusable."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read the label file ({type(exc).__name__}: {exc})"
    rows: list[list[float]] = []
    classes: list[int] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        values = line.split()
        if not values:
            continue
        if len(values) != 5:
            return (
                f"line {number} has {len(values)} values ({line.strip()!r:.60}); a box line is "
                "'class cx cy w h' (polygon lines of YOLO segmentation are not boxes)"
            )
        try:
            numbers = [float(v) for v in values]
        except ValueError:
            return f"line {number} ({line.strip()!r:.60}) holds a value that is not a number"
        label = numbers[0]
        if not label.is_integer() or label < 0 or (num_classes and label >= num_classes):
            known = f"0..{num_classes - 1}" if num_classes else "a non-negative integer"
            return f"line {number} has class {values[0]!r}, not a known class ({known})"
        classes.append(int(label))
        rows.append(numbers[1:])
        lines.append(number)
    cxcywh = np.asarray(rows, np.float64).reshape(-1, 4)
    half = cxcywh[:, 2:] / 2
    xyxy = np.concatenate([cxcywh[:, :2] - half, cxcywh[:, :2] + half], axis=1)
    ones = np.ones(len(xyxy))
    clipped, problems = box_problems(xyxy, ones, ones, _NORMALISED_TOLERANCE)
    for number, row, problem in zip(lines, rows, problems, strict=True):
        if problem:
            given = " ".join(f"{v:g}" for v in row)
            return f"line {number}: box 'cx cy w h' = '{given}' (normalised) {problem}"
    return clipped, np.asarray(classes, np.int64)


class YoloDetection(DetectionSource):
    """Images and boxes of a YOLO-format set: ``images/**/x.jpg`` with ``labels/**/x.txt``.

    Rules: items are the image files under ``images`` (suffixes
    :data:`IMAGE_SUFFIXES`, any depth, sorted by path); the label file of
    ``images/a/x.jpg`` is ``labels/a/x.txt`` (``labels`` may be ``images`` itself, as
    labelImg writes them). An image without a label file, or with an empty one, has
    ``N = 0`` boxes (YOLO's background images). Each line ``class cx cy w h`` (centre and
    size as fractions of the image's width and height) becomes
    ``[(cx - w/2) W, (cy - h/2) H, (cx + w/2) W, (cy + h/2) H]`` pixels of the image turned
    upright by its EXIF orientation (the frame YOLO tools label in). Class names:
    ``class_names``, else ``labels/classes.txt`` (one name a line) when present, else none
    (``classes`` is empty and any non-negative class is taken).

    Left out, and listed in ``skipped``: an image whose label file cannot be read, has a
    line that is not five numbers, a class that is not a known class, or a box that breaks
    the box rules (in fractions: 0.1% past an edge is clipped); a label file without an
    image; and an image whose stem another image shares (``x.jpg`` and ``x.png``: which
    one the labels describe is unknown).

    Args:
        images: The image folder.
        labels: The label folder (default: ``images``).
        class_names: Label ``i`` is ``class_names[i]``; a class outside them is a bad
            annotation.

    Raises:
        AnnotationError: A folder is missing, no image is found, or the class names are
            empty or repeat a name.
        TypeError: ``class_names`` is not a sequence of strings.
    """

    format_name = "yolo"
    normalised = True

    def __init__(
        self,
        images: str | Path,
        labels: str | Path | None = None,
        class_names: Sequence[str] | None = None,
    ) -> None:
        image_root = Path(images)
        label_root = image_root if labels is None else Path(labels)
        for folder, what in ((image_root, "image"), (label_root, "label")):
            if not folder.is_dir():
                raise AnnotationError(f"YOLO {what} folder does not exist: {folder}")
        names = check_class_names(class_names)
        if not names and (label_root / CLASS_NAMES_FILE).is_file():
            names = read_class_names(label_root / CLASS_NAMES_FILE)
        walker = _Walker(())
        image_files = [
            p for p in walker.files_recursive(image_root) if p.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not image_files:
            raise AnnotationError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {image_root}")
        label_files = {
            p.relative_to(label_root).with_suffix("")
            for p in walker.files_recursive(label_root)
            if p.suffix == ".txt" and p.name != CLASS_NAMES_FILE
        }
        builder = TableBuilder()
        seen: dict[Path, Path] = {}
        for image in image_files:
            stem = image.relative_to(image_root).with_suffix("")
            if stem in seen:
                builder.skip(
                    str(image),
                    f"another image has the same stem ({seen[stem].name}): which one "
                    f"{stem.as_posix()}.txt describes is unknown",
                )
                continue
            seen[stem] = image
            label_file = label_root / stem.with_suffix(".txt")
            relative = image.relative_to(image_root).as_posix()
            if stem not in label_files:
                builder.add(relative, np.zeros((0, 4)), np.zeros(0), {})
                continue
            parsed = _parse_label_file(label_file, len(names))
            if isinstance(parsed, str):
                builder.skip(str(image), f"{label_file}: {parsed}")
            else:
                builder.add(relative, parsed[0], parsed[1], {})
        for stem in sorted(label_files - set(seen)):
            builder.skip(
                str(label_root / stem.with_suffix(".txt")),
                f"label file without an image (no {stem.as_posix()}.* in {image_root})",
            )
        super().__init__(image_root, builder.build(), names, f"YOLO {label_root}")

    def _frame(self, image: Image.Image, index: int, source: str) -> Image.Image:
        return image if orientation(image) == 1 else ImageOps.exif_transpose(image)
