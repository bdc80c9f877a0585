"""fastdata: make PyTorch training stop waiting for data.

The public API. Optional backends (DALI, Ray, torchvision/CUDA) are never imported here:
they load when a backend that needs them is created. The device-side modules live in
``fastdata.gpu`` (``fastdata.gpu.Normalize``, ``fastdata.gpu.DevicePrefetcher``), and the
CPU batch augmentations in ``fastdata.transforms``; both subpackages load on first access.
"""

import importlib
from types import ModuleType

from fastdata.datasets import (
    MemoryReport,
    RAMDataset,
    ShardAwareDistributedSampler,
    ShardDataset,
    passthrough_collate,
    share_on_node,
)
from fastdata.decode import DecodingLoader, create_decoder
from fastdata.errors import (
    DecodeError,
    FastDataError,
    InsufficientMemoryError,
    PreprocessError,
    ShardFormatError,
)
from fastdata.preprocess import PreprocessOptions, PreprocessSummary, RayEngine, preprocess
from fastdata.shards import FieldSpec, Manifest, ShardReader, ShardWriter, load_manifest
from fastdata.tune import ProfileReport, TuneResult, autotune, profile

__version__ = "0.1.0"

_LAZY_SUBPACKAGES = frozenset({"gpu", "transforms"})


def __getattr__(name: str) -> ModuleType:
    """``fastdata.gpu`` and friends without an explicit ``import fastdata.gpu`` (PEP 562)."""
    if name in _LAZY_SUBPACKAGES:
        return importlib.import_module(f"fastdata.{name}")
    raise AttributeError(f"module 'fastdata' has no attribute {name!r}")


__all__ = [
    "DecodeError",
    "DecodingLoader",
    "FastDataError",
    "FieldSpec",
    "InsufficientMemoryError",
    "Manifest",
    "MemoryReport",
    "PreprocessError",
    "PreprocessOptions",
    "PreprocessSummary",
    "ProfileReport",
    "RAMDataset",
    "RayEngine",
    "ShardAwareDistributedSampler",
    "ShardDataset",
    "ShardFormatError",
    "ShardReader",
    "ShardWriter",
    "TuneResult",
    "__version__",
    "autotune",
    "create_decoder",
    "load_manifest",
    "passthrough_collate",
    "preprocess",
    "profile",
    "share_on_node",
]
