"""``resize="keep"``: the whole image, shorter side S, stored at its own size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastdata import ShardDataset
from fastdata._resize import resize_image
from fastdata.cli import main
from fastdata.preprocess import PreprocessOptions, preprocess
from fastdata.preprocess._transforms import KEEP_MAX_ASPECT, transform, transform_boxes
from fastdata.shards import ShardReader, verify_shards

# (height, width) of the source images: landscape, portrait, square, smaller than S,
# and a 1:5 strip beyond the 3:1 cap
SOURCE_SIZES = [(50, 80), (90, 40), (64, 64), (12, 20), (30, 150)]


def _images() -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SOURCE_SIZES]


def _reference(image: np.ndarray, side: int) -> np.ndarray:
    """The keep mode spelled out: the centred part of aspect at most 3:1, then an
    antialiased resize of its shorter side to ``side`` (the other side rounded)."""
    h, w = image.shape[:2]
    if w > KEEP_MAX_ASPECT * h:
        kept = round(h * KEEP_MAX_ASPECT)
        image = image[:, (w - kept) // 2 : (w - kept) // 2 + kept]
    elif h > KEEP_MAX_ASPECT * w:
        kept = round(w * KEEP_MAX_ASPECT)
        image = image[(h - kept) // 2 : (h - kept) // 2 + kept]
    h, w = image.shape[:2]
    if h <= w:
        out_h, out_w = side, round(w * side / h)
    else:
        out_h, out_w = round(h * side / w), side
    return resize_image(image, out_w, out_h) if (out_h, out_w) != (h, w) else image


def test_keep_mode_geometry() -> None:
    shapes = [transform(image, 32, "keep").shape for image in _images()]
    assert shapes == [(32, 51, 3), (72, 32, 3), (32, 32, 3), (32, 53, 3), (32, 96, 3)]
    for image in _images():
        assert np.array_equal(transform(image, 32, "keep"), _reference(image, 32))


def test_keep_mode_moves_boxes_with_the_kept_part() -> None:
    boxes = np.array([[0, 0, 30, 30], [60, 5, 90, 25]], np.float32)  # in a 30x150 strip
    placed, keep = transform_boxes(boxes, 30, 150, 32, "keep")
    # the kept part is columns 30..120, scaled by 32 / 30: the first box loses its left part
    assert keep.tolist() == [False, True]
    assert np.allclose(placed, [[(60 - 30) * 32 / 30, 5 * 32 / 30, 60 * 32 / 30, 25 * 32 / 30]])


def test_preprocess_stores_each_image_at_its_own_size(tmp_path: Path) -> None:
    for i, image in enumerate(_images()):
        (tmp_path / "src" / "c").mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(tmp_path / "src" / "c" / f"{i}.png")
    out = tmp_path / "out"
    options = PreprocessOptions(sizes=(32,), resize="keep", shard_bytes=8000)
    preprocess(tmp_path / "src", out, options=options, show_progress=False)
    manifest = json.loads((out / "index.json").read_text())
    assert manifest["fields"][0]["kind"] == "ragged_image"
    assert len(manifest["shards"]) > 1
    reader = ShardReader(out)
    paths = [bytes(reader.read("path", i)).decode() for i in range(len(reader))]
    for i, path in enumerate(paths):
        source = np.asarray(Image.open(tmp_path / "src" / path).convert("RGB"))
        assert np.array_equal(reader.read("image", i), _reference(source, 32))
    reader.close()
    assert verify_shards(out, show_progress=False) == []
    heights = {tuple(image.shape) for image in ShardDataset(out, fields=("image",), layout="HWC")}
    assert len(heights) == len(SOURCE_SIZES)


def test_cli_resize_keep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "src" / "c").mkdir(parents=True)
    Image.fromarray(_images()[0]).save(tmp_path / "src" / "c" / "0.png")
    argv = ["preprocess", str(tmp_path / "src"), str(tmp_path / "out"), "--size", "32"]
    assert main([*argv, "--resize", "keep", "--quiet"]) == 0
    assert main(["inspect", str(tmp_path / "out")]) == 0
    assert "ragged_image uint8 (H, W, 3)  (image)" in capsys.readouterr().out
    assert main(["verify", str(tmp_path / "out")]) == 0
