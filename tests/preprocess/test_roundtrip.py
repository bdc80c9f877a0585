"""Source → shards → ShardReader, pixel-exact against an OpenCV/NumPy reference."""

from __future__ import annotations

import math
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from fastdata import PreprocessOptions, load_manifest
from fastdata.errors import PreprocessError
from fastdata.preprocess import SegmentationSource, preprocess
from fastdata.shards import ShardReader


def _shrink_reference(image: np.ndarray, new_w: int, new_h: int) -> np.ndarray:
    """The documented downscale below 2x: a 3-tap Gaussian per shrinking axis (sigma 0.9 x
    (factor - 1), float taps, left out where its outer taps weigh under 1/256), then
    bilinear; INTER_AREA from 2x on (quality: tests/preprocess/test_resize.py)."""
    h, w = image.shape[:2]
    sx, sy = w / new_w, h / new_h
    if max(sx, sy) >= 2:
        return cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_AREA)

    def taps(factor: float) -> np.ndarray:
        one = np.ones((1, 1), np.float32)
        if factor <= 1:
            return one
        kernel = cv2.getGaussianKernel(3, 0.9 * (factor - 1), cv2.CV_32F)
        return one if kernel[0, 0] < 1 / 256 else kernel

    if taps(sx).size > 1 or taps(sy).size > 1:
        image = cv2.sepFilter2D(image, -1, taps(sx), taps(sy), borderType=cv2.BORDER_REFLECT_101)
    return cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_LINEAR)


def _reference(path: Path, side: int, reduce: int = 1, gray: bool = False) -> np.ndarray:
    """Independent reference: (reduced) decode, centred square, downscale to the side."""
    flags = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2}
    gray_flags = {1: cv2.IMREAD_GRAYSCALE, 2: cv2.IMREAD_REDUCED_GRAYSCALE_2}
    image = cv2.imread(str(path), (gray_flags if gray else flags)[reduce])
    if not gray:
        image = cv2.cvtColor(image, cv2.COLOR_BGR2RGB)
    h, w = image.shape[:2]
    short = min(h, w)
    top, left = (h - short) // 2, (w - short) // 2
    out = _shrink_reference(image[top : top + short, left : left + short], side, side)
    return out[..., None] if gray else out


def test_imagefolder_raw_roundtrip_is_pixel_exact(sample_imagefolder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    summary = preprocess(
        sample_imagefolder, out, PreprocessOptions(sizes=(16,)), workers=2, show_progress=False
    )
    assert (summary.num_samples, summary.num_skipped) == (24, 0)
    reader = ShardReader(out)
    files = sorted(sample_imagefolder.glob("*/*.jpg"))
    # 64x48 JPEGs decode at 1/2 scale for a 16-pixel output (24 >= 16 > 12).
    expected = np.stack([_reference(f, 16, reduce=2) for f in files])
    np.testing.assert_array_equal(reader.read_batch("image", np.arange(24)), expected)
    labels = reader.read_batch("label", np.arange(24))
    assert labels.tolist() == [
        ["class_000", "class_001", "class_002"].index(f.parent.name) for f in files
    ]
    assert bytes(reader.read("path", 5)).decode() == f"{files[5].parent.name}/{files[5].name}"
    manifest = load_manifest(out)
    assert manifest.class_names == ["class_000", "class_001", "class_002"]
    stats = manifest.stats["image"]
    flat = expected.reshape(-1, 3).astype(np.float64)
    np.testing.assert_allclose(stats["mean"], flat.mean(0), rtol=1e-9)
    np.testing.assert_allclose(stats["std"], flat.std(0), rtol=1e-6)
    assert stats["count"] == 24


def test_multiple_sizes_grayscale_and_lzf(sample_imagefolder: Path, tmp_path: Path) -> None:
    options = PreprocessOptions(sizes=(16, 8), grayscale=True, compression="lzf")
    preprocess(sample_imagefolder, tmp_path / "o", options, workers=1, show_progress=False)
    reader = ShardReader(tmp_path / "o")
    assert reader.field("image").shape == (16, 16, 1)
    assert reader.field("image_8").shape == (8, 8, 1)
    first = sorted(sample_imagefolder.glob("*/*.jpg"))[0]
    np.testing.assert_array_equal(reader.read("image", 0), _reference(first, 16, 2, gray=True))
    assert set(load_manifest(tmp_path / "o").stats) == {"image", "image_8"}


@pytest.mark.parametrize("mode", ["exact", "pad", "longer"])
def test_jpeg_storage_resize_modes(sample_imagefolder: Path, tmp_path: Path, mode: str) -> None:
    options = PreprocessOptions(sizes=(32,), storage="jpeg", resize=mode, jpeg_quality=95)
    preprocess(sample_imagefolder, tmp_path / "o", options, workers=1, show_progress=False)
    reader = ShardReader(tmp_path / "o")
    assert reader.field("image").encoding == "jpeg"
    decoded = cv2.imdecode(reader.read("image", 0), cv2.IMREAD_COLOR)
    assert decoded.shape == ((24, 32, 3) if mode == "longer" else (32, 32, 3))
    if mode == "pad":  # 64x48 → 32x24, padded by 4 rows of zeros top and bottom
        assert decoded[:3].max() < 20 and decoded[-3:].max() < 20


def test_csv_list_source_resolves_relative_paths(sample_imagefolder: Path, tmp_path: Path) -> None:
    files = sorted(sample_imagefolder.glob("*/*.jpg"))[:5]
    listing = sample_imagefolder / "list.csv"
    rows = ["path,label"] + [
        f"{f.relative_to(sample_imagefolder)},{'cat' if i % 2 else 'dog'}"
        for i, f in enumerate(files)
    ]
    listing.write_text("\n".join(rows) + "\n")
    preprocess(listing, tmp_path / "o", PreprocessOptions(sizes=(16,)), show_progress=False)
    reader = ShardReader(tmp_path / "o")
    assert reader.manifest.class_names == ["cat", "dog"]
    assert reader.read_batch("label", np.arange(5)).tolist() == [1, 0, 1, 0, 1]
    np.testing.assert_array_equal(reader.read("image", 3), _reference(files[3], 16, 2))


def test_tsv_with_integer_labels(sample_imagefolder: Path, tmp_path: Path) -> None:
    files = sorted(sample_imagefolder.glob("*/*.jpg"))[:3]
    listing = tmp_path / "list.tsv"
    listing.write_text("".join(f"{f}\t{7 + i}\n" for i, f in enumerate(files)))
    preprocess(listing, tmp_path / "o", PreprocessOptions(sizes=(16,)), show_progress=False)
    assert ShardReader(tmp_path / "o").read_batch("label", [0, 1, 2]).tolist() == [7, 8, 9]


def test_segmentation_pairs_nearest_uint8_masks(tmp_path: Path) -> None:
    images, masks = tmp_path / "img", tmp_path / "mask"
    images.mkdir(), masks.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        cv2.imwrite(str(images / f"s{i}.png"), rng.integers(0, 256, (40, 60, 3), dtype=np.uint8))
        mask = np.zeros((40, 60), np.uint8)
        mask[10:30, 20:50] = 200 + i
        Image.fromarray(mask).save(masks / f"s{i}.png")
    source = SegmentationSource(images, masks=masks)
    preprocess(source, tmp_path / "o", PreprocessOptions(sizes=(20,)), show_progress=False)
    reader = ShardReader(tmp_path / "o")
    assert reader.field("mask").dtype == "uint8" and reader.field("mask").shape == (20, 20)
    mask = reader.read("mask", 2)
    assert set(np.unique(mask).tolist()) == {0, 202}  # nearest: no blended class ids
    reference = cv2.resize(
        np.asarray(Image.open(masks / "s2.png")), (30, 20), interpolation=cv2.INTER_NEAREST
    )[:, 5:25]
    np.testing.assert_array_equal(mask, reference)
    assert "label" not in [f.name for f in reader.fields]


@pytest.mark.parametrize("dtype", ["uint8", "uint16"])
def test_npy_volumes_keep_dtype(tmp_path: Path, dtype: str) -> None:
    src = tmp_path / "vols"
    src.mkdir()
    rng = np.random.default_rng(1)
    volumes = [
        rng.integers(0, 1000 if dtype == "uint16" else 256, (4, 5, 6)).astype(dtype)
        for _ in range(3)
    ]
    for i, volume in enumerate(volumes):
        np.save(src / f"v{i}.npy", volume)
    preprocess(src, tmp_path / "o", show_progress=False)
    reader = ShardReader(tmp_path / "o")
    spec = reader.field("volume")
    assert (spec.dtype, spec.shape, spec.axes) == (dtype, (4, 5, 6), "DHW")
    np.testing.assert_array_equal(reader.read_batch("volume", [0, 1, 2]), np.stack(volumes))
    stats = reader.manifest.stats["volume"]
    assert math.isclose(stats["mean"][0], float(np.stack(volumes).mean()), rel_tol=1e-9)


def test_mismatched_npy_shapes_fail_before_writing(tmp_path: Path) -> None:
    src = tmp_path / "vols"
    src.mkdir()
    np.save(src / "a.npy", np.zeros((4, 4, 4), np.uint8))
    np.save(src / "b.npy", np.zeros((4, 4, 5), np.uint8))
    with pytest.raises(PreprocessError, match=r"mismatched \.npy arrays: .*b\.npy is \(4, 4, 5\)"):
        preprocess(src, tmp_path / "o", show_progress=False)
    assert not (tmp_path / "o").exists()


def test_many_shards_in_order(sample_imagefolder: Path, tmp_path: Path) -> None:
    options = PreprocessOptions(sizes=(16,), shard_bytes=5 * 16 * 16 * 3)
    one = preprocess(
        sample_imagefolder, tmp_path / "a", PreprocessOptions(sizes=(16,)), show_progress=False
    )
    many = preprocess(sample_imagefolder, tmp_path / "b", options, workers=2, show_progress=False)
    assert one.num_shards == 1 and many.num_shards > 4
    a, b = ShardReader(tmp_path / "a"), ShardReader(tmp_path / "b")
    np.testing.assert_array_equal(
        a.read_batch("image", np.arange(24)), b.read_batch("image", np.arange(24))
    )
