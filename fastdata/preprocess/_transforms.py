"""Offline geometric transforms on uint8 images and masks (OpenCV).

Every function takes and returns ``(H, W, C)`` or ``(H, W)`` uint8 arrays. Images are
resized with the antialiased kernel the CPU transforms share (:mod:`fastdata._resize`);
masks always resized with ``INTER_NEAREST`` so that class ids are never blended. Where to
crop and what size to scale to is the one geometry module's (:mod:`fastdata._crop`), the
math the decoders and the training-time transforms use.
"""

from __future__ import annotations

import cv2
import numpy as np

from fastdata._boxes import place_boxes, sanitize_boxes
from fastdata._crop import largest_centered_box, largest_centered_boxes, scaled_size
from fastdata._resize import resize_image

# shorter: shorter side to S then centre crop S x S; exact: stretch to S x S;
# pad: longer side to S then zero-pad to S x S; longer: cap the longer side at S (variable);
# keep: shorter side to S, aspect kept up to KEEP_MAX_ASPECT (variable: the whole image).
RESIZE_MODES = ("shorter", "exact", "pad", "longer", "keep")
# The ``keep`` mode's longest side, in shorter sides: a more elongated image keeps its
# centred 3:1 (or 1:3) part, so no stored image exceeds 3 S x S pixels.
KEEP_MAX_ASPECT = 3.0


def keep_box(height: int, width: int) -> tuple[int, int, int, int]:
    """The ``(top, left, height, width)`` of a ``height x width`` image the ``keep`` mode
    stores: the whole image, or its centred part of aspect ratio ``KEEP_MAX_ASPECT``."""
    ratio = (1 / KEEP_MAX_ASPECT, KEEP_MAX_ASPECT)
    box = largest_centered_boxes(np.array([height]), np.array([width]), ratio)[0].tolist()
    return box[0], box[1], box[2], box[3]


def resize_to(
    image: np.ndarray,
    width: int,
    height: int,
    *,
    nearest: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Resize to exactly ``(height, width)`` (no-op when already that size, unless
    ``out`` is given): images with the antialiased kernel the CPU transforms share
    (:func:`fastdata._resize.resize_image`), masks (``nearest``) nearest-neighbour.
    ``out``: a C-contiguous array of the result's shape to write it into (returned)."""
    h, w = image.shape[:2]
    if (h, w) == (height, width):
        if out is None:
            return image
        out[...] = image
        return out
    if not nearest:
        return resize_image(image, width, height, out)
    dst = None if out is None else (out[..., 0] if out.ndim == 3 and out.shape[2] == 1 else out)
    resized = cv2.resize(image, (width, height), dst=dst, interpolation=cv2.INTER_NEAREST)
    if out is not None:
        return out
    return resized if resized.ndim == image.ndim else resized[..., None]  # cv2 drops C=1


def shrink(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """Antialiased downscale of ``(H, W[, C])`` uint8 ``image`` to ``(height, width[, C])``:
    :func:`fastdata._resize.resize_image`."""
    return resize_image(image, width, height)


def pad_to_square(image: np.ndarray, side: int) -> np.ndarray:
    """Zero-pad (centred) to ``side x side``; the image must fit."""
    h, w = image.shape[:2]
    if (h, w) == (side, side):
        return image
    out = np.zeros((side, side, *image.shape[2:]), dtype=image.dtype)
    top, left = (side - h) // 2, (side - w) // 2
    out[top : top + h, left : left + w] = image
    return out


def transform(
    image: np.ndarray,
    side: int,
    mode: str,
    *,
    nearest: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Apply one resize mode of :data:`RESIZE_MODES` for output side ``side``.

    ``out``: for ``exact`` and ``shorter``, a C-contiguous ``(side, side[, C])`` uint8
    array the result is written into and returned (a worker's shared-memory slot: no
    copy of the pixels afterwards); the other modes ignore it and return a new array.

    Returns:
        A C-contiguous uint8 array: ``(side, side[, C])`` for ``shorter``/``exact``/``pad``;
        for ``longer`` the image scaled down (never up) so its longer side is ``side``; for
        ``keep`` the image (its centred 3:1 part when more elongated, :func:`keep_box`)
        scaled up or down so its shorter side is ``side``.
    """
    h, w = image.shape[:2]
    if mode == "exact":
        result = resize_to(image, side, side, nearest=nearest, out=out)
    elif mode == "shorter":
        # the centred square of the source, then one resize: the same picture as scaling
        # the shorter side to S and cropping (the crop's scale is exact on both axes), at
        # the cost of the pixels kept only; the decoders' centred crop of a square output
        top, left, height, width = largest_centered_box((h, w), 1.0)
        square = image[top : top + height, left : left + width]
        result = resize_to(square, side, side, nearest=nearest, out=out)
    elif mode == "pad":
        new_h, new_w = scaled_size(h, w, side, longer=True)
        result = pad_to_square(resize_to(image, new_w, new_h, nearest=nearest), side)
    elif mode == "longer":
        if max(h, w) <= side:
            result = image
        else:
            new_h, new_w = scaled_size(h, w, side, longer=True)
            result = resize_to(image, new_w, new_h, nearest=nearest)
    elif mode == "keep":
        top, left, height, width = keep_box(h, w)
        new_h, new_w = scaled_size(height, width, side, longer=False)
        kept = image[top : top + height, left : left + width]
        result = resize_to(kept, new_w, new_h, nearest=nearest)
    else:
        raise ValueError(f"resize mode must be one of {RESIZE_MODES}, got {mode!r}")
    return np.ascontiguousarray(result)  # ``out`` itself when it was written


def decode_min_side(side: int, mode: str, height: int, width: int) -> int:
    """Smallest shorter side a reduced-size decode may produce for ``transform`` to lose
    nothing: the target itself for ``shorter``/``exact``/``keep``, scaled for the longer-side
    modes."""
    if mode in ("shorter", "exact", "keep"):
        return side
    return max(1, -(-side * min(height, width) // max(height, width)))


def transform_boxes(
    boxes: np.ndarray, height: int, width: int, side: int, mode: str
) -> tuple[np.ndarray, np.ndarray]:
    """Where ``(N, 4)`` xyxy pixel boxes of an ``height x width`` image land under
    :func:`transform` (same mode and side), clipped to the stored image and dropped by
    :func:`fastdata._boxes.sanitize_boxes`' rule (the ``shorter`` mode's centre crop can cut
    boxes away).

    Returns:
        ``(boxes, keep)``: the kept ``(K, 4)`` float32 boxes and the ``(N,)`` bool mask that
        chose them (for the boxes' labels).
    """
    content = (0, 0, side, side)  # (top, left, height, width) of the picture in the output
    if mode == "exact":
        crop, out = (0.0, 0.0, float(height), float(width)), (side, side)
    elif mode == "shorter":
        top, left, crop_h, crop_w = largest_centered_box((height, width), 1.0)
        crop, out = (float(top), float(left), float(crop_h), float(crop_w)), (side, side)
    elif mode == "pad":
        new_h, new_w = scaled_size(height, width, side, longer=True)
        pad_top, pad_left = (side - new_h) // 2, (side - new_w) // 2
        scale_y, scale_x = height / new_h, width / new_w
        crop = (-pad_top * scale_y, -pad_left * scale_x, side * scale_y, side * scale_x)
        out = (side, side)
        content = (pad_top, pad_left, new_h, new_w)
    elif mode == "longer":
        out = (
            (height, width)
            if max(height, width) <= side
            else scaled_size(height, width, side, longer=True)
        )
        crop = (0.0, 0.0, float(height), float(width))
        content = (0, 0, *out)
    elif mode == "keep":
        top, left, crop_h, crop_w = keep_box(height, width)
        crop = (float(top), float(left), float(crop_h), float(crop_w))
        out = scaled_size(crop_h, crop_w, side, longer=False)
        content = (0, 0, *out)
    else:
        raise ValueError(f"resize mode must be one of {RESIZE_MODES}, got {mode!r}")
    placed = place_boxes(boxes, crop, out)
    shift = np.array([content[1], content[0]] * 2, np.float32)
    clipped, keep = sanitize_boxes(placed - shift, content[2:])
    return (clipped[keep] + shift).astype(np.float32), keep
