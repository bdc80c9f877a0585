"""Box geometry: where ``xyxy`` boxes land under a crop, a resize and a horizontal flip, and
which of them survive the output's edges.

The one implementation that the CPU transforms, the decoder crops, the device augmentations
and offline preprocessing share, so that every executor given the same draws moves boxes the
same way. Boxes are ``(N, 4)`` float32 rows ``(x1, y1, x2, y2)`` in pixels, ``x`` along the
width; a pixel ``(row, col)`` covers ``[col, col + 1) x [row, row + 1)``, so a box around a
whole ``H x W`` image is ``(0, 0, W, H)``.

Every geometric step the library applies (crop, resize, pad, flip) is, per axis,
``x -> x * scale + shift`` possibly mirrored, so a step is described by the crop it cuts in
the input, ``(top, left, height, width)`` as floats (a letterbox pad is a crop that reaches
past the image: negative ``top``/``left``, sides longer than the image), the output size and
a flip flag. :func:`place_boxes` maps boxes through it without clipping; :func:`sanitize_boxes`
then clips to the output and applies the dropping rule.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

# Drop a box when less than this fraction of its area (as mapped, before clipping) is left
# inside the output. Low on purpose: a box is kept while any real part of its object is
# visible, so almost every visible object pixel stays inside some box.
DEFAULT_MIN_VISIBILITY = 0.1
# Drop a box whose clipped width or height is below this many output pixels.
DEFAULT_MIN_SIZE = 1.0

Crop = tuple[float, float, float, float]


def as_boxes(boxes: npt.ArrayLike, name: str = "boxes") -> npt.NDArray[np.float32]:
    """``boxes`` as a ``(N, 4)`` float32 array (a copy only when needed).

    Raises:
        ValueError: The array is not ``(N, 4)``.
    """
    array = np.asarray(boxes, dtype=np.float32)
    if array.ndim == 1 and array.size == 0:
        array = array.reshape(0, 4)
    if array.ndim != 2 or array.shape[1] != 4:
        raise ValueError(f"{name} must have shape (N, 4) xyxy, got {array.shape}")
    return array


def box_areas(boxes: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
    """Areas of ``(N, 4)`` xyxy boxes, ``(N,)`` float32; a negative side counts as 0."""
    widths = np.clip(boxes[:, 2] - boxes[:, 0], 0.0, None)
    heights = np.clip(boxes[:, 3] - boxes[:, 1], 0.0, None)
    return (widths * heights).astype(np.float32, copy=False)


def place_boxes(
    boxes: npt.ArrayLike,
    crop: Sequence[float],
    out_size: Sequence[int],
    flip: bool = False,
) -> npt.NDArray[np.float32]:
    """Map boxes through one crop, a resize to ``out_size`` and an optional horizontal flip.

    Args:
        boxes: ``(N, 4)`` xyxy in input pixels (``N`` may be 0).
        crop: ``(top, left, height, width)`` of the region cut from the input, in input
            pixels (floats; may reach outside the input, as a pad does).
        out_size: ``(H, W)`` of the output the crop is resized to.
        flip: Mirror the output left-right after the resize.

    Returns:
        ``(N, 4)`` float32 xyxy in output pixels, not clipped (see :func:`sanitize_boxes`).

    Raises:
        ValueError: ``boxes`` is not ``(N, 4)``, or a crop side or output side is not positive.
    """
    array = as_boxes(boxes)
    top, left, height, width = (float(value) for value in crop)
    out_height, out_width = (float(side) for side in out_size)
    if min(height, width, out_height, out_width) <= 0:
        raise ValueError(
            f"crop sides and out_size must be positive, got crop={tuple(crop)!r}, "
            f"out_size={tuple(out_size)!r}"
        )
    scale = np.array(
        [out_width / width, out_height / height, out_width / width, out_height / height],
        dtype=np.float64,
    )
    shift = np.array([left, top, left, top], dtype=np.float64)
    placed = (array.astype(np.float64) - shift) * scale
    if flip:
        placed = np.stack(
            [out_width - placed[:, 2], placed[:, 1], out_width - placed[:, 0], placed[:, 3]],
            axis=1,
        )
    return placed.astype(np.float32)


def place_box_batch(
    boxes: Sequence[npt.ArrayLike],
    crops: npt.ArrayLike,
    out_size: Sequence[int],
    flips: npt.ArrayLike | None = None,
) -> list[npt.NDArray[np.float32]]:
    """:func:`place_boxes` for a batch: one crop and flip per sample, in one vectorised pass.

    Args:
        boxes: ``B`` arrays ``(N_i, 4)`` xyxy in each sample's input pixels.
        crops: ``(B, 4)`` rows ``(top, left, height, width)`` in input pixels.
        out_size: ``(H, W)`` shared by the batch.
        flips: ``(B,)`` bools, or None for no flip.

    Returns:
        ``B`` float32 arrays ``(N_i, 4)`` in output pixels, not clipped.
    """
    arrays = [as_boxes(item) for item in boxes]
    crop_rows = np.asarray(crops, dtype=np.float64).reshape(-1, 4)
    if len(crop_rows) != len(arrays):
        raise ValueError(
            f"crops must have one row per sample ({len(arrays)}), got {len(crop_rows)}"
        )
    flip_flags = (
        np.zeros(len(arrays), dtype=bool) if flips is None else np.asarray(flips, dtype=bool)
    )
    if flip_flags.shape != (len(arrays),):
        raise ValueError(
            f"flips must have one flag per sample ({len(arrays)}), got {flip_flags.shape}"
        )
    out_height, out_width = (float(side) for side in out_size)
    if arrays and (crop_rows[:, 2:].min() <= 0 or min(out_height, out_width) <= 0):
        raise ValueError(
            f"crop sides and out_size must be positive, got out_size={tuple(out_size)!r}"
        )
    counts = np.array([len(item) for item in arrays], dtype=np.int64)
    if counts.sum() == 0:
        return [np.zeros((0, 4), np.float32) for _ in arrays]
    flat = np.concatenate(arrays).astype(np.float64)
    rows = np.repeat(crop_rows, counts, axis=0)
    scale_x = out_width / rows[:, 3]
    scale_y = out_height / rows[:, 2]
    x1 = (flat[:, 0] - rows[:, 1]) * scale_x
    x2 = (flat[:, 2] - rows[:, 1]) * scale_x
    y1 = (flat[:, 1] - rows[:, 0]) * scale_y
    y2 = (flat[:, 3] - rows[:, 0]) * scale_y
    mirrored = np.repeat(flip_flags, counts)
    x1, x2 = np.where(mirrored, out_width - x2, x1), np.where(mirrored, out_width - x1, x2)
    placed = np.stack([x1, y1, x2, y2], axis=1).astype(np.float32)
    return list(np.split(placed, np.cumsum(counts)[:-1]))


def sanitize_boxes(
    boxes: npt.ArrayLike,
    out_size: Sequence[int],
    min_size: float = DEFAULT_MIN_SIZE,
    min_visibility: float = DEFAULT_MIN_VISIBILITY,
    areas_before: npt.ArrayLike | None = None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """Clip boxes to the output and decide which to keep.

    The rule: clip each box to ``[0, W] x [0, H]``; keep it when both clipped sides are at
    least ``min_size`` pixels and the clipped area is at least ``min_visibility`` times its
    area as mapped (``areas_before``, before clipping). Boxes with a NaN or infinite
    coordinate are dropped. A box is *not* dropped because its centre left the output
    (torchvision's and DALI's rule, which loses boxes around objects that are still half
    visible): with the defaults (1 px, 10 %) a box goes only when at most a tenth of it, or
    a sliver under a pixel wide, is left.

    Args:
        boxes: ``(N, 4)`` xyxy in output pixels, as :func:`place_boxes` returns them.
        out_size: ``(H, W)`` of the output.
        min_size: Smallest clipped side kept, in output pixels (``>= 0``).
        min_visibility: Smallest kept fraction of the mapped area, in ``[0, 1]``.
        areas_before: ``(N,)`` areas of the boxes as mapped, in output pixels, when earlier
            steps already clipped them; default: the areas of ``boxes`` themselves.

    Returns:
        ``(clipped, keep)``: ``(N, 4)`` float32 clipped boxes (all rows, so that the caller
        can filter other per-box fields with the same mask) and an ``(N,)`` bool mask.

    Raises:
        ValueError: ``min_size`` is negative, ``min_visibility`` is outside ``[0, 1]``, or
            ``areas_before`` does not have one value per box.
    """
    if not min_size >= 0:
        raise ValueError(f"min_size must be >= 0 pixels, got {min_size!r}")
    if not 0.0 <= min_visibility <= 1.0:
        raise ValueError(f"min_visibility must be in [0, 1], got {min_visibility!r}")
    array = as_boxes(boxes)
    out_height, out_width = (float(side) for side in out_size)
    if areas_before is None:
        mapped_areas = box_areas(array)
    else:
        mapped_areas = np.asarray(areas_before, dtype=np.float32).reshape(-1)
        if mapped_areas.shape != (len(array),):
            raise ValueError(
                f"areas_before must have one value per box ({len(array)}), got {mapped_areas.shape}"
            )
    finite = np.isfinite(array).all(axis=1)
    limits = np.array([out_width, out_height, out_width, out_height], dtype=np.float32)
    clipped = np.clip(np.nan_to_num(array), 0.0, limits).astype(np.float32)
    widths = clipped[:, 2] - clipped[:, 0]
    heights = clipped[:, 3] - clipped[:, 1]
    keep = (
        finite
        & (widths >= min_size)
        & (heights >= min_size)
        & (widths > 0)
        & (heights > 0)
        & (widths * heights >= min_visibility * mapped_areas)
    )
    return clipped, keep


def check_boxes(
    boxes: npt.ArrayLike, image_size: Sequence[int], tolerance_px: float = 1.0
) -> str | None:
    """Why a sample's stored annotation is bad, or None when it is fine.

    Bad: not ``(N, 4)``; a NaN or infinite coordinate; ``x2 < x1`` or ``y2 < y1``; a
    coordinate more than ``tolerance_px`` outside ``[0, W] x [0, H]`` (annotations a
    fraction of a pixel past the edge are common and are clipped by the caller).

    Args:
        boxes: ``(N, 4)`` xyxy in the image's pixels.
        image_size: ``(H, W)`` of the image.
        tolerance_px: How far past the edge a coordinate may lie.
    """
    try:
        array = as_boxes(boxes)
    except (TypeError, ValueError) as error:
        return str(error)
    if not np.isfinite(array).all():
        return "boxes has a NaN or infinite coordinate"
    if (array[:, 2] < array[:, 0]).any() or (array[:, 3] < array[:, 1]).any():
        return "a box has x2 < x1 or y2 < y1 (negative size)"
    height, width = (float(side) for side in image_size)
    low = array.min(initial=0.0)
    if (
        low < -tolerance_px
        or (array[:, [0, 2]] > width + tolerance_px).any()
        or (array[:, [1, 3]] > height + tolerance_px).any()
    ):
        return f"a box lies outside the {int(width)}x{int(height)} image"
    return None


def clip_to_image(boxes: npt.ArrayLike, image_size: Sequence[int]) -> npt.NDArray[np.float32]:
    """``(N, 4)`` float32 boxes clipped to ``[0, W] x [0, H]`` of an ``(H, W)`` image."""
    array = as_boxes(boxes)
    height, width = (float(side) for side in image_size)
    limits = np.array([width, height, width, height], dtype=np.float32)
    return np.clip(array, 0.0, limits).astype(np.float32)
