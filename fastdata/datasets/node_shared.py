"""``share_on_node``: one in-RAM dataset per node, mapped by every local rank.

With ``torchrun --nproc-per-node 8``, eight ranks that each build a ``RAMDataset`` hold
eight copies of it. Here the lowest rank of each node builds it once; the other ranks of
that node receive a pickle of it in which every shared-memory buffer (``memfd``) is
replaced by a reference to the builder's descriptor, and open the same memory through
``/proc/<pid>/fd/<fd>``: the pages exist once, and each of ``k`` ranks is charged ``1/k``
of them in its PSS. Nothing is named in ``/dev/shm`` (no ``--shm-size`` limit, nothing
left behind after a crash); the memory is freed when the last rank using it exits.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist

from fastdata.datasets._shm import SharedBuffer

T = TypeVar("T")

_MEMFD_PREFIX = "/memfd:fastdata-"


def _node_id() -> str:
    """This machine as its local ranks see it: host name and kernel boot id."""
    boot_id = ""
    with contextlib.suppress(OSError):
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return f"{socket.gethostname()}/{boot_id}"


class _ByDescriptor(pickle.Pickler):
    """Pickles each :class:`SharedBuffer` as (this pid, its fd) instead of its bytes."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, SharedBuffer):
            if obj.closed:
                raise ValueError("cannot share a closed SharedBuffer")
            return _open_descriptor, (os.getpid(), obj.fd, obj.nbytes)
        return NotImplemented


def _open_descriptor(pid: int, fd: int, nbytes: int) -> SharedBuffer:
    """The buffer behind descriptor ``fd`` of process ``pid`` (same node), mapped here."""
    try:
        own_fd = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise RuntimeError(
            f"cannot open the shared buffer of local rank process {pid} ({exc}); the ranks "
            "of a node must run as one user in one PID namespace. Otherwise build the "
            "dataset on every rank instead of calling share_on_node"
        ) from exc
    return SharedBuffer.from_descriptor(own_fd, nbytes)


def share_on_node(build: Callable[[], T], *, group: Any = None) -> T:
    """Build an in-RAM dataset once per node and give every local rank the same memory.

    Every rank of ``group`` must call this (it is a collective). The lowest rank of each
    node calls ``build()``; the other ranks of that node wait, then get an equal object
    whose :class:`~fastdata.datasets.RAMDataset` buffers map the builder's pages. The
    result pickles into DataLoader workers (fork or spawn) without copies, as usual.

    Use it for a :class:`~fastdata.datasets.RAMDataset` that fits in one node's RAM once
    but not once per GPU. A :class:`~fastdata.datasets.ShardDataset` needs nothing: its
    memory-mapped shards already share the node's page cache.

    Args:
        build: Makes the object, e.g. ``lambda: RAMDataset.from_shards("out/")``. Only
            buffers of ``fastdata`` shared memory are shared; anything else is copied.
        group: The ``torch.distributed`` process group; the default group when
            initialized. Without an initialized group this returns ``build()``.

    Raises:
        RuntimeError: On the other ranks when ``build()`` failed (the building rank raises
            the builder's own exception), or when a rank could not open the builder's
            memory (ranks not in one PID namespace or not one user).

    Example:
        >>> dist.init_process_group("nccl")                                # doctest: +SKIP
        >>> train = share_on_node(lambda: RAMDataset.from_shards("out/"))
        >>> sampler = ShardAwareDistributedSampler(train, seed=0)
    """
    if not (dist.is_available() and dist.is_initialized()):
        return build()
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    nodes: list[Any] = [None] * world
    dist.all_gather_object(nodes, _node_id(), group=group)
    leader = nodes.index(nodes[rank])  # the lowest rank on this node builds
    result: Any = None
    failure: Exception | None = None
    payload: bytes | None = None
    if rank == leader:
        try:
            result = build()
            stream = io.BytesIO()
            _ByDescriptor(stream, protocol=pickle.HIGHEST_PROTOCOL).dump(result)
            payload = stream.getvalue()
        except Exception as exc:
            failure = exc
    published: list[Any] = [None] * world
    mine = (payload, None if failure is None else repr(failure))
    dist.all_gather_object(published, mine, group=group)  # followers wait for the build
    leader_payload, leader_failure = published[leader]
    if rank != leader and leader_failure is None:
        try:
            result = pickle.loads(leader_payload)
        except Exception as exc:
            failure = exc
    # Everyone holds its own descriptors before the builder may let go of its own.
    outcomes: list[Any] = [None] * world
    dist.all_gather_object(outcomes, None if failure is None else repr(failure), group=group)
    if failure is not None:
        raise failure
    problems = {r: outcome for r, outcome in enumerate(outcomes) if outcome is not None}
    if problems:
        raise RuntimeError(f"share_on_node failed on ranks {problems}")
    return result


def shared_memory_usage() -> dict[str, int]:
    """This process's ``rss_bytes`` and ``pss_bytes`` in fastdata shared-memory buffers.

    Read from ``/proc/self/smaps`` (Linux). With ``k`` local ranks sharing a dataset
    through :func:`share_on_node` and all having touched it, each one's ``pss_bytes`` is
    about ``1/k`` of the dataset: the node pays for one copy.
    """
    usage = {"rss_bytes": 0, "pss_bytes": 0}
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split(maxsplit=1)[0]
            if not first.endswith(":"):  # a mapping header: "start-end perms offset dev inode path"
                parts = line.split(maxsplit=5)
                inside = len(parts) == 6 and parts[5].startswith(_MEMFD_PREFIX)
            elif inside and first in ("Rss:", "Pss:"):
                usage["rss_bytes" if first == "Rss:" else "pss_bytes"] += (
                    int(line.split()[1]) * 1024
                )
    return usage
