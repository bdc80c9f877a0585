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
from fastdata.preprocess import PreprocessOptions, PreprocessSummary, preprocess
from fastdata.shards import FieldSpec, Manifest, ShardReader, ShardWriter, load_manifest

__version__ = "0.1.0"

__all__ = [
    "DecodeError",
    "FastDataError",
    "FieldSpec",
    "InsufficientMemoryError",
    "Manifest",
    "PreprocessError",
    "PreprocessOptions",
    "PreprocessSummary",
    "ShardFormatError",
    "ShardReader",
    "ShardWriter",
    "__version__",
    "load_manifest",
    "preprocess",
]
