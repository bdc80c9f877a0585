"""Pascal VOC annotations (one ``.xml`` per image) as a dataset of images and boxes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

import numpy as np

from fastdata.preprocess._detection._common import (
    IMAGE_SUFFIXES,
    AnnotationError,
    DetectionSource,
    TableBuilder,
    box_problems,
    check_class_names,
)
from fastdata.preprocess._sources import _Walker


@dataclass
class _VocFile:
    """One parsed annotation file: its image's size and its objects."""

    size: tuple[int, int]
    names: list[str]
    boxes: np.ndarray  # (N, 4) float64 x1y1x2y2 pixels
    difficult: np.ndarray  # (N,) int64


def _text(element: ElementTree.Element, tag: str) -> str | None:
    found = element.find(tag)
    return None if found is None or found.text is None else found.text.strip()


def _parse(path: Path) -> _VocFile | str:
    """The file's annotation, or why it is unusable."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError) as exc:
        return f"not a readable XML file ({type(exc).__name__}: {exc})"
    if root.tag != "annotation":
        return f"the root element is <{root.tag}>; a VOC file's is <annotation>"
    try:
        size = (int(_text(root, "size/width") or 0), int(_text(root, "size/height") or 0))
    except ValueError:
        size = (0, 0)
    if min(size) <= 0:
        return "has no <size> with a positive integer <width> and <height>"
    names: list[str] = []
    rows: list[list[float]] = []
    difficult: list[int] = []
    for number, element in enumerate(root.iter("object"), 1):
        name = _text(element, "name")
        if not name:
            return f"object {number} has no <name>"
        try:
            row = [float(_text(element, f"bndbox/{tag}") or "") for tag in _CORNERS]
        except ValueError:
            return (
                f"object {number} ({name}) has no <bndbox> of four numbers ({'/'.join(_CORNERS)})"
            )
        flag = _text(element, "difficult") or "0"
        if flag not in ("0", "1"):
            return f"object {number} ({name}) has <difficult> {flag!r}; expected 0 or 1"
        names.append(name)
        rows.append(row)
        difficult.append(int(flag))
    corners = np.asarray(rows, np.float64).reshape(-1, 4)
    # VOC counts pixels from 1, inclusive: xmin=1, xmax=W covers the whole image, which
    # is [0, W] in pixel coordinates (detectron2's reading)
    corners[:, :2] -= 1
    return _VocFile(size, names, corners, np.asarray(difficult, np.int64))


_CORNERS = ("xmin", "ymin", "xmax", "ymax")


class VocDetection(DetectionSource):
    """Images and boxes of a Pascal VOC set: ``Annotations/*.xml`` beside ``JPEGImages/``.

    Rules: items are the annotation files (``.xml`` under ``annotations``, any depth,
    sorted by path); the image of ``annotations/a/x.xml`` is ``images/a/x.<suffix>`` (an
    image without an annotation file is not an item). Each ``<object>`` gives a box
    ``<bndbox>`` in VOC's 1-based inclusive pixels, stored as
    ``[xmin - 1, ymin - 1, xmax, ymax]``, a class ``<name>`` and ``difficult`` (0 when
    absent; every target has it). Labels: the index of the name in ``class_names``, or,
    without it, in the sorted set of names found in all the files (pass ``class_names`` to
    keep labels the same across splits). The image is used as stored, or turned upright
    by its EXIF orientation when ``<size>`` is the upright photo's; another size mismatch is
    an error of that item (``DecodeError``, reason ``mismatch``).

    Left out, and listed in ``skipped``: a file that is not XML or has no positive
    ``<size>``, an object without a name, a four-number ``<bndbox>`` or a 0/1 ``difficult``,
    a name not in ``class_names``, a box that breaks the box rules; a file without an image,
    or whose stem two images share.

    Args:
        images: The image folder (``JPEGImages``).
        annotations: The annotation folder (``Annotations``).
        class_names: Label ``i`` is ``class_names[i]``.

    Raises:
        AnnotationError: A folder is missing or holds no ``.xml`` files, or the class names
            are empty or repeat a name.
        TypeError: ``class_names`` is not a sequence of strings.
    """

    format_name = "voc"

    def __init__(
        self,
        images: str | Path,
        annotations: str | Path,
        class_names: Sequence[str] | None = None,
    ) -> None:
        image_root, xml_root = Path(images), Path(annotations)
        for folder, what in ((image_root, "image"), (xml_root, "annotation")):
            if not folder.is_dir():
                raise AnnotationError(f"VOC {what} folder does not exist: {folder}")
        given = check_class_names(class_names)
        walker = _Walker(())
        xml_files = [p for p in walker.files_recursive(xml_root) if p.suffix.lower() == ".xml"]
        if not xml_files:
            raise AnnotationError(f"no .xml annotation files in {xml_root}")
        images_by_stem: dict[Path, list[Path]] = {}
        for image in walker.files_recursive(image_root):
            if image.suffix.lower() in IMAGE_SUFFIXES:
                stem = image.relative_to(image_root).with_suffix("")
                images_by_stem.setdefault(stem, []).append(image)
        builder = TableBuilder(("difficult",))
        parsed: list[tuple[Path, Path, _VocFile]] = []
        for xml in xml_files:
            stem = xml.relative_to(xml_root).with_suffix("")
            found = images_by_stem.get(stem, [])
            if len(found) != 1:
                reason = (
                    f"no image {stem.as_posix()}.* in {image_root}"
                    if not found
                    else f"several images share its stem: {', '.join(p.name for p in found)}"
                )
                builder.skip(str(xml), reason)
                continue
            result = _parse(xml)
            if isinstance(result, str):
                builder.skip(str(found[0]), f"{xml}: {result}")
            else:
                parsed.append((xml, found[0], result))
        names = given or sorted({name for _, _, result in parsed for name in result.names})
        labels = {name: label for label, name in enumerate(names)}
        for xml, image, result in parsed:
            problem = self._add(builder, image.relative_to(image_root).as_posix(), result, labels)
            if problem:
                builder.skip(str(image), f"{xml}: {problem}")
        super().__init__(image_root, builder.build(), names, f"VOC {xml_root}")

    @staticmethod
    def _add(
        builder: TableBuilder, relative: str, result: _VocFile, labels: dict[str, int]
    ) -> str | None:
        unknown = [name for name in result.names if name not in labels]
        if unknown:
            return f"class {unknown[0]!r} is not in class_names"
        count = len(result.names)
        width, height = (np.full(count, float(side)) for side in result.size)
        clipped, problems = box_problems(result.boxes, width, height)
        for number, (name, problem) in enumerate(zip(result.names, problems, strict=True), 1):
            if problem:
                corners = ", ".join(f"{v:g}" for v in result.boxes[number - 1] + [1, 1, 0, 0])
                return f"object {number} ({name}): bndbox ({corners}) {problem}"
        label_ids = np.asarray([labels[name] for name in result.names], np.int64)
        builder.add(relative, clipped, label_ids, {"difficult": result.difficult}, result.size)
        return None
