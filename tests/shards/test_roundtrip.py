from __future__ import annotations

import errno
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

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
    FieldSpec("image", "array", "uint8", (8, 6, 3), "HWC"),
    FieldSpec("label", "array", "int64"),
    FieldSpec("jpeg", "encoded", "uint8", encoding="jpeg"),
]


def _write_set(root: Path, counts: list[int], compression: str | None = None) -> np.ndarray:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(sum(counts), 8, 6, 3), dtype=np.uint8)
    shards = []
    start = 0
    for number, count in enumerate(counts):
        with ShardWriter(root / f"shard-{number:05d}.h5", FIELDS, compression=compression) as w:
            for i in range(start, start + count):
                w.append({"image": images[i], "label": i, "jpeg": bytes([i % 256]) * (i + 1)})
            shards.append(w.close())
        start += count
    save_manifest(root, Manifest(fields=FIELDS, shards=shards, class_names=["a"]))
    return images


@pytest.mark.parametrize("compression", [None, "gzip"])
@pytest.mark.parametrize("use_mmap", [True, False])
def test_roundtrip_single_and_batched(
    tmp_path: Path, compression: str | None, use_mmap: bool
) -> None:
    images = _write_set(tmp_path, [5, 0, 7], compression)
    reader = ShardReader(tmp_path, use_mmap=use_mmap)
    assert len(reader) == 12
    for i in range(12):
        np.testing.assert_array_equal(reader.read("image", i), images[i])
        assert int(reader.read("label", i)) == i
        assert reader.read("jpeg", i).tobytes() == bytes([i % 256]) * (i + 1)
    order = [11, 0, 5, 5, 3, -1]
    np.testing.assert_array_equal(reader.read_batch("image", order), images[order])
    np.testing.assert_array_equal(reader.read_batch("label", order), np.array(order) % 12)
    blobs = reader.read_batch("jpeg", order)
    assert [b.tobytes() for b in blobs] == [bytes([i % 12]) * (i % 12 + 1) for i in order]


def test_reader_pickles_without_handles(tmp_path: Path) -> None:
    images = _write_set(tmp_path, [4])
    reader = ShardReader(tmp_path)
    reader.read("image", 0)
    clone = pickle.loads(pickle.dumps(reader))
    np.testing.assert_array_equal(clone.read("image", 3), images[3])


def test_out_of_range_and_unknown_field(tmp_path: Path) -> None:
    _write_set(tmp_path, [3])
    reader = ShardReader(tmp_path)
    with pytest.raises(IndexError, match="sample index 3 out of range for 3 samples"):
        reader.read("image", 3)
    with pytest.raises(KeyError, match="no field 'mask'"):
        reader.read("mask", 0)


def test_writer_is_atomic_on_error(tmp_path: Path) -> None:
    target = tmp_path / "shard-00000.h5"
    with pytest.raises(ValueError, match="takes shape"), ShardWriter(target, FIELDS) as writer:
        writer.append({"image": np.zeros((8, 6, 3), np.uint8), "label": 0, "jpeg": b"x"})
        writer.append({"image": np.zeros((2, 2, 3), np.uint8), "label": 0, "jpeg": b"x"})
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_bad_dtype_and_missing_field(tmp_path: Path) -> None:
    writer = ShardWriter(tmp_path / "s.h5", FIELDS)
    with pytest.raises(TypeError, match="takes dtype uint8, got float32"):
        writer.append({"image": np.zeros((8, 6, 3), np.float32), "label": 0, "jpeg": b""})
    with pytest.raises(ValueError, match="lacks fields"):
        writer.append({"image": np.zeros((8, 6, 3), np.uint8)})
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_verify_detects_corruption(tmp_path: Path) -> None:
    _write_set(tmp_path, [3, 3])
    assert verify_shards(tmp_path, show_progress=False) == []
    shard = tmp_path / "shard-00001.h5"
    data = bytearray(shard.read_bytes())
    data[-10] ^= 0xFF
    shard.write_bytes(bytes(data))
    problems = verify_shards(tmp_path, show_progress=False)
    assert [p.file for p in problems] == ["shard-00001.h5"]
    assert "sha256" in problems[0].reason
    shard.unlink()
    assert verify_shards(tmp_path, show_progress=False)[0].reason == "missing"


def test_manifest_errors(tmp_path: Path) -> None:
    with pytest.raises(ShardFormatError, match="no shard manifest found"):
        load_manifest(tmp_path)
    (tmp_path / "index.json").write_text("{not json")
    with pytest.raises(ShardFormatError, match="unreadable manifest"):
        load_manifest(tmp_path)
    (tmp_path / "index.json").write_text('{"format": "fastdata-shards", "version": 99}')
    with pytest.raises(ShardFormatError, match="version 99 is not supported"):
        load_manifest(tmp_path)


@pytest.mark.parametrize(
    "unavailable",
    [AttributeError("no copy_file_range"), OSError(errno.EXDEV, "cross-device")],
)
def test_shards_are_the_same_bytes_without_a_kernel_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unavailable: Exception
) -> None:
    for folder in ("kernel", "blocks"):
        (tmp_path / folder).mkdir()
    _write_set(tmp_path / "kernel", [5, 7])

    def refuse(*args: object) -> int:
        raise unavailable

    monkeypatch.setattr(os, "copy_file_range", refuse)
    _write_set(tmp_path / "blocks", [5, 7])
    for name in ("shard-00000.h5", "shard-00001.h5"):
        assert (tmp_path / "blocks" / name).read_bytes() == (
            tmp_path / "kernel" / name
        ).read_bytes()


def test_a_real_copy_error_is_not_hidden(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "copy_file_range", fail)
    with pytest.raises(OSError, match="No space left"):
        _write_set(tmp_path, [3])
    assert not list(tmp_path.glob("*.h5"))
