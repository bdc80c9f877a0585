"""Field roles: what a stored field *is*, which decides how every executor moves it.

A role is declared per field in the manifest (``role`` in each field entry) and read by
the datasets, the batch transforms, the decoders and the device modules; none of them
guesses from a field's name or shape. Manifests written before roles existed get the
role :func:`default_role` gives, from the names preprocessing wrote then.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

IMAGE = "image"  # pixels, (H, W, C) uint8 (or an encoded image)
MASK = "mask"  # per-pixel class ids, (H, W) uint8, moved nearest-neighbour with its image
BOXES = "boxes"  # (N_i, 4) float32 xyxy in pixels of the image, variable length
LABEL = "label"  # one class per sample (int64 scalar)
BOX_LABELS = "box_labels"  # one class per box, (N_i,) int64
PATH = "path"  # where the sample came from (UTF-8 text)
OTHER = "other"  # anything else: passed through untouched (per-box ones filtered with boxes)

ROLES: tuple[str, ...] = (IMAGE, MASK, BOXES, LABEL, BOX_LABELS, PATH, OTHER)
# The built-in roles plus those registered with a mover (fastdata.transforms.register_mover).
_KNOWN: list[str] = list(ROLES)


def register_role(role: str) -> str:
    """Make ``role`` a valid role name (idempotent)."""
    if not isinstance(role, str) or not role.isidentifier():
        raise ValueError(f"role must be an identifier-like name, got {role!r}")
    if role not in _KNOWN:
        _KNOWN.append(role)
    return role


def known_roles() -> tuple[str, ...]:
    """Every role a field may declare: the built-in ones and the registered ones."""
    return tuple(_KNOWN)


class _SpecLike(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def encoding(self) -> str | None: ...


def check_role(role: str, name: str = "role") -> str:
    """``role`` when it is a known role (:func:`known_roles`); ``ValueError`` else."""
    if not isinstance(role, str):
        raise TypeError(f"{name} must be a str, one of {known_roles()}, got {type(role).__name__}")
    if role not in _KNOWN:
        raise ValueError(f"{name} must be one of {known_roles()}, got {role!r}")
    return role


def default_role(spec: _SpecLike) -> str:
    """The role of a field whose manifest names none (written before roles existed).

    The names preprocessing wrote decide first (``image``/``image_<side>``,
    ``mask``/``mask_<side>``, ``label``, ``path``, ``boxes``, ``labels`` of a set with
    boxes); otherwise what the field holds: encoded images and 3-D uint8 arrays are images,
    2-D uint8 arrays masks, integer scalars labels, UTF-8 text paths, variable-length rows
    of 4 floats boxes and of integer scalars box labels; anything else ``other``.
    """
    name = spec.name.lower()
    integer = np.issubdtype(np.dtype(spec.dtype), np.integer)
    ragged = spec.kind == "ragged"
    if name == "image" or name.startswith("image_"):
        return IMAGE
    if name == "mask" or name.startswith("mask_"):
        return MASK
    if name in ("path", "paths"):
        return PATH
    if name in ("boxes", "bbox", "bboxes") and ragged:
        return BOXES
    if ragged:
        if tuple(spec.shape) == (4,) and not integer:
            return BOXES
        return BOX_LABELS if integer and not spec.shape else OTHER
    if spec.kind == "encoded":
        if spec.encoding in ("jpeg", "png", "image"):
            return IMAGE
        return PATH if spec.encoding == "utf-8" else OTHER
    if name in ("label", "labels", "target", "class") or (integer and not spec.shape):
        return LABEL if not spec.shape else OTHER
    if spec.dtype == "uint8" and len(spec.shape) == 3:
        return IMAGE
    if spec.dtype == "uint8" and len(spec.shape) == 2:
        return MASK
    return OTHER
