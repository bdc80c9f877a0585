"""The sample-dataset generator: layout, realism of sizes, determinism."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest


def test_tiny_tree_layout(sample_imagefolder: Path) -> None:
    classes = sorted(p.name for p in sample_imagefolder.iterdir())
    assert classes == ["class_000", "class_001", "class_002"]
    files = sorted(sample_imagefolder.glob("*/*.jpg"))
    assert len(files) == 24
    image = cv2.imread(str(files[0]))
    assert image.shape == (48, 64, 3)


def test_deterministic_and_seed_dependent(sample_tool: Any) -> None:
    assert sample_tool.make_image(0, 3) == sample_tool.make_image(0, 3)
    assert sample_tool.make_image(0, 3) != sample_tool.make_image(1, 3)


def test_imagenet_like_sizes(sample_tool: Any) -> None:
    shapes = [
        cv2.imdecode(np.frombuffer(sample_tool.make_image(0, i), np.uint8), 1).shape
        for i in range(8)
    ]
    assert all(300 <= min(s[:2]) <= 500 and max(s[:2]) <= 500 for s in shapes)


def test_workers_do_not_change_output(tmp_path: Path, sample_tool: Any) -> None:
    one = sample_tool.make_sample_dataset(tmp_path / "a", 70, 2, image_size=(32, 24), workers=1)
    two = sample_tool.make_sample_dataset(tmp_path / "b", 70, 2, image_size=(32, 24), workers=2)
    assert [p.read_bytes() for p in one] == [p.read_bytes() for p in two]


def test_rejects_bad_counts(tmp_path: Path, sample_tool: Any) -> None:
    with pytest.raises(ValueError, match="num_images must be >= 1"):
        sample_tool.make_sample_dataset(tmp_path, 0)
    with pytest.raises(ValueError, match="num_classes must be in"):
        sample_tool.make_sample_dataset(tmp_path, 4, num_classes=5)
