"""Detection annotation sources: COCO JSON, YOLO txt and Pascal VOC XML, each read into a
torchvision-style dataset (:class:`DetectionSource`) that ``preprocess`` takes like any
dataset object. One class per format behind :data:`ANNOTATION_FORMATS`;
:func:`open_annotations` picks the format from the path when asked to."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from fastdata.errors import OnError, PreprocessError
from fastdata.preprocess._detection._coco import CocoDetection
from fastdata.preprocess._detection._common import (
    BOX_TOLERANCE_PX,
    AnnotationError,
    DetectionSource,
    logger,
    read_class_names,
)
from fastdata.preprocess._detection._voc import VocDetection
from fastdata.preprocess._detection._yolo import CLASS_NAMES_FILE, YoloDetection
from fastdata.preprocess._python_source import DatasetListing
from fastdata.preprocess._sources import _Walker

# every format's class takes (images, annotations, class_names)
AnnotationReader = Callable[[str | Path, str | Path, Sequence[str] | None], DetectionSource]
ANNOTATION_CLASSES: dict[str, AnnotationReader] = {
    "coco": CocoDetection,
    "yolo": YoloDetection,
    "voc": VocDetection,
}
ANNOTATION_FORMATS = ("auto", *ANNOTATION_CLASSES)


def detect_annotation_format(annotations: str | Path) -> str:
    """The format of an annotation path: a ``.json`` file is COCO, a folder of ``.txt``
    files YOLO, a folder of ``.xml`` files VOC (at any depth).

    Raises:
        AnnotationError: The path is missing, a file that is not ``.json``, or a folder
            holding both kinds of files or neither.
    """
    path = Path(annotations)
    if path.is_file():
        if path.suffix.lower() == ".json":
            return "coco"
        raise AnnotationError(
            f"annotations {path}: a file is read as COCO JSON and must end in .json; YOLO and "
            "VOC annotations are a folder of .txt or .xml files"
        )
    if not path.is_dir():
        raise AnnotationError(f"annotations do not exist: {path}")
    files = _Walker(()).files_recursive(path)
    txt = sum(p.suffix.lower() == ".txt" and p.name != CLASS_NAMES_FILE for p in files)
    xml = sum(p.suffix.lower() == ".xml" for p in files)
    if txt and xml:
        raise AnnotationError(
            f"annotations {path} holds {txt} .txt and {xml} .xml files: say which format "
            "they are (--yolo or --voc; format='yolo' or 'voc')"
        )
    if not txt and not xml:
        raise AnnotationError(
            f"annotations {path} holds no .txt (YOLO) or .xml (VOC) files; COCO annotations "
            "are one .json file"
        )
    return "yolo" if txt else "voc"


def open_annotations(
    images: str | Path,
    annotations: str | Path,
    *,
    format: str = "auto",
    class_names: Sequence[str] | str | os.PathLike[str] | None = None,
) -> DetectionSource:
    """The dataset of ``images`` annotated by ``annotations``, for ``preprocess``.

    Args:
        images: The image folder.
        annotations: A COCO ``.json`` file, or a folder of YOLO ``.txt`` or VOC ``.xml``
            files.
        format: One of :data:`ANNOTATION_FORMATS`; ``"auto"`` detects it
            (:func:`detect_annotation_format`).
        class_names: Label ``i`` is ``class_names[i]`` (YOLO and VOC; COCO names its
            categories itself); a path is a text file of one name a line.

    Raises:
        ValueError: ``format`` is unknown, or ``class_names`` is given for COCO.
        AnnotationError: The annotations cannot be read (see each format's class).
    """
    if format not in ANNOTATION_FORMATS:
        raise ValueError(f"format must be one of {ANNOTATION_FORMATS}, got {format!r}")
    if format == "auto":
        format = detect_annotation_format(annotations)
    if isinstance(class_names, (str, os.PathLike)):
        class_names = read_class_names(Path(class_names))
    return ANNOTATION_CLASSES[format](images, annotations, class_names)


__all__ = [
    "ANNOTATION_CLASSES",
    "ANNOTATION_FORMATS",
    "BOX_TOLERANCE_PX",
    "AnnotationError",
    "CocoDetection",
    "DetectionSource",
    "VocDetection",
    "YoloDetection",
    "add_source_record",
    "detect_annotation_format",
    "open_annotations",
    "source_skipped",
]


def add_source_record(
    listing: DatasetListing, dataset: object, skipped: list[dict[str, str]]
) -> None:
    """Fold what a :class:`DetectionSource` knows beyond its probed items into its
    ``listing``: the images it left out (``skipped``, from :func:`source_skipped`) and the
    digest of all its annotations (a resume notices any change)."""
    if isinstance(dataset, DetectionSource):
        listing.root = dataset.description  # the manifest's "dataset": what was read
        listing.skipped = skipped
        listing.digest = hashlib.sha256(
            f"{listing.digest}\0{dataset.digest()}".encode()
        ).hexdigest()


def source_skipped(dataset: object, on_error: OnError | str) -> list[dict[str, str]]:
    """What a :class:`DetectionSource` left out, with the job's ``on_error`` applied (other
    datasets: nothing): ``"raise"`` stops at the first, naming it; ``"warn"`` logs each
    and ``"skip"`` records them quietly (the manifest's ``skipped`` lists them either way).

    Raises:
        PreprocessError: ``on_error="raise"`` and something was left out, or everything was.
    """
    if not isinstance(dataset, DetectionSource) or not dataset.skipped:
        return []
    on_error = OnError.parse(on_error)
    first = dataset.skipped[0]
    if on_error is OnError.RAISE:
        more = f" ({len(dataset.skipped) - 1} more)" if len(dataset.skipped) > 1 else ""
        raise PreprocessError(
            f"bad annotation: {first['path']}: {first['reason']}{more}; --on-error skip "
            "(on_error='skip') leaves such images out, records them and goes on"
        )
    if len(dataset) == 0:
        raise PreprocessError(
            f"every image was left out for bad annotations ({len(dataset.skipped)}), e.g. "
            f"{first['path']}: {first['reason']}"
        )
    for entry in dataset.skipped:
        on_error.handle(PreprocessError(f"{entry['path']}: {entry['reason']}"), log=logger)
    return list(dataset.skipped)
