"""File checksums: the SHA-256 of a whole file, as a manifest records each shard's.

Shared by the shard format (writing and verifying shards) and preprocessing (a resumed
job keeps the shards already written whose size and checksum match its records).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastdata.shards import ShardInfo

_BLOCK_BYTES = 8 << 20


def file_sha256(path: str | Path, advance: Callable[[int], object] | None = None) -> str:
    """Hex SHA-256 of a file, read in 8 MiB blocks; ``advance(n)`` after each block."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK_BYTES):
            digest.update(block)
            if advance is not None:
                advance(len(block))
    return digest.hexdigest()


def shard_matches(
    path: Path, info: ShardInfo, advance: Callable[[int], object] | None = None
) -> bool:
    """True when ``path`` exists with the size and checksum that ``info`` records
    (``advance(n)`` is called as bytes are hashed, for a progress bar)."""
    try:
        if path.stat().st_size != info.num_bytes:
            return False
    except OSError:
        return False
    return file_sha256(path, advance) == info.sha256
