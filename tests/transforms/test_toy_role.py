"""A new role is one field kind, its mover and this test: points ``(N_i, 2)`` xy pixels,
stored as a ragged field with role ``points``, moved by the existing geometric transforms
through a dataset whose code knows nothing of points."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fastdata import ShardDataset
from fastdata._boxes import place_boxes
from fastdata.shards import FieldSpec, Manifest, ShardWriter, save_manifest
from fastdata.transforms import Compose, Move, RandomHorizontalFlip, Resize, register_mover


def move_points(move: Move, batch: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Points as zero-size boxes; those outside the output are dropped."""
    geometry = move.geometry
    moved, kept = [], []
    for k, points in enumerate(batch):
        boxes = np.concatenate([points, points], axis=1)
        placed = place_boxes(boxes, geometry.box_crops()[k], tuple(geometry.out_sizes[k]))
        xy = placed[:, :2]
        if geometry.flips[k]:
            xy[:, 0] = geometry.out_sizes[k][1] - xy[:, 0]
        keep = (xy >= 0).all(axis=1) & (xy <= geometry.out_sizes[k][::-1]).all(axis=1)
        moved.append(xy[keep])
        kept.append(keep)
    return moved, kept


@pytest.fixture(scope="module", autouse=True)
def points_role() -> None:
    register_mover("points", move_points)


def test_points_follow_flip_and_resize_through_a_dataset(tmp_path: Path) -> None:
    fields = [
        FieldSpec("image", "array", "uint8", (20, 40, 3), "HWC"),
        FieldSpec("points", "ragged", "float32", (2,), role="points"),
    ]
    points = [np.array([[4, 2], [30, 10]], np.float32), np.zeros((0, 2), np.float32)]
    with ShardWriter(tmp_path / "shard-00000.h5", fields) as writer:
        for sample in points:
            writer.append({"image": np.zeros((20, 40, 3), np.uint8), "points": sample})
        info = writer.close()
    save_manifest(tmp_path, Manifest(fields=fields, shards=[info]))
    dataset = ShardDataset(
        tmp_path,
        fields=("image", "points"),
        transform=Compose([RandomHorizontalFlip(p=1.0), Resize((40, 20))]),
    )
    images, moved = dataset.__getitems__([0, 1])
    assert tuple(images.shape) == (2, 3, 40, 20)
    # flip over width 40, then x * 0.5, y * 2 (NumPy by hand)
    expected = np.array([[(40 - 4) * 0.5, 2 * 2], [(40 - 30) * 0.5, 10 * 2]], np.float32)
    np.testing.assert_allclose(moved[0].numpy(), expected)
    assert tuple(moved[1].shape) == (0, 2)
    assert dataset.roles["points"] == "points"
