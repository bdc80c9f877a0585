"""The on-disk format: HDF5 shards plus an ``index.json`` manifest (see docs/FORMAT.md).

This is the only package that imports h5py.
"""

from fastdata.shards._checksum import VerifyProblem, shard_matches, verify_shards
from fastdata.shards._field_kind import Column, FieldKind
from fastdata.shards._kinds import register_field_kind
from fastdata.shards._schema import (
    MANIFEST_NAME,
    FieldSpec,
    Manifest,
    ShardInfo,
    load_manifest,
    save_manifest,
)
from fastdata.shards.reader import ShardReader
from fastdata.shards.writer import COMPRESSIONS, ShardWriter

__all__ = [
    "COMPRESSIONS",
    "MANIFEST_NAME",
    "Column",
    "FieldKind",
    "FieldSpec",
    "Manifest",
    "ShardInfo",
    "ShardReader",
    "ShardWriter",
    "VerifyProblem",
    "load_manifest",
    "register_field_kind",
    "save_manifest",
    "shard_matches",
    "verify_shards",
]
