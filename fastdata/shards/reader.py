"""``ShardReader``: random access to a shard set by field and sample index."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from fastdata.errors import ShardFormatError
from fastdata.shards._schema import FieldSpec, Manifest, load_manifest


class _OpenShard:
    """The open HDF5 file of one shard and fast views of its fields (one process only)."""

    def __init__(self, path: Path, fields: Sequence[FieldSpec], use_mmap: bool) -> None:
        self.path = path
        try:
            self.h5 = h5py.File(path, "r")
        except OSError as exc:
            raise ShardFormatError(f"cannot open shard ({exc})", path) from exc
        self.arrays: dict[str, Any] = {}  # mapped np.ndarray when contiguous, else h5py.Dataset
        self.offsets: dict[str, np.ndarray] = {}
        self.blobs: dict[str, Any] = {}
        try:
            for spec in fields:
                if spec.kind == "array":
                    self.arrays[spec.name] = self._view(self.h5[spec.name], use_mmap)
                else:
                    group = self.h5[spec.name]
                    self.offsets[spec.name] = group["offsets"][()]
                    self.blobs[spec.name] = self._view(group["data"], use_mmap)
        except KeyError as exc:
            self.h5.close()
            raise ShardFormatError(f"shard lacks a field the manifest lists ({exc})", path) from exc

    def _view(self, ds: h5py.Dataset, use_mmap: bool) -> Any:
        """A memory map of a contiguous uncompressed dataset; the dataset itself otherwise.

        The map is returned as a plain ``np.ndarray`` (it keeps the map alive): indexing an
        ``np.memmap`` runs Python-level hooks on every row, a per-sample cost that a
        batched read would pay once per sample.
        """
        if use_mmap and ds.chunks is None and ds.compression is None and ds.size > 0:
            offset = ds.id.get_offset()
            if offset is not None:
                mapped = np.memmap(self.path, ds.dtype, "r", offset=offset, shape=ds.shape)
                return mapped.view(np.ndarray)
        return ds

    def close(self) -> None:
        self.arrays.clear()
        self.blobs.clear()
        self.h5.close()


class ShardReader:
    """Reads samples of a ``fastdata preprocess`` output by field and global index.

    Files are opened lazily, once per process: a reader created in the main process and
    pickled or forked into DataLoader workers opens its own handles there. Uncompressed
    array fields are memory-mapped (a sample is then one memory copy, not an HDF5 call).

    Args:
        root: The shard folder (or its ``index.json``).
        use_mmap: Memory-map contiguous datasets (default). ``False`` reads through h5py.

    Example:
        >>> reader = ShardReader("out/")                          # doctest: +SKIP
        >>> image = reader.read("image", 0)                      # (H, W, C) uint8
        >>> batch = reader.read_batch("image", [5, 1, 9])         # (3, H, W, C) uint8
    """

    def __init__(self, root: str | Path, *, use_mmap: bool = True) -> None:
        self.manifest: Manifest = load_manifest(root)
        root = Path(root)
        self.root = root.parent if root.suffix == ".json" else root
        self.use_mmap = use_mmap
        counts = np.array([s.num_samples for s in self.manifest.shards], dtype=np.int64)
        self._starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self._starts[1:])
        self._open: dict[int, _OpenShard] = {}
        self._pid = os.getpid()

    # -- basics ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def fields(self) -> list[FieldSpec]:
        return self.manifest.fields

    def field(self, name: str) -> FieldSpec:
        return self.manifest.field(name)

    def locate(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global indices → (shard number, index inside that shard), vectorised."""
        indices = np.asarray(indices, dtype=np.int64)
        n = len(self)
        if indices.size and (indices.min() < -n or indices.max() >= n):
            bad = indices[(indices < -n) | (indices >= n)][0]
            raise IndexError(f"sample index {int(bad)} out of range for {n} samples")
        indices = np.where(indices < 0, indices + n, indices)
        shard = np.searchsorted(self._starts, indices, side="right") - 1
        return shard, indices - self._starts[shard]

    # -- reading --------------------------------------------------------------------------
    def read(self, field: str, index: int) -> np.ndarray:
        """One sample of ``field``: an array of the field's shape and dtype, or for an
        encoded field its bytes as a 1-D ``uint8`` array."""
        spec = self.manifest.field(field)
        shard_ids, local_ids = self.locate(np.array([index]))
        shard = self._shard(int(shard_ids[0]))
        local = int(local_ids[0])
        try:
            if spec.kind == "array":
                return np.asarray(shard.arrays[field][local])
            offsets = shard.offsets[field]
            return np.asarray(shard.blobs[field][offsets[local] : offsets[local + 1]])
        except OSError as exc:
            raise ShardFormatError(
                f"cannot read field {field!r} ({exc})", shard.path, index
            ) from exc

    def read_batch(
        self, field: str, indices: Sequence[int] | np.ndarray, out: np.ndarray | None = None
    ) -> np.ndarray | list[np.ndarray]:
        """Several samples of ``field``, in the order given.

        Indices are grouped by shard and read in ascending order, in as few calls as the
        storage allows. Array fields come back stacked, ``(len(indices), *shape)``,
        written into ``out`` when given (e.g. a reused or pinned buffer); encoded fields
        as a list of 1-D ``uint8`` arrays.
        """
        spec = self.manifest.field(field)
        index_array = np.asarray(indices, dtype=np.int64)
        shard_ids, local_ids = self.locate(index_array)
        if spec.kind == "encoded":
            return self._read_encoded(field, shard_ids, local_ids)
        shape = (len(index_array), *spec.shape)
        if out is None:
            out = np.empty(shape, dtype=spec.dtype)
        elif out.shape != shape or out.dtype != np.dtype(spec.dtype):
            raise ValueError(
                f"out must have shape {shape} and dtype {spec.dtype}, got {out.shape} {out.dtype}"
            )
        for shard_id in np.unique(shard_ids):
            positions = np.flatnonzero(shard_ids == shard_id)
            shard = self._shard(int(shard_id))
            source = shard.arrays[field]
            locals_ = local_ids[positions]
            try:
                if isinstance(source, np.ndarray):  # memory-mapped
                    # One memcpy per sample into ``out``: fancy indexing would build a
                    # temporary and copy every sample twice.
                    for position, local in zip(positions.tolist(), locals_.tolist(), strict=True):
                        out[position] = source[local]
                else:
                    order = np.argsort(locals_, kind="stable")
                    unique, inverse = np.unique(locals_[order], return_inverse=True)
                    block = source[unique]  # h5py needs increasing, unique indices
                    out[positions[order]] = block[inverse]
            except OSError as exc:
                raise ShardFormatError(f"cannot read field {field!r} ({exc})", shard.path) from exc
        return out

    def _read_encoded(
        self, field: str, shard_ids: np.ndarray, local_ids: np.ndarray
    ) -> list[np.ndarray]:
        result: list[np.ndarray] = []
        for shard_id, local in zip(shard_ids.tolist(), local_ids.tolist(), strict=True):
            shard = self._shard(shard_id)
            offsets = shard.offsets[field]
            result.append(np.asarray(shard.blobs[field][offsets[local] : offsets[local + 1]]))
        return result

    def view(self, field: str, shard_id: int) -> Any:
        """Direct access to one shard's field, opened in this process on first use.

        Returns:
            For an array field, the ``(n, *shape)`` samples of shard ``shard_id``: a
            read-only memory-mapped ``np.ndarray`` when the dataset is contiguous and
            uncompressed (and ``use_mmap``), else the ``h5py.Dataset``. For an encoded field,
            ``(data, offsets)``: the flat ``uint8`` blob (mapped array or dataset) and its
            ``int64`` offsets, ``n + 1`` entries.
        """
        spec = self.manifest.field(field)
        if not 0 <= shard_id < len(self.manifest.shards):
            raise IndexError(
                f"shard {shard_id} out of range for {len(self.manifest.shards)} shards"
            )
        shard = self._shard(shard_id)
        if spec.kind == "array":
            return shard.arrays[field]
        return shard.blobs[field], shard.offsets[field]

    def _shard(self, shard_id: int) -> _OpenShard:
        if self._pid != os.getpid():  # forked: handles of the parent must not be used here
            self._open = {}
            self._pid = os.getpid()
        shard = self._open.get(shard_id)
        if shard is None:
            info = self.manifest.shards[shard_id]
            shard = _OpenShard(self.root / info.file, self.manifest.fields, self.use_mmap)
            self._open[shard_id] = shard
        return shard

    def close(self) -> None:
        """Close every open file of this process (reopened on the next read)."""
        if self._pid == os.getpid():
            for shard in self._open.values():
                shard.close()
        self._open = {}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_open"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._pid = os.getpid()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown h5py may be gone
            self.close()
