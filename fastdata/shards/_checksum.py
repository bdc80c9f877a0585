"""Shard checksums: SHA-256 of the whole file, recorded in the manifest."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from fastdata._progress import progress
from fastdata.errors import ShardFormatError
from fastdata.shards._schema import Manifest, ShardInfo, load_manifest
from fastdata.shards.reader import open_shard

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

    The manifest itself is checked when loaded (types, plain file names, no shard or field
    listed twice, totals). Then each shard must be a regular file of the recorded size and
    SHA-256 whose contents agree with the manifest: format attributes, sample count, job
    identity, and per field the dataset's dtype, shape, storage and offsets (the checks a
    reader makes when it opens the shard).

    Returns:
        The shards that fail, with the reason; empty when everything verifies.

    Raises:
        ShardFormatError: The manifest is missing or malformed.
    """
    root = Path(root)
    manifest = load_manifest(root)
    if root.suffix == ".json":
        root = root.parent
    problems: list[VerifyProblem] = []
    for info in progress(
        manifest.shards,
        total=len(manifest.shards),
        desc="verify",
        unit="shard",
        enabled=show_progress,
    ):
        path = root / info.file
        reason = _problem(path, info, manifest)
        if reason is not None:
            problems.append(VerifyProblem(info.file, reason))
    return problems


def _problem(path: Path, info: ShardInfo, manifest: Manifest) -> str | None:
    """Why the shard at ``path`` does not match ``info``, or ``None``."""
    if not path.exists():
        return "missing"
    if not path.is_file():
        return "not a regular file"
    size = path.stat().st_size
    if size != info.num_bytes:
        return f"size {size} bytes, expected {info.num_bytes}"
    if (digest := file_sha256(path)) != info.sha256:
        return f"sha256 {digest[:12]}…, expected {info.sha256[:12]}…"
    try:
        open_shard(path, info, manifest.fields, use_mmap=False).close()
    except ShardFormatError as exc:
        return str(exc).removesuffix(f": {path}")
    return None
