"""``NodeSharedArray``: one copy of an array in shared memory for every local rank of a node.

With ``torchrun --nproc-per-node 8`` and a RAM-cached dataset, each rank holding its own
copy costs eight times the dataset. Here the lowest rank of each node fills one file in
``/dev/shm`` and every rank of that node maps it read-only: the pages exist once, and each
of ``k`` ranks is charged ``1/k`` of them in its PSS (proportional set size).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import socket
import tempfile
import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist

from fastdata._system import format_bytes
from fastdata.errors import InsufficientMemoryError

_SHM_DIR = Path("/dev/shm")
_PREFIX = "fastdata-node-"


def _node_id() -> str:
    """This machine as local ranks see it: host name and kernel boot id."""
    boot_id = ""
    with contextlib.suppress(OSError):
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{socket.gethostname()}/{boot_id}"


def _shm_dir() -> Path:
    return _SHM_DIR if _SHM_DIR.is_dir() else Path(tempfile.gettempdir())


def _check_room(folder: Path, nbytes: int) -> None:
    stat = os.statvfs(folder)
    free = stat.f_bavail * stat.f_frsize
    if nbytes > free:
        raise InsufficientMemoryError(
            f"a node-shared array of {format_bytes(nbytes)} does not fit in {folder} "
            f"({format_bytes(free)} free); in a container raise --shm-size, or use a "
            "per-rank cache of the rank's partition"
        )


class NodeSharedArray:
    """A read-only array that all local ranks of a node map from one shared-memory file.

    Create it with :meth:`create` on every rank (a collective call). The object pickles
    as the file's path, so DataLoader workers (fork or spawn) map the same pages too.
    The file is removed when the rank that filled it calls :meth:`close` or exits.

    Attributes:
        path: The shared-memory file (under ``/dev/shm`` on Linux).
        array: The data, ``shape`` and ``dtype`` as created, read-only.
        owner: Whether this process filled the file (and removes it).
    """

    def __init__(self, path: str | Path, shape: tuple[int, ...], dtype: str, *, owner: bool):
        self._setup(Path(path), tuple(shape), np.dtype(dtype).name, owner)

    def _setup(self, path: Path, shape: tuple[int, ...], dtype: str, owner: bool) -> None:
        self.path = path
        self.shape = shape
        self.dtype = dtype
        self.owner = owner
        self._map: mmap.mmap | None = None
        self.array = self._attach()
        # weakref.finalize also runs at interpreter exit
        self._finalizer = weakref.finalize(self, _unlink, path) if owner else None

    @classmethod
    def create(
        cls,
        shape: tuple[int, ...],
        dtype: str,
        fill: Callable[[np.ndarray], None],
        *,
        group: Any = None,
    ) -> NodeSharedArray:
        """Fill one shared array per node; every rank of ``group`` must call this.

        Args:
            shape: Shape of the array, e.g. ``(N, H, W, C)``.
            dtype: NumPy dtype name, e.g. ``"uint8"``.
            fill: Called once per node, on its lowest rank, with the writable array
                (zeroed) to fill in place; the other local ranks wait for it.
            group: The ``torch.distributed`` process group; the default group when
                initialized. Without an initialized group this process fills it alone.

        Raises:
            InsufficientMemoryError: The shared-memory folder has too little room.
            ValueError: ``shape`` has a negative dimension.
        """
        if any(int(n) < 0 for n in shape):
            raise ValueError(f"shape must have dimensions >= 0, got {shape}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        distributed = dist.is_available() and dist.is_initialized()
        world = dist.get_world_size(group) if distributed else 1
        rank = dist.get_rank(group) if distributed else 0
        nodes: list[Any] = [None] * world
        if distributed:
            dist.all_gather_object(nodes, _node_id(), group=group)
        else:
            nodes = [_node_id()]
        leader = nodes.index(nodes[rank])  # lowest rank on this node
        path: Path | None = None
        failure: Exception | None = None
        if rank == leader:
            folder = _shm_dir()
            path = folder / f"{_PREFIX}{uuid.uuid4().hex}"
            try:
                _check_room(folder, nbytes)
                _fill_file(path, shape, dtype, nbytes, fill)
            except Exception as exc:
                _unlink(path)
                failure = exc
        mine = (str(path) if path else None, None if failure is None else repr(failure))
        published: list[Any] = [mine] * world
        if distributed:  # also the barrier: followers attach only after the fill
            dist.all_gather_object(published, mine, group=group)
        if failure is not None:
            raise failure
        leader_path, leader_failure = published[leader]
        if leader_failure is not None:
            raise RuntimeError(
                f"rank {leader} could not fill the node-shared array: {leader_failure}"
            )
        if not Path(leader_path).exists():
            raise RuntimeError(
                f"rank {rank} cannot see {leader_path}, filled by rank {leader} with the same "
                "host name and boot id: the ranks do not share /dev/shm (separate containers?)"
            )
        return cls(leader_path, shape, dtype, owner=rank == leader)

    def _attach(self) -> np.ndarray:
        nbytes = int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize
        if nbytes == 0:
            return np.empty(self.shape, dtype=self.dtype)
        with open(self.path, "rb") as fh:
            self._map = mmap.mmap(fh.fileno(), nbytes, prot=mmap.PROT_READ)
        array = np.frombuffer(self._map, dtype=self.dtype).reshape(self.shape)
        return array

    def memory_usage(self) -> dict[str, int]:
        """This process's ``rss_bytes`` and ``pss_bytes`` of the mapping (Linux smaps).

        With ``k`` local ranks that all touched every page, ``pss_bytes`` is about
        ``nbytes / k`` on each: the node pays for one copy.
        """
        usage = {"rss_bytes": 0, "pss_bytes": 0}
        inside = False
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                first = line.split(maxsplit=1)[0]
                if not first.endswith(":"):  # a mapping header line: "start-end perms ... path"
                    inside = line.rstrip().split(" (deleted)")[0].endswith(str(self.path))
                elif inside and first in ("Rss:", "Pss:"):
                    key = "rss_bytes" if first == "Rss:" else "pss_bytes"
                    usage[key] += int(line.split()[1]) * 1024
        return usage

    def close(self) -> None:
        """Unmap here; the filling rank also removes the file (mapped pages stay valid)."""
        self.array = np.empty((0,), dtype=self.dtype)
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view of the array is still alive
                self._map.close()
            self._map = None
        if self._finalizer is not None:
            self._finalizer()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": str(self.path), "shape": self.shape, "dtype": self.dtype}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._setup(Path(state["path"]), tuple(state["shape"]), state["dtype"], owner=False)


def _fill_file(
    path: Path, shape: tuple[int, ...], dtype: str, nbytes: int, fill: Callable[[np.ndarray], None]
) -> None:
    with open(path, "w+b") as fh:
        fh.truncate(nbytes)
        if nbytes == 0:
            fill(np.empty(shape, dtype=dtype))
            return
        buffer = mmap.mmap(fh.fileno(), nbytes)
        try:
            fill(np.frombuffer(buffer, dtype=dtype).reshape(shape))
        finally:
            # a failed fill's traceback still holds the view: then the GC unmaps later
            with contextlib.suppress(BufferError):
                buffer.close()


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
