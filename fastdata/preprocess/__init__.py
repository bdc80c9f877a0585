"""Offline preprocessing: sources → uint8 transforms → HDF5 shards (``fastdata preprocess``).

``preprocess(src, out, PreprocessOptions(...))`` lists the source (files, or a map-style
dataset object: :func:`list_dataset`), splits it into shard tasks (pure functions: items
in, one shard file out) and runs them on an engine: a :class:`LocalEngine` process pool
by default, or :class:`RayEngine` on a Ray cluster.
"""

from fastdata.preprocess._dataset_items import DatasetTypeError, DatasetValueError
from fastdata.preprocess._engine import Engine, LocalEngine
from fastdata.preprocess._options import STORAGE_MODES, PreprocessOptions
from fastdata.preprocess._python_source import DatasetListing, list_dataset, load_python_source
from fastdata.preprocess._ray import RayEngine
from fastdata.preprocess._runner import PreprocessSummary, plan_tasks, preprocess
from fastdata.preprocess._sources import SOURCE_KINDS, SourceItem, SourceListing, list_source
from fastdata.preprocess._task import (
    ShardJob,
    ShardResult,
    ShardTask,
    build_fields,
    process_sample,
    run_shard_task,
    write_shard,
)
from fastdata.preprocess._transforms import RESIZE_MODES

__all__ = [
    "RESIZE_MODES",
    "SOURCE_KINDS",
    "STORAGE_MODES",
    "DatasetListing",
    "DatasetTypeError",
    "DatasetValueError",
    "Engine",
    "LocalEngine",
    "PreprocessOptions",
    "PreprocessSummary",
    "RayEngine",
    "ShardJob",
    "ShardResult",
    "ShardTask",
    "SourceItem",
    "SourceListing",
    "build_fields",
    "list_dataset",
    "list_source",
    "load_python_source",
    "plan_tasks",
    "preprocess",
    "process_sample",
    "run_shard_task",
    "write_shard",
]
