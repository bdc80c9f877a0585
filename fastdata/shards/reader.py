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

from fastdata._gather import locate
from fastdata.errors import ShardFormatError
from fastdata.shards._schema import (
    FORMAT_NAME,
    FORMAT_VERSION,
    FieldSpec,
    Manifest,
    ShardInfo,
    load_manifest,
)


class OpenShard:
    """The open HDF5 file of one shard and fast views of its fields (one process only).

    Opening checks the file against its manifest entry before anything is mapped (see
    docs/FORMAT.md, "What readers check"): a regular file of the recorded size, the format
    attributes, the job identity, and per field what its kind checks (datasets, dtype,
    shape, storage, offsets). Any difference raises :class:`ShardFormatError`.
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
        # field name -> what its kind's open() returned (mapped arrays where it can)
        self.views: dict[str, Any] = {}
        try:
            _check_attributes(self.h5, info)
            for spec in fields:
                self.views[spec.name] = spec.field_kind.open(
                    self.h5, info.num_samples, lambda ds: self._view(ds, use_mmap)
                )
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
        self.views.clear()
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
            return spec.field_kind.read(shard.views[field], local)
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
        shard_ids, local_ids = self.locate(np.asarray(indices, dtype=np.int64))
        try:
            return spec.field_kind.gather(
                lambda shard: self.view(field, shard), shard_ids, local_ids, out
            )
        except OSError as exc:  # h5py reading a damaged chunk
            raise ShardFormatError(f"cannot read field {field!r} ({exc})", self.root) from exc

    def view(self, field: str, shard_id: int) -> Any:
        """Direct access to one shard's field, opened in this process on first use.

        Returns:
            What the field's kind opened (:meth:`FieldKind.open`). For an array field, the
            ``(n, *shape)`` samples of shard ``shard_id``: a read-only memory-mapped
            ``np.ndarray`` when the dataset is contiguous and uncompressed (and
            ``use_mmap``), else the ``h5py.Dataset``. For an encoded field,
            ``(data, offsets)``: the flat ``uint8`` blob (mapped array or dataset) and its
            ``int64`` offsets, ``n + 1`` entries.
        """
        self.manifest.field(field)  # KeyError naming the stored fields
        if not 0 <= shard_id < len(self.manifest.shards):
            raise IndexError(
                f"shard {shard_id} out of range for {len(self.manifest.shards)} shards"
            )
        return self._shard(shard_id).views[field]

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
