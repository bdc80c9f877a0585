"""Datasets over images stored at their own sizes (``ragged_image``): the crop transforms
make one fixed-size batch, with the pixels of a NumPy reference of the same geometry."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from fastdata import RAMDataset, ShardDataset
from fastdata._crop import random_boxes, shorter_side_size
from fastdata._resize import resize_image
from fastdata.shards import FieldSpec, Manifest, ShardWriter, save_manifest
from fastdata.transforms import (
    CenterCrop,
    Compose,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)

SIZES = [(40, 60), (64, 32), (48, 48), (36, 90), (50, 41), (33, 70), (80, 40)]


def _images(sizes: list[tuple[int, int]]) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _write(root: Path, images: list[np.ndarray], kind: str, per_shard: int = 3) -> None:
    shape = (3,) if kind == "ragged_image" else images[0].shape
    fields = [FieldSpec("image", kind, "uint8", shape, "HWC"), FieldSpec("label", "array", "int64")]
    root.mkdir(parents=True, exist_ok=True)
    shards = []
    for number, start in enumerate(range(0, len(images), per_shard)):
        with ShardWriter(root / f"shard-{number:05d}.h5", fields) as writer:
            for i in range(start, min(start + per_shard, len(images))):
                writer.append({"image": images[i], "label": i})
            shards.append(writer.close())
    save_manifest(root, Manifest(fields=fields, shards=shards))


def _dataset(root: Path, transform: object, in_ram: bool) -> ShardDataset:
    fields = ("image", "label")
    if in_ram:
        return RAMDataset.from_shards(
            root, fields=fields, transform=transform, layout="HWC", show_progress=False
        )
    return ShardDataset(root, fields=fields, transform=transform, layout="HWC")


@pytest.mark.parametrize("in_ram", [False, True])
def test_random_resized_crop_is_the_reference_crop_of_each_image(
    tmp_path: Path, in_ram: bool
) -> None:
    images = _images(SIZES)
    _write(tmp_path, images, "ragged_image")
    dataset = _dataset(tmp_path, RandomResizedCrop((24, 20), seed=5), in_ram)
    order = [4, 0, 6, 2, 3]
    batch, labels = dataset.__getitems__(order)
    assert tuple(batch.shape) == (5, 24, 20, 3)
    assert labels.tolist() == order
    heights = np.array([SIZES[i][0] for i in order])
    widths = np.array([SIZES[i][1] for i in order])
    reference = RandomResizedCrop((24, 20), seed=5)
    draws = reference.uniform(len(order), reference.op.draws_per_sample)
    boxes = random_boxes(heights, widths, (0.08, 1.0), (3 / 4, 4 / 3), draws)
    for k, i in enumerate(order):
        top, left, height, width = boxes[k].tolist()
        crop = images[i][top : top + height, left : left + width]
        assert np.array_equal(batch[k].numpy(), resize_image(crop, 20, 24))


@pytest.mark.parametrize("in_ram", [False, True])
def test_resize_then_center_crop_is_the_reference(tmp_path: Path, in_ram: bool) -> None:
    images = _images(SIZES)
    _write(tmp_path, images, "ragged_image")
    dataset = _dataset(tmp_path, Compose([Resize(36), CenterCrop(32)]), in_ram)
    batch, _ = dataset.__getitems__(list(range(len(SIZES))))
    assert tuple(batch.shape) == (len(SIZES), 32, 32, 3)
    for k, image in enumerate(images):
        h, w = shorter_side_size(*image.shape[:2], 36)
        resized = resize_image(image, w, h)
        top, left = (h - 32) // 2, (w - 32) // 2
        assert np.array_equal(batch[k].numpy(), resized[top : top + 32, left : left + 32])


def test_same_size_images_get_the_draws_of_a_fixed_size_set(tmp_path: Path) -> None:
    images = _images([(40, 52)] * 7)
    _write(tmp_path / "ragged", images, "ragged_image")
    _write(tmp_path / "fixed", images, "array")
    transform = Compose([RandomResizedCrop(24, seed=9), RandomHorizontalFlip(seed=9)])
    order = [3, 1, 6, 0]
    ragged, _ = _dataset(tmp_path / "ragged", transform, False).__getitems__(order)
    transform = Compose([RandomResizedCrop(24, seed=9), RandomHorizontalFlip(seed=9)])
    fixed, _ = _dataset(tmp_path / "fixed", transform, False).__getitems__(order)
    assert np.array_equal(ragged.numpy(), fixed.numpy())


def test_a_transform_whose_output_follows_its_input_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, _images(SIZES), "ragged_image")
    for transform in (
        Resize(32),
        RandomHorizontalFlip(),
        Compose([Resize(40), RandomHorizontalFlip()]),
    ):
        with pytest.raises(ValueError, match="holds images of varying sizes: start it with"):
            ShardDataset(tmp_path, fields=("image", "label"), transform=transform)


def test_workers_return_the_same_batches(tmp_path: Path) -> None:
    images = _images(SIZES)
    _write(tmp_path, images, "ragged_image")
    dataset = _dataset(tmp_path, Compose([Resize(36), CenterCrop(32)]), False)
    loader = dataset.loader(batch_size=4, num_workers=1)
    batches = [batch for batch, _ in loader]
    direct = dataset.__getitems__(list(range(len(SIZES))))[0]
    assert np.array_equal(np.concatenate([b.numpy() for b in batches]), direct.numpy())


def test_masks_of_their_own_sizes_move_with_their_images(tmp_path: Path) -> None:
    fields = [
        FieldSpec("image", "ragged_image", "uint8", (3,), "HWC"),
        FieldSpec("mask", "ragged_image", "uint8", (), "HW"),
    ]
    images = _images(SIZES)
    with ShardWriter(tmp_path / "shard-00000.h5", fields) as writer:
        for image in images:
            writer.append({"image": image, "mask": image[..., 0].copy()})
        shards = [writer.close()]
    save_manifest(tmp_path, Manifest(fields=fields, shards=shards))
    # nearest-neighbour for the image too (the masks' kernel): the mask is its first channel
    crop = RandomResizedCrop(16, interpolation=cv2.INTER_NEAREST_EXACT, seed=2)
    transform = Compose([crop, RandomHorizontalFlip(seed=2)])
    dataset = ShardDataset(tmp_path, fields=("image", "mask"), transform=transform, layout="HWC")
    batch, masks = dataset.__getitems__(list(range(len(SIZES))))
    assert tuple(masks.shape) == (len(SIZES), 16, 16)
    assert np.array_equal(batch[..., 0].numpy(), masks.numpy())


def test_a_decoder_given_as_decode_leaves_raw_images_to_the_transform(tmp_path: Path) -> None:
    from fastdata.decode import create_decoder  # noqa: PLC0415

    images = _images(SIZES)
    fields = [
        FieldSpec("image", "ragged_image", "uint8", (3,), "HWC"),
        FieldSpec("mask", "ragged_image", "uint8", (), "HW"),
    ]
    with ShardWriter(tmp_path / "shard-00000.h5", fields) as writer:
        for image in images:
            writer.append({"image": image, "mask": image[..., 0].copy()})
        shards = [writer.close()]
    save_manifest(tmp_path, Manifest(fields=fields, shards=shards))
    transform = Compose([Resize(36), CenterCrop(32)])
    decoder = create_decoder("cpu", size=16, num_threads=1)
    dataset = ShardDataset(
        tmp_path, fields=("image", "mask"), transform=transform, decode=decoder, layout="HWC"
    )
    batch, masks = dataset.__getitems__([0, 1])
    assert tuple(batch.shape) == (2, 32, 32, 3) and tuple(masks.shape) == (2, 32, 32)
