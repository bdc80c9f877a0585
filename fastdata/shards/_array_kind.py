"""The ``array`` kind: a fixed shape and dtype per sample."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from fastdata._gather import gather_rows
from fastdata.shards._field_kind import (
    COPY_BLOCK_BYTES,
    Column,
    FieldKind,
    FieldSpecLike,
    Mapper,
    Region,
    checked_dataset,
    create_contiguous,
)

if TYPE_CHECKING:
    import h5py


class ArrayKind(FieldKind):
    """A fixed ``shape`` and ``dtype`` per sample, stored as one ``(N, *shape)`` dataset
    named after the field (contiguous when uncompressed, so readers can map it; with
    compression chunked one sample per chunk)."""

    name = "array"
    fixed_size = True

    @classmethod
    def check(cls, spec: FieldSpecLike) -> None:
        if spec.axes and len(spec.axes) != len(spec.shape):
            raise ValueError(
                f"axes {spec.axes!r} of field {spec.name!r} does not match shape {spec.shape}"
            )

    @cached_property
    def sample_nbytes(self) -> int:
        spec = self.spec
        return int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize

    @property
    def sample_axes(self) -> str:
        return self.spec.axes

    @property
    def image_size(self) -> tuple[int, int] | None:
        shape, axes = self.spec.shape, self.spec.axes
        if len(shape) == 2:
            return shape[0], shape[1]
        if len(shape) == 3:
            return (shape[1], shape[2]) if axes == "CHW" else (shape[0], shape[1])
        return None

    def describe(self) -> str:
        spec = self.spec
        return f"{spec.dtype} {tuple(spec.shape)} {spec.axes}".rstrip()

    def to_bytes(self, value: Any) -> bytes | memoryview:
        spec = self.spec
        array = np.asarray(value)
        if array.shape != spec.shape:
            raise ValueError(f"field {spec.name!r} takes shape {spec.shape}, got {array.shape}")
        if array.dtype != np.dtype(spec.dtype):
            if array.ndim == 0 and np.can_cast(array, np.dtype(spec.dtype), casting="same_kind"):
                array = array.astype(spec.dtype)
            else:
                raise TypeError(f"field {spec.name!r} takes dtype {spec.dtype}, got {array.dtype}")
        return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data  # no copy

    def preallocate(self, h5: h5py.File, max_samples: int) -> int | None:
        spec = self.spec
        ds = create_contiguous(h5, spec.name, (max_samples, *spec.shape), spec.dtype)
        ds.attrs["axes"] = spec.axes
        offset = ds.id.get_offset()
        if offset is None:
            raise OSError(f"HDF5 gave no offset for field {spec.name!r} of {h5.filename}")
        return int(offset)

    def write(self, h5: h5py.File, column: Column, compression: str | None) -> list[Region]:
        spec, n = self.spec, column.num_samples
        shape = (n, *spec.shape)
        sample_nbytes = self.sample_nbytes
        if compression is None or n == 0 or sample_nbytes == 0:
            ds = create_contiguous(h5, spec.name, shape, spec.dtype)
            ds.attrs["axes"] = spec.axes
            offset = ds.id.get_offset()
            nbytes = n * sample_nbytes
            return (
                [(column.path, column.offset, offset, nbytes)]
                if nbytes and offset is not None
                else []
            )
        ds = h5.create_dataset(
            spec.name,
            shape=shape,
            dtype=spec.dtype,
            chunks=(1, *spec.shape),
            compression=compression,
        )
        ds.attrs["axes"] = spec.axes
        rows = np.memmap(column.path, dtype=spec.dtype, mode="r", offset=column.offset, shape=shape)
        rows_per_block = max(1, COPY_BLOCK_BYTES // sample_nbytes)
        for start in range(0, n, rows_per_block):
            ds[start : start + rows_per_block] = rows[start : start + rows_per_block]
        del rows
        return []

    def open(self, h5: h5py.File, num_samples: int, mapper: Mapper) -> Any:
        spec = self.spec
        return mapper(checked_dataset(h5, spec.name, spec.dtype, (num_samples, *spec.shape)))

    def read(self, view: Any, index: int) -> np.ndarray:
        return np.asarray(view[index])

    def gather(
        self,
        views: Callable[[int], Any],
        segments: np.ndarray,
        local: np.ndarray,
        out: np.ndarray | None = None,
        *,
        executor: Executor | None = None,
        tasks: int = 1,
    ) -> np.ndarray:
        spec = self.spec
        shape = (len(segments), *spec.shape)
        if out is None:
            out = np.empty(shape, dtype=spec.dtype)
        elif out.shape != shape or out.dtype != np.dtype(spec.dtype):
            raise ValueError(
                f"out must have shape {shape} and dtype {spec.dtype}, got {out.shape} {out.dtype}"
            )
        gather_rows(
            views,
            segments,
            local,
            out,
            sample_nbytes=self.sample_nbytes,
            executor=executor,
            tasks=tasks,
        )
        return out

    def pack(self, view: Any) -> tuple[Any, np.ndarray | None]:
        return view, None

    def unpack(self, payload: np.ndarray, offsets: np.ndarray | None, num_samples: int) -> Any:
        return payload.view(self.spec.dtype).reshape(num_samples, *self.spec.shape)
