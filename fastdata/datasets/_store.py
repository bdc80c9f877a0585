"""Where a dataset's samples live: memory-mapped shards or contiguous RAM buffers.

Both stores present the same small interface to the datasets: fields, segments
(a shard, or the one RAM buffer) with direct array views, and a batched gather that
copies rows in file order, split across a thread pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np

from fastdata._threads import parallel_for
from fastdata.datasets._shm import SharedBuffer
from fastdata.shards import FieldSpec, ShardReader

# Below this many bytes per sample a vectorised fancy-index read beats a copy loop.
_SMALL_SAMPLE_BYTES = 512


class Store:
    """Interface of the sample storage behind a dataset (see the two subclasses)."""

    specs: dict[str, FieldSpec]

    def __len__(self) -> int:
        raise NotImplementedError

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global indices → (segment, index inside it); ``IndexError`` when out of range."""
        raise NotImplementedError

    def array_view(self, field: str, segment: int) -> Any:
        """``(n, *shape)`` array-like of one segment's samples of an array field."""
        raise NotImplementedError

    def encoded_view(self, field: str, segment: int) -> tuple[Any, np.ndarray]:
        """``(blob, offsets)`` of one segment's encoded field."""
        raise NotImplementedError

    def source(self, index: int) -> str:
        """Where sample ``index`` came from, for error messages."""
        raise NotImplementedError

    def close(self) -> None:
        """Release this process's handles or mappings."""

    def gather(
        self,
        field: str,
        indices: np.ndarray,
        out: np.ndarray,
        executor: Executor | None = None,
        tasks: int = 1,
    ) -> None:
        """Copy samples ``indices`` of an array field into ``out[0:len(indices)]``.

        Rows are read in ascending (segment, offset) order, and the copy loop is split
        into ``tasks`` slices on ``executor`` (NumPy releases the GIL while copying).
        """
        segments, local = self.locate(indices)
        small = self.specs[field].sample_nbytes <= _SMALL_SAMPLE_BYTES
        copies: list[tuple[int, Any, int]] = []  # (output row, view, row in view), file order
        for segment in np.unique(segments).tolist():
            positions = np.flatnonzero(segments == segment)
            view = self.array_view(field, segment)
            if not isinstance(view, np.ndarray):  # h5py (chunked): sorted unique rows only
                unique, inverse = np.unique(local[positions], return_inverse=True)
                out[positions] = view[unique][inverse]
            elif small:
                out[positions] = view[local[positions]]
            else:
                order = np.argsort(local[positions], kind="stable")
                rows = local[positions][order].tolist()
                copies += [
                    (p, view, r) for p, r in zip(positions[order].tolist(), rows, strict=True)
                ]

        def body(start: int, stop: int) -> None:
            for position, view, row in copies[start:stop]:
                out[position] = view[row]

        parallel_for(executor, len(copies), body, tasks=tasks)

    def encoded(self, field: str, indices: np.ndarray) -> list[np.ndarray]:
        """Encoded samples as 1-D ``uint8`` arrays (views where the storage allows)."""
        segments, local = self.locate(indices)
        cache: dict[int, tuple[Any, np.ndarray]] = {}
        result = []
        for segment, position in zip(segments.tolist(), local.tolist(), strict=True):
            if segment not in cache:
                cache[segment] = self.encoded_view(field, segment)
            blob, offsets = cache[segment]
            result.append(np.asarray(blob[offsets[position] : offsets[position + 1]]))
        return result


class ShardStore(Store):
    """Samples in a shard set, memory-mapped through a :class:`ShardReader` that opens its
    files lazily in each process (never inherited across ``fork``)."""

    def __init__(self, path: str | Path, fields: Sequence[str]) -> None:
        self.reader = ShardReader(path)
        self.specs = {name: self.reader.field(name) for name in fields}

    def __len__(self) -> int:
        return len(self.reader)

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.reader.locate(indices)

    def array_view(self, field: str, segment: int) -> Any:
        return self.reader.view(field, segment)

    def encoded_view(self, field: str, segment: int) -> tuple[Any, np.ndarray]:
        blob, offsets = self.reader.view(field, segment)
        return blob, offsets

    def source(self, index: int) -> str:
        segments, local = self.locate(np.array([index]))
        shard = self.reader.manifest.shards[int(segments[0])]
        return f"{self.reader.root / shard.file}:{int(local[0])}"

    def close(self) -> None:
        self.reader.close()


class RAMStore(Store):
    """Samples in contiguous shared-memory buffers: per array field one ``(N, *shape)``
    array, per encoded field one flat ``uint8`` blob plus ``int64`` offsets, and the
    sources (file paths) packed the same way. No per-sample Python objects."""

    def __init__(
        self,
        specs: Sequence[FieldSpec],
        buffers: dict[str, SharedBuffer],
        offsets: dict[str, SharedBuffer],
        num_samples: int,
        sources: tuple[SharedBuffer, SharedBuffer] | None = None,
    ) -> None:
        self.specs = {spec.name: spec for spec in specs}
        self.buffers = buffers
        self.offsets = offsets
        self.num_samples = num_samples
        self.sources = sources

    def __len__(self) -> int:
        return self.num_samples

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        indices = np.asarray(indices, dtype=np.int64)
        n = self.num_samples
        if indices.size and (indices.min() < -n or indices.max() >= n):
            bad = indices[(indices < -n) | (indices >= n)][0]
            raise IndexError(f"sample index {int(bad)} out of range for {n} samples")
        return np.zeros(indices.shape, np.int64), np.where(indices < 0, indices + n, indices)

    def array_view(self, field: str, segment: int) -> np.ndarray:
        spec = self.specs[field]
        return self.buffers[field].array.view(spec.dtype).reshape(self.num_samples, *spec.shape)

    def encoded_view(self, field: str, segment: int) -> tuple[np.ndarray, np.ndarray]:
        return self.buffers[field].array, self.offsets[field].array.view(np.int64)

    def source(self, index: int) -> str:
        if self.sources is None:
            return f"sample {index}"
        blob, offsets = self.sources[0].array, self.sources[1].array.view(np.int64)
        return bytes(blob[offsets[index] : offsets[index + 1]]).decode()

    @property
    def nbytes(self) -> int:
        held = [*self.buffers.values(), *self.offsets.values(), *(self.sources or ())]
        return sum(buffer.nbytes for buffer in held)

    def field_nbytes(self) -> dict[str, int]:
        """Bytes per field (payload plus offsets), and ``"sources"`` when paths are kept."""
        sizes = {
            name: buffer.nbytes + (self.offsets[name].nbytes if name in self.offsets else 0)
            for name, buffer in self.buffers.items()
        }
        if self.sources is not None:
            sizes["sources"] = self.sources[0].nbytes + self.sources[1].nbytes
        return sizes

    def close(self) -> None:
        for buffer in [*self.buffers.values(), *self.offsets.values(), *(self.sources or ())]:
            buffer.close()
