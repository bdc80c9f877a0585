"""Every dataset over shards refuses a shard that disagrees with its manifest (checked once,
when the shard is opened), instead of mapping it."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from fastdata import RAMDataset, ShardDataset
from fastdata._file_hash import file_sha256
from fastdata.errors import ShardFormatError
from tests.datasets.conftest import Reference


def _vlen_image(root: Path) -> None:
    """Replace shard 1's images with a variable-length string dataset and record the new
    size and checksum in the manifest (``verify``'s size and hash checks then pass)."""
    path = root / "shard-00001.h5"
    with h5py.File(path, "r+") as h5:
        count = h5["image"].shape[0]
        del h5["image"]
        h5.create_dataset("image", data=[b"x" * 360] * count, dtype=h5py.string_dtype())
    manifest = root / "index.json"
    data = json.loads(manifest.read_text())
    data["shards"][1].update(num_bytes=path.stat().st_size, sha256=file_sha256(path))
    data["num_bytes"] = sum(s["num_bytes"] for s in data["shards"])
    manifest.write_text(json.dumps(data))


def test_shard_dataset_refuses_vlen_dataset(raw_shards: Reference) -> None:
    _vlen_image(raw_shards.path)
    dataset = ShardDataset(raw_shards.path, fields=("image", "label"))
    assert len(dataset.__getitems__([0, 1])[0]) == 2  # shard 0 is fine
    with pytest.raises(ShardFormatError, match="/image has dtype object"):
        dataset.__getitems__([0, 10])


def test_ram_dataset_from_shards_refuses_vlen_dataset(raw_shards: Reference) -> None:
    _vlen_image(raw_shards.path)
    with pytest.raises(ShardFormatError, match="/image has dtype object"):
        RAMDataset.from_shards(raw_shards.path, fields=("image",), show_progress=False)


def test_shard_dataset_refuses_in_memory_naming_ram_dataset(raw_shards: Reference) -> None:
    with pytest.raises(ValueError, match=r"in_memory=True .* RAMDataset\.from_shards\("):
        ShardDataset(raw_shards.path, in_memory=True)


def test_ram_copy_of_shards_refuses_wrong_count(raw_shards: Reference) -> None:
    manifest = raw_shards.path / "index.json"
    data = json.loads(manifest.read_text())
    data["shards"][2]["num_samples"] = 6  # the file holds 4
    data["num_samples"] = 24
    manifest.write_text(json.dumps(data))
    with pytest.raises(ShardFormatError, match="holds 4 samples, the manifest records 6"):
        RAMDataset.from_shards(raw_shards.path, show_progress=False)
    dataset = ShardDataset(raw_shards.path)
    assert len(dataset) == 24
    with pytest.raises(ShardFormatError, match="holds 4 samples"):
        dataset.__getitems__([23])


def test_checked_shards_still_read_correctly(raw_shards: Reference) -> None:
    dataset = ShardDataset(raw_shards.path, fields=("image", "label"), layout="HWC")
    images, labels = dataset.__getitems__([21, 0, 9])
    np.testing.assert_array_equal(images.numpy(), raw_shards.images[[21, 0, 9]])
    np.testing.assert_array_equal(labels.numpy(), raw_shards.labels[[21, 0, 9]])
