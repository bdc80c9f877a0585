"""Offline preprocessing: sources → uint8 transforms → HDF5 shards (``fastdata preprocess``).

``preprocess(src, out, PreprocessOptions(...))`` lists the source (files: :func:`list_source`,
or a map-style dataset object), splits it into shard tasks (pure functions: items in, one
shard file out) and runs them on an engine: a :class:`LocalEngine` process pool by
default, or :class:`RayEngine` on a Ray cluster. Another engine implements
:class:`Engine`: it runs each :class:`ShardTask` with :func:`run_shard_task`.

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
    from fastdata.preprocess._engine import Engine, LocalEngine
    from fastdata.preprocess._options import DEFAULT_SHARD_BYTES, STORAGE_MODES, PreprocessOptions
    from fastdata.preprocess._python_source import load_python_source
    from fastdata.preprocess._ray import RayEngine
    from fastdata.preprocess._runner import PreprocessSummary, preprocess
    from fastdata.preprocess._sources import SOURCE_KINDS, SourceListing, list_source
    from fastdata.preprocess._task import ShardJob, ShardResult, ShardTask, run_shard_task
    from fastdata.preprocess._transforms import RESIZE_MODES

# public name -> the module (of this package) that defines it
_LAZY_NAMES = {
    **dict.fromkeys(("ANNOTATION_FORMATS", "AnnotationError", "CocoDetection", "DetectionSource",
                     "VocDetection", "YoloDetection", "open_annotations"), "._detection"),
    **dict.fromkeys(("Engine", "LocalEngine"), "._engine"),
    **dict.fromkeys(("DEFAULT_SHARD_BYTES", "STORAGE_MODES", "PreprocessOptions"), "._options"),
    "load_python_source": "._python_source",
    "RayEngine": "._ray",
    **dict.fromkeys(("PreprocessSummary", "preprocess"), "._runner"),
    **dict.fromkeys(("SOURCE_KINDS", "SourceListing", "list_source"), "._sources"),
    **dict.fromkeys(("ShardJob", "ShardResult", "ShardTask", "run_shard_task"), "._task"),
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
    "Engine",
    "LocalEngine",
    "PreprocessOptions",
    "PreprocessSummary",
    "RayEngine",
    "ShardJob",
    "ShardResult",
    "ShardTask",
    "SourceListing",
    "VocDetection",
    "YoloDetection",
    "list_source",
    "load_python_source",
    "open_annotations",
    "preprocess",
    "run_shard_task",
]
