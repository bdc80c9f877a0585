"""``ShardWriter``: writes one HDF5 shard file atomically."""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import h5py
import numpy as np

from fastdata.shards._checksum import file_sha256
from fastdata.shards._schema import FORMAT_NAME, FORMAT_VERSION, FieldSpec, ShardInfo, fsync_dir

COMPRESSIONS = ("gzip", "lzf")
_COPY_BLOCK_BYTES = 64 << 20
# copy_file_range errors that mean "not here" (cross-device before Linux 5.3, file systems
# without support, seccomp filters): the copy goes through pread/pwrite instead.
_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})

SampleValue = np.ndarray | bytes | int | str


class ShardWriter:
    """Writes samples into one HDF5 shard that becomes visible only when complete.

    Samples are appended to per-field spill files next to the target; ``close()`` builds
    the HDF5 file under a temporary name with datasets of exactly the written size
    (uncompressed array fields contiguous, so readers can memory-map them), fsyncs it,
    renames it into place and returns its :class:`ShardInfo`. An exception inside a
    ``with`` block, or ``abort()``, removes everything written.

    Args:
        path: Final shard path (``.../shard-00000.h5``).
        fields: What every sample holds (see :class:`FieldSpec`).
        compression: ``None`` (default: contiguous, memory-mappable), ``"gzip"`` or
            ``"lzf"`` (lossless, chunked by sample; array fields only).
        job: Identity of the job writing the set, stored as the shard's ``job`` attribute
            and in its :class:`ShardInfo` (readers compare the two).
        inputs: Digest of the inputs of this shard, stored likewise as ``inputs``.
    """

    def __init__(
        self,
        path: str | Path,
        fields: Sequence[FieldSpec],
        *,
        compression: str | None = None,
        job: str = "",
        inputs: str = "",
    ) -> None:
        if compression is not None and compression not in COMPRESSIONS:
            raise ValueError(
                f"compression must be None or one of {COMPRESSIONS}, got {compression!r}"
            )
        names = [f.name for f in fields]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"fields must be non-empty with unique names, got {names}")
        self.path = Path(path)
        self.fields = list(fields)
        self.compression = compression
        self.identity = {"job": job, "inputs": inputs}
        self.num_samples = 0
        self._spill_dir = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=self.path.parent))
        self._spills: dict[str, BinaryIO] = {
            f.name: open(self._spill_dir / f.name, "wb")  # noqa: SIM115 - closed in close()/abort()
            for f in self.fields
        }
        self._lengths: dict[str, list[int]] = {
            f.name: [] for f in self.fields if f.kind == "encoded"
        }
        self._closed = False

    def append(self, sample: Mapping[str, SampleValue]) -> None:
        """Add one sample: a value for every field (arrays of the declared shape and dtype,
        ``bytes`` for encoded fields, a Python ``int``/``str`` where that fits)."""
        if self._closed:
            raise ValueError(f"ShardWriter for {self.path} is closed")
        missing = [f.name for f in self.fields if f.name not in sample]
        if missing:
            raise ValueError(
                f"sample lacks fields {missing}; expected {[f.name for f in self.fields]}"
            )
        for spec in self.fields:
            data = _to_bytes(spec, sample[spec.name])
            self._spills[spec.name].write(data)
            if spec.kind == "encoded":
                self._lengths[spec.name].append(len(data))
        self.num_samples += 1

    def close(self) -> ShardInfo:
        """Finish the shard: build, fsync and rename the HDF5 file; return its info."""
        if self._closed:
            raise ValueError(f"ShardWriter for {self.path} is already closed")
        self._closed = True
        for fh in self._spills.values():
            fh.close()
        partial = self._spill_dir / "shard.h5"
        try:
            self._build(partial)
            with open(partial, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(partial, self.path)
            fsync_dir(self.path.parent)
        finally:
            _remove_tree(self._spill_dir)
        return ShardInfo(
            file=self.path.name,
            num_samples=self.num_samples,
            num_bytes=self.path.stat().st_size,
            sha256=file_sha256(self.path),
            **self.identity,
        )

    def abort(self) -> None:
        """Discard everything written; the final path is never created."""
        if not self._closed:
            self._closed = True
            for fh in self._spills.values():
                fh.close()
        _remove_tree(self._spill_dir)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._closed:
            self.close()

    def _build(self, partial: Path) -> None:
        # HDF5 lays out (and allocates) every contiguous dataset first; the bulk bytes are
        # then copied from the spill files into those regions by the kernel, never through
        # Python or HDF5's own buffers.
        n = self.num_samples
        regions: list[tuple[Path, int, int]] = []  # (spill file, offset in shard, bytes)
        with h5py.File(partial, "w") as h5:
            h5.attrs["format"] = FORMAT_NAME
            h5.attrs["version"] = FORMAT_VERSION
            h5.attrs["num_samples"] = n
            for key, value in self.identity.items():
                if value:
                    h5.attrs[key] = value
            for spec in self.fields:
                spill = self._spill_dir / spec.name
                if spec.kind == "array":
                    regions += self._write_array(h5, spec, spill, n)
                else:
                    regions += self._write_encoded(h5, spec, spill)
        if regions:
            with open(partial, "r+b") as out:
                for spill, offset, nbytes in regions:
                    with open(spill, "rb") as source:
                        _copy_range(source.fileno(), out.fileno(), offset, nbytes)

    def _write_array(
        self, h5: h5py.File, spec: FieldSpec, spill: Path, n: int
    ) -> list[tuple[Path, int, int]]:
        shape = (n, *spec.shape)
        chunked = self.compression is not None and n > 0 and spec.sample_nbytes > 0
        if not chunked:
            ds = _create_contiguous(h5, spec.name, shape, spec.dtype)
            ds.attrs["layout"] = spec.layout
            offset = ds.id.get_offset()
            nbytes = n * spec.sample_nbytes
            return [(spill, offset, nbytes)] if nbytes and offset is not None else []
        ds = h5.create_dataset(
            spec.name,
            shape=shape,
            dtype=spec.dtype,
            chunks=(1, *spec.shape),
            compression=self.compression,
        )
        ds.attrs["layout"] = spec.layout
        source = np.memmap(spill, dtype=spec.dtype, mode="r", shape=shape)
        rows_per_block = max(1, _COPY_BLOCK_BYTES // max(1, spec.sample_nbytes))
        for start in range(0, n, rows_per_block):
            ds[start : start + rows_per_block] = source[start : start + rows_per_block]
        del source
        return []

    def _write_encoded(
        self, h5: h5py.File, spec: FieldSpec, spill: Path
    ) -> list[tuple[Path, int, int]]:
        group = h5.create_group(spec.name)
        group.attrs["encoding"] = spec.encoding or ""
        lengths = np.asarray(self._lengths[spec.name], dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        group.create_dataset("offsets", data=offsets)
        total = int(offsets[-1])
        data = _create_contiguous(group, "data", (total,), "uint8")
        offset = data.id.get_offset()
        return [(spill, offset, total)] if total and offset is not None else []


def _create_contiguous(
    parent: h5py.Group, name: str, shape: tuple[int, ...], dtype: str
) -> h5py.Dataset:
    """A contiguous dataset whose file space is allocated now and never pre-filled."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    return parent.create_dataset(name, shape=shape, dtype=dtype, dcpl=dcpl, fill_time="never")


def _copy_range(source_fd: int, target_fd: int, offset: int, nbytes: int) -> None:
    """Copy ``nbytes`` from the start of ``source_fd`` to ``offset`` in ``target_fd``: in
    the kernel where it can, else (or for what it left) through ``pread``/``pwrite``."""
    copied = _kernel_copy(source_fd, target_fd, offset, nbytes)
    while copied < nbytes:
        block = os.pread(source_fd, min(_COPY_BLOCK_BYTES, nbytes - copied), copied)
        if not block:
            raise OSError(f"spill file ended after {copied} of {nbytes} bytes")
        os.pwrite(target_fd, block, offset + copied)
        copied += len(block)


def _kernel_copy(source_fd: int, target_fd: int, offset: int, nbytes: int) -> int:
    """Bytes ``copy_file_range`` copied before it finished or turned out unavailable."""
    copied = 0
    try:
        while copied < nbytes:
            step = os.copy_file_range(
                source_fd, target_fd, nbytes - copied, copied, offset + copied
            )
            if step == 0:
                raise OSError(f"spill file ended after {copied} of {nbytes} bytes")
            copied += step
    except (AttributeError, NotImplementedError):  # no copy_file_range (not Linux)
        return copied
    except OSError as exc:
        if exc.errno not in _NO_KERNEL_COPY:
            raise
    return copied


def _to_bytes(spec: FieldSpec, value: SampleValue) -> bytes:
    if spec.kind == "encoded":
        if isinstance(value, str):
            return value.encode()
        if isinstance(value, np.ndarray):
            return value.tobytes()
        if isinstance(value, bytes):
            return value
        raise TypeError(f"field {spec.name!r} takes bytes, got {type(value).__name__}")
    array = np.asarray(value)
    if array.shape != spec.shape:
        raise ValueError(f"field {spec.name!r} takes shape {spec.shape}, got {array.shape}")
    if array.dtype != np.dtype(spec.dtype):
        if array.ndim == 0 and np.can_cast(array, np.dtype(spec.dtype), casting="same_kind"):
            array = array.astype(spec.dtype)
        else:
            raise TypeError(f"field {spec.name!r} takes dtype {spec.dtype}, got {array.dtype}")
    return np.ascontiguousarray(array).tobytes()


def _remove_tree(folder: Path) -> None:
    if not folder.exists():
        return
    for child in folder.iterdir():
        child.unlink(missing_ok=True)
    folder.rmdir()
