"""The ranks of a job agree on the shuffle window that their capped caches allow.

The order of :class:`~fastdata.datasets.ShardAwareDistributedSampler` is the same on every
rank only if every rank shuffles the same number of shards together. A remote set's
capped cache shrinks that window; ranks given different ``cache_limit`` values (nodes
with different scratch space), or ranks of a node sharing one cache folder (each keeping
its own shards in use there), would size it differently. So, once at construction, the
ranks gather each one's host, cache folder, limit and shard size, split each folder's
limit between the ranks that share it, and all take the smallest window.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from fastdata.shards.reader import CacheFolder, CacheRoom


@dataclass(frozen=True)
class RankCache:
    """One rank's cache of the set, as gathered from every rank."""

    host: str
    directory: str
    limit_bytes: int | None
    shard_bytes: int


@dataclass(frozen=True)
class FolderShare:
    """A cache folder of one host and the ranks that read through it."""

    host: str
    directory: str
    ranks: tuple[int, ...]
    limit_bytes: int | None  # the smallest limit its ranks were given (None: no limit)
    shard_bytes: int

    @property
    def share_bytes(self) -> int | None:
        """Each rank's share of the folder's limit."""
        return None if self.limit_bytes is None else self.limit_bytes // len(self.ranks)

    @property
    def room(self) -> CacheRoom | None:
        """What one rank's share holds (``None``: no limit)."""
        share = self.share_bytes
        return None if share is None else CacheRoom(share, self.shard_bytes)

    def describe(self) -> str:
        """Where the limit is and how it is split, for messages."""
        where = f"cache_dir {self.directory!r} on host {self.host!r}"
        ranks = len(self.ranks)
        if ranks == 1:
            return f"{where}, rank {self.ranks[0]}"
        return f"{where}, shared by {ranks} ranks {list(self.ranks)}: {self.share_bytes} bytes each"


def gathers_caches(dataset: object, num_replicas: int, shuffle: bool, partition: str) -> bool:
    """Whether the ranks must agree on the window: a remote set (whatever its limit: the
    ranks decide alike), shuffled with ``partition="epoch"``, split between the processes
    of an initialized ``torch.distributed`` group of more than one."""
    if not shuffle or partition != "epoch" or num_replicas < 2:
        return False
    if getattr(dataset, "cache_folder", None) is None:
        return False
    if not (dist.is_available() and dist.is_initialized()):
        return False
    return bool(dist.get_world_size() == num_replicas)


def gather_caches(folder: CacheFolder) -> list[RankCache]:
    """Every rank's cache of the set, in rank order (a collective: every rank calls it)."""
    mine = (socket.gethostname(), folder.directory, folder.limit_bytes, folder.shard_bytes)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return [RankCache(*entry) for entry in gathered]


def folder_shares(caches: Sequence[RankCache]) -> list[FolderShare]:
    """The folders of ``caches`` (one per host and folder), each with its ranks and the
    smallest limit they were given (each process holds the whole folder to its own).

    Raises:
        ValueError: A folder's share per rank is smaller than the largest shard.
    """
    ranks_of: dict[tuple[str, str], list[int]] = {}
    for rank, cache in enumerate(caches):
        ranks_of.setdefault((cache.host, cache.directory), []).append(rank)
    shard_bytes = max((cache.shard_bytes for cache in caches), default=0)
    shares = []
    for (host, directory), ranks in ranks_of.items():
        limits = [limit for r in ranks if (limit := caches[r].limit_bytes) is not None]
        share = FolderShare(
            host, directory, tuple(ranks), min(limits) if limits else None, shard_bytes
        )
        if share.share_bytes is not None and share.share_bytes < shard_bytes:
            raise ValueError(
                f"cache_limit ({share.limit_bytes} bytes) of {share.describe()}, is smaller "
                f"than the largest shard ({shard_bytes} bytes): allow at least "
                f"{shard_bytes * len(ranks)} bytes there (better a few shards per rank), "
                "or give each rank its own cache_dir"
            )
        shares.append(share)
    return shares


def agreed_window(shares: Sequence[FolderShare], wanted: int) -> tuple[int, FolderShare | None]:
    """The smallest window any rank's share allows (at most ``wanted``) and the folder
    that limits it (``None``: ``wanted`` fits everywhere)."""
    window, limiting = wanted, None
    for share in shares:
        room = share.room
        if room is not None and room.window_shards(wanted) < window:
            window, limiting = room.window_shards(wanted), share
    return window, limiting
