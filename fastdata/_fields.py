"""The batch convention of the CPU executors and the per-role movers.

A :class:`FieldBatch` is what every batch transform takes and returns: fields by name,
each with its role. A geometric transform draws one :class:`Geometry` per batch (per
sample: the region cut from the input, the size it is resized to, where it lands on the
output canvas, a horizontal flip) and hands it to the mover of each field's role, looked
up in :data:`MOVERS`: pixels for images, nearest-neighbour for masks, coordinates for
boxes (:mod:`fastdata._boxes`). A new role is one :func:`register_mover` call (and, for a
stored field, a field kind): no executor or dataset changes.

Boxes that leave the output are dropped together with the rows of their *companions*:
``box_labels`` fields, and every other variable-length field (a list of arrays) of the
batch whose per-sample row counts equal the boxes' (per-box flags such as ``iscrowd``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Protocol

import cv2
import numpy as np

from fastdata import _roles
from fastdata._boxes import (
    DEFAULT_MIN_SIZE,
    DEFAULT_MIN_VISIBILITY,
    as_boxes,
    box_areas,
    sanitize_boxes,
)
from fastdata._images import Images
from fastdata._resize import resize_image
from fastdata._threads import parallel_for

# Masks are resampled nearest-neighbour at pixel centres (OpenCV's INTER_NEAREST samples
# the top-left corner instead, half a pixel off the bilinear image); grid_sample's
# "nearest" with align_corners=False, the device executor's, samples the same centres.
MASK_INTERPOLATION = cv2.INTER_NEAREST_EXACT


@dataclass
class FieldBatch:
    """A batch of named fields, each with its role: what batch transforms take and return.

    Attributes:
        values: Field name → its batch: images ``(B, H, W, C)`` uint8 (or a list of
            ``(H, W, C)``), masks ``(B, H, W)`` uint8, boxes a list of ``(N_i, 4)`` float32
            xyxy pixel arrays, box labels a list of ``(N_i,)`` int64, labels ``(B,)``.
        roles: Field name → role (see :mod:`fastdata._roles`); a field with no entry is
            ``other`` and passes through untouched.
    """

    values: dict[str, Any]
    roles: dict[str, str] = field(default_factory=dict)

    def role(self, name: str) -> str:
        """The role of field ``name`` (``other`` when none was given)."""
        return self.roles.get(name, _roles.OTHER)

    def names(self, role: str) -> list[str]:
        """The fields of ``role``, in order."""
        return [name for name in self.values if self.role(name) == role]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


def as_field_batch(
    batch: Mapping[str, Any] | FieldBatch, roles: Mapping[str, str] | None = None
) -> FieldBatch:
    """``batch`` as a :class:`FieldBatch`; roles not given default from the field names
    (``image``, ``mask``, ``boxes``; ``labels`` and ``box_labels`` are box labels,
    ``label`` a class per sample; anything else ``other``)."""
    if isinstance(batch, FieldBatch):
        return batch if roles is None else FieldBatch(dict(batch.values), dict(roles))
    given = dict(roles or {})
    for name in batch:
        if name not in given:
            given[name] = _guess_role(name)
    for name, role in given.items():
        _roles.check_role(role, f"roles[{name!r}]")
    return FieldBatch(dict(batch), given)


def _guess_role(name: str) -> str:
    lowered = name.lower()
    for prefix, role in (
        ("image", _roles.IMAGE),
        ("mask", _roles.MASK),
        ("boxes", _roles.BOXES),
        ("box_labels", _roles.BOX_LABELS),
    ):
        if lowered == prefix or lowered.startswith(prefix + "_"):
            return role
    if lowered in ("labels",):
        return _roles.BOX_LABELS
    if lowered in ("label", "target"):
        return _roles.LABEL
    return _roles.OTHER


@dataclass(frozen=True)
class Geometry:
    """One draw of a geometric op for a batch, per sample ``k``: cut ``crops[k]``
    ``(top, left, height, width)`` (ints, input pixels; may reach past the input, which
    reads as zeros), resize it to ``resized[k]`` ``(height, width)``, put it at
    ``offsets[k]`` ``(top, left)`` of a zero canvas of ``out_sizes[k]``, mirror the canvas
    left-right where ``flips[k]``.

    Crop, resize, centre crop, flip and letterbox are all of this form.
    """

    crops: np.ndarray  # (B, 4) int64
    resized: np.ndarray  # (B, 2) int64
    offsets: np.ndarray  # (B, 2) int64
    out_sizes: np.ndarray  # (B, 2) int64
    flips: np.ndarray  # (B,) bool

    @classmethod
    def of(
        cls,
        crops: np.ndarray,
        resized: np.ndarray | Sequence[Sequence[int]],
        flips: np.ndarray | None = None,
        offsets: np.ndarray | None = None,
        out_sizes: np.ndarray | Sequence[Sequence[int]] | None = None,
    ) -> Geometry:
        """A geometry from its parts (no pad and no flip unless given)."""
        crop_rows = np.asarray(crops, np.int64).reshape(-1, 4)
        count = len(crop_rows)
        resized_rows = np.asarray(resized, np.int64).reshape(count, 2)
        return cls(
            crop_rows,
            resized_rows,
            np.zeros((count, 2), np.int64) if offsets is None else np.asarray(offsets, np.int64),
            resized_rows
            if out_sizes is None
            else np.asarray(out_sizes, np.int64).reshape(count, 2),
            np.zeros(count, bool) if flips is None else np.asarray(flips, bool).reshape(count),
        )

    @classmethod
    def identity(cls, heights: np.ndarray, widths: np.ndarray, flips: np.ndarray) -> Geometry:
        """No crop and no resize: only the flips."""
        zeros = np.zeros(len(heights), np.int64)
        crops = np.stack([zeros, zeros, heights, widths], axis=1)
        return cls.of(crops, np.stack([heights, widths], axis=1), flips)

    @property
    def uniform_size(self) -> tuple[int, int] | None:
        """The output ``(height, width)`` shared by every sample, or ``None``."""
        if len(self.out_sizes) == 0 or (self.out_sizes != self.out_sizes[0]).any():
            return None
        return int(self.out_sizes[0, 0]), int(self.out_sizes[0, 1])

    def box_crops(self) -> np.ndarray:
        """``(B, 4)`` float64 ``(top, left, height, width)``: the region of the input that
        the whole canvas shows (reaching past the crop where the canvas is padded), the
        form :func:`fastdata._boxes.place_box_batch` takes."""
        crops = self.crops.astype(np.float64)
        scale_y = crops[:, 2] / self.resized[:, 0]
        scale_x = crops[:, 3] / self.resized[:, 1]
        return np.stack(
            [
                crops[:, 0] - self.offsets[:, 0] * scale_y,
                crops[:, 1] - self.offsets[:, 1] * scale_x,
                self.out_sizes[:, 0] * scale_y,
                self.out_sizes[:, 1] * scale_x,
            ],
            axis=1,
        )


class GeometricExecutor(Protocol):
    """What a mover reads of the transform moving a batch."""

    interpolation: int | None
    min_box_size: float
    min_box_visibility: float


@dataclass(frozen=True)
class Move:
    """One batch's move, as a mover gets it.

    Attributes:
        transform: The transform moving the batch (its kernel and box settings).
        geometry: The batch's geometry.
        executor: Optional thread pool for per-sample work.
        tasks: Slices to split the batch into on ``executor``.
        out: Where the first image field's output goes (``None`` for other fields).
    """

    transform: GeometricExecutor
    geometry: Geometry
    executor: Executor | None = None
    tasks: int = 1
    out: np.ndarray | None = None


# (move, field's batch) -> (moved batch, per sample the kept rows or None)
Mover = Callable[[Move, Any], tuple[Any, list[np.ndarray] | None]]
MOVERS: dict[str, Mover] = {}


def register_mover(role: str, mover: Mover) -> Mover:
    """Make ``mover`` move every field of ``role`` under the geometric transforms (a new
    role is registered as a side effect).

    Args:
        role: The role's name.
        mover: ``(move, batch) -> (moved, keep)`` (:class:`Move`), where ``keep`` is
            None or, per sample, a bool array over the field's rows (rows dropped together
            with its companions, as boxes are).
    """
    _roles.register_role(role)
    MOVERS[role] = mover
    return mover


def moved_roles() -> tuple[str, ...]:
    """The roles a geometric transform moves (those with a mover)."""
    return tuple(MOVERS)


def _output(
    batch: Images, geometry: Geometry, out: np.ndarray | None
) -> np.ndarray | list[np.ndarray]:
    """A uniform output batch (``out`` when given, checked) or a list for varying sizes."""
    size = geometry.uniform_size
    first = batch[0] if len(batch) else np.empty((1, 1, 3), np.uint8)
    if size is None:
        if out is not None:
            raise ValueError("out cannot hold outputs of different sizes")
        return [np.empty((*map(int, s), *first.shape[2:]), np.uint8) for s in geometry.out_sizes]
    shape = (len(batch), *size, *first.shape[2:])
    if out is None:
        return np.empty(shape, np.uint8)
    if out.shape != shape or out.dtype != np.uint8 or not out.flags.c_contiguous:
        raise ValueError(
            f"out must be a C-contiguous {shape} uint8 array, got {out.shape} {out.dtype}"
        )
    return out


def _region(source: np.ndarray, top: int, left: int, height: int, width: int) -> np.ndarray:
    """``source[top:top + height, left:left + width]``, zeros where it reaches past."""
    src_h, src_w = source.shape[:2]
    if top >= 0 and left >= 0 and top + height <= src_h and left + width <= src_w:
        return source[top : top + height, left : left + width]
    region = np.zeros((height, width, *source.shape[2:]), source.dtype)
    y0, x0 = max(top, 0), max(left, 0)
    y1, x1 = min(top + height, src_h), min(left + width, src_w)
    if y1 > y0 and x1 > x0:
        region[y0 - top : y1 - top, x0 - left : x1 - left] = source[y0:y1, x0 : x0 + (x1 - x0)]
    return region


def warp_pixels(
    batch: Images,
    geometry: Geometry,
    interpolation: int | None,
    *,
    executor: Executor | None = None,
    tasks: int = 1,
    out: np.ndarray | None = None,
) -> Images:
    """Move a batch of pixels (images or masks) by ``geometry``.

    ``interpolation`` ``None`` is the antialiased kernel of :mod:`fastdata._resize`;
    otherwise an OpenCV ``INTER_*`` flag (:data:`MASK_INTERPOLATION` for masks). A sample
    the geometry leaves as it is (no crop, no resize, no pad) is flipped in place.
    """
    crops = geometry.crops.tolist()
    resized = geometry.resized.tolist()
    offsets = geometry.offsets.tolist()
    out_sizes = geometry.out_sizes.tolist()
    flips = geometry.flips.tolist()
    untouched = all(
        c[0] == 0 and c[1] == 0 and c[2:] == r == s and list(b.shape[:2]) == r and o == [0, 0]
        for c, r, o, s, b in zip(crops, resized, offsets, out_sizes, batch, strict=True)
    )
    if untouched and out is None:  # a flip only: in place
        if isinstance(batch, list):
            for k in np.flatnonzero(flips).tolist():
                batch[k] = cv2.flip(batch[k], 1)
            return batch
        chosen = np.flatnonzero(flips).tolist()

        def flip_body(start: int, stop: int) -> None:
            for k in chosen[start:stop]:
                cv2.flip(batch[k], 1, dst=batch[k])

        parallel_for(executor, len(chosen), flip_body, tasks=tasks)
        return batch
    result = _output(batch, geometry, out)

    def body(start: int, stop: int) -> None:
        for k in range(start, stop):
            top, left, height, width = crops[k]
            region = _region(batch[k], top, left, height, width)
            target = result[k]
            pad_top, pad_left = offsets[k]
            res_h, res_w = resized[k]
            padded = (pad_top, pad_left) != (0, 0) or tuple(out_sizes[k]) != (res_h, res_w)
            if padded:
                target[...] = 0
            dest = target[pad_top : pad_top + res_h, pad_left : pad_left + res_w]
            if (height, width) == (res_h, res_w):
                dest[...] = region
            elif interpolation is None:
                if dest.flags.c_contiguous:
                    resize_image(region, res_w, res_h, dest)
                else:
                    dest[...] = resize_image(region, res_w, res_h)
            elif dest.flags.c_contiguous:
                cv2.resize(region, (res_w, res_h), dst=dest, interpolation=interpolation)
            else:
                dest[...] = cv2.resize(region, (res_w, res_h), interpolation=interpolation)
            if flips[k]:
                cv2.flip(target, 1, dst=target)

    parallel_for(executor, len(batch), body, tasks=tasks)
    return result


def move_images(move: Move, batch: Images) -> tuple[Images, None]:
    """The image mover: the transform's resampling kernel."""
    moved = warp_pixels(
        batch,
        move.geometry,
        move.transform.interpolation,
        executor=move.executor,
        tasks=move.tasks,
        out=move.out,
    )
    return moved, None


def move_masks(move: Move, batch: Images) -> tuple[Images, None]:
    """The mask mover: nearest-neighbour at pixel centres, so labels stay labels."""
    moved = warp_pixels(
        batch, move.geometry, MASK_INTERPOLATION, executor=move.executor, tasks=move.tasks
    )
    return moved, None


def move_boxes(move: Move, batch: Sequence[Any]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The boxes mover: :func:`fastdata._boxes.place_boxes`, then each box clipped to
    the part of the canvas the image covers and dropped by
    :func:`fastdata._boxes.sanitize_boxes`' rule (the transform's ``min_box_size`` and
    ``min_box_visibility``); the whole batch in one vectorised pass."""
    geometry, transform = move.geometry, move.transform
    arrays = [as_boxes(np.asarray(item)) for item in batch]
    counts = np.array([len(rows) for rows in arrays], np.int64)
    if not counts.sum():
        return [rows.copy() for rows in arrays], [np.zeros(0, bool) for _ in arrays]
    flat = np.concatenate(arrays).astype(np.float64)
    crops = np.repeat(geometry.box_crops(), counts, axis=0)
    out_h, out_w = (np.repeat(geometry.out_sizes[:, k], counts).astype(np.float64) for k in (0, 1))
    res_h, res_w = (np.repeat(geometry.resized[:, k], counts).astype(np.float32) for k in (0, 1))
    pad_top, pad_left = (
        np.repeat(geometry.offsets[:, k], counts).astype(np.float32) for k in (0, 1)
    )
    # place_boxes, row by row: (x - left) * W_out / width in float64, stored as float32
    scale_x, scale_y = out_w / crops[:, 3], out_h / crops[:, 2]
    placed = np.stack(
        [
            (flat[:, 0] - crops[:, 1]) * scale_x,
            (flat[:, 1] - crops[:, 0]) * scale_y,
            (flat[:, 2] - crops[:, 1]) * scale_x,
            (flat[:, 3] - crops[:, 0]) * scale_y,
        ],
        axis=1,
    ).astype(np.float32)
    shift = np.stack([pad_left, pad_top, pad_left, pad_top], axis=1)
    local = placed - shift  # in the resized image's pixels, for the clip
    # sanitize_boxes, with each row's own limits
    if not transform.min_box_size >= 0 or not 0 <= transform.min_box_visibility <= 1:
        sanitize_boxes(local[:0], (1, 1), transform.min_box_size, transform.min_box_visibility)
    limits = np.stack([res_w, res_h, res_w, res_h], axis=1)
    clipped = np.clip(np.nan_to_num(local), 0.0, limits).astype(np.float32)
    widths, heights = clipped[:, 2] - clipped[:, 0], clipped[:, 3] - clipped[:, 1]
    keep = (
        np.isfinite(local).all(axis=1)
        & (widths >= transform.min_box_size)
        & (heights >= transform.min_box_size)
        & (widths > 0)
        & (heights > 0)
        & (widths * heights >= transform.min_box_visibility * box_areas(local))
    )
    canvas = clipped + shift
    mirrored = np.repeat(geometry.flips, counts)
    width_f32 = out_w.astype(np.float32)
    canvas = np.where(
        mirrored[:, None],
        np.stack(
            [width_f32 - canvas[:, 2], canvas[:, 1], width_f32 - canvas[:, 0], canvas[:, 3]], 1
        ),
        canvas,
    ).astype(np.float32)
    splits = np.cumsum(counts)[:-1]
    kept = np.split(keep, splits)
    moved = [rows[mask] for rows, mask in zip(np.split(canvas, splits), kept, strict=True)]
    return moved, kept


register_mover(_roles.IMAGE, move_images)
register_mover(_roles.MASK, move_masks)
register_mover(_roles.BOXES, move_boxes)


def companions(batch: FieldBatch, name: str) -> list[str]:
    """The fields whose rows are dropped with field ``name``'s: box labels, and other
    variable-length fields with the same row count in every sample."""
    counts = [len(item) for item in batch.values[name]]
    found = []
    for other, value in batch.values.items():
        if other == name or batch.role(other) in MOVERS:
            continue
        if not isinstance(value, list) or len(value) != len(counts):
            continue
        if batch.role(other) == _roles.BOX_LABELS or [len(v) for v in value] == counts:
            found.append(other)
    return found


def apply_geometry(
    transform: GeometricExecutor,
    batch: FieldBatch,
    geometry: Geometry,
    *,
    executor: Executor | None = None,
    tasks: int = 1,
    out: np.ndarray | None = None,
) -> FieldBatch:
    """Move every field whose role has a mover by ``geometry`` (``out`` for the first
    image field), drop the rows each mover dropped from its companions, and pass the
    other fields through."""
    values = dict(batch.values)
    given_out = out
    for name, value in batch.values.items():
        mover = MOVERS.get(batch.role(name))
        if mover is None:
            continue
        target = given_out if batch.role(name) == _roles.IMAGE else None
        if target is not None:
            given_out = None
        move = Move(transform, geometry, executor, tasks, target)
        moved, keep = mover(move, value)
        values[name] = moved
        if keep is None:
            continue
        for other in companions(batch, name):
            values[other] = [
                np.asarray(item)[mask] for item, mask in zip(values[other], keep, strict=True)
            ]
    return FieldBatch(values, dict(batch.roles))


__all__ = [
    "DEFAULT_MIN_SIZE",
    "DEFAULT_MIN_VISIBILITY",
    "MASK_INTERPOLATION",
    "MOVERS",
    "FieldBatch",
    "Geometry",
    "Move",
    "apply_geometry",
    "as_field_batch",
    "moved_roles",
    "register_mover",
    "warp_pixels",
]
