"""Ranks of a ``torch.distributed`` job reading a remote set through capped caches agree
on one shuffle window: ranks given different ``cache_limit`` values draw the same order,
and ranks of a node sharing a cache folder each size their order by their share of it."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from fastdata import ShardAwareDistributedSampler, ShardDataset
from fastdata.shards import load_manifest
from fastdata.shards.reader import CacheFolder
from tests.storage._ranks import build_and_read
from tests.storage.conftest import upload_folder, write_set

_SHARDS = (8,) * 8  # 64 samples, labels = global indices
_NUM_SAMPLES = sum(_SHARDS)


def _remote_set(bucket: str, tmp_path: Path, prefix: str) -> tuple[str, int]:
    """The set's URL and its largest shard's bytes."""
    local = write_set(tmp_path / "set", _SHARDS)
    largest = max(info.num_bytes for info in load_manifest(local).shards)
    return upload_folder(bucket, local, prefix), largest


def _run_ranks(url: str, caches: list[tuple[str, int]], tmp_path: Path) -> list[dict[str, Any]]:
    """Two spawned ranks (gloo on loopback), each with its ``(cache_dir, cache_limit)``."""
    out = tmp_path / "ranks"
    out.mkdir()
    mp.spawn(build_and_read, args=(url, caches, str(out)), nprocs=2, join=True)
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def _served_once(ranks: list[dict[str, Any]]) -> None:
    for epoch in ("epoch0", "epoch1"):
        assert sorted(ranks[0][epoch] + ranks[1][epoch]) == list(range(_NUM_SAMPLES)), epoch


def test_ranks_with_different_cache_limits_draw_one_order(bucket: str, tmp_path: Path) -> None:
    """Rank 0's cache holds 7 shards (room to shuffle 3 together), rank 1's 5 (2): both
    shuffle 2 together, so together they serve every sample once an epoch (with 3 and 2,
    their slices of two different orders overlap: samples come twice, others never)."""
    url, largest = _remote_set(bucket, tmp_path, "limits")
    caches = [(str(tmp_path / "cache0"), 7 * largest), (str(tmp_path / "cache1"), 5 * largest)]
    ranks = _run_ranks(url, caches, tmp_path)
    _served_once(ranks)
    assert [rank["window_shards"] for rank in ranks] == [2, 2]
    for rank in ranks:  # each rank says why, naming the limit that sets the window
        (message,) = rank["warnings"]
        assert f"cache_limit ({5 * largest} bytes) of cache_dir " in message
        assert "the sampler of every rank shuffles 2 shards together instead of " in message
        assert f"allow {9 * largest} bytes to shuffle 4 together" in message
    assert ranks[0]["room_bytes"] == 7 * largest  # each reads ahead in its own cache
    assert ranks[1]["room_bytes"] == 5 * largest


def test_ranks_sharing_a_cache_folder_split_its_limit(bucket: str, tmp_path: Path) -> None:
    """Two ranks of one host, one folder holding 6 shards: each sizes its order and its
    read-ahead by 3 (room to shuffle 1 together; alone, 6 would shuffle 2)."""
    url, largest = _remote_set(bucket, tmp_path, "shared")
    cache = str(tmp_path / "cache")
    ranks = _run_ranks(url, [(cache, 6 * largest), (cache, 6 * largest)], tmp_path)
    assert [rank["window_shards"] for rank in ranks] == [1, 1]
    assert [rank["room_bytes"] for rank in ranks] == [3 * largest, 3 * largest]
    _served_once(ranks)
    (message,) = ranks[0]["warnings"]
    assert f"shared by 2 ranks [0, 1]: {3 * largest} bytes each, holds 3 shards" in message
    assert f"allow {18 * largest} bytes to shuffle 4 together" in message


def test_a_shared_folder_below_one_shard_per_rank_is_refused_on_every_rank(
    bucket: str, tmp_path: Path
) -> None:
    url, largest = _remote_set(bucket, tmp_path, "tiny")
    cache, limit = str(tmp_path / "cache"), largest * 3 // 2
    ranks = _run_ranks(url, [(cache, limit), (cache, limit)], tmp_path)
    for rank in ranks:
        assert rank["error"] == (
            f"cache_limit ({limit} bytes) of cache_dir {str(Path(cache).resolve())!r} on host "
            f"{socket.gethostname()!r}, shared by 2 ranks [0, 1]: {limit // 2} bytes each, is "
            f"smaller than the largest shard ({largest} bytes): allow at least {2 * largest} "
            "bytes there (better a few shards per rank), or give each rank its own cache_dir"
        )


class _RemoteStandIn:
    """A remote set as the sampler sees it: shard sizes and a cache folder."""

    def __init__(self) -> None:
        self.shard_sizes = list(_SHARDS)
        self.cache_room = None
        self.cache_folder = CacheFolder("/cache", 100, 10)


@pytest.mark.parametrize(
    ("dataset", "options"),
    [
        (list(_SHARDS), {}),  # not a remote set
        (_RemoteStandIn(), {"shuffle": False}),
        (_RemoteStandIn(), {"partition": "fixed"}),
    ],
)
def test_no_collective_unless_a_shuffled_remote_order_needs_the_ranks_to_agree(
    monkeypatch: pytest.MonkeyPatch, dataset: object, options: dict[str, Any]
) -> None:
    """A group of 2 is initialized: the sampler gathers nothing for a local set, an
    unshuffled order or a fixed partition (a rank building it alone does not hang)."""
    calls: list[object] = []

    def gather_as_if_both_ranks_were_this_one(gathered: list[object], mine: object) -> None:
        calls.append(mine)
        gathered[:] = [mine, mine]

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_gather_object", gather_as_if_both_ranks_were_this_one)
    ShardAwareDistributedSampler(dataset, 2, 0, **options)
    assert calls == []
    # a shuffled remote order does gather: 2 ranks share the folder of 10 shards, 5 each
    with pytest.warns(UserWarning, match="shared by 2 ranks .* shuffles 2 shards together"):
        sampler = ShardAwareDistributedSampler(_RemoteStandIn(), 2, 0)
    assert len(calls) == 1 and sampler.window_shards == 2


def test_without_a_process_group_each_rank_sizes_the_window_alone(
    bucket: str, tmp_path: Path
) -> None:
    """num_replicas and rank given by hand, no process group: no collective, the rank's
    own limit (as in one process)."""
    url, largest = _remote_set(bucket, tmp_path, "alone")
    dataset = ShardDataset(url, cache_dir=tmp_path / "cache", cache_limit=5 * largest)
    with pytest.warns(UserWarning, match="the sampler shuffles 2 shards together"):
        sampler = ShardAwareDistributedSampler(dataset, 2, 1)
    assert sampler.window_shards == 2


def test_a_state_saved_under_the_ranks_agreement_names_it_when_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agreed window is part of the saved state: a sampler that shuffles another
    number of shards together refuses it, saying where the window came from."""

    def gather_as_if_both_ranks_were_this_one(gathered: list[object], mine: object) -> None:
        gathered[:] = [mine, mine]

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_gather_object", gather_as_if_both_ranks_were_this_one)
    with pytest.warns(UserWarning, match="shuffles 2 shards together"):
        saved = ShardAwareDistributedSampler(_RemoteStandIn(), 2, 1).state_dict(5)
    assert saved["window_shards"] == 2
    with pytest.warns(UserWarning, match="shuffles 2 shards together"):
        ShardAwareDistributedSampler(_RemoteStandIn(), 2, 0).load_state_dict(saved)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(ValueError, match="saved with window_shards=2, this sampler has window"):
        ShardAwareDistributedSampler(_RemoteStandIn(), 2, 0).load_state_dict(saved)
    roomy = _RemoteStandIn()
    roomy.cache_folder = CacheFolder("/cache", 40, 10)  # 2 shards each: shuffles 1
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    expected = (
        r"window_shards=1 \(the cache_limit of every rank \(shared by the ranks of a folder\) "
        r"lets it shuffle 1 shard together of the 4 asked for"
    )
    with (
        pytest.raises(ValueError, match=expected),
        pytest.warns(UserWarning, match="shuffles 1 shard together"),
    ):
        ShardAwareDistributedSampler(roomy, 2, 0).load_state_dict(saved)


def test_a_rank_without_a_limit_reads_ahead_within_its_share_of_a_limited_folder(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 was given no cache_limit, rank 0 (same host, same folder) 6 shards: the
    folder's limit is split, and rank 1's order and read-ahead keep to its 3 shards."""
    url, largest = _remote_set(bucket, tmp_path, "unlimited")
    dataset = ShardDataset(url, cache_dir=tmp_path / "cache")
    assert dataset.cache_room is None  # alone, no limit: no room to keep to

    def gather_with_a_limited_rank_0(gathered: list[object], mine: Any) -> None:
        host, directory, _, shard_bytes = mine
        gathered[:] = [(host, directory, 6 * largest, shard_bytes), mine]

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_gather_object", gather_with_a_limited_rank_0)
    with pytest.warns(UserWarning, match="shuffles 1 shard together"):
        sampler = ShardAwareDistributedSampler(dataset, 2, 1)
    assert sampler.window_shards == 1
    room = dataset.cache_room
    assert room is not None and (room.limit_bytes, room.shard_bytes) == (3 * largest, largest)
