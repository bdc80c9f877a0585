"""What reused batch memory builds on (the datasets' batch buffers, the CPU
``Normalize``'s outputs): whether anything still refers to a tensor's memory, and faulting
fresh shared memory in at once."""

from __future__ import annotations

import ctypes
import mmap
import sys

import torch

storage_use_count = getattr(torch._C, "_storage_Use_Count", None)

_MADV_POPULATE_WRITE = 23  # Linux 5.14+
_libc: ctypes.CDLL | None = None
_populate_works = sys.platform == "linux"


def populate(address: int, nbytes: int) -> None:
    """Fault in a fresh shared-memory batch with one system call rather than page by page
    as it is written (a 12 MB batch is about 3,000 faults); nothing where the kernel cannot.
    """
    global _libc, _populate_works  # noqa: PLW0603 - set once, on first use
    if not _populate_works:
        return
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    start = address - address % mmap.PAGESIZE
    if _libc.madvise(start, nbytes + address - start, _MADV_POPULATE_WRITE) != 0:
        _populate_works = False  # an older kernel: pages fault in as they are written


def _references(tensor: torch.Tensor) -> tuple[int, int]:
    """References to ``tensor``'s memory: ``(tensors and views sharing its storage,
    Python references to the storage object)``, each counting the one taken here."""
    storage = tensor.untyped_storage()
    return storage_use_count(storage._cdata), sys.getrefcount(storage)  # type: ignore[misc]


def is_free(kept: torch.Tensor) -> bool:
    """Whether nothing but ``kept`` refers to its memory (counts at most those of a fresh
    tensor, measured once on this torch)."""
    tensors, storage_objects = _references(kept)
    return tensors <= _FREE_REFERENCES[0] and storage_objects <= _FREE_REFERENCES[1]


_FREE_REFERENCES = (
    _references(torch.empty(1, dtype=torch.uint8)) if storage_use_count is not None else (0, 0)
)
