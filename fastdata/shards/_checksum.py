"""Shard checksums: SHA-256 of the whole file, recorded in the manifest."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fastdata._file_hash import file_sha256
from fastdata._progress import progress_bar
from fastdata._storage import HeldShard, LocalFiles, ShardFiles, shard_files
from fastdata.errors import ShardFormatError
from fastdata.shards._schema import Manifest, ShardInfo, load_manifest
from fastdata.shards.reader import OpenShard, open_shard


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
    manifest = load_manifest(root)
    files = shard_files(root)
    problems: list[VerifyProblem] = []
    # Bytes, not shards: one shard is up to a GiB, seconds of hashing.
    total = sum(info.num_bytes for info in manifest.shards)
    bar = progress_bar(total=total, desc="verify", unit="B", enabled=show_progress)
    try:
        for info in manifest.shards:
            if isinstance(files, LocalFiles):
                reason = _problem(files.root / info.file, info, manifest, bar.update)
            else:
                reason = _remote_problem(files, info, manifest, bar.update)
            if reason is not None:
                problems.append(VerifyProblem(info.file, reason))
    finally:
        bar.close()
    return problems


def _problem(
    path: Path, info: ShardInfo, manifest: Manifest, advance: Callable[[int], object]
) -> str | None:
    """Why the shard at ``path`` does not match ``info``, or ``None``; ``advance(n)`` counts
    its ``info.num_bytes`` bytes, hashed or not."""
    if not path.exists():
        reason: str | None = "missing"
    elif not path.is_file():
        reason = "not a regular file"
    elif (size := path.stat().st_size) != info.num_bytes:
        reason = f"size {size} bytes, expected {info.num_bytes}"
    else:
        if (digest := file_sha256(path, advance)) != info.sha256:
            return f"sha256 {digest[:12]}…, expected {info.sha256[:12]}…"
        try:
            open_shard(path, info, manifest.fields, use_mmap=False).close()
        except ShardFormatError as exc:
            return str(exc).removesuffix(f": {path}")
        return None
    advance(info.num_bytes)
    return reason


def _remote_problem(
    files: ShardFiles, info: ShardInfo, manifest: Manifest, advance: Callable[[int], object]
) -> str | None:
    """As :func:`_problem`, for a shard in object storage: its bytes are read into memory
    (one shard at a time; nothing is cached) and checked there."""
    try:
        data = files.read_bytes(info.file)
    except FileNotFoundError:
        advance(info.num_bytes)
        return "missing"
    advance(info.num_bytes)
    if len(data) != info.num_bytes:
        return f"size {len(data)} bytes, expected {info.num_bytes}"
    if (digest := hashlib.sha256(data).hexdigest()) != info.sha256:
        return f"sha256 {digest[:12]}…, expected {info.sha256[:12]}…"
    where = files.where(info.file)
    try:
        held = HeldShard(Path(info.file), data=data)
        OpenShard(Path(info.file), info, manifest.fields, False, held).close()
    except ShardFormatError as exc:
        return str(exc).removesuffix(f": {info.file}").removesuffix(f": {where}")
    return None
