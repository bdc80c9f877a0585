from __future__ import annotations

import json
import os
import pickle
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from fastdata.datasets import node_shared
from fastdata.datasets.node_shared import NodeSharedArray
from fastdata.errors import InsufficientMemoryError

SHAPE = (32, 256, 256, 4)  # 8 MiB of uint8


def _pattern(out: np.ndarray) -> None:
    out[...] = (np.arange(out.size, dtype=np.int64) % 251).astype(out.dtype).reshape(out.shape)


def test_single_process_fill_read_only_pickle_and_close() -> None:
    shared = NodeSharedArray.create((4, 5), "int32", lambda a: a.__setitem__(..., 7))
    assert shared.owner and shared.path.exists()
    assert shared.array.dtype == np.int32 and shared.array.shape == (4, 5)
    assert (shared.array == 7).all()
    with pytest.raises(ValueError, match="read-only"):
        shared.array[0, 0] = 1
    clone = pickle.loads(pickle.dumps(shared))  # what a spawned DataLoader worker gets
    assert not clone.owner and clone.path == shared.path
    np.testing.assert_array_equal(clone.array, shared.array)
    clone.close()
    assert shared.path.exists()  # only the filling rank removes the file
    shared.close()
    assert not shared.path.exists()


def test_failed_fill_removes_the_file_and_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(out: np.ndarray) -> None:
        raise OSError("disk gone")

    before = set(node_shared._shm_dir().glob("fastdata-node-*"))
    with pytest.raises(OSError, match="disk gone"):
        NodeSharedArray.create((10,), "uint8", broken)
    assert set(node_shared._shm_dir().glob("fastdata-node-*")) == before


def test_too_little_shared_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        node_shared.os, "statvfs", lambda _: SimpleNamespace(f_bavail=16, f_frsize=4096)
    )
    with pytest.raises(InsufficientMemoryError, match=r"does not fit in .* raise --shm-size"):
        NodeSharedArray.create((1 << 20,), "uint8", _pattern)
    with pytest.raises(ValueError, match="shape must have dimensions >= 0"):
        NodeSharedArray.create((-1, 3), "uint8", _pattern)


def _worker(rank: int, store: str, out: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=60),
    )
    try:
        shared = NodeSharedArray.create(SHAPE, "uint8", _pattern)
        expected = np.empty(SHAPE, np.uint8)
        _pattern(expected)
        equal = bool(np.array_equal(shared.array, expected))  # touches every page
        usage = shared.memory_usage()
        dist.barrier()  # both ranks mapped every page before anyone measures
        usage = shared.memory_usage()
        Path(out, f"rank{rank}.json").write_text(
            json.dumps({"equal": equal, "owner": shared.owner, "path": str(shared.path), **usage})
        )
        dist.barrier()  # the owner removes the file only after both measured
        shared.close()
    finally:
        dist.destroy_process_group()


def test_two_ranks_share_one_copy(tmp_path: Path) -> None:
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    nbytes = int(np.prod(SHAPE))
    assert [r["owner"] for r in ranks] == [True, False]
    assert ranks[0]["path"] == ranks[1]["path"] and not Path(ranks[0]["path"]).exists()
    for rank in ranks:
        assert rank["equal"]
        assert rank["rss_bytes"] == nbytes  # each maps all of it...
        assert 0.45 * nbytes <= rank["pss_bytes"] <= 0.55 * nbytes  # ...and pays for half
