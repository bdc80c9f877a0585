"""fastdata: make PyTorch training stop waiting for data.

The public API. Optional backends (DALI, Ray, CUDA) are never imported here.
"""

from fastdata.errors import (
    DecodeError,
    FastDataError,
    InsufficientMemoryError,
    PreprocessError,
    ShardFormatError,
)
from fastdata.shards import FieldSpec, Manifest, ShardReader, ShardWriter, load_manifest
from fastdata.tune import ProfileReport, TuneResult, autotune, profile

__version__ = "0.1.0"

__all__ = [
    "DecodeError",
    "FastDataError",
    "FieldSpec",
    "InsufficientMemoryError",
    "Manifest",
    "PreprocessError",
    "ProfileReport",
    "ShardFormatError",
    "ShardReader",
    "ShardWriter",
    "TuneResult",
    "__version__",
    "autotune",
    "load_manifest",
    "profile",
]
