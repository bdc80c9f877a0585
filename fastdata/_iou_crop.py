"""Geometry of the detection crops: the SSD-style IoU crop and the YOLO-style letterbox,
the pixel math behind :class:`fastdata.ops.RandomIoUCrop` and
:class:`fastdata.ops.Letterbox`, vectorised over a batch and driven by uniforms the caller
draws (so every executor given the same draws cuts the same crop).

Crops are ``(B, 4)`` int64 rows ``(top, left, height, width)`` in input pixels, as
:mod:`fastdata._crop` writes them; boxes are ``(N, 4)`` float xyxy in input pixels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Crop trials per sample; each takes four draws (width scale, height scale, left, top).
IOU_TRIALS = 40
DRAWS_PER_IOU_TRIAL = 4
# One draw picks the IoU threshold, then the trials.
DRAWS_PER_IOU_CROP = 1 + DRAWS_PER_IOU_TRIAL * IOU_TRIALS


def iou_trial_crops(
    heights: np.ndarray,
    widths: np.ndarray,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    draws: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The ``IOU_TRIALS`` candidate crops of each image, torchvision's sampling.

    Trial ``t`` takes draws ``1 + 4t .. 4 + 4t``: width ``int(W * s_w)`` and height
    ``int(H * s_h)`` with ``s`` uniform in ``scale``; left ``int((W - w) * u)`` and top
    ``int((H - h) * v)``. A trial is *shaped* when its sides are positive and its aspect
    ``w / h`` lies in ``ratio``.

    Returns:
        ``(B, IOU_TRIALS, 4)`` int64 crops ``(top, left, height, width)`` and the
        ``(B, IOU_TRIALS)`` bool shaped flags.
    """
    heights = np.asarray(heights, np.int64)[:, None]
    widths = np.asarray(widths, np.int64)[:, None]
    trials = draws[:, 1:DRAWS_PER_IOU_CROP].reshape(len(draws), IOU_TRIALS, DRAWS_PER_IOU_TRIAL)
    low, high = scale
    crop_w = (widths * (low + (high - low) * trials[..., 0])).astype(np.int64)
    crop_h = (heights * (low + (high - low) * trials[..., 1])).astype(np.int64)
    left = ((widths - crop_w) * trials[..., 2]).astype(np.int64)
    top = ((heights - crop_h) * trials[..., 3]).astype(np.int64)
    positive = (crop_w > 0) & (crop_h > 0)
    aspect = crop_w / np.maximum(crop_h, 1)
    shaped = positive & (aspect >= ratio[0]) & (aspect <= ratio[1])
    return np.stack([top, left, crop_h, crop_w], axis=-1), shaped


def best_iou_inside(crops: np.ndarray, boxes: Sequence[np.ndarray]) -> np.ndarray:
    """For each image and trial crop, the largest IoU between the crop and a box whose
    centre lies strictly inside it; ``-1`` where no box centre does.

    Args:
        crops: ``(B, T, 4)`` int64 ``(top, left, height, width)``.
        boxes: ``B`` arrays ``(N_i, 4)`` xyxy in input pixels.

    Returns:
        ``(B, T)`` float64.
    """
    count, trials = crops.shape[:2]
    best = np.full((count, trials), -1.0)
    sizes = np.array([len(item) for item in boxes], np.int64)
    if sizes.sum() == 0:
        return best
    flat = np.concatenate([np.asarray(item, np.float64).reshape(-1, 4) for item in boxes])
    owner = np.repeat(np.arange(count), sizes)
    mine = crops[owner].astype(np.float64)  # (M, T, 4)
    top, left = mine[..., 0], mine[..., 1]
    bottom, right = top + mine[..., 2], left + mine[..., 3]
    x1, y1, x2, y2 = (flat[:, k : k + 1] for k in range(4))
    centre_x, centre_y = (x1 + x2) / 2, (y1 + y2) / 2
    inside = (centre_x > left) & (centre_x < right) & (centre_y > top) & (centre_y < bottom)
    overlap_w = np.clip(np.minimum(x2, right) - np.maximum(x1, left), 0, None)
    overlap_h = np.clip(np.minimum(y2, bottom) - np.maximum(y1, top), 0, None)
    overlap = overlap_w * overlap_h
    union = (x2 - x1) * (y2 - y1) + mine[..., 2] * mine[..., 3] - overlap
    iou = np.where(inside, overlap / np.maximum(union, 1e-12), -1.0)
    np.maximum.at(best, owner, iou)
    return best


def iou_crops(
    heights: np.ndarray,
    widths: np.ndarray,
    boxes: Sequence[np.ndarray],
    *,
    options: tuple[float, ...],
    scale: tuple[float, float],
    ratio: tuple[float, float],
    draws: np.ndarray,
) -> np.ndarray:
    """SSD-style crops, one per image (torchvision's ``RandomIoUCrop`` rule, bounded).

    Draw 0 picks a threshold from ``options`` (uniformly); a threshold of 1 or more means
    no crop (the whole image). Otherwise the first of the ``IOU_TRIALS`` trials
    (:func:`iou_trial_crops`) that is shaped and has a box whose centre lies inside it with
    an IoU of at least the threshold is the crop. An image with no boxes takes its first
    shaped trial (there is nothing to keep). When no trial qualifies the whole image is
    kept (torchvision instead draws again, without bound).

    Args:
        heights: ``(B,)`` integer image heights.
        widths: ``(B,)`` integer image widths.
        boxes: ``B`` arrays ``(N_i, 4)`` xyxy in the images' pixels.
        options: IoU thresholds to pick from.
        scale: ``(low, high)`` range of each side's fraction of the image's.
        ratio: ``(low, high)`` range of the crop's width / height.
        draws: ``(B, DRAWS_PER_IOU_CROP)`` float64 uniforms in [0, 1).

    Returns:
        ``(B, 4)`` int64 crops ``(top, left, height, width)`` inside their images.
    """
    heights, widths = np.asarray(heights, np.int64), np.asarray(widths, np.int64)
    count = len(heights)
    if len(boxes) != count or draws.shape != (count, DRAWS_PER_IOU_CROP):
        raise ValueError(
            f"need one box array and {DRAWS_PER_IOU_CROP} draws per image ({count}), "
            f"got {len(boxes)} box arrays and draws of shape {draws.shape}"
        )
    picks = np.minimum((draws[:, 0] * len(options)).astype(np.int64), len(options) - 1)
    thresholds = np.asarray(options, np.float64)[picks]
    crops, shaped = iou_trial_crops(heights, widths, scale, ratio, draws)
    best = best_iou_inside(crops, boxes)
    empty = np.array([len(item) == 0 for item in boxes], bool)[:, None]
    good = shaped & (empty | ((best >= 0) & (best >= thresholds[:, None])))
    good &= np.asarray(thresholds < 1.0)[:, None]
    found: np.ndarray = np.any(good, axis=1)
    chosen = crops[np.arange(count), np.argmax(good, axis=1)]
    whole = np.stack([np.zeros(count, np.int64), np.zeros(count, np.int64), heights, widths], 1)
    return np.where(found[:, None], chosen, whole)


def letterbox_layout(
    heights: np.ndarray, widths: np.ndarray, size: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray]:
    """Where each image lands in a letterbox of ``size``: resized by one factor (the one
    that makes the longer side fit) to sides rounded to the nearest pixel, centred
    (``top = (H_out - h) // 2``), the rest padding.

    Returns:
        ``(B, 4)`` int64 placements ``(top, left, height, width)`` in output pixels, and
        ``(B, 4)`` float64 crops ``(top, left, height, width)`` in input pixels: the input
        region the whole output shows (it reaches past the image where the output is
        padding), what :func:`fastdata._boxes.place_boxes` maps boxes through.
    """
    heights = np.asarray(heights, np.int64)
    widths = np.asarray(widths, np.int64)
    out_h, out_w = size
    factor = np.minimum(out_h / heights, out_w / widths)
    placed_h = np.clip(np.round(heights * factor), 1, out_h).astype(np.int64)
    placed_w = np.clip(np.round(widths * factor), 1, out_w).astype(np.int64)
    top, left = (out_h - placed_h) // 2, (out_w - placed_w) // 2
    placements = np.stack([top, left, placed_h, placed_w], axis=1)
    per_row, per_col = heights / placed_h, widths / placed_w  # input pixels per output pixel
    crops = np.stack([-top * per_row, -left * per_col, out_h * per_row, out_w * per_col], axis=1)
    return placements, crops
