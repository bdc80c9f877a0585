"""What a dataset does with its transform, decided once when the dataset is built.

A dataset reads what a transform declares (:class:`~fastdata.transforms.BatchTransform`'s
``output_size``, ``in_place``, ``min_input_side``) here and nowhere else, checks the
stored image size against it, and keeps the answers in a frozen :class:`TransformPlan`
that every batch reads.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastdata import _roles, ops
from fastdata._fields import moved_roles
from fastdata.shards import FieldSpec
from fastdata.transforms import (
    BatchTransform,
    CenterCrop,
    Compose,
    RandomIoUCrop,
    RandomResizedCrop,
    Resize,
)


@dataclass(frozen=True)
class TransformPlan:
    """How a dataset applies its ``transform`` to the fields it returns, by their roles.

    Attributes:
        transform: The callable, or ``None``.
        field: The image field it applies to: the first field whose role is ``image``
            (raw pixels, or encoded and decoded); ``None`` when the transform applies to
            nothing.
        batched: ``True`` for a :class:`~fastdata.transforms.BatchTransform` (called once
            per batch on NumPy ``(B, H, W, C)`` uint8 with the dataset's threads, masks
            moved alike); ``False`` for any other callable (per sample, on ``(C, H, W)``
            uint8 tensors, torchvision style).
        reads_input_only: The batch transform never writes its input, so it may be given
            the stored rows themselves instead of a copy.
        image_size: The stored ``(height, width)`` of ``field`` (``None``: encoded, or no
            transform).
        output_size: The ``(height, width)`` of the transformed batch for ``image_size``
            (``None``: it varies per sample or is known only from the first output).
        decode_min_side: Decode JPEGs reduced down to this shorter side (``None``: full
            size).
        mask_fields: Fields the batch transform moves along with the image: the fields
            whose role is ``mask``.
        target_fields: The other fields a batch transform is given, by role: boxes (and
            any role with a mover), box labels, and variable-length ``other`` fields
            (per-box flags), which are dropped with their boxes.
        writes_out: The batch transform writes its images into a given ``out`` batch of
            ``output_size`` (in a DataLoader worker the dataset gives it the shared memory
            the batch is returned in).
        decode_crop: The transform's leading random resized crop when encoded images are
            decoded straight into it (crop-in-decode: the same draws and boxes, the JPEG
            decoded at the smallest DCT scale that covers the box); ``None`` otherwise.
        after_decode: What of the transform is left to run after a ``decode_crop`` or a
            ``decode_center`` (``None``: nothing).
        decode_center: The transform's leading ``Resize`` (of the default kernel) and
            ``CenterCrop`` when encoded images are decoded straight into their centre crop
            (the same pixels: the low-pass filter runs only where the crop samples, the crop
            is written into its row of the batch); ``None`` otherwise.
        decode_iou_crop: The transform's leading ``RandomIoUCrop(size=...)`` when encoded
            images are decoded straight into it: the crop drawn from the header's size and
            the batch's boxes, the boxes (and their labels) moved by the same crops after
            the decode; ``None`` otherwise.
    """

    transform: Callable[..., Any] | None
    field: str | None
    batched: bool
    reads_input_only: bool
    image_size: tuple[int, int] | None
    output_size: tuple[int, int] | None
    decode_min_side: int | None
    mask_fields: tuple[str, ...]
    writes_out: bool = False
    decode_crop: RandomResizedCrop | None = None
    after_decode: BatchTransform | None = None
    decode_center: tuple[ops.Resize, ops.CenterCrop] | None = None
    target_fields: tuple[str, ...] = ()
    decode_iou_crop: RandomIoUCrop | None = None

    @property
    def decoded_size(self) -> tuple[int, int] | None:
        """The ``(height, width)`` every image is decoded into (a leading crop handed to the
        decode), or ``None``."""
        if self.decode_crop is not None:
            return self.decode_crop.op.size
        if self.decode_iou_crop is not None:
            return self.decode_iou_crop.size
        return None if self.decode_center is None else self.decode_center[1].size

    @property
    def per_sample(self) -> bool:
        """Whether a per-sample (torchvision-style) callable transforms ``field``."""
        return self.field is not None and not self.batched

    def rows_in_place(self, name: str) -> bool:
        """Whether field ``name`` may reach the transform as stored rows (no copy)."""
        return self.batched and self.reads_input_only and name in self.moved_fields

    @property
    def moved_fields(self) -> tuple[str, ...]:
        """The image field and the masks that move with it (empty: no transform)."""
        return () if self.field is None else (self.field, *self.mask_fields)


def plan_transform(
    transform: Callable[..., Any] | None,
    specs: Mapping[str, FieldSpec],
    fields: Sequence[str],
    *,
    decode: bool,
    decode_min_side: int | None,
    decoded_size: tuple[int, int] | None = None,
) -> TransformPlan:
    """The plan for ``transform`` over ``fields`` stored as ``specs``.

    Args:
        transform: A :class:`~fastdata.transforms.BatchTransform`, any other callable
            (applied per sample), or ``None``.
        specs: The stored fields by name.
        fields: The fields a dataset returns (their roles say which is the image).
        decode: Whether encoded image fields are decoded.
        decode_min_side: The side asked for explicitly (``None``: the transform's
            ``min_input_side`` unless masks come along).
        decoded_size: The ``(height, width)`` a decoder given as ``decode=`` decodes
            encoded images into (``None``: their own size).

    Raises:
        TypeError: ``transform`` is not callable.
        ValueError: The stored images are too small for the transform, or a mask field's
            height and width differ from the images', or a decoder crops images that
            mask fields come along with.
    """
    if transform is not None and not callable(transform):
        raise TypeError(f"transform must be callable or None, got {type(transform).__name__}")
    images = [name for name in fields if specs[name].role == _roles.IMAGE]
    image = images[0] if images else None
    kind = None if image is None else specs[image].field_kind
    is_image = kind is not None and (
        kind.fixed_size or kind.variable_images or (decode and kind.decodes_to_image)
    )
    if transform is None or image is None or kind is None or not is_image:
        return TransformPlan(transform, None, False, False, None, None, decode_min_side, ())
    image_size = kind.image_size
    targets = _target_fields(specs, fields)
    if decoded_size is not None and kind.decodes_to_image and not kind.fixed_size:
        cropped_away = _mask_fields(specs, fields, image, None) + targets
        if cropped_away:
            raise ValueError(
                f"fields {cropped_away} cannot follow field {image!r} through the crop of "
                "the decoder given as decode=: use decode=True and a batch transform, which "
                "moves masks and boxes with the image"
            )
        image_size = decoded_size
    if not isinstance(transform, BatchTransform):
        left_behind = _mask_fields(specs, fields, image, None) + targets
        if left_behind:
            warnings.warn(
                f"transform {transform!r} is applied per sample to field {image!r} only: "
                f"fields {left_behind} (masks, boxes) are not moved with it, so a crop, flip "
                "or resize leaves them misaligned. The batch transforms of "
                "fastdata.transforms move every field by its role",
                UserWarning,
                stacklevel=4,
            )
        return TransformPlan(transform, image, False, False, image_size, None, decode_min_side, ())
    masks = _mask_fields(specs, fields, image, image_size)
    if targets and decode_min_side is not None and not kind.fixed_size:
        raise ValueError(
            f"decode_min_side={decode_min_side!r} shrinks the decoded images but fields "
            f"{targets} hold coordinates in stored pixels: leave decode_min_side unset"
        )
    # Reduced JPEG decoding would shrink images below their full-size masks and boxes.
    auto_side = None if masks or targets else transform.min_input_side
    output_size = _output_size(transform, image, image_size)
    if kind.variable_images:
        output_size = _fixed_output_size(transform, image)
    leading = center = iou = None
    decoded = kind.decodes_to_image and not kind.fixed_size
    if decoded and decoded_size is None and not masks and not targets:
        if decode_min_side is None:
            leading = _leading_crop(transform)
        center = _leading_center_crop(transform)
    if decoded and decoded_size is None and not masks and decode_min_side is None:
        iou = _leading_iou_crop(transform, specs, targets)
    return TransformPlan(
        transform,
        image,
        True,
        not transform.in_place,
        image_size,
        output_size,
        decode_min_side or auto_side,
        masks,
        transform.writes_out and output_size is not None,
        None if leading is None else leading[0],
        next((found[1] for found in (leading, center, iou) if found is not None), None),
        None if center is None else center[0],
        targets,
        None if iou is None else iou[0],
    )


def _leading_crop(
    transform: BatchTransform,
) -> tuple[RandomResizedCrop, BatchTransform | None] | None:
    """``transform``'s leading random resized crop (of the default kernel) and the rest
    (``None``: nothing), or ``None`` when it does not start with one."""
    steps = transform.transforms if isinstance(transform, Compose) else [transform]
    first = steps[0] if steps else None
    if not isinstance(first, RandomResizedCrop) or first.interpolation is not None:
        return None
    rest = steps[1:]
    return first, (Compose(rest) if len(rest) > 1 else rest[0] if rest else None)


def _leading_iou_crop(
    transform: BatchTransform, specs: Mapping[str, FieldSpec], targets: Sequence[str]
) -> tuple[RandomIoUCrop, BatchTransform | None] | None:
    """``transform``'s leading ``RandomIoUCrop`` with an output ``size`` (of the default
    kernel) and the rest, when a boxes field comes along for it to draw from; else
    ``None``."""
    steps = transform.transforms if isinstance(transform, Compose) else [transform]
    first = steps[0] if steps else None
    if not isinstance(first, RandomIoUCrop) or first.size is None or first.interpolation:
        return None
    if not any(specs[name].role == _roles.BOXES for name in targets):
        return None
    rest = steps[1:]
    return first, (Compose(rest) if len(rest) > 1 else rest[0] if rest else None)


def _leading_center_crop(
    transform: BatchTransform,
) -> tuple[tuple[ops.Resize, ops.CenterCrop], BatchTransform | None] | None:
    """``transform``'s leading ``Resize`` (of the default kernel) + ``CenterCrop`` and the
    rest (``None``: nothing), or ``None`` when it does not start with them."""
    steps = transform.transforms if isinstance(transform, Compose) else [transform]
    if len(steps) < 2 or not isinstance(steps[0], Resize) or not isinstance(steps[1], CenterCrop):
        return None
    if steps[0].interpolation is not None:
        return None
    rest = steps[2:]
    return (steps[0].op, steps[1].op), (
        Compose(rest) if len(rest) > 1 else rest[0] if rest else None
    )


def _output_size(
    transform: BatchTransform, name: str, size: tuple[int, int] | None
) -> tuple[int, int] | None:
    """What ``transform`` makes of the stored size, so that a crop larger than the images
    fails when the dataset is built rather than at the first batch."""
    if size is None:
        return None
    try:
        return transform.output_size(size)
    except ValueError as exc:
        raise ValueError(
            f"transform {transform!r} cannot take field {name!r} "
            f"({size[0]}x{size[1]} images): {exc}"
        ) from exc


def _fixed_output_size(transform: BatchTransform, name: str) -> tuple[int, int]:
    """The one output size ``transform`` makes of images of any size: field ``name``
    holds images whose sizes vary, and a batch is one array."""
    size = transform.output_size(None)
    if size is None:
        raise ValueError(
            f"transform {transform!r} makes outputs whose size follows each input, but "
            f"field {name!r} holds images of varying sizes: start it with a transform of a "
            "fixed output size (RandomResizedCrop, or Resize then CenterCrop)"
        )
    return size


def _target_fields(specs: Mapping[str, FieldSpec], fields: Sequence[str]) -> tuple[str, ...]:
    """Fields other than images and masks that a batch transform moves or filters: roles
    with a mover, box labels, and variable-length ``other`` fields (per-box values)."""
    found = []
    for name in fields:
        spec = specs[name]
        role = spec.role
        if role in (_roles.IMAGE, _roles.MASK):
            continue
        ragged_other = role == _roles.OTHER and spec.kind == "ragged"
        if role in moved_roles() or role == _roles.BOX_LABELS or ragged_other:
            found.append(name)
    return tuple(found)


def _mask_fields(
    specs: Mapping[str, FieldSpec],
    fields: Sequence[str],
    image: str,
    image_size: tuple[int, int] | None,
) -> tuple[str, ...]:
    """Every field whose role is ``mask``; their height and width must be the image's when
    both are stored at a fixed size."""
    masks = []
    for name in fields:
        spec = specs[name]
        if spec.role != _roles.MASK:
            continue
        if image_size is not None and tuple(spec.shape) != tuple(image_size):
            raise ValueError(
                f"field {name!r} holds {spec.shape[0]}x{spec.shape[1]} masks but field "
                f"{image!r} holds {image_size[0]}x{image_size[1]} images: the batch "
                "transform moves masks with their images, so their sizes must match (read "
                f"{name!r} without the transform, or store masks of the image size)"
            )
        masks.append(name)
    return tuple(masks)
