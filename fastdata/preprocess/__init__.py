"""Offline preprocessing: sources → uint8 transforms → HDF5 shards (``fastdata preprocess``).

``preprocess(src, out, PreprocessOptions(...))`` lists the source (files: :func:`list_source`,
or a map-style dataset object), splits it into shard tasks (pure functions: items in, one
shard file out) and runs them on an engine: a :class:`LocalEngine` process pool by
default, or :class:`RayEngine` on a Ray cluster. Another engine implements
:class:`Engine`: it runs each :class:`ShardTask` with :func:`run_shard_task`.
"""

from fastdata.preprocess._engine import Engine, LocalEngine
from fastdata.preprocess._options import (
    DEFAULT_SHARD_BYTES,
    STORAGE_MODES,
    PreprocessOptions,
)
from fastdata.preprocess._python_source import load_python_source
from fastdata.preprocess._ray import RayEngine
from fastdata.preprocess._runner import PreprocessSummary, preprocess
from fastdata.preprocess._sources import SOURCE_KINDS, SourceListing, list_source
from fastdata.preprocess._task import ShardJob, ShardResult, ShardTask, run_shard_task
from fastdata.preprocess._transforms import RESIZE_MODES

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "RESIZE_MODES",
    "SOURCE_KINDS",
    "STORAGE_MODES",
    "Engine",
    "LocalEngine",
    "PreprocessOptions",
    "PreprocessSummary",
    "RayEngine",
    "ShardJob",
    "ShardResult",
    "ShardTask",
    "SourceListing",
    "list_source",
    "load_python_source",
    "preprocess",
    "run_shard_task",
]
