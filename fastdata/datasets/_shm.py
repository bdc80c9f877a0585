"""Anonymous shared memory that processes share without a name (Linux ``memfd_create``).

A :class:`SharedBuffer` is a ``MAP_SHARED`` mapping of a memory file descriptor. Forked
workers inherit the mapping (no copy-on-write: nobody writes to it); spawned or
forkserver workers receive a duplicate of the descriptor when the owner is pickled into
them and map the same pages. The memory has no path in ``/dev/shm``, so nothing can leak
there: the kernel frees it when the last process that maps it or holds the descriptor
closes it or dies, crash or not.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from multiprocessing import reduction
from typing import Any

import numpy as np


class SharedBuffer:
    """``nbytes`` of zeroed shared memory, viewed as a flat ``uint8`` NumPy array.

    Args:
        nbytes: Size of the buffer in bytes (0 is allowed).
        name: A label shown in ``/proc/<pid>/maps`` (``memfd:fastdata-<name>-<creator pid>``).
    """

    def __init__(self, nbytes: int, name: str = "buffer") -> None:
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        fd = os.memfd_create(f"fastdata-{name}-{os.getpid()}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)
        except OSError:
            os.close(fd)
            raise
        self._attach(fd, nbytes)

    @classmethod
    def from_descriptor(cls, fd: int, nbytes: int) -> SharedBuffer:
        """The buffer of ``nbytes`` behind memory file descriptor ``fd``, mapped in this
        process; it owns ``fd`` from now on (closes it in :meth:`close`)."""
        buffer = cls.__new__(cls)
        buffer._attach(fd, nbytes)
        return buffer

    def _attach(self, fd: int, nbytes: int) -> None:
        self.fd = fd
        self.nbytes = nbytes
        self._pid = os.getpid()
        # mmap of length 0 is an error; an empty buffer keeps only the descriptor.
        self._map: mmap.mmap | None = mmap.mmap(fd, nbytes) if nbytes else None
        self.array: np.ndarray = (
            np.frombuffer(self._map, dtype=np.uint8)
            if self._map is not None
            else np.empty(0, np.uint8)
        )

    @property
    def closed(self) -> bool:
        return self.fd < 0

    def close(self) -> None:
        """Unmap and close this process's view; the memory is freed once every process has."""
        if self.closed:
            return
        self.array = np.empty(0, np.uint8)
        if self._map is not None:
            # A view still held elsewhere keeps the mapping alive until it is collected.
            with contextlib.suppress(BufferError):
                self._map.close()
            self._map = None
        os.close(self.fd)
        self.fd = -1

    def __reduce__(self) -> tuple[Any, ...]:
        if self.closed:
            raise ValueError("cannot pickle a closed SharedBuffer")
        # DupFd passes the descriptor itself to a spawned child (or through a resource
        # sharer to a live process), never the bytes.
        return (_rebuild, (reduction.DupFd(self.fd), self.nbytes))

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


def _rebuild(dup: Any, nbytes: int) -> SharedBuffer:
    return SharedBuffer.from_descriptor(dup.detach(), nbytes)
