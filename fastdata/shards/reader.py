"""``ShardReader``: random access to a shard set by field and sample index."""

from __future__ import annotations

import contextlib
import os
import stat
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from fastdata._gather import locate
from fastdata._storage import HeldShard, LocalFiles, shard_files
from fastdata.errors import ShardFormatError
from fastdata.shards._schema import (
    FORMAT_NAME,
    READABLE_VERSIONS,
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
        self,
        path: Path,
        info: ShardInfo,
        fields: Sequence[FieldSpec],
        use_mmap: bool,
        held: HeldShard | None = None,
    ) -> None:
        self.path = path
        # the file (or, from a full cache, the bytes) held until close()
        self.held = held
        self.data = None if held is None else held.data
        if self.data is None:
            self.file_bytes = _check_file(path, info)
        elif len(self.data) != info.num_bytes:  # pragma: no cover (checked when downloaded)
            raise ShardFormatError(f"shard is {len(self.data)} bytes, not {info.num_bytes}", path)
        else:
            self.file_bytes = len(self.data)
        try:
            self.h5 = h5py.File(path, "r") if self.data is None else _open_image(path, self.data)
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
                if self.data is not None:  # in memory: a view of the bytes, no copy
                    flat = np.frombuffer(self.data, ds.dtype, ds.size, offset)
                    return flat.reshape(ds.shape)
                mapped = np.memmap(self.path, ds.dtype, "r", offset=offset, shape=ds.shape)
                return mapped.view(np.ndarray)
        return ds

    def close(self) -> None:
        self.views.clear()
        self.h5.close()
        if self.held is not None:
            self.held.release()


def _open_image(path: Path, data: bytes) -> h5py.File:
    """An HDF5 file read from ``data`` by HDF5's in-memory (core) driver.

    HDF5 keeps its own copy of the image (released on close), so nothing calls back into
    Python from HDF5's C code. A file opened on a Python file object (``io.BytesIO``)
    does: each read and the final close run Python callbacks from C, tied to that
    object's lifetime, and DataLoader workers reading such files were seen to crash
    (segmentation fault) as they shut down.
    """
    access = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    access.set_fapl_core(backing_store=False)
    access.set_file_image(data)
    # named after the shard (its content) for HDF5's messages
    name = f"{path}#in-memory".encode(errors="replace")
    return h5py.File(h5py.h5f.open(name, h5py.h5f.ACC_RDONLY, fapl=access))


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
    if _integer(attrs.get("version")) not in READABLE_VERSIONS:
        raise ValueError(
            f"shard format version {attrs.get('version')} is not one of {READABLE_VERSIONS}"
        )
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


@dataclass(frozen=True)
class CacheRoom:
    """What the capped cache of a remote set holds, counted in its largest shards: what a
    sampler sizes its order by, so that :meth:`ShardReader.read_ahead` holds every shard
    the order keeps in use.

    :meth:`ShardReader.read_ahead` holds, besides one spare, the shards in use twice over
    (where the sampler hands samples out and where the loader reads them, behind it): an
    order that shuffles ``w`` shards together needs ``2 * w + 1`` shards of room, and the
    rest of the cache is downloaded ahead.
    """

    limit_bytes: int
    shard_bytes: int  # the largest shard

    @property
    def shards(self) -> int:
        """Largest shards the limit holds (at least 1: a smaller limit is refused)."""
        return self.limit_bytes // max(self.shard_bytes, 1)

    def window_shards(self, wanted: int) -> int:
        """The most shards, at most ``wanted``, an order may shuffle together for the
        cache to hold them twice and a spare (at least 1)."""
        return max(1, min(wanted, (self.shards - 1) // 2))

    def bytes_for(self, window_shards: int) -> int:
        """The limit that holds an order shuffling ``window_shards`` together."""
        return (2 * window_shards + 1) * self.shard_bytes


@dataclass(frozen=True)
class CacheFolder:
    """Where this process caches a remote set, as the ranks of a job compare it: the
    ranks of a node that name the same folder share its limit (see
    :class:`~fastdata.datasets.ShardAwareDistributedSampler`)."""

    directory: str  # the resolved cache folder
    limit_bytes: int | None  # the cache_limit this process was given (None: no limit)
    shard_bytes: int  # the largest shard of the set


def _most_at_once(first_use: np.ndarray, last_use: np.ndarray) -> int:
    """The most shards an order reads at once: at some position, shards used before it
    and after it (each shard's first and last position given)."""
    changes = np.zeros(int(last_use.max()) + 2, dtype=np.int64)
    np.add.at(changes, first_use, 1)
    np.add.at(changes, last_use + 1, -1)
    return int(np.cumsum(changes).max())


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

    A shard set in object storage (``s3://bucket/prefix``) is read through a local cache
    (see :func:`fastdata._storage.shard_files`): each shard is downloaded whole, checked
    against the manifest's SHA-256, then memory-mapped like a local one. A reader then
    keeps at most ``max_open_shards`` shards open (held in the cache) per process.

    Args:
        root: The shard folder (or its ``index.json``), or a URL such as ``s3://bucket/set/``.
        use_mmap: Memory-map contiguous datasets (default). ``False`` reads through h5py.
        cache_dir: Cache folder of a remote set (default: the user cache folder).
        cache_limit: Bytes the cache folder may hold: an int or a string such as
            ``"200MB"``; default no limit. At least the largest shard.
        max_open_shards: Shards of a remote set one process keeps open (default 8, at
            most one less than ``cache_limit`` holds).

    Example:
        >>> reader = ShardReader("out/")                          # doctest: +SKIP
        >>> image = reader.read("image", 0)                      # (H, W, C) uint8
        >>> batch = reader.read_batch("image", [5, 1, 9])         # (3, H, W, C) uint8
    """

    def __init__(
        self,
        root: str | Path,
        *,
        use_mmap: bool = True,
        cache_dir: str | Path | None = None,
        cache_limit: int | str | None = None,
        max_open_shards: int = 8,
    ) -> None:
        self.manifest: Manifest = load_manifest(root)
        self.files = shard_files(
            root,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
            largest_shard_bytes=self._largest_shard_bytes(),
        )
        self.root: Path | str = (
            self.files.root if isinstance(self.files, LocalFiles) else self.files.where("")
        )
        self.use_mmap = use_mmap
        if isinstance(max_open_shards, bool) or not isinstance(max_open_shards, int):
            raise TypeError(f"max_open_shards must be an int, got {max_open_shards!r}")
        if max_open_shards < 1:
            raise ValueError(f"max_open_shards must be >= 1, got {max_open_shards}")
        self.max_open_shards: int | None = None  # local: every shard stays mapped
        if self.files.remote:
            limit = getattr(self.files, "limit_bytes", None)
            largest = max((s.num_bytes for s in self.manifest.shards), default=1)
            if limit is not None:  # leave room for one shard read ahead
                max_open_shards = max(1, min(max_open_shards, limit // max(largest, 1) - 1))
            self.max_open_shards = max_open_shards
        counts = np.array([s.num_samples for s in self.manifest.shards], dtype=np.int64)
        self._starts = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self._starts[1:])
        self._open: dict[int, OpenShard] = {}
        self._pid = os.getpid()
        self._reads = 0  # calls of close_unused, and the call that last named each shard
        self._named: dict[int, int] = {}
        self._warned_small_cache = False
        self._cache_share: int | None = None  # this process's share of a shared limit

    # -- basics ---------------------------------------------------------------------------
    @property
    def cache_room(self) -> CacheRoom | None:
        """What the cache of a remote set holds (``None``: a local set, or no limit,
        neither given nor shared, see :meth:`share_cache`):
        :class:`ShardAwareDistributedSampler` shuffles no more shards together than it
        holds twice over, with a spare."""
        given = getattr(self.files, "limit_bytes", None)
        # a share of a folder whose limit another process was given binds this one too
        limits = [limit for limit in (given, self._cache_share) if limit is not None]
        if not self.files.remote or not limits or not self.manifest.shards:
            return None
        return CacheRoom(min(limits), self._largest_shard_bytes())

    @property
    def cache_folder(self) -> CacheFolder | None:
        """The cache folder of a remote set, its limit and the set's largest shard
        (``None``: a local set)."""
        cache = getattr(self.files, "cache", None)
        if not self.files.remote or cache is None:
            return None
        return CacheFolder(
            os.path.realpath(cache.directory),
            cache.limit_bytes,
            self._largest_shard_bytes(),
        )

    def _largest_shard_bytes(self) -> int:
        """The size of the set's largest shard file (0: no shards): the unit a cache's
        room is counted in."""
        return max((info.num_bytes for info in self.manifest.shards), default=0)

    def share_cache(self, limit_bytes: int) -> None:
        """Size orders and read-ahead (:attr:`cache_room`) by ``limit_bytes``, this
        process's share of a cache folder whose limit several processes of a node share
        (each keeps its own shards in use there). The folder's limit is unchanged."""
        self._cache_share = int(limit_bytes)

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
        shard = self._open.pop(shard_id, None)
        if shard is None:
            if self.max_open_shards is not None:  # remote: let the cache evict others
                while len(self._open) >= self.max_open_shards:
                    self._open.pop(next(iter(self._open))).close()
            info = self.manifest.shards[shard_id]
            held = self._acquire(info)
            try:
                shard = OpenShard(held.path, info, self.manifest.fields, self.use_mmap, held)
            except BaseException:
                held.release()
                raise
        self._open[shard_id] = shard  # most recently used last
        return shard

    def close_unused(self, shard_ids: np.ndarray, lookback: int = 1) -> None:
        """Say which shards a batch is about to read: in a capped cache, this process
        closes its open shards named in none of the last ``lookback`` calls (default: the
        shards this batch does not read), so that the cache may evict them instead of
        reading shards into memory. The processes of a node hold the shards they keep
        open, and the room a capped cache leaves beside the shards the sampler reads
        ahead counts only the shards batches are reading (see :meth:`read_ahead`): a
        worker that kept the shards of its earlier batches open filled that room with
        shards no one reads. Nothing for other sets."""
        if self.max_open_shards is None or getattr(self.files, "limit_bytes", None) is None:
            return
        if self._pid != os.getpid():
            return  # nothing of this process is open yet
        self._reads += 1
        for shard_id in np.unique(shard_ids).tolist():
            self._named[shard_id] = self._reads
        for shard_id in [s for s in self._open if self._named.get(s, 0) <= self._reads - lookback]:
            self._open.pop(shard_id).close()

    def _acquire(self, info: ShardInfo) -> HeldShard:
        """The shard held in the cache. With no room there (every cached shard held), this
        process's other open shards are closed first, least recently used first, so that
        the cache can evict them; only then are its bytes read into memory."""
        while True:
            memory_fallback = not self._open
            held = self.files.acquire(
                info.file, info.num_bytes, info.sha256, memory_fallback=memory_fallback
            )
            if held is not None:
                return held
            self._open.pop(next(iter(self._open))).close()

    def read_ahead(self, indices: Sequence[int] | np.ndarray, window: int = 8) -> Iterator[int]:
        """Yield ``indices`` while the shards they read are fetched ahead, up to ``window``
        shards beyond those in use, in the order of their first use (remote sets; a local
        set yields them at once). Samplers call this with an epoch's order.

        With a cache limit the window is what the cache holds beside twice the shards in
        use (the most shards the order reads at once, where the sampler hands them out and
        where the loader reads them; the processes of a node share them in the cache) and
        one spare: negative when it holds less, then fewer of the shards in use are
        fetched ahead. A shard read ahead stays held in the cache,
        never evicted, until the order has handed out its last sample and about as many
        samples as the shards in use hold (the loader reads behind the sampler): the
        shards that remain held at the end are let go when the generator is closed. The
        first step (a sampler starts it at ``set_epoch``, before the loader iterates)
        only downloads: the shards are held from the second step on, so an order that is
        started and never iterated keeps nothing from eviction.
        """
        array = np.asarray(indices, dtype=np.int64)
        if not self.files.remote or array.size == 0:
            yield from array.tolist()
            return
        shard_ids, _ = self.locate(array)
        unique, first_use, counts = np.unique(shard_ids, return_index=True, return_counts=True)
        _, last_from_end = np.unique(shard_ids[::-1], return_index=True)
        last_use = array.size - 1 - last_from_end
        at_once = _most_at_once(first_use, last_use)
        # the loader reads a shard after the sampler handed it out, by about the samples of
        # the shards in use: a shard read ahead stays held that long after its last sample
        trailing = at_once * int(counts.max())
        cache = self.cache_room
        if cache is not None:
            limit, largest = cache.limit_bytes, cache.shard_bytes
            # The loader's processes read the shards in use behind the sampler's position
            # (by about a window: the batches they prefetch), and the sampler holds those
            # of its own position: both are held in the cache. With less room than that,
            # the window is negative: fewer of the shards of the sampler's position are
            # fetched ahead, and the loader downloads the rest when it reads them.
            # (one slot is left free: a reader process may still hold a shard it is done with)
            room = cache.shards - 2 * at_once - 1
            window = min(window, room)
            if room < 0 and not self._warned_small_cache:
                self._warned_small_cache = True
                warnings.warn(
                    f"cache_limit ({limit} bytes) holds {cache.shards} shards of "
                    f"{self.root}, fewer than the {2 * at_once + 1} this order reads at once "
                    f"({at_once} where the sampler hands samples out, {at_once} where the "
                    "loader reads them, one spare): shards are downloaded more than once an "
                    f"epoch, in the loader's time; allow at least {(2 * at_once + 2) * largest} "
                    "bytes, or shuffle fewer shards together (the sampler's window_shards)",
                    stacklevel=2,
                )
        by_first_use = np.argsort(first_use, kind="stable")
        order = unique[by_first_use].tolist()
        starts = first_use[by_first_use]
        done_at: dict[int, list[str]] = {}  # position -> shards to let go there
        last_at: dict[int, int] = {}
        for shard, last in zip(unique.tolist(), last_use.tolist(), strict=True):
            sha256 = self.manifest.shards[shard].sha256
            done_at.setdefault(int(last) + trailing, []).append(sha256)
            last_at[shard] = int(last)
        fetched = 0
        pending: set[str] = set()  # held by a prefetch of this order, not released yet
        warmed: list[int] = []  # shards the first step downloaded without holding them
        try:
            for position, index in enumerate(array.tolist()):
                if position == 1:  # the order is iterated: hold what its first step got
                    for shard in warmed:
                        info = self.manifest.shards[shard]
                        self.files.prefetch(info.file, info.num_bytes, info.sha256)
                        pending.add(info.sha256)
                # the shards in use now and `window` more (fewer when the window is negative)
                due = min(len(order), int(np.searchsorted(starts, position, "right")) + window)
                while fetched < due:
                    if last_at[order[fetched]] >= position:  # not all handed out already
                        info = self.manifest.shards[order[fetched]]
                        if position == 0:
                            self.files.warm(info.file, info.num_bytes, info.sha256)
                            warmed.append(order[fetched])
                        else:
                            self.files.prefetch(info.file, info.num_bytes, info.sha256)
                            pending.add(info.sha256)
                    fetched += 1
                for sha256 in done_at.get(position, ()):  # read by the loader by now
                    if sha256 in pending:
                        pending.discard(sha256)
                        self.files.release_prefetched(sha256)
                yield index
        finally:
            for sha256 in pending:  # an order left early: free what it still holds
                self.files.release_prefetched(sha256)

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
