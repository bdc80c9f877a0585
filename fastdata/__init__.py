"""fastdata: make PyTorch training stop waiting for data.

The public API. Every name loads on first access (PEP 562), so ``import fastdata`` and the
CLI start without importing torch, and preprocessing workers never import it; optional
backends (DALI, Ray, torchvision/CUDA) load only when a backend that needs them is
created. The device-side modules live in ``fastdata.gpu`` (``fastdata.gpu.Normalize``,
``fastdata.gpu.DevicePrefetcher``), the CPU batch augmentations in
``fastdata.transforms``, and the descriptions both run (and the decoders' ``random_crop``)
in ``fastdata.ops``. The preprocessing entry point is
``fastdata.preprocess.preprocess`` (``fastdata.preprocess`` is its subpackage).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata import _cuda_fork, _lazy  # noqa: F401 - _cuda_fork: its fork hook (see there)
from fastdata._version import __version__
from fastdata.errors import (
    DecodeError,
    FastDataError,
    InsufficientMemoryError,
    OnError,
    PreprocessError,
    ShardFormatError,
    StorageError,
)

if TYPE_CHECKING:
    from fastdata.datasets import (
        RAMDataset,
        ShardAwareDistributedSampler,
        ShardDataset,
        passthrough_collate,
        share_on_node,
    )
    from fastdata.decode import DecodingLoader, create_decoder
    from fastdata.preprocess import PreprocessOptions
    from fastdata.shards import load_manifest
    from fastdata.tune import autotune, profile


# public name -> the module that defines it
_LAZY_NAMES = {
    **dict.fromkeys(
        ("RAMDataset", "ShardAwareDistributedSampler", "ShardDataset", "passthrough_collate",
         "share_on_node"),
        "fastdata.datasets",
    ),
    **dict.fromkeys(("DecodingLoader", "create_decoder"), "fastdata.decode"),
    "PreprocessOptions": "fastdata.preprocess",
    "load_manifest": "fastdata.shards",
    **dict.fromkeys(("autotune", "profile"), "fastdata.tune"),
}  # fmt: skip
_LAZY_SUBPACKAGES = frozenset({"gpu", "ops", "transforms"})


__getattr__, __dir__ = _lazy.lazy_attributes(__name__, _LAZY_NAMES, _LAZY_SUBPACKAGES)


__all__ = [
    "DecodeError",
    "DecodingLoader",
    "FastDataError",
    "InsufficientMemoryError",
    "OnError",
    "PreprocessError",
    "PreprocessOptions",
    "RAMDataset",
    "ShardAwareDistributedSampler",
    "ShardDataset",
    "ShardFormatError",
    "StorageError",
    "__version__",
    "autotune",
    "create_decoder",
    "load_manifest",
    "passthrough_collate",
    "profile",
    "share_on_node",
]
