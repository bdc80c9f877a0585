"""The ragged_image kind: images of their own (H, W) stored as values + offsets + sizes."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from fastdata import RAMDataset, ShardDataset
from fastdata.errors import ShardFormatError
from fastdata.shards import (
    FieldSpec,
    Manifest,
    ShardReader,
    ShardWriter,
    load_manifest,
    save_manifest,
    verify_shards,
)

FIELDS = [
    FieldSpec("image", "ragged_image", "uint8", (3,), "HWC"),
    FieldSpec("mask", "ragged_image", "uint8", (), "HW"),
    FieldSpec("label", "array", "int64"),
]
SIZES = [(5, 7), (9, 4), (1, 1), (6, 6), (3, 11), (8, 2), (4, 4)]


def write_image_set(root: Path, per_shard: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in SIZES]
    shards = []
    for number, start in enumerate(range(0, len(images), per_shard)):
        with ShardWriter(root / f"shard-{number:05d}.h5", FIELDS) as writer:
            for i in range(start, min(start + per_shard, len(images))):
                writer.append({"image": images[i], "mask": images[i][..., 0], "label": i})
            shards.append(writer.close())
    save_manifest(root, Manifest(fields=FIELDS, shards=shards))
    return images


def test_layout_in_the_shard(tmp_path: Path) -> None:
    images = write_image_set(tmp_path, per_shard=len(SIZES))
    with h5py.File(tmp_path / "shard-00000.h5") as h5:
        sizes = h5["image/sizes"][()]
        offsets = h5["image/offsets"][()]
        values = h5["image/values"][()]
    assert sizes.tolist() == [list(size) for size in SIZES]
    assert offsets.tolist() == [0, *np.cumsum([h * w for h, w in SIZES]).tolist()]
    assert values.shape == (offsets[-1], 3)
    assert np.array_equal(values, np.concatenate([image.reshape(-1, 3) for image in images]))


def test_read_and_gather_across_shards(tmp_path: Path) -> None:
    images = write_image_set(tmp_path)
    reader = ShardReader(tmp_path)
    assert np.array_equal(reader.read("image", 4), images[4])
    assert np.array_equal(reader.read("mask", 1), images[1][..., 0])
    order = [6, 0, 4, 2, 5, 1]
    batch = reader.read_batch("image", order)
    for got, i in zip(batch, order, strict=True):
        assert np.array_equal(got, images[i])
    assert reader.field("image").field_kind.describe() == "ragged_image uint8 (H, W, 3)"
    reader.close()
    assert verify_shards(tmp_path, show_progress=False) == []


@pytest.mark.parametrize("in_ram", [False, True])
def test_datasets_yield_images_of_their_own_size(tmp_path: Path, in_ram: bool) -> None:
    images = write_image_set(tmp_path)
    fields = ("image", "mask", "label")
    dataset = (
        RAMDataset.from_shards(tmp_path, fields=fields, show_progress=False)
        if in_ram
        else ShardDataset(tmp_path, fields=fields)
    )
    chw, masks, labels = dataset.__getitems__([3, 6, 0, 4])
    for k, i in enumerate([3, 6, 0, 4]):
        assert np.array_equal(chw[k].permute(1, 2, 0).numpy(), images[i])
        assert np.array_equal(masks[k].numpy(), images[i][..., 0])
    assert labels.tolist() == [3, 6, 0, 4]
    image, _, _ = dataset[1]
    assert tuple(image.shape) == (3, 9, 4)


def test_append_refuses_wrong_shapes_and_dtypes(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "s.h5", FIELDS[:1]) as writer:
        with pytest.raises(ValueError, match=r"field 'image' takes shape \(H, W, 3\), got"):
            writer.append({"image": np.zeros((4, 4), np.uint8)})
        with pytest.raises(ValueError, match="takes images of at least 1x1"):
            writer.append({"image": np.zeros((0, 4, 3), np.uint8)})
        with pytest.raises(TypeError, match="field 'image' takes dtype uint8, got float32"):
            writer.append({"image": np.zeros((4, 4, 3), np.float32)})


def test_spec_checks() -> None:
    with pytest.raises(ValueError, match=r"needs shape \(C,\) with C >= 1"):
        FieldSpec("image", "ragged_image", "uint8", (4, 3))
    with pytest.raises(ValueError, match="must name height, width"):
        FieldSpec("image", "ragged_image", "uint8", (3,), "HW")


def test_sizes_that_disagree_with_offsets_are_refused(tmp_path: Path) -> None:
    write_image_set(tmp_path, per_shard=len(SIZES))
    with h5py.File(tmp_path / "shard-00000.h5", "r+") as h5:
        h5["image/sizes"][0] = (7, 5 + 1)
    with pytest.raises(Exception, match="sizes of field 'image' are not the pixel counts"):
        ShardReader(tmp_path).read("image", 0)


def test_readers_without_the_kind_refuse_the_manifest_clearly(tmp_path: Path) -> None:
    write_image_set(tmp_path)
    manifest = load_manifest(tmp_path)
    assert manifest.fields[0].kind == "ragged_image"
    from fastdata.shards import _kinds  # noqa: PLC0415

    held = _kinds.FIELD_KINDS.pop("ragged_image")
    try:
        with pytest.raises(ShardFormatError, match=r"kind must be one of .*got 'ragged_image'"):
            load_manifest(tmp_path)
    finally:
        _kinds.FIELD_KINDS["ragged_image"] = held
