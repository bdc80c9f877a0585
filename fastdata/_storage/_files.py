"""A shard set's files as local files: read in place, or through the cache of a node."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from fastdata._storage._backend import ObjectStore, object_store
from fastdata._storage._cache import (
    HeldShard,
    RemoteShard,
    ShardCache,
    default_cache_dir,
    parse_bytes,
)
from fastdata._storage._location import RemoteLocation, parse_location

logger = logging.getLogger(__name__)

MANIFEST_NAME = "index.json"
# Downloads a process runs at once ahead of its order (the sampler's read-ahead window
# bounds them too). A store answers each request after a delay (first byte) that parallel
# requests hide: on a loopback S3 server, 8 in flight halved the loader's waits for shards
# against 4, at the same CPU per image.
_PREFETCH_THREADS = 8


def read_file(root: str | os.PathLike[str] | RemoteLocation, name: str) -> tuple[bytes, str]:
    """The bytes of file ``name`` of a shard set, and where they came from (for messages).

    Raises:
        FileNotFoundError: There is no such file (object).
        OSError, StorageError: It cannot be read.
    """
    location = parse_location(root)
    if isinstance(location, Path):
        path = location / name
        return path.read_bytes(), str(path)
    return object_store(location).read_bytes(location.key(name)), location.child(name)


class ShardFiles:
    """Where a reader finds each shard of a set as a local file (see :func:`shard_files`)."""

    remote = False

    def where(self, file: str) -> str:
        """The shard file's path or URL, for messages."""
        raise NotImplementedError

    def acquire(
        self, file: str, num_bytes: int, sha256: str, *, memory_fallback: bool = True
    ) -> HeldShard | None:
        """The shard, held for reading until :meth:`HeldShard.release` (``None``: no room
        for it in a cache, and ``memory_fallback`` off)."""
        raise NotImplementedError

    def prefetch(self, file: str, num_bytes: int, sha256: str) -> None:
        """Start getting the shard ahead of its use (nothing to do for local files)."""

    def release_prefetched(self, sha256: str) -> None:
        """The shard :meth:`prefetch` got is used: let it go (nothing for local files)."""

    def warm(self, file: str, num_bytes: int, sha256: str) -> None:
        """Start getting the shard into a cache without holding it there (nothing to do
        for local files)."""

    def read_bytes(self, file: str) -> bytes:
        """The file's whole current content, unchecked and uncached (for verification).

        Raises:
            FileNotFoundError: There is no such file.
        """
        raise NotImplementedError


class LocalFiles(ShardFiles):
    """A shard folder on a local (or network) file system: its files, read in place."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def where(self, file: str) -> str:
        return str(self.root / file)

    def acquire(
        self, file: str, num_bytes: int, sha256: str, *, memory_fallback: bool = True
    ) -> HeldShard:
        return HeldShard(self.root / file)

    def read_bytes(self, file: str) -> bytes:
        return (self.root / file).read_bytes()


class CachedFiles(ShardFiles):
    """A shard set in an object store, read through a node's :class:`ShardCache`."""

    remote = True

    def __init__(self, location: RemoteLocation, cache: ShardCache) -> None:
        self.location = location
        self.cache = cache
        # sha256 -> the download holding the shard, and how many prefetches want it held
        self._prefetching: dict[str, tuple[Future[Any], int]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()

    @property
    def limit_bytes(self) -> int | None:
        return self.cache.limit_bytes

    def where(self, file: str) -> str:
        return self.location.child(file)

    def _shard(self, file: str, num_bytes: int, sha256: str) -> RemoteShard:
        return RemoteShard(self.location.child(file), self.location.key(file), num_bytes, sha256)

    def acquire(
        self, file: str, num_bytes: int, sha256: str, *, memory_fallback: bool = True
    ) -> HeldShard | None:
        """The shard, held for reading; with no room in the cache its bytes in memory, or
        ``None`` when ``memory_fallback`` is off (the caller can close shards and retry)."""
        shard = self._shard(file, num_bytes, sha256)
        return self.cache.fetch(self._store, shard, memory_fallback=memory_fallback)

    def read_bytes(self, file: str) -> bytes:
        return self._store().read_bytes(self.location.key(file))

    def _store(self) -> ObjectStore:
        """This process's client (created when first needed: a download)."""
        return object_store(self.location)

    def prefetch(self, file: str, num_bytes: int, sha256: str) -> None:
        """Download the shard into the cache in a background thread of this process (not
        into memory when the cache is full; a failure is left to the read that needs it).

        The shard stays held (no process evicts it) until :meth:`release_prefetched`: a
        shard read ahead is never evicted before its use.
        """
        self._check_process()
        with self._lock:
            if sha256 in self._prefetching:
                future, count = self._prefetching[sha256]
                self._prefetching[sha256] = (future, count + 1)
                return
            future = self._submit(self._shard(file, num_bytes, sha256))
            self._prefetching[sha256] = (future, 1)

    def warm(self, file: str, num_bytes: int, sha256: str) -> None:
        """Download the shard into the cache in a background thread, as :meth:`prefetch`,
        and let it go once there (an order not iterated yet holds nothing: the cache may
        evict it, least recently used last)."""
        self._check_process()
        with self._lock:
            future = self._submit(self._shard(file, num_bytes, sha256))
        future.add_done_callback(_release_result)

    def _check_process(self) -> None:
        if self._pid != os.getpid():  # forked: the parent's threads and lock are not here
            self._prefetching, self._pool, self._pid = {}, None, os.getpid()
            self._lock = threading.Lock()

    def _submit(self, shard: RemoteShard) -> Future[HeldShard | None]:
        """A download of ``shard`` into the cache in a background thread (under ``_lock``)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_PREFETCH_THREADS, "fastdata-prefetch")
        return self._pool.submit(self._prefetch, shard)

    def release_prefetched(self, sha256: str) -> None:
        """Let the cache evict the shard :meth:`prefetch` holds (once its download ends),
        when each call of :meth:`prefetch` for it was answered by one of this method."""
        if self._pid != os.getpid():
            return
        with self._lock:
            entry = self._prefetching.pop(sha256, None)
            if entry is None:
                return
            future, count = entry
            if count > 1:  # another prefetch of it (another order) still wants it held
                self._prefetching[sha256] = (future, count - 1)
                return
        future.add_done_callback(_release_result)

    def _prefetch(self, shard: RemoteShard) -> HeldShard | None:
        try:
            return self.cache.fetch(self._store, shard, memory_fallback=False)
        except Exception as exc:  # the read that needs the shard reports it
            logger.info("prefetch of %s failed: %s", shard.url, exc)
            return None

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location, "cache": self.cache}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["location"], state["cache"])  # type: ignore[misc]


def _release_result(future: Future[Any]) -> None:
    held = future.result()
    if held is not None:
        with contextlib.suppress(OSError):  # just used: the last the cache evicts
            os.utime(held.path)
        held.release()


def shard_files(
    root: str | os.PathLike[str],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | str | None = None,
    largest_shard_bytes: int = 0,
) -> ShardFiles:
    """The files of the shard set at ``root`` (a folder, its ``index.json``, or a URL).

    Args:
        cache_dir: The cache folder of remote shards; default :func:`default_cache_dir`.
            Ignored for a local set.
        cache_limit: Bytes the cache folder may hold: an int, or a string with a unit
            (``"200MB"``, ``"1.5GiB"``); default no limit. Ignored for a local set.
        largest_shard_bytes: The largest shard, which the limit must hold.

    Raises:
        ValueError: ``cache_limit`` is below one shard, or not a byte count.
    """
    location = parse_location(root)
    if isinstance(location, Path):
        return LocalFiles(location.parent if location.name == MANIFEST_NAME else location)
    limit = None if cache_limit is None else parse_bytes(cache_limit, "cache_limit")
    if limit is not None and limit < largest_shard_bytes:
        raise ValueError(
            f"cache_limit {cache_limit!r} ({limit} bytes) is smaller than the largest shard "
            f"of {location.url} ({largest_shard_bytes} bytes): allow at least one shard, "
            "better a few"
        )
    directory = default_cache_dir() if cache_dir is None else Path(cache_dir)
    return CachedFiles(location, ShardCache(directory, limit))
