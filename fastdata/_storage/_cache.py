"""A node's local cache of remote shards: bounded in bytes, verified, shared by processes.

Layout of the cache folder (any folder; it can be moved or deleted between runs)::

    .lock              held exclusively while space is reserved or a download renamed into
                       place (never during a download)
    <sha256>.h5        a verified shard, named by its content: never stale, never wrong
    <sha256>.part      a download in progress, already of its full size, locked by its writer

Every process of a node (DataLoader workers, ranks) uses the same folder:

- one download per shard: the process that creates ``<sha256>.part`` downloads it; the
  others wait for its lock and then read the renamed file;
- a partial download is never read: the file is checked (size and SHA-256 of the bytes as
  they arrive) and only then renamed to ``<sha256>.h5``;
- the byte limit holds at every moment: space is reserved (the ``.part`` file is created at
  its full size) before a byte is downloaded, under the folder's lock, after evicting the
  least recently used shards that no process has open (open shards hold a shared
  ``flock``); the limit counts every file of the folder;
- a full cache never stalls: when nothing can be evicted (every cached shard is open), the
  shard is read into memory instead, for as long as it is open.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import random
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fastdata._storage._backend import ObjectStore
from fastdata.errors import ShardFormatError, StorageError

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "FASTDATA_CACHE_DIR"
_SUFFIX = ".h5"
_PART = ".part"
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
# what ShardCache._reserve returns instead of a descriptor
_DOWNLOADING = -1
_CACHED = -2
_BYTES = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)


def parse_bytes(value: int | str, argument: str = "cache_limit") -> int:
    """A byte count from an int or a string with a unit: ``"200MB"``, ``"1.5GiB"``, ``"512M"``
    (``k``/``M``/``G``/``T`` decimal, ``KiB``/``MiB``/... binary).

    Raises:
        TypeError: Neither an int nor a string.
        ValueError: Not a positive byte count.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"{argument} must be an int or a string such as '200MB', got {value!r}")
    if isinstance(value, int):
        number = value
    else:
        match = _BYTES.match(value)
        if match is None or (match.group(3) and not match.group(2)):
            raise ValueError(
                f"{argument} must be a byte count such as 200000000, '200MB' or '1.5GiB', "
                f"got {value!r}"
            )
        prefix = match.group(2).lower()
        scale = 1024 ** "kmgt".index(prefix) * 1024 if match.group(3) else _UNITS[prefix]
        number = int(float(match.group(1)) * scale)
    if number <= 0:
        raise ValueError(f"{argument} must be a positive byte count, got {value!r}")
    return number


def default_cache_dir() -> Path:
    """``$FASTDATA_CACHE_DIR``, else the user cache folder: ``$XDG_CACHE_HOME/fastdata``
    (``~/.cache/fastdata``; ``~/Library/Caches/fastdata`` on macOS)."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "fastdata"
    if os.uname().sysname == "Darwin":
        return Path.home() / "Library" / "Caches" / "fastdata"
    return Path.home() / ".cache" / "fastdata"


@dataclass(frozen=True)
class RemoteShard:
    """What the cache needs to know of one shard: where it is and what it must be."""

    url: str  # for messages
    key: str
    num_bytes: int
    sha256: str


# Descriptors that hold a lock on a cache file. flock locks belong to the open file, which
# a fork shares with the child: the child closes its copies at once, or a shard the parent
# released would stay locked (never evicted) for as long as the child lives. A descriptor
# is opened and recorded (closed and forgotten) under `_fds_lock`, which a fork takes
# first: a fork between the two (a download thread of the parent runs while the DataLoader
# forks its workers) left the child an unrecorded copy of the folder's lock, taken by the
# parent a moment later, and the lock held for good (every process then waited on it).
_locking_fds: set[int] = set()
_fds_lock = threading.Lock()


def _close_inherited_fds() -> None:
    global _fds_lock  # noqa: PLW0603 (a new one: the parent's is held across the fork)
    for fd in list(_locking_fds):
        with contextlib.suppress(OSError):
            os.close(fd)
    _locking_fds.clear()
    _fds_lock = threading.Lock()


def _before_fork() -> None:
    _fds_lock.acquire()


def _after_fork_in_parent() -> None:
    _fds_lock.release()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_close_inherited_fds,
)


def _open_locking(path: Path, flags: int, mode: int = 0o644) -> int:
    with _fds_lock:
        fd = os.open(path, flags, mode)
        _locking_fds.add(fd)
    return fd


def _close_locking(fd: int) -> None:
    with _fds_lock:
        _locking_fds.discard(fd)
        os.close(fd)


class HeldShard:
    """A shard this process reads: a cached file (held open with a shared lock, so that no
    process evicts it) or, when the cache had no room, its bytes in memory."""

    def __init__(self, path: Path, fd: int | None = None, data: bytes | None = None) -> None:
        self.path = path
        self.data = data
        self._fd = fd
        self._pid = os.getpid()

    def release(self) -> None:
        """Let the cache evict the file (a memory map of it stays valid until dropped)."""
        fd, self._fd = self._fd, None
        if fd is not None and self._pid == os.getpid():
            _close_locking(fd)

    def __del__(self) -> None:
        self.release()


class ShardCache:
    """The cache folder ``directory`` holding at most ``limit_bytes`` (``None``: no limit).

    Picklable: it is a folder and a number; each process locks and opens files itself.
    """

    def __init__(self, directory: Path, limit_bytes: int | None) -> None:
        self.directory = Path(directory)
        self.limit_bytes = limit_bytes
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(
                f"cache_dir {str(directory)!r} cannot be created ({exc.strerror or exc})"
            ) from exc

    def usage(self) -> int:
        """Bytes held by the folder's shard and download files now."""
        return sum(size for _, size, _ in self._entries())

    # -- getting a shard -----------------------------------------------------------------
    def fetch(
        self,
        store: Callable[[], ObjectStore],
        shard: RemoteShard,
        *,
        memory_fallback: bool = True,
    ) -> HeldShard | None:
        """The shard, from the cache or downloaded into it (verified), held for reading.

        ``store()`` gives the client, called only when this process downloads the shard:
        a process that finds its shards in the cache (a DataLoader worker behind the
        sampler's read-ahead) never creates one (a boto3 client costs about 0.1-0.25 s of
        CPU to create, in each process).

        With no room in the cache (every cached shard open): its bytes in memory, or
        ``None`` when ``memory_fallback`` is off (a prefetch).

        Raises:
            ShardFormatError: A download did not match the manifest twice in a row.
            StorageError: The store refused the request, or failed past the retries.
        """
        final = self.directory / f"{shard.sha256}{_SUFFIX}"
        part = self.directory / f"{shard.sha256}{_PART}"
        while True:
            held = _hold(final)
            if held is not None:
                _touch(final)
                return held
            fd = self._reserve(part, final, shard.num_bytes)
            if fd == _CACHED:  # renamed into place since we looked: hold it
                continue
            if fd is None:  # no room: nothing can be evicted now
                if not memory_fallback:
                    return None
                return HeldShard(final, data=self._download_bytes(store(), shard))
            if fd == _DOWNLOADING:  # another process is downloading it: wait, then look
                _wait_for(part)
                continue
            try:
                self._download_into(fd, store(), shard)
                os.fsync(fd)
                # Under the folder's lock: a reservation that lists the folder must see
                # the shard under one of its names (renamed between the listing and the
                # size of `part`, it was counted under neither, and the limit was overrun
                # by a shard); the lock turns from the writer's to a reader's there too,
                # so that no eviction finds it free in between.
                with self._folder_lock():
                    os.rename(part, final)
                    fcntl.flock(fd, fcntl.LOCK_SH)
            except BaseException:
                with contextlib.suppress(OSError):
                    part.unlink()
                _close_locking(fd)
                raise
            return HeldShard(final, fd)

    def _reserve(self, part: Path, final: Path, num_bytes: int) -> int | None:
        """Under the folder's lock: make room for ``num_bytes`` and create ``part`` at that
        size, locked. Returns its descriptor; ``_DOWNLOADING`` when another process is
        downloading it, ``_CACHED`` when ``final`` is there; ``None`` when no room can be
        made."""
        with self._folder_lock():
            # ``part`` first, then ``final``: a download renamed between the caller's look
            # at ``final`` and this lock shows in one of the two (a rename is atomic, and
            # no download starts and no eviction happens while the lock is held)
            if part.exists():
                if not _is_stale(part):
                    return _DOWNLOADING
                with contextlib.suppress(OSError):
                    part.unlink()
            if final.exists():
                return _CACHED
            if self.limit_bytes is not None and not self._make_room(num_bytes):
                return None
            fd = _open_locking(part, os.O_RDWR | os.O_CREAT | os.O_EXCL)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                os.ftruncate(fd, num_bytes)  # counted from now on
            except OSError:
                _close_locking(fd)
                part.unlink()
                raise
            return fd

    def _make_room(self, num_bytes: int) -> bool:
        """Evict least recently used shards that no process holds until ``num_bytes`` fit."""
        if self.limit_bytes is None:
            return True
        entries = list(self._entries())
        used = sum(size for _, size, _ in entries)
        shards = sorted(
            (mtime, path, size) for path, size, mtime in entries if path.suffix == _SUFFIX
        )
        for _, path, size in shards:
            if used + num_bytes <= self.limit_bytes:
                break
            if _evict(path):
                used -= size
        return used + num_bytes <= self.limit_bytes

    def _entries(self) -> Iterator[tuple[Path, int, float]]:
        """``(path, size, mtime)`` of each shard and download file, stale downloads removed."""
        with os.scandir(self.directory) as listing:
            for entry in listing:
                if not entry.name.endswith((_SUFFIX, _PART)):
                    continue
                try:
                    status = entry.stat()
                except FileNotFoundError:
                    continue
                path = Path(entry.path)
                if entry.name.endswith(_PART) and _is_stale(path):
                    with contextlib.suppress(OSError):
                        path.unlink()
                    continue
                yield path, status.st_size, status.st_mtime

    @contextlib.contextmanager
    def _folder_lock(self) -> Iterator[None]:
        fd = _open_locking(self.directory / ".lock", os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            _close_locking(fd)

    # -- downloading ---------------------------------------------------------------------
    def _download_into(self, fd: int, store: ObjectStore, shard: RemoteShard) -> None:
        def write(chunks: Iterator[memoryview], digest: Callable[[memoryview], None]) -> int:
            offset = 0
            for chunk in chunks:
                if offset + len(chunk) > shard.num_bytes:
                    return offset + len(chunk)  # longer than recorded: wrong, stop here
                os.pwrite(fd, chunk, offset)
                digest(chunk)
                offset += len(chunk)
            return offset

        _verified_download(store, shard, write)

    def _download_bytes(self, store: ObjectStore, shard: RemoteShard) -> bytes:
        buffer = bytearray()

        def write(chunks: Iterator[memoryview], digest: Callable[[memoryview], None]) -> int:
            buffer.clear()
            for chunk in chunks:
                if len(buffer) + len(chunk) > shard.num_bytes:
                    return len(buffer) + len(chunk)
                buffer.extend(chunk)
                digest(chunk)
            return len(buffer)

        _verified_download(store, shard, write)
        return bytes(buffer)


def _verified_download(
    store: ObjectStore,
    shard: RemoteShard,
    write: Callable[[Iterator[memoryview], Callable[[memoryview], None]], int],
) -> None:
    """Download with ``write`` until the bytes match the shard's size and SHA-256: transient
    failures are retried with backoff; a complete but wrong download is fetched once more,
    then refused with :class:`ShardFormatError`."""
    attempts = getattr(store, "attempts", 5)
    failures = 0
    wrong = 0
    while True:
        digest = hashlib.sha256()
        try:
            count = write(store.stream(shard.key), digest.update)
        except StorageError as exc:
            if not exc.corrupt:
                failures += 1
                if not exc.transient or failures >= attempts:
                    raise
                _backoff(failures, shard, str(exc))
                continue
            count, problem = -1, "the client's checksum of the body disagreed"
        else:
            if count == shard.num_bytes and digest.hexdigest() == shard.sha256:
                return
            problem = (
                f"{count} bytes, the manifest records {shard.num_bytes}"
                if count != shard.num_bytes
                else f"SHA-256 {digest.hexdigest()[:12]}…, the manifest records "
                f"{shard.sha256[:12]}…"
            )
        wrong += 1
        if wrong >= 2:
            raise ShardFormatError(
                f"downloaded shard does not match the manifest twice ({problem}); the stored "
                "object was changed or damaged: run `fastdata verify`",
                shard.url,
            )
        logger.warning("downloaded %s does not match the manifest (%s): fetching it again",
                       shard.url, problem)  # fmt: skip


def _backoff(failure: int, shard: RemoteShard, reason: str) -> None:
    delay = min(5.0, 0.1 * 2 ** (failure - 1)) * (0.5 + random.random())
    logger.info("retrying the download of %s in %.1f s (%s)", shard.url, delay, reason)
    time.sleep(delay)


def _hold(path: Path) -> HeldShard | None:
    """``path`` opened and share-locked, or ``None`` when it is not there (or was just
    evicted: the lock is taken on the file the name still points to)."""
    try:
        fd = _open_locking(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_ino == os.stat(path).st_ino:
            return HeldShard(path, fd)
    except FileNotFoundError:
        pass
    _close_locking(fd)
    return None


def _touch(path: Path) -> None:
    """Mark ``path`` as just used (eviction takes the least recently used first)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def _evict(path: Path) -> bool:
    """Remove ``path`` when no process holds it open."""
    with _exclusive(path) as free:
        if free:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                return True
    return False


def _is_stale(part: Path) -> bool:
    """A download file whose writer is gone (its lock is free)."""
    with _exclusive(path=part) as free:
        return free


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[bool]:
    """Whether ``path`` exists and no process holds a lock on it (kept locked meanwhile)."""
    try:
        fd = _open_locking(path, os.O_RDONLY)
    except FileNotFoundError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _close_locking(fd)
        yield False
        return
    try:
        yield True
    finally:
        _close_locking(fd)


def _wait_for(part: Path) -> None:
    """Block until the process downloading ``part`` renamed it or gave up."""
    try:
        fd = _open_locking(part, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        _close_locking(fd)


def clear_cache(directory: Path) -> None:
    """Remove a cache folder (no process may be using it)."""
    shutil.rmtree(directory, ignore_errors=True)
