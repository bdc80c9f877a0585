"""Detection targets through the datasets: boxes and box labels read by role, moved by the
batch transforms with their images, dropped together."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from fastdata import RAMDataset, ShardDataset
from fastdata.decode.cpu import CpuDecoder
from fastdata.shards import FieldSpec, Manifest, ShardWriter, save_manifest
from fastdata.transforms import CenterCrop, Compose, RandomHorizontalFlip, Resize

SIZE = (48, 64)  # stored (H, W)


def write_set(root: Path, count: int = 20, encoded: bool = False) -> list[np.ndarray]:

    rng = np.random.default_rng(1)
    image_spec = (
        FieldSpec("image", "encoded", "uint8", encoding="png")
        if encoded
        else FieldSpec("image", "array", "uint8", (*SIZE, 3), "HWC")
    )
    fields = [
        image_spec,
        FieldSpec("boxes", "ragged", "float32", (4,), role="boxes"),
        FieldSpec("labels", "ragged", "int64", (), role="box_labels"),
    ]
    boxes = []
    with ShardWriter(root / "shard-00000.h5", fields) as writer:
        for i in range(count):
            n = i % 4
            xy = rng.uniform(0, 40, (n, 2))
            rows = np.concatenate([xy, xy + rng.uniform(4, 20, (n, 2))], axis=1)
            rows = np.minimum(rows, [SIZE[1], SIZE[0], SIZE[1], SIZE[0]]).astype(np.float32)
            boxes.append(rows)
            image = np.full((*SIZE, 3), i, np.uint8)
            value = cv2.imencode(".png", image)[1].tobytes() if encoded else image
            writer.append({"image": value, "boxes": rows, "labels": np.arange(n) + 10 * i})
        info = writer.close()
    save_manifest(root, Manifest(fields=fields, shards=[info]))
    return boxes


@pytest.mark.parametrize("encoded", [False, True])
def test_flip_and_resize_give_the_documented_batch(tmp_path: Path, encoded: bool) -> None:
    boxes = write_set(tmp_path, encoded=encoded)
    dataset = ShardDataset(
        tmp_path,
        fields=("image", "boxes", "labels"),
        transform=Compose([RandomHorizontalFlip(p=1.0), Resize((512, 512))]),
    )
    images, moved, labels = dataset.__getitems__(list(range(16)))
    assert tuple(images.shape) == (16, 3, 512, 512) and images.dtype == torch.uint8
    assert isinstance(moved, list) and isinstance(labels, list)
    for i in range(16):
        assert moved[i].dtype == torch.float32 and labels[i].dtype == torch.int64
        assert tuple(moved[i].shape) == (i % 4, 4) and tuple(labels[i].shape) == (i % 4,)
        scale = np.array([512 / SIZE[1], 512 / SIZE[0]] * 2, np.float32)
        flipped = boxes[i][:, [2, 1, 0, 3]] * [-1, 1, -1, 1] + [SIZE[1], 0, SIZE[1], 0]
        np.testing.assert_allclose(moved[i].numpy(), flipped * scale, rtol=1e-5, atol=1e-3)
        np.testing.assert_array_equal(labels[i].numpy(), np.arange(i % 4) + 10 * i)


def test_ram_dataset_drops_boxes_with_their_labels(tmp_path: Path) -> None:
    write_set(tmp_path)
    dataset = RAMDataset.from_shards(
        tmp_path,
        fields=("image", "boxes", "labels"),
        transform=CenterCrop((8, 8)),
        show_progress=False,
    )
    _, boxes, labels = dataset.__getitems__(list(range(20)))
    for box, label in zip(boxes, labels, strict=True):
        assert len(box) == len(label)
        assert ((box >= 0) & (box <= 8)).all()
    dataset.close()


def test_per_sample_callable_warns_that_boxes_stay(tmp_path: Path) -> None:
    write_set(tmp_path)
    with pytest.warns(UserWarning, match=r"fields \('boxes', 'labels'\)"):
        ShardDataset(tmp_path, fields=("image", "boxes", "labels"), transform=lambda x: x)


def test_a_decoder_crop_refuses_boxes(tmp_path: Path) -> None:
    write_set(tmp_path, encoded=True)
    with pytest.raises(ValueError, match=r"fields \('boxes', 'labels'\) cannot follow"):
        ShardDataset(
            tmp_path,
            fields=("image", "boxes", "labels"),
            transform=RandomHorizontalFlip(),
            decode=CpuDecoder(32),
        )


def test_roles_argument_overrides_the_manifest(tmp_path: Path) -> None:
    write_set(tmp_path)
    # read as plain rows: no transform follows them
    dataset = ShardDataset(
        tmp_path,
        fields=("image", "boxes", "labels"),
        transform=RandomHorizontalFlip(p=1.0),
        roles={"boxes": "other", "labels": "other"},
    )
    assert dataset.roles == {"image": "image", "boxes": "other", "labels": "other"}
    _, boxes, _ = dataset.__getitems__([1, 2])
    stored = ShardDataset(tmp_path, fields=("boxes",))
    np.testing.assert_array_equal(boxes[1].numpy(), stored[2].numpy())
    with pytest.raises(ValueError, match="roles names field 'mask'"):
        ShardDataset(tmp_path, fields=("image",), roles={"mask": "mask"})
    with pytest.raises(ValueError, match=r"roles\['boxes'\] must be one of"):
        ShardDataset(tmp_path, fields=("image", "boxes"), roles={"boxes": "bbox"})
    ram = RAMDataset.from_shards(
        tmp_path, fields=("image", "boxes"), roles={"boxes": "other"}, show_progress=False
    )
    assert ram.roles["boxes"] == "other"
