"""``ShardWriter(max_samples=...)``: large array fields written in place, same data out."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from fastdata.shards import FieldSpec, ShardWriter

FIELDS = [
    FieldSpec("image", "array", "uint8", (40, 32, 3), "HWC"),  # 3,840 bytes: spilled
    FieldSpec("big", "array", "uint8", (64, 64, 2), "HWC"),  # 8,192 bytes: in place
    FieldSpec("label", "array", "int64"),
    FieldSpec("path", "encoded", "uint8", encoding="utf-8"),
]


def _samples(count: int) -> list[dict[str, object]]:
    rng = np.random.default_rng(count)
    return [
        {
            "image": rng.integers(0, 256, (40, 32, 3), dtype=np.uint8),
            "big": rng.integers(0, 256, (64, 64, 2), dtype=np.uint8),
            "label": i,
            "path": f"class/{i}.jpg",
        }
        for i in range(count)
    ]


def _write(path: Path, samples: list[dict[str, object]], max_samples: int | None) -> bytes:
    with ShardWriter(path, FIELDS, max_samples=max_samples) as writer:
        for sample in samples:
            writer.append(sample)  # type: ignore[arg-type]
        info = writer.close()
    data = path.read_bytes()
    assert info.sha256 == hashlib.sha256(data).hexdigest() and info.num_samples == len(samples)
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no spill left
    return data


def _read(path: Path) -> dict[str, np.ndarray]:
    import h5py  # noqa: PLC0415 - only to look inside the file

    with h5py.File(path, "r") as h5:
        return {
            "image": h5["image"][()],
            "big": h5["big"][()],
            "label": h5["label"][()],
            "offsets": h5["path"]["offsets"][()],
            "paths": h5["path"]["data"][()],
            "contiguous": np.array(h5["big"].chunks is None and h5["image"].chunks is None),
        }


def test_exact_count_is_written_in_place_and_reads_back(tmp_path: Path) -> None:
    samples = _samples(5)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    first = _write(tmp_path / "a" / "shard-00000.h5", samples, max_samples=5)
    again = _write(tmp_path / "b" / "shard-00000.h5", samples, max_samples=5)
    assert first == again  # deterministic
    got = _read(tmp_path / "a" / "shard-00000.h5")
    for name in ("big", "image"):
        np.testing.assert_array_equal(got[name], np.stack([s[name] for s in samples]))  # type: ignore[misc]
    assert got["label"].tolist() == list(range(5)) and bool(got["contiguous"])
    assert bytes(got["paths"][got["offsets"][3] : got["offsets"][4]]) == b"class/3.jpg"


@pytest.mark.parametrize("count", [0, 1, 4])
def test_fewer_samples_give_the_same_file_as_without_the_hint(tmp_path: Path, count: int) -> None:
    samples = _samples(count)
    (tmp_path / "hint").mkdir(), (tmp_path / "plain").mkdir()
    hinted = _write(tmp_path / "hint" / "s.h5", samples, max_samples=5)
    plain = _write(tmp_path / "plain" / "s.h5", samples, max_samples=None)
    assert hinted == plain


def test_more_samples_than_announced_are_refused(tmp_path: Path) -> None:
    sample = _samples(1)[0]
    with ShardWriter(tmp_path / "s.h5", FIELDS, max_samples=1) as writer:
        writer.append(sample)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="takes at most 1"):
            writer.append(sample)  # type: ignore[arg-type]
        writer.abort()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="max_samples must be None or an int >= 0, got -1"):
        ShardWriter(tmp_path / "s.h5", FIELDS, max_samples=-1)
