"""Crafted and extreme files: lying headers, decompression bombs, EXIF-rotated photos."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from fastdata import PreprocessOptions, RAMDataset, load_manifest
from fastdata._codec import DEFAULT_MAX_PIXELS, image_size
from fastdata.decode import create_decoder
from fastdata.errors import PreprocessError
from fastdata.preprocess import SegmentationSource, preprocess
from fastdata.preprocess import _task as task_module
from fastdata.preprocess import _transforms as transforms_module
from fastdata.preprocess._sources import SourceItem, list_source
from fastdata.preprocess._task import SampleFailure, ShardJob, build_fields, process_sample
from fastdata.preprocess._transforms import transform
from fastdata.shards import ShardReader

TINY = PreprocessOptions(sizes=(16,))


def _jpeg(pixels: np.ndarray, orientation: int | None = None) -> bytes:
    buffer = io.BytesIO()
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    Image.fromarray(pixels).save(buffer, "JPEG", quality=95, exif=exif)
    return buffer.getvalue()


def _lying_jpeg(height: int, width: int) -> bytes:
    """A tiny valid JPEG whose frame header claims ``height x width``."""
    data = bytearray(_jpeg(np.full((8, 8, 3), 90, np.uint8)))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _png_header_only(height: int, width: int, gray: bool = False) -> bytes:
    """A PNG of a few dozen bytes whose IHDR claims ``height x width``."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body) & 0xFFFFFFFF
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0 if gray else 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0"))


def _folder(tmp_path: Path, files: dict[str, bytes]) -> Path:
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    (src / "ok.jpg").write_bytes(_jpeg(np.full((20, 24, 3), 100, np.uint8)))
    for name, data in files.items():
        (src / name).write_bytes(data)
    return src.parent


@pytest.fixture
def decoded_sizes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The header sizes of the images handed to a pixel decoder (OpenCV, simplejpeg) in this
    process: an image over the limit must never reach one (however fast the machine)."""
    sizes: list[tuple[int, int]] = []

    def recording(decode: Any) -> Any:
        def wrapper(data: Any, *args: Any, **kwargs: Any) -> Any:
            size = image_size(np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data)
            sizes.append(size or (0, 0))
            return decode(data, *args, **kwargs)

        return wrapper

    monkeypatch.setattr(cv2, "imdecode", recording(cv2.imdecode))
    monkeypatch.setattr(simplejpeg, "decode_jpeg", recording(simplejpeg.decode_jpeg))
    return sizes


def _reasons(out: Path) -> dict[str, str]:
    return {Path(s["path"]).name: s["reason"] for s in load_manifest(out).skipped}


# --- lying headers and bombs (skipped like any undecodable file) ---------------------------


def test_jpeg_with_lying_or_corrupt_frame_header_is_skipped_not_grey(
    tmp_path: Path, decoded_sizes: list[tuple[int, int]]
) -> None:
    src = _folder(
        tmp_path, {"huge.jpg": _lying_jpeg(65500, 65500), "bigger.jpg": _lying_jpeg(480, 640)}
    )
    summary = preprocess(src, tmp_path / "o", TINY, workers=1, show_progress=False)
    assert decoded_sizes and max(h * w for h, w in decoded_sizes) <= DEFAULT_MAX_PIXELS
    assert (summary.num_samples, summary.num_skipped) == (1, 2)
    reasons = _reasons(tmp_path / "o")
    assert "65500x65500 = 4,290,250,000 pixels, over the limit" in reasons["huge.jpg"]
    assert "corrupt or truncated JPEG" in reasons["bigger.jpg"]
    fail = PreprocessOptions(sizes=(16,), on_error="raise")
    with pytest.raises(PreprocessError, match=r"bigger\.jpg: corrupt or truncated JPEG"):
        preprocess(src, tmp_path / "o2", fail, show_progress=False)


def test_decoder_exceptions_follow_on_error(tmp_path: Path) -> None:
    """cv2.error (a PNG header over OpenCV's own limit) and PIL's DecompressionBombError
    (a mask header of 20000x20000) are undecodable inputs, not a crashed job."""
    src = _folder(tmp_path, {"bomb.png": _png_header_only(40000, 40000)})
    no_limit = PreprocessOptions(sizes=(16,), max_pixels=None)  # OpenCV itself refuses
    summary = preprocess(src, tmp_path / "o", no_limit, show_progress=False)
    assert (summary.num_samples, summary.num_skipped) == (1, 1)
    assert "OpenCV" in _reasons(tmp_path / "o")["bomb.png"]
    fail = PreprocessOptions(sizes=(16,), max_pixels=None, on_error="raise")
    with pytest.raises(PreprocessError, match=r"bomb\.png: not a decodable image"):
        preprocess(src, tmp_path / "o2", fail, show_progress=False)
    # a mask bomb
    images, masks = tmp_path / "i", tmp_path / "m"
    images.mkdir()
    masks.mkdir()
    for stem in ("a", "b"):
        (images / f"{stem}.jpg").write_bytes(_jpeg(np.full((20, 24, 3), 100, np.uint8)))
        Image.fromarray(np.zeros((20, 24), np.uint8)).save(masks / f"{stem}.png")
    (masks / "b.png").write_bytes(_png_header_only(20000, 20000, gray=True))
    summary = preprocess(
        SegmentationSource(images, masks=masks), tmp_path / "o3", no_limit, show_progress=False
    )
    assert (summary.num_samples, summary.num_skipped) == (1, 1)
    assert "cannot decode mask (DecompressionBombError" in _reasons(tmp_path / "o3")["b.jpg"]


def test_memory_error_is_not_a_skipped_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _folder(tmp_path, {})
    listing = list_source(src)
    job = ShardJob(str(tmp_path), TINY, build_fields(listing, TINY), listing.kind)

    def out_of_memory(*args: Any, **kwargs: Any) -> None:
        raise MemoryError

    monkeypatch.setattr(task_module, "decode_image", out_of_memory)
    with pytest.raises(MemoryError):
        process_sample(listing.items[0], job)


def test_ram_dataset_and_cpu_decoder_skip_decoder_errors(tmp_path: Path) -> None:
    good = _jpeg(np.full((20, 24, 3), 100, np.uint8))
    bomb = _png_header_only(40000, 40000)
    paths = []
    for name, data in (("good.jpg", good), ("bomb.png", bomb)):
        (tmp_path / name).write_bytes(data)
        paths.append(tmp_path / name)
    dataset = RAMDataset(paths, [0, 1], on_error="skip", show_progress=False)
    images, labels = dataset.__getitems__([0, 1])
    assert len(images) == 1 and labels.tolist() == [0]
    decoded = create_decoder("cpu", size=8, on_error="skip").decode([good, bomb])
    assert decoded.kept.tolist() == [0]


# --- max_pixels and crop before resize -----------------------------------------------------


def test_max_pixels_is_read_from_the_header_and_configurable(
    tmp_path: Path, decoded_sizes: list[tuple[int, int]]
) -> None:
    src = _folder(tmp_path, {"wide.png": _png_header_only(30000, 30000)})
    summary = preprocess(src, tmp_path / "o", TINY, workers=1, show_progress=False)
    assert decoded_sizes and max(h * w for h, w in decoded_sizes) <= DEFAULT_MAX_PIXELS
    assert summary.num_skipped == 1
    assert "over the limit of 89,478,485" in _reasons(tmp_path / "o")["wide.png"]
    # a low limit refuses the ordinary 24x20 image too: nothing stored is an error
    with pytest.raises(PreprocessError, match=r"every input failed \(2 of 2\), so nothing was"):
        preprocess(src, tmp_path / "o2", PreprocessOptions(sizes=(8,), max_pixels=100),
                   show_progress=False)  # fmt: skip
    assert not (tmp_path / "o2" / "index.json").exists()
    # 0 and None both mean no limit, as on the command line (--max-pixels 0)
    assert PreprocessOptions(max_pixels=0) == PreprocessOptions(max_pixels=None)
    assert PreprocessOptions(max_pixels=0).max_pixels is None
    for bad in (-1, 1.5, True, "100"):
        with pytest.raises(ValueError, match="max_pixels must be a positive int"):
            PreprocessOptions(max_pixels=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sizes", "max_pixels", "message"),
    [
        ((10000,), None, None),
        ((9459,), 89_478_485, None),
        ((224, 9460), 89_478_485, r"sizes=\(224, 9460\): an output of 9460x9460 = 89,491,600 "),
        ((100000,), None, r"an output side of 100,000 pixels is over the largest, 65,535"),
        ((1_000_000_000,), 0, r"an output side of 1,000,000,000 pixels"),
        ((64,), 4000, r"is over the pixel limit that every image is held to, max_pixels 4,000"),
    ],
)
def test_an_output_size_over_the_pixel_limit_is_refused_at_once(
    sizes: tuple[int, ...], max_pixels: int | None, message: str | None
) -> None:
    if message is None:
        assert PreprocessOptions(sizes=sizes, max_pixels=max_pixels).sizes == sizes
        return
    with pytest.raises(ValueError, match=message):
        PreprocessOptions(sizes=sizes, max_pixels=max_pixels)


def test_thin_strip_is_cropped_before_resizing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    strip = np.random.default_rng(0).integers(0, 255, (1, 10000, 3), dtype=np.uint8)
    resized: list[tuple[int, ...]] = []
    resize_to = transforms_module.resize_to

    def recording(image: np.ndarray, *args: Any, **kwargs: Any) -> np.ndarray:
        resized.append(image.shape)
        return resize_to(image, *args, **kwargs)

    monkeypatch.setattr(transforms_module, "resize_to", recording)
    got = transform(strip, 224, "shorter")
    assert resized == [(1, 1, 3)]  # the centred square, not the strip (224 x 2,240,000: ~10 s)
    # the centre crop of the strip scaled to 224: the picture of its middle source pixels
    assert got.shape == (224, 224, 3)
    centre = strip[0, 4998:5002]
    assert (got >= centre.min(axis=0)).all() and (got <= centre.max(axis=0)).all()
    (tmp_path / "src" / "a").mkdir(parents=True)
    Image.fromarray(strip).save(tmp_path / "src" / "a" / "strip.png")
    summary = preprocess(tmp_path / "src", tmp_path / "o", PreprocessOptions(), workers=1,
                         show_progress=False)  # fmt: skip
    assert summary.num_samples == 1
    np.testing.assert_array_equal(ShardReader(tmp_path / "o").read("image", 0), got)


# --- EXIF orientation: one rule for image and mask, everywhere ---------------------------


def _quadrants(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """An image whose quadrants have distinct grey levels, and the matching label mask."""
    mask = np.zeros((height, width), np.uint8)
    mask[: height // 2, width // 2 :] = 1
    mask[height // 2 :, : width // 2] = 2
    mask[height // 2 :, width // 2 :] = 3
    image = np.repeat((40 + 60 * mask)[..., None], 3, axis=2).astype(np.uint8)
    return image, mask


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_exif_rotated_photo_and_its_mask_stay_aligned(tmp_path: Path, orientation: int) -> None:
    image, mask = _quadrants(32, 48)
    images, masks = tmp_path / "i", tmp_path / "m"
    images.mkdir()
    masks.mkdir()
    (images / "stored.jpg").write_bytes(_jpeg(image, orientation))
    (images / "shown.jpg").write_bytes(_jpeg(image, orientation))
    Image.fromarray(mask).save(masks / "stored.png")  # the mask of the stored pixels
    displayed = np.asarray(Image.open(images / "shown.jpg").copy().transpose(
        {3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_270,
         8: Image.Transpose.ROTATE_90}[orientation]).convert("L"))  # fmt: skip
    shown_mask = ((displayed.astype(int) - 40 + 30) // 60).clip(0, 3).astype(np.uint8)
    Image.fromarray(shown_mask).save(masks / "shown.png")  # drawn on the displayed photo
    options = PreprocessOptions(sizes=(16,), resize="exact")
    summary = preprocess(
        SegmentationSource(images, masks=masks), tmp_path / "o", options, show_progress=False
    )
    assert (summary.num_samples, summary.num_skipped) == (2, 0)
    reader = ShardReader(tmp_path / "o")
    for i in range(summary.num_samples):
        name = bytes(reader.read("path", i)).decode()
        if orientation == 3 and name == "shown.jpg":
            continue  # same size both ways: a mask is taken as stored and rotated alike
        stored_image = reader.read("image", i)[..., 0].astype(int)
        stored_mask = reader.read("mask", i).astype(int)
        expected = ((stored_image - 40 + 30) // 60).clip(0, 3)
        agree = (expected == stored_mask).mean()
        assert agree > 0.9, (name, agree)


def test_ram_dataset_applies_exif_orientation(tmp_path: Path) -> None:
    image, _ = _quadrants(32, 48)
    (tmp_path / "r.jpg").write_bytes(_jpeg(image, 6))
    dataset = RAMDataset([tmp_path / "r.jpg"], [0], layout="HWC", show_progress=False)
    assert tuple(dataset[0][0].shape) == (48, 32, 3)
    decoded = create_decoder("cpu", size=(48, 32))([_jpeg(image, 6)])
    reference = torch.from_numpy(np.asarray(dataset[0][0])).permute(2, 0, 1)
    assert (decoded[0].float() - reference.float()).abs().mean() < 1.0


def test_failure_of_an_item_is_a_sample_failure(tmp_path: Path) -> None:
    (tmp_path / "x.png").write_bytes(_png_header_only(40000, 40000))
    listing_item = SourceItem(str(tmp_path / "x.png"), "x.png", 0)
    fields = build_fields(list_source(_folder(tmp_path, {})), TINY)
    result = process_sample(listing_item, ShardJob(str(tmp_path), TINY, fields, "imagefolder"))
    assert isinstance(result, SampleFailure) and "over the limit" in result.reason
