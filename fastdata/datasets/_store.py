"""Where a dataset's samples live: memory-mapped shards or contiguous RAM buffers.

Both stores present the same small interface to the datasets: fields, segments
(a shard, or the one RAM buffer) with direct views, and a batched gather that copies
rows in file order, split across a thread pool. Indexing is :func:`fastdata._gather.locate`
and gathering each field's kind (:class:`~fastdata.shards.FieldKind`), which
:class:`~fastdata.shards.ShardReader` uses too.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np

from fastdata._gather import locate
from fastdata.datasets._shm import SharedBuffer
from fastdata.shards import FieldSpec, ShardReader, load_manifest


class Store:
    """Interface of the sample storage behind a dataset (see the two subclasses)."""

    specs: dict[str, FieldSpec]

    def __len__(self) -> int:
        raise NotImplementedError

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global indices → (segment, index inside it); ``IndexError`` when out of range."""
        raise NotImplementedError

    def view(self, field: str, segment: int) -> Any:
        """One segment's samples of ``field`` as its kind views them: an ``(n, *shape)``
        array-like for an array field, ``(blob, offsets)`` for an encoded one."""
        raise NotImplementedError

    def source(self, index: int) -> str:
        """Where sample ``index`` came from, for error messages."""
        raise NotImplementedError

    def close(self) -> None:
        """Release this process's handles or mappings."""

    def begin_batch(self, indices: np.ndarray) -> None:
        """The samples one batch is about to read (a store may release what it no longer
        needs)."""

    def gather(
        self,
        field: str,
        indices: np.ndarray,
        out: np.ndarray | None = None,
        executor: Executor | None = None,
        tasks: int = 1,
    ) -> np.ndarray | list[np.ndarray]:
        """Samples ``indices`` of ``field``: fixed-size ones copied into ``out`` (or a new
        array), variable-size ones as a list of arrays (1-D ``uint8`` for encoded fields;
        views where the storage allows).

        Rows are read in ascending (segment, offset) order, and the copy loop is split
        into ``tasks`` slices on ``executor`` (see :func:`fastdata._gather.gather_rows`).
        """
        segments, local = self.locate(indices)
        return self.specs[field].field_kind.gather(
            lambda segment: self.view(field, segment),
            segments,
            local,
            out,
            executor=executor,
            tasks=tasks,
        )

    def rows(self, field: str, indices: np.ndarray) -> list[np.ndarray] | None:
        """Read-only views of samples ``indices`` of an array field, without copying
        (``None`` when a segment is not memory-mapped, e.g. compressed shards)."""
        segments, local = self.locate(indices)
        views = {s: self.view(field, s) for s in np.unique(segments).tolist()}
        if not all(isinstance(view, np.ndarray) for view in views.values()):
            return None
        return [views[s][i] for s, i in zip(segments.tolist(), local.tolist(), strict=True)]


class ShardStore(Store):
    """Samples in a shard set, memory-mapped through a :class:`ShardReader` that opens its
    files lazily in each process (never inherited across ``fork``)."""

    def __init__(self, path: str | Path, fields: Sequence[str], **cache: Any) -> None:
        self.reader = ShardReader(path, **cache)  # cache: cache_dir, cache_limit (remote)
        self.specs = {name: self.reader.field(name) for name in fields}

    def __len__(self) -> int:
        return len(self.reader)

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.reader.locate(indices)

    def view(self, field: str, segment: int) -> Any:
        return self.reader.view(field, segment)

    def begin_batch(self, indices: np.ndarray) -> None:
        # shards this batch does not read are closed: a capped cache can then evict them
        # rather than read shards into memory
        self.reader.close_unused(self.locate(indices)[0])

    def source(self, index: int) -> str:
        segments, local = self.locate(np.array([index]))
        shard = self.reader.manifest.shards[int(segments[0])]
        return f"{self.reader.files.where(shard.file)}:{int(local[0])}"

    def close(self) -> None:
        self.reader.close()


class RAMStore(Store):
    """Samples in contiguous shared-memory buffers: per field its kind's packed payload
    (an array field's ``(N, *shape)`` rows, an encoded field's flat ``uint8`` blob) plus
    ``int64`` offsets where samples vary in size, and the sources (file paths) packed the
    same way. No per-sample Python objects."""

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
        self._starts = np.array([0, num_samples], np.int64)  # one segment

    def __len__(self) -> int:
        return self.num_samples

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return locate(self._starts, indices)

    def view(self, field: str, segment: int) -> Any:
        offsets = self.offsets.get(field)
        return self.specs[field].field_kind.unpack(
            self.buffers[field].array,
            None if offsets is None else offsets.array.view(np.int64),
            self.num_samples,
        )

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


def known_fields(path: str | Path, fields: Sequence[str]) -> Sequence[str]:
    """``fields`` after checking the manifest stores each of them."""
    stored = [spec.name for spec in load_manifest(path).fields]
    missing = [name for name in fields if name not in stored]
    if missing:
        raise ValueError(
            f"fields {missing} are not in the shard set {path}; stored fields: {stored}"
        )
    return fields
