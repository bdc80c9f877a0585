"""The ``ragged_image`` kind: per sample an image of its own height and width (raw pixels,
no codec), for images stored with their aspect ratio kept."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fastdata.shards._field_kind import (
    Column,
    FieldSpecLike,
    Mapper,
    Region,
    checked_dataset,
    create_contiguous,
)
from fastdata.shards._ragged_kind import RaggedKind

if TYPE_CHECKING:
    import h5py

# Each sample's spilled bytes start with its (height, width) as two little-endian int64,
# read back when the shard is written; the stored pixels carry no header.
_HEADER = np.dtype("<i8")
HEADER_NBYTES = 2 * _HEADER.itemsize


class RaggedImageKind(RaggedKind):
    """Per sample an ``(H_i, W_i, *shape)`` array of ``dtype`` (``shape`` the manifest's:
    ``(C,)`` for ``HWC`` images, ``()`` for ``HW``), ``H_i, W_i >= 1`` varying per sample.

    Stored as a group named after the field holding ``values``, every sample's pixels
    back to back in row-major order (``(sum H_i * W_i, *shape)``, contiguous), ``offsets``,
    ``N + 1`` ``int64`` pixel offsets, and ``sizes``, ``(N, 2)`` ``int64`` ``(H_i, W_i)``:
    sample ``i`` is ``values[offsets[i]:offsets[i + 1]].reshape(H_i, W_i, *shape)``. A
    batch is read with one copy per shard touched, as the ``ragged`` kind reads its rows
    (pixels are its rows), and is a list of arrays.
    """

    name = "ragged_image"
    fixed_size = False
    #: The RAM copy's offsets carry ``(pixel offset, H_i, W_i)`` per sample.
    offset_columns: ClassVar[int] = 3

    @classmethod
    def check(cls, spec: FieldSpecLike) -> None:
        if len(spec.shape) > 1 or any(side < 1 for side in spec.shape):
            raise ValueError(
                f"ragged_image field {spec.name!r} needs shape (C,) with C >= 1 (HWC images) "
                f"or () (HW images), got {spec.shape}"
            )
        if spec.axes and len(spec.axes) != len(spec.shape) + 2:
            raise ValueError(
                f"axes {spec.axes!r} of ragged_image field {spec.name!r} must name height, "
                f"width and the {len(spec.shape)} axes of shape {spec.shape}"
            )

    @property
    def sample_axes(self) -> str:
        return self.spec.axes or ("HWC" if self.spec.shape else "HW")

    @property
    def variable_images(self) -> bool:
        return True

    def describe(self) -> str:
        spec = self.spec
        tail = "".join(f", {side}" for side in spec.shape)
        return f"ragged_image {spec.dtype} (H, W{tail})"

    def to_bytes(self, value: Any) -> bytes | memoryview:
        spec = self.spec
        array = np.asarray(value)
        tail = "".join(f", {side}" for side in spec.shape)
        if array.ndim != len(spec.shape) + 2 or tuple(array.shape[2:]) != spec.shape:
            raise ValueError(f"field {spec.name!r} takes shape (H, W{tail}), got {array.shape}")
        if min(array.shape[:2]) < 1:
            raise ValueError(f"field {spec.name!r} takes images of at least 1x1, got {array.shape}")
        if array.dtype != np.dtype(spec.dtype):
            raise TypeError(f"field {spec.name!r} takes dtype {spec.dtype}, got {array.dtype}")
        header = np.array(array.shape[:2], _HEADER).tobytes()
        return header + np.ascontiguousarray(array).tobytes()

    def write(self, h5: h5py.File, column: Column, compression: str | None) -> list[Region]:
        spec = self.spec
        lengths = np.asarray(column.lengths, dtype=np.int64)
        starts = column.offset + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        sizes = np.zeros((len(lengths), 2), np.int64)
        if len(lengths):
            fd = os.open(column.path, os.O_RDONLY)
            try:
                for k, start in enumerate(starts.tolist()):
                    header = os.pread(fd, HEADER_NBYTES, start)
                    sizes[k] = np.frombuffer(header, _HEADER)
            finally:
                os.close(fd)
        pixels = sizes[:, 0] * sizes[:, 1]
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(pixels, out=offsets[1:])
        group = h5.create_group(spec.name)
        group.create_dataset("offsets", data=offsets)
        group.create_dataset("sizes", data=sizes)
        values = create_contiguous(group, "values", (int(offsets[-1]), *spec.shape), spec.dtype)
        base = values.id.get_offset()
        if not offsets[-1] or base is None:
            return []
        row = self.row_nbytes
        return [
            (column.path, int(start) + HEADER_NBYTES, base + int(first) * row, int(count) * row)
            for start, first, count in zip(starts, offsets[:-1], pixels, strict=True)
        ]

    def open(self, h5: h5py.File, num_samples: int, mapper: Mapper) -> Any:
        values, offsets = super().open(h5, num_samples, mapper)
        group = h5[self.spec.name]
        sizes = np.asarray(checked_dataset(group, "sizes", "int64", (num_samples, 2))[()])
        if np.any(sizes < 1) or np.any(sizes[:, 0] * sizes[:, 1] != np.diff(offsets)):
            raise ValueError(
                f"sizes of field {self.spec.name!r} are not the pixel counts between its offsets"
            )
        return values, offsets, sizes

    def read(self, view: Any, index: int) -> np.ndarray:
        values, offsets, sizes = view
        height, width = sizes[index].tolist()
        pixels = values[offsets[index] : offsets[index + 1]]
        return np.array(pixels).reshape(height, width, *self.spec.shape)

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
        """Each image one slice copy of its pixels from a mapped shard or a RAM copy (one
        read of the span per segment from an HDF5 dataset), viewed as its
        ``(H_i, W_i, *shape)`` image: the images never alias the shard."""
        tail = self.spec.shape
        result: list[np.ndarray] = [np.empty((0, 0, *tail), self.spec.dtype)] * len(segments)
        for segment in np.unique(segments).tolist():
            chosen = np.flatnonzero(segments == segment)
            values, offsets, sizes = views(segment)
            picked = local[chosen]
            starts, stops = offsets[picked].tolist(), offsets[picked + 1].tolist()
            if isinstance(values, np.ndarray):
                span, low = values, 0
            else:  # an HDF5 dataset: one read of the span
                low = min(starts)
                span = np.asarray(values[low : max(stops)])
            shapes = sizes[picked].tolist()
            for k, start, stop, (height, width) in zip(
                chosen.tolist(), starts, stops, shapes, strict=True
            ):
                pixels = span[start - low : stop - low]
                result[k] = pixels.reshape(height, width, *tail).copy()
        return result

    def pack(self, view: Any) -> tuple[Any, np.ndarray | None]:
        values, offsets, sizes = view
        columns = np.zeros((len(offsets), self.offset_columns), np.int64)
        columns[:, 0] = offsets
        columns[:-1, 1:] = sizes
        return values, columns

    def unpack(self, payload: np.ndarray, offsets: np.ndarray | None, num_samples: int) -> Any:
        if offsets is None:
            raise ValueError(f"field {self.spec.name!r} needs its offsets and sizes")
        columns = offsets.reshape(num_samples + 1, self.offset_columns)
        values = payload.view(self.spec.dtype).reshape(-1, *self.spec.shape)
        return values, columns[:, 0], columns[:-1, 1:]
