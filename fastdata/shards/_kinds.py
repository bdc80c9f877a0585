"""The registry of field kinds: the name a manifest gives a field's ``kind`` → its class.

A new kind of field (say per-sample point clouds) is one
:class:`~fastdata.shards.FieldKind` subclass passed to :func:`register_field_kind`.
"""

from __future__ import annotations

from fastdata.shards._array_kind import ArrayKind
from fastdata.shards._encoded_kind import EncodedKind
from fastdata.shards._field_kind import FieldKind
from fastdata.shards._ragged_image_kind import RaggedImageKind
from fastdata.shards._ragged_kind import RaggedKind

FIELD_KINDS: dict[str, type[FieldKind]] = {
    kind.name: kind for kind in (ArrayKind, EncodedKind, RaggedKind, RaggedImageKind)
}


def register_field_kind(cls: type[FieldKind]) -> type[FieldKind]:
    """Make ``cls`` the kind named ``cls.name`` in manifests (usable as a decorator).

    Args:
        cls: A :class:`FieldKind` subclass.

    Example:
        >>> @register_field_kind                                    # doctest: +SKIP
        ... class BoxesKind(FieldKind):
        ...     name = "boxes"
        ...     fixed_size = False
        ...     ...

    Raises:
        TypeError: ``cls`` is not a :class:`FieldKind` subclass.
        ValueError: Another class already has the name.
    """
    if not (isinstance(cls, type) and issubclass(cls, FieldKind)):
        raise TypeError(f"cls must be a FieldKind subclass, got {cls!r}")
    held = FIELD_KINDS.get(cls.name)
    if held is not None and held is not cls:
        raise ValueError(f"field kind {cls.name!r} is already {held.__qualname__}")
    FIELD_KINDS[cls.name] = cls
    return cls


def kind_class(name: str) -> type[FieldKind]:
    """The class of kind ``name``; ``ValueError`` naming the known kinds otherwise."""
    cls = FIELD_KINDS.get(name)
    if cls is None:
        known = ", ".join(repr(k) for k in FIELD_KINDS)
        raise ValueError(f"kind must be one of {known}, got {name!r}")
    return cls
