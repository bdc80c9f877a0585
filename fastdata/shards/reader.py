"""``ShardReader``: random access to a shard set by field and sample index."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from fastdata._gather import gather_encoded, gather_rows, locate
from fastdata.errors import ShardFormatError
from fastdata.shards._schema import (
    FORMAT_NAME,
    FORMAT_VERSION,
    NUMERIC_KINDS,
    FieldSpec,
    Manifest,
    ShardInfo,
    load_manifest,
)


class OpenShard:
    """The open HDF5 file of one shard and fast views of its fields (one process only).

    Opening checks the file against its manifest entry before anything is mapped (see
    docs/FORMAT.md, "What readers check"): a regular file of the recorded size, the format
    attributes, the job identity, and per field the dataset's kind, dtype, shape, storage
    and, for encoded fields, the offsets. Any difference raises :class:`ShardFormatError`.
    """

    def __init__(
        self, path: Path, info: ShardInfo, fields: Sequence[FieldSpec], use_mmap: bool
    ) -> None:
        self.path = path
        self.file_bytes = _check_file(path, info)
        try:
            self.h5 = h5py.File(path, "r")
        except OSError as exc:
            raise ShardFormatError(f"cannot open shard ({exc})", path) from exc
        self.arrays: dict[str, Any] = {}  # mapped np.ndarray when contiguous, else h5py.Dataset
        self.offsets: dict[str, np.ndarray] = {}
        self.blobs: dict[str, Any] = {}
        try:
            _check_attributes(self.h5, info)
            n = info.num_samples
            for spec in fields:
                if spec.kind == "array":
                    ds = _dataset(self.h5, spec.name, spec.dtype, (n, *spec.shape))
                    self.arrays[spec.name] = self._view(ds, use_mmap)
                else:
                    group = self.h5.get(spec.name)
                    if not isinstance(group, h5py.Group):
                        raise ValueError(f"field {spec.name!r} is not a group of an encoded field")
                    offsets_ds = _dataset(group, "offsets", "int64", (n + 1,))
                    offsets = np.asarray(offsets_ds[()])
                    data = group.get("data")
                    size = data.shape[0] if isinstance(data, h5py.Dataset) and data.ndim else 0
                    data = _dataset(group, "data", "uint8", (size,))
                    if offsets[0] != 0 or offsets[-1] != size or np.any(np.diff(offsets) < 0):
                        raise ValueError(
                            f"offsets of field {spec.name!r} do not run from 0 up to {size}"
                        )
                    self.offsets[spec.name] = offsets
                    self.blobs[spec.name] = self._view(data, use_mmap)
        except (ValueError, KeyError, OSError) as exc:
            self.h5.close()
            raise ShardFormatError(f"shard does not match the manifest: {exc}", path) from exc

    def _view(self, ds: h5py.Dataset, use_mmap: bool) -> Any:
        """A memory map of a contiguous uncompressed dataset; the dataset itself otherwise.

        The map is returned as a plain ``np.ndarray`` (it keeps the map alive): indexing an
        ``np.memmap`` runs Python-level hooks on every row, a per-sample cost that a
        batched read would pay once per sample. Only checked numeric dtypes reach this
        point, and only regions inside the file are mapped (a region past the end would
        raise SIGBUS on first touch).
        """
        if use_mmap and ds.chunks is None and ds.compression is None and ds.size > 0:
            offset = ds.id.get_offset()
            if offset is not None:
                if offset + ds.nbytes > self.file_bytes:
                    raise ValueError(
                        f"dataset {ds.name!r} lies past the end of the file "
                        f"({offset + ds.nbytes} > {self.file_bytes} bytes)"
                    )
                mapped = np.memmap(self.path, ds.dtype, "r", offset=offset, shape=ds.shape)
                return mapped.view(np.ndarray)
        return ds

    def close(self) -> None:
        self.arrays.clear()
        self.blobs.clear()
        self.h5.close()


def open_shard(
    path: Path, info: ShardInfo, fields: Sequence[FieldSpec], *, use_mmap: bool = True
) -> OpenShard:
    """Open and check one shard file against its manifest entry (see :class:`OpenShard`)."""
    return OpenShard(path, info, fields, use_mmap)


def _check_file(path: Path, info: ShardInfo) -> int:
    """The size of ``path`` after checking it is a regular file of the recorded size (a FIFO
    would block the open; a truncated file would raise SIGBUS when mapped)."""
    try:
        status = path.stat()
    except OSError as exc:
        raise ShardFormatError(f"cannot open shard ({exc.strerror or exc})", path) from exc
    if not stat.S_ISREG(status.st_mode):
        raise ShardFormatError("shard is not a regular file", path)
    if status.st_size != info.num_bytes:
        raise ShardFormatError(
            f"shard is {status.st_size} bytes, the manifest records {info.num_bytes} "
            "(truncated, or rewritten after the manifest was read: reopen the dataset, "
            "and run `fastdata verify`)",
            path,
        )
    return status.st_size


def _check_attributes(h5: h5py.File, info: ShardInfo) -> None:
    """The root attributes: format, version, sample count and the job identity."""
    attrs = h5.attrs
    if _text(attrs.get("format")) != FORMAT_NAME:
        raise ValueError(f"not a {FORMAT_NAME} shard")
    if _integer(attrs.get("version")) != FORMAT_VERSION:
        raise ValueError(f"shard format version {attrs.get('version')} is not {FORMAT_VERSION}")
    if _integer(attrs.get("num_samples")) != info.num_samples:
        raise ValueError(
            f"it holds {attrs.get('num_samples')} samples, the manifest records {info.num_samples}"
        )
    for key in ("job", "inputs"):
        expected = getattr(info, key)
        if expected and _text(attrs.get(key)) != expected:
            raise ValueError(
                f"its {key} attribute {_text(attrs.get(key))!r:.20} is not the manifest's "
                f"{expected!r:.20}: the shard was rewritten after the manifest was read "
                "(reopen the dataset)"
            )


def _integer(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, np.integer)) else None


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else None


def _dataset(parent: h5py.Group, name: str, dtype: str, shape: tuple[int, ...]) -> h5py.Dataset:
    """``parent[name]`` after checking it is a plain dataset of ``dtype`` and ``shape``:
    never a variable-length, string or compound type, external or virtual storage."""
    ds = parent.get(name)
    where = f"{parent.name.rstrip('/')}/{name}"
    if not isinstance(ds, h5py.Dataset):
        raise ValueError(f"{where} is missing or not a dataset")
    if ds.dtype != np.dtype(dtype) or ds.dtype.kind not in NUMERIC_KINDS or ds.dtype.metadata:
        raise ValueError(f"{where} has dtype {ds.dtype}, the manifest records {dtype}")
    if ds.shape != shape:
        raise ValueError(f"{where} has shape {ds.shape}, the manifest records {shape}")
    if ds.external or ds.is_virtual:
        raise ValueError(f"{where} keeps its data outside the shard file")
    return ds


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
        self._open: dict[int, OpenShard] = {}
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
        return locate(self._starts, indices)

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
            return gather_encoded(lambda shard: self.view(field, shard), shard_ids, local_ids)
        shape = (len(index_array), *spec.shape)
        if out is None:
            out = np.empty(shape, dtype=spec.dtype)
        elif out.shape != shape or out.dtype != np.dtype(spec.dtype):
            raise ValueError(
                f"out must have shape {shape} and dtype {spec.dtype}, got {out.shape} {out.dtype}"
            )
        try:
            gather_rows(
                lambda shard: self.view(field, shard),
                shard_ids,
                local_ids,
                out,
                sample_nbytes=spec.sample_nbytes,
            )
        except OSError as exc:  # h5py reading a damaged chunk
            raise ShardFormatError(f"cannot read field {field!r} ({exc})", self.root) from exc
        return out

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

    def _shard(self, shard_id: int) -> OpenShard:
        if self._pid != os.getpid():  # forked: handles of the parent must not be used here
            self._open = {}
            self._pid = os.getpid()
        shard = self._open.get(shard_id)
        if shard is None:
            info = self.manifest.shards[shard_id]
            shard = OpenShard(self.root / info.file, info, self.manifest.fields, self.use_mmap)
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
