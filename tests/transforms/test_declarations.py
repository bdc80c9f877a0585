"""Transforms declare their output before any batch; datasets check sizes at construction."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fastdata.datasets import RAMDataset, ShardDataset
from fastdata.shards import FieldSpec, Manifest, ShardWriter, save_manifest
from fastdata.transforms import (
    CenterCrop,
    Compose,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
)


@pytest.mark.parametrize(
    "transform",
    [
        RandomResizedCrop((12, 9), seed=0),
        CenterCrop((10, 7)),
        Resize(11),
        Resize((30, 5)),
        RandomHorizontalFlip(seed=0),
        Compose([Resize(16), CenterCrop(14), RandomHorizontalFlip(seed=0)]),
        Compose([RandomHorizontalFlip(seed=0), Resize(13)]),
    ],
)
@pytest.mark.parametrize("size", [(20, 16), (16, 40)])
def test_declared_output_size_is_the_real_one(transform: object, size: tuple[int, int]) -> None:
    images = np.zeros((3, *size, 3), np.uint8)
    declared = transform.output_size(size)  # type: ignore[attr-defined]
    out = transform(images)  # type: ignore[operator]
    assert declared == out.shape[1:3]


def test_declarations_of_compose_cover_every_step() -> None:
    flip_then_resize = Compose([RandomHorizontalFlip(), Resize(64), CenterCrop(56)])
    assert flip_then_resize.min_input_side == 64  # a flip keeps sizes: the resize decides
    assert not flip_then_resize.keeps_size and flip_then_resize.in_place
    assert Compose([RandomResizedCrop(8), Resize(64)]).min_input_side is None
    assert not Compose([RandomResizedCrop(8), RandomHorizontalFlip()]).in_place
    assert Compose([RandomHorizontalFlip()]).keeps_size
    assert Compose([Resize(8)]).output_size(None) is None  # per image
    assert Compose([Resize(8), CenterCrop(8)]).output_size(None) == (8, 8)
    with pytest.raises(ValueError, match=r"CenterCrop size \(10, 10\) is larger than an image"):
        Compose([Resize((9, 30)), CenterCrop(10)]).output_size((100, 100))


def _shards(root: Path, images: np.ndarray) -> Path:
    fields = [FieldSpec("image", "array", "uint8", images.shape[1:], "HWC")]
    root.mkdir()
    with ShardWriter(root / "shard-00000.h5", fields) as writer:
        for image in images:
            writer.append({"image": image})
        info = writer.close()
    save_manifest(root, Manifest(fields=fields, shards=[info]))
    return root


def test_a_crop_larger_than_the_stored_images_fails_at_construction(tmp_path: Path) -> None:
    images = np.zeros((4, 20, 16, 3), np.uint8)
    root = _shards(tmp_path / "raw", images)
    match = r"cannot take field 'image' \(20x16 images\): CenterCrop size \(18, 18\) is larger"
    with pytest.raises(ValueError, match=match):
        ShardDataset(root, fields=("image",), transform=CenterCrop(18))
    with pytest.raises(ValueError, match=match):
        RAMDataset.from_arrays(images, np.zeros(4, np.int64), transform=CenterCrop(18))
    with pytest.raises(ValueError, match="CenterCrop size"):
        ShardDataset(
            root,
            fields=("image",),
            transform=Compose([RandomHorizontalFlip(), CenterCrop((4, 17))]),
        )
    fits = ShardDataset(root, fields=("image",), transform=Compose([Resize(24), CenterCrop(18)]))
    assert fits.__getitems__([0, 1]).shape == (2, 3, 18, 18)
