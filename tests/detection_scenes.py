"""Painted scenes and NumPy checks shared by the detection tests of every executor.

A scene paints each box's region in a solid colour of its own (boxes do not overlap), so
after any geometry the colour shows where the object went; the checks read the output
pixels only, never the code under test.
"""

from __future__ import annotations

import numpy as np

COLOURS = np.array(
    [[255, 0, 0], [0, 255, 0], [0, 0, 255], [255, 255, 0], [255, 0, 255], [0, 255, 255]],
    np.uint8,
)
# A pixel "is" a colour within this many levels per channel (blended edges are neither).
COLOUR_TOLERANCE = 40
# Colours with fewer visible pixels than this are too small to judge coverage by.
MIN_PIXELS = 30


def painted_scenes(
    count: int, height: int, width: int, seed: int
) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(count, height, width, 3)`` uint8 scenes on black and their ``(N_i, 4)`` float32
    xyxy boxes (integer corners), box ``j`` painted ``COLOURS[j]``: up to four boxes, one
    per quadrant, so none overlap."""
    rng = np.random.default_rng(seed)
    images = np.zeros((count, height, width, 3), np.uint8)
    boxes = []
    half_h, half_w = height // 2, width // 2
    for k in range(count):
        rows = []
        for cell in range(int(rng.integers(1, 5))):
            cell_top, cell_left = (cell // 2) * half_h, (cell % 2) * half_w
            box_h = int(rng.integers(half_h // 3, half_h - 2))
            box_w = int(rng.integers(half_w // 3, half_w - 2))
            top = cell_top + int(rng.integers(1, half_h - box_h))
            left = cell_left + int(rng.integers(1, half_w - box_w))
            images[k, top : top + box_h, left : left + box_w] = COLOURS[cell]
            rows.append([left, top, left + box_w, top + box_h])
        boxes.append(np.array(rows, np.float32))
    return images, boxes


def _centres_inside(box: np.ndarray, height: int, width: int) -> np.ndarray:
    """``(height, width)`` bool: pixels whose centre lies in the xyxy ``box``."""
    cols = np.arange(width) + 0.5
    rows = np.arange(height) + 0.5
    in_x = (cols >= box[0]) & (cols <= box[2])
    in_y = (rows >= box[1]) & (rows <= box[3])
    return in_y[:, None] & in_x[None, :]


def check_painted(
    image: np.ndarray,
    boxes: np.ndarray,
    kept_ids: np.ndarray,
    colour_ids: np.ndarray,
    mapped_areas: np.ndarray | None = None,
) -> int:
    """Each kept box covers >= 90% of its colour's output pixels and is >= 75% that colour
    inside (when large enough to judge); a colour whose box was dropped shows few pixels.

    Args:
        image: ``(H, W, 3)`` uint8 output.
        boxes: ``(K, 4)`` xyxy output boxes.
        kept_ids: ``(K,)`` which input box each output box is.
        colour_ids: ``(N,)`` the colour index of every input box.
        mapped_areas: ``(N,)`` each input box's area scaled into the output (for the
            dropped boxes), or ``None`` when none may be dropped.

    Returns:
        How many boxes were large enough to judge.
    """
    height, width = image.shape[:2]
    judged = 0
    for box, box_id in zip(boxes, kept_ids, strict=True):
        colour = COLOURS[colour_ids[box_id]].astype(np.int16)
        is_colour = (np.abs(image.astype(np.int16) - colour) <= COLOUR_TOLERANCE).all(-1)
        inside = _centres_inside(box, height, width)
        if is_colour.sum() < MIN_PIXELS or inside.sum() < MIN_PIXELS:
            continue
        judged += 1
        covered = (is_colour & inside).sum() / is_colour.sum()
        assert covered >= 0.9, (box, covered)
        purity = (is_colour & inside).sum() / inside.sum()
        assert purity >= 0.75, (box, purity)
    for box_id in set(range(len(colour_ids))) - set(kept_ids.tolist()):
        colour = COLOURS[colour_ids[box_id]].astype(np.int16)
        is_colour = (np.abs(image.astype(np.int16) - colour) <= COLOUR_TOLERANCE).all(-1)
        limit = 0.0 if mapped_areas is None else 0.1 * mapped_areas[box_id]
        assert is_colour.sum() <= limit + MIN_PIXELS, box_id
    return judged


def kept_object_share(object_mask: np.ndarray, boxes: np.ndarray) -> tuple[int, int]:
    """``(visible, covered)``: object pixels in an ``(H, W)`` mask, and how many of them
    lie inside at least one of the ``(K, 4)`` xyxy ``boxes``."""
    height, width = object_mask.shape
    covered = np.zeros((height, width), bool)
    for box in boxes:
        covered |= _centres_inside(box, height, width)
    visible = object_mask.astype(bool)
    return int(visible.sum()), int((visible & covered).sum())


def object_masks(count: int, height: int, width: int, seed: int) -> tuple[np.ndarray, list]:
    """Seeded synthetic boxes (0-8 per image, overlapping allowed, some at the edges) and
    the ``(count, height, width)`` uint8 mask of their union."""
    rng = np.random.default_rng(seed)
    masks = np.zeros((count, height, width), np.uint8)
    boxes = []
    for k in range(count):
        number = int(rng.integers(0, 9))
        sides = rng.uniform(0.05, 0.5, (number, 2)) * [width, height]
        corners = rng.uniform(0, 1, (number, 2)) * ([width, height] - sides)
        rows = np.round(np.concatenate([corners, corners + sides], 1)).astype(np.float32)
        for x1, y1, x2, y2 in rows.astype(int):
            masks[k, y1:y2, x1:x2] = 1
        boxes.append(rows)
    return masks, boxes
