"""Shard checksums: SHA-256 of the whole file, recorded in the manifest."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from fastdata._progress import progress
from fastdata.shards._schema import ShardInfo, load_manifest

_BLOCK_BYTES = 8 << 20


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file, read in 8 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def shard_matches(path: Path, info: ShardInfo) -> bool:
    """True when ``path`` exists with the size and checksum that ``info`` records."""
    try:
        if path.stat().st_size != info.num_bytes:
            return False
    except OSError:
        return False
    return file_sha256(path) == info.sha256


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
    for info in progress(
        manifest.shards,
        total=len(manifest.shards),
        desc="verify",
        unit="shard",
        enabled=show_progress,
    ):
        path = root / info.file
        if not path.is_file():
            problems.append(VerifyProblem(info.file, "missing"))
        elif path.stat().st_size != info.num_bytes:
            problems.append(
                VerifyProblem(
                    info.file, f"size {path.stat().st_size} bytes, expected {info.num_bytes}"
                )
            )
        elif (digest := file_sha256(path)) != info.sha256:
            problems.append(
                VerifyProblem(info.file, f"sha256 {digest[:12]}…, expected {info.sha256[:12]}…")
            )
    return problems
