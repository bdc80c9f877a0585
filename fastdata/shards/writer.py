"""``ShardWriter``: writes one HDF5 shard file atomically."""

from __future__ import annotations

import errno
import hashlib
import mmap
import os
import tempfile
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import h5py
import numpy as np

from fastdata._file_hash import file_sha256
from fastdata._files import fsync_dir
from fastdata.shards._field_kind import COPY_BLOCK_BYTES, Column, Region
from fastdata.shards._schema import COMPRESSIONS, FORMAT_NAME, FORMAT_VERSION, FieldSpec, ShardInfo

# copy_file_range errors that mean "not here" (cross-device before Linux 5.3, file systems
# without support, seccomp filters): the copy goes through pread/pwrite instead.
_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})

# Array fields of at least this many bytes per sample are written in place (max_samples).
_DIRECT_MIN_BYTES = 4096
_PREALLOCATED = "preallocated.h5"

SampleValue = np.ndarray | bytes | int | str


class ShardWriter:
    """Writes samples into one HDF5 shard that becomes visible only when complete.

    Samples are appended to per-field spill files next to the target; ``close()`` builds
    the HDF5 file under a temporary name with datasets of exactly the written size
    (uncompressed array fields contiguous, so readers can memory-map them), fsyncs it,
    renames it into place and returns its :class:`ShardInfo`. An exception inside a
    ``with`` block, or ``abort()``, removes everything written.

    With ``max_samples`` (and no compression), the large array fields (images, masks) are
    laid out first in the shard, sized for ``max_samples``, and each sample is written
    straight into place: no spill and no copy at ``close()`` when exactly that many
    samples were appended. With fewer, ``close()`` builds the usual compact file from them.
    Both layouts are deterministic functions of the samples and ``max_samples``.

    Args:
        path: Final shard path (``.../shard-00000.h5``).
        fields: What every sample holds (see :class:`FieldSpec`).
        compression: ``None`` (default: contiguous, memory-mappable), ``"gzip"`` or
            ``"lzf"`` (lossless, chunked by sample; array fields only).
        job: Identity of the job writing the set, stored as the shard's ``job`` attribute
            and in its :class:`ShardInfo` (readers compare the two).
        inputs: Digest of the inputs of this shard, stored likewise as ``inputs``.
        max_samples: The most samples that will be appended (optional; see above).
    """

    def __init__(
        self,
        path: str | Path,
        fields: Sequence[FieldSpec],
        *,
        compression: str | None = None,
        job: str = "",
        inputs: str = "",
        max_samples: int | None = None,
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
        if max_samples is not None and (not isinstance(max_samples, int) or max_samples < 0):
            raise ValueError(f"max_samples must be None or an int >= 0, got {max_samples!r}")
        self.max_samples = max_samples
        self._spill_dir = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=self.path.parent))
        # field name -> offset of its data in the preallocated partial file
        self._direct: dict[str, int] = {}
        self._direct_fd = -1
        try:
            if max_samples and compression is None:
                self._preallocate(max_samples)
            self._spills: dict[str, BinaryIO] = {
                f.name: open(self._spill_dir / f.name, "wb")  # noqa: SIM115 - closed in close()/abort()
                for f in self.fields
                if f.name not in self._direct
            }
        except BaseException:
            self._close_direct()
            _remove_tree(self._spill_dir)
            raise
        # bytes per sample of the fields whose samples vary in size
        self._lengths: dict[str, list[int]] = {
            f.name: [] for f in self.fields if not f.field_kind.fixed_size
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
        if self.num_samples == self.max_samples:
            raise ValueError(f"ShardWriter for {self.path} takes at most {self.max_samples}")
        for spec in self.fields:
            data = spec.field_kind.to_bytes(sample[spec.name])
            offset = self._direct.get(spec.name)
            if offset is not None:
                _pwrite_all(self._direct_fd, data, offset + self.num_samples * spec.sample_nbytes)
                continue
            self._spills[spec.name].write(data)
            lengths = self._lengths.get(spec.name)
            if lengths is not None:
                lengths.append(len(data))
        self.num_samples += 1

    def close(self) -> ShardInfo:
        """Finish the shard: build, fsync and rename the HDF5 file; return its info."""
        if self._closed:
            raise ValueError(f"ShardWriter for {self.path} is already closed")
        self._closed = True
        for fh in self._spills.values():
            fh.close()
        self._close_direct()
        partial = self._spill_dir / "shard.h5"
        try:
            if self._direct and self.num_samples == self.max_samples:
                self._complete(partial)
            else:
                if self._direct:  # fewer samples than laid out: build the compact file
                    os.replace(partial, self._spill_dir / _PREALLOCATED)
                self._build(partial)
            # hash while the kernel writes the file out: fsync waits on the disk, hashing
            # reads the page cache; both release the GIL
            with ThreadPoolExecutor(1, thread_name_prefix="fastdata-shard-hash") as hasher:
                sha256 = hasher.submit(_mapped_sha256, partial)
                with open(partial, "rb") as fh:
                    os.fsync(fh.fileno())
                digest = sha256.result()
            os.replace(partial, self.path)
            fsync_dir(self.path.parent)
        finally:
            _remove_tree(self._spill_dir)
        return ShardInfo(
            file=self.path.name,
            num_samples=self.num_samples,
            num_bytes=self.path.stat().st_size,
            sha256=digest,
            **self.identity,
        )

    def abort(self) -> None:
        """Discard everything written; the final path is never created."""
        if not self._closed:
            self._closed = True
            for fh in self._spills.values():
                fh.close()
        self._close_direct()
        _remove_tree(self._spill_dir)

    def _preallocate(self, max_samples: int) -> None:
        """Lay out the large fixed-size fields (images, masks) for ``max_samples`` samples."""
        direct = [spec for spec in self.fields if spec.sample_nbytes >= _DIRECT_MIN_BYTES]
        if not direct:
            return
        partial = self._spill_dir / "shard.h5"
        with h5py.File(partial, "w") as h5:
            for spec in direct:
                offset = spec.field_kind.preallocate(h5, max_samples)
                if offset is not None:
                    self._direct[spec.name] = offset
        self._direct_fd = os.open(partial, os.O_WRONLY)

    def _close_direct(self) -> None:
        if self._direct_fd >= 0:
            os.close(self._direct_fd)
            self._direct_fd = -1

    def _complete(self, partial: Path) -> None:
        """Add the attributes and the spilled fields to the preallocated file."""
        regions: list[Region] = []
        with h5py.File(partial, "r+") as h5:
            self._write_attrs(h5, self.num_samples)
            for spec in self.fields:
                if spec.name not in self._direct:
                    regions += self._write_field(h5, spec, self._spill_dir / spec.name, 0)
        _copy_regions(partial, regions)

    def _write_attrs(self, h5: h5py.File, num_samples: int) -> None:
        """The file's attributes: format, version, sample count, and the job identity."""
        h5.attrs["format"] = FORMAT_NAME
        h5.attrs["version"] = FORMAT_VERSION
        h5.attrs["num_samples"] = num_samples
        for key, value in self.identity.items():
            if value:
                h5.attrs[key] = value

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
        regions: list[Region] = []
        with h5py.File(partial, "w") as h5:
            self._write_attrs(h5, self.num_samples)
            for spec in self.fields:
                if spec.name in self._direct:
                    source = (self._spill_dir / _PREALLOCATED, self._direct[spec.name])
                else:
                    source = (self._spill_dir / spec.name, 0)
                regions += self._write_field(h5, spec, *source)
        _copy_regions(partial, regions)

    def _write_field(
        self, h5: h5py.File, spec: FieldSpec, spill: Path, offset: int
    ) -> list[Region]:
        """Let the field's kind store the samples spilled to ``spill`` from ``offset`` on."""
        column = Column(spill, offset, self._lengths.get(spec.name, ()), self.num_samples)
        return spec.field_kind.write(h5, column, self.compression)


def _mapped_sha256(path: Path) -> str:
    """:func:`file_sha256` hashing the page cache through a mapping (no copy into Python)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size == 0:
            return file_sha256(path)
        digest = hashlib.sha256()
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                for start in range(0, size, COPY_BLOCK_BYTES):
                    digest.update(view[start : start + COPY_BLOCK_BYTES])
            finally:
                view.release()
    return digest.hexdigest()


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _copy_regions(target: Path, regions: list[Region]) -> None:
    if not regions:
        return
    with open(target, "r+b") as out:
        for path, source_offset, offset, nbytes in regions:
            with open(path, "rb") as source:
                _copy_range(source.fileno(), out.fileno(), (source_offset, offset), nbytes)


def _copy_range(source_fd: int, target_fd: int, offsets: tuple[int, int], nbytes: int) -> None:
    """Copy ``nbytes`` from ``offsets[0]`` in ``source_fd`` to ``offsets[1]`` in
    ``target_fd``: in the kernel where it can, else (or for what it left) through
    ``pread``/``pwrite``."""
    source_offset, offset = offsets
    copied = _kernel_copy(source_fd, target_fd, offsets, nbytes)
    while copied < nbytes:
        block = os.pread(source_fd, min(COPY_BLOCK_BYTES, nbytes - copied), source_offset + copied)
        if not block:
            raise OSError(f"spill file ended after {copied} of {nbytes} bytes")
        os.pwrite(target_fd, block, offset + copied)
        copied += len(block)


def _kernel_copy(source_fd: int, target_fd: int, offsets: tuple[int, int], nbytes: int) -> int:
    """Bytes ``copy_file_range`` copied before it finished or turned out unavailable."""
    source_offset, offset = offsets
    copied = 0
    try:
        while copied < nbytes:
            step = os.copy_file_range(
                source_fd, target_fd, nbytes - copied, source_offset + copied, offset + copied
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


def _remove_tree(folder: Path) -> None:
    if not folder.exists():
        return
    for child in folder.iterdir():
        child.unlink(missing_ok=True)
    folder.rmdir()
