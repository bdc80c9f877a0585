"""Offline preprocessing: sources → uint8 transforms → HDF5 shards (``fastdata preprocess``).

``preprocess(src, out, PreprocessOptions(...))`` lists the source (a path, a source record
such as :class:`SegmentationSource`, or a map-style dataset object), splits it into shard
tasks (pure functions: items in, one shard file out) and runs them on an engine: a local
process pool by default, or :class:`RayEngine` on a Ray cluster. What an engine author
needs (the engine interface, the local engine, shard tasks and how to run one) is in
:mod:`fastdata.preprocess.engine`.

Detection annotations (COCO JSON, YOLO txt, Pascal VOC XML) are read into dataset objects
(:class:`CocoDetection`, :class:`YoloDetection`, :class:`VocDetection`, or
:func:`open_annotations` by the path) whose items are ``(PIL image, {"boxes", "labels",
...})``; ``preprocess`` stores their boxes scaled with the image.

Every name loads on first access (PEP 562), so the worker processes, which import only
the per-sample code, start without h5py, tqdm or Ray.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata import _lazy

if TYPE_CHECKING:
    from fastdata.preprocess._detection import (
        ANNOTATION_FORMATS,
        AnnotationError,
        CocoDetection,
        DetectionSource,
        VocDetection,
        YoloDetection,
        open_annotations,
    )
    from fastdata.preprocess._options import DEFAULT_SHARD_BYTES, STORAGE_MODES, PreprocessOptions
    from fastdata.preprocess._python_source import load_python_source
    from fastdata.preprocess._ray import RayEngine
    from fastdata.preprocess._runner import PreprocessSummary, preprocess
    from fastdata.preprocess._source_records import (
        FileListSource,
        ImageFolderSource,
        NpyFolderSource,
        SegmentationSource,
        Source,
    )
    from fastdata.preprocess._sources import SOURCE_KINDS
    from fastdata.preprocess._transforms import RESIZE_MODES

# public name -> the module (of this package) that defines it
_LAZY_NAMES = {
    **dict.fromkeys(("ANNOTATION_FORMATS", "AnnotationError", "CocoDetection", "DetectionSource",
                     "VocDetection", "YoloDetection", "open_annotations"), "._detection"),
    **dict.fromkeys(("DEFAULT_SHARD_BYTES", "STORAGE_MODES", "PreprocessOptions"), "._options"),
    "load_python_source": "._python_source",
    "RayEngine": "._ray",
    **dict.fromkeys(("PreprocessSummary", "preprocess"), "._runner"),
    **dict.fromkeys(
        ("FileListSource", "ImageFolderSource", "NpyFolderSource", "SegmentationSource",
         "Source"),
        "._source_records",
    ),
    "SOURCE_KINDS": "._sources",
    "RESIZE_MODES": "._transforms",
}  # fmt: skip


__getattr__, __dir__ = _lazy.lazy_attributes(__name__, _LAZY_NAMES)

__all__ = [
    "ANNOTATION_FORMATS",
    "DEFAULT_SHARD_BYTES",
    "RESIZE_MODES",
    "SOURCE_KINDS",
    "STORAGE_MODES",
    "AnnotationError",
    "CocoDetection",
    "DetectionSource",
    "FileListSource",
    "ImageFolderSource",
    "NpyFolderSource",
    "PreprocessOptions",
    "PreprocessSummary",
    "RayEngine",
    "SegmentationSource",
    "Source",
    "VocDetection",
    "YoloDetection",
    "load_python_source",
    "open_annotations",
    "preprocess",
]
