"""The on-disk format: HDF5 shards plus an ``index.json`` manifest (see docs/FORMAT.md).

This is the only package that imports h5py. Every name loads on first access (PEP 562):
preprocessing workers need the schema (:class:`FieldSpec`), not h5py and the reader
and writer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastdata import _lazy

if TYPE_CHECKING:
    from fastdata.shards._checksum import VerifyProblem, verify_shards
    from fastdata.shards._field_kind import Column, FieldKind
    from fastdata.shards._kinds import register_field_kind
    from fastdata.shards._schema import (
        COMPRESSIONS,
        MANIFEST_NAME,
        FieldSpec,
        Manifest,
        ShardInfo,
        load_manifest,
        save_manifest,
    )
    from fastdata.shards.reader import ShardReader
    from fastdata.shards.writer import ShardWriter

# public name -> the module that defines it
_LAZY_NAMES = {
    **dict.fromkeys(
        ("VerifyProblem", "verify_shards"), "fastdata.shards._checksum"
    ),
    **dict.fromkeys(("Column", "FieldKind"), "fastdata.shards._field_kind"),
    "register_field_kind": "fastdata.shards._kinds",
    **dict.fromkeys(
        ("COMPRESSIONS", "MANIFEST_NAME", "FieldSpec", "Manifest", "ShardInfo",
         "load_manifest", "save_manifest"),
        "fastdata.shards._schema",
    ),
    "ShardReader": "fastdata.shards.reader",
    "ShardWriter": "fastdata.shards.writer",
}  # fmt: skip


__getattr__, __dir__ = _lazy.lazy_attributes(__name__, _LAZY_NAMES)

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
    "verify_shards",
]
