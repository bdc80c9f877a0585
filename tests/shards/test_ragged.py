"""The ragged kind (N_i rows per sample: boxes, box labels) and field roles in the manifest."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from fastdata import RAMDataset, ShardDataset
from fastdata.shards import (
    FieldSpec,
    Manifest,
    ShardReader,
    ShardWriter,
    load_manifest,
    save_manifest,
    verify_shards,
)
from fastdata.shards._checksum import file_sha256

FIELDS = [
    FieldSpec("image", "array", "uint8", (8, 6, 3), "HWC"),
    FieldSpec("boxes", "ragged", "float32", (4,)),
    FieldSpec("labels", "ragged", "int64", ()),
    FieldSpec("label", "array", "int64"),
]
COUNTS = [3, 0, 1, 5, 0, 2, 4]


def write_detection_set(
    root: Path, counts: list[int] = COUNTS, per_shard: int = 3
) -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    boxes = [rng.uniform(0, 6, (n, 4)).astype(np.float32) for n in counts]
    labels = [rng.integers(0, 9, n).astype(np.int64) for n in counts]
    shards = []
    for number, start in enumerate(range(0, len(counts), per_shard)):
        with ShardWriter(root / f"shard-{number:05d}.h5", FIELDS) as writer:
            for i in range(start, min(start + per_shard, len(counts))):
                writer.append(
                    {
                        "image": np.full((8, 6, 3), i, np.uint8),
                        "boxes": boxes[i],
                        "labels": labels[i].astype(np.int32),  # widened when stored
                        "label": i,
                    }
                )
            shards.append(writer.close())
    save_manifest(root, Manifest(fields=FIELDS, shards=shards))
    return {"boxes": boxes, "labels": labels}


def test_roles_default_from_name_and_kind() -> None:
    assert [spec.role for spec in FIELDS] == ["image", "boxes", "box_labels", "label"]
    assert FieldSpec("seg", "array", "uint8", (8, 6)).role == "mask"
    assert FieldSpec("seg", "array", "uint8", (8, 6), role="other").role == "other"
    with pytest.raises(ValueError, match="role of field 'seg' must be one of"):
        FieldSpec("seg", "array", "uint8", (8, 6), role="segmentation")


def test_ragged_rows_round_trip_through_the_reader(tmp_path: Path) -> None:
    expected = write_detection_set(tmp_path)
    reader = ShardReader(tmp_path)
    for i, count in enumerate(COUNTS):
        boxes = reader.read("boxes", i)
        assert boxes.shape == (count, 4) and boxes.dtype == np.float32
        np.testing.assert_array_equal(boxes, expected["boxes"][i])
        np.testing.assert_array_equal(reader.read("labels", i), expected["labels"][i])
    order = [6, 1, 3, 0, 3, 4]
    batch = reader.read_batch("boxes", order)
    assert isinstance(batch, list)
    for item, i in zip(batch, order, strict=True):
        assert item.shape == (COUNTS[i], 4)
        np.testing.assert_array_equal(item, expected["boxes"][i])
    # no padding on disk: exactly sum(N_i) rows
    with h5py.File(tmp_path / "shard-00001.h5") as h5:
        assert h5["boxes/values"].shape == (5 + 0 + 2, 4)
        np.testing.assert_array_equal(h5["boxes/offsets"][()], [0, 5, 5, 7])
    assert verify_shards(tmp_path, show_progress=False) == []


@pytest.mark.parametrize("dataset_class", [ShardDataset, RAMDataset])
def test_datasets_return_lists_of_rows(tmp_path: Path, dataset_class: type) -> None:
    expected = write_detection_set(tmp_path)
    fields = ("image", "boxes", "labels")
    if dataset_class is RAMDataset:
        dataset = RAMDataset.from_shards(tmp_path, fields=fields, show_progress=False)
    else:
        dataset = ShardDataset(tmp_path, fields=fields)
    images, boxes, labels = dataset.__getitems__([5, 1, 3])
    assert images.shape == (3, 3, 8, 6)
    assert [tuple(b.shape) for b in boxes] == [(2, 4), (0, 4), (5, 4)]
    for item, i in zip(boxes, [5, 1, 3], strict=True):
        np.testing.assert_array_equal(item.numpy(), expected["boxes"][i])
    assert [lab.dtype for lab in labels] == [labels[0].dtype] * 3
    np.testing.assert_array_equal(labels[2].numpy(), expected["labels"][3])
    _, boxes_one, _ = dataset[3]
    np.testing.assert_array_equal(boxes_one.numpy(), expected["boxes"][3])
    assert dataset.roles == {"image": "image", "boxes": "boxes", "labels": "box_labels"}
    dataset.close()


def test_ragged_refuses_wrong_rows(tmp_path: Path) -> None:
    with ShardWriter(tmp_path / "s.h5", FIELDS) as writer:
        sample = {"image": np.zeros((8, 6, 3), np.uint8), "labels": [], "label": 0}
        with pytest.raises(ValueError, match=r"field 'boxes' takes shape \(N, 4\)"):
            writer.append({**sample, "boxes": np.zeros((2, 5), np.float32)})
        with pytest.raises(TypeError, match="field 'labels' takes dtype int64"):
            writer.append({**sample, "boxes": [], "labels": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="positive sides"):
        FieldSpec("bad", "ragged", "float32", (0,))


def test_manifest_records_roles_and_reads_version_1(tmp_path: Path) -> None:
    write_detection_set(tmp_path)
    data = json.loads((tmp_path / "index.json").read_text())
    assert data["version"] == 2
    assert [f["role"] for f in data["fields"]] == ["image", "boxes", "box_labels", "label"]
    # A set written before roles: version 1, no role keys, its shards say version 1.
    data["version"] = 1
    data["fields"] = [
        {k: v for k, v in f.items() if k != "role"} for f in data["fields"] if f["kind"] != "ragged"
    ]
    data["fields"].append(
        {"name": "mask", "kind": "array", "dtype": "uint8", "shape": [8, 6], "layout": "HW"}
    )
    (tmp_path / "index.json").write_text(json.dumps(data))
    manifest = load_manifest(tmp_path)
    assert {f.name: f.role for f in manifest.fields} == {
        "image": "image",
        "label": "label",
        "mask": "mask",
    }
    data["version"] = 3
    (tmp_path / "index.json").write_text(json.dumps(data))
    with pytest.raises(Exception, match="version 3 is not supported"):
        load_manifest(tmp_path)


def test_old_shard_files_still_open(tmp_path: Path) -> None:
    write_detection_set(tmp_path, counts=[1, 2], per_shard=2)
    with h5py.File(tmp_path / "shard-00000.h5", "r+") as h5:
        h5.attrs["version"] = 1
    data = json.loads((tmp_path / "index.json").read_text())
    data["shards"][0]["sha256"] = file_sha256(tmp_path / "shard-00000.h5")
    data["shards"][0]["num_bytes"] = (tmp_path / "shard-00000.h5").stat().st_size
    data["num_bytes"] = data["shards"][0]["num_bytes"]
    (tmp_path / "index.json").write_text(json.dumps(data))
    assert ShardReader(tmp_path).read("boxes", 1).shape == (2, 4)
