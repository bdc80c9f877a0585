"""Masks follow their images through the CPU batch transforms and the device transforms.

The pattern makes alignment checkable: the image's channels 0 and 1 hold each pixel's row
and column, and two masks hold the same row and column. After any crop, resize and flip,
a bilinear image pixel and the nearest mask pixel at the same place come from source
points less than a pixel apart, so they differ by at most 1; a mask left unflipped or
uncropped differs by tens.
"""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import torch

from fastdata.datasets import RAMDataset, ShardDataset
from fastdata.gpu import DeviceRandomHorizontalFlip, DeviceRandomResizedCrop
from fastdata.shards import FieldSpec, Manifest, ShardWriter, save_manifest
from fastdata.transforms import (
    CenterCrop,
    Compose,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)

HEIGHT, WIDTH = 48, 64


def _pattern(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images ``(count, H, W, 3)`` with (row, column, sample) in the channels, and the row
    and column masks ``(count, H, W)``."""
    rows, cols = np.meshgrid(np.arange(HEIGHT), np.arange(WIDTH), indexing="ij")
    rows = np.broadcast_to(rows * 3, (count, HEIGHT, WIDTH)).astype(np.uint8)
    cols = np.broadcast_to(cols * 3, (count, HEIGHT, WIDTH)).astype(np.uint8)
    sample = np.broadcast_to(np.arange(count)[:, None, None], rows.shape).astype(np.uint8)
    return np.stack([rows, cols, sample], axis=-1), rows.copy(), cols.copy()


def _assert_aligned(images: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> None:
    # 3 levels a pixel: a bilinear value and the nearest pixel's differ by at most 1.5 + 1.
    # On the outermost rows and columns one level more: a shrink's low-pass reflects at
    # the crop's edge, which moves a ramp's edge pixel inward by up to 0.6 of a pixel.
    assert images.shape[:3] == rows.shape == cols.shape
    row_error = np.abs(images[..., 0].astype(int) - rows.astype(int))
    col_error = np.abs(images[..., 1].astype(int) - cols.astype(int))
    inner = (slice(None), slice(1, -1), slice(1, -1))
    assert row_error[inner].max() <= 2 and col_error[inner].max() <= 2, (row_error, col_error)
    assert row_error.max() <= 3 and col_error.max() <= 3, (row_error.max(), col_error.max())


def _flipped(cols: np.ndarray) -> np.ndarray:
    """Which samples run right to left."""
    return cols[:, :, 0].astype(int).mean(axis=1) > cols[:, :, -1].astype(int).mean(axis=1)


@pytest.mark.parametrize(
    "transform",
    [
        lambda: Compose([RandomResizedCrop(24, seed=1), RandomHorizontalFlip(seed=2)]),
        lambda: Compose([RandomResizedCrop((30, 20), scale=(0.5, 1.0), seed=3)]),
        lambda: Compose([Resize(20), CenterCrop((16, 12)), RandomHorizontalFlip(p=1.0)]),
        lambda: Compose([RandomHorizontalFlip(seed=5), Resize((100, 90))]),
    ],
)
def test_cpu_masks_follow_the_image(transform: object) -> None:
    images, rows, cols = _pattern(8)
    pool = ThreadPoolExecutor(2)
    out, (out_rows, out_cols) = transform().apply_all(images, [rows, cols], pool, 3)  # type: ignore[attr-defined]
    _assert_aligned(out, out_rows, out_cols)
    assert out_rows.dtype == np.uint8 and out_rows.ndim == 3


def test_cpu_masks_follow_listed_images_of_different_sizes() -> None:
    images, rows, cols = _pattern(4)
    listed = [images[k][: HEIGHT - 4 * k] for k in range(4)]
    listed_rows = [r[: HEIGHT - 4 * k] for k, r in enumerate(rows)]
    listed_cols = [c[: HEIGHT - 4 * k] for k, c in enumerate(cols)]
    transform = Compose([RandomHorizontalFlip(seed=0), RandomResizedCrop(16, seed=1)])
    out, (out_rows, out_cols) = transform.apply_all(listed, [listed_rows, listed_cols], None, 1)
    _assert_aligned(out, out_rows, out_cols)


def test_call_with_a_mask_returns_the_pair() -> None:
    images, _, cols = _pattern(8)
    tensor = torch.from_numpy(images).permute(0, 3, 1, 2)
    crop = Compose([RandomResizedCrop(24, seed=4), RandomHorizontalFlip(seed=4)])
    out, masks = crop(tensor, masks=torch.from_numpy(cols))
    assert isinstance(out, torch.Tensor) and out.shape == (8, 3, 24, 24)
    assert isinstance(masks, torch.Tensor) and masks.shape == (8, 24, 24)
    col_error = (out[:, 1].int() - masks.int()).abs()
    # the image's low-pass reflects the ramp at the image border: one level more there
    assert col_error[:, 1:-1, 1:-1].max() <= 2 and col_error.max() <= 3
    assert _flipped(masks.numpy()).any() and not _flipped(masks.numpy()).all()
    with pytest.raises(ValueError, match=r"mask masks\[0\] of sample 0 is 48x60 but its image"):
        crop(images, masks=cols[:, :, :60].copy())
    with pytest.raises(ValueError, match=r"masks must be a \(B, H, W\) uint8 tensor"):
        crop(tensor, masks=torch.from_numpy(images))


def test_ram_dataset_masks_follow_the_transform() -> None:
    images, _, cols = _pattern(8)
    transform = Compose([RandomResizedCrop(24, seed=0), RandomHorizontalFlip(seed=0)])
    dataset = RAMDataset.from_arrays(images, np.arange(8), masks=cols, transform=transform)
    batch, labels, masks = dataset.__getitems__(list(range(8)))
    assert batch.shape == (8, 3, 24, 24) and masks.shape == (8, 24, 24)
    assert (batch[:, 2].amax(dim=(1, 2)) == labels).all()  # sample order kept
    col_error = (batch[:, 1].int() - masks.int()).abs()
    # the image's low-pass reflects the ramp at the crop's edge: one level more there
    assert col_error[:, 1:-1, 1:-1].max() <= 2 and col_error.max() <= 3
    assert _flipped(masks.numpy()).any() and not _flipped(masks.numpy()).all()


def _shards(root: Path, images: np.ndarray, rows: np.ndarray, mask_size: tuple[int, int]) -> Path:
    fields = [
        FieldSpec("image", "array", "uint8", (HEIGHT, WIDTH, 3), "HWC"),
        FieldSpec("mask", "array", "uint8", mask_size, "HW"),
    ]
    root.mkdir()
    with ShardWriter(root / "shard-00000.h5", fields) as writer:
        for image, mask in zip(images, rows, strict=True):
            writer.append({"image": image, "mask": mask[: mask_size[0], : mask_size[1]]})
        info = writer.close()
    save_manifest(root, Manifest(fields=fields, shards=[info]))
    return root


def test_shard_dataset_segmentation_pairs_stay_aligned(tmp_path: Path) -> None:
    images, _, cols = _pattern(8)
    root = _shards(tmp_path / "seg", images, cols, (HEIGHT, WIDTH))
    transform = Compose([RandomResizedCrop(32, seed=7), RandomHorizontalFlip(seed=7)])
    dataset = ShardDataset(root, fields=("image", "mask"), transform=transform)
    batch, masks = dataset.__getitems__(list(range(8)))
    assert batch.shape == (8, 3, 32, 32) and masks.shape == (8, 32, 32)
    assert (batch[:, 1].int() - masks.int()).abs().max() <= 2
    assert _flipped(masks.numpy()).any() and not _flipped(masks.numpy()).all()
    image, mask = dataset[3]  # single reads too
    assert image.shape == (3, 32, 32) and mask.shape == (32, 32)
    assert (image[1].int() - mask.int()).abs().max() <= 2


def test_shard_dataset_refuses_masks_of_another_size(tmp_path: Path) -> None:
    images, rows, _ = _pattern(2)
    root = _shards(tmp_path / "seg", images, rows, (HEIGHT, WIDTH // 2))
    with pytest.raises(ValueError, match=r"field 'mask' holds 48x32 masks but field 'image'"):
        ShardDataset(root, fields=("image", "mask"), transform=RandomHorizontalFlip())
    images_only = ShardDataset(root, fields=("image", "mask"))  # no transform: nothing to align
    assert images_only.__getitems__([0, 1])[1].shape == (2, HEIGHT, WIDTH // 2)


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_device_masks_follow_the_image(layout: str) -> None:
    images, rows, cols = _pattern(8)
    batch = torch.from_numpy(images)
    batch = batch.permute(0, 3, 1, 2) if layout == "CHW" else batch
    moved = []
    for mask in (rows, cols):  # the same seeds: the same boxes and flips for both masks
        crop = DeviceRandomResizedCrop(24, layout=layout, seed=1)
        flip = DeviceRandomHorizontalFlip(layout=layout, seed=2)
        out, out_mask = flip(*crop(batch, torch.from_numpy(mask)))  # type: ignore[misc]
        moved.append(out_mask.numpy())
    out_hwc = out.permute(0, 2, 3, 1) if layout == "CHW" else out
    _assert_aligned(out_hwc.numpy(), moved[0], moved[1])
    assert _flipped(moved[1]).any() and not _flipped(moved[1]).all()


def test_cpu_and_device_crops_agree_for_one_seed() -> None:
    images, _, cols = _pattern(8)
    cpu, (cpu_cols,) = RandomResizedCrop(24, seed=9).apply_all(images, [cols], None, 1)
    device = DeviceRandomResizedCrop(24, layout="HWC", seed=9)
    gpu, gpu_cols = device(torch.from_numpy(images), torch.from_numpy(cols))  # type: ignore[misc]
    assert np.abs(cpu.astype(int) - gpu.numpy().astype(int)).max() <= 1
    # Nearest picks the same source pixel except at exact ties: at most one level apart.
    assert np.abs(cpu_cols.astype(int) - gpu_cols.numpy().astype(int)).max() <= 3
    assert (cpu_cols == gpu_cols.numpy()).mean() > 0.99


def test_jpeg_images_decode_at_full_size_when_masks_follow(tmp_path: Path) -> None:
    """Reduced JPEG decoding (Resize's min_input_side) would shrink images below their
    full-size masks: with masks the decoder keeps the full size."""
    images, _, cols = _pattern(4)
    fields = [
        FieldSpec("image", "encoded", "uint8", encoding="jpeg"),
        FieldSpec("mask", "array", "uint8", (HEIGHT, WIDTH), "HW"),
    ]
    root = tmp_path / "jpeg"
    root.mkdir()
    with ShardWriter(root / "shard-00000.h5", fields) as writer:
        for image, mask in zip(images, cols, strict=True):
            jpeg = cv2.imencode(".jpg", image[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 100])[1]
            writer.append({"image": bytes(jpeg), "mask": mask})
        info = writer.close()
    save_manifest(root, Manifest(fields=fields, shards=[info]))
    transform = Compose([Resize(16), CenterCrop(16), RandomHorizontalFlip(seed=0)])
    dataset = ShardDataset(root, fields=("image", "mask"), transform=transform)
    assert dataset.decode_min_side is None
    batch, masks = dataset.__getitems__([0, 1, 2, 3])
    assert batch.shape == (4, 3, 16, 16) and masks.shape == (4, 16, 16)
    assert (batch[:, 1].int() - masks.int()).abs().float().mean() <= 3
    assert ShardDataset(root, fields=("image",), transform=transform).decode_min_side == 16


def test_cpu_and_device_flips_agree_for_one_seed() -> None:
    """One draw scheme: the same seeds give the same crops and flips on CPU and device."""
    images, _, cols = _pattern(16)
    cpu = Compose([RandomResizedCrop(24, seed=3), RandomHorizontalFlip(seed=4)])
    cpu_images, (cpu_cols,) = cpu.apply_all(images, [cols], None, 1)
    crop = DeviceRandomResizedCrop(24, layout="HWC", seed=3)
    flip = DeviceRandomHorizontalFlip(layout="HWC", seed=4)
    gpu_images, gpu_cols = flip(*crop(torch.from_numpy(images), torch.from_numpy(cols)))  # type: ignore[misc]
    assert np.abs(cpu_images.astype(int) - gpu_images.numpy().astype(int)).max() <= 1
    np.testing.assert_array_equal(_flipped(cpu_cols), _flipped(gpu_cols.numpy()))
    assert 0 < _flipped(cpu_cols).sum() < 16


def _two_mask_shards(root: Path, count: int) -> tuple[Path, np.ndarray]:
    images, rows, cols = _pattern(count)
    fields = [
        FieldSpec("image", "array", "uint8", (HEIGHT, WIDTH, 3), "HWC"),
        FieldSpec("rows", "array", "uint8", (HEIGHT, WIDTH), "HW"),
        FieldSpec("label", "array", "int64"),
        FieldSpec("cols", "array", "uint8", (HEIGHT, WIDTH), "HW"),
    ]
    root.mkdir()
    infos = []
    for number, start in enumerate(range(0, count, 5)):  # several shards
        with ShardWriter(root / f"shard-{number:05d}.h5", fields) as writer:
            for k in range(start, min(start + 5, count)):
                writer.append({"image": images[k], "rows": rows[k], "label": k, "cols": cols[k]})
            infos.append(writer.close())
    save_manifest(root, Manifest(fields=fields, shards=infos))
    return root, images


@pytest.mark.parametrize(
    "make",
    [
        lambda: Compose([RandomResizedCrop(24, seed=1), RandomHorizontalFlip(seed=2)]),  # reads
        lambda: Compose([RandomHorizontalFlip(seed=5), CenterCrop((40, 50))]),  # writes
        lambda: Compose([Resize(20), RandomHorizontalFlip(p=1.0)]),
        lambda: CenterCrop(30),
        lambda: RandomHorizontalFlip(seed=3),
    ],
)
@pytest.mark.parametrize("kind", ["shards", "ram"])
@pytest.mark.parametrize("layout", ["CHW", "HWC"])
def test_every_mask_field_follows_the_image_through_datasets(
    tmp_path: Path, make: Any, kind: str, layout: str
) -> None:
    root, _ = _two_mask_shards(tmp_path / "seg", 12)
    fields = ("image", "rows", "label", "cols")
    dataset: Any
    if kind == "shards":
        dataset = ShardDataset(root, fields=fields, transform=make(), layout=layout)
    else:
        dataset = RAMDataset.from_shards(root, fields=fields, transform=make(), layout=layout)
    dataset.num_threads = 2
    indices = [11, 0, 5, 6, 3, 9, 1]  # across shards, out of order
    batch, rows, labels, cols = dataset.__getitems__(indices)
    assert labels.tolist() == indices
    hwc = batch if layout == "HWC" else batch.permute(0, 2, 3, 1)
    assert (hwc[..., 2].amax(dim=(1, 2)) == labels).all()  # each image its own sample
    _assert_aligned(hwc.numpy(), rows.numpy(), cols.numpy())
    image, row, _, col = dataset[7]
    one = image if layout == "HWC" else image.permute(1, 2, 0)
    _assert_aligned(one[None].numpy(), row[None].numpy(), col[None].numpy())


@pytest.mark.parametrize("on_error", ["skip", "warn"])
def test_masks_of_skipped_images_leave_the_batch_with_them(tmp_path: Path, on_error: str) -> None:
    """An undecodable JPEG drops its sample; its masks (read as stored rows for a transform
    that only reads) go with it, and the rest stay aligned."""
    images, rows, cols = _pattern(6)
    fields = [
        FieldSpec("image", "encoded", "uint8", encoding="png"),
        FieldSpec("rows", "array", "uint8", (HEIGHT, WIDTH), "HW"),
        FieldSpec("label", "array", "int64"),
        FieldSpec("cols", "array", "uint8", (HEIGHT, WIDTH), "HW"),
    ]
    root = tmp_path / "png"
    root.mkdir()
    with ShardWriter(root / "shard-00000.h5", fields) as writer:
        for k in range(6):
            png = bytes(cv2.imencode(".png", images[k][:, :, ::-1])[1])
            image = png[: len(png) // 2] if k == 2 else png  # sample 2 is truncated
            writer.append({"image": image, "rows": rows[k], "label": k, "cols": cols[k]})
        info = writer.close()
    save_manifest(root, Manifest(fields=fields, shards=[info]))
    transform = Compose([CenterCrop((40, 50)), RandomHorizontalFlip(seed=1)])
    dataset = ShardDataset(
        root, fields=("image", "rows", "label", "cols"), transform=transform, on_error=on_error
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        batch, got_rows, labels, got_cols = dataset.__getitems__([5, 2, 0, 3])
    assert labels.tolist() == [5, 0, 3]
    hwc = batch.permute(0, 2, 3, 1)
    assert (hwc[..., 2].amax(dim=(1, 2)) == labels).all()
    _assert_aligned(hwc.numpy(), got_rows.numpy(), got_cols.numpy())


def test_a_per_sample_transform_warns_that_masks_stay_where_they_are(tmp_path: Path) -> None:
    images, _, cols = _pattern(4)
    root = _shards(tmp_path / "seg", images, cols, (HEIGHT, WIDTH))

    def crop(image: torch.Tensor) -> torch.Tensor:  # torchvision style: one (C, H, W) image
        return image[:, :32, :32]

    with pytest.warns(
        UserWarning, match=r"fields \('mask',\) \(masks, boxes\) are not moved with it"
    ):
        ShardDataset(root, fields=("image", "mask"), transform=crop)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ShardDataset(root, fields=("image",), transform=crop)  # no mask: nothing to say
        ShardDataset(root, fields=("image", "mask"), transform=RandomResizedCrop(32))
