"""A new kind of field is one class: a toy kind for detection boxes, written, read and
gathered by the unchanged writer, reader and datasets; and the registry's errors."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from fastdata import RAMDataset, ShardDataset
from fastdata.errors import ShardFormatError
from fastdata.shards import (
    Column,
    FieldKind,
    FieldSpec,
    Manifest,
    ShardReader,
    ShardWriter,
    load_manifest,
    register_field_kind,
    save_manifest,
)
from fastdata.shards._kinds import FIELD_KINDS


class BoxesKind(FieldKind):
    """A variable number of rows of a fixed shape per sample (``(k, 4)`` boxes), stored as a
    group holding ``rows`` ``(total, *shape)`` and ``offsets`` counting rows."""

    name = "boxes"
    fixed_size = False

    @classmethod
    def check(cls, spec: FieldSpec) -> None:
        if not spec.shape:
            raise ValueError(f"boxes field {spec.name!r} needs the shape of one row")

    @property
    def sample_nbytes(self) -> int:
        return 0

    @property
    def row_nbytes(self) -> int:
        return int(np.prod(self.spec.shape)) * np.dtype(self.spec.dtype).itemsize

    def describe(self) -> str:
        return f"boxes of {self.spec.dtype} {self.spec.shape}"

    def to_bytes(self, value: Any) -> bytes | memoryview:
        rows = np.ascontiguousarray(value, dtype=self.spec.dtype)
        return rows.reshape(-1, *self.spec.shape).tobytes()

    def write(self, h5: h5py.File, column: Column, compression: str | None) -> list[Any]:
        group = h5.create_group(self.spec.name)
        offsets = np.zeros(column.num_samples + 1, np.int64)
        np.cumsum(np.asarray(column.lengths, np.int64) // self.row_nbytes, out=offsets[1:])
        group.create_dataset("offsets", data=offsets)
        with open(column.path, "rb") as fh:
            fh.seek(column.offset)
            raw = fh.read(int(offsets[-1]) * self.row_nbytes)
        rows = np.frombuffer(raw, self.spec.dtype).reshape(-1, *self.spec.shape)
        group.create_dataset("rows", data=rows)
        return []

    def open(self, h5: h5py.File, num_samples: int, mapper: Callable[[Any], Any]) -> Any:
        group = h5[self.spec.name]
        offsets = np.asarray(group["offsets"][()])
        if offsets.shape != (num_samples + 1,):
            raise ValueError(f"offsets of field {self.spec.name!r} have the wrong length")
        return mapper(group["rows"]), offsets

    def read(self, view: Any, index: int) -> np.ndarray:
        rows, offsets = view
        return np.asarray(rows[offsets[index] : offsets[index + 1]])

    def gather(
        self,
        views: Callable[[int], Any],
        segments: np.ndarray,
        local: np.ndarray,
        out: np.ndarray | None = None,
        *,
        executor: Executor | None = None,
        tasks: int = 1,
    ) -> list[np.ndarray]:
        pairs = zip(segments.tolist(), local.tolist(), strict=True)
        return [self.read(views(segment), index) for segment, index in pairs]

    def pack(self, view: Any) -> tuple[Any, np.ndarray | None]:
        return view

    def unpack(self, payload: np.ndarray, offsets: np.ndarray | None, num_samples: int) -> Any:
        return payload.view(self.spec.dtype).reshape(-1, *self.spec.shape), offsets


@pytest.fixture
def boxes_kind() -> Iterator[None]:
    register_field_kind(BoxesKind)
    yield
    del FIELD_KINDS["boxes"]


def _fields() -> list[FieldSpec]:
    return [FieldSpec("label", "array", "int64"), FieldSpec("boxes", "boxes", "float32", (4,))]


def _boxes(i: int) -> np.ndarray:
    return np.arange(4 * (i % 3), dtype=np.float32).reshape(-1, 4) + i


def _write_set(root: Path, counts: list[int]) -> None:
    shards, start, fields = [], 0, _fields()
    for number, count in enumerate(counts):
        with ShardWriter(root / f"shard-{number:05d}.h5", fields) as writer:
            for i in range(start, start + count):
                writer.append({"label": i, "boxes": _boxes(i)})
            shards.append(writer.close())
        start += count
    save_manifest(root, Manifest(fields=fields, shards=shards))


def test_a_new_kind_is_one_class(tmp_path: Path, boxes_kind: None) -> None:
    _write_set(tmp_path, [4, 0, 5])
    assert load_manifest(tmp_path).field("boxes").field_kind.describe() == ("boxes of float32 (4,)")
    reader = ShardReader(tmp_path)
    for i in range(9):
        np.testing.assert_array_equal(reader.read("boxes", i), _boxes(i))
    order = [8, 0, 4, 4, -1]
    batch = reader.read_batch("boxes", order)
    assert len(batch) == len(order)
    for got, i in zip(batch, order, strict=True):
        np.testing.assert_array_equal(got, _boxes(i % 9))
    for dataset in (
        ShardDataset(tmp_path, fields=("boxes", "label")),
        RAMDataset.from_shards(tmp_path, fields=("boxes", "label")),
    ):
        boxes, labels = dataset.__getitems__(order)
        assert labels.tolist() == [i % 9 for i in order]
        for got, i in zip(boxes, order, strict=True):
            assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
            np.testing.assert_array_equal(got.numpy(), _boxes(i % 9))
        dataset.close()


def test_unknown_kind_in_a_manifest_is_a_format_error(tmp_path: Path, boxes_kind: None) -> None:
    _write_set(tmp_path, [3])
    data = json.loads((tmp_path / "index.json").read_text())
    data["fields"][1]["kind"] = "polygons"
    (tmp_path / "index.json").write_text(json.dumps(data))
    with pytest.raises(
        ShardFormatError,
        match=r"malformed manifest \(fields\[1\]\.kind must be one of 'array', 'encoded', "
        r"'ragged', 'ragged_image', 'boxes', got 'polygons'\)",
    ):
        load_manifest(tmp_path)


def test_a_kind_checks_its_specs(boxes_kind: None) -> None:
    with pytest.raises(ValueError, match="boxes field 'b' needs the shape of one row"):
        FieldSpec("b", "boxes", "float32")
    with pytest.raises(
        ValueError,
        match="kind must be one of 'array', 'encoded', 'ragged', 'ragged_image', 'boxes'",
    ):
        FieldSpec("b", "polygons", "float32")
    with pytest.raises(ValueError, match="encoded field 'e' must have dtype 'uint8'"):
        FieldSpec("e", "encoded", "int16", encoding="png")


def test_registering_checks_the_class(boxes_kind: None) -> None:
    with pytest.raises(TypeError, match="cls must be a FieldKind subclass"):
        register_field_kind(dict)  # type: ignore[arg-type]

    class OtherBoxes(BoxesKind):
        pass

    with pytest.raises(ValueError, match="field kind 'boxes' is already BoxesKind"):
        register_field_kind(OtherBoxes)
    assert register_field_kind(BoxesKind) is BoxesKind
