"""What the preprocessing tests share: the bytes of a job's shards, its worker processes."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from fastdata.preprocess import PreprocessOptions, _pool
from fastdata.preprocess._sources import list_source
from fastdata.preprocess._task import build_fields
from fastdata.preprocess.engine import ShardJob


def shard_bytes(out: Path) -> dict[str, bytes]:
    """Each shard file of ``out`` by name: what equal jobs must write alike."""
    return {path.name: path.read_bytes() for path in sorted(out.glob("shard-*.h5"))}


def idle_worker_pids() -> list[int]:
    """The processes of the worker pools kept for the next job."""
    with _pool._idle_lock:
        return [p.pid for _, pool in _pool._idle_pool for p in pool._processes]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie no one reaped does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture
def one_image_job(tmp_path: Path) -> ShardJob:
    """A job over a one-image folder (``tmp_path/src``) into ``tmp_path/out``, for the
    tests that start worker pools themselves."""
    src = tmp_path / "src" / "class_a"
    src.mkdir(parents=True)
    cv2.imwrite(str(src / "0.png"), np.zeros((8, 8, 3), np.uint8))
    listing = list_source(tmp_path / "src")
    options = PreprocessOptions(sizes=(8,))
    return ShardJob(str(tmp_path / "out"), options, build_fields(listing, options), listing.kind)
