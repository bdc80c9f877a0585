"""Shard checksums: SHA-256 of the whole file, recorded in the manifest."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fastdata._progress import progress_bar
from fastdata.shards._schema import ShardInfo, load_manifest

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


@dataclass(frozen=True)
class VerifyProblem:
    """One shard that failed verification."""

    file: str
    reason: str


def verify_shards(root: str | Path, *, show_progress: bool = True) -> list[VerifyProblem]:
    """Re-check every shard of a shard set against its manifest.

    Returns:
        The shards that are missing, of the wrong size, or whose checksum differs; empty
        when everything verifies.
    """
    root = Path(root)
    manifest = load_manifest(root)
    problems: list[VerifyProblem] = []
    # Bytes, not shards: one shard is up to a GiB, seconds of hashing.
    total = sum(info.num_bytes for info in manifest.shards)
    bar = progress_bar(total=total, desc="verify", unit="B", enabled=show_progress)
    try:
        for info in manifest.shards:
            path = root / info.file
            if not path.is_file():
                problems.append(VerifyProblem(info.file, "missing"))
                bar.update(info.num_bytes)
            elif (size := path.stat().st_size) != info.num_bytes:
                problems.append(
                    VerifyProblem(info.file, f"size {size} bytes, expected {info.num_bytes}")
                )
                bar.update(info.num_bytes)
            elif (digest := file_sha256(path, bar.update)) != info.sha256:
                problems.append(
                    VerifyProblem(info.file, f"sha256 {digest[:12]}…, expected {info.sha256[:12]}…")
                )
    finally:
        bar.close()
    return problems
