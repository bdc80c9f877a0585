"""examples/detection_finetune.py: preprocesses a tiny COCO folder and trains its detector
(the loss falls), then fine-tunes from the weights it saved."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.detection_sets import painted_photos, write_coco
from tests.examples.conftest import load_example


def test_the_detector_trains_on_a_coco_folder_and_fine_tunes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    photos = painted_photos(tmp_path / "coco" / "images", num_images=16)
    annotations = write_coco(photos, tmp_path / "coco" / "instances_train.json")
    example = load_example("detection_finetune")
    weights = tmp_path / "detector.pt"
    args = [str(photos.images), str(annotations), str(tmp_path / "work"), "--image-size", "32",
            "--batch-size", "4", "--num-workers", "0"]  # fmt: skip
    losses = example.main([*args, "--epochs", "4", "--save", str(weights)])
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0]
    assert "epoch 3: 4 batches" in capsys.readouterr().out  # 16 photos, batches of 4
    assert (tmp_path / "work" / "shards" / "index.json").is_file() and weights.is_file()
    # fine-tuning: starts from the saved weights (the shards are reused), at a lower rate
    tuned = example.main([*args, "--epochs", "1", "--weights", str(weights), "--lr", "1e-3"])
    assert math.isfinite(tuned[0]) and tuned[0] < losses[0]
