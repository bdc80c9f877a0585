"""The ``ragged`` kind: a variable number of fixed-size rows per sample (detection boxes,
box labels, keypoints)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from fastdata.shards._field_kind import (
    Column,
    FieldKind,
    FieldSpecLike,
    Mapper,
    Region,
    checked_values_and_offsets,
    create_contiguous,
)

if TYPE_CHECKING:
    import h5py


class RaggedKind(FieldKind):
    """Per sample an ``(N_i, *shape)`` array of ``dtype``: ``shape`` (the manifest's) is the
    fixed tail of a row, ``N_i`` any count including 0. Stored without padding as a group
    named after the field holding ``values``, every sample's rows back to back
    (``(sum N_i, *shape)``, contiguous), and ``offsets``, ``N + 1`` ``int64`` row offsets:
    sample ``i`` is ``values[offsets[i]:offsets[i + 1]]``.

    Boxes are ``shape=(4,)`` float32 (xyxy pixels of the stored image), box labels
    ``shape=()`` int64. Images of varying sizes are the ``ragged_image`` kind
    (:class:`~fastdata.shards._ragged_image_kind.RaggedImageKind`): this layout with one
    pixel per row, plus each sample's height and width.
    """

    name = "ragged"
    fixed_size = False

    @classmethod
    def check(cls, spec: FieldSpecLike) -> None:
        if any(side < 1 for side in spec.shape):
            raise ValueError(
                f"ragged field {spec.name!r} needs a row shape of positive sides, got {spec.shape}"
            )
        if spec.axes and len(spec.axes) != len(spec.shape) + 1:
            raise ValueError(
                f"axes {spec.axes!r} of ragged field {spec.name!r} must name the row axis "
                f"and the {len(spec.shape)} axes of shape {spec.shape}"
            )

    @property
    def sample_nbytes(self) -> int:
        return 0

    @cached_property
    def row_nbytes(self) -> int:
        """Bytes of one row (``shape`` of ``dtype``)."""
        spec = self.spec
        return int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize

    def describe(self) -> str:
        spec = self.spec
        return f"ragged {spec.dtype} (N, {', '.join(map(str, spec.shape))})".replace(", )", ")")

    def to_bytes(self, value: Any) -> bytes | memoryview:
        spec = self.spec
        array = np.asarray(value)
        if array.size == 0 and array.ndim <= 1:
            array = array.reshape(0, *spec.shape)
        if array.ndim != len(spec.shape) + 1 or tuple(array.shape[1:]) != spec.shape:
            raise ValueError(
                f"field {spec.name!r} takes shape (N, {', '.join(map(str, spec.shape))}) "
                f"rows, got {array.shape}".replace(", )", ")")
            )
        if array.dtype != np.dtype(spec.dtype):
            if not np.can_cast(array.dtype, np.dtype(spec.dtype), casting="same_kind"):
                raise TypeError(f"field {spec.name!r} takes dtype {spec.dtype}, got {array.dtype}")
            array = array.astype(spec.dtype)
        return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data

    def write(self, h5: h5py.File, column: Column, compression: str | None) -> list[Region]:
        spec = self.spec
        group = h5.create_group(spec.name)
        lengths = np.asarray(column.lengths, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths // self.row_nbytes, out=offsets[1:])
        group.create_dataset("offsets", data=offsets)
        rows = int(offsets[-1])
        values = create_contiguous(group, "values", (rows, *spec.shape), spec.dtype)
        offset = values.id.get_offset()
        total = rows * self.row_nbytes
        if not total or offset is None:
            return []
        return [(column.path, column.offset, offset, total)]

    def open(self, h5: h5py.File, num_samples: int, mapper: Mapper) -> Any:
        spec = self.spec
        values, offsets = checked_values_and_offsets(
            h5,
            spec.name,
            values_key="values",
            dtype=spec.dtype,
            row_shape=spec.shape,
            num_samples=num_samples,
            kind="a ragged",
        )
        return mapper(values), offsets

    def read(self, view: Any, index: int) -> np.ndarray:
        values, offsets = view
        return np.array(values[offsets[index] : offsets[index + 1]])

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
        """One copy per segment touched (a fancy-indexed read of all its rows), split
        into the samples' arrays: the batch's rows never alias the shard."""
        spec = self.spec
        result: list[np.ndarray] = [np.empty((0, *spec.shape), spec.dtype)] * len(segments)
        for segment in np.unique(segments).tolist():
            chosen = np.flatnonzero(segments == segment)
            values, offsets = views(segment)
            starts = offsets[local[chosen]]
            counts = offsets[local[chosen] + 1] - starts
            total = int(counts.sum())
            if total == 0:
                for k in chosen.tolist():
                    result[k] = np.empty((0, *spec.shape), spec.dtype)
                continue
            # row numbers of every chosen sample, back to back
            rows = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(total)
            if isinstance(values, np.ndarray):
                taken = values[rows]
            else:  # an HDF5 dataset: one read of the span, then the rows
                low = int(rows.min())
                taken = np.asarray(values[low : int(rows.max()) + 1])[rows - low]
            pieces = np.split(taken, np.cumsum(counts)[:-1])
            for k, piece in zip(chosen.tolist(), pieces, strict=True):
                result[k] = piece
        return result

    def pack(self, view: Any) -> tuple[Any, np.ndarray | None]:
        return view

    def unpack(self, payload: np.ndarray, offsets: np.ndarray | None, num_samples: int) -> Any:
        return payload.view(self.spec.dtype).reshape(-1, *self.spec.shape), offsets
